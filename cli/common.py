"""What the `srdq` commands share: error translation and opening the database a command reads."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from srd_worker.errors import SrdqError

#: Items per shard of `srdq run` and `srdq submit dataset` (and of their --sweep points). A shard is the
#: unit that finishes, appends its records and is skipped on resume: 16 problems keep a shard to minutes
#: on a CPU (Best-of-16 with SmolLM2, about 50k generated tokens at 100-250 tokens/s) while a shard still
#: fills the engine's batches (16 x n sequences per round), and the embedded and fleet runs of one command
#: have the same shards.
DEFAULT_SHARD_SIZE = 16


def friendly_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn library errors into ``click.ClickException`` (message, exit 1, no traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SrdqError as exc:
            raise click.ClickException(str(exc)) from exc
        except ImportError as exc:  # an optional part (torch, matplotlib, vLLM) missing: say which extra
            from srd_worker.extras import hint_for

            hint = hint_for(exc)
            if hint is None:
                raise
            raise click.ClickException(hint) from exc

    return wrapper


def require_extra(extra: str, what: str) -> None:
    """``srd_worker.extras.require`` as a clean CLI error (exit 1, nothing written)."""
    from srd_worker.extras import require

    try:
        require(extra, what)
    except SrdqError as exc:
        raise click.ClickException(str(exc)) from exc


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_options(
    default_level: str = "WARNING", *, level_aliases: tuple[str, ...] = (), who: str = "srdq's"
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--log-level`` (and ``level_aliases``) and ``--log-format text|json`` (also SRDQ_LOG_LEVEL /
    SRDQ_LOG_FORMAT), as the keyword arguments ``log_level`` and ``log_format``."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn = click.option(
            "--log-format",
            "log_format",
            type=click.Choice(["text", "json"]),
            default="text",
            show_default=True,
            envvar="SRDQ_LOG_FORMAT",
            help=f"{who} log lines as text or as JSON objects (ts, level, logger, msg, run_id, shard, "
            "worker, counts, durations, error); secrets in them are masked.",
        )(fn)
        return click.option(
            "--log-level",
            *level_aliases,
            "log_level",
            type=click.Choice(LOG_LEVELS, case_sensitive=False),
            default=default_level,
            show_default=True,
            envvar="SRDQ_LOG_LEVEL",
            help=f"Lowest level of {who} log lines printed to stderr.",
        )(fn)

    return decorate


def configure_logging(level: str, fmt: str) -> None:
    """srdq's loggers to stderr at ``level`` in ``fmt``, with the settings' secrets masked."""
    from srd_worker.logs import settings_secrets, setup_logging
    from srd_worker.settings import get_settings

    setup_logging(level, fmt, secrets=settings_secrets(get_settings()))


track_option = click.option(
    "--track",
    "track",
    type=click.Choice(["none", "mlflow", "wandb"]),
    default=None,
    help="Log to experiment tracking (default: SRDQ_TRACKING, none): the spec, provenance, progress per "
    "shard, the summary with its 95% intervals, the report's plots and pages and a per-item table. mlflow: "
    "SRDQ_MLFLOW_TRACKING_URI (default OUT/mlruns); wandb: SRDQ_WANDB_PROJECT, offline by default. Needs "
    "pip install 'srdq[tracking]'.",
)

db_option = click.option(
    "--db",
    default=None,
    metavar="URL|PATH",
    help="Database: a SQLAlchemy URL, an embedded run's SQLite file (srdq-out/srdq.db) or its --out folder. "
    "Default: SRDQ_DATABASE_URL.",
)


def db_url(db: str | None) -> str:
    """``--db`` as a SQLAlchemy URL (default: the settings' database)."""
    from srd_worker.settings import get_settings
    from srd_worker.store.db import sqlite_url

    if not db:
        return get_settings().database_url
    if "://" in db:
        _check_sqlite_file(db, db)
        return db
    path = Path(db)
    if path.is_dir():
        path = path / "srdq.db"
    if not path.is_file():
        raise click.ClickException(
            f"--db {db}: no such database file (give a SQLAlchemy URL or a SQLite file)"
        )
    url = sqlite_url(path)
    _check_sqlite_file(url, db)
    return url


def _check_sqlite_file(url: str, given: str) -> None:
    """A SQLite URL must name an existing, non-empty file: SQLite would create a missing one (and write a
    header into an empty one) before the commands that read a store find no tables in it."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return  # the engine names what is wrong with the URL
    if not parsed.drivername.startswith("sqlite") or parsed.database in (None, "", ":memory:"):
        return
    file = Path(parsed.database)
    if not file.is_file():
        raise click.ClickException(f"--db {given}: no such database file ({file})")
    if file.stat().st_size == 0:
        raise click.ClickException(f"--db {given}: {file} is empty, not a srdq store")


def _local_store_hint() -> str | None:
    """When no --db was given and the fleet database cannot be used: the local stores of `srdq run` in the
    working directory (its default --out, or any folder holding a srdq.db), named for --db."""
    found = sorted(
        {p.parent for p in Path(".").glob("*/srdq.db")}, key=lambda p: (p.name != "srdq-out", p.name)
    )
    if not found:
        return None
    names = ", ".join(f"--db {p}" for p in found[:3])
    return f"not a fleet database; for a local `srdq run` store pass {names}"


def open_db(db: str | None = None):
    """An engine for ``--db``, checked with one query: a clear message if the database is unreachable or
    was never migrated."""
    from srd_worker.store.db import check_reachable, make_engine, schema_behind, upgrade

    try:
        engine = make_engine(db_url(db))
    except SrdqError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        check_reachable(engine)
    except Exception as exc:  # noqa: BLE001 - any failure here is the user's setup
        engine.dispose()
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        missing = "run" in first and ("exist" in first or "no such table" in first)
        hint = "run `srdq db upgrade` first" if missing else "check the URL (SRDQ_DATABASE_URL or --db)"
        if not db and (local := _local_store_hint()):
            hint = local  # after `srdq run`, the follow-up commands read its store with --db
        raise click.ClickException(
            f"database {engine.url.render_as_string(hide_password=True)}: {first} ({hint})"
        ) from None
    behind = schema_behind(engine)
    if behind is not None:
        shown = engine.url.render_as_string(hide_password=True)
        if engine.url.get_backend_name() != "sqlite":
            engine.dispose()
            raise click.ClickException(
                f"database {shown}: its schema is at revision {behind[0]}, older than this srdq's "
                f"{behind[1]}; run `srdq db upgrade` first (the workers' srdq must be as new)"
            )
        # an embedded store (`srdq run`'s SQLite file) is brought up to date, as `srdq run` would
        upgrade(engine.url.render_as_string(hide_password=False))
    return engine


def console(stderr: bool = False) -> Console:
    """Stderr for progress and notes; stdout, when not a terminal (a pipe, a test), wide enough that tables
    never cut a run id."""
    if stderr:
        return Console(stderr=True, highlight=False)
    out = Console(highlight=False)
    return out if out.is_terminal else Console(highlight=False, width=200)
