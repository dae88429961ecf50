"""Summary statistics and report generation from recorded runs (no models involved)."""

from __future__ import annotations

from quickdraft.bench import report
from quickdraft.config import load_config


def run(
    latency, tokens, *, completion="x = 1", forwards=None, identical=True, exact=False, **extra
):
    return {
        "completion": completion,
        "tokens": tokens,
        "latency_ms": latency,
        "prefill_ms": 10.0,
        "decode_ms": latency - 10.0,
        "new_tokens": len(tokens),
        "target_forwards": len(tokens) if forwards is None else forwards,
        "accepted_by_source": extra.get("accepted", {}),
        "drafted_by_source": extra.get("drafted", {}),
        "identical_to_ar": identical,
        "exact_match": exact,
    }


def hole(language, runs, *, truth="x = 1", kind="line", line=0):
    return {
        "file": f"f.{language}",
        "language": language,
        "line": line,
        "col": 0,
        "kind": kind,
        "prompt_tokens": 100,
        "truth": truth,
        "runs": runs,
    }


HOLES = [
    hole(
        "python",
        {
            "ar": run(100.0, [1, 2, 3, 4], exact=True),
            "hybrid": run(
                50.0,
                [1, 2, 3, 4],
                forwards=2,
                exact=True,
                drafted={"ngram": 4},
                accepted={"ngram": 3},
            ),
        },
        line=1,
    ),
    hole(
        "python",
        {
            "ar": run(200.0, [1, 2]),
            "hybrid": run(
                50.0, [1, 2], forwards=1, drafted={"ngram": 2, "draft": 2}, accepted={"ngram": 1}
            ),
        },
        truth="x = 10",
        line=2,
    ),
    hole(
        "rust",
        {
            "ar": run(90.0, [5, 6], completion="let"),
            "hybrid": run(100.0, [5, 7], completion="lex", identical=False),
        },
        truth="let y = 2;",
        kind="block",
    ),
]


def test_identity_is_reported_per_compute_path():
    """Identity with `ar` is a property of what computes (runtime, dtype, cache): the summary and
    the report name the path of every runtime's strategies."""
    holes = [
        hole(
            "python",
            {
                "ar": run(100.0, [1, 2]),
                "hybrid": run(50.0, [1, 2]),
                "ar@llamacpp": run(90.0, [1, 3]),
                "hybrid@llamacpp": run(40.0, [1, 4], identical=False),
                "ngram@llamacpp": run(40.0, [1, 3]),
            },
        ),
        hole(
            "python",
            {
                "ar": run(100.0, [1, 2]),
                "hybrid": run(50.0, [1, 2]),
                "ar@llamacpp": run(90.0, [1, 3]),
                "hybrid@llamacpp": run(40.0, [1, 3]),
                "ngram@llamacpp": run(40.0, [1, 3]),
            },
        ),
    ]
    paths = {
        "": "torch int8/onednn, cpu, growing KV cache",
        "llamacpp": "llama.cpp, cpu, growing KV cache",
    }
    by_path = report.summarize(holes, paths)["identity_by_path"]
    assert by_path == {
        paths[""]: {"hybrid": {"identical": 2, "holes": 2, "rate": 1.0}},
        paths["llamacpp"]: {
            "hybrid": {"identical": 1, "holes": 2, "rate": 0.5},
            "ngram": {"identical": 2, "holes": 2, "rate": 1.0},
        },
    }
    # Without names (an older results.json), the variant stands in.
    assert set(report.identity_by_path(holes, None)) == {"variant default", "variant llamacpp"}
    text = report.render_markdown(
        {
            "env": {"repo": "r", "seed": 0, "max_new_tokens": 8},
            "holes": holes,
            "summary": report.summarize(holes, paths),
        }
    )
    section = text.split("## Identity with `ar`, per compute path")[1].split("##")[0]
    assert "| `llama.cpp, cpu, growing KV cache` | 100% (2/2) | 50% (1/2) |" in section
    assert "| `torch int8/onednn, cpu, growing KV cache` | – | 100% (2/2) |" in section


def test_percentile_interpolates_like_numpy():
    assert report.percentile([], 50) is None
    assert report.percentile([3.0], 99) == 3.0
    assert report.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert report.percentile([float(i) for i in range(1, 101)], 90) == 90.1


