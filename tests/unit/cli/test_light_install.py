"""The client install: ``pip install srdq`` with no extras in a fresh venv (no torch, no transformers, no
matplotlib) gives a working ``srdq --help``, ``status``, ``export`` and ``report`` (tables, plots skipped)
against an existing run's database, and ``srdq run`` / ``srdq worker`` refuse with the extra to install,
writing nothing; then ``pip install 'srdq[worker]'`` in the same venv runs the testbed demo. Slow (a
venv, the base dependencies and then torch from pip's cache or the registry); the one test that checks
pyproject.toml's base and worker dependencies are enough on their own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli import ROOT, run_srdq

pytestmark = pytest.mark.e2e

SOURCES = ("pyproject.toml", "README.md", "alembic.ini", "srd_worker", "cli", "migrations")


def _client_venv(tmp: Path) -> Path:
    """A fresh venv with ``pip install SRC`` (no extras), SRC a copy of the checkout (pip builds in the
    source folder; the checkout stays untouched)."""
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, src / name)
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(src)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if pip.returncode != 0:
        if "No matching distribution" in pip.stderr or "Could not find a version" in pip.stderr:
            pytest.skip(f"the package registry is not reachable: {pip.stderr.strip().splitlines()[-1]}")
        raise AssertionError(f"pip install of the client failed:\n{pip.stderr[-3000:]}")
    return venv


def _client(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("SRDQ_")}
    return subprocess.run(
        [str(venv / "bin" / "srdq"), *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300
    )


def test_the_client_install_has_no_torch_and_reads_an_existing_run(tmp_path: Path) -> None:
    out = tmp_path / "run-out"
    made = run_srdq(
        "run", "gsm8k", "--method", "best_of_n", "--n", "2", "--reward", "arithmetic", "--model",
        "tiny-random-llama", "--limit", "3", "--max-new-tokens", "8", "--out", str(out), timeout=300,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    (run_id,) = [p.name for p in out.iterdir() if p.name.startswith("run-")]

    venv = _client_venv(tmp_path)
    python = str(venv / "bin" / "python")
    for absent in ("torch", "transformers", "matplotlib", "gguf"):
        probe = subprocess.run([python, "-c", f"import {absent}"], capture_output=True, text=True)
        assert probe.returncode != 0, f"the client install pulled {absent}"

    work = tmp_path / "work"
    work.mkdir()
    for args in (["--help"], ["status", "--help"], ["export", "--help"], ["methods"], ["datasets"]):
        done = _client(venv, *args, cwd=work)
        assert done.returncode == 0, (args, done.stderr)

    status = _client(venv, "status", run_id, "--db", str(out), cwd=work)
    assert status.returncode == 0, status.stderr
    assert "done" in status.stdout and "3/3" in status.stdout

    exported = _client(venv, "export", run_id, "--db", str(out), "--out", str(work / "r.parquet"), cwd=work)
    assert exported.returncode == 0, exported.stderr
    rows = subprocess.run(
        [
            python,
            "-c",
            f"import pyarrow.parquet as pq; print(pq.read_table({str(work / 'r.parquet')!r}).num_rows)",
        ],
        capture_output=True,
        text=True,
    )
    assert rows.stdout.strip() == "3", rows.stderr

    report = _client(venv, "report", run_id, "--db", str(out), "--out", str(work / "rep"), cwd=work)
    assert report.returncode == 0, report.stderr
    text = (work / "rep" / "report.md").read_text()
    assert run_id in text and "Plots skipped" in text and "pip install 'srdq[plots]'" in text
    assert not list((work / "rep").glob("*.png"))

    for cmd in (
        ["run", "gsm8k", "--method", "sampling", "--out", str(work / "never")],
        ["worker"],
        ["testbed", "build", "--out", str(work / "never")],
        [
            "calibrate",
            "gsm8k",
            "--model",
            "testbed",
            "--draft-model",
            "testbed-draft",
            "--out",
            str(work / "never"),
        ],
    ):
        refused = _client(venv, *cmd, cwd=work)
        assert refused.returncode == 1, refused.stderr
        assert "pip install 'srdq[worker]'" in refused.stderr and "torch" in refused.stderr
    assert not (work / "never").exists()

    # the same venv plus the worker extra (the CPU torch wheel first, as the Makefile does) runs the demo
    for spec in (["torch==2.13.0"], [f"{tmp_path / 'src'}[worker]"]):
        pip = subprocess.run(
            [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *spec],
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert pip.returncode == 0, pip.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("SRDQ_")}
    demo = subprocess.run(
        [python, "-m", "srd_worker.testbed.demo", "--limit", "2", "--n", "2", "--out", str(work / "demo")],
        capture_output=True,
        text=True,
        env={**env, "SRDQ_CACHE_DIR": str(tmp_path / "cache")},
        cwd=work,
        timeout=900,
    )
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "srd" in demo.stdout and "best_of_n" in demo.stdout
