"""`srdq worker --metrics-port`: a bad value, a range past 65535 or a taken port is one line and exit 1,
before any worker process starts; the port helpers of ``srd_worker.metrics``."""

from __future__ import annotations

import socket

import pytest
from click.testing import CliRunner
from srdq_cli.main import cli

from srd_worker.errors import ConfigError
from srd_worker.metrics import check_ports_free, parse_port, worker_ports

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "args, message",
    [
        (["--metrics-port", "abc"], "--metrics-port expects a port number (0 = off, 1-65535), got 'abc'"),
        (["--metrics-port", "70000"], "--metrics-port expects a port number (0 = off, 1-65535), got 70000"),
        (["--metrics-port", "-1"], "got -1"),
        (
            ["--metrics-port", "65535", "--concurrency", "2"],
            "needs ports 65535-65536; the last is above 65535",
        ),
        (["--metrics-port", "65534", "--gpus", "0,1,2"], "needs ports 65534-65536"),
        (["--concurrency", "0"], "--concurrency expects a number of processes >= 1, got 0"),
    ],
)
def test_bad_values_are_one_line(args, message):
    result = CliRunner().invoke(cli, ["worker", *args])
    assert result.exit_code == 1, result.output
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_environment_value_is_checked_too(monkeypatch):
    monkeypatch.setenv("SRDQ_METRICS_PORT", "http")
    result = CliRunner().invoke(cli, ["worker"])
    assert result.exit_code == 1 and "got 'http'" in result.output


def test_a_taken_port_is_refused_before_the_worker_starts():
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = CliRunner().invoke(cli, ["worker", "--metrics-port", str(port)])
        assert result.exit_code == 1
        assert f"--metrics-port: port {port} is not free" in result.output
        with pytest.raises(ConfigError, match=f"port {port} is not free"):
            check_ports_free([port])


def test_port_helpers():
    assert parse_port(None) == parse_port("") == parse_port("0") == 0
    assert parse_port(" 9100 ") == 9100
    assert worker_ports(0, 4) == []
    assert worker_ports(9100, 3) == [9100, 9101, 9102]
    assert worker_ports(65535, 1) == [65535]
