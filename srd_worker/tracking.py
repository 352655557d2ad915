"""Experiment tracking (optional extra ``srdq[tracking]``): a run logged to MLflow or Weights & Biases.

``srdq run --track mlflow|wandb`` (or ``SRDQ_TRACKING``) logs while the run goes on; ``srdq report
--track ...`` logs finished runs (a fleet's included) from the store. Each srdq run is one tracking run,
named by its run id, holding:

- the spec (flattened into parameters, and whole as ``spec.json``) and the provenance records (engine
  version, model and reward revisions: ``provenance.json``, and tags);
- progress per shard (step = shard index + 1): items done, failed, generated tokens, the shard's seconds
  and tokens/s (``srdq report`` rebuilds the items, failures and tokens per shard from the records);
- the summary with its 95% bootstrap intervals (accuracy, generated tokens, reward; SRD's pooled routing
  statistics) as final metrics;
- the report: ``report.md``, its PNG plots (accuracy vs tokens, k-curves) and the self-contained
  ``report.html``, and a per-item table (position, id, gold, answer, correct, reward, tokens, candidates,
  routing, error).

MLflow: ``SRDQ_MLFLOW_TRACKING_URI`` (a server ``http://...``, a database, or a ``file:`` store; default
``MLFLOW_TRACKING_URI``, else a file store in the command's output folder, ``OUT/mlruns``), experiment
``SRDQ_MLFLOW_EXPERIMENT``. A resumed run continues the tracking run tagged with its run id. W&B:
``SRDQ_WANDB_PROJECT``, ``SRDQ_WANDB_MODE`` (``offline``, the default: run files under ``SRDQ_WANDB_DIR``
or the output folder, uploaded later with ``wandb sync``; ``online`` needs ``wandb login``).

mlflow and wandb are imported only here, inside the functions that need them (``open_tracker``); a
missing package is one clear line before anything is written.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srd_worker.errors import ConfigError
from srd_worker.reports.rows import RunRecords, routing_row, summarise

if TYPE_CHECKING:
    from srd_worker.settings import Settings

log = logging.getLogger("srdq.tracking")

TRACKERS = ("none", "mlflow", "wandb")
#: MLflow's limit on a parameter value (the file store's and recent servers'); spec.json has it whole
PARAM_LIMIT = 500
#: the per-item table's text cells (question, answer, error) are cut to this many characters
CELL_LIMIT = 500
ITEM_COLUMNS = [
    "position",
    "item_id",
    "question",
    "gold",
    "answer",
    "correct",
    "reward",
    "gen_tokens",
    "candidates",
    "chosen",
    "keep",
    "refine",
    "discard",
    "error",
]


# ------------------------------------------------------------------------------------ what is logged
def flat_params(spec: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """The spec as flat ``a.b`` parameters (lists as JSON text), each value at most ``PARAM_LIMIT``."""
    out: dict[str, str] = {}
    for key, value in sorted(spec.items()):
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat_params(value, name + "."))
            continue
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
        out[name] = text if len(text) <= PARAM_LIMIT else text[: PARAM_LIMIT - 1] + "…"
    return out


def provenance(run: RunRecords) -> list[dict[str, str]]:
    from srd_worker.provenance import summary

    return summary(run.versions or {})


def summary_metrics(run: RunRecords) -> dict[str, float]:
    """The run's summary as numbers: counts, accuracy / tokens / reward with their 95% intervals
    (``*_ci_low``, ``*_ci_high``), compute and elapsed seconds, and SRD's pooled routing statistics."""
    s = summarise(run)
    out: dict[str, float | None] = {
        "items": s.items,
        "done": s.done,
        "failed": s.failed,
        "pending": s.pending,
        "graded": s.graded,
        "correct": s.correct,
        "accuracy": s.accuracy,
        "mean_gen_tokens": s.mean_gen_tokens,
        "mean_reward": s.mean_reward,
        "compute_s": s.compute_s,
        "elapsed_s": s.wall_s,
    }
    for name, ci in (
        ("accuracy", s.accuracy_ci),
        ("mean_gen_tokens", s.tokens_ci),
        ("mean_reward", s.reward_ci),
    ):
        if ci is not None:
            out[f"{name}_ci_low"], out[f"{name}_ci_high"] = ci.low, ci.high
    if (route := routing_row(run)) is not None:
        out.update(
            {
                "p_H": route.p_h,
                "p_M": route.p_m,
                "p_L": route.p_l,
                "rho": route.rho,
                "routing_gain": route.gain,
            }
        )
    return {k: float(v) for k, v in out.items() if v is not None}


def _cell(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float):
        return value
    text = str(value)
    return text if len(text) <= CELL_LIMIT else text[: CELL_LIMIT - 1] + "…"


