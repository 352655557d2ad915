"""The runner's row cap (``SRDQ_BATCH_ROWS``, ``run_shard(max_rows=R)``): a shard's items start in order
while their live candidates fit in R rows, and later items start as earlier ones keep, drop or finish
candidates. On the batch-invariant engine the records do not depend on it (seeds are per item and per
the item's own round), a crash resumes to the same records, and each item's checkpoint is written at
its own round."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from srd_worker.methods.registry import build_method
from srd_worker.provenance import applied_settings, engine_config, shard_window_on
from srd_worker.rewards.arithmetic import ArithmeticReward
from srd_worker.runner import admit
from srd_worker.settings import Settings
from srd_worker.tasks.base import Item
from tests.cli import ROOT, run_srdq, srdq_env, tiny_run_args
from tests.doubles import Crash, CrashingEngine, MemoryStore, run_items

QUESTIONS = [
    "What is 3 + 4?",
    "Tom has 5 apples and eats 2. How many are left?",
    "A box holds 6 eggs. How many eggs are in 3 boxes?",
    "Sam reads 12 pages a day. How many pages in 4 days?",
    "What is 20 - 7?",
    "Ann has 9 pens and buys 3 more. How many pens?",
    "What is 8 times 2?",
]
ITEMS = [Item(f"q{i}", q, "7") for i, q in enumerate(QUESTIONS)]
SRD = {"n": 3, "max_new_tokens": 24, "chunk_tokens": 8}


class RowsEngine(CrashingEngine):
    """The real engine, recording the number of requests of every generate call."""

    def __init__(self, inner, crash_on=None) -> None:
        super().__init__(inner, crash_on)
        self.rows: list[int] = []

    def _generate(self, requests):
        self.rows.append(len(requests))
        return self.inner.generate(requests)


def _shard(engine, store, *, method="srd", params=SRD, max_rows=0):
    return run_items(
        ITEMS, build_method(method, params), engine, ArithmeticReward(), store, seed=11, max_rows=max_rows
    )


def _records(records: list[dict[str, Any]]) -> str:
    return json.dumps([{k: v for k, v in r.items() if k != "timing"} for r in records], sort_keys=True)


@pytest.fixture(scope="module")
def uncapped(tiny_engine):
    engine = RowsEngine(tiny_engine)
    outcome = _shard(engine, MemoryStore())
    return outcome, engine.rows


@pytest.mark.parametrize("cap", [4, 7])
def test_a_row_cap_keeps_every_call_within_it_and_changes_no_record(tiny_engine, uncapped, cap):
    reference, reference_rows = uncapped
    assert max(reference_rows) == 3 * len(ITEMS)  # without a cap round 0 drafts every item at once
    engine, store = RowsEngine(tiny_engine), MemoryStore()
    outcome = _shard(engine, store, max_rows=cap)
    assert outcome.finished and engine.rows and max(engine.rows) <= cap
    assert _records(outcome.records) == _records(reference.records)
    # items started late: the last one's own rounds are fewer than the shard's, and items overlapped
    # (their own rounds add up to more than the shard ran)
    own = {item_id: r for item_id, (r, _) in store.checkpoints.items()}
    assert own[ITEMS[-1].id] < outcome.rounds
    assert sum(own.values()) > outcome.rounds
    # every checkpoint is written at the item's own round (n = 3 has no REFINE band: a round per step)
    for item_id, (r, text) in store.checkpoints.items():
        assert json.loads(text)["round"] == r, item_id


def test_a_capped_shard_resumes_after_a_crash_to_the_same_records(tiny_engine, uncapped):
    reference, _ = uncapped
    store = MemoryStore()
    with pytest.raises(Crash):
        _shard(RowsEngine(tiny_engine, crash_on=9), store, max_rows=4)
    started = set(store.checkpoints)
    assert started and started != {it.id for it in ITEMS}  # crashed with items not yet started
    outcome = _shard(RowsEngine(tiny_engine), store, max_rows=4)
    assert outcome.finished
    assert _records(outcome.records) == _records(reference.records)


def test_fixed_pools_and_rejection_sampling_under_a_cap(tiny_engine):
    for method, params in (
        ("best_of_n", {"n": 2, "max_new_tokens": 16, "chunk_tokens": 8}),
        ("rejection_sampling", {"n": 3, "max_new_tokens": 16, "chunk_tokens": 8}),
    ):
        free = _shard(RowsEngine(tiny_engine), MemoryStore(), method=method, params=params)
        engine = RowsEngine(tiny_engine)
        capped = _shard(engine, MemoryStore(), method=method, params=params, max_rows=5)
        assert max(engine.rows) <= 5, method
        assert _records(capped.records) == _records(free.records), method


class Widths:
    """A method whose width is the state's ``w`` and whose states are done when ``done`` says so."""

    def width(self, state):
        return state["w"]

    def done(self, state):
        return state["done"]


