"""SRD's incremental form steps each item in its own phase: an item drafts and routes in one step, runs
each refinement wave in a step of its own, and one engine call carries some items' drafts beside other
items' waves. On the batch-invariant engine an item's record does not depend on which items share its
steps (every draw is seeded by the item's round and the trajectory's edit count, never by the step), a
crash in the middle of a round resumes to the same records, and the runner's row cap packs the waves'
freed rows with other items' work."""

from __future__ import annotations

import json
from typing import Any

import pytest

from srd_worker.methods.base import StepContext
from srd_worker.methods.registry import build_method
from srd_worker.tasks.base import Item
from tests.doubles import Crash, CrashingEngine, HashReward, MemoryStore, run_items, run_to_done

ITEMS = [Item(f"q{i}", f"What is {i} + {3 * i}?", str(4 * i)) for i in range(5)]
DRAFT_T, EDIT_T = 0.7, 1.0
#: n = 6 has a REFINE band (u = 0.4), and N_refine = 2 lets a refined trajectory be queued again, so items
#: run different numbers of waves and fall out of step
SRD = {
    "n": 6,
    "max_new_tokens": 40,
    "chunk_tokens": 8,
    "l_max": 6,
    "scoring_interval": 3,
    "temperature": DRAFT_T,
    "editor_temperature": EDIT_T,
}


class CallsEngine(CrashingEngine):
    """The real engine, recording the sampling temperatures of every generate call's requests."""

    def __init__(self, inner, crash_on=None) -> None:
        super().__init__(inner, crash_on)
        self.temperatures: list[list[float]] = []

    def _generate(self, requests):
        self.temperatures.append([r.params.temperature for r in requests])
        return self.inner.generate(requests)


def _shard(engine, store, items=ITEMS, *, max_rows=0, params=SRD):
    positions = [ITEMS.index(it) for it in items]
    method = build_method("srd", params)
    return run_items(
        items, method, engine, HashReward(), store, seed=5, positions=positions, max_rows=max_rows
    )


def _plain(record: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in record.items() if k != "timing"}, sort_keys=True)


@pytest.fixture(scope="module")
def together(tiny_engine):
    engine = CallsEngine(tiny_engine)
    outcome = _shard(engine, MemoryStore())
    assert outcome.finished
    return outcome, engine.temperatures


def test_waves_share_engine_calls_with_other_items_drafts(together):
    outcome, calls = together
    waves = [r["extra"]["round_log"] for r in outcome.records]
    assert sum(len(rnd["waves"]) for log in waves for rnd in log) > 0  # refinement happened
    mixed = [temps for temps in calls if DRAFT_T in temps and EDIT_T in temps]
    assert mixed, "no engine call carried one item's draft beside another item's wave"
    # a wave takes a step of its own: the shard took more steps than the items' rounds
    assert outcome.rounds > max(r["extra"]["rounds"] for r in outcome.records)


def test_an_items_record_does_not_depend_on_the_items_beside_it(tiny_engine, together):
    reference, _ = together
    for k, item in enumerate(ITEMS):
        alone = _shard(tiny_engine, MemoryStore(), [item])
        assert _plain(alone.records[0]) == _plain(reference.records[k]), item.id


@pytest.mark.parametrize("cap", [6, 10])
def test_a_row_cap_packs_waves_and_drafts_and_changes_no_record(tiny_engine, together, cap):
    reference, _ = together
    engine = CallsEngine(tiny_engine)
    outcome = _shard(engine, MemoryStore(), max_rows=cap)
    assert outcome.finished and max(len(t) for t in engine.temperatures) <= cap
    assert [_plain(r) for r in outcome.records] == [_plain(r) for r in reference.records]
    if cap > SRD["n"]:  # room beside one item's draft: some call carries a draft and another's wave
        assert any(DRAFT_T in t and EDIT_T in t for t in engine.temperatures)


def test_a_crash_between_a_rounds_waves_resumes_to_the_same_records(tiny_engine, together):
    reference, _ = together
    for crash_on in range(2, 12):  # the first crash that leaves some item in the middle of a round
        store = MemoryStore()
        with pytest.raises(Crash):
            _shard(CallsEngine(tiny_engine, crash_on=crash_on), store)
        phases = [json.loads(text)["phase"] for _, text in store.checkpoints.values()]
        if "refine" in phases:
            break
    else:
        pytest.fail("no crash point left an item between its draft and its waves")
    outcome = _shard(CallsEngine(tiny_engine), store)
    assert outcome.finished
    assert [_plain(r) for r in outcome.records] == [_plain(r) for r in reference.records]


def test_a_checkpoint_written_before_the_phases_existed_resumes(tiny_engine):
    """States of the earlier layout (no ``keep`` / ``refining`` / ``top``: always at a round's start)."""
    method = build_method("srd", SRD)
    prompt = tiny_engine.tokenizer.chat_prompt_ids([{"role": "user", "content": ITEMS[1].question}])
    results = []
    for legacy in (False, True):
        state = method.init_state(ITEMS[1].id, ITEMS[1].question, prompt)
        if legacy:
            for key in ("keep", "refining", "top"):
                del state[key]
        run_to_done(method, [state], StepContext(tiny_engine, HashReward(), 5))
        res = method.result(state)
        results.append(json.dumps({k: v for k, v in res.items() if k != "ledger_components"}, sort_keys=True))
    assert results[0] == results[1]


def test_width_counts_a_waves_regenerations(tiny_engine):
    prompt = tiny_engine.tokenizer.chat_prompt_ids([{"role": "user", "content": "What is 1 + 1?"}])
    for params, per_entry in (({}, 1), ({"policy": "refine_bob", "bob_b": 3}, 3)):
        method = build_method("srd", {**SRD, **params})
        state = method.init_state("w", "What is 1 + 1?", prompt)
        assert method.width(state) == SRD["n"]
        ctx = StepContext(tiny_engine, HashReward(), 5)
        while not method.done(state) and state["phase"] != "refine":
            method.step([state], ctx)
        assert state["phase"] == "refine"
        assert method.width(state) == len(state["refining"]) * per_entry
