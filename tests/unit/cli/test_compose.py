"""docker-compose.yml: the fleet services are all there, and the compose tool accepts the file when one
is installed (`docker compose config` / `docker-compose config`)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]


def test_services_present_and_worker_reserves_a_gpu():
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = doc["services"]
    assert {"postgres", "redis", "minio", "minio-bucket", "migrate", "worker", "flower"} <= set(services)
    devices = services["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert services["migrate"]["command"] == ["db", "upgrade"]
    assert services["worker"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_servers_profile_light_workers_hold_no_model():
    """Profile "servers": vLLM model servers, each with its own GPUs split by tensor parallelism, under one
    alias; light workers without GPUs point the openai engine at that alias."""
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    servers = [s for name, s in services.items() if name.startswith("model-server")]
    assert len(servers) >= 2
    gpus = []
    for srv in servers:
        assert srv["profiles"] == ["servers"] and "model-server" in srv["networks"]["default"]["aliases"]
        (dev,) = srv["deploy"]["resources"]["reservations"]["devices"]
        tp = next(a for a in srv["command"] if a.startswith("--tensor-parallel-size="))
        assert int(tp.split("=")[1]) == len(dev["device_ids"])
        gpus += dev["device_ids"]
    assert len(gpus) == len(set(gpus)), "two model servers share a GPU"
    light = services["light-worker"]
    assert light["profiles"] == ["servers"] and "deploy" not in light
    assert light["environment"]["SRDQ_OPENAI_BASE_URL"] == "http://model-server:8000/v1"


def _compose() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_compose_tool_validates_the_file(tmp_path):
    cmd = _compose()
    if cmd is None:
        pytest.skip("no docker compose / docker-compose on this machine")
    proc = subprocess.run(
        [*cmd, "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
