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

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Engine

from srd_worker.store import crud, queries
from srd_worker.store.db import session_scope
from srd_worker.store.models import Run, Shard, utcnow


def format_duration(seconds: float | None) -> str:
    """A duration for people: ``45s``, ``3m 05s``, ``2h 07m``, ``1d 04h``; ``n/a`` when unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "n/a"
    secs = int(round(seconds))
    if secs < 60:
        return f"{secs}s"
    mins, secs = divmod(secs, 60)
    if mins < 60:
        return f"{mins}m {secs:02d}s"
    hours, mins = divmod(mins, 60)
    if hours < 24:
        return f"{hours}h {mins:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours:02d}h"


#: Time constant of the rate behind the ETAs (seconds): progress older than a few of these hardly counts.
#: It stretches to ``ETA_GAPS`` times the mean gap between progress points when those are sparser (a
#: shard finishing every ten minutes), so the rate never rests on one or two of them.
ETA_TAU_S = 300.0
ETA_GAPS = 3.0


def ewma_rate(
    events: Iterable[tuple[float, float]], *, start: float, now: float, tau_s: float = ETA_TAU_S
) -> float | None:
    """Units per second from a progress timeline: ``events`` are (time, units finished then), oldest
    first, from ``start`` (when the work began: nothing before it counts) to ``now``.

    An exponentially weighted moving average over time: between two progress points the rate is taken
    as constant (units / gap), and each stretch of time weighs ``exp(-age / tau)`` (``tau``:
    ``max(tau_s, ETA_GAPS x the mean gap)``), normalised by the weight of the time observed, so a young
    run's rate is its plain average and a steady one's is exact however lumpy its progress (a shard's
    items all finish at once). Time since the last point counts as time without progress only beyond
    one mean gap (the next point is not late before that), so a stalled run's rate falls and its ETA
    grows. None before the first point."""
    points: list[tuple[float, float]] = []
    for t, n in events:
        if t < start:
            continue
        if points and t == points[-1][0]:  # progress at one moment (parallel workers): one point
            points[-1] = (t, points[-1][1] + n)
        else:
            points.append((t, n))
    if not points:
        return None
    mean_gap = max(points[-1][0] - start, 0.0) / len(points)
    tau = max(tau_s, ETA_GAPS * mean_gap, 1e-9)
    num = den = 0.0
    last = start
    for t, n in points:
        gap = max(t - last, 0.0)
        decay = math.exp(-gap / tau)
        # the units of this gap spread over it: their weight is the mean of exp(-age/tau) across the gap
        spread = tau * (1.0 - decay) / gap if gap > 0 else 1.0
        num = num * decay + n * spread
        den = den * decay + tau * (1.0 - decay)
        last = max(last, t)
    idle = max(now - last - mean_gap, 0.0)
    if idle > 0:
        decay = math.exp(-idle / tau)
        num, den = num * decay, den * decay + tau * (1.0 - decay)
    if den <= 0.0:  # every point at ``start`` itself: no time observed yet
        return None
    return num / den


def eta_seconds(remaining: int, rate: float | None) -> float | None:
    """Seconds left at ``rate`` units per second; 0 when nothing remains, None without a rate."""
    if remaining <= 0:
        return 0.0
    if rate is None or rate <= 0:
        return None
    return remaining / rate


#: The share of its expected tokens an item under way is always taken to still need: however many tokens
#: it has made, it is not done until its result is in (one long item is not counted as finished).
IN_FLIGHT_FLOOR = 0.1


def eta_from_tokens(
    *,
    unstarted: int,
    in_flight: int,
    in_flight_tokens: int,
    tokens_per_item: float | None,
    tokens_per_s: float | None,
) -> float | None:
    """Seconds left from the work's tokens, which credits the items under way with what they have made:
    ``unstarted`` items each need ``tokens_per_item`` (the mean of the finished ones), the ``in_flight``
    ones together that many less the ``in_flight_tokens`` they hold (at least ``IN_FLIGHT_FLOOR`` of
    their share), at ``tokens_per_s``. Counting only finished items overstates what is left when many
    items are nearly done at once (a few shards finishing together at the end of a run). 0 when nothing
    remains; None without a finished item or a rate."""
    if unstarted + in_flight <= 0:
        return 0.0
    if tokens_per_item is None or tokens_per_item <= 0 or tokens_per_s is None or tokens_per_s <= 0:
        return None
    share = tokens_per_item * in_flight
    left = tokens_per_item * unstarted + max(share - in_flight_tokens, IN_FLIGHT_FLOOR * share)
    return left / tokens_per_s


@dataclass
class RunMeter:
    """Rate and ETA of one ``srdq run`` call, from the work done *in this call* (items an earlier call
    finished and tokens a resumed checkpoint holds are not counted as speed). Tokens/s is this call's
    average; the ETA is the remaining items at the recent item rate (``ewma_rate`` over the rounds that
    finished items); unknown until an item has finished. ``clock``: seconds (tests pass their own)."""

    total: int
    done_before: int
    clock: Callable[[], float] = time.monotonic
    started: float = field(default=-1.0)
    items_done: int = 0
    tokens: int = 0
    #: (time, items finished) of every round of this call that finished items.
    progress: list[tuple[float, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.started < 0:
            self.started = self.clock()
        self.items_done = max(self.items_done, self.done_before)

    def update(self, items_done: int, round_tokens: int) -> None:
        """``items_done``: items of the whole run finished so far; ``round_tokens``: generated by the
        round just ended."""
        if items_done > self.items_done:
            self.progress.append((self.clock(), float(items_done - self.items_done)))
        self.items_done = max(self.items_done, items_done)
        self.tokens += round_tokens

    @property
    def elapsed(self) -> float:
        return max(self.clock() - self.started, 1e-9)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed

    @property
    def items_per_s(self) -> float | None:
        return ewma_rate(self.progress, start=self.started, now=self.clock())

    @property
    def eta_s(self) -> float | None:
        return eta_seconds(self.total - self.items_done, self.items_per_s)


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
    #: Why a shard is slow: "lease expired" (running, no heartbeat) or "retrying after attempt N"; for a
    #: running shard otherwise, when its last round was saved ("round 2 saved 14m 05s ago").
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
    #: Generated tokens per second: the recent rate of the finished shards while the run goes on (their
    #: ``ewma_rate``; until one finished, the average since work began), the average once it ended; both
    #: averages count only the tokens made since work (re)started (``run.started_tokens``).
    tokens_per_s: float
    #: Seconds left: ``eta_from_tokens`` (the unfinished items' expected tokens less those the items under
    #: way hold, at the average tokens/s since work began); the unfinished items at ``items_per_s`` where
    #: the runs' tokens say nothing (no finished item with tokens, none made yet).
    eta_s: float | None
    created_at: datetime
    #: When work began (the first lease since submit or resume; None: not yet, or stored before 0006).
    started_at: datetime | None = None
    #: Items per second, the ``ewma_rate`` of the shards' finish times since work began (None: none yet).
    items_per_s: float | None = None
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
        d["started_at"] = self.started_at.isoformat() if self.started_at else None
        return d


def progress_rates(
    timeline: list[tuple[datetime, int, int]], *, began: datetime, now: datetime
) -> tuple[float | None, float | None]:
    """(items/s, tokens/s) of a run from its shards' finish times (``queries.finish_timeline``: time,
    items, generated tokens), each an ``ewma_rate`` from ``began`` to ``now``."""
    origin = began.timestamp()
    at = [t.timestamp() for t, _, _ in timeline]
    items = ewma_rate(
        zip(at, (float(n) for _, n, _ in timeline), strict=True), start=origin, now=now.timestamp()
    )
    tokens = ewma_rate(
        zip(at, (float(k) for _, _, k in timeline), strict=True), start=origin, now=now.timestamp()
    )
    return items, tokens


def _shard_note(shard: Shard, now: datetime, saved_at: datetime | None = None) -> str | None:
    if shard.status == "running" and shard.lease_expires_at is not None and shard.lease_expires_at < now:
        return "lease expired"
    if shard.status == "running" and saved_at is not None:  # a long round shows no other sign of life
        return f"round {shard.round} saved {format_duration(max((now - saved_at).total_seconds(), 0.0))} ago"
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
        in_flight = queries.unfinished_items(session=session, run_id=run_id)
        shards, matched = queries.list_status_shards(
            session=session, run_id=run_id, everything=all_shards, limit=None if all_shards else limit
        )
        saved = queries.last_saved(
            session=session, run_id=run_id, shard_indices=[s.index for s in shards if s.status == "running"]
        )
        final = run.status in ("done", "failed", "cancelled")
        # between sittings (after `srdq resume`, or while a reopened `srdq run` loads its engine) nothing is
        # under way: no rate and no ETA, not the earlier sittings' progress over the time since submit
        idle = not final and run.started_at is None
        timeline = (
            [] if idle else queries.finish_timeline(session=session, run_id=run_id, since=run.started_at)
        )
    done = sum(s[1] for s in states.values())
    failed = sum(s[2] for s in states.values())
    finished_tokens = sum(s[3] for s in states.values())  # of the items with a result
    tokens = finished_tokens + running_tokens
    end = run.updated_at if final else now
    # work began at the run's first lease (since the last `srdq resume`), not when it was submitted: time in
    # the queue is not work (runs stored before migration 0006 have no start and fall back to creation)
    began = run.started_at or run.created_at
    elapsed = max((end - began).total_seconds(), 1e-9)
    # tokens made since work (re)started: a resumed run's earlier tokens are not this session's speed
    made = 0 if idle else max(tokens - (run.started_tokens if run.started_at else 0), 0)
    items_rate, tokens_rate = progress_rates(timeline, began=began, now=end)
    remaining = run.n_items - done - failed
    eta = eta_from_tokens(
        unstarted=max(remaining - in_flight, 0),
        in_flight=min(in_flight, remaining),
        in_flight_tokens=running_tokens,
        tokens_per_item=finished_tokens / (done + failed) if done + failed else None,
        tokens_per_s=made / elapsed if made else None,
    )
    if eta is None:
        eta = eta_seconds(remaining, items_rate)
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
        tokens_per_s=made / elapsed if final or tokens_rate is None else tokens_rate,
        eta_s=eta,
        created_at=run.created_at,
        started_at=run.started_at,
        items_per_s=items_rate,
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
                _shard_note(s, now, saved.get(s.index)),
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
