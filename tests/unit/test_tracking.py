"""Experiment tracking (``srd_worker/tracking.py``): what is logged, computed from runs; then real ``srdq run
--track`` / ``srdq report --track`` calls on the tiny random Llama, read back from a real MLflow file store
(MLflow's client API) and from W&B's offline run files (the run folder's files and its ``.wandb``
transaction log, read with wandb's protobuf records: ``tests/wandb_log.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from srd_worker.tracking import ITEM_COLUMNS, flat_params, item_rows, shard_progress, summary_metrics
from tests.unit.reports.test_reports import RUN_ARGS, bon_run, srd_run
from tests.wandb_log import read_run

SRDQ = [sys.executable, "-m", "srdq_cli.main"]


# ----------------------------------------------------------------------------------- what is logged
def test_the_spec_flattens_into_short_parameters() -> None:
    spec = {"method": "srd", "params": {"n": 4, "theta": 0.5}, "fields": {}, "limit": None, "x": "y" * 600}
    flat = flat_params(spec)
    assert flat["method"] == "srd" and flat["params.n"] == "4" and flat["params.theta"] == "0.5"
    assert flat["fields"] == "{}" and flat["limit"] == "null"
    assert len(flat["x"]) == 500 and flat["x"].endswith("…")


def test_summary_metrics_carry_intervals_and_routing() -> None:
    m = summary_metrics(srd_run())
    assert m["items"] == 2 and m["done"] == 2 and m["accuracy"] == 1.0
    assert m["accuracy_ci_low"] <= m["accuracy"] <= m["accuracy_ci_high"]
    assert m["mean_gen_tokens_ci_low"] <= m["mean_gen_tokens"] <= m["mean_gen_tokens_ci_high"]
    # pooled over both items: keep 5, refine 2, discard 3 of 10 routing events; 2 of 3 refinements kept
    assert (m["p_H"], m["p_M"], m["p_L"]) == (0.5, 0.2, 0.3) and m["rho"] == pytest.approx(2 / 3)
    bon = summary_metrics(bon_run())
    assert bon["failed"] == 1 and bon["pending"] == 1 and "p_H" not in bon


def test_item_rows_and_shard_progress_from_records() -> None:
    run = bon_run()
    run.spec["shard_size"] = 2
    rows = item_rows(run)
    assert len(rows) == 3 and all(len(r) == len(ITEM_COLUMNS) for r in rows)
    row = dict(zip(ITEM_COLUMNS, rows[2], strict=True))
    assert (
        row["item_id"] == "q2" and row["error"].startswith("prompt of 3000 tokens") and row["correct"] is None
    )
    assert dict(zip(ITEM_COLUMNS, rows[0], strict=True))["gen_tokens"] == 100
    assert shard_progress(run) == [
        (1, {"items_done": 2.0, "items_failed": 0.0, "gen_tokens": 300.0, "shard_items": 2.0}),
        (2, {"items_done": 3.0, "items_failed": 1.0, "gen_tokens": 300.0, "shard_items": 1.0}),
    ]


# ------------------------------------------------------------------------------- real runs, tracked
def srdq(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {**os.environ, "SRDQ_DTYPE": "float32", "SRDQ_DEVICE": "cpu", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [*SRDQ, *args], capture_output=True, text=True, env={**base, **(env or {})}, timeout=600
    )


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, datasets_dir) -> Path:
    data = tmp_path_factory.mktemp("track") / "gsm8k_4.jsonl"
    rows = (datasets_dir / "gsm8k_test.jsonl").read_text(encoding="utf-8").splitlines()[:4]
    data.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return data


def run_tracked(dataset: Path, out: Path, track: str, env: dict[str, str]) -> str:
    """SRD on 4 problems in 2 shards, tracked; returns the run id."""
    proc = srdq(
        "run",
        str(dataset),
        "--method",
        "srd",
        *RUN_ARGS,
        "--shard-size",
        "2",
        "--out",
        str(out),
        "--track",
        track,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"tracked: {track}" in proc.stdout
    (summary,) = out.glob("run-*/summary.json")
    return json.loads(summary.read_text())["run_id"]


@pytest.mark.e2e
def test_srdq_run_logs_to_an_mlflow_file_store_and_report_continues_it(
    dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # this process reads the file store too
    from mlflow import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()
    env = {"SRDQ_MLFLOW_TRACKING_URI": uri, "SRDQ_MLFLOW_EXPERIMENT": "srdq-test"}
    run_id = run_tracked(dataset, tmp_path / "out", "mlflow", env)
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("srdq-test")
    assert exp is not None
    (tracked,) = client.search_runs([exp.experiment_id])
    assert tracked.info.status == "FINISHED" and tracked.info.run_name == run_id
    assert tracked.data.tags["srdq.run_id"] == run_id and tracked.data.tags["srdq.method"] == "srd"
    assert tracked.data.tags["provenance.model"] == "tiny-random-llama"
    params = tracked.data.params
    assert params["method"] == "srd" and params["params.n"] == "4" and params["shard_size"] == "2"
    assert params["model"] == "tiny-random-llama" and params["reward"] == "arithmetic"
    # progress per shard (step = shard index + 1), then the summary with its intervals
    mid = tracked.info.run_id
    items = client.get_metric_history(mid, "progress.items_done")
    assert [(m.step, m.value) for m in sorted(items, key=lambda m: m.step)] == [(1, 2.0), (2, 4.0)]
    tokens = sorted(client.get_metric_history(mid, "progress.gen_tokens"), key=lambda m: m.step)
    assert 0 < tokens[0].value < tokens[1].value
    metrics = tracked.data.metrics
    assert metrics["items"] == 4 and metrics["done"] == 4 and "accuracy" in metrics and "p_H" in metrics
    assert (
        metrics["mean_gen_tokens_ci_low"] <= metrics["mean_gen_tokens"] <= metrics["mean_gen_tokens_ci_high"]
    )
    results = [
        json.loads(line) for line in (tmp_path / "out" / run_id / "results.jsonl").read_text().splitlines()
    ]
    assert metrics["mean_gen_tokens"] == pytest.approx(sum(r["ledger"]["gen_tokens"] for r in results) / 4)
    # artifacts: spec, provenance, the per-item table and the report (plots and the page)
    local = Path(client.download_artifacts(mid, "", str(tmp_path / "dl")))
    spec = json.loads((local / "spec.json").read_text())
    assert spec["method"] == "srd" and spec["params"]["n"] == 4
    prov = json.loads((local / "provenance.json").read_text())
    assert prov["runtime"][0]["model"] == "tiny-random-llama"
    table = json.loads((local / "items.json").read_text())
    assert table["columns"] == ITEM_COLUMNS and len(table["data"]) == 4
    assert [row[ITEM_COLUMNS.index("item_id")] for row in table["data"]] == [r["item_id"] for r in results]
    report = sorted(p.name for p in (local / "report").iterdir())
    assert report == ["accuracy_vs_tokens_gsm8k_4.png", f"anytime_{run_id}.png", "report.html", "report.md"]
    assert (local / "report" / "accuracy_vs_tokens_gsm8k_4.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f'id="items-{run_id}"' in (local / "report" / "report.html").read_text()

    # srdq report --track on the finished run (as for a fleet run) continues the same tracking run
    proc = srdq(
        "report",
        run_id,
        "--out",
        str(tmp_path / "rep"),
        "--db",
        str(tmp_path / "out"),
        "--track",
        "mlflow",
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"tracked: {run_id} -> mlflow {uri}" in proc.stdout
    (again,) = client.search_runs([exp.experiment_id])
    assert again.info.run_id == mid and again.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(mid, "progress.items_done")].count(
        1
    ) == 2  # logged anew


@pytest.mark.e2e
def test_srdq_run_and_report_write_wandb_offline_runs(dataset, tmp_path: Path) -> None:
    env = {"SRDQ_WANDB_DIR": str(tmp_path / "wb"), "SRDQ_WANDB_PROJECT": "srdq-test", "WANDB_SILENT": "true"}
    run_id = run_tracked(dataset, tmp_path / "out", "wandb", env)
    (folder,) = (tmp_path / "wb" / "wandb").glob(f"offline-run-*-{run_id}")
    files = folder / "files"
    assert json.loads((files / "spec.json").read_text())["method"] == "srd"
    assert json.loads((files / "provenance.json").read_text())["runtime"][0]["model"] == "tiny-random-llama"
    assert f'id="items-{run_id}"' in (files / "report" / "report.html").read_text()
    assert (files / "report" / "report.md").read_text().startswith("# srdq report")
    (png,) = (files / "media" / "images" / "report").glob("accuracy_vs_tokens_gsm8k_4_*.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (table_file,) = (files / "media" / "table").glob("item_table_*.table.json")
    table = json.loads(table_file.read_text())
    assert table["columns"] == ITEM_COLUMNS and len(table["data"]) == 4
    # the transaction log: run, config, progress per shard, summary with intervals
    (log_file,) = folder.glob(f"run-{run_id}.wandb")
    logged = read_run(log_file)
    assert logged["run"] == {"id": run_id, "project": "srdq-test", "name": run_id}
    assert logged["config"]["method"] == "srd" and logged["config"]["params"]["n"] == 4
    assert logged["config"]["provenance"][0]["model"] == "tiny-random-llama"
    progress = [
        (h["_step"], h["progress/items_done"]) for h in logged["history"] if "progress/items_done" in h
    ]
    assert progress == [(1, 2), (2, 4)]
    assert any("report/accuracy_vs_tokens_gsm8k_4" in "".join(h) for h in logged["history"])
    summary = logged["summary"]
    assert summary["items"] == 4 and summary["done"] == 4 and "p_H" in summary
    assert (
        summary["mean_gen_tokens_ci_low"] <= summary["mean_gen_tokens"] <= summary["mean_gen_tokens_ci_high"]
    )

    proc = srdq(
        "report",
        run_id,
        "--out",
        str(tmp_path / "rep"),
        "--db",
        str(tmp_path / "out"),
        "--track",
        "wandb",
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    folders = sorted((tmp_path / "wb" / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(folders) in (1, 2)  # a second offline folder, or the same one when both started in one second
    latest = read_run(next(folders[-1].glob(f"run-{run_id}.wandb")))
    assert [h["progress/items_done"] for h in latest["history"] if "progress/items_done" in h][-2:] == [2, 4]
    assert latest["summary"]["items"] == 4


@pytest.mark.e2e
def test_a_bad_tracking_setting_is_one_line_and_writes_nothing(dataset, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = srdq(
        "run", str(dataset), "--method", "srd", *RUN_ARGS, "--out", str(out), env={"SRDQ_TRACKING": "neptune"}
    )
    assert proc.returncode == 1, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "SRDQ_TRACKING" in line and "neptune" in line
    assert not out.exists()
    proc = srdq("run", str(dataset), "--method", "srd", *RUN_ARGS, "--out", str(out), "--track", "neptune")
    assert proc.returncode == 2 and "'neptune' is not one of 'none', 'mlflow', 'wandb'" in proc.stderr
    assert not out.exists()
