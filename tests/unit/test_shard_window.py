"""``run_shards``: one window of rows across a run's shards (``srdq run``'s default, ``SRDQ_SHARD_WINDOW``).
With a row cap the next shard's items start in the rows the open shards' items free, so shards overlap;
on the batch-invariant engine the records equal those of the shards run one at a time, a crash with two
shards open resumes to the same records, and without a cap the shards run one at a time."""

from __future__ import annotations

import pytest

from srd_worker.methods.registry import build_method
from srd_worker.rewards.arithmetic import ArithmeticReward
from srd_worker.runner import ShardOutcome, ShardWork, fresh_width, run_shards
from srd_worker.tasks.gsm8k import GSM8KTask
from tests.doubles import Crash, MemoryStore
from tests.unit.test_batch_rows import ITEMS, SRD, RowsEngine, _records

SHARD = 3  # 7 items: shards of 3, 3 and 1


class StepStore(MemoryStore):
    """A MemoryStore that notes the step (a counter shared by the window's stores) of every write."""

    def __init__(self, clock: list[int]) -> None:
        super().__init__()
        self.clock, self.saved_at, self.done_at = clock, [], None

    def save_checkpoints(self, round_, states) -> None:
        super().save_checkpoints(round_, states)
        self.saved_at.append(self.clock[0])

    def save_results(self, records) -> int:
        self.done_at = self.clock[0]
        return super().save_results(records)


def _stores() -> list[StepStore]:
    clock = [0]
    return [StepStore(clock) for _ in range(0, len(ITEMS), SHARD)]


def _window(
    engine, stores, *, max_rows: int, finished: list[int] | None = None, first: int = 0
) -> list[ShardOutcome]:
    """The shards from the ``first``-th on, one per store."""
    starts = range(first * SHARD, len(ITEMS), SHARD)
    shards = [
        ShardWork(ITEMS[start : start + SHARD], list(range(start, min(start + SHARD, len(ITEMS)))), store)
        for start, store in zip(starts, stores, strict=True)
    ]

    def tick(_report) -> None:
        stores[0].clock[0] += 1

    return run_shards(
        shards,
        method=build_method("srd", SRD),
        task=GSM8KTask(),
        engine=engine,
        reward=ArithmeticReward(),
        run_seed=11,
        max_rows=max_rows,
        on_round=tick,
        on_shard_done=None if finished is None else lambda position, _: finished.append(position),
    )


def _all(outcomes: list[ShardOutcome]) -> str:
    return _records([r for o in outcomes for r in o.records])


@pytest.fixture(scope="module")
def one_at_a_time(tiny_engine):
    stores = _stores()
    outcomes = _window(RowsEngine(tiny_engine), stores, max_rows=0)
    return outcomes, stores


def test_without_a_cap_the_shards_run_one_at_a_time(one_at_a_time):
    outcomes, stores = one_at_a_time
    assert all(o.finished for o in outcomes)
    assert [[r["position"] for r in o.records] for o in outcomes] == [[0, 1, 2], [3, 4, 5], [6]]
    for before, after in zip(stores, stores[1:], strict=False):  # the next shard starts after these results
        assert before.done_at is not None and min(after.saved_at) >= before.done_at


def test_a_window_overlaps_the_shards_within_its_rows_and_changes_no_record(tiny_engine, one_at_a_time):
    reference, _ = one_at_a_time
    rows = SHARD * fresh_width(build_method("srd", SRD), GSM8KTask(), tiny_engine, ITEMS[0])
    assert rows == SHARD * SRD["n"]
    engine, stores, finished = RowsEngine(tiny_engine), _stores(), []
    outcomes = _window(engine, stores, max_rows=rows, finished=finished)
    assert all(o.finished for o in outcomes) and sorted(finished) == [0, 1, 2]
    assert max(engine.rows) <= rows
    assert _all(outcomes) == _all(reference)  # the batch-invariant engine: batches change no record
    # the second shard started before the first one's last step: its items took the rows freed
    assert min(stores[1].saved_at) < max(stores[0].saved_at)
    assert stores[-1].clock[0] < sum(len(s.saved_at) for s in one_at_a_time[1])  # fewer steps in all
    for outcome, store in zip(outcomes, stores, strict=True):  # a shard counts the steps it was in
        assert outcome.rounds == len(set(store.saved_at))


@pytest.mark.parametrize("crash_on", [3, 6])
def test_a_crash_with_two_shards_open_resumes_to_the_same_records(tiny_engine, one_at_a_time, crash_on):
    reference, _ = one_at_a_time
    rows = SHARD * SRD["n"]
    stores = _stores()
    with pytest.raises(Crash):
        _window(RowsEngine(tiny_engine, crash_on=crash_on), stores, max_rows=rows)
    open_ = [s for s in stores if s.results is None and s.checkpoints]
    assert len(open_) == 2  # died with two shards part-way (3: the first two, 6: the last two)
    # a resume is given the unfinished shards, as srdq run gives them
    left = [k for k, s in enumerate(stores) if s.results is None]
    outcomes = _window(RowsEngine(tiny_engine), [stores[k] for k in left], max_rows=rows, first=left[0])
    assert all(o.finished for o in outcomes)
    assert _records([r for s in stores for r in s.results]) == _all(reference)


def test_shards_done_before_a_crash_are_not_run_again(tiny_engine, one_at_a_time):
    """A resume is given the unfinished shards only (``srdq run`` skips the done ones); a store whose
    items all finished before its results were written is finished at once, without a step."""
    reference, _ = one_at_a_time
    stores = _stores()
    _window(RowsEngine(tiny_engine), stores, max_rows=SHARD * SRD["n"])
    finished_store = stores[1]
    finished_store.results = None  # as if the process died between the last checkpoint and the results
    engine, done = RowsEngine(tiny_engine), []
    shard = ShardWork(ITEMS[SHARD : 2 * SHARD], [3, 4, 5], finished_store)
    (outcome,) = run_shards(
        [shard],
        method=build_method("srd", SRD),
        task=GSM8KTask(),
        engine=engine,
        reward=ArithmeticReward(),
        run_seed=11,
        max_rows=SHARD * SRD["n"],
        on_shard_done=lambda position, _: done.append(position),
    )
    assert outcome.finished and done == [0] and engine.rows == []
    assert _records(outcome.records) == _records(reference[1].records)
