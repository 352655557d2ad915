"""``srdq report``: ``build_report`` writes ``report.md`` and its figures from the rows of ``rows.py``, the
tables of ``tables.py`` and the plots of ``plots.py``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from srd_worker.reports.anytime import anytime_curve
from srd_worker.reports.kcurves import NON_ADAPTIVE, KPoint, k_curve
from srd_worker.reports.plots import KCURVE_METRICS, plot_anytime, plot_frontier, plot_kcurve
from srd_worker.reports.rows import (
    RunRecords,
    RunSummary,
    component_row,
    dataset_label,
    kcurve_ks,
    pool_seeds,
    pooled_points,
    routing_row,
    summarise,
)
from srd_worker.reports.tables import (
    budget_text,
    component_table,
    component_tokens_table,
    failed_items_table,
    markdown_table,
    pct_ci,
    provenance_table,
    reward_calls_table,
    routing_table,
    summary_table,
)


# -------------------------------------------------------------------------------------------- report
@dataclass
class Report:
    markdown: Path
    plots: list[Path]
    summaries: list[RunSummary]


def _k(point: KPoint, attr: str) -> str:
    return pct_ci(getattr(point, attr), point.ci.get(attr, (None, None)))


def ci_text(value: float, ci: tuple[float | None, float | None], digits: int) -> str:
    lo, hi = ci
    if lo is None or hi is None:
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "dataset"


def build_report(runs: Sequence[RunRecords], out_dir: str | Path, *, now: datetime | None = None) -> Report:
    """Write ``report.md`` and one PNG per (task, metric) into ``out_dir``; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summaries = [summarise(r) for r in runs]
    comp_rows = [
        row for r, s in zip(runs, summaries, strict=True) if (row := component_row(r, s)) is not None
    ]
    route_rows = [route for r in runs if (route := routing_row(r)) is not None]
    pooled = pool_seeds(runs)
    points = pooled_points(pooled)
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M UTC")

    md = [
        "# srdq report",
        "",
        f"{len(runs)} run(s): "
        + ", ".join(f"`{r.run_id}` ({r.method})" for r in runs)
        + f". Generated {stamp}.",
        "",
        "## Runs",
        "",
    ]
    reward_by_run = {s.run_id: s.reward or "none" for s in summaries}
    by_reward: dict[str, list[RunSummary]] = {}
    for s in summaries:
        by_reward.setdefault(reward_by_run[s.run_id], []).append(s)
    for reward, reward_runs in by_reward.items():
        if len(by_reward) > 1:  # one table per reward: their mean rewards are on different scales
            md += [f"### Reward `{reward}`", ""]
        md += [summary_table(reward_runs), ""]
    md += [
        "Accuracy = correct / graded over items that did not fail, in percent with its 95% bootstrap "
        "interval; failed items (with their error) are counted in *failed*. *pending* = items without a "
        "result yet. Params lists what differs from the method's defaults (N is the budget `n`). *mean "
        "reward* is on its reward model's own scale (runs scored by different rewards are in separate "
        "tables). *compute* = the run's own engine, reward and router seconds summed over its items; "
        "*elapsed* = submit to finish, which includes queue waits and, in a sweep, the runs before it.",
        "",
    ]
    if (failed_table := failed_items_table(runs)) is not None:
        md += [
            "## Failed items",
            "",
            failed_table,
            "",
            "*fault* is `item` for an item whose engine or reward call failed on its own (found by "
            "splitting its batch; the rest of its shard went on) and `oom` for one out of memory even "
            "alone; empty for a prompt longer than the context or a grading failure. README: Failing items.",
            "",
        ]

    plots = []
    # a pooled point's reward: its runs differ only in seed (config_key), so its first run's
    reward_of = {g.label: reward_by_run.get(g.run_ids[0], "none") for g in pooled}
    # a mean-reward plane holds one reward model's scale only; accuracy is comparable across rewards
    groups = sorted(
        {
            (p.dataset, p.metric, reward_of.get(p.run_id, "none") if p.metric == "reward" else "")
            for p in points
        }
    )
    for dataset, metric, reward_key in groups:
        group = [
            p
            for p in points
            if (p.dataset, p.metric) == (dataset, metric)
            and (metric != "reward" or reward_of.get(p.run_id, "none") == reward_key)
        ]
        group_runs = {rid for g in pooled if g.label in {p.run_id for p in group} for rid in g.run_ids}
        names = [s for s in summaries if s.run_id in group_runs]
        label = dataset_label(dataset)
        what = "Accuracy" if metric == "accuracy" else "Mean reward"
        models = ", ".join(sorted({s.model for s in names}))
        rewards = ", ".join(sorted({s.reward or "no reward" for s in names}))
        items = ", ".join(str(i) for i in sorted({s.items for s in names}))
        subtitle = f"model {models} · reward {rewards} · {items} problems"
        path = plot_frontier(
            group,
            out / f"{metric}_vs_tokens_{_slug(dataset)}{'_' + _slug(reward_key) if reward_key else ''}.png",
            title=f"{label}: {what.lower()} vs generated tokens",
            subtitle=subtitle,
        )
        plots.append(path)
        md += [
            f"## {label}: {what.lower()} vs generated tokens",
            "",
            f"![{label} {what.lower()} vs mean generated tokens]({path.name})",
            "",
            f"One series per method, one point per configuration (budget N; runs that differ only in "
            f"their seed are pooled); error bars are 95% bootstrap intervals over problems and seeds; "
            f"{subtitle}.",
            "",
            markdown_table(
                ["method", "N", "run", "seeds", "problems", "mean gen tokens", what.lower()],
                [
                    [
                        p.method,
                        budget_text(p.budget),
                        p.run_id,
                        p.seeds,
                        p.problems,
                        ci_text(p.x, p.x_ci, 1),
                        pct_ci(p.y, p.y_ci) if metric == "accuracy" else ci_text(p.y, p.y_ci, 3),
                    ]
                    for p in sorted(group, key=lambda p: (p.method, p.x))
                ],
                align="lrlrrrr",
            ),
            "",
        ]
    if not groups:
        md += ["No run has graded items or rewards yet: nothing to plot.", ""]

    md += ["## k-curves (non-adaptive runs, from each run's candidates)", ""]
    curves = 0
    for run in runs:
        if run.method not in NON_ADAPTIVE:
            continue
        has = [len(r["candidates"]) for r in run.records if r.get("candidates") and not r.get("error")]
        if not has or min(has) < 2:
            continue
        rows = k_curve(run.records, kcurve_ks(min(has)))
        if not rows:
            continue
        curves += 1
        path = plot_kcurve(
            rows, out / f"kcurve_{_slug(run.run_id)}.png", title=f"{run.run_id} ({run.method})"
        )
        plots.append(path)
        md += [
            f"### `{run.run_id}` ({run.method}, n={min(has)}, {rows[0].problems} problems)",
            "",
            f"![k-curve of {run.run_id}]({path.name})",
            "",
            markdown_table(
                ["k", *(name for name, _ in KCURVE_METRICS), "votes"],
                [
                    [
                        r.k,
                        *(_k(r, attr) for _, attr in KCURVE_METRICS),
                        "exact" if r.exact else "sampled",
                    ]
                    for r in rows
                ],
                align="rrrrrl",
            ),
            "",
        ]
    if curves:
        md += [
            "Each k is the expectation over k-subsets of the run's n seeded candidates (the first k are a "
            "run at n=k): pass@k by the unbiased estimator of Chen et al. (2021), Best-of-k exactly, the "
            "votes over every subset (*exact*) or 1000 seeded random subsets (*sampled*); "
            "`srd_worker/reports/kcurves.py`.",
            "",
        ]
    else:
        md += [
            "No non-adaptive run (sampling, best_of_n, self_consistency) here keeps graded candidates "
            "(n >= 2).",
            "",
        ]

    md += ["## Anytime curves (adaptive runs, from each run's per-round answers)", ""]
    drawn = 0
    for run in runs:
        curve = anytime_curve(run.records)
        if not curve:
            continue
        drawn += 1
        path = plot_anytime(
            curve, out / f"anytime_{_slug(run.run_id)}.png", title=f"{run.run_id} ({run.method}): anytime"
        )
        plots.append(path)
        md += [
            f"### `{run.run_id}` ({run.method}, {curve[0].problems} problems)",
            "",
            f"![anytime curve of {run.run_id}]({path.name})",
            "",
            markdown_table(
                ["round", "finished", "mean gen tokens [95% CI]", "accuracy [95% CI]"],
                [
                    [
                        a.round,
                        f"{a.finished}/{a.problems}",
                        ci_text(a.tokens, a.tokens_ci, 1),
                        pct_ci(a.accuracy, a.accuracy_ci),
                    ]
                    for a in curve
                ],
                align="rrrr",
            ),
            "",
        ]
    if drawn:
        md += [
            "Each point is this run stopped after round r: every problem's answer is the method's current "
            "best by reward after that round (a problem that finished earlier keeps its answer), tokens are "
            "those generated by then; the last point is the run itself. It is not a run at a smaller budget "
            "(a smaller N or token budget changes the run from its first round): see "
            "`srd_worker/reports/anytime.py` and ALGORITHMS.md, *Anytime curves*.",
            "",
        ]
    else:
        md += [
            "No adaptive run here records per-round answers (runs made before srdq recorded them do not).",
            "",
        ]

    md += ["## Compute per component (Table 2 layout)", ""]
    if comp_rows:
        md += [
            component_table(comp_rows),
            "",
            "Mean per problem. Time in seconds (*Time* = all components); In tok = prompt/prefix tokens fed "
            "to the policy model, Out tok = generated tokens; component cells are *time / invocations*.",
            "",
            "Tokens per component (mean input / output tokens per problem; the scorer's input is the "
            "response tokens it scored):",
            "",
            component_tokens_table(comp_rows),
            "",
            "Reward calls and score-cache hits (mean per problem; a hit is a score read from the store's "
            "score cache instead of a reward call, and is not counted in the scorer's invocations, tokens "
            "or *RM calls*):",
            "",
            reward_calls_table(comp_rows),
            "",
        ]
    else:
        md += ["No compute ledger in these runs.", ""]

    md += ["## Provenance (engine version, model and reward revisions)", "", provenance_table(runs), ""]

    md += ["## Routing statistics (Table 6 layout)", ""]
    if route_rows:
        md += [
            routing_table(route_rows),
            "",
            "Pooled over every routing event of the run (ALGORITHMS.md §1.10): p̂ = tier counts / routing "
            "events; ρ̂ = refinements whose result went to KEEP / refinements; gain = 1 + ρ̂·p̂_M/p̂_H "
            "(1.00 when p̂_M = 0; n/a when p̂_H = 0 or nothing was refined while p̂_M > 0).",
            "",
        ]
    else:
        md += ["No run here records routing statistics (only SRD-family methods do).", ""]

    path = out / "report.md"
    path.write_text("\n".join(md), encoding="utf-8")
    return Report(markdown=path, plots=plots, summaries=summaries)
