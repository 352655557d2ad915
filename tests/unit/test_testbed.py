"""The CPU reasoning testbed (srd_worker/testbed): deterministic generator with correct gold answers, the
committed build matching its manifest, and the trained policy and reward model working through srdq."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from srdq_cli.main import cli

from srd_worker.rewards.arithmetic import check_claims
from srd_worker.tasks.gsm8k import GSM8KTask
from srd_worker.testbed.generator import Difficulty, generate, split_rows
from srd_worker.testbed.train import ARTIFACTS_DIR, auroc, sha256_file

MANIFEST = ARTIFACTS_DIR / "manifest.json"


def test_generator_is_deterministic_under_a_seed() -> None:
    assert generate(30, seed=5, split="test") == generate(30, seed=5, split="test")
    assert generate(30, seed=5, split="test") != generate(30, seed=6, split="test")
    assert generate(30, seed=5, split="test") != generate(30, seed=5, split="train")
    rows = generate(12, seed=1, split="x", difficulty=Difficulty(min_steps=2, max_steps=4))
    assert sorted({r["steps"] for r in rows}) == [2, 3, 4]
    assert all(len(r["solution"].splitlines()) == r["steps"] + 1 for r in rows)


def test_splits_do_not_share_questions() -> None:
    splits = split_rows(seed=0, n_train=300, n_calibration=60, n_test=60)
    train = {r["question"] for r in splits["train"]}
    assert not train & {r["question"] for r in splits["test"] + splits["calibration"]}


def test_gold_answers_pass_the_grader_and_the_arithmetic_reward(tmp_path: Path) -> None:
    rows = generate(60, seed=2, split="test", difficulty=Difficulty(max_operand=50, max_value=300))
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    task = GSM8KTask()
    items = task.load(path)
    assert [i.gold for i in items] == [str(r["final"]) for r in rows]
    for row, item in zip(rows, items, strict=True):
        assert task.grade(row["solution"], item), row
        claims = check_claims(row["solution"], complete=True)
        assert len(claims) == row["steps"] and all(c.ok for c in claims), row
        assert 0 <= row["final"] <= 300
    wrong = rows[0]["solution"].replace(
        f"\\boxed{{{rows[0]['final']}}}", f"\\boxed{{{rows[0]['final'] + 1}}}"
    )
    assert not task.grade(wrong, items[0])


def test_auroc() -> None:
    assert auroc([0.1, 0.4, 0.35, 0.8], [False, False, True, True]) == 0.75
    assert auroc([1.0, 1.0], [True, False]) == 0.5
    assert auroc([1.0], [True]) is None


def test_committed_files_match_the_manifest() -> None:
    manifest = json.loads(MANIFEST.read_text(encoding="utf-8"))
    on_disk = {
        str(p.relative_to(ARTIFACTS_DIR))
        for p in ARTIFACTS_DIR.rglob("*")
        if p.is_file() and p.name != "manifest.json"
    }
    assert on_disk == set(manifest["files"])
    for name, meta in manifest["files"].items():
        path = ARTIFACTS_DIR / name
        assert path.stat().st_size == meta["bytes"], name
        assert sha256_file(path) == meta["sha256"], name
    assert {"policy", "draft", "rm"} <= set(manifest["parameters"])
    assert manifest["reward_model"]["heldout_complete"]["auroc"] is not None


def test_policy_solves_some_easy_problems_greedily() -> None:
    """An untrained model solves none of these; the trained policy must get some right."""
    import torch

    from srd_worker.engines.loading import load_model
    from srd_worker.engines.transformers_engine import HFTokenizer
    from srd_worker.tasks.base import Item
    from srd_worker.tasks.prompts import math_messages
    from srd_worker.testbed.train import generate as lm_generate

    rows = [json.loads(x) for x in (ARTIFACTS_DIR / "data" / "test.jsonl").read_text().splitlines()]
    easy = [r for r in rows if r["steps"] == 1][:20]
    model, tokenizer = load_model("testbed", cache_dir=Path("."), dtype="float32")
    hf = HFTokenizer(tokenizer)
    prompts = [hf.chat_prompt_ids(math_messages(r["question"])) for r in easy]
    torch.set_num_threads(2)
    responses = lm_generate(model, tokenizer, prompts, greedy=True, seed=0, max_new_tokens=40)
    task = GSM8KTask()
    right = sum(
        task.grade(resp, Item(id=r["id"], question=r["question"], gold=str(r["final"]), meta={}))
        for r, resp in zip(easy, responses, strict=True)
    )
    assert right >= 8, responses


@pytest.mark.e2e
def test_srdq_run_best_of_n_with_the_testbed_policy_and_rm(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = [
        "run", str(ARTIFACTS_DIR / "data" / "test.jsonl"), "--limit", "3", "--method", "best_of_n",
        "--n", "2", "--model", str(ARTIFACTS_DIR / "policy"), "--reward", f"hf-orm:{ARTIFACTS_DIR / 'rm'}",
        "--max-new-tokens", "64", "--out", str(out),
    ]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    (results,) = out.glob("run-*/results.jsonl")
    records = [json.loads(line) for line in results.read_text(encoding="utf-8").splitlines()]
    assert len(records) == 3
    assert all(r["response"] and isinstance(r["reward"], float) for r in records)
    assert any("\\boxed{" in r["response"] for r in records)
