"""Celery app and tasks (thin: validate the payload, call ``service``, report).

Queue semantics (DESIGN.md): JSON serializer only (never pickle); late acks with
``task_reject_on_worker_lost`` and prefetch 1, so a message is only gone once its slice ended; every
task runs a bounded slice of rounds far under the broker's visibility timeout and re-enqueues its
continuation; soft shutdown on SIGTERM lets the current slice finish. Redis only wakes workers:
PostgreSQL holds the truth, and each worker's reaper thread re-enqueues shards whose message was lost
or whose lease expired. A database that goes away mid-slice is retried with backoff (tenacity): the
task leases its shard again once the database is back and resumes from the last checkpoint.

The engine is built once per worker process, after the fork (``EngineCache`` inside the child), and
closed when that process shuts down (``worker_process_shutdown``), so vLLM's processes end with it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from contextlib import nullcontext
from typing import Any

from celery import Celery, signals
from sqlalchemy.exc import DBAPIError, OperationalError
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from srd_worker.settings import Settings, get_settings

log = logging.getLogger("srdq.queue")
TASK_NAME = "srdq.run_shard"
#: Messages per Redis pipeline in ``enqueue_many``.
PUBLISH_BATCH = 1000


def make_app(settings: Settings | None = None) -> Celery:
    settings = settings or get_settings()
    app = Celery("srdq", broker=settings.broker_url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=settings.queue,
        broker_transport_options={"visibility_timeout": settings.visibility_timeout_s},
        broker_connection_retry_on_startup=True,
        worker_soft_shutdown_timeout=60.0,
        worker_enable_soft_shutdown_on_idle=False,
        worker_hijack_root_logger=False,
    )
    return app


app = make_app()

_runtime: dict[str, Any] = {}
_runtime_lock = threading.Lock()


def runtime() -> dict[str, Any]:
    """Per-process settings, database engine and model cache, built on first use (after fork)."""
    with _runtime_lock:
        if not _runtime:
            from srd_worker.results.sync import store_from_settings
            from srd_worker.service import EngineCache, SliceConfig
            from srd_worker.store.db import make_engine

            settings = get_settings()
            _runtime.update(
                settings=settings,
                db=make_engine(settings.database_url),
                engines=EngineCache(settings),
                cfg=SliceConfig.from_settings(settings),
                objects=store_from_settings(settings),
            )
        return _runtime


@signals.worker_process_init.connect
def _after_fork(**_: Any) -> None:
    # connections inherited from the parent must not be shared with it
    _runtime.clear()
    _serve_metrics()


def _serve_metrics() -> None:
    """A pool process serves its metrics on SRDQ_METRICS_PORT + its index in the pool (0 = off;
    ``srd_worker.metrics``); a port it cannot bind is logged, and the process works on without metrics."""
    from celery.utils.log import current_process_index

    from srd_worker import metrics

    base = get_settings().metrics_port
    if not base:
        return
    port = base + (current_process_index(base=0) or 0)
    try:
        metrics.serve(port)
    except OSError as exc:
        log.error("metrics: cannot serve on port %d: %s", port, exc)
        return
    log.info("metrics on port %d", port)


@signals.after_setup_logger.connect
@signals.after_setup_task_logger.connect
def _log_format(logger: Any = None, **_: Any) -> None:
    """Celery's handlers get srdq's format (``SRDQ_LOG_FORMAT``: text or json lines) and secret masking,
    so a worker's lines, Celery's and srdq's alike, never show a password or key (``srd_worker.logs``)."""
    import os

    from srd_worker.logs import apply_to_handlers, settings_secrets

    if logger is not None:
        fmt = os.environ.get("SRDQ_LOG_FORMAT", "text")
        apply_to_handlers(
            logger, fmt if fmt in ("text", "json") else "text", settings_secrets(get_settings())
        )


@signals.worker_process_shutdown.connect
@signals.worker_shutdown.connect
def _before_exit(**_: Any) -> None:
    """A pool child exits (SIGTERM/SIGINT of the worker, or recycling), or a solo-pool worker (whose
    tasks ran in its own process: ``--gpus-per-worker``) shuts down: close its engines, so vLLM's engine
    core and workers do not outlive it. (In a prefork parent the cache is empty: nothing to close.)"""
    engines = _runtime.get("engines")
    if engines is not None:
        engines.close()
    from srd_worker.rewards.registry import close_rewards

    close_rewards()  # vllm-rm and a judge on vLLM hold vLLM engines of their own


def enqueue(run_id: str, shard_index: int) -> None:
    app.send_task(TASK_NAME, args=[run_id, int(shard_index)], queue=get_settings().queue)


def queue_depth(queue: str) -> int | None:
    """Messages waiting in ``queue`` on the broker (kombu's passive declare), or None if it cannot tell."""
    from kombu.exceptions import ChannelError

    try:
        with app.connection_for_write() as conn:
            return int(conn.default_channel.queue_declare(queue=queue, passive=True).message_count)
    except Exception as exc:  # noqa: BLE001 - unknown depth: the reaper falls back to re-enqueueing
        if isinstance(exc, ChannelError) and "NOT_FOUND" in str(exc):
            return 0  # no queue declared yet (no worker has consumed, nothing sent): empty
        log.warning("queue depth of %s unknown: %s", queue, exc)
        return None


