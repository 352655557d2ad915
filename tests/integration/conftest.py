"""Fixtures for the integration tier (see tests/integration/fleet.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.fleet import fleet, moto_server, unreachable


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a real moto_server (S3 HTTP API) that lives as long as the module's tests."""
    yield from moto_server(tmp_path_factory.mktemp("moto"))


@pytest.fixture(scope="module")
def servers() -> None:
    """Skip the module's tests with the reason when the wrapper's PostgreSQL or Redis cannot be used
    (modules that talk to them: ``pytestmark = [..., pytest.mark.usefixtures("servers")]``)."""
    reason = unreachable()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def env(tmp_path, request: pytest.FixtureRequest, servers: None) -> Iterator[dict]:
    """A fleet of the test's own (``fleet.fleet``): a fresh migrated database and Redis database number,
    env for `srdq` processes, its workers killed at the end. The database is named after the module."""
    prefix = "srdq_" + request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")[:12]
    with fleet(tmp_path, prefix) as ctx:
        yield ctx
