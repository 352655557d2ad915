"""``srdq export``, ``srdq report`` and ``srdq sync``: thin shells over ``srd_worker.results`` and
``srd_worker.reports`` (parse, wire, call, print). Registered on the main group by ``register(cli)``.

Every command reads the database named by ``--db`` (a SQLAlchemy URL, or the path of an embedded run's
SQLite file such as ``srdq-out/srdq.db``), by default ``SRDQ_DATABASE_URL``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click


def _friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``srdq_cli.main.friendly_errors``, looked up when the command runs: ``main`` imports this module
    at its end, so importing ``main`` here at import time would be circular (under ``python -m``)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from srdq_cli.main import friendly_errors

        return friendly_errors(fn)(*args, **kwargs)

    return wrapper


def _db_url(db: str | None) -> str:
    from srd_worker.settings import get_settings
    from srd_worker.store.db import sqlite_url

    if not db:
        return get_settings().database_url
    if "://" in db:
        return db
    path = Path(db)
    if path.is_dir():
        path = path / "srdq.db"
    if not path.is_file():
        raise click.ClickException(f"--db {db}: no such database file (give a SQLAlchemy URL or a SQLite file)")
    return sqlite_url(path)


def _open_db(db: str | None):
    """An engine for ``--db``, checked with one query (clear message if unreachable or empty)."""
    from sqlalchemy import text

    from srd_worker.store.db import make_engine

    engine = make_engine(_db_url(db))
    try:
        with engine.connect() as conn:
            conn.execute(text("select 1 from run limit 1"))
    except Exception as exc:  # noqa: BLE001 - any failure here is the user's setup
        engine.dispose()
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise click.ClickException(
            f"database {engine.url.render_as_string(hide_password=True)}: {first}") from None
    return engine


def _store(url: str | None):
    from srd_worker.objects import open_store
    from srd_worker.settings import get_settings

    settings = get_settings()
    return open_store(url or settings.object_store_url, settings)


db_option = click.option("--db", default=None, metavar="URL|PATH",
                         help="Database: a SQLAlchemy URL, or an embedded run's SQLite file (srdq-out/srdq.db). "
                         "Default: SRDQ_DATABASE_URL.")


@click.command()
@click.argument("run_id")
@click.option("--format", "fmt", type=click.Choice(["parquet", "jsonl", "csv"]), default="parquet",
              show_default=True, help="jsonl keeps records nested; csv and parquet flatten them.")
@click.option("--out", "out", required=True, metavar="PATH|s3://BUCKET/KEY",
              help="Destination file (a folder gets RUN_ID.FORMAT inside it), or an S3 object.")
@db_option
@_friendly
def export(run_id: str, fmt: str, out: str, db: str | None) -> None:
    """Export RUN_ID's results from the database: one row per item in dataset order, failed items
    included (failed=true, with their error).

    Example: srdq export run-1a2b3c4d5e6f --format csv --out results.csv --db srdq-out/srdq.db
    """
    from srd_worker.results import export_run
    from srd_worker.settings import get_settings

    engine = _open_db(db)
    try:
        where, rows = export_run(engine, run_id, fmt, out, settings=get_settings())
    finally:
        engine.dispose()
    failed = sum(1 for r in rows if r["status"] == "failed")
    pending = sum(1 for r in rows if r["status"] == "pending")
    note = f" ({failed} failed" + (f", {pending} without a result yet" if pending else "") + ")"
    click.echo(f"{len(rows)} rows{note} -> {where}")


@click.command()
@click.argument("run_ids", nargs=-1, required=True)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Folder for report.md and the PNG plots.")
@db_option
@_friendly
def report(run_ids: tuple[str, ...], out_dir: str, db: str | None) -> None:
    """Write report.md and PNG plots for RUN_IDS: accuracy (or reward) vs generated tokens per method
    and budget, per-component time/calls (Table 2 layout), routing statistics (Table 6 layout) and a
    per-run summary.

    Example: srdq report run-aaa run-bbb --out report/ --db srdq-out/srdq.db
    """
    from srd_worker.reports import build_report
    from srd_worker.results import load_report_runs

    engine = _open_db(db)
    try:
        runs = load_report_runs(engine, list(dict.fromkeys(run_ids)))
    finally:
        engine.dispose()
    done = build_report(runs, out_dir)
    click.echo(str(done.markdown))
    for path in done.plots:
        click.echo(str(path))


@click.command()
@click.argument("run_id")
@click.option("--store", "store_url", default=None, metavar="s3://BUCKET/PREFIX|PATH",
              help="Object store (default: SRDQ_OBJECT_STORE_URL).")
@click.option("--verify", is_flag=True, help="Also check uploaded parts (sha256) and upload broken ones again.")
@click.option("--force", is_flag=True, help="Upload every done shard and the run manifest again (e.g. a new store).")
@db_option
@_friendly
def sync(run_id: str, store_url: str | None, verify: bool, force: bool, db: str | None) -> None:
    """Upload RUN_ID's finished shards that are not in the object store yet, then its manifest (last,
    once every shard is done). Workers do this themselves; this is for when the store was down.

    Example: srdq sync run-1a2b3c4d5e6f --verify
    """
    from srd_worker.results import sync_run

    store = _store(store_url)
    engine = _open_db(db)
    try:
        done = sync_run(engine, store, run_id, verify=verify, force=force, wait=True)
    finally:
        engine.dispose()

    def shards(indexes: list[int]) -> str:
        return ", ".join(map(str, indexes)) if indexes else "none"

    click.echo(f"uploaded shards: {shards(done.uploaded)}")
    if done.repaired:
        click.echo(f"re-uploaded (missing or corrupt in the store): {shards(done.repaired)}")
    click.echo(f"already uploaded: {shards(done.already)}")
    if done.busy:
        click.echo(f"being uploaded by another process: {shards(done.busy)}")
    if done.unfinished:
        click.echo(f"not finished yet: {shards(done.unfinished)}")
    if done.manifest == "written":
        click.echo(f"run manifest written: {done.manifest_url}")
    elif done.manifest == "present":
        click.echo(f"run manifest already there: {done.manifest_url}")
    elif done.manifest == "busy":
        click.echo("run manifest: another process is writing it")
    else:
        click.echo("run manifest: waiting for every shard to finish")


def register(cli: click.Group) -> None:
    """Add ``export``, ``report`` and ``sync`` to the ``srdq`` group."""
    for command in (export, report, sync):
        cli.add_command(command)
