"""Shard leases in the database: who may run a shard now, fenced so two holders can never both write.

DESIGN.md, Queue semantics. A queue message only *wakes* a worker; the lease decides who works:

- ``acquire`` locks the shard row (``SELECT ... FOR UPDATE SKIP LOCKED`` on PostgreSQL; SQLite
  serialises writers itself), refuses a shard that is finished, cancelled or held under an unexpired
  lease, and otherwise takes it: owner, expiry, heartbeat, ``attempt + 1`` and ``version + 1``. The new
  version is the fencing token: every later write of the holder (checkpoints, results, release) checks
  it, so a holder whose lease expired and was taken over writes nothing.
- ``attempt`` counts acquisitions since the last clean slice end; a slice that ends normally resets it.
  A shard that keeps crashing its worker (a poison shard) reaches ``max_attempts`` and becomes
  ``failed``, with the last error kept.
- ``reap`` finds work that no message may be carrying: leases that expired (their holder died) and
  shards left pending for longer than a grace period. Expired leases are bumped to a new version and
  set back to pending, which fences the dead holder.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, update
from sqlmodel import Session, col, select

from srd_worker.errors import StoreError
from srd_worker.store import queries
from srd_worker.store.models import Run, Shard, Status, utcnow

FINAL = (Status.DONE.value, Status.FAILED.value, Status.CANCELLED.value)


@dataclass(frozen=True)
class Lease:
    run_id: str
    shard_index: int
    owner: str
    version: int
    attempt: int


class LeaseLost(StoreError):
    """The lease was taken over (or the shard cancelled): the holder must stop writing."""


def acquire(
    *,
    session: Session,
    run_id: str,
    shard_index: int,
    owner: str,
    ttl_s: float,
    max_attempts: int,
    now: datetime | None = None,
) -> Lease | None:
    """Take the shard's lease, or return None if someone else holds it or there is nothing to do."""
    now = now or utcnow()
    stmt = select(Shard).where(Shard.run_id == run_id, Shard.index == shard_index)
    if session.get_bind().dialect.name == "postgresql":
        stmt = stmt.with_for_update(skip_locked=True)
    shard = session.exec(stmt).first()
    if shard is None or shard.status in FINAL:
        return None
    run = session.get(Run, run_id)
    if run is None or run.status == Status.CANCELLED.value:
        return None
    held = (
        shard.lease_owner is not None and shard.lease_expires_at is not None and shard.lease_expires_at > now
    )
    # the same owner may take its own lease again (a task retried after the database came back)
    if shard.status == Status.RUNNING.value and held and shard.lease_owner != owner:
        return None
    if shard.attempt >= max_attempts:
        shard.status = Status.FAILED.value
        shard.error = f"gave up after {shard.attempt} attempts; last error: {shard.error or 'worker lost'}"
        shard.lease_owner = None
        shard.lease_expires_at = None
        shard.version += 1
        session.add(shard)
        session.flush()
        finish_run_if_complete(session=session, run_id=run_id)
        return None
    shard.status = Status.RUNNING.value
    shard.lease_owner = owner
    shard.lease_expires_at = now + timedelta(seconds=ttl_s)
    shard.heartbeat_at = now
    shard.attempt += 1
    shard.version += 1
    session.add(shard)
    if run.status == Status.PENDING.value or run.started_at is None:
        if run.status == Status.PENDING.value:
            run.status = Status.RUNNING.value
        if run.started_at is None:  # the first lease since submit or `srdq resume`: the ETA's origin
            run.started_at = now
            run.started_tokens = queries.run_tokens(session=session, run_id=run.id)  # the rate's baseline
        session.add(run)
    session.flush()
    return Lease(run_id, shard_index, owner, shard.version, shard.attempt)


def _fenced(lease: Lease):
    return (
        col(Shard.run_id) == lease.run_id,
        col(Shard.index) == lease.shard_index,
        col(Shard.version) == lease.version,
        col(Shard.status) == Status.RUNNING.value,
    )


def check(*, session: Session, lease: Lease) -> None:
    """Raise LeaseLost unless ``lease`` is still the shard's current lease (locks the row on PostgreSQL)."""
    stmt = select(Shard.id).where(*_fenced(lease))
    if session.get_bind().dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    if session.exec(stmt).first() is None:
        raise LeaseLost(f"lease v{lease.version} on shard {lease.shard_index} of {lease.run_id} was lost")


def heartbeat(*, session: Session, lease: Lease, ttl_s: float, now: datetime | None = None) -> bool:
    """Extend the lease; False if it was lost."""
    now = now or utcnow()
    n = session.exec(
        update(Shard)
        .where(*_fenced(lease))
        .values(lease_expires_at=now + timedelta(seconds=ttl_s), heartbeat_at=now)
    ).rowcount
    return n == 1


