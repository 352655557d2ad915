"""Service-mode operations (submit, process a shard slice, status, cancel, resume), free of Celery.

``queue.py`` (Celery tasks) and the CLI call these with an ``enqueue`` callable, so the logic is the
same whether a message came from Redis or a test. PostgreSQL is the source of truth; a message only
wakes a worker, and the shard lease (``store.leases``) decides who works.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine

from srd_worker import metrics
from srd_worker.errors import BrokerUnavailable, EngineUnavailable, StoreError
from srd_worker.spec import PreparedRun, RunSpec
from srd_worker.status import (  # noqa: F401 - re-exported: the status reads live in the light status module
    STATUS_SHARD_LIMIT,
    RunStatus,
    ShardStatus,
    SweepStatus,
    ensure_run,
    recent_runs,
    run_status,
    sweep_status,
)
from srd_worker.store import crud, leases
from srd_worker.store.db import session_scope
from srd_worker.store.models import utcnow
from srd_worker.tasks.base import Item
from srd_worker.wiring import check_spec, probe_sources, wire

if TYPE_CHECKING:
    from srd_worker.fork import Forked
    from srd_worker.settings import Settings

log = logging.getLogger("srdq.service")

Enqueue = Callable[[str, int], None]
#: Enqueue many shards of one run at once (``queue.enqueue_many``); returns how many were sent.
EnqueueMany = Callable[[str, Iterable[int]], int]


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# ----------------------------------------------------------------------------------------- GPU workers
@dataclass(frozen=True)
class GpuWorker:
    """One worker process of ``srdq worker --gpus``: the GPUs it holds (its CUDA_VISIBLE_DEVICES) and the
    Celery pool it runs: ``prefork`` for one GPU (the task runs in a daemonic pool child), ``solo`` for
    several (the task runs in the worker's own, non-daemonic process, so a vLLM engine may start the
    worker process per GPU that tensor parallelism needs; ``vllm_engine.prepare_process``)."""

    gpus: tuple[str, ...]
    pool: str

    @property
    def env(self) -> dict[str, str]:
        """What the worker process's environment gets: its GPUs, and the transformers engine on the first."""
        return {"CUDA_VISIBLE_DEVICES": ",".join(self.gpus), "SRDQ_DEVICE": "cuda:0"}


def plan_gpu_workers(gpus: str, per_worker: int = 1) -> list[GpuWorker]:
    """``srdq worker --gpus 0,1,2,3 [--gpus-per-worker N]``: the GPU ids cut, in order, into groups of N,
    one worker process per group (N = 1: one per GPU, the default; N = 2: workers on 0,1 and 2,3, each
    able to hold a tensor_parallel_size=2 vLLM engine). ConfigError for ids that are not GPU numbers, a
    repeated id, or a count that N does not divide."""
    from srd_worker.errors import ConfigError

    ids = [g.strip() for g in gpus.split(",") if g.strip()]
    if not ids or not all(g.isdigit() for g in ids):
        raise ConfigError(f"--gpus expects comma-separated GPU numbers, got {gpus!r}")
    if len(set(ids)) != len(ids):
        raise ConfigError(f"--gpus names a GPU twice: {gpus!r}")
    if per_worker < 1:
        raise ConfigError(f"--gpus-per-worker must be >= 1, got {per_worker}")
    if len(ids) % per_worker:
        raise ConfigError(
            f"--gpus-per-worker {per_worker} does not divide the {len(ids)} GPUs of --gpus {gpus!r}: give a "
            f"multiple of {per_worker} GPU ids"
        )
    pool = "prefork" if per_worker == 1 else "solo"
    return [GpuWorker(tuple(ids[i : i + per_worker]), pool) for i in range(0, len(ids), per_worker)]


# ---------------------------------------------------------------------------------------------- submit
@dataclass
class Submitted:
    run_id: str
    created: bool
    n_items: int
    n_shards: int
    enqueued: int


