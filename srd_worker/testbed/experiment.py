"""Run a grid of decoding methods on the testbed and tabulate it with 95% intervals (``make demo`` and
``benchmarks/testbed.py`` use this; everything goes through srdq's own sweep, report and k-curve code).

- ``run_grid`` runs a sweep (a dict in the ``srdq run --sweep`` file format) with the embedded runner
  (``sweep.run_sweep_local``) into one output folder and returns the runs as ``reports.RunRecords``. Run
  ids are deterministic, so a rerun only re-reports finished points.
- ``kcurve_rows``: sampling, Best-of-k and self-consistency (majority@k) for every k ≤ n from the
  candidates of ``best_of_n`` runs at n (``kcurves``: the first k of n seeded candidates ARE a run at k), per
  problem, pooled over seeds with the bootstrap over problems of ``stats.bootstrap_ci``. Tokens at k are k
  times the problem's mean tokens per candidate (the expected cost of a k-subset).
- ``run_rows``: one row per configuration of the other runs (``reports.pool_seeds``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srd_worker.reports.stats import Interval, bootstrap_ci

if TYPE_CHECKING:
    from srd_worker.settings import Settings


@dataclass
class Row:
    """One method at one budget: accuracy and mean generated tokens per problem, with 95% intervals."""

    method: str
    n: int
    accuracy: Interval
    tokens: Interval
    source: str  # "run" (its own runs) or "k-curve of best_of_n n=N"
    run_ids: list[str]
    #: per problem id, the value (correctness) per seed, for paired comparisons (``paired_values``)
    values: dict[str, dict[int, float | None]] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "n": self.n,
            "accuracy": self.accuracy.to_dict(),
            "tokens": self.tokens.to_dict(),
            "source": self.source,
            "run_ids": self.run_ids,
        }


def grid_settings(settings: Settings | None = None) -> Settings:
    """The settings a grid runs with: ``settings``, or by default the CPU with the rest from the SRDQ_*
    environment (the run ids name their engine settings, so readers of a grid recompute ids with these)."""
    from srd_worker.settings import Settings

    return settings or Settings(device="cpu")


def run_grid(
    sweep: dict[str, Any], out_dir: str | Path, *, settings: Settings | None = None, log: Any = print
) -> list[Any]:
    """Run every point of ``sweep`` (embedded, one SQLite store under ``out_dir``); the runs' records."""
    from srd_worker.reports.loading import load_report_runs
    from srd_worker.store.db import make_engine, sqlite_url
    from srd_worker.sweep import SweepPlan, parse_sweep, prepare_sweep, run_sweep_local

    settings = grid_settings(settings)
    parsed = parse_sweep(sweep)
    sid, prepared = prepare_sweep(parsed, settings=settings)  # the run ids name these engine settings
    plan = SweepPlan(sid, "testbed", parsed, prepared)
    out = Path(out_dir)

    def on_point(i: int, point: Any, run_id: str, state: str) -> None:
        log(f"[{i + 1}/{len(prepared)}] {run_id} {point.method} {point.params} seed {point.seed}: {state}")

    run_sweep_local(plan, out_dir=out, settings=settings, on_point=on_point)
    db = make_engine(sqlite_url(out / "srdq.db"))
    try:
        return load_report_runs(db, plan.run_ids)
    finally:
        db.dispose()


def _by_seed(runs: Sequence[Any]) -> dict[int, dict[str, dict[str, Any]]]:
    return {int(r.spec.get("seed", 0)): {str(x["item_id"]): x for x in r.records} for r in runs}


def kcurve_rows(
    bon_runs: Sequence[Any], ks: Sequence[int], *, oracle: bool = False, weighted: bool = False
) -> list[Row]:
    """Sampling (k=1), Best-of-k and majority@k rows from ``best_of_n`` runs of one configuration over
    seeds (their kept candidates, each with ``correct``, ``reward``, ``answer`` and ``n_tokens``);
    ``oracle`` adds pass@k (some candidate of k right: the ceiling of any selector) for every k > 1;
    ``weighted`` adds weighted Best-of-k (``weighted_best_of_n``: the reward-weighted majority@k, what
    ``best_of_n answer=weighted_majority`` answers) for every k > 1 when no candidate's reward is negative."""
    from srd_worker.reports.kcurves import best_of_k, pass_at_k, usable, vote_at_k

    seeds = _by_seed(bon_runs)
    order = sorted(seeds)
    items = [i for i in seeds[order[0]] if all(i in seeds[s] for s in order)]
    # the pool size every usable record has (a failed item has none: its cells are None below)
    n = min((len(u) for s in order for i in items if (u := usable(seeds[s][i]))), default=0)
    ids = [r.run_id for r in bon_runs]
    pools = [u[:n] for s in order for i in items if (u := usable(seeds[s][i]))]
    weighted = weighted and not any(c.get("reward") is not None and c["reward"] < 0 for u in pools for c in u)
    rows = []
    for k in ks:
        if k > n:
            continue
        best: list[list[float | None]] = []
        vote: list[list[float | None]] = []
        wvote: list[list[float | None]] = []
        tokens: list[list[float | None]] = []
        passed: list[list[float | None]] = []
        for i in items:
            b_row: list[float | None] = []
            v_row: list[float | None] = []
            w_row: list[float | None] = []
            t_row: list[float | None] = []
            p_row: list[float | None] = []
            for s in order:
                cands = (usable(seeds[s][i]) or [])[:n]
                if not cands:
                    for row in (b_row, v_row, w_row, t_row, p_row):
                        row.append(None)
                    continue
                b_row.append(best_of_k(cands, k))
                v_row.append(vote_at_k(cands, k, seed=s))
                w_row.append(vote_at_k(cands, k, weighted=True, seed=s) if weighted and k > 1 else None)
                t_row.append(k * sum(int(c.get("n_tokens") or 0) for c in cands) / len(cands))
                p_row.append(pass_at_k(len(cands), sum(1 for c in cands if c.get("correct")), k))
            best.append(b_row)
            vote.append(v_row)
            wvote.append(w_row)
            tokens.append(t_row)
            passed.append(p_row)
        tok = bootstrap_ci(tokens)
        source = f"k-curve of best_of_n n={n}"
        named = [("sampling", best)] if k == 1 else [("best_of_n", best), ("self_consistency", vote)]
        if weighted and k > 1:
            named.append(("weighted_best_of_n", wvote))
        if oracle and k > 1:
            named.append(("pass@k", passed))
        for method, matrix in named:
            cells = {i: dict(zip(order, m, strict=True)) for i, m in zip(items, matrix, strict=True)}
            rows.append(Row(method, k, bootstrap_ci(matrix), tok, source, ids, cells))
    return rows


