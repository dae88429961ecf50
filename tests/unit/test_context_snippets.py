"""Snippets from other open documents: ranking, dedupe, exclusions, budgets."""

from dataclasses import dataclass

from quickdraft.context.snippets import (
    as_open_document,
    identifier_tokens,
    jaccard,
    select_snippets,
    uri_to_path,
)


@dataclass
class Doc:
    uri: str
    text: str
    language_id: str = "python"


def block(name: str, lines: int = 6) -> str:
    """A small function whose identifiers all carry `name`."""
    body = "\n".join(
        f"    {name}_value_{i} = {name}_compute({name}_arg, {i})" for i in range(lines)
    )
    return f"def {name}_function({name}_arg):\n{body}\n    return {name}_value_0\n"


FILLER = "\n".join(f"unrelated_{i} = other_thing_{i}" for i in range(40)) + "\n"


def test_identifier_tokens_drop_keywords_and_single_letters():
    assert identifier_tokens("def f(x): return self.total + count") == {"total", "count"}


def test_jaccard():
    assert jaccard(frozenset({"a", "b"}), frozenset({"b", "c"})) == 1 / 3
    assert jaccard(frozenset(), frozenset({"a"})) == 0.0


def test_uri_and_dict_documents():
    assert uri_to_path("file:///home/me/my%20proj/a.py") == "/home/me/my proj/a.py"
    assert uri_to_path("file:///C:/x/a.py") == "C:/x/a.py"
    doc = as_open_document({"uri": "file:///a.py", "text": "x", "languageId": "python"})
    assert (doc.path, doc.text, doc.language_id) == ("/a.py", "x", "python")


def test_most_similar_window_wins_and_unrelated_text_is_left_out():
    docs = [
        Doc("file:///w/noise.py", FILLER),
        Doc("file:///w/billing.py", FILLER + block("invoice") + FILLER),
        Doc("file:///w/users.py", block("account")),
    ]
    query = "total = invoice_compute(invoice_arg, 3)\nresult = invoice_value_2\n"
    chosen = select_snippets(query, docs, max_snippets=1, snippet_lines=8)
    assert len(chosen) == 1
    assert chosen[0].path == "/w/billing.py"
    assert "invoice_compute" in chosen[0].text
    assert chosen[0].score > 0


def test_current_document_is_never_used():
    text = block("invoice")
    docs = [Doc("file:///w/current.py", text), Doc("file:///w/copy.py", text)]
    by_path = select_snippets("invoice_compute invoice_arg", docs, current_path="/w/current.py")
    assert by_path and all(s.path == "/w/copy.py" for s in by_path)
    by_text = select_snippets("invoice_compute invoice_arg", docs, current_text=text)
    assert by_text == []  # the copy is the current text too, so it is skipped


def test_windows_already_in_the_current_document_are_skipped():
    shared = block("invoice")
    docs = [Doc("file:///w/other.py", shared)]
    current = "import x\n" + shared
    assert (
        select_snippets("invoice_compute", docs, current_path="/w/cur.py", current_text=current)
        == []
    )


def test_near_duplicates_and_overlapping_windows_are_dropped():
    same = block("invoice")
    docs = [Doc("file:///w/a.py", same), Doc("file:///w/b.py", same), Doc("file:///w/c.py", same)]
    chosen = select_snippets(
        "invoice_compute invoice_value_1", docs, max_snippets=4, snippet_lines=4
    )
    # b.py and c.py are copies of a.py: nothing of theirs is added once a.py's windows are in.
    assert {s.path for s in chosen} == {"/w/a.py"}
    # a.py's windows overlap each other (stride = half a window): no two taken cover one line.
    for i, a in enumerate(chosen):
        for b in chosen[i + 1 :]:
            assert a.end_line <= b.start_line or b.end_line <= a.start_line
    assert len(chosen) >= 2


def test_a_distinct_window_is_kept_next_to_a_duplicate():
    docs = [
        Doc("file:///w/a.py", block("invoice")),
        Doc("file:///w/b.py", block("invoice")),
        Doc("file:///w/c.py", block("invoice_tax")),
    ]
    chosen = select_snippets("invoice_compute invoice_tax_compute", docs, max_snippets=4)
    assert [s.path for s in chosen] == ["/w/a.py", "/w/c.py"]


def test_max_snippets_and_token_budget():
    docs = [Doc(f"file:///w/m{i}.py", block(f"mod{i}") + block("invoice")) for i in range(6)]
    assert len(select_snippets("invoice_compute mod1_compute", docs, max_snippets=2)) <= 2
    costs = []

    def cost(snippet):
        costs.append(len(snippet.text))
        return len(snippet.text)

    query = "invoice_compute mod1_compute"
    unbounded = select_snippets(query, docs, max_snippets=6, snippet_lines=8)
    budget = sum(len(s.text) for s in unbounded) // 2
    chosen = select_snippets(
        query, docs, max_snippets=6, snippet_lines=8, token_budget=budget, cost=cost
    )
    assert chosen and sum(len(s.text) for s in chosen) <= budget
    assert len(chosen) < len(unbounded)
    assert select_snippets("invoice_compute", docs, token_budget=0, cost=cost) == []
    assert select_snippets("invoice_compute", docs, max_snippets=0) == []


def test_result_order_is_document_then_line_not_score():
    docs = [
        Doc("file:///w/first.py", block("alpha")),
        Doc("file:///w/second.py", block("beta")),
    ]
    # beta matches better, but first.py still comes first in the prompt.
    chosen = select_snippets("beta_compute beta_arg beta_value_1 alpha_compute", docs)
    assert [s.path for s in chosen] == ["/w/first.py", "/w/second.py"]
    assert chosen[1].score > chosen[0].score


def test_large_documents_are_skipped():
    docs = [Doc("file:///w/big.py", block("invoice") * 50)]
    assert select_snippets("invoice_compute", docs, max_document_bytes=100) == []


def test_empty_query_or_documents():
    assert select_snippets("", [Doc("file:///a.py", block("x1"))]) == []
    assert select_snippets("invoice", []) == []


def test_multibyte_text_in_snippets():
    docs = [Doc("file:///w/ü.py", "def größe_berechnen(wert):\n    return wert * 2  # ✓\n")]
    chosen = select_snippets("größe_berechnen(wert)", docs)
    assert chosen and "größe_berechnen" in chosen[0].text