def item_rows(run: RunRecords) -> list[list[Any]]:
    """One row per item (``ITEM_COLUMNS``), dataset order."""
    rows = []
    for r in run.records:
        extra = r.get("extra") or {}
        routing: dict[str, Any] = extra["routing"] if isinstance(extra.get("routing"), dict) else {}
        error = str(r["error"]).splitlines()[0] if r.get("error") else None
        rows.append(
            [
                r.get("position"),
                _cell(r.get("item_id")),
                _cell(r.get("question")),
                _cell(r.get("gold")),
                _cell(r.get("answer")),
                r.get("correct"),
                r.get("reward"),
                (r.get("ledger") or {}).get("gen_tokens"),
                len(r.get("candidates") or []),
                extra.get("chosen"),
                routing.get("keep"),
                routing.get("refine"),
                routing.get("discard"),
                _cell(error),
            ]
        )
    return rows


def shard_progress(run: RunRecords) -> list[tuple[int, dict[str, float]]]:
    """Progress after each shard of a finished run, rebuilt from its records (shards are contiguous
    ranges of ``shard_size`` items): (step = shard index + 1, items done, failed, generated tokens so far)."""
    size = int(run.spec.get("shard_size") or 16)
    by_shard: dict[int, list[dict[str, Any]]] = {}
    for r in run.records:
        by_shard.setdefault(int(r.get("position") or 0) // size, []).append(r)
    out, done, failed, tokens = [], 0, 0, 0
    for index in sorted(by_shard):
        rows = by_shard[index]
        done += len(rows)
        failed += sum(1 for r in rows if r.get("error"))
        tokens += sum(int((r.get("ledger") or {}).get("gen_tokens", 0)) for r in rows)
        out.append(
            (
                index + 1,
                {
                    "items_done": float(done),
                    "items_failed": float(failed),
                    "gen_tokens": float(tokens),
                    "shard_items": float(len(rows)),
                },
            )
        )
    return out


def report_files(run: RunRecords, folder: Path) -> list[Path]:
    """``srdq report --html`` of this run into ``folder``: report.md, its PNGs and report.html."""
    from srd_worker.reports.html import build_html_report

    report, page = build_html_report([run], folder)
    return [report.markdown, *report.plots, page]


# -------------------------------------------------------------------------------------------- trackers
class Tracker:
    """One srdq run in a tracking backend. ``start`` once; ``shard`` after each shard; ``finish`` with the
    run's records at the end (summary, report, item table); ``close`` on the way out (failed when the run
    did not finish)."""

    kind = "none"

    def start(self, run: RunRecords) -> None:
        raise NotImplementedError

    def shard(self, step: int, metrics: dict[str, float]) -> None:
        raise NotImplementedError

    def finish(self, run: RunRecords) -> None:
        raise NotImplementedError

    def close(self, *, ok: bool) -> None:
        raise NotImplementedError

    @property
    def where(self) -> str:
        """Where the run was logged (for the command's last lines)."""
        raise NotImplementedError


class MlflowTracker(Tracker):
    kind = "mlflow"

    def __init__(self, settings: Settings, out_dir: Path) -> None:
        try:
            from mlflow import MlflowClient
        except ImportError:
            raise ConfigError(
                "--track mlflow needs MLflow: pip install 'srdq[tracking]' (mlflow-skinny)"
            ) from None
        uri = settings.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or ""
        if not uri:
            uri = (Path(out_dir).resolve() / "mlruns").as_uri()
        if uri.startswith("file:") or "://" not in uri:
            # MLflow 3 keeps its file store only behind this opt-in; a file: URI asks for exactly that
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        self.experiment = settings.mlflow_experiment
        self.run_id: str | None = None

    @property
    def where(self) -> str:
        return f"mlflow {self.uri} experiment {self.experiment!r} run {self.run_id}"

    def start(self, run: RunRecords) -> None:
        exp = self.client.get_experiment_by_name(self.experiment)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(self.experiment)
        found = self.client.search_runs(
            [exp_id], filter_string=f"tags.`srdq.run_id` = '{run.run_id}'", max_results=1
        )
        if found:  # a resumed (or re-reported) run continues its tracking run
            self.run_id = found[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            tags = {"srdq.run_id": run.run_id, "srdq.method": run.method, "srdq.name": run.name}
            self.run_id = self.client.create_run(exp_id, run_name=run.run_id, tags=tags).info.run_id
        from mlflow.entities import Param, RunTag

        params = [Param(k, v) for k, v in flat_params(run.spec).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])
        prov = provenance(run)
        self.client.log_dict(self.run_id, run.spec, "spec.json")
        self.client.log_dict(self.run_id, {"versions": run.versions, "runtime": prov}, "provenance.json")
        if prov:
            first = prov[0]
            prov_tags = [RunTag(f"provenance.{k}", (v or "–")[:PARAM_LIMIT]) for k, v in first.items()]
            self.client.log_batch(self.run_id, tags=prov_tags)

    def shard(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        assert self.run_id is not None
        import time

        now = int(time.time() * 1000)
        self.client.log_batch(
            self.run_id, metrics=[Metric(f"progress.{k}", v, now, step) for k, v in metrics.items()]
        )

    def finish(self, run: RunRecords) -> None:
        from mlflow.entities import Metric

        assert self.run_id is not None
        import time

        now = int(time.time() * 1000)
        self.client.log_batch(
            self.run_id, metrics=[Metric(k, v, now, 0) for k, v in summary_metrics(run).items()]
        )
        self.client.log_dict(self.run_id, {"columns": ITEM_COLUMNS, "data": item_rows(run)}, "items.json")
        with tempfile.TemporaryDirectory(prefix="srdq-track-") as tmp:
            for path in report_files(run, Path(tmp)):
                self.client.log_artifact(self.run_id, str(path), artifact_path="report")

    def close(self, *, ok: bool) -> None:
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, "FINISHED" if ok else "KILLED")


class WandbTracker(Tracker):
    kind = "wandb"

    def __init__(self, settings: Settings, out_dir: Path) -> None:
        try:
            import wandb
        except ImportError:
            raise ConfigError("--track wandb needs wandb: pip install 'srdq[tracking]'") from None
        self.wandb = wandb
        self.project = settings.wandb_project
        self.mode = settings.wandb_mode
        self.dir = Path(settings.wandb_dir or out_dir).resolve()
        self.run: Any = None
        self.run_id = ""
        self.run_dir = ""

    @property
    def where(self) -> str:
        return f"wandb ({self.mode}) project {self.project!r} run {self.run_id}: {self.run_dir}"

    def start(self, run: RunRecords) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        config = {**run.spec, "srdq_run_id": run.run_id, "provenance": provenance(run)}
        self.run = self.wandb.init(
            project=self.project,
            name=run.run_id,
            id=run.run_id,
            resume="allow",
            dir=str(self.dir),
            mode=self.mode,
            config=config,
            tags=[run.method],
            settings=self.wandb.Settings(silent=True, console="off", x_disable_stats=True),
        )
        self.run_id, self.run_dir = str(self.run.id), str(Path(self.run.dir).parent)
        (Path(self.run.dir) / "spec.json").write_text(json.dumps(run.spec, indent=2, default=str))
        (Path(self.run.dir) / "provenance.json").write_text(
            json.dumps({"versions": run.versions, "runtime": provenance(run)}, indent=2, default=str)
        )
        for name in ("spec.json", "provenance.json"):
            self.run.save(str(Path(self.run.dir) / name), base_path=self.run.dir, policy="now")
        self.step = 0

    def shard(self, step: int, metrics: dict[str, float]) -> None:
        self.step = max(self.step, step)
        self.run.log({f"progress/{k}": v for k, v in metrics.items()}, step=self.step)

    def finish(self, run: RunRecords) -> None:
        wandb = self.wandb
        summary = summary_metrics(run)
        self.run.summary.update(summary)
        media: dict[str, Any] = {"item_table": wandb.Table(columns=ITEM_COLUMNS, data=item_rows(run))}
        with tempfile.TemporaryDirectory(prefix="srdq-track-") as tmp:
            for path in report_files(run, Path(tmp)):
                if path.suffix == ".png":
                    media[f"report/{path.stem}"] = wandb.Image(str(path))
                else:  # report.md, report.html: into the run's files
                    dest = Path(self.run.dir) / "report" / path.name
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(path, dest)
                    self.run.save(str(dest), base_path=self.run.dir, policy="now")
            self.step += 1
            self.run.log(media, step=self.step)  # images are copied into the run when logged
        self.run.summary.update(summary)  # the summary's numbers, not the last logged media

    def close(self, *, ok: bool) -> None:
        if self.run is not None:
            self.run.finish(exit_code=0 if ok else 1)
            self.run = None


def open_tracker(kind: str | None, settings: Settings, *, out_dir: str | Path) -> Tracker | None:
    """The tracker ``kind`` names (``SRDQ_TRACKING`` when None); None for ``none``. Imports the backend
    here, so a missing package or a bad name is one clear line before anything is written."""
    kind = (kind or settings.tracking or "none").lower()
    if kind not in TRACKERS:
        raise ConfigError(f"unknown tracker {kind!r}: one of {', '.join(TRACKERS)}")
    if kind == "mlflow":
        return MlflowTracker(settings, Path(out_dir))
    if kind == "wandb":
        return WandbTracker(settings, Path(out_dir))
    return None


def track_runs(
    tracker_kind: str | None, runs: Sequence[RunRecords], settings: Settings, *, out_dir: str | Path
) -> list[str]:
    """``srdq report --track``: log finished runs (one tracking run each): spec, provenance, progress per
    shard rebuilt from the records, summary, report and item table. Returns where each went."""
    where = []
    for run in runs:
        tracker = open_tracker(tracker_kind, settings, out_dir=out_dir)
        if tracker is None:
            return []
        ok = False
        try:
            tracker.start(run)
            for step, metrics in shard_progress(run):
                tracker.shard(step, metrics)
            tracker.finish(run)
            ok = True
            where.append(f"{run.run_id} -> {tracker.where}")
        finally:
            tracker.close(ok=ok)
    return where
