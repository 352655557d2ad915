"""``srdq status RUN``: one run's progress, aggregated in SQL, in a module light enough to import fast
(the store only: no methods, engines or Celery, which ``service`` would also import).

Shard counts by state and the item / token totals come from the shard rows (the counters
``crud.save_results`` keeps, migration 0004); tokens of unfinished items from the checkpoints of the
started, unfinished shards only; the listed shards are the notable ones (running, failed, slow: pending
again after an attempt crashed or raised) unless every shard is asked for. The cost grows with the
number of shards, not with items or results. Sweep status and the recent-runs table live here too;
``service`` re-exports these names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Engine

from srd_worker.store import crud, queries
from srd_worker.store.db import session_scope
from srd_worker.store.models import Run, Shard, utcnow


@dataclass
class ShardStatus:
    index: int
    status: str
    items: int
    done: int
    failed: int
    round: int
    attempt: int
    lease_owner: str | None
    error: str | None
    #: Why a shard is slow: "lease expired" (running, no heartbeat) or "retrying after attempt N".
    note: str | None = None


#: Notable shards ``srdq status`` lists at most without ``--all`` (the rest are counted).
STATUS_SHARD_LIMIT = 100


@dataclass
class RunStatus:
    run_id: str
    name: str
    status: str
    method: str
    model: str
    items: int
    done: int
    failed: int
    gen_tokens: int
    elapsed_s: float
    tokens_per_s: float
    eta_s: float | None
    created_at: datetime
    #: The listed shards: running, failed and slow ones (``notable``), or every shard (``all``).
    shards: list[ShardStatus] = field(default_factory=list)
    n_shards: int = 0
    #: state -> number of shards in it (every shard of the run).
    shard_states: dict[str, int] = field(default_factory=dict)
    listed: str = "notable"
    #: Shards that matched but were left out of ``shards`` (over ``STATUS_SHARD_LIMIT``).
    not_listed: int = 0

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        d = asdict(self)
        d["created_at"] = self.created_at.isoformat()
        return d


def _shard_note(shard: Shard, now: datetime) -> str | None:
    if shard.status == "running" and shard.lease_expires_at is not None and shard.lease_expires_at < now:
        return "lease expired"
    if shard.status == "pending" and (shard.attempt > 0 or shard.error):
        return f"retrying after attempt {shard.attempt}" if shard.attempt else "retrying"
    return None


def run_status(
    *, db: Engine, run_id: str, all_shards: bool = False, limit: int | None = STATUS_SHARD_LIMIT
) -> RunStatus:
    """Progress of one run, read from the database (never from the broker), aggregated in SQL: shard
    counts by state and item / token totals from the shards' counters (``crud.save_results``), tokens
    of unfinished items from the checkpoints of started shards only, and the listed shards: the notable
    ones (running, failed, slow: ``queries.notable_condition``; at most ``limit``) or, with
    ``all_shards``, every shard. Its cost grows with the number of shards, not items or results."""
    now = utcnow()
    with session_scope(db) as session:
        run = crud.get_run(session=session, run_id=run_id)
        states = queries.shard_states(session=session, run_id=run_id)
        running_tokens = queries.unfinished_tokens(session=session, run_id=run_id)
        shards, matched = queries.list_status_shards(
            session=session, run_id=run_id, everything=all_shards, limit=None if all_shards else limit
        )
    done = sum(s[1] for s in states.values())
    failed = sum(s[2] for s in states.values())
    tokens = sum(s[3] for s in states.values()) + running_tokens
    end = run.updated_at if run.status in ("done", "failed", "cancelled") else now
    elapsed = max((end - run.created_at).total_seconds(), 1e-9)
    rate_items = (done + failed) / elapsed
    remaining = run.n_items - done - failed
    eta = (remaining / rate_items) if rate_items > 0 and remaining > 0 else (0.0 if remaining == 0 else None)
    return RunStatus(
        run_id=run.id,
        name=run.name,
        status=run.status,
        method=run.spec.get("method", "?"),
        model=run.spec.get("model", "?"),
        items=run.n_items,
        done=done,
        failed=failed,
        gen_tokens=tokens,
        elapsed_s=elapsed,
        tokens_per_s=tokens / elapsed,
        eta_s=eta,
        created_at=run.created_at,
        shards=[
            ShardStatus(
                s.index,
                s.status,
                s.stop - s.start,
                s.n_done,
                s.n_failed,
                s.round,
                s.attempt,
                s.lease_owner,
                (s.error or "").splitlines()[0] if s.error else None,
                _shard_note(s, now),
            )
            for s in shards
        ],
        n_shards=run.n_shards,
        shard_states={state: n for state, (n, *_rest) in sorted(states.items())},
        listed="all" if all_shards else "notable",
        not_listed=matched - len(shards),
    )


@dataclass
class SweepStatus:
    sweep_id: str
    name: str
    created_at: datetime
    runs: list[RunStatus]
    params: list[dict[str, Any]]  # each run's method parameters
    seeds: list[int]

    @property
    def status(self) -> str:
        states = {r.status for r in self.runs}
        for state in ("running", "pending", "failed", "cancelled"):
            if state in states:
                return state
        return "done"

    def to_dict(self) -> dict[str, Any]:
        return {
            "sweep_id": self.sweep_id,
            "name": self.name,
            "status": self.status,
            "created_at": self.created_at.isoformat(),
            "runs": [
                {**r.to_dict(), "params": p, "seed": s}
                for r, p, s in zip(self.runs, self.params, self.seeds, strict=True)
            ],
        }


def sweep_status(*, db: Engine, sweep_id: str) -> SweepStatus:
    """Progress of every run of a sweep, in expansion order."""
    with session_scope(db) as session:
        sweep = crud.get_sweep(session=session, sweep_id=sweep_id)
        runs = crud.sweep_runs(session=session, sweep_id=sweep_id)
    return SweepStatus(
        sweep_id=sweep.id,
        name=sweep.name,
        created_at=sweep.created_at,
        runs=[run_status(db=db, run_id=r.id) for r in runs],
        params=[dict(r.spec.get("params") or {}) for r in runs],
        seeds=[int(r.spec.get("seed", 0)) for r in runs],
    )


def recent_runs(*, db: Engine, limit: int = 20) -> list[Run]:
    with session_scope(db) as session:
        return queries.recent_runs(session=session, limit=limit)


def ensure_run(*, db: Engine, run_id: str) -> None:
    """``SrdqError`` naming the run unless it is in the database."""
    from srd_worker.errors import SrdqError

    with session_scope(db) as session:
        if not queries.run_exists(session=session, run_id=run_id):
            raise SrdqError(f"no run '{run_id}' in the database")