def run_rows(runs: Sequence[Any]) -> list[Row]:
    """One row per configuration (runs that differ only in their seed pooled), intervals over problems and
    seeds (``reports.pool_seeds``)."""
    from srd_worker.reports.rows import pool_seeds

    return [
        Row(g.method, int(g.budget or 1), g.accuracy, g.tokens, "run", list(g.run_ids))
        for g in pool_seeds(runs)
    ]


def correctness(runs: Sequence[Any]) -> dict[str, dict[int, float | None]]:
    """Per problem id (those every seed's run has), each seed's correctness (1/0, None when ungraded or
    failed): the layout of ``Row.values``."""
    from srd_worker.reports.rows import correct_value

    seeds = _by_seed(runs)
    order = sorted(seeds)
    items = [i for i in seeds[order[0]] if all(i in seeds[s] for s in order)]
    return {i: {s: correct_value(seeds[s][i]) for s in order} for i in items}


def revoted(runs: Sequence[Any]) -> dict[str, dict[int, float | None]]:
    """``correctness`` had the pool methods' runs (SRD, rejection sampling, Speculative Rejection) answered
    with ``answer=weighted_majority``: each record re-answered from its answer pool, the kept candidates or
    the archive (``archive_all``; Speculative Rejection's record lists only its archive), by
    ``kcurves.revoted_correct``; None where it cannot be."""
    from srd_worker.reports.kcurves import revoted_correct

    seeds = _by_seed(runs)
    order = sorted(seeds)
    items = [i for i in seeds[order[0]] if all(i in seeds[s] for s in order)]
    archive_all = {int(r.spec.get("seed", 0)): answers_from_archive(r.spec) for r in runs}
    return {i: {s: revoted_correct(seeds[s][i], archive_all=archive_all[s]) for s in order} for i in items}


def answers_from_archive(spec: dict[str, Any]) -> bool:
    """Whether a run's answer pool is every candidate its records list (Speculative Rejection, or SRD /
    rejection sampling with ``archive_all``), not only those with status kept."""
    params = spec.get("params") or {}
    return spec.get("method") == "speculative_rejection" or bool(params.get("archive_all"))


def paired_values(a: dict[str, dict[int, float | None]], b: dict[str, dict[int, float | None]]) -> Any:
    """``stats.paired`` of two ``Row.values`` layouts over the (problem, seed) cells both have: the
    problems both have, on the seeds both have (a ``--partial`` grid's method may lack a seed that the
    other has; pairing by column position would pair different seeds' draws). ``Paired.seeds`` says how
    many seeds were paired."""
    from srd_worker.reports.stats import paired

    common = [i for i in a if i in b]
    seeds = sorted({s for i in common for s in a[i]} & {s for i in common for s in b[i]})
    return paired(
        [[a[i].get(s) for s in seeds] for i in common], [[b[i].get(s) for s in seeds] for i in common]
    )


def markdown(rows: Sequence[Row]) -> str:
    """The rows as a markdown table: accuracy (%) and mean generated tokens with 95% intervals."""
    lines = [
        "| method | N | accuracy % [95% CI] | mean gen tokens [95% CI] | problems × seeds | from |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        acc, tok = interval_cells(r)
        lines.append(
            f"| {r.method} | {r.n} | {acc} | {tok} | {r.accuracy.problems} × {r.accuracy.seeds} | {r.source} |"
        )
    return "\n".join(lines)


def interval_cells(row: Row) -> tuple[str, str]:
    """Table cells of a row: accuracy in % and mean generated tokens, each with its 95% interval."""
    a, t = row.accuracy, row.tokens
    acc = (
        "n/a"
        if a.mean is None
        else f"{100 * a.mean:.1f} [{100 * (a.low or 0):.1f}, {100 * (a.high or 0):.1f}]"
    )
    tok = "n/a" if t.mean is None else f"{t.mean:.1f} [{t.low or 0:.1f}, {t.high or 0:.1f}]"
    return acc, tok


def dump(rows: Sequence[Row], path: str | Path) -> None:
    Path(path).write_text(json.dumps([r.to_dict() for r in rows], indent=1) + "\n", encoding="utf-8")
