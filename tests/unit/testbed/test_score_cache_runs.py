"""The score cache in whole runs (``srdq run``'s code path) on the CPU testbed with its learned reward model:
with the cache on, SRD then rejection sampling with the same seed give records identical to the same two
runs with the cache off (the RM scoring each sequence alone, so no score depends on its batch-mates), apart
from the reward-call counters (a hit is never a reward call: calls + hits
with the cache equal the calls without it), and rejection sampling reads SRD's shared drafts' scores."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func
from sqlmodel import select

from srd_worker.engines.registry import build_engine
from srd_worker.local import run_local
from srd_worker.settings import Settings
from srd_worker.spec import prepare_run
from srd_worker.store.db import make_engine, session_scope, sqlite_url
from srd_worker.store.models import ScoreCacheRow

pytestmark = pytest.mark.e2e

RM = "hf-orm:testbed-rm"
PAIR = (("srd", {"n": 4, "max_new_tokens": 96}), ("rejection_sampling", {"n": 4, "max_new_tokens": 96}))
COUNTERS = ("rm_calls", "rm_tokens", "rm_cache_hits", "rm_cache_hit_tokens")


def run_pair(out: Path, settings: Settings, engine: Any) -> list[list[dict[str, Any]]]:
    runs = []
    for method, params in PAIR:
        prepared = prepare_run(
            dataset="testbed",
            method=method,
            params=params,
            model="testbed",
            reward=RM,
            limit=6,
            settings=settings,
        )
        summary = run_local(prepared, out_dir=out, settings=settings, engine=engine)
        runs.append([json.loads(line) for line in Path(summary.results_path).read_text().splitlines()])
    return runs


def without_reward_counters(record: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(record))
    for key in COUNTERS:
        out["ledger"].pop(key)
    out["ledger"]["components"].pop("scorer")
    (out.get("extra") or {}).get("ledger_components", {}).pop("scorer", None)
    return out


def cached_rows(out: Path) -> int:
    db = make_engine(sqlite_url(out / "srdq.db"))
    try:
        with session_scope(db) as session:
            return session.exec(select(func.count()).select_from(ScoreCacheRow)).one()
    finally:
        db.dispose()


def test_cache_on_gives_the_records_of_cache_off_with_hits_counted_apart(tmp_path: Path) -> None:
    engine = build_engine("transformers", "testbed", Settings())
    # every sequence scored alone (SRDQ_RM_MAX_BATCH_TOKENS=1): a batched RM's score of one text moves in
    # the last float bits with its batch-mates (seen on another CPU), and the cache changes who they are
    on = run_pair(tmp_path / "on", Settings(score_cache=True, rm_max_batch_tokens=1), engine)
    off = run_pair(tmp_path / "off", Settings(score_cache=False, rm_max_batch_tokens=1), engine)
    assert cached_rows(tmp_path / "off") == 0 and cached_rows(tmp_path / "on") > 0
    for run_on, run_off in zip(on, off, strict=True):
        for a, b in zip(run_on, run_off, strict=True):
            assert without_reward_counters(a) == without_reward_counters(b)
            la, lb = a["ledger"], b["ledger"]
            assert la["rm_calls"] + la["rm_cache_hits"] == lb["rm_calls"]
            assert la["rm_tokens"] + la["rm_cache_hit_tokens"] == lb["rm_tokens"]
            assert lb["rm_cache_hits"] == 0
    srd_on, rs_on = on
    # rejection sampling after SRD (same seed, same drafts): its round-0 drafts' scores are all hits
    rs_hits = sum(r["ledger"]["rm_cache_hits"] for r in rs_on)
    rs_calls_off = sum(r["ledger"]["rm_calls"] for r in off[1])
    assert rs_hits >= 4 * len(rs_on) and sum(r["ledger"]["rm_calls"] for r in rs_on) < rs_calls_off
