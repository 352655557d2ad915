"""The fleet's commands: ``srdq worker`` (lease shards, run them, checkpoint), ``srdq status`` (a run's,
a sweep's or the recent runs' progress), ``srdq cancel`` / ``srdq resume`` and ``srdq db upgrade``.

Thin shells over ``srd_worker.service``, ``srd_worker.status`` and ``srd_worker.queue``; registered on the
``srdq`` group by ``cli/main.py``.
"""

from __future__ import annotations

import json
from typing import Any

import click
from rich.table import Table
from srdq_cli.common import console, db_option, friendly_errors, log_options, open_db, require_extra


@click.command()
@click.option("--queue", default=None, help="Queue to consume (default: SRDQ_QUEUE or 'srdq').")
@click.option("--concurrency", type=int, default=1, show_default=True, help="Worker processes (1 per GPU).")
@click.option(
    "--gpus",
    default=None,
    help="Comma-separated GPU ids: one worker process pinned to each (or to each group of --gpus-per-worker).",
)
@click.option(
    "--gpus-per-worker",
    type=int,
    default=1,
    show_default=True,
    help="With --gpus: GPUs each worker process holds, for runs whose vLLM engine spans several "
    "(--engine-arg tensor_parallel_size=N); above 1 the worker runs Celery's solo pool, one task at a time "
    "in its own process, so vLLM may start its per-GPU processes.",
)
@click.option(
    "--pool",
    type=click.Choice(["prefork", "solo"]),
    default="prefork",
    show_default=True,
    help="Celery pool: prefork (tasks in daemonic pool children) or solo (tasks in this process; what "
    "--gpus-per-worker above 1 uses).",
)
@click.option(
    "--metrics-port",
    default=None,
    metavar="PORT",
    envvar="SRDQ_METRICS_PORT",
    help="Serve Prometheus metrics at http://HOST:PORT/metrics; worker process i (of --concurrency or "
    "--gpus) serves on PORT + i. 0 or unset: off.",
)
@log_options("INFO", level_aliases=("--loglevel",), who="the worker's (Celery's and srdq's)")
@friendly_errors
def worker(
    queue: str | None,
    concurrency: int,
    gpus: str | None,
    metrics_port: str | None = None,
    gpus_per_worker: int = 1,
    pool: str = "prefork",
    log_level: str = "INFO",
    log_format: str = "text",
) -> None:
    """Run a worker: lease shards, run them in batched rounds, checkpoint, store results.

    Example: srdq worker --gpus 0,1,2,3 (four workers, one GPU each)

    Example: srdq worker --gpus 0,1 --gpus-per-worker 2 (one worker holding both GPUs, for runs submitted
    with --engine vllm --engine-arg tensor_parallel_size=2)
    """
    import os

    from srd_worker.metrics import check_ports_free, parse_port, worker_ports
    from srd_worker.settings import get_settings

    require_extra("worker", "srdq worker")

    if concurrency < 1:
        raise click.ClickException(f"--concurrency expects a number of processes >= 1, got {concurrency}")
    port = parse_port(metrics_port)
    from srd_worker.service import plan_gpu_workers

    planned = plan_gpu_workers(gpus, gpus_per_worker) if gpus else []
    check_ports_free(worker_ports(port, len(planned) or concurrency))
    os.environ["SRDQ_LOG_FORMAT"] = log_format  # the Celery processes (and --gpus children) read it
    os.environ["SRDQ_METRICS_PORT"] = str(port)  # the pool processes serve on port + their index

    queue = queue or get_settings().queue
    if planned:
        _gpu_workers(planned, queue, log_level, port)
        return
    if gpus_per_worker != 1:
        raise click.UsageError("--gpus-per-worker needs --gpus (the GPU ids the workers hold)")
    from srd_worker.queue import run_worker

    run_worker(queue=queue, concurrency=concurrency, loglevel=log_level, pool=pool)


