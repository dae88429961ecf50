"""What keeps a rule's candidate next edit from being shown (context/edit_rules.py proposes).

In order, cheapest first; the first that applies removes the candidate and is counted:

- `floor`: its confidence is below `edit_rules.FLOOR` (abstaining is the default).
- `fill`: part of its text is for a model to write (`Candidate.fill_at`: an added parameter's
  argument) and none wrote it: no model (`vet`'s `filler` None), a request that had one fill
  already (FILL_CHECKS), a model's text that is not one argument (`edit_rules.
  argument_written`), or one the model itself found less likely than FILL_LOGPROB. A filled
  candidate goes on to the vetoes below but `likelihood`: the model's own certainty of what
  it wrote has judged it (`Candidate.scored`: an inserted argument's tokens cost the changed
  line nats however right they are).
- `undo`: it touches the lines of the latest edit, or turns the document back into what it was
  before it.
- `parse`: the document with it applied has more tree-sitter errors than without it.
- `likelihood`: a model (the draft by default) finds the changed lines much less likely than
  they were (`likely_enough`). The caller asks the model (`vet`'s `judge`: the pipeline has
  the backend, this module only says what to score: `likelihood_window`); at most
  LIKELIHOOD_CHECKS candidates are scored per request, none of the UNSCORED_RULES nor an
  added parameter's argument (`Candidate.scored`). The draft
  first takes a quick look (a few lines around the candidate and the latest edit's lines): it
  keeps a candidate it finds clearly likely (`clearly_likely`) and vetoes one that loses as
  much as the full window vetoes (`likely_enough`); the full window judges the rest.

The first candidate, best first, that no veto removes is shown; none shown is the answer "no
edit". Pure functions; offsets are code points.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from quickdraft.context import syntax
from quickdraft.context.edit_history import lines_with_breaks
from quickdraft.context.edit_rules import FLOOR, Candidate, LatestEdit, line_span

VETOES = ("floor", "fill", "undo", "parse", "likelihood")

# The likelihood veto's settings, all in one place. Chosen on the rule candidates of the two
# tuning sets of the README's table (tuned: openai-agents-python, smolagents, pytest, fastapi,
# 371 cases; held out earlier: fastmcp, python-sdk, textual, 360), scored by Qwen2.5-Coder-1.5B
# Instruct (Q4_K_M): the change in the summed log-probability of the changed lines (and the end
# of the middle) when the candidate is applied. Helpful candidates mostly gain (median +9
# nats), harmful ones mostly lose. Shown at the floor, without the veto: 77 (57 helpful, 20
# harmful); at -1 nats: 60 (51, 9), the most helpful ones less twice the harmful ones of the
# drops tried (-10 to +4; -4: 66 (54, 12); 0: 56 (48, 8)).
LIKELIHOOD_DROP = {"target": 1.0, "draft": 3.0}
"""Per scoring model (`edits.likelihood_veto`): a candidate whose changed lines lose more than
this many nats is vetoed. The draft (Qwen2.5-Coder-0.5B Instruct, Q4_K_M, the default scorer)
on the same candidates, by the same rule: at -3 nats 66 shown (56 helpful, 10 harmful), better
than the target's best, at a third of its time per candidate (3.8 s against 11.8 s offline on
a 2-core Zen 2)."""
WINDOW_LINES = 12
"""Lines of the document above and below the changed lines that the model reads."""
REACH_LINES = 40
"""The window reaches further (by at most this many lines) to take in the latest edit, which is
what makes the candidate likely."""
WINDOW_TOKENS = 1024
"""A window longer than this (a file of very long lines) is not scored: the candidate is kept
as the rules alone would show it, rather than a prefill of seconds more."""
UNSCORED_RULES = frozenset({"hoist", "import"})
"""Rules whose candidates the model is not asked about: on the tuning sets the veto (draft at
-3 nats) never removed one of theirs (hoist: 16 helpful, 5 harmful; import: 8 helpful, all
kept), nor on the untuned trl, aider and lerobot runs (7 hoists, 3 imports), so scoring them
only made their answers seconds later."""
NEAR_LINES = 3
"""The quick look's window: lines above and below the changed lines."""
NEAR_EDIT_LINES = 6
"""The quick look shows at most this many lines of the latest edit across the gap."""
NEAR_GAIN = {"draft": 4.0}
"""Per scoring model: a candidate whose changed lines the quick look finds at least this many
nats more likely is kept without the full window; any other is judged by the full window, as
before. Chosen on the same candidates as LIKELIHOOD_DROP, rescored by the draft as the server
runs it (Q4_0, 2026-12-06): the smallest gain at which the answers shown stayed those of the
full window alone on both tuning sets (tuned 33 shown, 30 helpful, 3 harmful; held out
earlier 32, 25, 7 against 31, 24, 7), and the scored answers' p50 fell from 2.0 to 0.8 s and
2.3 to 1.8 s there. Candidate by candidate it is not free: of 98 scored, 46 were kept at a
glance, 6 of them harmful ones and 3 helpful ones the full window would have vetoed (at 6
nats: 34, 3 and 3; at 3: 53, 10 and 3). Its vetoes (a loss of more than LIKELIHOOD_DROP, as
the full window's) agreed with the full window on all 12 candidates they took (the nearest
disagreement was at -2.0 nats), and left the answers shown as they were; the scored answers'
p50 on the held-out-earlier set fell from 1.8 to 0.9 s with them (offline). The target has
no quick look (not measured)."""
LIKELIHOOD_CHECKS = 1
"""At most this many candidates are scored per request; when all are vetoed, the answer is no
edit. The model's veto of the best candidate says no to the change: on the tuning sets'
candidates (the quick look and full window as shipped), scoring up to 3 showed 3 more (2
helpful, 1 harmful) than stopping at the first veto, the same criterion (helpful less twice
harmful, 35), for up to two more scorings of a second or more each."""