def release(
    *, session: Session, lease: Lease, status: str, error: str | None = None, reset_attempts: bool = True
) -> None:
    """Give the lease back, setting the shard's status (pending to continue later, done, failed)."""
    values: dict = {
        "status": Status(status).value,
        "lease_owner": None,
        "lease_expires_at": None,
        "error": error,
    }
    if reset_attempts:
        values["attempt"] = 0
    n = session.exec(update(Shard).where(*_fenced(lease)).values(**values)).rowcount
    if n != 1:
        raise LeaseLost(f"lease v{lease.version} on shard {lease.shard_index} of {lease.run_id} was lost")
    if status in FINAL:
        finish_run_if_complete(session=session, run_id=lease.run_id)


def finish_run_if_complete(*, session: Session, run_id: str) -> str | None:
    """Mark the run done (or failed, if any shard failed) once every shard is final.

    Called each time a shard ends, so it asks SQL whether an unfinished shard exists (stopping at the first,
    through the (run_id, status) index) instead of reading every shard's status: 60,000 rows per finished
    shard on a run of 60,000 shards."""

    def some(*where: Any) -> bool:
        return (
            session.exec(select(Shard.id).where(Shard.run_id == run_id, *where).limit(1)).first() is not None
        )

    if not some() or some(col(Shard.status).not_in(FINAL)):
        return None
    run = session.get(Run, run_id)
    if run is None or run.status == Status.CANCELLED.value:
        return None
    run.status = Status.FAILED.value if some(Shard.status == Status.FAILED.value) else Status.DONE.value
    session.add(run)
    session.flush()
    return run.status


def reap(
    *,
    session: Session,
    pending_grace_s: float,
    now: datetime | None = None,
    queued: int | None = None,
    queue: str | None = None,
) -> list[tuple[str, int]]:
    """Shards to enqueue again: expired leases (set back to pending, version bumped) and shards
    pending for longer than ``pending_grace_s`` (their message may be lost; touched so the next
    reap waits another grace period).

    ``queued``, the number of messages waiting in the broker, keeps a deep queue from being doubled: when
    it is at least the number of stale pending shards, their messages are taken to be still waiting and
    none is re-enqueued (a run of 60,000 shards waits far longer than the grace period for its turn). Once
    workers drain the queue below that number, the stale shards are re-enqueued as before.

    ``queue``: only runs submitted to that queue (and runs that recorded none) are reaped, so a worker
    never moves another queue's shards onto its own."""
    now = now or utcnow()
    out: list[tuple[str, int]] = []
    active_runs = select(Run.id).where(col(Run.status).in_([Status.PENDING.value, Status.RUNNING.value]))
    if queue is not None:
        active_runs = active_runs.where(or_(col(Run.queue) == queue, col(Run.queue).is_(None)))
    expired = session.exec(
        select(Shard).where(
            col(Shard.run_id).in_(active_runs),
            Shard.status == Status.RUNNING.value,
            col(Shard.lease_expires_at) < now,
        )
    ).all()
    for shard in expired:
        shard.status = Status.PENDING.value
        shard.lease_owner = None
        shard.lease_expires_at = None
        shard.version += 1
        session.add(shard)
        out.append((shard.run_id, shard.index))
    stale = session.exec(
        select(Shard).where(
            col(Shard.run_id).in_(active_runs),
            Shard.status == Status.PENDING.value,
            col(Shard.updated_at) < now - timedelta(seconds=pending_grace_s),
        )
    ).all()
    if queued is not None and queued >= len(stale):
        stale = []
    for shard in stale:
        shard.updated_at = now
        session.add(shard)
        out.append((shard.run_id, shard.index))
    session.flush()
    return sorted(set(out))


def cancel_run(*, session: Session, run_id: str) -> int:
    """Cancel a run: unfinished shards become cancelled (version bumped, so holders stop). Returns how many."""
    run = session.get(Run, run_id)
    if run is None:
        raise StoreError(f"no run {run_id!r}")
    shards = session.exec(select(Shard).where(Shard.run_id == run_id, col(Shard.status).not_in(FINAL))).all()
    for shard in shards:
        shard.status = Status.CANCELLED.value
        shard.lease_owner = None
        shard.lease_expires_at = None
        shard.version += 1
        session.add(shard)
    if run.status not in (Status.DONE.value, Status.FAILED.value):
        run.status = Status.CANCELLED.value
        session.add(run)
    session.flush()
    return len(shards)


def reopen_run(*, session: Session, run_id: str) -> list[int]:
    """Make failed / cancelled / pending shards pending again (attempts reset); returns their indexes."""
    run = session.get(Run, run_id)
    if run is None:
        raise StoreError(f"no run {run_id!r}")
    shards = session.exec(
        select(Shard).where(Shard.run_id == run_id, Shard.status != Status.DONE.value)
    ).all()
    todo = []
    for shard in shards:
        if (
            shard.status == Status.RUNNING.value
            and shard.lease_expires_at
            and shard.lease_expires_at > utcnow()
        ):
            continue  # someone is working on it
        shard.status = Status.PENDING.value
        shard.attempt = 0
        shard.lease_owner = None
        shard.lease_expires_at = None
        shard.version += 1
        shard.error = None
        session.add(shard)
        todo.append(shard.index)
    if todo:
        run.status = Status.RUNNING.value
        run.started_at = None  # the next lease restarts the clock of status's rate and ETA
        session.add(run)
    session.flush()
    return todo