def _gpu_workers(planned: list[Any], queue: str, loglevel: str, metrics_port: int = 0) -> None:
    import os
    import signal
    import subprocess
    import sys

    procs = []
    for i, planned_worker in enumerate(planned):
        env = {
            **os.environ,
            **planned_worker.env,
            "SRDQ_METRICS_PORT": str(metrics_port + i if metrics_port else 0),
        }
        cmd = [
            sys.executable,
            "-m",
            "srdq_cli.main",
            "worker",
            "--queue",
            queue,
            "--concurrency",
            "1",
            "--pool",
            planned_worker.pool,
            "--loglevel",
            loglevel,
        ]
        procs.append(subprocess.Popen(cmd, env=env))
        held = ",".join(planned_worker.gpus)
        console(stderr=True).print(
            f"worker pid {procs[-1].pid} on GPU{'s' if len(planned_worker.gpus) > 1 else ''} {held}"
        )

    def forward(signum: int, _frame: Any) -> None:
        for p in procs:
            p.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = [p.wait() for p in procs]
    if any(codes):
        raise click.ClickException(f"worker exit codes: {codes}")


@click.command()
@click.argument("run_id", required=False)
@click.option("--watch", is_flag=True, help="Live progress until the run ends (Ctrl-C to stop watching).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--interval", type=float, default=2.0, show_default=True, help="Refresh interval for --watch.")
@click.option(
    "--all",
    "all_shards",
    is_flag=True,
    help="List every shard of RUN_ID (default: shard counts by state, then only running, failed and slow "
    "shards, at most 100).",
)
@db_option
@friendly_errors
def status(
    run_id: str | None,
    watch: bool,
    as_json: bool,
    interval: float,
    all_shards: bool = False,
    db: str | None = None,
) -> None:
    """Progress of RUN_ID or of every run of a sweep (SWEEP_ID, sweep-...), or a table of recent runs, read
    from PostgreSQL (or --db). A run's shards are summarised by state; only running, failed and slow
    ones are listed unless --all.

    Example: srdq status run-3f2a9c1b7d20 --all

    Example: srdq status sweep-0123456789ab --db srdq-out
    """
    engine = open_db(db)
    try:
        if run_id is not None and run_id.startswith("sweep-"):
            _sweep_status(engine, run_id, watch=watch, as_json=as_json, interval=interval)
            return
        from srd_worker import status as run_status  # the store only: imports fast

        if run_id is None:
            runs = run_status.recent_runs(db=engine)
            if as_json:
                click.echo(
                    json.dumps(
                        [
                            {
                                "run_id": r.id,
                                "name": r.name,
                                "status": r.status,
                                "items": r.n_items,
                                "created_at": r.created_at.isoformat(),
                            }
                            for r in runs
                        ],
                        indent=2,
                    )
                )
                return
            table = Table(title="recent runs")
            table.add_column("run", no_wrap=True, min_width=16)  # never cut: ids are copied from here
            for col in ("name", "status", "items", "shards", "created"):
                table.add_column(col)
            for r in runs:
                table.add_row(
                    r.id, r.name, r.status, str(r.n_items), str(r.n_shards), f"{r.created_at:%Y-%m-%d %H:%M}"
                )
            console().print(table)
            return
        run_status.ensure_run(db=engine, run_id=run_id)

        def read() -> Any:
            return run_status.run_status(db=engine, run_id=run_id, all_shards=all_shards)

        if as_json and not watch:
            click.echo(json.dumps(read().to_dict(), indent=2))
            return
        if not watch:
            console().print(_status_view(read()))
            return
        import time

        from rich.live import Live

        st = read()
        with Live(_status_view(st), console=console(), refresh_per_second=4) as live:
            while st.status in ("pending", "running"):
                time.sleep(interval)
                st = read()
                live.update(_status_view(st))
    finally:
        engine.dispose()


def _sweep_status(engine: Any, sweep_id: str, *, watch: bool, as_json: bool, interval: float) -> None:
    import time

    from srdq_cli.sweep_cli import sweep_status_view

    from srd_worker import status as service  # the store only: imports fast

    st = service.sweep_status(db=engine, sweep_id=sweep_id)
    if as_json and not watch:
        click.echo(json.dumps(st.to_dict(), indent=2))
        return
    if not watch:
        console().print(sweep_status_view(st))
        return
    from rich.live import Live

    with Live(sweep_status_view(st), console=console(), refresh_per_second=4) as live:
        while st.status in ("pending", "running"):
            time.sleep(interval)
            st = service.sweep_status(db=engine, sweep_id=sweep_id)
            live.update(sweep_status_view(st))


