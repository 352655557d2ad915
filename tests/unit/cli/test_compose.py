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
    alias, and a reward server (pooling) on a GPU of its own; light workers without GPUs point the openai
    engine at that alias and the openai-rm reward at the reward server."""
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
    rm = services["reward-server"]
    assert rm["profiles"] == ["servers"] and "--runner=pooling" in rm["command"]
    assert "--served-model-name=rm" in rm["command"] and "--port=8002" in rm["command"]
    gpus += rm["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
    assert len(gpus) == len(set(gpus)), "two model servers share a GPU"
    light = services["light-worker"]
    assert light["profiles"] == ["servers"] and "deploy" not in light
    assert light["environment"]["SRDQ_OPENAI_BASE_URL"] == "http://model-server:8000/v1"
    assert light["environment"]["SRDQ_RM_BASE_URL"] == "http://reward-server:8002/v1"


def test_monitoring_profile_scrapes_the_workers_and_provisions_the_dashboard():
    """Profile "monitoring": Prometheus scrapes the port the workers serve metrics on (by the services'
    DNS names); Grafana gets that Prometheus as its datasource and a dashboard whose queries name only
    metrics a worker exports."""
    import json
    import re

    from prometheus_client import REGISTRY

    import srd_worker.metrics  # noqa: F401 - registers srdq's metrics

    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    prom, grafana = services["prometheus"], services["grafana"]
    assert prom["profiles"] == grafana["profiles"] == ["monitoring"]
    mounts = {
        m.split(":")[1]: ROOT / m.split(":")[0]
        for m in prom["volumes"] + grafana["volumes"]
        if m.startswith("./")
    }
    config = yaml.safe_load(mounts["/etc/prometheus/prometheus.yml"].read_text())
    targets = {
        sd["names"][0]: sd["port"] for job in config["scrape_configs"] for sd in job.get("dns_sd_configs", [])
    }
    for name in ("worker", "light-worker"):
        assert targets[name] == int(services[name]["environment"]["SRDQ_METRICS_PORT"]), name
    provisioning = mounts["/etc/grafana/provisioning"]
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "srdq.yml").read_text())["providers"]
    dashboards = mounts[provider["options"]["path"]]
    dashboard = json.loads((dashboards / "srdq.json").read_text())
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    exported = {
        family.name + suffix
        for family in REGISTRY.collect()
        if family.name.startswith("srdq_")
        for suffix in suffixes[family.type]
    }
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(exprs) >= 10
    used = {name for expr in exprs for name in re.findall(r"\bsrdq_[a-z_]+", expr)}
    assert used and used <= exported, used - exported
    sources = {t["datasource"]["uid"] for panel in dashboard["panels"] for t in panel["targets"]}
    assert sources == {source["uid"]}


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
