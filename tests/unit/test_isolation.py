"""Per-item fault isolation (srd_worker/isolation.py) on the real runner: ``run_shard`` over a real SQLite
store with the tiny random Llama, faults injected by wrappers around the real engine and reward
(tests/faults.py). The wrapped engine generates request by request, so a run that split its batches can
be compared exactly with one that did not."""

from __future__ import annotations

import pytest

from srd_worker.errors import ConfigError, EngineError, RewardError
from srd_worker.isolation import INFRA, ITEM, OOM, SystemicFault, classify
from srd_worker.methods.registry import build_method
from srd_worker.reports.builder import build_report
from srd_worker.reports.rows import RunRecords
from srd_worker.reports.tables import failed_items_table
from srd_worker.rewards.arithmetic import ArithmeticReward
from srd_worker.runner import run_shard
from srd_worker.store import crud
from srd_worker.store.db import make_engine, session_scope, sqlite_url, upgrade
from srd_worker.store.shard_store import SqlShardStore
from srd_worker.tasks.base import Item
from srd_worker.tasks.gsm8k import GSM8KTask
from tests.faults import FaultyEngine, FaultyReward

POISON = "[poison]"
PARAMS = {"n": 1, "max_new_tokens": 4, "chunk_tokens": 2}  # two rounds per item, one request each


def make_items(count: int, poison_at: int | None = None) -> list[Item]:
    return [
        Item(f"q{i}", f"What is {i} + {i + 2}?" + (f" {POISON}" if i == poison_at else ""), str(2 * i + 2))
        for i in range(count)
    ]


def strip(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "timing"} for r in records]


class Shard:
    """One shard of a run in a fresh SQLite store."""

    def __init__(self, tmp_path, items: list[Item], name: str = "s") -> None:
        url = sqlite_url(tmp_path / f"{name}.db")
        upgrade(url)
        self.db = make_engine(url)
        self.items = items
        with session_scope(self.db) as session:
            crud.create_run(
                session=session,
                run_id="r",
                name=name,
                spec={},
                config_hash="",
                versions={},
                items=items,
                shard_size=len(items),
            )
        self.store = SqlShardStore(self.db, "r", 0)

    def run(self, engine, reward=None, **kwargs):
        return run_shard(
            items=self.items,
            positions=list(range(len(self.items))),
            method=build_method("best_of_n", PARAMS),
            task=GSM8KTask(),
            engine=engine,
            reward=reward or ArithmeticReward(),
            run_seed=11,
            store=self.store,
            **kwargs,
        )


@pytest.fixture(scope="module")
def clean(tmp_path_factory, tiny_engine):
    """Records of four unpoisoned items, stepped as whole batches."""
    out = Shard(tmp_path_factory.mktemp("clean"), make_items(4), "clean").run(
        FaultyEngine(tiny_engine, per_request=True)
    )
    assert out.finished and out.isolation.faults == [] and out.isolation.retries == 0
    return strip(out.records)


def assert_others_equal(records: list[dict], clean: list[dict], bad: int) -> None:
    for i, (got, want) in enumerate(zip(records, clean, strict=True)):
        if i != bad:
            assert got["error"] is None
            assert got == want, f"item {i} differs from the run without the fault"


def test_poisoned_request_becomes_an_error_row_and_the_rest_completes(tmp_path, tiny_engine, clean):
    engine = FaultyEngine(tiny_engine, poison=POISON, per_request=True)
    out = Shard(tmp_path, make_items(4, poison_at=3)).run(engine)
    assert out.finished
    records = strip(out.records)
    assert_others_equal(records, clean, bad=3)
    bad = records[3]
    assert bad["error"].startswith("RuntimeError: injected fault") and POISON in bad["error"]
    assert bad["response"] is None and bad["correct"] is None
    assert bad["extra"]["fault"]["kind"] == ITEM and bad["extra"]["fault"]["round"] == 0
    assert "injected fault" in bad["extra"]["fault"]["traceback"]
    assert bad["ledger"]["gen_tokens"] == 0  # the failed attempts left no counts behind
    assert [(f.item_id, f.round, f.kind) for f in out.isolation.faults] == [("q3", 0, ITEM)]
    # binary search: 4 -> [q0, q1] ok + [q2, q3] fails -> [q2] ok + [q3] fails
    assert out.isolation.splits == 2 and out.isolation.retries == 4