FILL_CHECKS = 1
"""Candidates a model writes an argument for per request (each is a generation of up to
FILL_TOKENS tokens): the nearest call; the next is asked once that one is applied."""
FILL_TOKENS = 16
"""The most tokens a model writes for one argument (a short fill-in-the-middle)."""
FILL_LOGPROB = -LIKELIHOOD_DROP["target"]
"""The least summed log-probability (nats) the target may give the argument it wrote for it
to be shown. Not tuned: the next-edit histories hold almost no such case (of 338 edit cases of
five tuning histories, 1 added a parameter without a default whose calls the commit changed).
So the bound of the target's likelihood veto: an argument the target finds at least about
37 % likely."""

Filler = Callable[[Candidate], Candidate | None]
"""Has a model write the part of a candidate's text it holds open (`Candidate.fill_at`): the
candidate whole, or None (not written: no argument, cancelled)."""

Judge = Callable[[Candidate], bool | None]
"""Asks the model about one candidate: True keep, False veto, None: not scored (a backend that
cannot score keeps it; a cancelled request ends the search)."""


@dataclass
class Decision:
    """What the rules and the vetoes made of one latest edit."""

    shown: Candidate | None = None
    candidates: int = 0
    vetoed: dict[str, int] = field(default_factory=dict)
    """Veto name -> candidates it removed before one was shown."""
    parses: int = 0
    """Parses the `parse` veto made (tests count work, not time)."""
    judged: int = 0
    """Candidates the judge (the likelihood veto's model) was asked about."""
    filled: int = 0
    """Candidates the filler (a model writing an argument) was asked about."""
    unscored: int = 0
    """Of those, the ones it could not score (kept: a backend without log-probabilities)."""

    @property
    def scored(self) -> int:
        """Candidates the model scored (asked, less those it could not score)."""
        return self.judged - self.unscored

    @property
    def rule(self) -> str | None:
        return self.shown.rule if self.shown is not None else None

    def then(self, later: Decision) -> Decision:
        """This decision, which showed nothing, followed by `later`'s: its answer, the work of
        both."""
        vetoed = dict(self.vetoed)
        for reason, count in later.vetoed.items():
            vetoed[reason] = vetoed.get(reason, 0) + count
        return Decision(
            shown=later.shown,
            candidates=self.candidates + later.candidates,
            vetoed=vetoed,
            parses=self.parses + later.parses,
            judged=self.judged + later.judged,
            filled=self.filled + later.filled,
            unscored=self.unscored + later.unscored,
        )

    @property
    def confidence(self) -> float | None:
        return self.shown.confidence if self.shown is not None else None


def applied(text: str, candidate: Candidate) -> str:
    edit = candidate.edit
    return text[: edit.start] + edit.text + text[edit.end :]


