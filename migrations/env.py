"""Alembic environment: migrates the database named by the config's ``sqlalchemy.url``.

``srd_worker.store.db.upgrade`` sets that URL programmatically; developers running the ``alembic`` command
from the repository root (``alembic.ini``) may leave it empty and set ``SRDQ_DATABASE_URL`` instead.
The target metadata is ``SQLModel.metadata`` with every table of ``srd_worker.store.models``, so
``alembic revision --autogenerate`` compares against the models. SQLite gets batch mode (it cannot
ALTER most things in place).
"""

from __future__ import annotations

from logging.config import fileConfig
from typing import Any

from alembic import context
from sqlmodel import SQLModel
from sqlmodel.sql.sqltypes import AutoString

from srd_worker.store import models
from srd_worker.store.db import make_engine

config = context.config
if config.config_file_name is not None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = SQLModel.metadata


def _database_url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return url
    from srd_worker.settings import get_settings

    return get_settings().database_url


def _render_item(type_: str, obj: Any, autogen_context: Any) -> str | bool:
    # Keep generated migrations free of imports from this package: they are frozen history.
    if type_ == "type" and isinstance(obj, models.UTCDateTime):
        return "sa.DateTime(timezone=True)"
    if type_ == "type" and isinstance(obj, AutoString):
        return "sa.String()"
    return False


def run_migrations_offline() -> None:
    """Emit SQL to stdout instead of running it (``alembic upgrade --sql``)."""
    url = _database_url()
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        render_as_batch=url.startswith("sqlite"),
        render_item=_render_item,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = make_engine(_database_url())
    try:
        with engine.connect() as connection:
            context.configure(
                connection=connection,
                target_metadata=target_metadata,
                render_as_batch=connection.dialect.name == "sqlite",
                render_item=_render_item,
            )
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