def test_reward_fault_after_drafting_restores_states_before_retrying(tmp_path, tiny_engine, clean):
    # the reward raises after the round's drafts changed every state: the retried items must not keep
    # the failed attempt's candidates or ledger counts (their records equal the run without the fault)
    engine = FaultyEngine(tiny_engine, per_request=True)
    out = Shard(tmp_path, make_items(4, poison_at=1)).run(
        engine, reward=FaultyReward(ArithmeticReward(), POISON)
    )
    records = strip(out.records)
    assert_others_equal(records, clean, bad=1)
    bad = records[1]
    assert bad["error"].startswith("ValueError: injected reward fault")
    assert bad["ledger"]["rm_calls"] == 0 and bad["extra"]["fault"]["round"] >= 0
    assert [f.item_id for f in out.isolation.faults] == ["q1"]


def test_out_of_memory_lowers_the_batch_limit_for_the_rest_of_the_slice(tmp_path, tiny_engine, clean):
    engine = FaultyEngine(tiny_engine, oom_above=2, per_request=True)  # 2 requests = 2 items of n=1
    out = Shard(tmp_path, make_items(4)).run(engine)
    assert out.finished and out.isolation.faults == []
    assert strip(out.records) == clean  # nothing lost, nothing changed
    assert out.isolation.oom_events >= 1 and out.isolation.batch_limit == 2
    assert engine.batches and max(engine.batches) <= 2  # every batch that ran fit
    assert out.isolation.splits == 0  # an OOM halves the chunks; it is no item's fault


def test_an_item_out_of_memory_alone_is_an_item_fault(tmp_path, tiny_engine, clean):
    engine = FaultyEngine(tiny_engine, oom_poison=POISON, per_request=True)
    out = Shard(tmp_path, make_items(4, poison_at=2)).run(engine)
    records = strip(out.records)
    assert_others_equal(records, clean, bad=2)
    assert records[2]["error"].startswith("OutOfMemoryError: injected")
    assert records[2]["extra"]["fault"]["kind"] == OOM
    assert out.isolation.batch_limit == 1  # halved down to the single item that still did not fit


@pytest.mark.parametrize(
    "exc, raised",
    [
        (ConnectionRefusedError("model server down"), ConnectionRefusedError),
        (RuntimeError("the engine broke for every request"), SystemicFault),
    ],
)
def test_infrastructure_and_systemic_faults_fail_the_slice_and_write_nothing(
    tmp_path, tiny_engine, clean, exc, raised
):
    shard = Shard(tmp_path, make_items(4))
    with pytest.raises(raised):
        shard.run(FaultyEngine(tiny_engine, fail_all=exc, per_request=True))
    assert shard.store.load_checkpoints() == {}  # no round committed, no item marked as an error
    if raised is ConnectionRefusedError:  # (once is enough: the rerun costs a whole clean run)
        # the retried slice (a healthy engine now) gives what a run without the fault gives
        out = shard.run(FaultyEngine(tiny_engine, per_request=True))
        assert out.finished and strip(out.records) == clean


def test_resume_keeps_the_error_row_and_equals_an_uninterrupted_run(tmp_path, tiny_engine):
    items = make_items(3, poison_at=0)
    full = Shard(tmp_path, items, "full").run(FaultyEngine(tiny_engine, poison=POISON, per_request=True))
    shard = Shard(tmp_path, items, "resumed")
    first = shard.run(FaultyEngine(tiny_engine, poison=POISON, per_request=True), max_rounds=1)
    assert not first.finished and [f.item_id for f in first.isolation.faults] == ["q0"]
    second = shard.run(FaultyEngine(tiny_engine, poison=POISON, per_request=True))
    assert second.finished and second.isolation.faults == []  # the error came from the checkpoint
    assert strip(second.records) == strip(full.records)
    assert full.records[0]["error"] and all(r["error"] is None for r in full.records[1:])


