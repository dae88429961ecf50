"""The floor table counts what a floor hides, and the floor chosen loses at most a tenth."""

from __future__ import annotations

import pytest

from quickdraft.bench.confidence_report import (
    candidates_summary,
    choose_floor,
    floor_table,
    render_confidence,
    summarize_confidence,
)


def hole(language, confidence, exact, alternatives=()):
    run = {
        "completion": "x" if confidence is not None else "",
        "confidence": confidence,
        "exact_match": exact,
        "prefix_match": exact,
        "alternatives": list(alternatives),
    }
    return {"language": language, "truth": "x", "runs": {"hybrid": run}}


HOLES = [
    hole("python", 0.9, True),
    hole("python", 0.6, True),
    hole("python", 0.5, False),
    hole("python", 0.03, False),
    hole("typescript", 0.4, True),
    hole("typescript", 0.04, False),
    hole("typescript", 0.02, False),
    hole("typescript", 0.15, True),
    hole("typescript", None, False),  # nothing shown: not a suggestion to judge
]


def test_each_floor_counts_what_it_shows_and_hides():
    table = {row["floor"]: row for row in floor_table(HOLES, "hybrid")}
    assert table[0.0]["shown"] == 8 and table[0.0]["exact_share"] == 0.5
    assert table[0.05]["shown"] == 5 and table[0.05]["right_lost"] == 0.0
    assert table[0.05]["exact_share"] == pytest.approx(4 / 5)
    assert table[0.05]["wrong_hidden"] == pytest.approx(3 / 4)
    assert table[0.2]["right_lost"] == pytest.approx(1 / 4)


def test_the_chosen_floor_is_the_best_exact_share_losing_at_most_a_tenth():
    chosen = choose_floor(floor_table(HOLES, "hybrid"))
    assert chosen["floor"] == 0.05  # 0.1 and 0.15 do as well; the lowest wins
    assert chosen["right_lost"] <= 0.1


def test_candidates_count_which_item_was_right_and_the_report_says_so():
    holes = [
        hole(
            "python",
            0.5,
            False,
            [
                {
                    "completion": "y",
                    "exact_match": True,
                    "confidence": 0.2,
                    "prefill_tokens": 0,
                    "new_tokens": 4,
                    "decode_ms": 10.0,
                }
            ],
        ),
        hole("python", 0.5, True, []),
    ]
    summary = candidates_summary(holes, "hybrid")
    assert summary["exact_index"] == {"1": 1, "0": 1}
    assert summary["alternative_prefill_tokens"] == 0
    text = "\n".join(render_confidence(summarize_confidence(HOLES + holes, "hybrid")))
    assert "The data supports a floor of" in text and "item 2: 1" in text


def test_a_first_line_that_scores_above_the_floor_is_counted_apart():
    below = hole("python", 0.01, False)
    below["runs"]["hybrid"].update(completion="x = 1\ny = 2", line_confidence=0.5)
    below["truth"] = "x = 1\nz = 3"
    wrong = hole("python", 0.01, False)
    wrong["runs"]["hybrid"].update(completion="q = 1\ny = 2", line_confidence=0.5)
    rows = {row["floor"]: row for row in floor_table([below, wrong], "hybrid")}
    assert rows[0.05]["first_lines"] == 2 and rows[0.05]["first_lines_right"] == 1
    assert rows[0.0]["first_lines"] == 0  # shown whole
    assert rows[0.6]["first_lines"] == 0  # the line is below that floor too
