"""Anytime curves from one run (``runner.anytime_entry``, ``reports.anytime``) on the CPU testbed's trained
policy and learned reward model: each adaptive method's per-round entries are pinned against the per-round
checkpoints (a run resumed one round at a time), the last entry is the final answer, tokens never go down,
and the curve's last point is the run's own accuracy and mean tokens."""

from __future__ import annotations

import pytest

from srd_worker.datasets import resolve_dataset
from srd_worker.engines.registry import build_engine
from srd_worker.methods.base import StepContext
from srd_worker.methods.registry import build_method
from srd_worker.reports.anytime import anytime_curve, at_round
from srd_worker.rewards.registry import build_reward
from srd_worker.runner import run_shard
from srd_worker.settings import Settings
from srd_worker.tasks.base import grade_candidate
from srd_worker.tasks.gsm8k import GSM8KTask
from tests.doubles import MemoryStore

ADAPTIVE = {
    "srd": {"n": 4, "max_new_tokens": 64, "chunk_tokens": 16},
    "rejection_sampling": {"n": 4, "max_new_tokens": 64, "chunk_tokens": 16},
    "speculative_rejection": {"n": 4, "max_new_tokens": 64},
    "beam_search": {"n": 4, "max_new_tokens": 64},
    "dvts": {"n": 4, "max_new_tokens": 64},
}


@pytest.fixture(scope="module")
def testbed():
    settings = Settings()
    engine = build_engine("transformers", "testbed", settings)
    task = GSM8KTask()
    items = task.load(resolve_dataset("testbed"))[:5]
    return engine, build_reward("hf-orm:testbed-rm", engine, settings=settings), task, items


@pytest.mark.parametrize("name", sorted(ADAPTIVE))
def test_anytime_entries_match_the_per_round_checkpoints(testbed, name: str) -> None:
    engine, reward, task, items = testbed
    method = build_method(name, ADAPTIVE[name])
    assert method.anytime
    store = MemoryStore()
    seen: dict[str, list[dict]] = {it.id: [] for it in items}
    by_id = {it.id: it for it in items}
    ctx = StepContext(engine, reward, 5, extract_answer=task.extract_answer)
    for _ in range(200):  # one round per call: every round's checkpoint is looked at
        outcome = run_shard(
            items=items,
            positions=list(range(len(items))),
            method=method,
            task=task,
            engine=engine,
            reward=reward,
            run_seed=5,
            store=store,
            max_rounds=1,
        )
        for key, (_round, state) in store.load_checkpoints().items():
            if state.get("anytime") and state["anytime"][-1]["round"] == state["round"]:
                entry = state["anytime"][-1]
                # the entry is this checkpoint: its tokens, and the answer the method would return from it
                assert entry["tokens"] == state["ledger"]["gen_tokens"]
                response, rew = method.current_best(state, ctx)
                assert (entry["answer"], entry["correct"]) == grade_candidate(task, by_id[key], response)
                assert entry["reward"] == rew
                if not seen[key] or seen[key][-1]["round"] != entry["round"]:
                    seen[key].append(entry)
        if outcome.finished:
            break
    assert outcome.finished
    for record in outcome.records:
        entries = record["extra"]["anytime"]
        assert entries == seen[record["item_id"]]  # every round's entry, as its checkpoint had it
        rounds, tokens = [e["round"] for e in entries], [e["tokens"] for e in entries]
        assert rounds == list(range(1, len(entries) + 1))
        assert tokens == sorted(tokens) and tokens[-1] == record["ledger"]["gen_tokens"]
        last = entries[-1]  # stopped after the last round = the run's answer
        assert (last["answer"], last["correct"], last["reward"]) == (
            record["answer"],
            record["correct"],
            record["reward"],
        )
    curve = anytime_curve(outcome.records)
    end = curve[-1]
    assert end.finished == end.problems == len(items)
    assert end.accuracy == sum(bool(r["correct"]) for r in outcome.records) / len(items)
    assert end.tokens == pytest.approx(sum(r["ledger"]["gen_tokens"] for r in outcome.records) / len(items))
    assert [p.tokens for p in curve] == sorted(p.tokens for p in curve)
    assert [p.finished for p in curve] == sorted(p.finished for p in curve)


def test_fixed_pools_record_no_anytime_entries(testbed) -> None:
    engine, reward, task, items = testbed
    outcome = run_shard(
        items=items[:2],
        positions=[0, 1],
        method=build_method("best_of_n", {"n": 2, "max_new_tokens": 32}),
        task=task,
        engine=engine,
        reward=reward,
        run_seed=0,
        store=MemoryStore(),
    )
    assert all("anytime" not in r["extra"] for r in outcome.records)
    assert anytime_curve(outcome.records) == []


def test_a_problem_that_finished_keeps_its_answer_and_tokens() -> None:
    early = [{"round": 1, "tokens": 10, "answer": "4", "correct": True, "reward": 1.0}]
    late = [
        {"round": 1, "tokens": 8, "answer": None, "correct": False, "reward": None},
        {"round": 2, "tokens": 20, "answer": "5", "correct": False, "reward": 0.2},
        {"round": 3, "tokens": 30, "answer": "7", "correct": True, "reward": 0.9},
    ]
    assert at_round(late, 2)["tokens"] == 20 and at_round(early, 3) is early[0]
    records = [
        {"correct": True, "error": None, "extra": {"anytime": early}},
        {"correct": True, "error": None, "extra": {"anytime": late}},
    ]
    curve = anytime_curve(records)
    assert [(p.round, p.finished, p.tokens, p.accuracy) for p in curve] == [
        (1, 1, 9.0, 0.5),
        (2, 1, 15.0, 0.5),
        (3, 2, 20.0, 1.0),
    ]
