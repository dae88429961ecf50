"""The draft's GGUF in the format llama.cpp runs fastest here: its Q4_0 copy where that wins.

The draft model only proposes tokens, which the target verifies, and scores next-edit
candidates for the likelihood veto; its weights' format changes no completion, only how fast
drafts and scores come. llama.cpp's kernels differ by format and CPU: on a 2-core AMD EPYC
(Zen 2, AVX2) the Q4_K_M 0.5B stepped in 31.7 ms and prefilled 107 tokens/s, and its Q4_0 copy
(requantized from it, 429 MB) in 25.8 ms and 158 tokens/s, AVX2's Q4_0 kernels being the
faster ones. The veto's verdicts held: on the 127 rule candidates of its tuning sets, at its
-3 nats, 63 shown (54 helpful, 9 harmful) against 66 (56, 10), the same criterion (helpful
less twice harmful, 36).

So at load, where llama.cpp runs the draft (or may: models/draft_runtime.py compares it with
torch), a Q4_0 copy is made once (`$QUICKDRAFT_HOME/converted/`), both files are measured by the
llama.cpp probe (a child process, cached per machine), and the copy is taken only where it is
faster by MARGIN at its step or its prefill and slower at neither. Elsewhere the file as given
runs. `model.draft_format: as-is` turns it off.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from quickdraft.decoding.llamacpp import library
from quickdraft.errors import ModelError
from quickdraft.models import llamacpp_probe, store
from quickdraft.models.llamacpp_probe import ProbeResult

log = logging.getLogger(__name__)

COPY_FORMAT = "Q4_0"
MARGIN = 0.9
"""The copy must be faster by this much (its step time or its prefill time at most this
share of the original's) to be taken: below it, measurement noise decides nothing."""
REQUANTIZABLE = {0, 1, 7, 8, 9, 14, 15, 16, 17, 18, 32}
"""llama.cpp file types (`general.file_type`) a Q4_0 copy is made from: F32, F16, BF16, Q8_0,
Q5_0/1 and the 4-6 bit K-quants. Q4_0 itself and the lower-bit types are kept as they are."""
Q4_0 = 2


@dataclass(frozen=True)
class DraftFormat:
    path: Path
    """The GGUF the draft runs from."""
    reason: str
    copy: bool = False
    """Whether that is the Q4_0 copy."""
    extra_bufts: bool = False
    """Whether llama.cpp loads it with its extra (AMX/repack) buffers: as the probe of this very
    file found. Never the target's verdict: on an AMX Xeon the F32 tiny target ran with them and
    its Q4_0 draft copy crashed with them (a SIGSEGV in CI). False where the file could not be
    measured: slower at worst, never a crash."""


_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
"""Bytes of a GGUF scalar value by its type; 8 is a string, 9 an array."""
_STRING, _ARRAY = 8, 9


def file_type(path: Path) -> int:
    """A GGUF's `general.file_type` (0, all F32, where the file does not say), read from its
    header alone: the metadata is walked key by key, skipping values, up to that key (a full
    reader would parse the 151k-token vocabulary first, 12 s on a 2-core Zen 2)."""
    try:
        with open(path, "rb") as file:
            magic, _version, _tensors, keys = struct.unpack("<4sIQQ", file.read(24))
            if magic != b"GGUF":
                raise ModelError(f"{path} is not a GGUF file")

            def read(size: int) -> bytes:
                data = file.read(size)
                if len(data) != size:
                    raise ModelError(f"{path} ends inside its metadata")
                return data

            def skip(kind: int) -> None:
                if kind == _STRING:
                    file.seek(struct.unpack("<Q", read(8))[0], 1)
                elif kind == _ARRAY:
                    element, count = struct.unpack("<IQ", read(12))
                    if element in _SIZES:
                        file.seek(_SIZES[element] * count, 1)
                    else:
                        for _ in range(count):
                            skip(element)
                elif kind in _SIZES:
                    file.seek(_SIZES[kind], 1)
                else:
                    raise ModelError(f"{path}: unknown metadata type {kind}")

            for _ in range(keys):
                key = read(struct.unpack("<Q", read(8))[0])
                kind = struct.unpack("<I", read(4))[0]
                if key == b"general.file_type" and kind in (4, 5):
                    return struct.unpack("<I" if kind == 4 else "<i", read(4))[0]
                skip(kind)
    except (OSError, struct.error) as exc:
        raise ModelError(f"cannot read {path}: {exc}") from exc
    return 0


def q4_0_copy(gguf: Path, *, home: Path | None = None, say: Callable[[str], None]) -> Path:
    """`gguf` requantized to Q4_0, made once under `converted/` (keyed by the file's path, size
    and time), reused after."""
    stat = gguf.stat()
    where = hashlib.sha1(str(gguf.resolve()).encode()).hexdigest()[:8]
    final = (
        store.converted_dir(home) / f"{gguf.stem}-q4_0-{stat.st_size}-{int(stat.st_mtime)}-{where}"
    )
    copy = final / f"{gguf.stem}-q4_0.gguf"
    if store.is_complete(final) and copy.is_file():
        return copy
    say(f"making a Q4_0 copy of the draft {gguf.name} for llama.cpp (once)")
    lib = library()
    with store.building(final, {"source": str(gguf), "format": COPY_FORMAT}) as temp:
        params = lib.llama_model_quantize_default_params()
        params.ftype = Q4_0
        params.allow_requantize = True
        code = lib.llama_model_quantize(str(gguf).encode(), str(temp / copy.name).encode(), params)
        if code != 0:
            raise ModelError(f"llama.cpp could not requantize {gguf.name} (code {code})")
    _remove_older_copies(gguf, final)
    return copy


def _remove_older_copies(gguf: Path, kept: Path) -> None:
    """Copies made of an earlier version of the same file (its size or time changed: a fetch
    again, an edit) are never used again: removed, so a re-fetch does not leave 400 MB behind."""
    for other in kept.parent.glob(f"{gguf.stem}-q4_0-*"):
        if other != kept and store.read_marker(other).get("source") == str(gguf):
            log.info("removing %s, a copy of an earlier %s", other.name, gguf.name)
            shutil.rmtree(other, ignore_errors=True)


def faster(copy: ProbeResult, original: ProbeResult) -> bool:
    """Whether the copy is faster by MARGIN at its one-token step or its prefill, and slower at
    neither."""
    step, step0 = copy.target_ms[1], original.target_ms[1]
    prefill, prefill0 = copy.prefill_tokens_per_s, original.prefill_tokens_per_s
    if step > step0 or prefill < prefill0:
        return False
    return step <= MARGIN * step0 or prefill * MARGIN >= prefill0


def choose_draft_format(
    gguf: Path,
    threads: int,
    *,
    home: Path | None = None,
    say: Callable[[str], None],
) -> DraftFormat:
    """The draft's GGUF as given, or its Q4_0 copy where llama.cpp runs that faster here."""
    try:
        if file_type(gguf) not in REQUANTIZABLE:
            reason = f"{gguf.name} is Q4_0 or fewer bits already"
            return as_given(gguf, threads, reason, home=home, say=say)
        copy = q4_0_copy(gguf, home=home, say=say)
        measured = _probe(copy, threads, home, say, "the draft's Q4_0 copy")
        original = llamacpp_probe.probe(gguf, threads, home=home)
    except (ModelError, OSError) as exc:
        log.warning("the draft runs as given: its Q4_0 copy could not be made or measured: %s", exc)
        return DraftFormat(gguf, f"its Q4_0 copy failed: {exc}")
    figures = (
        f"step {measured.target_ms[1]:.1f} ms against {original.target_ms[1]:.1f} ms, prefill "
        f"{measured.prefill_tokens_per_s:.0f} against {original.prefill_tokens_per_s:.0f} "
        "tokens/s"
    )
    if faster(measured, original):
        return DraftFormat(
            copy,
            f"its Q4_0 copy is faster here ({figures})",
            copy=True,
            extra_bufts=measured.extra_bufts,
        )
    return DraftFormat(
        gguf, f"its Q4_0 copy is not faster here ({figures})", extra_bufts=original.extra_bufts
    )


def as_given(
    gguf: Path,
    threads: int,
    reason: str,
    *,
    home: Path | None = None,
    say: Callable[[str], None],
) -> DraftFormat:
    """The draft's GGUF as it is, with the extra buffers its own probe (cached per machine)
    allows; without them where it cannot be measured."""
    try:
        extra_bufts = _probe(gguf, threads, home, say, f"the draft {gguf.name}").extra_bufts
    except (ModelError, OSError) as exc:
        log.warning("the draft %s could not be measured on llama.cpp: %s", gguf.name, exc)
        extra_bufts = False
    return DraftFormat(gguf, reason, extra_bufts=extra_bufts)


def _probe(
    gguf: Path, threads: int, home: Path | None, say: Callable[[str], None], what: str
) -> ProbeResult:
    """llama.cpp's probe of `gguf`, saying so where it measures (not cached yet)."""
    if not llamacpp_probe.is_measured(gguf, threads, home=home):
        say(f"measuring {what} on llama.cpp (once per machine)")
    return llamacpp_probe.probe(gguf, threads, home=home)