def _states(*widths: int) -> list[dict[str, Any]]:
    return [{"item_id": f"i{k}", "w": w, "done": False} for k, w in enumerate(widths)]


def test_admit_takes_items_in_order_while_they_fit_and_stops_at_the_first_that_does_not():
    states, steps = _states(3, 3, 2, 1), {}
    assert [s["item_id"] for s in admit(Widths(), states, steps, 7)] == ["i0", "i1"]  # i3 would fit: order
    assert steps == {"i0": 0, "i1": 0}
    states[0]["w"] = 1  # i0 kept one candidate: rows 4, so i2 (2) and i3 (1) start
    assert [s["item_id"] for s in admit(Widths(), states, steps, 7)] == ["i0", "i1", "i2", "i3"]
    states[1]["done"] = True
    assert [s["item_id"] for s in admit(Widths(), states, steps, 7)] == ["i0", "i2", "i3"]


def test_admit_starts_one_item_wider_than_the_cap_alone_and_zero_means_every_item():
    states, steps = _states(9, 2), {}
    assert [s["item_id"] for s in admit(Widths(), states, steps, 4)] == ["i0"]
    states[0]["done"] = True
    assert [s["item_id"] for s in admit(Widths(), states, steps, 4)] == ["i1"]
    everything = _states(9, 2, 5)
    assert admit(Widths(), everything, {}, 0) == everything


def test_admit_after_a_resume_keeps_the_checkpointed_items_first():
    states = _states(2, 2, 2)
    steps = {"i1": 3}  # i1 has a checkpoint (a resume), i0 was not started
    assert [s["item_id"] for s in admit(Widths(), states, steps, 4)] == ["i0", "i1"]
    assert [s["item_id"] for s in admit(Widths(), states, {"i2": 1}, 4)] == ["i0", "i2"]


def test_admit_lets_an_item_too_wide_for_this_step_wait_while_later_ones_fill_the_rows():
    states, steps = _states(3, 3, 2, 2), {"i0": 1, "i1": 1, "i2": 1}
    states[0]["w"], states[1]["w"], states[2]["w"] = 1, 5, 2  # i0 in a wave, i1 drafting again
    # i1 does not fit beside i0 (1 + 5 > 4) and waits; i2 (2) fits; i3 is not started while i1 waits
    assert [s["item_id"] for s in admit(Widths(), states, steps, 4)] == ["i0", "i2"]
    assert "i3" not in steps
    states[0]["done"] = True  # i1 now comes first and steps alone; i2 waits
    assert [s["item_id"] for s in admit(Widths(), states, steps, 4)] == ["i1"]
    states[1]["w"] = 1  # nothing waits: i3 starts in the room left
    assert [s["item_id"] for s in admit(Widths(), states, steps, 4)] == ["i1", "i2"]
    states[2]["w"] = 1
    assert [s["item_id"] for s in admit(Widths(), states, steps, 4)] == ["i1", "i2", "i3"]
    assert steps["i3"] == 0


def test_the_run_id_names_a_row_cap_only_when_one_is_set():
    plain = engine_config("transformers", Settings(device="cpu", dtype="float32"))
    assert "batch_rows" not in plain
    capped = engine_config("transformers", Settings(device="cpu", dtype="float32", batch_rows=64))
    assert capped == {**plain, "batch_rows": 64}
    assert engine_config("vllm", Settings(batch_rows=32))["batch_rows"] == 32
    with pytest.raises(ValueError):
        Settings(batch_rows=-1)
    # the shard window: unset by default and unnamed; set (either way) is named
    alone = engine_config("transformers", Settings(device="cpu", dtype="float32", shard_window=False))
    assert alone == {**plain, "shard_window": False}
    assert applied_settings(Settings(shard_window=False), plain).shard_window is None
    assert applied_settings(Settings(), alone).shard_window is False