def enqueue_many(run_id: str, shard_indexes: Iterable[int]) -> int:
    """``enqueue`` for many shards of one run: the settings read once, one producer (one broker
    connection) for every message, and kombu's publish batches (Redis pipelines of ``PUBLISH_BATCH``
    messages, kombu >= 5.7; one message at a time on older kombu). Returns how many were sent."""
    queue = get_settings().queue
    sent = 0
    with app.producer_or_acquire() as producer:
        batch = getattr(producer, "batch", None)
        with batch(max_size=PUBLISH_BATCH) if callable(batch) else nullcontext():
            for index in shard_indexes:
                app.send_task(TASK_NAME, args=[run_id, int(index)], queue=queue, producer=producer)
                sent += 1
    return sent


@app.task(name=TASK_NAME, acks_late=True, reject_on_worker_lost=True)
def run_shard_task(run_id: Any, shard_index: Any) -> str:
    if not isinstance(run_id, str) or not isinstance(shard_index, int) or shard_index < 0:
        log.error("dropping malformed message: run_id=%r shard_index=%r", run_id, shard_index)
        return "invalid"
    from srd_worker import metrics
    from srd_worker.service import process_shard, worker_id

    rt = runtime()
    owner = worker_id()

    def count_retry(_state: Any) -> None:
        metrics.RETRIES.labels(run_id, owner, "database").inc()

    for attempt in Retrying(
        retry=retry_if_exception_type((OperationalError, DBAPIError)),
        wait=wait_exponential(multiplier=0.5, max=10),
        stop=stop_after_delay(300),
        reraise=True,
        before_sleep=count_retry,
    ):
        with attempt:
            outcome = process_shard(
                run_id,
                shard_index,
                db=rt["db"],
                engines=rt["engines"],
                enqueue=enqueue,
                cfg=rt["cfg"],
                objects=rt["objects"],
                owner=owner,
            )
    log.info("shard %s/%s: %s", run_id, shard_index, outcome)
    return outcome


# ------------------------------------------------------------------------------------------ reaper
class Reaper(threading.Thread):
    """Every ``interval`` seconds, re-enqueue shards with expired leases or lost messages."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(name="srdq-reaper", daemon=True)
        self.settings = settings
        self.stop_event = threading.Event()

    def run(self) -> None:
        from srd_worker.results.sync import PendingUploads, store_from_settings
        from srd_worker.service import reap
        from srd_worker.store.db import make_engine

        db = make_engine(self.settings.database_url)
        uploads = PendingUploads(store_from_settings(self.settings), interval_s=self.settings.reap_interval_s)
        while not self.stop_event.wait(self.settings.reap_interval_s):
            uploads.poke(db)  # shards whose upload failed (store down): retried in the background
            try:
                todo = reap(
                    db=db,
                    enqueue=enqueue,
                    pending_grace_s=self.settings.pending_grace_s,
                    queued=lambda: queue_depth(self.settings.queue),
                    queue=self.settings.queue,
                )
                if todo:
                    log.warning("reaper re-enqueued %d shard(s): %s", len(todo), todo)
            except Exception as exc:  # database or broker briefly down: try again next time
                log.warning("reaper: %s", exc)


_reaper: Reaper | None = None


@signals.worker_ready.connect
def _start_reaper(**_: Any) -> None:
    global _reaper
    if _reaper is None:
        _reaper = Reaper(get_settings())
        _reaper.start()


def _warnings_as_json() -> None:
    """Python warnings (Celery's SecurityWarning at start-up, library deprecations) as srdq's JSON lines
    on stderr, from before Celery sets up its logging: a ``--log-format json`` worker writes nothing else."""
    import logging
    import sys

    from srd_worker.logs import SecretFilter, formatter, settings_secrets

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter("json"))
    handler.addFilter(SecretFilter(settings_secrets(get_settings())))
    logging.captureWarnings(True)
    warn_log = logging.getLogger("py.warnings")
    warn_log.addHandler(handler)
    warn_log.propagate = False


POOLS = ("prefork", "solo")


def run_worker(
    *,
    queue: str,
    concurrency: int,
    loglevel: str = "INFO",
    hostname: str | None = None,
    pool: str = "prefork",
) -> None:
    """Start a Celery worker. ``prefork`` (default): each pool child builds its engine once, after the
    fork; ``solo``: one task at a time in the worker's own process (not daemonic, so a vLLM engine over
    several GPUs may start its worker processes: ``srdq worker --gpus-per-worker``)."""
    import os
    import socket

    if pool not in POOLS:
        raise ValueError(f"pool must be one of {POOLS}, got {pool!r}")
    name = hostname or f"srdq-{os.getpid()}@{socket.gethostname()}"
    json_lines = os.environ.get("SRDQ_LOG_FORMAT") == "json"
    if json_lines:
        _warnings_as_json()
    app.worker_main(
        [
            *(["--quiet"] if json_lines else []),  # no start-up banner: every line is a JSON object
            "worker",
            f"--loglevel={loglevel}",
            "-Q",
            queue,
            "-c",
            str(concurrency if pool == "prefork" else 1),
            f"--pool={pool}",
            "-n",
            name,
            "--without-gossip",
            "--without-mingle",
        ]
    )