def test_summary_per_strategy_and_language():
    summary = report.summarize(HOLES)
    assert set(summary) == {
        "ar",
        "hybrid",
        "by_language",
        "copy_heavy",
        "model_copies",
        "identity_by_path",
    }
    hybrid = summary["hybrid"]
    assert set(hybrid) == set(report.SUMMARY_KEYS)
    # Ratios ar/hybrid per hole: 2.0, 4.0, 0.9 -> median 2.0.
    assert hybrid["speedup_vs_ar"] == 2.0
    assert hybrid["tokens_per_forward"] == round(8 / 5, 3)  # 4+2+2 tokens, 2+1+2 forwards
    assert hybrid["identical_to_ar"] == round(2 / 3, 3)
    assert hybrid["exact_match"] == round(1 / 3, 3)
    assert hybrid["p50_ms"] == 50.0
    assert summary["ar"]["speedup_vs_ar"] == 1.0
    assert summary["by_language"]["python"]["hybrid"]["speedup_vs_ar"] == 3.0
    assert summary["by_language"]["rust"]["hybrid"]["identical_to_ar"] == 0.0


def test_each_stage_is_reported_by_its_median_over_holes():
    stages = [
        dict.fromkeys(report.STAGES, 1.0) | {"prefill_ms": prefill}
        for prefill in (10.0, 30.0, 20.0)
    ]
    runs = [{"stages_ms": timed} for timed in stages] + [{"stages_ms": {}}]  # a peer: untimed
    medians = report.stage_medians(runs)
    assert medians == dict.fromkeys(report.STAGES, 1.0) | {"prefill_ms": 20.0}
    assert report.stage_medians([{"stages_ms": {}}]) is None
    holes = [{"runs": {"hybrid": run}} for run in runs[:3]]
    rendered = "\n".join(report.render_stages(holes, {"hybrid": {"stages_p50_ms": medians}}))
    assert (
        "## Where the time goes" in rendered
        and "| `hybrid` | 1.00 | 1.00 | 1.00 | 20.0 |" in rendered
    )
    assert report.render_stages(holes, {"hybrid": {"stages_p50_ms": None}}) == []


def test_repeats_of_existing_code_are_counted_among_the_runs_that_judged_them():
    runs = [
        {"repeated": True, "repeat_trimmed": True},
        {"repeated": True, "repeat_trimmed": False},
        {"repeated": False, "repeat_trimmed": False},
        {"repeated": None, "repeat_trimmed": None},  # a peer: not judged
    ]
    assert report._share(runs, "repeated") == round(2 / 3, 3)
    assert report._share(runs, "repeat_trimmed") == round(1 / 3, 3)
    holes = [{"runs": {"hybrid": run}} for run in runs]
    summary = {"hybrid": {"repeated": 0.667, "repeat_trimmed": 0.333}}
    rendered = "\n".join(report.render_repeats(holes, summary))
    assert "## Repeats of existing code" in rendered and "| `hybrid` | 67% | 33% |" in rendered
    assert report.render_repeats(holes, {"hybrid": {"repeated": None}}) == []


def test_copy_heavy_holes_are_summarized_on_their_own():
    holes = [dict(h) for h in HOLES]
    assert report.summarize(holes)["copy_heavy"] == {}
    holes[0]["copied_from"] = "f_test.py"
    copy_heavy = report.summarize(holes)["copy_heavy"]
    assert set(copy_heavy) == {"ar", "hybrid"}
    assert copy_heavy["hybrid"]["holes"] == 1
    assert copy_heavy["hybrid"]["tokens_per_forward"] == 2.0  # 4 tokens, 2 forwards
    holes[2]["ar_copied_from"] = "g.rs"
    summary = report.summarize(holes)
    assert summary["model_copies"]["hybrid"]["holes"] == 1
    assert summary["model_copies"]["hybrid"]["tokens_per_forward"] == 1.0  # 2 tokens, 2 forwards
    text = report.render_markdown({"env": {}, "holes": holes, "summary": summary})
    assert "## Copy-heavy holes" in text and "1 of 3 holes" in text and "`f_test.py`" in text
    assert "On 1 holes the model's own output" in text and "`g.rs`" in text


def test_matching_rules():
    assert report.exact_match("x = 1  \n", "x = 1")
    assert not report.exact_match("x = 1", "x = 10")
    assert report.prefix_match("x = 1", "x = 10")
    assert not report.prefix_match("", "x = 10")
    assert not report.prefix_match("y", "x = 10")


