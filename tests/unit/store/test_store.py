"""The store (migrations and CRUD) on SQLite, the embedded default; the same checks run on PostgreSQL in
tests/integration/test_store_postgres.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine

from srd_worker.store.db import make_engine, sqlite_url
from tests.store_cases import StoreCases


class TestStoreSqlite(StoreCases):
    @pytest.fixture
    def url(self, tmp_path: Path) -> str:
        return sqlite_url(tmp_path / "store.db")


def test_sqlite_engine_uses_wal_busy_timeout_and_foreign_keys(tmp_path: Path) -> None:
    engine: Engine = make_engine(sqlite_url(tmp_path / "pragmas.db"))
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() > 0
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        engine.dispose()


def test_sqlite_url_is_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert sqlite_url("out/srdq.db") == f"sqlite:///{tmp_path.resolve()}/out/srdq.db"
