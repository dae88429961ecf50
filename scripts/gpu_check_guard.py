"""`python -m gpu_check_guard -m MODULE ARGS...`: run MODULE with the packages a GPU machine
lacks made unimportable, so a dry run on a CPU shows that scripts/gpu_check.sh needs none."""

from __future__ import annotations

import runpy
import sys

MISSING = ("pygls", "lsprotocol", "cattrs", "gguf", "llama_cpp", "tree_sitter")


class _Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0].startswith(MISSING):
            raise ImportError(f"{name} is not installed on the GPU machine")
        return None


if __name__ == "__main__":
    sys.meta_path.insert(0, _Refuse())
    args = sys.argv[1:]
    if args[:1] == ["-c"]:
        sys.argv = ["-c", *args[2:]]
        exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})
    elif args[:1] == ["-m"]:
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        raise SystemExit("usage: python -m gpu_check_guard (-m MODULE | -c CODE) [ARGS...]")
