"""Engines, migrations and transactions for the store (PostgreSQL in service mode, SQLite embedded).

``make_engine`` builds an engine tuned per backend, ``upgrade`` runs the packaged Alembic migrations
(``alembic upgrade head``) as their own step, and ``session_scope`` gives one transaction: commit on
success, rollback on error. Nothing here touches a database at import time.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlmodel import Session

#: How long (ms) a SQLite connection waits for another writer's lock before failing with "locked".
SQLITE_BUSY_TIMEOUT_MS = 30_000


def sqlite_url(path: str | Path) -> str:
    """SQLAlchemy URL of the SQLite database file at ``path`` (made absolute)."""
    return f"sqlite:///{Path(path).resolve()}"


def _configure_sqlite(dbapi_connection: Any, connection_record: Any) -> None:
    # WAL lets readers run while one process writes; the busy timeout makes concurrent writers wait
    # instead of failing at once; SQLite only enforces foreign keys when asked, per connection.
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


def normalise_url(url: str) -> str:
    """``url`` with the PostgreSQL driver srdq installs: SQLAlchemy maps a bare ``postgresql://`` (and
    Heroku-style ``postgres://``) to psycopg 3, which srdq does not depend on, so those become
    ``postgresql+psycopg2://`` unless psycopg 3 is importable. Any other URL is returned unchanged."""
    import importlib.util

    for bare in ("postgresql://", "postgres://"):
        if url.startswith(bare) and importlib.util.find_spec("psycopg") is None:
            return "postgresql+psycopg2://" + url[len(bare) :]
    return url


def masked(url: str) -> str:
    """``url`` for messages: the password hidden (``logs.mask``); text that is not a URL is shown minus
    anything up to its last '@'."""
    from srd_worker.logs import mask

    return mask(url) if "://" in url else url.split("@")[-1]


def make_engine(url: str) -> Engine:
    """An engine for ``url``: SQLite gets WAL, a busy timeout and foreign keys; PostgreSQL pre-pings.
    A URL that does not parse or names a driver that is not installed raises ``ConfigError`` (one line,
    the password masked)."""
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    from srd_worker.errors import ConfigError

    url = normalise_url(url)
    try:
        return _make_engine(url)
    except (ArgumentError, NoSuchModuleError, ModuleNotFoundError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(
            f"database URL {masked(url)!r} cannot be used: {first} (srdq supports sqlite:///PATH and "
            "postgresql+psycopg2://USER:PASSWORD@HOST:PORT/DB; set SRDQ_DATABASE_URL or --db)"
        ) from None


def _make_engine(url: str) -> Engine:
    if make_url(url).get_backend_name() == "sqlite":
        # Connections are shared across threads (a worker's heartbeat thread); SQLite's own locking
        # serialises writers.
        engine = create_engine(url, connect_args={"check_same_thread": False})
        event.listen(engine, "connect", _configure_sqlite)
        return engine
    return create_engine(url, pool_pre_ping=True)


@contextmanager
def _migrations() -> Iterator[str]:
    """The folder of srdq's packaged Alembic migrations (``srdq_migrations``), as a path Alembic reads."""
    with importlib.resources.as_file(importlib.resources.files("srdq_migrations")) as location:
        yield str(location)


def upgrade(url: str) -> tuple[str | None, str | None]:
    """Bring the database at ``url`` to the newest schema (``alembic upgrade head``); a no-op if current.
    Returns the schema revision before (None: an empty database) and after."""
    from alembic import command
    from alembic.config import Config

    before = schema_revision(url)
    config = Config()
    with _migrations() as script_location:
        config.set_main_option("script_location", script_location)
        # ConfigParser interpolates '%': escape it (percent-encoded passwords).
        config.set_main_option("sqlalchemy.url", normalise_url(url).replace("%", "%%"))
        command.upgrade(config, "head")
    return before, schema_revision(url)


def head_revision() -> str:
    """The newest schema revision this srdq's packaged migrations define."""
    from alembic.script import ScriptDirectory

    with _migrations() as location:
        head = ScriptDirectory(location).get_current_head()
    assert head is not None, "srdq_migrations has no revisions"
    return head


def schema_behind(engine: Engine) -> tuple[str, str] | None:
    """(the database's revision, this srdq's head) when the database at ``engine`` was migrated by srdq
    to an older schema than this srdq reads; None when it is current, newer (a later srdq; the extra
    columns are ignored) or has no Alembic stamp (tables made without migrations)."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    with engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
    if current is None:
        return None
    with _migrations() as location:
        script = ScriptDirectory(location)
        head = script.get_current_head()
        known = {rev.revision for rev in script.walk_revisions()}
    if head is None or current == head or current not in known:
        return None
    return current, head


def open_sqlite(path: str | Path) -> Engine:
    """An engine on the SQLite store at ``path`` brought to this srdq's schema first (a store written by
    an older srdq: a slice, a benchmark snapshot), as ``srdq run`` does with its own store."""
    url = sqlite_url(path)
    upgrade(url)
    return make_engine(url)


def schema_revision(url: str) -> str | None:
    """The Alembic revision the database at ``url`` is at; None when it has no srdq schema yet."""
    from alembic.runtime.migration import MigrationContext

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def check_reachable(engine: Engine) -> None:
    """One query that needs the ``run`` table: raises (the driver's error) when the database is
    unreachable or was never migrated."""
    from sqlalchemy import text

    with engine.connect() as conn:
        conn.execute(text("select 1 from run limit 1"))


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """One session and one transaction: commit when the block succeeds, roll back when it raises.

    Objects stay readable after the block (``expire_on_commit=False``): callers get plain rows back.
    """
    with Session(engine, expire_on_commit=False) as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