def submit(
    prepared: PreparedRun,
    *,
    db: Engine,
    enqueue: Enqueue,
    name: str | None = None,
    new: bool = False,
    versions: dict[str, Any] | None = None,
    enqueue_many: EnqueueMany | None = None,
    queue: str | None = None,
) -> Submitted:
    """Store the run, its shards and items (one transaction), then enqueue every shard (through
    ``enqueue_many`` when given: one broker connection for all of them).

    ``prepared.items`` may be a list or an ``ItemSpool`` (``prepare_run(stream=True)``): the items go
    into the store in bounded batches (``crud.create_run``), so memory does not grow with the dataset.
    Nothing is enqueued unless the transaction committed.

    The same dataset and spec give the same run id, so a second submit returns the existing run and
    enqueues nothing; ``new=True`` salts the id to start a fresh run. If the broker is down after the
    run is stored, nothing is lost: the shards stay pending and the reaper enqueues them. A method the
    spec's engine cannot run (or one lacking the reward it needs) is refused before anything is stored,
    as ``srdq run`` refuses it (``wiring.check_spec``; the worker checks the built engine again).
    """
    spec = prepared.spec
    check_spec(prepared.method, engine=spec.engine, reward=spec.reward, engine_args=spec.engine_args)
    probe_sources(spec, everything=False)  # a model folder here that cannot load
    run_id = spec.run_id()
    if new:
        run_id = f"{run_id}-{utcnow().strftime('%Y%m%d%H%M%S%f')}"
    with session_scope(db) as session:
        # the insert decides: of two identical submits racing, exactly one creates and enqueues
        run, created = crud.insert_run(
            session=session,
            run_id=run_id,
            name=name or f"{spec.method}-{Path(spec.dataset).stem}",
            spec=spec.stored(),
            config_hash=spec.config_hash(),
            versions=versions or {},
            items=prepared.items,
            shard_size=spec.shard_size,
            queue=queue,
        )
        n_shards = run.n_shards
    enqueued = _enqueue_run(run_id, n_shards, enqueue, enqueue_many) if created else 0
    return Submitted(run_id, created, len(prepared.items), n_shards, enqueued)


def _enqueue_run(run_id: str, n_shards: int, enqueue: Enqueue, enqueue_many: EnqueueMany | None) -> int:
    """Send one message per shard of a run just stored (through ``enqueue_many`` when given); returns how
    many were sent. A broker that refuses them raises ``BrokerUnavailable``: the run stays stored with
    its shards pending (a worker's reaper, or ``srdq resume``, enqueues them once the broker is back)."""
    try:
        if enqueue_many is not None:
            return enqueue_many(run_id, range(n_shards))
        for index in range(n_shards):
            enqueue(run_id, index)
        return n_shards
    except Exception as exc:  # noqa: BLE001 - kombu/redis raise many types; all mean "not sent"
        raise broker_unavailable(run_id, n_shards, exc) from exc


def broker_unavailable(run_id: str, n_shards: int, exc: BaseException) -> BrokerUnavailable:
    """The one line a submit prints when the broker refused its messages: the run is stored, its shards
    stay pending, and a worker's reaper (or ``srdq resume``) enqueues them once the broker is back."""
    from srd_worker.logs import mask
    from srd_worker.settings import get_settings

    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return BrokerUnavailable(
        f"run {run_id} is stored ({n_shards} shards) but the broker {mask(get_settings().broker_url)} did not "
        f"take its messages ({first}); its shards stay pending: a worker's reaper enqueues them once the "
        f"broker is back, or run `srdq resume {run_id}`"
    )


@dataclass
class SweepSubmitted:
    sweep_id: str
    run_ids: list[str]
    created: list[str]  # runs stored by this call (the others existed)
    enqueued: int


def submit_sweep(
    plan: Any,
    *,
    db: Engine,
    enqueue: Enqueue,
    versions: dict[str, Any] | None = None,
    enqueue_many: EnqueueMany | None = None,
    queue: str | None = None,
) -> SweepSubmitted:
    """Store a validated sweep (``sweep.plan_sweep``) and all its runs, shards and items in one
    transaction, then enqueue the shards of the runs created now. Submitting the same sweep again gives
    the same ids and enqueues nothing; a run already stored (outside the sweep or by another sweep) is
    not enqueued again (``srdq resume`` restarts it)."""
    from srd_worker.sweep import record_sweep

    for prepared in plan.prepared:
        spec = prepared.spec
        check_spec(prepared.method, engine=spec.engine, reward=spec.reward, engine_args=spec.engine_args)
    with session_scope(db) as session:
        created = record_sweep(session, plan, versions=versions or {}, queue=queue)
        shards = {run_id: crud.get_run(session=session, run_id=run_id).n_shards for run_id in created}
    enqueued = sum(_enqueue_run(run_id, shards[run_id], enqueue, enqueue_many) for run_id in created)
    return SweepSubmitted(plan.sweep_id, plan.run_ids, created, enqueued)