def veto(
    edit: LatestEdit, candidate: Candidate, *, floor: float = FLOOR
) -> tuple[str | None, bool]:
    """(the veto that removes `candidate`, or None; whether a parse was made)."""
    if candidate.confidence < floor:
        return "floor", False
    target = candidate.edit
    if (
        target.start < edit.new_end
        and edit.start < target.end
        or (target.start == target.end and edit.start <= target.start <= edit.new_end)
    ):
        return "undo", False
    result = applied(edit.after, candidate)
    if result == edit.before:
        return "undo", False
    return _parse_veto(edit.after, result, edit.grammar)


def _parse_veto(text: str, result: str, grammar: str | None) -> tuple[str | None, bool]:
    if grammar is None:
        return None, False
    if syntax.parses_without_new_errors(text, result, grammar) is False:
        return "parse", True
    return None, True


def vet(
    edit: LatestEdit,
    candidates: Sequence[Candidate],
    *,
    floor: float = FLOOR,
    judge: Judge | None = None,
    filler: Filler | None = None,
    cancelled: Callable[[], bool] = lambda: False,
) -> Decision:
    """The first of `candidates` (best first) that no veto removes, and what was removed.
    (`floor` 0: the best candidate whatever its confidence, as the bench's floor sweep asks.)
    `filler`: a model writing what a candidate holds open (`Candidate.fill_at`), asked about
    at most FILL_CHECKS candidates past the floor (None: such candidates are not shown).
    `judge`: the likelihood veto, asked last and about at most LIKELIHOOD_CHECKS candidates
    (None: not applied); `cancelled` ends the search with no edit when the judge or the
    filler stopped because the request was cancelled."""
    decision = Decision(candidates=len(candidates))
    for candidate in candidates:
        if candidate.fill_at is not None and candidate.confidence >= floor:
            filled = None
            if filler is not None and decision.filled < FILL_CHECKS:
                decision.filled += 1
                filled = filler(candidate)
                if filled is None and cancelled():
                    return decision
            if filled is None or filled.fill_at is not None:
                decision.vetoed["fill"] = decision.vetoed.get("fill", 0) + 1
                continue
            candidate = filled
        reason, parsed = veto(edit, candidate, floor=floor)
        decision.parses += parsed
        if reason is None and judge is not None and candidate.scored:
            if decision.judged >= LIKELIHOOD_CHECKS:
                return decision
            if candidate.rule not in UNSCORED_RULES:
                decision.judged += 1
                verdict = judge(candidate)
                if verdict is None and cancelled():
                    return decision
                decision.unscored += verdict is None
                reason = "likelihood" if verdict is False else None
        if reason is None:
            decision.shown = candidate
            return decision
        decision.vetoed[reason] = decision.vetoed.get(reason, 0) + 1
    return decision


def vet_importer(
    text: str, grammar: str | None, candidates: Sequence[Candidate], *, floor: float = FLOOR
) -> Decision:
    """The first of `candidates` for a document that imports what another document's latest
    edit changed (context/edit_importers.py), `text` as it is, past the `floor` and `parse`
    vetoes. The model is not asked: the source no longer binds the old name (or takes the
    argument), so the importer as it stands is broken, and a window of the importer would not
    show the edit that makes the candidate right."""
    decision = Decision(candidates=len(candidates))
    for candidate in candidates:
        reason, parsed = (
            ("floor", False)
            if candidate.confidence < floor
            else _parse_veto(text, applied(text, candidate), grammar)
        )
        decision.parses += parsed
        if reason is None:
            decision.shown = candidate
            return decision
        decision.vetoed[reason] = decision.vetoed.get(reason, 0) + 1
    return decision


@dataclass(frozen=True)
class LikelihoodWindow:
    """What the likelihood veto scores: the changed lines as they are (`old`) and with the
    candidate applied (`new`), each the middle of a fill-in-the-middle prompt whose prefix and
    suffix are the lines around them."""

    prefix: str
    suffix: str
    old: str
    new: str