def _status_view(st: Any) -> Any:
    from rich.console import Group
    from rich.progress_bar import ProgressBar

    from srd_worker.status import format_duration

    # an ETA only while work remains to be done: a finished, failed or cancelled run has none
    eta = format_duration(st.eta_s) if st.status in ("pending", "running") else "—"
    head = Table.grid(padding=(0, 2))
    head.add_row(
        f"[bold]{st.run_id}[/bold] {st.name}",
        f"status [bold]{st.status}[/bold]",
        f"{st.done + st.failed}/{st.items} items ({st.failed} failed)",
        f"{st.gen_tokens} tokens",
        f"{st.tokens_per_s:.1f} tok/s",
        f"ETA {eta}",
    )
    states = Table.grid(padding=(0, 2))
    states.add_row(
        f"{st.n_shards} shards:",
        *(f"{state} [bold]{n}[/bold]" for state, n in st.shard_states.items()),
    )
    what = "all shards" if st.listed == "all" else "running, failed and slow shards"
    if not st.shards:
        return Group(
            head, states, f"no {what} to list" + ("" if st.listed == "all" else " (--all lists every shard)")
        )
    table = Table(title=what, title_justify="left")
    for col in ("shard", "state", "progress", "items", "round", "attempt", "lease owner", "note", "error"):
        table.add_column(col)
    for s in st.shards:
        bar = ProgressBar(total=max(s.items, 1), completed=s.done + s.failed, width=20)
        table.add_row(
            str(s.index),
            s.status,
            bar,
            f"{s.done + s.failed}/{s.items}",
            str(s.round),
            str(s.attempt),
            s.lease_owner or "",
            s.note or "",
            (s.error or "")[:60],
        )
    parts: list[Any] = [head, states, table]
    if st.not_listed:
        parts.append(f"... and {st.not_listed} more (--all lists every shard)")
    return Group(*parts)


@click.command()
@click.argument("run_id")
@friendly_errors
def cancel(run_id: str) -> None:
    """Cancel RUN_ID: unfinished shards stop at their next checkpoint and are not picked up again."""
    from srd_worker import service

    n = _on_db(service.cancel, run_id=run_id)
    click.echo(f"cancelled {run_id}: {n} unfinished shard(s) stopped")


@click.command()
@click.argument("run_id")
@friendly_errors
def resume(run_id: str) -> None:
    """Re-enqueue RUN_ID's unfinished, failed or cancelled shards (they continue from their checkpoints)."""
    from srd_worker import service
    from srd_worker.queue import enqueue, enqueue_many

    todo = _on_db(service.resume, run_id=run_id, enqueue=enqueue, enqueue_many=enqueue_many)
    click.echo(f"resumed {run_id}: {len(todo)} shard(s) re-enqueued")


def _on_db(action: Any, **kwargs: Any) -> Any:
    """``action(db=..., **kwargs)`` on the configured database, disposed of afterwards."""
    db = open_db()
    try:
        return action(db=db, **kwargs)
    finally:
        db.dispose()


@click.group()
def db() -> None:
    """Database administration."""


@db.command("upgrade")
@friendly_errors
def db_upgrade() -> None:
    """Create or migrate the service database to the newest schema (Alembic)."""
    from srd_worker.settings import get_settings
    from srd_worker.store.db import upgrade

    url = get_settings().database_url
    try:
        before, after = upgrade(url)
    except Exception as exc:  # noqa: BLE001
        raise click.ClickException(
            f"cannot upgrade {url.split('@')[-1]}: {str(exc).splitlines()[0]}"
        ) from None
    if before is None:
        click.echo(f"created the srdq schema (revision {after})")
    elif before != after:
        click.echo(f"migrated the database from revision {before} to {after}")
    else:
        click.echo(f"database is already at the newest schema (revision {after})")


def register(cli: click.Group) -> None:
    for command in (worker, status, cancel, resume, db):
        cli.add_command(command)