def submit_fork(
    parent_id: str,
    at_round: int,
    overrides: dict[str, str],
    *,
    db: Engine,
    enqueue: Enqueue,
    enqueue_many: EnqueueMany | None = None,
    name: str | None = None,
    versions: dict[str, Any] | None = None,
    queue: str | None = None,
) -> tuple[Forked, int]:
    """``srdq fork RUN --submit``: create the fork of ``parent_id`` at round ``at_round`` (``fork.fork_run``:
    one transaction, refused with nothing written when a change or the round is not allowed), then enqueue
    its shards as ``submit`` does; workers run it like any run (its shards resume from the copied round-R
    checkpoints). A fork that exists already is not enqueued again (``srdq resume`` restarts it). Returns
    the fork and how many shards were enqueued."""
    from srd_worker.fork import fork_run

    forked = fork_run(db, parent_id, at_round, overrides, versions=versions or {}, name=name, queue=queue)
    enqueued = _enqueue_run(forked.run_id, forked.n_shards, enqueue, enqueue_many) if forked.created else 0
    return forked, enqueued


# ----------------------------------------------------------------------------------- shard processing
class EngineCache:
    """One engine per (engine name, model, engine configuration, engine arguments) per process, built on
    first use (after the worker's fork) with the worker's settings, the run's ``engine_config`` applied
    and the run's ``engine_args`` passed to the engine's constructor (checked again here first: a run
    submitted from a machine without vLLM had its vLLM arguments checked by no one yet)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._engines: dict[tuple[str, str, str, str], Any] = {}
        self._lock = threading.Lock()

    def settings_for(self, engine_config: dict[str, Any] | None = None) -> Settings:
        """The worker's settings with a run's engine configuration applied (``provenance.applied_settings``)."""
        from srd_worker.provenance import applied_settings

        return applied_settings(self.settings, engine_config or {})

    def get(
        self,
        model: str,
        engine: str = "transformers",
        engine_config: dict[str, Any] | None = None,
        engine_args: dict[str, Any] | None = None,
    ) -> Any:
        from srd_worker.encoding import sorted_json

        # the runner's row cap is no engine setting: runs that differ only in it share one engine
        config = {k: v for k, v in (engine_config or {}).items() if k != "batch_rows"}
        key = (engine, model, sorted_json(config), sorted_json(engine_args or {}))
        with self._lock:
            if key not in self._engines:
                from srd_worker.engines.registry import build_engine, check_engine_args

                args = check_engine_args(engine, engine_args, where="the run's engine_args:")
                t0 = time.perf_counter()
                self._engines[key] = build_engine(engine, model, self.settings_for(engine_config), args)
                metrics.ENGINE_LOAD_SECONDS.labels(engine, worker_id()).observe(time.perf_counter() - t0)
            return self._engines[key]

    def close(self) -> None:
        """Close every cached engine (its optional ``close()``, engines/base.py): a vLLM engine's processes
        go away with it. Called when the worker process shuts down (queue.py); the cache is empty after."""
        with self._lock:
            engines, self._engines = list(self._engines.values()), {}
        for eng in engines:
            close = getattr(eng, "close", None)
            if callable(close):
                try:
                    close()
                except Exception as exc:  # noqa: BLE001 - on the way out: log, close the others
                    log.warning("closing engine %s: %s", getattr(eng, "name", eng), exc)


class Heartbeat:
    """Renews a lease every ttl/3 seconds in a thread; ``lost`` is set when renewal fails."""

    def __init__(self, db: Engine, lease: leases.Lease, ttl_s: float) -> None:
        self.db, self.lease, self.ttl_s = db, lease, ttl_s
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="srdq-heartbeat", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                with session_scope(self.db) as session:
                    ok = leases.heartbeat(session=session, lease=self.lease, ttl_s=self.ttl_s)
            except Exception as exc:  # database briefly unreachable: try again next beat
                log.warning("heartbeat failed: %s", exc)
                continue
            if not ok:
                self.lost.set()
                return

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@dataclass
class SliceConfig:
    lease_ttl_s: float = 60.0
    slice_rounds: int = 8
    max_attempts: int = 3
    slice_seconds: float = 600.0

    @classmethod
    def from_settings(cls, settings: Settings) -> SliceConfig:
        return cls(settings.lease_ttl_s, settings.slice_rounds, settings.max_attempts, settings.slice_seconds)


def _items(rows: list[Any]) -> tuple[list[Item], list[int]]:
    return [Item(id=r.item_key, question=r.question, gold=r.gold, meta=dict(r.meta or {})) for r in rows], [
        r.position for r in rows
    ]


def process_shard(
    run_id: str,
    shard_index: int,
    *,
    db: Engine,
    engines: EngineCache,
    enqueue: Enqueue,
    cfg: SliceConfig,
    owner: str | None = None,
    objects: Any = None,
) -> str:
    """Lease the shard and run one bounded slice of rounds.

    Returns what happened: ``skipped`` (no lease: finished, cancelled or held by another worker),
    ``continued`` (slice done, continuation enqueued), ``done``, ``lost`` (lease taken over mid-slice:
    this worker's writes were refused), ``unavailable`` (the engine's model server stayed down:
    ``EngineUnavailable``; released as pending without counting an attempt, re-enqueued), or ``error``
    (recorded on the shard, re-enqueued; the attempt cap turns a poison shard into ``failed``).
    """
    from srd_worker.runner import run_shard
    from srd_worker.store.shard_store import SqlShardStore

    owner = owner or worker_id()
    with session_scope(db) as session:
        lease = leases.acquire(
            session=session,
            run_id=run_id,
            shard_index=shard_index,
            owner=owner,
            ttl_s=cfg.lease_ttl_s,
            max_attempts=cfg.max_attempts,
        )
        if lease is None:
            return "skipped"
        spec = RunSpec(**crud.get_run(session=session, run_id=run_id).spec)
        rows = crud.list_items(session=session, run_id=run_id, shard_index=shard_index)
    started = time.perf_counter()
    event = {"run_id": run_id, "shard": shard_index, "worker": owner, "items": len(rows)}
    log.info("shard leased", extra={**event, "event": "shard_leased"})
    metrics.SHARDS_LEASED.labels(run_id, owner).inc()
    try:
        # the heartbeat starts before the engine is built: a first build (loading weights, starting a
        # vLLM engine) can take longer than the lease's TTL, and the reaper must not take the shard meanwhile
        with Heartbeat(db, lease, cfg.lease_ttl_s):
            items, positions = _items(rows)
            settings = engines.settings_for(spec.engine_config)
            engine = engines.get(spec.model, spec.engine, spec.engine_config, spec.engine_args)
            wired = wire(spec, settings=settings, engine=engine)
            from srd_worker.provenance import record_runtime, score_cache

            # engine version, model and reward revisions, once per distinct record
            record_runtime(db, run_id, spec, wired.engine, settings=settings)
            store = SqlShardStore(
                db, run_id, shard_index, lease=lease, snapshot_rounds=settings.snapshot_rounds
            )

            def slice_started(from_round: int) -> None:
                # the fleet's fixed cost, visible per slice: lease → first round (engine build, wiring)
                log.info(
                    "rounds started",
                    extra={
                        **event,
                        "event": "rounds_started",
                        "rounds": from_round,
                        "seconds": round(time.perf_counter() - started, 3),
                    },
                )

            outcome = run_shard(
                items=items,
                positions=positions,
                method=wired.method,
                task=wired.task,
                engine=wired.engine,
                reward=wired.reward,
                run_seed=spec.seed,
                store=store,
                max_rounds=cfg.slice_rounds,
                max_seconds=cfg.slice_seconds,
                on_slice_start=slice_started,
                on_round=lambda report: metrics.observe_round(run_id, owner, report),
                score_cache=score_cache(db, spec, wired.engine, wired.reward, settings=settings),
                max_rows=settings.batch_rows,
            )
    except leases.LeaseLost as exc:
        log.warning("%s", exc, extra={**event, "event": "lease_lost", "error": str(exc)})
        metrics.LEASE_LOSSES.labels(run_id, owner).inc()
        return "lost"
    except EngineUnavailable as exc:
        # the model server is down: not the shard's fault, so no attempt is counted; the slice ends, the
        # shard goes back to pending and is re-enqueued (each try waits SRDQ_OPENAI_RETRY_S for the server)
        log.warning(
            "shard %s/%s: %s; released, will resume",
            run_id,
            shard_index,
            exc,
            extra={**event, "event": "engine_unavailable", "error": str(exc)},
        )
        try:
            with session_scope(db) as session:
                leases.release(
                    session=session, lease=lease, status="pending", error=f"EngineUnavailable: {exc}"
                )
        except StoreError:
            metrics.LEASE_LOSSES.labels(run_id, owner).inc()
            return "lost"
        enqueue(run_id, shard_index)
        metrics.RETRIES.labels(run_id, owner, "engine_unavailable").inc()
        return "unavailable"
    except Exception as exc:
        log.error(
            "shard %s/%s failed: %s",
            run_id,
            shard_index,
            exc,
            extra={**event, "event": "shard_error", "error": f"{type(exc).__name__}: {exc}"},
        )
        metrics.SHARDS_FAILED.labels(run_id, owner).inc()
        error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"
        try:
            with session_scope(db) as session:
                leases.release(
                    session=session, lease=lease, status="pending", error=error, reset_attempts=False
                )
        except StoreError:
            metrics.LEASE_LOSSES.labels(run_id, owner).inc()
            return "lost"
        enqueue(run_id, shard_index)
        metrics.RETRIES.labels(run_id, owner, "error").inc()
        return "error"
    log.info(
        "shard finished" if outcome.finished else "slice ended",
        extra={
            **event,
            "event": "shard_finished" if outcome.finished else "slice_ended",
            "rounds": outcome.rounds,
            "seconds": round(time.perf_counter() - started, 3),
            # the slice's time in the method's steps (model and reward), checkpoint writes excluded:
            # seconds − compute_seconds is what the fleet adds around the rounds
            "compute_seconds": round(outcome.round_seconds - outcome.checkpoint_seconds, 3),
            **(outcome.counts() if outcome.finished else {}),
        },
    )
    if outcome.finished:
        metrics.observe_finished(run_id, owner, outcome.records)
        if objects is not None:  # upload parts + manifests (srd_worker.results.sync); never fails the shard
            from srd_worker.results.sync import upload_finished_shard

            upload_finished_shard(db=db, store=objects, run_id=run_id, shard_index=shard_index)
        return "done"  # results and the done status were written, fenced, by SqlShardStore
    with session_scope(db) as session:
        leases.release(session=session, lease=lease, status="pending")
    enqueue(run_id, shard_index)
    return "continued"


def reap(
    *,
    db: Engine,
    enqueue: Enqueue,
    pending_grace_s: float,
    queued: Callable[[], int | None] | None = None,
    queue: str | None = None,
) -> list[tuple[str, int]]:
    """Re-enqueue what ``leases.reap`` finds; ``queued()`` (the broker's queue depth, None if unknown)
    keeps a deep queue of legitimately waiting shards from being enqueued twice; ``queue``: only the runs
    submitted to it (the reaper's own queue, which ``enqueue`` sends to)."""
    depth = queued() if queued is not None else None
    with session_scope(db) as session:
        todo = leases.reap(session=session, pending_grace_s=pending_grace_s, queued=depth, queue=queue)
    for run_id, index in todo:
        enqueue(run_id, index)
    return todo


def cancel(*, db: Engine, run_id: str) -> int:
    with session_scope(db) as session:
        return leases.cancel_run(session=session, run_id=run_id)


def resume(
    *, db: Engine, run_id: str, enqueue: Enqueue, enqueue_many: EnqueueMany | None = None
) -> list[int]:
    with session_scope(db) as session:
        todo = leases.reopen_run(session=session, run_id=run_id)
    if enqueue_many is not None:
        enqueue_many(run_id, todo)
        return todo
    for index in todo:
        enqueue(run_id, index)
    return todo