def test_the_shard_window_is_on_by_default_except_in_the_refed_mode():
    """The re-fed mode's records depend on their batch and equal a fleet run's (one shard per step)."""
    default = Settings(device="cpu")
    assert shard_window_on("transformers", default) and shard_window_on("vllm", default)
    refed = Settings(device="cpu", kv_reuse=False)
    assert not shard_window_on("transformers", refed)
    assert shard_window_on("transformers", Settings(device="cpu", kv_reuse=False, batch_invariant=True))
    assert shard_window_on("vllm", refed)  # the transformers engine's modes only
    assert shard_window_on("transformers", Settings(device="cpu", kv_reuse=False, shard_window=True))
    assert not shard_window_on("vllm", Settings(shard_window=False))


def _dry_run_id(*extra: str, **env: str) -> str:
    proc = run_srdq(
        "submit", "dataset", str(ROOT / "examples" / "gsm8k_sample.jsonl"), "--method", "srd",
        "--model", "tiny-random-llama", "--reward", "arithmetic", "--limit", "2", "--dry-run", *extra,
        env=srdq_env(**env),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split(":", 1)[0]


def test_batch_rows_option_and_variable_are_one_run_id_and_zero_is_the_plain_run() -> None:
    plain, capped = _dry_run_id(), _dry_run_id("--batch-rows", "8")
    assert plain != capped
    assert _dry_run_id(SRDQ_BATCH_ROWS="8") == capped
    assert _dry_run_id("--batch-rows", "0") == plain
    bad = run_srdq(*tiny_run_args(ROOT / "examples" / "gsm8k_sample.jsonl", Path("/nonexistent/x")),
                   "--batch-rows", "-2")  # fmt: skip
    assert bad.returncode == 2 and "--batch-rows" in bad.stderr


@pytest.mark.e2e
def test_srdq_run_with_a_row_cap_matches_the_run_without_one_in_the_deterministic_mode(
    tmp_path: Path,
) -> None:
    """The whole embedded path (store, shards, records file) with a cap: the same answers and tokens as
    without one on the batch-invariant engine (each run its own store: a shared one would serve the
    second run's rewards from the score cache, which its ledger counts apart)."""
    data = ROOT / "examples" / "gsm8k_sample.jsonl"
    args = ["run", str(data), "--method", "srd", "--model", "tiny-random-llama",
            "--n", "3", "--max-new-tokens", "16", "--set", "chunk_tokens=8", "--reward", "arithmetic",
            "--limit", "6", "--deterministic"]  # fmt: skip
    records = {}
    for cap in ("0", "4"):
        out = tmp_path / f"rows-{cap}"
        proc = run_srdq(*args, "--out", str(out), "--batch-rows", cap, timeout=600)
        assert proc.returncode == 0, proc.stderr
        (folder,) = out.glob("run-*")
        lines = (folder / "results.jsonl").read_text().splitlines()
        records[cap] = [
            {k: v for k, v in json.loads(line).items() if k not in ("timing", "run_id")} for line in lines
        ]
    assert len(records["0"]) == 6 and records["0"] == records["4"]


def test_a_resumed_or_leased_run_takes_its_row_cap_from_its_spec_not_the_process() -> None:
    from srd_worker.provenance import applied_settings

    worker = Settings(device="cpu", dtype="float32", batch_rows=8)
    plain = engine_config("transformers", Settings(device="cpu", dtype="float32"))
    assert applied_settings(worker, plain).batch_rows == 0  # the run id names no cap: none
    capped = engine_config("transformers", Settings(device="cpu", dtype="float32", batch_rows=32))
    assert applied_settings(worker, capped).batch_rows == 32
    assert applied_settings(worker, {}) is worker  # a spec from before run ids named engine settings


def test_a_worker_shares_one_engine_between_runs_that_differ_only_in_their_row_cap(tmp_path: Path) -> None:
    from srd_worker.service import EngineCache

    cache = EngineCache(Settings(cache_dir=tmp_path, device="cpu", dtype="float32"))
    config = engine_config("transformers", Settings(device="cpu", dtype="float32"), resolve_device=False)
    plain = cache.get("tiny-random-llama", "transformers", config, {})
    assert cache.get("tiny-random-llama", "transformers", {**config, "batch_rows": 16}, {}) is plain
    other = cache.get("tiny-random-llama", "transformers", {**config, "kv_reuse": not config["kv_reuse"]}, {})
    assert other is not plain
