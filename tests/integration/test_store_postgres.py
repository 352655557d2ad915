"""The store (migrations and CRUD) on a real PostgreSQL server, each test in a fresh database.

The server comes from ``SRDQ_TEST_PG_URL``, which scripts/with-services sets to a server it starts for the
run; the tests skip when it is not set or cannot be reached. The checks are those of tests/unit/store/test_store.py (SQLite).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from tests.store_cases import StoreCases

pytestmark = pytest.mark.integration

SERVER_URL = os.environ.get("SRDQ_TEST_PG_URL", "")


@pytest.fixture(scope="module")
def server() -> Iterator[Engine]:
    """An autocommit engine on the server's maintenance database (CREATE/DROP DATABASE)."""
    if not SERVER_URL:
        pytest.skip(
            "SRDQ_TEST_PG_URL not set: run the suite through scripts/with-services (make test), which starts "
            "a PostgreSQL of its own (these tests create and drop databases, so never a user's server)"
        )
    engine = create_engine(SERVER_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5})
    try:
        with engine.connect():
            pass
    except OperationalError as exc:
        engine.dispose()
        shown = make_url(SERVER_URL).render_as_string(hide_password=True)
        pytest.skip(f"PostgreSQL server not reachable at {shown} (set SRDQ_TEST_PG_URL): {exc.orig}")
    yield engine
    engine.dispose()


class TestStorePostgres(StoreCases):
    @pytest.fixture
    def url(self, server: Engine) -> Iterator[str]:
        name = f"srdq_test_{uuid.uuid4().hex[:16]}"
        with server.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        try:
            yield make_url(SERVER_URL).set(database=name).render_as_string(hide_password=False)
        finally:
            with server.connect() as conn:
                # FORCE ends any connection a failed test left open.
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
