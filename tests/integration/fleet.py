"""Shared pieces of the integration tests: the real servers they talk to and the fleet they start.

PostgreSQL and Redis come from SRDQ_TEST_PG_URL / SRDQ_TEST_REDIS_URL, which scripts/with-services sets to
servers it starts for the run (``make test``); without them these tests skip, and they never fall back to
a server on the standard ports, which may hold a user's data (the tests drop databases and flush Redis
databases). Each test gets its own migrated database and Redis database number, and its worker processes are
killed (whole process group) when it ends. The S3 side is a real ``moto_server`` process.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

PG_URL = os.environ.get("SRDQ_TEST_PG_URL", "")
REDIS_URL = os.environ.get("SRDQ_TEST_REDIS_URL", "")
NO_SERVICES = (
    "SRDQ_TEST_PG_URL / SRDQ_TEST_REDIS_URL not set: run the suite through scripts/with-services (make test), "
    "which starts a PostgreSQL and a Redis of its own on free ports"
)
CLI = [sys.executable, "-m", "srdq_cli.main"]
# the deterministic mode (SRDQ_KV_REUSE=false): fleet results are compared byte for byte with embedded runs,
# and which prefixes a worker has cached depends on how slices fell on workers
BASE_ENV = {
    "SRDQ_DTYPE": "float32",
    "SRDQ_DEVICE": "cpu",
    "SRDQ_KV_REUSE": "false",
    "OMP_NUM_THREADS": "1",
    "PYTHONUNBUFFERED": "1",
}
#: Short leases and slices so the fault scenarios play out in seconds.
FAST_SERVICE_ENV = {
    "SRDQ_LEASE_TTL_S": "4",
    "SRDQ_SLICE_ROUNDS": "3",
    "SRDQ_REAP_INTERVAL_S": "1",
    "SRDQ_PENDING_GRACE_S": "3",
}


def unreachable() -> str | None:
    """Why PostgreSQL or Redis cannot be used, or None."""
    if not PG_URL or not REDIS_URL:
        return NO_SERVICES
    try:
        eng = create_engine(PG_URL)
        with eng.connect():
            pass
        eng.dispose()
    except Exception as exc:  # noqa: BLE001
        return f"PostgreSQL at {PG_URL} unreachable: {exc}"
    import redis

    try:
        redis.Redis.from_url(REDIS_URL).ping()
    except Exception as exc:  # noqa: BLE001
        return f"Redis at {REDIS_URL} unreachable: {exc}"
    return None


@contextmanager
def fleet(tmp_path: Path, prefix: str, **extra_env: str) -> Iterator[dict[str, Any]]:
    """A fresh migrated database and Redis database number, env for `srdq` processes, worker list."""
    import redis

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT", pool_pre_ping=True)  # survives a restart
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    db_url = make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    broker = REDIS_URL.rsplit("/", 1)[0] + f"/{1 + uuid.uuid4().int % 15}"
    redis.Redis.from_url(broker).flushdb()
    env = {
        **os.environ,
        **BASE_ENV,
        **FAST_SERVICE_ENV,
        "SRDQ_DATABASE_URL": db_url,
        "SRDQ_BROKER_URL": broker,
        "SRDQ_QUEUE": f"q-{uuid.uuid4().hex[:8]}",
        **extra_env,
    }
    proc = subprocess.run([*CLI, "db", "upgrade"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    ctx: dict[str, Any] = {"env": env, "db_url": db_url, "broker": broker, "workers": [], "tmp": tmp_path}
    try:
        yield ctx
    finally:
        for w in ctx["workers"]:
            kill(w)
        redis.Redis.from_url(broker).flushdb()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL a worker's whole process group (main process and pool children at once)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def start_worker(ctx: dict[str, Any], name: str, **env: str) -> subprocess.Popen:
    log = open(ctx["tmp"] / f"{name}.log", "w")  # noqa: SIM115 - closed when the process is reaped
    proc = subprocess.Popen(
        [*CLI, "worker", "--loglevel", "INFO"],
        env={**ctx["env"], **env},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    ctx["workers"].append(proc)
    return proc


def srdq(ctx: dict[str, Any], *args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """``srdq ARGS`` in a subprocess against the fleet's services (its environment plus ``env``)."""
    return subprocess.run(
        [*CLI, *args], env={**ctx["env"], **env}, capture_output=True, text=True, timeout=timeout
    )


def submit(ctx: dict[str, Any], *args: str, timeout: float = 300) -> str:
    """``srdq submit dataset ARGS``; fails the test on a non-zero exit; returns the run id it prints."""
    proc = srdq(ctx, "submit", "dataset", *args, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def worker_log(ctx: dict[str, Any], name: str) -> str:
    return (ctx["tmp"] / f"{name}.log").read_text()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_ports(count: int, *, avoid: tuple[int, ...] = ()) -> int:
    """The first of ``count`` consecutive free ports (a worker's pool processes serve metrics on
    ``port``, ``port + 1``, ...), none of them in ``avoid``: a free port's neighbour may be taken."""
    while True:
        first = free_port()
        ports = range(first, first + count)
        if first + count > 65536 or any(p in avoid for p in ports):
            continue
        socks = []
        try:
            for port in ports:
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
        return first


def moto_server(log_dir: Path) -> Iterator[str]:
    """Start a real moto_server on a free port, yield its URL, stop it after."""
    beside = Path(sys.executable).parent / "moto_server"
    command = str(beside) if beside.exists() else shutil.which("moto_server")
    if command is None:
        pytest.skip("moto_server not installed (pip install 'moto[server]')")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = log_dir / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([command, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"moto_server exited with {proc.returncode}: {log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(url + "/", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"moto_server did not answer on {url} within 60 s")
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
