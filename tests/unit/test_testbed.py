"""The CPU reasoning testbed (srd_worker/testbed): deterministic generator with correct gold answers, the
committed build matching its manifest (files, regenerated train split), the trained policy and reward model
working through srdq (by path and by the names ``testbed`` / ``hf-orm:testbed-rm``), and a tiny build."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from srdq_cli.main import cli

from srd_worker.rewards.arithmetic import check_claims
from srd_worker.tasks.gsm8k import GSM8KTask
from srd_worker.testbed.generator import Difficulty, generate, split_rows
from srd_worker.testbed.train import ARTIFACTS_DIR, BuildConfig, ModelConfig, auroc, build, sha256_file

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
    assert manifest["parameters"]["draft"] < manifest["parameters"]["policy"]
    assert manifest["reward_model"]["heldout_complete"]["auroc"] is not None


def test_train_split_regenerates_from_the_manifest() -> None:
    """The train split is not committed: the manifest's seed and difficulty rebuild it, byte for byte."""
    import hashlib

    manifest = json.loads(MANIFEST.read_text(encoding="utf-8"))
    cfg = manifest["config"]
    rows = generate(
        cfg["n_train"], seed=manifest["seed"], split="train", difficulty=Difficulty(**cfg["difficulty"])
    )
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    assert hashlib.sha256(text.encode("utf-8")).hexdigest() == manifest["train_split"]["sha256"]
    assert len(rows) == manifest["train_split"]["rows"]


def test_testbed_names_resolve_to_the_committed_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from srd_worker.datasets import resolve_dataset
    from srd_worker.rewards.registry import parse_reward_name

    monkeypatch.chdir(tmp_path)  # no local file called testbed
    assert resolve_dataset("testbed") == ARTIFACTS_DIR / "data" / "test.jsonl"
    assert parse_reward_name("hf-orm:testbed-rm") == ("hf-orm", str(ARTIFACTS_DIR / "rm"), None)
    Path("testbed").write_text('{"question": "1+1?", "answer": "#### 2"}\n', encoding="utf-8")
    assert resolve_dataset("testbed") == Path("testbed")  # a local file still wins


def test_a_tiny_build_writes_a_loadable_set_and_its_manifest(tmp_path: Path) -> None:
    """The whole build at toy size: every stage runs and the manifest describes what was written."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    tiny = ModelConfig(
        hidden_size=16, layers=1, heads=2, kv_heads=1, intermediate_size=32, steps=2, batch_size=4
    )
    cfg = BuildConfig(
        n_train=24, n_calibration=12, n_test=8, policy=tiny, draft=tiny, rm_problems=6, rm_samples=2,
        rm_steps=2, rm_batch_size=4, eval_problems=4, eval_every=0, max_new_tokens=8,
    )  # fmt: skip
    manifest = build(tmp_path, seed=3, config=cfg, log=lambda _: None)
    assert set(manifest["files"]) >= {"data/test.jsonl", "policy/model.safetensors", "rm/model.safetensors"}
    for name, meta in manifest["files"].items():
        assert sha256_file(tmp_path / name) == meta["sha256"], name
    assert json.loads((tmp_path / "manifest.json").read_text()) == manifest
    assert manifest["train_split"]["rows"] == 24 and manifest["config"]["policy"]["steps"] == 2
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "policy").config.vocab_size > 100
    assert AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm").config.num_labels == 1


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


@pytest.mark.e2e
def test_srdq_run_by_the_testbed_names(tmp_path: Path) -> None:
    """``srdq run testbed --model testbed --reward hf-orm:testbed-rm``: the same run as by paths."""
    out = tmp_path / "out"
    common = ["--limit", "2", "--method", "best_of_n", "--n", "2", "--max-new-tokens", "48"]
    by_name = [
        "run",
        "testbed",
        *common,
        "--model",
        "testbed",
        "--reward",
        "hf-orm:testbed-rm",
        "--out",
        str(out),
    ]
    result = CliRunner().invoke(cli, by_name)
    assert result.exit_code == 0, result.output
    (results,) = out.glob("run-*/results.jsonl")
    records = [json.loads(line) for line in results.read_text(encoding="utf-8").splitlines()]
    rows = [json.loads(x) for x in (ARTIFACTS_DIR / "data" / "test.jsonl").read_text().splitlines()[:2]]
    assert [r["gold"] for r in records] == [str(r["final"]) for r in rows]
    assert all(isinstance(r["reward"], float) for r in records)
