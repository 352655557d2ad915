"""Prometheus metrics of a real fleet: two worker processes on a real PostgreSQL and Redis, one of them with
two pool processes, each serving /metrics on its own port; their scraped counters add up to what the
database holds (items done, generated tokens of the records, shards finished)."""

from __future__ import annotations

import json
import subprocess
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.fleet import CLI, free_port, free_ports, start_worker, worker_log
from tests.integration.fleet import submit as fleet_submit
from tests.integration.test_service import db_rows, run_done, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("servers")]

ROWS = 6


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    """``/metrics`` of one process: sample name -> [(labels, value)]."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((dict(s.labels), s.value))
    return samples


def total(scrapes: list[dict], name: str, **labels: str) -> float:
    return sum(
        value
        for scraped in scrapes
        for got, value in scraped.get(name, [])
        if all(got.get(k) == v for k, v in labels.items())
    )


def serving(port: int) -> bool:
    try:
        scrape(port)
    except OSError:
        return False
    return True


def test_scraped_counters_equal_the_records(env, datasets_dir, tmp_path):
    data = tmp_path / "gsm8k_6.jsonl"
    data.write_text("\n".join((datasets_dir / "gsm8k_test.jsonl").read_text().splitlines()[:ROWS]) + "\n")
    run_id = fleet_submit(
        env,
        str(data),
        *("--method", "best_of_n", "--n", "2", "--reward", "arithmetic", "--model", "tiny-random-llama"),
        *("--max-new-tokens", "16", "--set", "chunk_tokens=4", "--seed", "3", "--shard-size", "2"),
        timeout=120,
    )
    a = free_port()
    b = free_ports(2, avoid=(a,))  # b and b + 1 both free (a busy b + 1 made the worker refuse to start)
    start_worker(env, "a", SRDQ_METRICS_PORT=str(a))
    # the second worker's two pool processes serve on b and b + 1 (the flag wins over the environment)
    log = open(tmp_path / "b.log", "w")  # noqa: SIM115 - closed when the process is reaped
    proc = subprocess.Popen(
        [*CLI, "worker", "--concurrency", "2", "--metrics-port", str(b), "--log-format", "json"],
        env=env["env"],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    env["workers"].append(proc)
    ports = [a, b, b + 1]
    for port in ports:
        wait_for(lambda port=port: serving(port), 120, f"metrics on port {port}")
    wait_for(lambda: run_done(env, run_id), 240, "run to finish")
    # a worker counts a shard after its results are committed (the store says done first), so the last
    # shard's counters may lag the database by a moment on a busy machine: wait for them, then compare
    wait_for(
        lambda: total([scrape(port) for port in ports], "srdq_shards_finished_total", run_id=run_id) >= 3,
        60,
        "the last shard's counters",
    )

    scrapes = [scrape(port) for port in ports]
    records = db_rows(
        env,
        "select coalesce((record->'ledger'->>'gen_tokens')::int, 0), error is null from result where run_id = :r",
        r=run_id,
    )
    assert len(records) == ROWS
    done = sum(ok for _, ok in records)
    tokens = sum(t for t, _ in records)
    assert tokens > 0
    ((shards_done,),) = db_rows(
        env, "select count(*) from shard where run_id = :r and status = 'done'", r=run_id
    )
    assert shards_done == 3

    assert total(scrapes, "srdq_items_done_total", run_id=run_id) == done
    assert total(scrapes, "srdq_items_failed_total", run_id=run_id) == ROWS - done
    assert total(scrapes, "srdq_generated_tokens_total", run_id=run_id) == tokens
    assert total(scrapes, "srdq_shards_finished_total", run_id=run_id) == shards_done
    # every shard is leased at least once; a slice of SRDQ_SLICE_ROUNDS rounds ends in a new lease
    assert total(scrapes, "srdq_shards_leased_total", run_id=run_id) >= shards_done
    # the drafter generated every token; the scorer (the arithmetic reward) was timed
    assert total(scrapes, "srdq_component_out_tokens_total", run_id=run_id, component="drafter") == tokens
    assert total(scrapes, "srdq_component_seconds_total", run_id=run_id, component="drafter") > 0
    assert total(scrapes, "srdq_component_calls_total", run_id=run_id, component="scorer") > 0
    rounds = total(scrapes, "srdq_rounds_total", run_id=run_id)
    assert total(scrapes, "srdq_checkpoint_seconds_count", run_id=run_id) == rounds > 0
    # each process that leased a shard builds its engine once and times it. On a loaded machine a process
    # may still be loading when another has finished the run (its lease then lapses and the reaper hands
    # the shard on): wait for its load to be counted, then compare
    workers = {got["worker"] for s in scrapes for got, v in s.get("srdq_shards_leased_total", []) if v > 0}

    def loads() -> float:
        return total(
            [scrape(port) for port in ports], "srdq_engine_load_seconds_count", engine="transformers"
        )

    wait_for(lambda: loads() >= len(workers), 180, "every leasing process's engine load")
    assert loads() == len(workers) >= 1
    # labels: run, worker (host:pid, the lease owner), component; never a URL or credential
    for scraped in scrapes:
        for name, samples in scraped.items():
            if name.startswith("srdq_"):
                for labels, _ in samples:
                    assert set(labels) <= {"run_id", "worker", "component", "reason", "engine", "le"}, name
                    assert not any("://" in v or "@" in v for v in labels.values()), labels
    assert f"metrics on port {a}" in worker_log(env, "a")
    # the worker started with --log-format json logs JSON objects only, line by line (Celery's too)
    log.flush()
    lines = [line for line in (tmp_path / "b.log").read_text().splitlines() if line.strip()]
    events = [json.loads(line) for line in lines]
    assert events and all({"ts", "level", "logger", "msg"} <= set(e) for e in events)
    assert any(e.get("run_id") == run_id for e in events)
