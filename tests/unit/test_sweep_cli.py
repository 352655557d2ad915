"""Sweeps end to end: ``srdq run --sweep`` (embedded, tiny random Llama), recording with the sweep id,
idempotent reruns, ``status`` / ``report`` / ``export`` / ``compare --paired`` on sweep ids; bad sweep
files and option mixes refused with one line and nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from srdq_cli.main import cli

from srd_worker.reports.rows import RunRecords, paired_seed_groups
from srd_worker.service import submit_sweep, sweep_status
from srd_worker.store import crud
from srd_worker.store.db import make_engine, session_scope, sqlite_url, upgrade
from srd_worker.sweep import expand_ids, plan_sweep, select_runs

SRDQ = [sys.executable, "-m", "srdq_cli.main"]

SWEEP = """\
dataset: gsm8k
model: tiny-random-llama
reward: arithmetic
limit: 3
seeds: [0, 1]
methods:
  - method: best_of_n
    n: 2
    params: {max_new_tokens: 16, chunk_tokens: 8}
  - method: self_consistency
    n: 2
    params: {max_new_tokens: 16, chunk_tokens: 8}
"""


def srdq(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SRDQ_DTYPE": "float32", "SRDQ_DEVICE": "cpu", "OMP_NUM_THREADS": "1"}
    return subprocess.run([*SRDQ, *args], capture_output=True, text=True, env=env, timeout=900)


@pytest.fixture
def sweep_file(tmp_path: Path) -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text(SWEEP)
    return path


# ------------------------------------------------------------------------------------ refused input
@pytest.mark.parametrize(
    ("text", "field"),
    [
        (SWEEP.replace("seeds: [0, 1]", "seeds: [0, 0]"), "'seeds'"),
        (
            SWEEP.replace(
                "    n: 2\n    params: {max_new_tokens: 16, chunk_tokens: 8}\n  - method: self",
                "    n: 0\n  - method: self",
            ),
            "'methods[0].n'",
        ),
        (SWEEP.replace("chunk_tokens: 8}\n", "chunk_tokenz: 8}\n", 1), "chunk_tokenz"),
        (SWEEP.replace("limit: 3", "limt: 3"), "'limt'"),
    ],
)
def test_bad_sweep_file_is_one_line_exit_1_nothing_written(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["run", "--sweep", str(path), "--out", str(out)])
    assert res.exit_code == 1, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and field in lines[0], res.output
    assert not out.exists()
    res = CliRunner().invoke(cli, ["submit", "dataset", "--sweep", str(path)])
    assert res.exit_code == 1 and field in res.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--sweep", "S", "--method", "sampling"], "--method cannot be combined with --sweep"),
        (["run", "--sweep", "S", "--seed", "3"], "--seed cannot be combined with --sweep"),
        (["run", "gsm8k", "--sweep", "S"], "drop the NAME|PATH argument"),
        (["submit", "dataset", "--sweep", "S", "--shard-size", "4"], "--shard-size cannot be combined"),
        (["submit", "dataset", "--sweep", "S", "--new"], "--new cannot be combined with --sweep"),
        (["run", "--method", "sampling"], "Missing argument 'NAME|PATH'"),
        (["run", "gsm8k"], "Missing option '--method'"),
    ],
)
def test_sweep_option_mixes_are_refused_naming_the_option(
    tmp_path: Path, args: list[str], message: str
) -> None:
    args = [str(tmp_path / "s.yaml") if a == "S" else a for a in args]
    res = CliRunner().invoke(cli, [*args, "--out", str(tmp_path / "out")] if args[0] == "run" else args)
    assert res.exit_code == 2 and message in res.output, res.output
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- recording (SQLite store)
def test_submit_sweep_records_runs_with_the_sweep_id_and_is_idempotent(
    tmp_path: Path, sweep_file: Path
) -> None:
    url = sqlite_url(tmp_path / "fleet.db")
    upgrade(url)
    db = make_engine(url)
    try:
        plan = plan_sweep(sweep_file, default_shard_size=2)
        sent: list[tuple[str, int]] = []
        done = submit_sweep(plan, db=db, enqueue=lambda r, i: sent.append((r, i)))
        assert done.sweep_id == plan.sweep_id and done.created == done.run_ids and len(done.run_ids) == 4
        assert sent == [(r, i) for r in done.run_ids for i in (0, 1)]  # 3 items in shards of 2
        again = submit_sweep(
            plan_sweep(sweep_file, default_shard_size=2), db=db, enqueue=lambda r, i: sent.append((r, i))
        )
        assert (again.sweep_id, again.run_ids, again.created, again.enqueued) == (
            done.sweep_id,
            done.run_ids,
            [],
            0,
        )
        with session_scope(db) as session:
            row = crud.get_sweep(session=session, sweep_id=done.sweep_id)
            runs = crud.sweep_runs(session=session, sweep_id=done.sweep_id)
        assert row.name == "grid" and json.loads(row.content)["seeds"] == [0, 1]
        assert [r.sweep_id for r in runs] == [done.sweep_id] * 4
        assert [(r.spec["method"], r.spec["seed"]) for r in runs] == [
            ("best_of_n", 0),
            ("best_of_n", 1),
            ("self_consistency", 0),
            ("self_consistency", 1),
        ]
        st = sweep_status(db=db, sweep_id=done.sweep_id)
        assert st.status == "pending" and [r.items for r in st.runs] == [3] * 4
        assert expand_ids(db, [done.sweep_id, done.run_ids[0]]) == done.run_ids
        assert select_runs(db, f"{done.sweep_id}:self_consistency:n=2") == done.run_ids[2:]
        with pytest.raises(Exception, match="selects no run"):
            select_runs(db, f"{done.sweep_id}:srd")
    finally:
        db.dispose()


def _runs(method: str, values: dict[int, list[float]], n: int = 2) -> list[RunRecords]:
    spec = {"method": method, "params": {"n": n}, "task": "gsm8k"}
    return [
        RunRecords(
            f"run-{method}-{s}",
            "x",
            {**spec, "seed": s},
            "done",
            len(v),
            1.0,
            [{"item_id": f"q{i}", "correct": bool(c), "error": None} for i, c in enumerate(v)],
        )
        for s, v in values.items()
    ]


def test_paired_seed_groups_pair_seeds_by_value_and_problems_by_id() -> None:
    a = _runs("best_of_n", {0: [1, 1, 0], 1: [1, 0, 0], 2: [1, 1, 1]})
    b = _runs("self_consistency", {1: [0, 0, 0], 0: [1, 0, 0]})
    metric, res, seeds = paired_seed_groups(a, b)
    assert (metric, seeds, res.pairs, res.problems, res.seeds) == ("accuracy", [0, 1], 6, 3, 2)
    assert (res.wins, res.losses, res.ties) == (2, 0, 4)
    with pytest.raises(ValueError, match="2 configurations"):
        paired_seed_groups(a + _runs("best_of_n", {5: [1, 1, 1]}, n=4), b)
    with pytest.raises(ValueError, match="share no seed"):
        paired_seed_groups(a, _runs("sampling", {9: [1, 1, 1]}))


# ------------------------------------------------------------------- embedded, on the tiny Llama
@pytest.mark.e2e
def test_run_sweep_records_resumes_reports_and_compares(tmp_path: Path, sweep_file: Path) -> None:
    out = tmp_path / "out"
    first = srdq("run", "--sweep", str(sweep_file), "--out", str(out))
    assert first.returncode == 0, first.stderr
    sid = first.stdout.strip().splitlines()[-1].split()[1].rstrip(":")
    assert sid.startswith("sweep-") and len(sid) == 18
    summaries = [json.loads(p.read_text()) for p in out.glob("run-*/summary.json")]
    run_ids = sorted(s["run_id"] for s in summaries)
    assert len(run_ids) == 4 and all(r in first.stdout for r in run_ids)
    assert sum("running" in line for line in first.stderr.splitlines() if line.startswith("[")) == 4

    again = srdq("run", "--sweep", str(sweep_file), "--out", str(out))  # idempotent: same ids, no new work
    assert again.returncode == 0, again.stderr
    assert f"sweep {sid}" in again.stdout and all(r in again.stdout for r in run_ids)
    assert again.stderr.count("finished, re-reporting") == 4

    st = srdq("status", sid, "--db", str(out), "--json")
    assert st.returncode == 0, st.stderr
    status = json.loads(st.stdout)
    assert status["status"] == "done" and sorted(r["run_id"] for r in status["runs"]) == run_ids
    assert all(r["done"] + r["failed"] == 3 for r in status["runs"])

    rep = srdq("report", sid, "--out", str(tmp_path / "rep"), "--db", str(out))
    assert rep.returncode == 0, rep.stderr
    text = (tmp_path / "rep" / "report.md").read_text()
    assert all(f"`{r}`" in text for r in run_ids)
    frontier = text.split("vs generated tokens\n")[1].split("## ")[0]
    rows = [
        line
        for line in frontier.splitlines()
        if line.startswith("| best_of_n") or line.startswith("| self_consistency")
    ]
    assert len(rows) == 2, frontier  # one curve (point) per method, seeds pooled
    assert all("(+1 seeds)" in row and "[" in row for row in rows)  # 2 seeds, 95% CI error bars
    assert "| problems | seeds | accuracy 95% CI |" in text

    cmp_ = srdq(
        "compare", f"{sid}:best_of_n", f"{sid}:self_consistency", "--paired", "--json", "--db", str(out)
    )
    assert cmp_.returncode == 0, cmp_.stderr
    paired = json.loads(cmp_.stdout)
    assert paired["seeds_paired"] == [0, 1] and paired["problems"] == 3 and paired["seeds"] == 2

    exp = srdq("export", sid, "--format", "jsonl", "--out", str(tmp_path / "exp"), "--db", str(out))
    assert exp.returncode == 0, exp.stderr
    assert sorted(p.stem for p in (tmp_path / "exp").glob("*.jsonl")) == run_ids
