"""``srdq report``: the tables' numbers on hand-made records, and report.md + PNG from two real embedded
runs (``srdq run`` with the tiny random Llama, Best-of-N and SRD on the same GSM8K problems)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from srd_worker.reports.builder import build_report
from srd_worker.reports.rows import RunRecords, component_row, frontier_points, routing_row, summarise
from srd_worker.reports.tables import pct_ci

SRDQ = [sys.executable, "-m", "srdq_cli.main"]


def ledger(gen: int, prefill: int, comps: dict[str, tuple[int, int, int]]) -> dict:
    components = {
        c: {"calls": 0, "in_tokens": 0, "out_tokens": 0} for c in ("drafter", "scorer", "editor", "router")
    }
    for name, (calls, tin, tout) in comps.items():
        components[name] = {"calls": calls, "in_tokens": tin, "out_tokens": tout}
    return {
        "gen_tokens": gen,
        "prefill_tokens": prefill,
        "lm_calls": 1,
        "rm_calls": 1,
        "rm_tokens": 0,
        "components": components,
    }


def record(i: int, *, correct, reward=None, led=None, timing=None, error=None, extra=None) -> dict:
    return {
        "item_id": f"q{i}",
        "position": i,
        "question": "?",
        "gold": "1",
        "method": "m",
        "response": "r",
        "answer": "1",
        "correct": correct,
        "reward": reward,
        "finish_reason": "stop",
        "ledger": led,
        "error": error,
        "extra": extra or {},
        "timing": timing,
    }


def bon_run() -> RunRecords:
    return RunRecords(
        run_id="run-bon",
        name="bon",
        status="done",
        n_items=4,
        wall_s=12.5,
        spec={
            "method": "best_of_n",
            "task": "gsm8k",
            "model": "tiny",
            "reward": "arithmetic",
            "params": {"n": 4, "max_new_tokens": 64, "temperature": 0.8},
        },
        records=[
            record(
                0,
                correct=True,
                reward=0.8,
                led=ledger(100, 50, {"drafter": (2, 50, 100), "scorer": (1, 100, 0)}),
                timing={"drafter": 1.0, "scorer": 0.5, "editor": 0.0, "router": 0.0},
            ),
            record(
                1,
                correct=False,
                reward=0.4,
                led=ledger(200, 70, {"drafter": (4, 70, 200), "scorer": (2, 200, 0)}),
                timing={"drafter": 2.0, "scorer": 1.5, "editor": 0.0, "router": 0.0},
            ),
            # the prompt did not fit the context: no ledger, no grade
            record(2, correct=None, error="prompt of 3000 tokens does not fit the model context of 2048"),
            # 3 has no result yet (pending)
        ],
    )


def srd_run() -> RunRecords:
    def extra(keep, refine, discard, refinements, kept):
        return {
            "routing": {"keep": keep, "refine": refine, "discard": discard},
            "refinements": refinements,
            "refine_kept": kept,
        }

    led = ledger(
        300, 90, {"drafter": (3, 60, 250), "scorer": (3, 300, 0), "editor": (1, 30, 50), "router": (2, 0, 0)}
    )
    return RunRecords(
        run_id="run-srd",
        name="srd",
        status="done",
        n_items=2,
        wall_s=30.0,
        spec={
            "method": "srd",
            "task": "gsm8k",
            "model": "tiny",
            "reward": "arithmetic",
            "params": {"n": 8, "theta_high": 0.5, "policy": "self_compare"},
        },
        records=[
            record(
                0,
                correct=True,
                reward=0.9,
                led=led,
                extra=extra(3, 1, 0, 1, 1),
                timing={"drafter": 3.0, "scorer": 2.0, "editor": 1.0, "router": 0.001},
            ),
            record(
                1,
                correct=True,
                reward=0.7,
                led=led,
                extra=extra(2, 1, 3, 2, 1),
                timing={"drafter": 1.0, "scorer": 1.0, "editor": 0.5, "router": 0.003},
            ),
        ],
    )


def test_a_nan_reward_is_no_reward_in_the_mean_and_its_interval() -> None:
    from srd_worker.reports.rows import reward_value, score_records

    records = [{"item_id": "a", "reward": 1.0}, {"item_id": "b", "reward": float("nan")}]
    assert score_records(records).mean_reward == 1.0  # was nan, while the interval skipped it
    assert [reward_value(r) for r in records] == [1.0, None]


def test_summary_counts_failed_and_pending_items_apart() -> None:
    s = summarise(bon_run())
    assert (s.items, s.done, s.failed, s.pending) == (4, 2, 1, 1)
    assert (s.correct, s.graded, s.accuracy) == (1, 2, 0.5)
    assert s.mean_reward == pytest.approx(0.6)
    assert s.mean_gen_tokens == 150  # over the items that have a ledger
    assert s.budget == 4 and s.wall_s == 12.5
    # params: only what differs from best_of_n's defaults (n is the budget column)
    assert s.params == {"max_new_tokens": 64}


def test_component_table_means_per_problem() -> None:
    row = component_row(bon_run())
    assert row is not None and row.problems == 2
    assert row.time_s == pytest.approx((1.5 + 3.5) / 2)
    assert (row.in_tokens, row.out_tokens) == (60, 150)
    drafter, scorer, editor = row.components["drafter"], row.components["scorer"], row.components["editor"]
    assert drafter.time_s == pytest.approx(1.5) and drafter.calls == 3
    assert (drafter.in_tokens, drafter.out_tokens) == (60, 150)
    assert scorer.time_s == pytest.approx(1.0) and scorer.calls == 1.5 and scorer.in_tokens == 150
    assert editor.calls == 0 and editor.time_s == 0


def test_component_time_is_unknown_without_timing() -> None:
    run = bon_run()
    for r in run.records:
        r.pop("timing")
    row = component_row(run)
    assert row.time_s is None and row.components["drafter"].time_s is None
    assert row.components["drafter"].calls == 3


def test_routing_statistics_pool_routing_events() -> None:
    row = routing_row(srd_run())
    assert row is not None
    assert (row.events, row.keep, row.refine, row.discard) == (10, 5, 2, 3)
    # pooled (5/10), not the mean of per-item ratios ((3/4 + 2/6) / 2 = 0.5417)
    assert (row.p_h, row.p_m, row.p_l) == (pytest.approx(0.5), pytest.approx(0.2), pytest.approx(0.3))
    assert row.rho == pytest.approx(2 / 3)
    assert row.gain == pytest.approx(1 + (2 / 3) * 0.2 / 0.5)
    assert routing_row(bon_run()) is None


def test_gain_is_one_without_a_refine_tier_and_unknown_without_keep() -> None:
    run = srd_run()
    for r in run.records:
        r["extra"].update(routing={"keep": 2, "refine": 0, "discard": 2}, refinements=0, refine_kept=0)
    assert routing_row(run).gain == 1.0 and routing_row(run).rho is None
    for r in run.records:
        r["extra"]["routing"] = {"keep": 0, "refine": 0, "discard": 4}
    assert routing_row(run).gain is None


def test_points_use_reward_when_nothing_is_graded() -> None:
    alpaca = RunRecords(
        run_id="run-a",
        name="a",
        status="done",
        n_items=1,
        wall_s=1.0,
        spec={"method": "best_of_n", "task": "alpaca_eval", "params": {"n": 2}},
        records=[record(0, correct=None, reward=2.5, led=ledger(40, 10, {}))],
    )
    points = frontier_points([summarise(r) for r in (bon_run(), srd_run(), alpaca)])
    assert [(p.dataset, p.metric, p.method, p.budget, p.x, p.y) for p in points] == [
        ("gsm8k", "accuracy", "best_of_n", 4, 150, 0.5),
        ("gsm8k", "accuracy", "srd", 8, 300, 1.0),
        ("alpaca_eval", "reward", "best_of_n", 2, 40, 2.5),
    ]


def test_report_markdown_holds_every_table(tmp_path: Path) -> None:
    report = build_report([bon_run(), srd_run()], tmp_path)
    text = report.markdown.read_text()
    assert [p.name for p in report.plots] == ["accuracy_vs_tokens_gsm8k.png"]
    assert "![GSM8K accuracy vs mean generated tokens](accuracy_vs_tokens_gsm8k.png)" in text
    # Table 2 row: Acc, Time, In tok, Out tok, then time / calls per component
    assert (
        "| run-bon | best_of_n | 4 | 50.0% | 2.50 | 60 | 150 | 1.50 / 3.0 | 1.00 / 1.5 | <0.01 / 0.0 | <0.01 / 0.0 |"
        in text
    )
    # Table 6 row: p_H, p_M, p_L, rho, gain, events, refinements, items
    assert "| run-srd | srd | 8 | 0.500 | 0.200 | 0.300 | 0.67 | 1.27× | 10 | 3 | 2 |" in text
    assert (
        "| run-bon | best_of_n | max_new_tokens=64 | 4 | tiny | arithmetic | 4 | 2 | 1 | 1 | 50.0% (1/2) |"
        in text
    )
    assert "policy=self_compare" in text


def seeded_run(seed: int, correct: list[bool], n_cands: int = 0) -> RunRecords:
    recs = []
    for i, ok in enumerate(correct):
        rec = record(i, correct=ok, reward=0.5, led=ledger(100 + 10 * i + seed, 20, {}))
        if n_cands:
            rec["candidates"] = [
                {"id": j, "answer": str((i + j) % 2), "correct": (i + j) % 2 == 0, "reward": j / n_cands}
                for j in range(n_cands)
            ]
        recs.append(rec)
    return RunRecords(
        run_id=f"run-s{seed}",
        name="s",
        status="done",
        n_items=len(correct),
        wall_s=1.0,
        spec={"method": "best_of_n", "task": "gsm8k", "model": "tiny", "params": {"n": 4}, "seed": seed},
        records=recs,
    )


def test_runs_differing_only_in_seed_are_pooled_with_intervals(tmp_path: Path) -> None:
    from srd_worker.reports.rows import pool_seeds
    from srd_worker.reports.stats import bootstrap_ci

    a = seeded_run(0, [True, False, True, True, False, True])
    b = seeded_run(1, [True, True, False, True, False, False])
    other = bon_run()
    pooled = pool_seeds([a, other, b])
    assert [g.run_ids for g in pooled] == [["run-s0", "run-s1"], ["run-bon"]]
    g = pooled[0]
    assert (g.seeds, g.problems) == (2, 6)
    assert g.accuracy.mean == pytest.approx(7 / 12)
    assert g.accuracy == bootstrap_ci([[1, 1], [0, 1], [1, 0], [1, 1], [0, 0], [1, 0]])
    assert g.accuracy.low < 7 / 12 < g.accuracy.high
    assert g.tokens.mean == pytest.approx(sum(100 + 10 * i for i in range(6)) / 6 + 0.5)
    text = build_report([a, b], tmp_path).markdown.read_text()
    assert "| best_of_n | 4 | run-s0 (+1 seeds) | 2 | 6 |" in text
    assert "accuracy 95% CI" in text and f"[{100 * g.accuracy.low:.1f}, {100 * g.accuracy.high:.1f}]" in text


def test_report_has_a_k_curve_for_runs_with_candidates(tmp_path: Path) -> None:
    from srd_worker.reports.kcurves import k_curve

    run = seeded_run(0, [True, False, True], n_cands=4)
    report = build_report([run, srd_run()], tmp_path)
    text = report.markdown.read_text()
    assert [p.name for p in report.plots] == ["accuracy_vs_tokens_gsm8k.png", "kcurve_run-s0.png"]
    rows = k_curve(run.records, [1, 2, 4])
    assert "### `run-s0` (best_of_n, n=4, 3 problems)" in text
    for r in rows:
        cells = [pct_ci(getattr(r, a), r.ci[a]) for a in ("pass_at_k", "majority", "best_of")]
        assert f"| {r.k} | {' | '.join(cells)} |" in text
        assert all(r.ci[a][0] <= getattr(r, a) <= r.ci[a][1] for a in ("pass_at_k", "majority", "best_of"))
    assert "## k-curves" in build_report([srd_run()], tmp_path / "b").markdown.read_text()


# ------------------------------------------------------------------------------ real embedded runs
RUN_ARGS = [
    "--n",
    "4",
    "--reward",
    "arithmetic",
    "--model",
    "tiny-random-llama",
    "--max-new-tokens",
    "24",
    "--set",
    "chunk_tokens=8",
    "--seed",
    "1",
]


def srdq(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SRDQ_DTYPE": "float32", "SRDQ_DEVICE": "cpu", "OMP_NUM_THREADS": "1"}
    return subprocess.run([*SRDQ, *args], capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, datasets_dir) -> tuple[Path, list[str]]:
    """Best-of-N and SRD on the same 4 GSM8K problems, in one embedded output folder."""
    base = tmp_path_factory.mktemp("embedded")
    data = base / "gsm8k_4.jsonl"
    rows = (datasets_dir / "gsm8k_test.jsonl").read_text(encoding="utf-8").splitlines()[:4]
    data.write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = base / "out"
    run_ids = []
    for method in ("best_of_n", "srd"):
        proc = srdq("run", str(data), "--method", method, *RUN_ARGS, "--out", str(out))
        assert proc.returncode == 0, proc.stderr
        (summary,) = [
            p for p in out.glob("run-*/summary.json") if json.loads(p.read_text())["method"] == method
        ]
        run_ids.append(json.loads(summary.read_text())["run_id"])
    return out, run_ids


@pytest.mark.e2e
def test_report_of_two_real_runs_writes_a_png_and_markdown(two_runs, tmp_path: Path) -> None:
    from PIL import Image

    out, run_ids = two_runs
    proc = srdq("report", *run_ids, "--out", str(tmp_path / "rep"), "--db", str(out / "srdq.db"))
    assert proc.returncode == 0, proc.stderr
    png = tmp_path / "rep" / "accuracy_vs_tokens_gsm8k_4.png"  # the dataset's own name (its file)
    kcurve = tmp_path / "rep" / f"kcurve_{run_ids[0]}.png"  # Best-of-N keeps its 4 candidates
    anytime = tmp_path / "rep" / f"anytime_{run_ids[1]}.png"  # SRD records its per-round answers
    assert proc.stdout.split() == [str(tmp_path / "rep" / "report.md"), str(png), str(kcurve), str(anytime)]
    assert kcurve.stat().st_size > 0 and anytime.stat().st_size > 0
    with Image.open(png) as image:
        image.verify()
    with Image.open(png) as image:
        assert image.format == "PNG"
        assert 800 <= image.width <= 1400 and 500 <= image.height <= 1000, image.size
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
        assert colours is not None and len(colours) > 50  # drawn, not a blank canvas
    text = (tmp_path / "rep" / "report.md").read_text()
    for run_id in run_ids:
        assert f"`{run_id}`" in text
    assert "## Routing statistics (Table 6 layout)" in text
    routing = text.split("## Routing statistics (Table 6 layout)")[1]
    assert run_ids[1] in routing and run_ids[0] not in routing  # only SRD records routing statistics
    kpart = text.split("## k-curves")[1].split("## Anytime curves")[0]
    assert f"### `{run_ids[0]}` (best_of_n, n=4, 4 problems)" in kpart and run_ids[1] not in kpart
    apart = text.split("## Anytime curves")[1].split("## Compute per component")[0]
    assert f"### `{run_ids[1]}` (srd, 4 problems)" in apart and run_ids[0] not in apart


@pytest.mark.e2e
def test_export_of_an_embedded_run_equals_its_results_file(two_runs, tmp_path: Path) -> None:
    out, run_ids = two_runs
    dest = tmp_path / "bon.jsonl"
    proc = srdq("export", run_ids[0], "--format", "jsonl", "--out", str(dest), "--db", str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"4 rows (0 failed) -> {dest}"
    exported = [json.loads(line) for line in dest.read_text().splitlines()]
    stored = [json.loads(line) for line in (out / run_ids[0] / "results.jsonl").read_text().splitlines()]
    extra = {"run_id", "shard_index", "status", "failed", "timing"}  # results.jsonl keeps timing apart
    assert [{k: v for k, v in r.items() if k not in extra} for r in exported] == stored
    assert all(r["status"] == "done" and r["failed"] is False for r in exported)


@pytest.mark.e2e
def test_export_format_follows_the_file_name(two_runs, tmp_path: Path) -> None:
    """No --format: `results.csv` gets CSV (it used to get Parquet bytes under a .csv name); a --format
    that contradicts the name is refused and writes nothing."""
    out, run_ids = two_runs
    dest = tmp_path / "results.csv"
    proc = srdq("export", run_ids[0], "--out", str(dest), "--db", str(out))
    assert proc.returncode == 0, proc.stderr
    assert dest.read_text().splitlines()[0].startswith("run_id,")
    wrong = tmp_path / "wrong.csv"
    proc = srdq("export", run_ids[0], "--format", "parquet", "--out", str(wrong), "--db", str(out))
    assert proc.returncode != 0 and not wrong.exists()
    assert "--format parquet does not match the destination" in proc.stderr


@pytest.mark.e2e
def test_report_of_an_unknown_run_is_one_clear_line(two_runs, tmp_path: Path) -> None:
    out, _ = two_runs
    proc = srdq("report", "run-nope", "--out", str(tmp_path), "--db", str(out / "srdq.db"))
    assert proc.returncode == 1
    assert proc.stderr.strip() == "Error: no run 'run-nope' in the database"


# ------------------------------------------------------------------ names, units and times in reports
def test_a_report_names_the_dataset_not_the_task(tmp_path: Path) -> None:
    from srd_worker.datasets import DATASETS, GENERATED, dataset_name

    assert dataset_name("testbed") == "testbed" and dataset_name("gsm8k") == "gsm8k"
    assert dataset_name(str(GENERATED["testbed"][0])) == "testbed"  # the testbed's file, given as a path
    assert dataset_name(str(DATASETS["math500"].path)) == "math500"
    assert dataset_name(str(tmp_path / "my_problems.jsonl")) == "my_problems"
    run = bon_run()
    run.spec["dataset"] = "testbed"  # a gsm8k-layout dataset that is not GSM8K
    report = build_report([run], tmp_path)
    text = report.markdown.read_text()
    assert [p.name for p in report.plots] == ["accuracy_vs_tokens_testbed.png"]
    assert "## CPU testbed (arithmetic word problems): accuracy vs generated tokens" in text
    assert "GSM8K" not in text


def test_run_times_are_each_runs_own_compute_beside_the_elapsed_span(tmp_path: Path) -> None:
    a, b = bon_run(), bon_run()
    b.run_id, b.wall_s = "run-bon-2", 40.0  # a sweep's second run: elapsed since submit includes the first
    b.records = b.records[:1]
    sa, sb = summarise(a), summarise(b)
    assert sa.compute_s == pytest.approx(1.0 + 0.5 + 2.0 + 1.5) and sb.compute_s == pytest.approx(1.5)
    text = build_report([a, b], tmp_path).markdown.read_text()
    assert "| compute | elapsed |" in text
    assert "| 5.0 s | 12.5 s |" in text and "| 1.5 s | 40.0 s |" in text


def test_runs_scored_by_different_rewards_get_separate_tables(tmp_path: Path) -> None:
    a, b = bon_run(), bon_run()
    b.run_id, b.spec = "run-orm", {**b.spec, "reward": "hf-orm:some/rm"}
    text = build_report([a, b], tmp_path).markdown.read_text()
    runs = text.split("## Runs")[1].split("\n## ")[0]
    assert "### Reward `arithmetic`" in runs and "### Reward `hf-orm:some/rm`" in runs
    first, second = runs.split("### Reward `hf-orm:some/rm`")
    assert "run-bon" in first and "run-orm" not in first and "run-orm" in second
    assert "### Reward" not in build_report([a], tmp_path / "one").markdown.read_text()


def test_accuracy_is_a_percentage_in_every_report_table(tmp_path: Path) -> None:
    text = build_report([bon_run(), srd_run()], tmp_path).markdown.read_text()
    assert "| 50.0% (1/2) |" in text  # the run table, as `srdq run` prints it
    assert "| 0.500 (1/2) |" not in text


def test_reward_calls_and_cache_hits_are_reported_apart(tmp_path: Path) -> None:
    """A score-cache hit is shown as a hit, never as a reward call (README, *Score cache*); records stored
    before the cache (no hit counter) count none."""
    run = srd_run()
    run.records[0]["ledger"] = {
        **run.records[0]["ledger"],
        "rm_calls": 2,
        "rm_tokens": 90,
        "rm_cache_hits": 6,
        "rm_cache_hit_tokens": 250,
    }
    row = component_row(run)
    assert row is not None
    assert (row.rm_calls, row.rm_cache_hits, row.rm_cache_hits_total) == (1.5, 3.0, 6)
    assert (row.rm_tokens, row.rm_cache_hit_tokens) == (45.0, 125.0)  # per problem, over the run's two
    text = build_report([run, bon_run()], tmp_path).markdown.read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("| run-srd |") and "0.667" in ln)
    assert line.split("|")[4:10] == [" 1.5 ", " 45 ", " 3.0 ", " 125 ", " 6 ", " 0.667 "]
    bon = next(
        ln for ln in text.splitlines() if ln.startswith("| run-bon |") and "n/a" not in ln and "| 0 |" in ln
    )
    assert " 0.000 " in bon


def test_report_draws_the_anytime_curve_of_an_adaptive_run(tmp_path: Path) -> None:
    run = srd_run()
    for i, rec in enumerate(run.records):
        rec["extra"] = {
            **rec["extra"],
            "anytime": [
                {"round": 1, "tokens": 10 + i, "answer": None, "correct": False, "reward": None},
                {"round": 2, "tokens": 30 + i, "answer": "1", "correct": rec["correct"], "reward": 0.5},
            ],
        }
    report = build_report([run, bon_run()], tmp_path)
    text = report.markdown.read_text()
    assert (tmp_path / "anytime_run-srd.png").exists() and "anytime_run-bon.png" not in text
    section = text.split("## Anytime curves")[1].split("\n## ")[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| 1 |") or ln.startswith("| 2 |")]
    graded = [r for r in run.records if r.get("correct") is not None]
    final = 100 * sum(bool(r["correct"]) for r in graded) / len(graded)
    assert rows[0].split("|")[4].strip().startswith("0.0%") and f"{final:.1f}%" in rows[1]


def test_the_anytime_plot_shows_the_same_methods_smaller_runs_as_points_of_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An SRD run at N=8 with per-round answers beside SRD at N=4 and N=16 and Best-of-N at N=4: the N=8
    curve's plot gets the N=4 SRD run (same method and dataset, smaller N) and nothing else."""
    import srd_worker.reports.builder as builder

    def srd_at(n: int, run_id: str, anytime: bool) -> RunRecords:
        run = srd_run()
        run.run_id, run.spec = run_id, {**run.spec, "params": {**run.spec["params"], "n": n}}
        if anytime:
            for rec in run.records:
                rec["extra"] = {
                    **rec["extra"],
                    "anytime": [{"round": 1, "tokens": 10, "answer": "1", "correct": rec["correct"]}],
                }
        return run

    seen: dict[str, list] = {}

    def capture(curve, path, *, title, runs=()):
        seen[Path(path).name] = list(runs)
        return Path(path)

    monkeypatch.setattr(builder, "plot_anytime", capture)
    small, big, bigger = (
        srd_at(4, "run-srd4", False),
        srd_at(8, "run-srd8", True),
        srd_at(16, "run-srd16", False),
    )
    bon = bon_run()
    build_report([small, big, bigger, bon], tmp_path, plots=True)
    (got,) = seen.values()
    assert [(p.method, p.budget) for p in got] == [("srd", 4)]
    expected = summarise(small)
    assert (got[0].y, got[0].x) == pytest.approx((expected.accuracy, expected.mean_gen_tokens))
