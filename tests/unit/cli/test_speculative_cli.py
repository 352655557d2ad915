"""The speculative-decoding methods through the commands a user runs: `srdq run` (embedded; crash after a
round and resume gives byte-identical results) and `srdq submit dataset --dry-run` (accepted on the
transformers engine, refused on vLLM and with a bad draft model, before anything is stored)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli import run_srdq, srdq_env

pytestmark = pytest.mark.e2e

ENV = {"SRDQ_DTYPE": "float32", "SRDQ_DEVICE": "cpu", "SRDQ_KV_REUSE": "false"}  # byte-identical resume
ARGS = [
    "--model",
    "testbed",
    "--method",
    "speculative_sampling",
    "--set",
    "draft_model=testbed-draft",
    "--set",
    "gamma=3",
    "--set",
    "chunk_tokens=8",
    "--max-new-tokens",
    "20",
    "--seed",
    "3",
]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    from srd_worker.engines.loading import TESTBED_DIR

    path = tmp_path_factory.mktemp("data") / "three.jsonl"
    lines = (TESTBED_DIR / "data" / "test.jsonl").read_text(encoding="utf-8").splitlines()[:3]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_run_crash_and_resume_is_byte_identical(tmp_path, data):
    clean = run_srdq("run", str(data), *ARGS, "--out", str(tmp_path / "a"), env=srdq_env(**ENV), timeout=300)
    assert clean.returncode == 0, clean.stderr
    assert "Loading weights" not in clean.stderr  # two real checkpoints loaded, transformers' bars off
    (results,) = (tmp_path / "a").glob("run-*/results.jsonl")
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(rows) == 3
    for r in rows:
        extra = r["extra"]
        assert r["error"] is None and r["method"] == "speculative_sampling"
        assert extra["draft_model"] == "testbed-draft" and extra["gamma"] == 3
        assert extra["target_forward_passes"] > 0 and extra["draft_forward_passes"] == 3 * extra["iterations"]
        assert 0 <= extra["acceptance_rate"] <= 1 and extra["mean_accepted_length"] >= 1
        assert r["ledger"]["gen_tokens"] <= 20
    crashed = run_srdq(
        "run",
        str(data),
        *ARGS,
        "--out",
        str(tmp_path / "b"),
        env=srdq_env(**ENV, SRDQ_CRASH_AFTER_ROUND="1"),
        timeout=300,
    )
    assert crashed.returncode == 86, crashed.stderr
    resumed = run_srdq(
        "run", str(data), *ARGS, "--out", str(tmp_path / "b"), env=srdq_env(**ENV), timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr
    (again,) = (tmp_path / "b").glob("run-*/results.jsonl")
    assert again.read_bytes() == results.read_bytes()


@pytest.mark.parametrize(
    "extra, code, message",
    [
        ([], 0, "dry run, nothing stored"),
        (
            ["--engine", "vllm"],
            1,
            "needs engine capabilities full_logits, which the 'vllm' engine does not provide",
        ),
        (
            ["--set", "draft_model=/no/such/draft"],
            1,
            "draft_model '/no/such/draft' is not a local model folder",
        ),
    ],
)
def test_submit_dry_run_accepts_or_refuses(data, extra, code, message):
    proc = run_srdq("submit", "dataset", str(data), *ARGS, *extra, "--dry-run", env=srdq_env(**ENV))
    assert proc.returncode == code, proc.stderr
    assert message in proc.stdout + proc.stderr
