"""Measure int8 against float32 on a real model: speed, agreement, batch invariance.

    python -m quickdraft.models.int8_report --model ~/.cache/quickdraft/models/<name> \\
        --files a.py b.js c.rs [--context 512] [--threads 2] [--json out.json]

What it prints:

* speed (best of --repeats): one forward of 1 and of 8 new tokens over a `--context`-token KV cache, for float32,
  our batch-invariant int8 (with and without the lm_head quantized) and torch's
  `quantize_dynamic` (per-tensor activation scales; for comparison only);
* agreement: over every position of each file's first `--context` tokens, the fraction where the
  int8 model's next-token argmax equals float32's; and the share of 32-token greedy
  continuations (from a few cut points per file) identical to float32's;
* batch invariance: an 8-token forward against 8 successive 1-token forwards over the same cache
  (max |logit difference| and argmax agreement), per variant.

This is a measurement tool for the README numbers and the `dtype="auto"` decision, not a test.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
import warnings
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from quickdraft.models.quantize import quantize_model


def _load(path: str):
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, tokenizer


def _make_variant(path: str, name: str):
    """A fresh model for one variant, quantized in place (one variant in memory at a time)."""
    model, _ = _load(path)
    if name == "int8":
        return quantize_model(model, lm_head=True)
    if name == "int8-7bit":  # the weights AVX2's exact oneDNN path needs (|w| <= 63)
        return quantize_model(model, lm_head=True, backend="onednn7")
    if name == "int8-fp32-head":
        return quantize_model(model, lm_head=False)
    if name == "quantize_dynamic":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torch.ao.quantization import quantize_dynamic  # deprecated: warns on import

            return quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
    if name == "bfloat16":
        return model.to(torch.bfloat16)
    if name == "float32":
        return model
    raise SystemExit(f"unknown variant {name}")


@torch.inference_mode()
def _prefill(model, ids):
    cache = DynamicCache(config=model.config)
    model(input_ids=ids, cache=cache, use_cache=True)
    return cache


def _crop_to(cache, n: int) -> None:
    extra = cache.get_seq_length() - n
    if extra > 0:
        cache.crop(-extra)


@torch.inference_mode()
def _time_forward(model, context_ids, new: int, repeats: int) -> float:
    cache = _prefill(model, context_ids)
    n = context_ids.shape[1]
    new_ids = context_ids[:, :new]
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        model(input_ids=new_ids, cache=cache, use_cache=True)
        times.append(time.perf_counter() - started)
        _crop_to(cache, n)
    return min(times[1:]) * 1000  # best of n: the machine may be shared


@torch.inference_mode()
def _invariance(model, context_ids, k: int = 8):
    n = context_ids.shape[1] - k
    prefix, tail = context_ids[:, :n], context_ids[:, n:]
    cache = _prefill(model, prefix)
    batch = model(input_ids=tail, cache=cache, use_cache=True).logits[0]
    _crop_to(cache, n)
    single = []
    for i in range(k):
        single.append(model(input_ids=tail[:, i : i + 1], cache=cache).logits[0, 0])
    single = torch.stack(single)
    return {
        "max_abs_diff": float((batch - single).abs().max()),
        "bitwise_equal": bool(torch.equal(batch, single)),
        "argmax_agree": float((batch.argmax(-1) == single.argmax(-1)).float().mean()),
    }


@torch.inference_mode()
def _greedy(model, ids, steps: int) -> list[int]:
    cache = _prefill(model, ids[:, :-1])
    token = ids[:, -1:]
    out = []
    for _ in range(steps):
        logits = model(input_ids=token, cache=cache, use_cache=True).logits[0, -1]
        nxt = int(logits.argmax())
        out.append(nxt)
        token = torch.tensor([[nxt]])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--files", nargs="+", required=True)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--continuations", type=int, default=3, help="cut points per file")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument(
        "--variants",
        nargs="+",
        default=["float32", "int8", "int8-fp32-head", "quantize_dynamic", "bfloat16"],
    )
    parser.add_argument("--skip", nargs="*", default=[], help="speed agreement greedy invariance")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = _load(args.model)
    texts = {Path(f).name: Path(f).read_text(errors="replace") for f in args.files}
    encoded = {
        name: torch.tensor([tokenizer.encode(text)[: args.context]]) for name, text in texts.items()
    }
    report: dict = {
        "model": args.model,
        "threads": torch.get_num_threads(),
        "context": args.context,
    }
    first = next(iter(encoded.values()))
    cuts = []
    for fname, ids in encoded.items():
        n = ids.shape[1]
        for j in range(args.continuations):
            cuts.append((fname, ids[:, : int(n * (j + 1) / (args.continuations + 1))]))
    reference_argmax = {}
    reference_greedy = []
    with torch.inference_mode():
        if "agreement" not in args.skip:
            reference_argmax = {
                n: model(input_ids=ids).logits[0].argmax(-1) for n, ids in encoded.items()
            }
        if "greedy" not in args.skip:
            reference_greedy = [_greedy(model, ids, args.steps) for _, ids in cuts]
    del model
    gc.collect()

    for key in ("speed_ms", "invariance", "argmax_agreement", "greedy_identical"):
        report[key] = {}
    for name in args.variants:
        m = _make_variant(args.model, name)
        if "speed" not in args.skip:
            speed = {str(k): round(_time_forward(m, first, k, args.repeats), 1) for k in (1, 8)}
            started = time.perf_counter()
            _prefill(m, first)
            speed["prefill"] = round((time.perf_counter() - started) * 1000)
            report["speed_ms"][name] = speed
            print("speed", name, speed, flush=True)
        if "invariance" not in args.skip:
            report["invariance"][name] = _invariance(m, first)
            print("invariance", name, report["invariance"][name], flush=True)
        if "agreement" not in args.skip and name != "float32":
            same = total = 0
            per_file = {}
            with torch.inference_mode():
                for fname, ids in encoded.items():
                    agree = m(input_ids=ids).logits[0].argmax(-1) == reference_argmax[fname]
                    per_file[fname] = round(float(agree.float().mean()), 4)
                    same += int(agree.sum())
                    total += agree.numel()
            report["argmax_agreement"][name] = {
                "all": round(same / total, 4),
                "positions": total,
                **per_file,
            }
            print("agreement", name, report["argmax_agreement"][name], flush=True)
        if "greedy" not in args.skip and name != "float32":
            identical = 0
            prefix_lengths = []
            for (_, ids), ref in zip(cuts, reference_greedy, strict=True):
                got = _greedy(m, ids, args.steps)
                identical += got == ref
                common = next(
                    (i for i, (a, b) in enumerate(zip(got, ref, strict=True)) if a != b), len(ref)
                )
                prefix_lengths.append(common)
            report["greedy_identical"][name] = {
                "identical": identical,
                "of": len(cuts),
                "mean_common_prefix": round(statistics.mean(prefix_lengths), 1),
            }
            print("greedy", name, report["greedy_identical"][name], flush=True)
        del m
        gc.collect()

    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
