"""scripts/with-services, the wrapper `make test` runs the suite in: it starts a PostgreSQL and a Redis of
its own on free ports and removes them afterwards, so the suite (which drops databases, flushes Redis
databases and restarts PostgreSQL) never touches a server of the user's on the standard ports."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.integration

PROBE = """
import os, redis, sqlalchemy
from sqlalchemy.engine import make_url
pg, rd = os.environ["SRDQ_TEST_PG_URL"], os.environ["SRDQ_TEST_REDIS_URL"]
engine = sqlalchemy.create_engine(pg)
with engine.connect() as conn:
    conn.execute(sqlalchemy.text("select 1"))
engine.dispose()
r = redis.Redis.from_url(rd)
r.set("probe", "1")
assert r.get("probe") == b"1"
print(make_url(pg).port, redis.connection.parse_url(rd)["port"], bool(os.environ.get("SRDQ_TEST_PG_RESTART")))
"""


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.skipif(
    not shutil.which("redis-server") or not glob.glob("/usr/lib/postgresql/*/bin/initdb"),
    reason="redis-server or PostgreSQL's initdb not installed (the script would install them with apt)",
)
def test_starts_its_own_servers_on_free_ports_and_stops_them() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SRDQ_TEST_")}
    proc = subprocess.run(
        [str(ROOT / "scripts" / "with-services"), sys.executable, "-c", PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    pg_port, redis_port, restart = proc.stdout.split()
    # never the standard ports, where a user's own servers listen (as on this machine kind)
    assert int(pg_port) != 5432 and int(redis_port) != 6379
    assert restart == "True"  # the service tests can restart this PostgreSQL, not a system one
    assert "started PostgreSQL" in proc.stderr and "started Redis" in proc.stderr
    assert not _listening(int(pg_port)) and not _listening(int(redis_port))  # stopped on exit


def test_integration_fixtures_never_fall_back_to_the_standard_ports() -> None:
    # without the wrapper's URLs the fleet fixtures report why they skip instead of using 5432 / 6379
    env = {k: v for k, v in os.environ.items() if not k.startswith("SRDQ_TEST_")}
    code = "from tests.integration import fleet; print(fleet.unreachable() == fleet.NO_SERVICES, fleet.PG_URL == '')"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True"]
