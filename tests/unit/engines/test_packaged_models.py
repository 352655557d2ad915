"""Packaged models (srd_worker/engines/packaged.py) on small fake chunk packages: located without being
imported, assembled in order, every chunk checked by size and sha256, a missing or altered chunk refused
by name before anything is written."""

from __future__ import annotations

import hashlib
import importlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from srd_worker.engines import packaged
from srd_worker.engines.packaged import PACKAGED_MODELS, PackagedModel, Part, assemble, verify_parts
from srd_worker.errors import ModelLoadError

pytestmark = pytest.mark.unit

CHUNKS = [b"GGUF" + bytes(range(256)) * 3, bytes(reversed(range(256))) * 2, b"tail bytes"]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def fake_model(tmp_path, monkeypatch) -> PackagedModel:
    """Three chunk packages on sys.path whose __init__ raises: importing one fails the test."""
    site = tmp_path / "site"
    parts = []
    for i, data in enumerate(CHUNKS, start=1):
        module = f"srdq_fake_chunk_part{i}"
        (site / module / "data").mkdir(parents=True)
        (site / module / "__init__.py").write_text("raise RuntimeError('a chunk package was imported')\n")
        (site / module / "data" / f"part{i:02d}.bin").write_bytes(data)
        parts.append(Part(f"srdq-fake-chunk-part{i}", module, f"data/part{i:02d}.bin", len(data), _sha(data)))
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    whole = b"".join(CHUNKS)
    return PackagedModel(
        name="fake-model",
        title="Fake-Model",
        upstream="none",
        version="1.0",
        parts=tuple(parts),
        size=len(whole),
        sha256=_sha(whole),
    )


def _chunk(model: PackagedModel, i: int) -> Path:
    spec = importlib.util.find_spec(model.parts[i].module)
    return Path(list(spec.submodule_search_locations)[0]) / model.parts[i].file


def test_assembles_in_order_and_verifies(fake_model, tmp_path):
    seen: list[int] = []
    out = assemble(fake_model, tmp_path / "out" / "model.gguf", on_bytes=seen.append)
    assert out.read_bytes() == b"".join(CHUNKS)
    assert sum(seen) == fake_model.size
    assert [p.name for p in out.parent.iterdir()] == ["model.gguf"]  # no temporary file left
    assert len(verify_parts(fake_model)) == len(CHUNKS)


def test_missing_package_names_it_and_the_install_command(fake_model, tmp_path):
    _chunk(fake_model, 1).unlink()
    (_chunk(fake_model, 1).parent.parent / "__init__.py").unlink()
    _chunk(fake_model, 1).parent.rmdir()
    _chunk(fake_model, 1).parent.parent.rmdir()
    importlib.invalidate_caches()
    with pytest.raises(ModelLoadError) as err:
        assemble(fake_model, tmp_path / "out" / "model.gguf")
    msg = str(err.value)
    assert "srdq-fake-chunk-part2==1.0" in msg and "not installed" in msg
    assert fake_model.install_command in msg
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize("how", ["truncated", "altered", "appended"])
def test_changed_chunk_is_refused_by_name_and_nothing_written(fake_model, tmp_path, how):
    path = _chunk(fake_model, 2)
    data = path.read_bytes()
    changed = {"truncated": data[:-1], "altered": data[:-1] + b"X", "appended": data + b"\0"}[how]
    path.write_bytes(changed)
    out = tmp_path / "out"
    for call in (lambda: assemble(fake_model, out / "model.gguf"), lambda: verify_parts(fake_model)):
        with pytest.raises(ModelLoadError) as err:
            call()
        msg = str(err.value)
        assert "srdq-fake-chunk-part3" in msg and "truncated or altered" in msg
        assert "--force-reinstall srdq-fake-chunk-part3==1.0" in msg
        assert ("sha256" in msg) == (how == "altered")  # same size: only the digest tells
    assert not out.exists() or not any(out.iterdir())


