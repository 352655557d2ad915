"""Hostile model text through the store's every reader (issue 31), shared by the SQLite (unit) and
PostgreSQL (integration) tests: a checkpoint holding the text, then `run_status`; the text as a result's
response, answer and candidates, then export (JSONL, CSV, Parquet rows) and the report."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from sqlalchemy import Engine

from srd_worker.reports.builder import build_report
from srd_worker.reports.loading import load_report_runs
from srd_worker.results.export import encode_export, export_rows
from srd_worker.status import run_status
from srd_worker.store import crud, leases
from srd_worker.store.db import session_scope
from srd_worker.tasks.base import Item

#: Always in the text besides what the strategy draws: NUL, control characters, a lone surrogate (as
#: JSON allows it), a line separator, a BOM.
ALWAYS = "\x00\x01\x1f\x7f \u2028\ufeff"


def check_hostile_text(engine: Engine, text: str, out_dir: Path) -> None:
    text = text + ALWAYS
    run_id = f"run-hostile-{uuid.uuid4().hex[:8]}"
    items = [Item(id=f"h{i}", question=f"q{i}", gold="1", meta={}) for i in range(4)]
    with session_scope(engine) as session:
        crud.insert_run(
            session=session,
            run_id=run_id,
            name="hostile",
            spec={"method": "best_of_n", "model": "m", "params": {"n": 2}, "dataset": "d.jsonl", "seed": 0},
            config_hash="h",
            versions={},
            items=items,
            shard_size=2,
        )
        lease = leases.acquire(
            session=session, run_id=run_id, shard_index=1, owner="w", ttl_s=60, max_attempts=3
        )
        assert lease is not None
        crud.save_checkpoints(
            session=session,
            run_id=run_id,
            shard_index=1,
            round=1,
            states={"h2": {"text": text, "ledger": {"gen_tokens": 7}}, "h3": {"ledger": {"gen_tokens": 5}}},
        )
    records = [
        {
            "item_id": f"h{i}",
            "position": i,
            "question": f"q{i}",
            "gold": "1",
            "answer": text[:50] or None,
            "response": text,
            "correct": i == 0,
            "error": None,
            "method": "best_of_n",
            "reward": 0.5,
            "ledger": {"gen_tokens": 11},
            "extra": {"rewards": [0.5, 0.25]},
            "candidates": [
                {"text": text, "answer": text[:20], "correct": False, "reward": 0.25, "finish": "eos"},
                {"text": text[::-1], "answer": "1", "correct": True, "reward": 0.5, "finish": "eos"},
            ],
        }
        for i in range(2)
    ]
    with session_scope(engine) as session:
        crud.save_results(session=session, run_id=run_id, shard_index=0, records=records)
        crud.set_shard_status(session=session, run_id=run_id, shard_index=0, status="done")
    st = run_status(db=engine, run_id=run_id, all_shards=True)
    assert (st.done, st.gen_tokens) == (2, 22 + 12)
    rows = export_rows(engine, run_id)
    assert [r.get("response") for r in rows] == [text, text, None, None]  # two items not finished yet
    for fmt in ("jsonl", "csv", "parquet"):
        assert encode_export(rows, fmt)
    # JSON Lines are split at "\n" only (str.splitlines would also split at U+2028 inside a string)
    lines = encode_export(rows, "jsonl").decode("utf-8").rstrip("\n").split("\n")
    assert [json.loads(line).get("response") for line in lines] == [text, text, None, None]
    (run,) = load_report_runs(engine, [run_id])
    report = build_report([run], out_dir / run_id)
    assert report.markdown.is_file() and run_id in report.markdown.read_text(encoding="utf-8")
