"""Fixtures for the integration tier (see tests/integration/fleet.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.fleet import moto_server


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a real moto_server (S3 HTTP API) that lives as long as the module's tests."""
    yield from moto_server(tmp_path_factory.mktemp("moto"))