def test_wrong_whole_pin_is_refused(fake_model, tmp_path):
    with pytest.raises(ModelLoadError, match="assembled sha256"):
        assemble(replace(fake_model, sha256="0" * 64), tmp_path / "model.gguf")
    assert not (tmp_path / "model.gguf").exists()


def test_chunks_are_read_not_imported(fake_model, tmp_path):
    assemble(fake_model, tmp_path / "model.gguf")  # each __init__ raises if imported
    assert not any(p.module in importlib.sys.modules for p in fake_model.parts)


def test_export_is_reused_only_for_its_own_sha(fake_model, tmp_path, monkeypatch):
    """An export marked with the pinned sha256 is reused (the chunks still checked at every call); an
    export marked with other bytes is redone; a chunk altered after the export is refused."""
    exports: list[Path] = []

    def fake_export(gguf: Path, out: Path) -> None:
        assert gguf.read_bytes() == b"".join(CHUNKS)
        out.mkdir()
        (out / "model.safetensors").write_bytes(b"weights")
        exports.append(out)

    monkeypatch.setattr(packaged, "export_gguf", fake_export)
    first = packaged.export_packaged(fake_model, tmp_path / "cache")
    again = packaged.export_packaged(fake_model, tmp_path / "cache")
    assert first == again and len(exports) == 1
    marker = first / packaged.SOURCE_FILE
    assert json.loads(marker.read_text())["sha256"] == fake_model.sha256
    marker.write_text(json.dumps({"sha256": "0" * 64}))  # an export of other bytes
    packaged.export_packaged(fake_model, tmp_path / "cache")
    assert len(exports) == 2
    assert [p.name for p in first.parent.iterdir() if p.name.startswith(".export")] == []
    _chunk(fake_model, 0).write_bytes(b"GGUX" + CHUNKS[0][4:])  # altered after the export
    with pytest.raises(ModelLoadError, match="srdq-fake-chunk-part1"):
        packaged.export_packaged(fake_model, tmp_path / "cache")


def test_the_pins_add_up():
    """Each model's chunk sizes sum to its GGUF's size; names resolve, case-insensitively and by title."""
    for model in PACKAGED_MODELS.values():
        assert sum(p.size for p in model.parts) == model.size
        assert packaged.packaged_model(model.name) is model
        assert packaged.packaged_model(model.title.upper()) is model
        assert packaged.packaged_model(f"Qwen/{model.title}") is model
        assert len({p.sha256 for p in model.parts}) == len(model.parts)
    assert packaged.packaged_model("smollm2") is None


def test_the_makefile_installs_exactly_the_pinned_packages():
    """`make install-qwen` / `install-qwen-1.5b` install the packages and versions the pins name."""
    import re

    makefile = (Path(__file__).resolve().parents[3] / "Makefile").read_text(encoding="utf-8")
    for var, model in (("QWEN05_PKGS", packaged.QWEN_05B), ("QWEN15_PKGS", packaged.QWEN_15B)):
        line = re.search(rf"^{var} := \$\(foreach i,([\d ]+),(\S+)\$\(i\)==(\S+)\)$", makefile, re.M)
        assert line, var
        numbers, stem, version = line.group(1).split(), line.group(2), line.group(3)
        assert [f"{stem}{i}" for i in numbers] == [p.package for p in model.parts]
        assert version == model.version


def test_models_command_lists_every_built_in_name(tmp_path):
    """`srdq models --json`: every name srdq resolves itself, with how to install it (sizes from the pins)."""
    import json as _json

    from tests.cli import run_srdq, srdq_env

    proc = run_srdq("models", "--json", env=srdq_env(SRDQ_CACHE_DIR=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in _json.loads(proc.stdout)}
    assert {"smollm2", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "testbed", "tiny-random-llama"} <= set(
        rows
    )
    assert (
        rows["qwen2.5-coder-0.5b"]["download_mb"] == 491 and rows["qwen2.5-coder-1.5b"]["download_mb"] == 1117
    )
    assert rows["qwen2.5-coder-0.5b"]["install"] == "make install-qwen"
    assert rows["qwen2.5-coder-0.5b"]["exported"] is False  # an empty cache