def likelihood_window(
    edit: LatestEdit, candidate: Candidate, *, near: bool = False
) -> LikelihoodWindow:
    """The window the model reads for `candidate` (an edit of the edited document): the whole
    lines it changes, WINDOW_LINES around them, stretched up or down to take in the latest edit
    when it is at most REACH_LINES away. `near`: the quick look's window instead, NEAR_LINES
    around them, with the latest edit's first NEAR_EDIT_LINES lines put across the gap (before
    the window when the edit is above it, after it when below) where the window misses it."""
    text, target = edit.after, candidate.edit
    start, end = line_span(text, target.start, target.end)
    first, last = text.count("\n", 0, start), text.count("\n", 0, end)
    edit_first, edit_last = text.count("\n", 0, edit.start), text.count("\n", 0, edit.new_end)
    above_lines, below_lines = lines_with_breaks(text[:start]), lines_with_breaks(text[end:])
    if near:
        prefix = "".join(above_lines[-NEAR_LINES:])
        suffix = "".join(below_lines[:NEAR_LINES])
        edit_last, edit_lines = _edit_lines(edit)
        if edit_last < first - NEAR_LINES:
            prefix = edit_lines + prefix
        elif edit_first > last + NEAR_LINES - 1:
            suffix += edit_lines
    else:
        above = WINDOW_LINES + (first - edit_first if 0 < first - edit_first <= REACH_LINES else 0)
        below = WINDOW_LINES + (edit_last - last if 0 < edit_last - last <= REACH_LINES else 0)
        prefix = "".join(above_lines[-above:])
        suffix = "".join(below_lines[:below])
    return LikelihoodWindow(
        prefix=prefix,
        suffix=suffix,
        old=text[start:end],
        new=text[start : target.start] + target.text + text[target.end : end],
    )


def fill_window(edit: LatestEdit, candidate: Candidate) -> tuple[str, str]:
    """The prefix and suffix of the fill-in-the-middle prompt in which a model writes what
    `candidate` holds open (`Candidate.fill_at`): its lines as the likelihood veto's full
    window shows them (`likelihood_window`), the candidate's text in place and open at the
    hole; where that window misses the latest edit (the `def` whose parameter the argument is
    for), the edit's first NEAR_EDIT_LINES lines put across the gap, as the quick look does."""
    assert candidate.fill_at is not None
    text, target = edit.after, candidate.edit
    start, end = line_span(text, target.start, target.end)
    window = likelihood_window(edit, candidate)
    first, last = text.count("\n", 0, start), text.count("\n", 0, end)
    edit_first = text.count("\n", 0, edit.start)
    _, edit_lines = _edit_lines(edit)
    prefix, suffix = window.prefix, window.suffix
    if edit_first < first and edit_lines not in prefix:
        prefix = edit_lines + prefix
    elif edit_first > last and edit_lines not in suffix:
        suffix += edit_lines
    hole = target.start - start + candidate.fill_at  # in the candidate's lines, `window.new`
    return prefix + window.new[:hole], window.new[hole:] + suffix


def _edit_lines(edit: LatestEdit) -> tuple[int, str]:
    """The latest edit's last line (a hunk that ends with a line break ends on that line) and
    its first NEAR_EDIT_LINES lines, as a window puts them across its gap."""
    text = edit.after
    edit_first = text.count("\n", 0, edit.start)
    edit_last = text.count("\n", 0, max(edit.new_end - 1, edit.start))
    lines = lines_with_breaks(text)
    return edit_last, "".join(lines[edit_first : min(edit_last + 1, edit_first + NEAR_EDIT_LINES)])


def window_head(text: str, line: int) -> str:
    """The lines every full window of a candidate below an edit that starts on `line` (0-based)
    of `text` opens with (`likelihood_window` stretches such a window up to the edit): the
    WINDOW_LINES above that line. Computed while the cursor rests there, before the edit, the
    windows after it start from a warm cache."""
    return "".join(lines_with_breaks(text)[max(0, line - WINDOW_LINES) : max(0, line)])


def likely_enough(old: Sequence[float], new: Sequence[float], model: str = "draft") -> bool:
    """Whether the changed lines, scored token by token by `model` as they are (`old`) and as
    the candidate leaves them (`new`), lose at most LIKELIHOOD_DROP[model] nats."""
    return sum(new) - sum(old) >= -LIKELIHOOD_DROP[model]


def clearly_likely(old: Sequence[float], new: Sequence[float], model: str = "draft") -> bool:
    """Whether the quick look (`likelihood_window(near=True)`) finds the changed lines at
    least NEAR_GAIN[model] nats more likely as the candidate leaves them: kept without the full
    window. False for a model without a quick look."""
    gain = NEAR_GAIN.get(model)
    return gain is not None and sum(new) - sum(old) >= gain