def _http_error(status: int) -> Exception:
    import requests

    response = requests.models.Response()
    response.status_code = status
    return requests.HTTPError(f"{status} from the model server", response=response)


@pytest.mark.parametrize(
    "make, kind",
    [
        (lambda: RuntimeError("index out of range in self"), ITEM),
        (lambda: ValueError("bad token"), ITEM),
        (lambda: EngineError("request 3: prompt of 900 tokens does not fit the context of 512"), ITEM),
        (lambda: RewardError("cannot parse the response"), ITEM),
        (lambda: _http_error(400), ITEM),
        (lambda: _http_error(422), ITEM),
        (lambda: EngineError("POST http://gpu-1:8000/v1/completions: HTTP 400: prompt too long"), ITEM),
        (lambda: MemoryError(), OOM),
        (lambda: __import__("torch").OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"), OOM),
        (lambda: RuntimeError("MPS backend out of memory"), OOM),
        (lambda: ConnectionRefusedError(111, "Connection refused"), INFRA),
        (lambda: TimeoutError("timed out"), INFRA),
        (lambda: __import__("requests").ConnectionError("model server unreachable"), INFRA),
        (lambda: __import__("redis").exceptions.ConnectionError("broker gone"), INFRA),
        (lambda: __import__("sqlalchemy").exc.OperationalError("select 1", {}, Exception("gone")), INFRA),
        (lambda: _http_error(503), INFRA),
        (lambda: _http_error(429), INFRA),
        (lambda: _http_error(401), INFRA),
        (lambda: EngineError("POST http://gpu-1:8000/v1/completions: HTTP 404: no model 'x'"), INFRA),
        (
            lambda: __import__("srd_worker.errors").errors.EngineUnavailable("model server down for 300 s"),
            INFRA,
        ),
        (lambda: ConfigError("this method needs a reward model"), INFRA),
        (lambda: RuntimeError("CUDA error: device-side assert triggered"), INFRA),
    ],
)
def test_classify(make, kind):
    assert classify(make()) == kind


def test_lost_lease_is_infrastructure():
    from srd_worker.store.leases import LeaseLost

    assert classify(LeaseLost("shard 0 of r was taken over")) == INFRA


def _report_run(records: list[dict]) -> RunRecords:
    spec = {
        "method": "best_of_n",
        "task": "gsm8k",
        "model": "tiny",
        "reward": "arithmetic",
        "params": {"n": 2},
    }
    return RunRecords("run-x", "x", spec, "done", len(records), 1.0, records)


def _row(i: int, error: str | None = None, fault: dict | None = None) -> dict:
    return {
        "item_id": f"q{i}",
        "position": i,
        "response": None if error else "4",
        "correct": None if error else True,
        "reward": None if error else 0.5,
        "error": error,
        "extra": {"fault": fault} if fault else {},
        "ledger": None,
    }


def test_report_lists_failed_items_with_their_error(tmp_path):
    fault = {"kind": "item", "round": 2, "traceback": "Traceback ..."}
    records = [
        _row(0),
        _row(1, "RuntimeError: injected fault: request 0 contains '[poison]'\nsecond line", fault),
        _row(2, "prompt of 3000 tokens does not fit the model context of 2048"),
    ]
    text = build_report([_report_run(records)], tmp_path).markdown.read_text()
    assert "## Failed items" in text
    assert (
        "| run-x | q1 | 1 | item | 2 | RuntimeError: injected fault: request 0 contains '[poison]' |" in text
    )
    assert "| run-x | q2 | 2 | – | – | prompt of 3000 tokens does not fit the model context of 2048 |" in text
    assert "second line" not in text and "q0 |" not in text.split("## Failed items")[1].split("##")[0]
    table = failed_items_table([_report_run(records)], limit=1)
    assert "… and 1 more" in table and "q2" not in table
    clean = build_report([_report_run([_row(0), _row(1)])], tmp_path / "clean").markdown.read_text()
    assert "## Failed items" not in clean
