"""Drafting rounds of the fixed pools (sampling, Best-of-N, self-consistency): by default the whole token
budget in ONE engine call per round (``chunk_tokens`` 0), ``chunk_tokens`` > 0 for the old chunked rounds;
and what a resumed run reproduces in each mode (README, *Resume*): byte-identical records in both."""

from __future__ import annotations

import json

import pytest

from srd_worker.errors import ConfigError
from srd_worker.methods.base import StepContext
from srd_worker.methods.registry import build_method
from srd_worker.rewards.arithmetic import ArithmeticReward
from srd_worker.runner import run_shard
from srd_worker.tasks.base import Item
from srd_worker.tasks.gsm8k import GSM8KTask
from tests.doubles import Crash, CrashingEngine, MemoryStore, run_to_done

FIXED_POOLS = ("sampling", "best_of_n", "self_consistency")
QUESTIONS = ["What is 3 + 4?", "Tom has 5 apples and eats 2. How many are left?"]


def _params(name: str, **extra: int) -> dict[str, int]:
    return {"max_new_tokens": 24, **({} if name == "sampling" else {"n": 3}), **extra}


def _states(method, engine, seed=0, max_rounds=50):
    ctx = StepContext(engine, ArithmeticReward(), seed, extract_answer=lambda t: t.strip()[-1:] or None)
    states = [
        method.init_state(f"q{i}", q, engine.tokenizer.chat_prompt_ids([{"role": "user", "content": q}]))
        for i, q in enumerate(QUESTIONS)
    ]
    run_to_done(method, states, ctx, max_rounds)
    return states


@pytest.mark.parametrize("name", FIXED_POOLS)
def test_fixed_pool_drafts_its_whole_budget_in_one_engine_call_by_default(tiny_engine, name):
    method = build_method(name, _params(name))
    assert method.params.chunk_tokens == 0
    calls = tiny_engine.stats.generate_calls
    states = _states(method, tiny_engine)
    assert tiny_engine.stats.generate_calls - calls == 1
    for s in states:
        assert s["round"] == 1 and s["ledger"]["components"]["drafter"]["calls"] == 1
        assert all(c["finish"] in ("eos", "stop", "length") for c in s["candidates"])
        assert all(len(c["tokens"]) <= 24 for c in s["candidates"])
        # a candidate that ran out of budget got all of it in that one call
        assert all(len(c["tokens"]) == 24 for c in s["candidates"] if c["finish"] == "length")


def test_chunked_rounds_stay_available(tiny_engine):
    states = _states(build_method("sampling", _params("sampling", chunk_tokens=8)), tiny_engine)
    lengths = [len(c["tokens"]) for s in states for c in s["candidates"]]
    assert max(lengths) > 16, "the tiny model should use most of the budget"
    assert max(s["round"] for s in states) == 3  # 24 tokens in rounds of 8


def test_chunk_tokens_zero_only_where_nothing_is_decided_between_rounds():
    with pytest.raises(ConfigError, match="chunk_tokens must be >= 0"):
        build_method("best_of_n", {"chunk_tokens": -1})
    for name in ("srd", "rejection_sampling", "speculative_rejection"):
        with pytest.raises(ConfigError, match="chunk_tokens must be >= 1"):
            build_method(name, {"chunk_tokens": 0})


def test_whole_budget_draft_begins_with_the_chunked_first_chunk_then_draws_anew(tiny_engine):
    """Round 0's seed is the same in both modes: the first chunk is token for token the same; later
    chunks use other seeds (the same distribution, another text)."""
    whole = _states(build_method("best_of_n", {"n": 4, "max_new_tokens": 24}), tiny_engine)
    chunked = _states(
        build_method("best_of_n", {"n": 4, "max_new_tokens": 24, "chunk_tokens": 8}), tiny_engine
    )
    pairs = [
        (a["tokens"], b["tokens"])
        for s, t in zip(whole, chunked, strict=True)
        for a, b in zip(s["candidates"], t["candidates"], strict=True)
    ]
    assert all(a[:8] == b[:8] for a, b in pairs)
    long_pairs = [(a, b) for a, b in pairs if len(a) > 12 and len(b) > 12]
    assert long_pairs and any(a[8:] != b[8:] for a, b in long_pairs)


ITEMS = [Item(f"q{i}", q, "0") for i, q in enumerate(QUESTIONS)]


def _shard(store, engine, params, *, max_rounds=None, crash_on=None):
    """Run (or resume) one shard of ITEMS with Best-of-N; None when the engine "crashed"."""
    try:
        return run_shard(
            items=ITEMS,
            positions=list(range(len(ITEMS))),
            method=build_method("best_of_n", params),
            task=GSM8KTask(),
            engine=CrashingEngine(engine, crash_on) if crash_on else engine,
            reward=ArithmeticReward(),
            run_seed=7,
            store=store,
            max_rounds=max_rounds,
        )
    except Crash:
        return None


def _records(outcome):
    return json.dumps(
        [{k: v for k, v in r.items() if k != "timing"} for r in outcome.records], sort_keys=True
    )


def test_resume_is_byte_identical_in_both_drafting_modes(tiny_engine):
    # whole budget (default): the only checkpoint comes after the one round; a crash inside the round
    # loses it, and the resumed run redoes it with the same seeds and prefixes
    whole = {"n": 3, "max_new_tokens": 24}
    full = _shard(MemoryStore(), tiny_engine, whole)
    assert full.finished and full.rounds == 1
    store = MemoryStore()
    assert _shard(store, tiny_engine, whole, crash_on=1) is None and store.checkpoints == {}
    resumed = _shard(store, tiny_engine, whole)
    assert resumed.finished and _records(resumed) == _records(full)

    # chunked: a checkpoint after every round; stopped after round 2, or crashed inside round 2
    chunked = {"n": 3, "max_new_tokens": 24, "chunk_tokens": 8}
    full = _shard(MemoryStore(), tiny_engine, chunked)
    assert full.finished and full.rounds == 3
    for tag, kwargs, saved_round in (
        ("stop after 2", {"max_rounds": 2}, 2),
        ("crash in 2", {"crash_on": 2}, 1),
    ):
        store = MemoryStore()
        first = _shard(store, tiny_engine, chunked, **kwargs)
        assert first is None or not first.finished
        assert {r for r, _ in store.checkpoints.values()} == {saved_round}
        resumed = _shard(store, tiny_engine, chunked)
        assert resumed.finished and _records(resumed) == _records(full), tag
