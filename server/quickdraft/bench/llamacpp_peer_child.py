"""The bench's llama.cpp peer, in a process of its own (run by `peers.LlamaCppPeer`).

llama.cpp crashes on some machines (a SIGSEGV in its AMX buffers on one Xeon VM), and a crash
inside the bench's own process would end the whole bench. So llama-cpp-python runs here, in a
child, and speaks JSON lines with the bench:

    bench -> child   {"prompt": [ids], "max_new_tokens": n}
    child -> bench   {"token": id}            one per token generated, then waits for
    bench -> child   "more" | "stop"          whether to go on (the server's stop rule runs
                                              in the bench, on the text so far)
    child -> bench   {"done": true}           after "stop" or n tokens

The first line the child writes is {"ready": true} (or {"error": "..."} and an exit), once the
model is loaded.

llama-cpp-python's `Llama` has no setting for llama.cpp's extra buffer types; with
`--no-extra-bufts` the model parameters it starts from are patched to turn them off, the
decision the bench takes from `models.llamacpp_probe` (as quickdraft's own llama.cpp runtime
does).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import IO, Any

PROMPT_LOOKUP_TOKENS = 10
"""llama-cpp-python's `num_pred_tokens` and transformers' `prompt_lookup_num_tokens`: the
value both libraries document."""


def load_llama(args: argparse.Namespace) -> Any:
    llama_cpp = importlib.import_module(args.llama_module)
    if args.no_extra_bufts:
        low_level = getattr(llama_cpp, "llama_cpp", llama_cpp)
        default_params = low_level.llama_model_default_params

        def without_extra_bufts():
            params = default_params()
            params.use_extra_bufts = False
            return params

        low_level.llama_model_default_params = without_extra_bufts
    kwargs: dict[str, Any] = dict(
        model_path=args.gguf, n_ctx=args.n_ctx, verbose=False, logits_all=True
    )
    if args.threads:
        kwargs["n_threads"] = args.threads
    if args.lookup:
        speculative = importlib.import_module(f"{args.llama_module}.llama_speculative")
        kwargs["draft_model"] = speculative.LlamaPromptLookupDecoding(
            num_pred_tokens=PROMPT_LOOKUP_TOKENS
        )
    return llama_cpp.Llama(**kwargs)


def _send(out: IO[str], message: dict[str, Any]) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


def serve(llama: Any, inp: IO[str], out: IO[str]) -> None:
    """Answer requests until the bench closes the pipe."""
    for line in inp:
        request = json.loads(line)
        llama.reset()  # cold: no prefix reuse from the previous hole
        tokens = llama.generate(list(request["prompt"]), top_k=1, top_p=1.0, temp=0.0, reset=True)
        for produced, token in enumerate(tokens, start=1):
            _send(out, {"token": int(token)})
            if produced >= request["max_new_tokens"] or inp.readline().strip() != "more":
                break
        _send(out, {"done": True})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the bench's llama.cpp peer (internal)")
    parser.add_argument("gguf")
    parser.add_argument("--n-ctx", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--lookup", action="store_true")
    parser.add_argument("--no-extra-bufts", action="store_true")
    parser.add_argument("--llama-module", default="llama_cpp")
    args = parser.parse_args(argv)
    # The protocol keeps the real stdout; whatever llama.cpp prints goes to stderr.
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    try:
        llama = load_llama(args)
    except Exception as exc:  # reported to the bench, which skips the peer
        _send(protocol, {"error": f"{type(exc).__name__}: {exc}"})
        return 1
    _send(protocol, {"ready": True})
    serve(llama, sys.stdin, protocol)
    return 0


if __name__ == "__main__":  # pragma: no cover - run by peers.LlamaCppPeer in a child
    sys.exit(main())