def test_details_acceptance_and_prefix_match():
    detail = report.details(HOLES, "hybrid")
    assert detail["drafted"] == {"ngram": 6, "draft": 2}
    assert detail["accepted"] == {"ngram": 4}
    assert detail["prefix_match"] == 2 / 3
    assert (
        report.acceptance_text(detail["drafted"], detail["accepted"])
        == "draft 0/2 (0%), ngram 4/6 (67%)"
    )
    # A strategy that may ask the draft model says so when the cost model never did.
    never = {"ngram": 6, "draft": 0}
    assert report.acceptance_text(never, {"ngram": 4}, "hybrid@tree-auto") == (
        "ngram 4/6 (67%), draft model never asked"
    )
    assert report.acceptance_text(never, {"ngram": 4}, "ngram") == "ngram 4/6 (67%)"


def test_markdown_has_every_table(tmp_path):
    results = {
        "env": {
            "device": "cpu",
            "dtype": "float32",
            "repo": "r",
            "seed": 0,
            "max_new_tokens": 8,
            "skipped": {"llama-cpp": "not installed"},
            "notes": ["a note"],
            "peers": {
                "llama-cpp-lookup": {
                    "extra_buffers": False,
                    "buffers_note": "without llama.cpp's extra (AMX) buffers: they crashed",
                }
            },
        },
        "holes": HOLES,
        "summary": report.summarize(HOLES),
    }
    plots = report.write_plots(tmp_path, results)
    assert [p.rsplit("/", 1)[-1] for p in plots] == ["latency_cdf.png", "speedup_by_language.png"]
    text = report.render_markdown(results, plots=plots)
    for heading in (
        "## Per strategy",
        "## Per language",
        "## Per kind of hole",
        "## Copy-heavy holes",
        "## Notes",
        "## Plots",
    ):
        assert heading in text
    assert "`llama-cpp` skipped: not installed" in text
    # How a peer was loaded is in the environment table (the probe's decision).
    assert (
        "| peer `llama-cpp-lookup` | without llama.cpp's extra (AMX) buffers: they crashed |"
        in text
    )
    assert "| `hybrid` | 3 |" in text
    assert "2.00×" in text


def test_markdown_without_holes():
    results = {"env": {"interrupted": True}, "holes": [], "summary": report.summarize([])}
    text = report.render_markdown(results)
    assert "interrupted" in text and "nothing to report" in text


def test_sweep_summary_picks_the_best_length_per_language():
    records = [
        {
            "file": h["file"],
            "language": h["language"],
            "line": h["line"],
            "col": h["col"],
            "runs": {
                "hybrid": {
                    "2": run(
                        h["runs"]["ar"]["latency_ms"] / 1.5,
                        h["runs"]["ar"]["tokens"],
                        drafted={"ngram": 4},
                        accepted={"ngram": 2},
                    ),
                    "4": run(
                        h["runs"]["ar"]["latency_ms"] / 3.0,
                        h["runs"]["ar"]["tokens"],
                        drafted={"ngram": 8},
                        accepted={"ngram": 6},
                    ),
                }
            },
        }
        for h in HOLES
    ]
    sweep = report.summarize_sweep(records, HOLES, "hybrid")
    assert sweep["best"] == {"python": 4, "rust": 4}
    cell = sweep["summary"]["python"]["hybrid"]["4"]
    assert (
        cell["speedup_vs_ar"] == 3.0
        and cell["acceptance"] == 0.75
        and cell["identical_to_ar"] == 1.0
    )
    assert sweep["summary"]["python"]["hybrid"]["adaptive"]["speedup_vs_ar"] == 3.0
    # Python's adaptive run did as well as k=4 (3.0x), Rust's did worse (0.9x): only Rust's
    # length is worth fixing.
    assert sweep["recommended"] == {"python": None, "rust": 4}
    snippet = report.config_snippet(sweep)
    assert snippet == {"languages": {"python": {"draft_length": None}, "rust": {"draft_length": 4}}}
    config = load_config(snippet)
    assert config.draft_length_for("rust") == 4 and config.draft_length_for("python") is None
    assert "Best fixed length for `hybrid` in python: 4" in "\n".join(report.render_sweep(sweep))


def test_timing_noise_is_flagged_when_identical_prefills_disagree():
    quiet = [hole("python", {"ar": run(100.0, [1]), "hybrid": run(60.0, [1])})]
    assert report.timing_noise(quiet) == 1.0
    busy = [
        hole("python", {"ar": {**run(100.0, [1]), "prefill_ms": 40.0}, "hybrid": run(60.0, [1])})
    ]
    assert report.timing_noise(busy) == 4.0
    results = {"env": {}, "holes": busy, "summary": report.summarize(busy)}
    assert "Timing noise" in report.render_markdown(results)
    results = {"env": {}, "holes": quiet, "summary": report.summarize(quiet)}
    assert "Timing noise" not in report.render_markdown(results)
