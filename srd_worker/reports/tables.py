"""The Markdown tables of ``srdq report`` (``reports.build_report`` puts them together): the run
summary, compute per component (SRD paper Table 2 layout) and routing statistics (Table 6 layout)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from srd_worker.methods.base import COMPONENTS

if TYPE_CHECKING:
    from srd_worker.reports.rows import ComponentRow, RoutingRow, RunSummary


def _num(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _seconds(x: float | None) -> str:
    if x is None:
        return "n/a"
    return "<0.01" if x < 0.01 else f"{x:.2f}"


def _frac(x: float | None) -> str:
    """A probability (routing tiers): a fraction, as the paper's tables give it."""
    return "n/a" if x is None else f"{x:.3f}"


def pct(x: float | None) -> str:
    """An accuracy in percent, as ``srdq run`` prints it (``25.0%``)."""
    return "n/a" if x is None else f"{100 * x:.1f}%"


def pct_ci(x: float | None, ci: tuple[float | None, float | None]) -> str:
    """An accuracy and its interval in percent: ``25.0% [10.0, 45.0]``."""
    lo, hi = ci
    if x is None:
        return "n/a"
    if lo is None or hi is None:
        return pct(x)
    return f"{100 * x:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"


def _interval(ci: Any, digits: int = 3) -> str:
    """``[low, high]`` of a ``stats.Interval`` (n/a when there is none)."""
    if ci is None or ci.low is None or ci.high is None:
        return "n/a"
    return f"[{ci.low:.{digits}f}, {ci.high:.{digits}f}]"


def _pct_interval(ci: Any) -> str:
    """``[low, high]%`` of an accuracy's ``stats.Interval`` in percent (n/a when there is none)."""
    if ci is None or ci.low is None or ci.high is None:
        return "n/a"
    return f"[{100 * ci.low:.1f}, {100 * ci.high:.1f}]%"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str = "") -> str:
    """A GitHub-flavoured Markdown table; ``align`` holds one of l/r per column (default: l then r)."""
    align = align or "l" + "r" * (len(headers) - 1)
    sep = ["---" if a == "l" else "---:" for a in align]
    lines = ["| " + " | ".join(_cell(h) for h in headers) + " |", "|" + "|".join(sep) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


@dataclass(frozen=True)
class Table:
    """A report table as data: ``markdown()`` renders it for ``report.md``, ``reports.html`` as HTML."""

    headers: list[str]
    rows: list[list[Any]]
    align: str = ""  # one of l/r per column (default: l then r)

    def markdown(self) -> str:
        return markdown_table(self.headers, self.rows, self.align)


def _params_text(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(params.items())) or "defaults"


def budget_text(budget: int | None) -> str:
    return "–" if budget is None else str(budget)


def summary_table_data(summaries: Sequence[RunSummary]) -> Table:
    rows = []
    for s in summaries:
        acc = "n/a" if s.accuracy is None else f"{pct(s.accuracy)} ({s.correct}/{s.graded})"
        rows.append(
            [
                s.run_id,
                s.method,
                _params_text(s.params),
                budget_text(s.budget),
                s.model,
                s.reward or "–",
                s.items,
                s.done,
                s.failed,
                s.pending,
                acc,
                _num(s.mean_reward),
                _num(s.mean_gen_tokens, 1),
                "n/a" if s.compute_s is None else f"{s.compute_s:.1f} s",
                "n/a" if s.wall_s is None else f"{s.wall_s:.1f} s",
                s.problems,
                s.seeds,
                _pct_interval(s.accuracy_ci),
                _interval(s.tokens_ci, 1),
            ]
        )
    return Table(
        [
            "run",
            "method",
            "params",
            "N",
            "model",
            "reward",
            "items",
            "done",
            "failed",
            "pending",
            "accuracy",
            "mean reward",
            "mean gen tokens",
            "compute",
            "elapsed",
            "problems",
            "seeds",
            "accuracy 95% CI",
            "mean gen tokens 95% CI",
        ],
        rows,
        align="lllrllrrrrrrrrrrrrr",
    )


def component_table_data(rows: Sequence[ComponentRow]) -> Table:
    body = []
    for r in rows:
        cells = [f"{_seconds(r.components[c].time_s)} / {r.components[c].calls:.1f}" for c in COMPONENTS]
        body.append(
            [
                r.run_id,
                r.method,
                budget_text(r.budget),
                pct(r.accuracy),
                _seconds(r.time_s),
                f"{r.in_tokens:.0f}",
                f"{r.out_tokens:.0f}",
                *cells,
            ]
        )
    return Table(
        ["run", "method", "N", "Acc", "Time", "In tok", "Out tok", "Drafter", "Scorer", "Editor", "Router"],
        body,
        align="llrrrrrrrrr",
    )


def component_tokens_table_data(rows: Sequence[ComponentRow]) -> Table:
    body = [
        [
            r.run_id,
            r.method,
            budget_text(r.budget),
            *(f"{r.components[c].in_tokens:.0f} / {r.components[c].out_tokens:.0f}" for c in COMPONENTS),
        ]
        for r in rows
    ]
    return Table(["run", "method", "N", "Drafter", "Scorer", "Editor", "Router"], body, align="llrrrrr")


def reward_calls_table_data(rows: Sequence[ComponentRow]) -> Table:
    """Reward calls and score-cache hits per run (README, *Score cache*)."""
    body = []
    for r in rows:
        total = r.rm_calls + r.rm_cache_hits
        body.append(
            [
                r.run_id,
                r.method,
                budget_text(r.budget),
                f"{r.rm_calls:.1f}",
                f"{r.rm_tokens:.0f}",
                f"{r.rm_cache_hits:.1f}",
                f"{r.rm_cache_hit_tokens:.0f}",
                str(r.rm_cache_hits_total),
                _frac(r.rm_cache_hits / total) if total else "n/a",
            ]
        )
    return Table(
        [
            "run",
            "method",
            "N",
            "RM calls",
            "RM tokens",
            "cache hits",
            "hit tokens",
            "hits (total)",
            "hit share",
        ],
        body,
        align="llrrrrrrr",
    )


def routing_table_data(rows: Sequence[RoutingRow]) -> Table:
    body = [
        [
            r.run_id,
            r.method,
            budget_text(r.budget),
            _frac(r.p_h),
            _frac(r.p_m),
            _frac(r.p_l),
            _num(r.rho, 2),
            "n/a" if r.gain is None else f"{r.gain:.2f}×",
            r.events,
            r.refinements,
            r.items,
        ]
        for r in rows
    ]
    return Table(
        ["run", "method", "N", "p_H", "p_M", "p_L", "ρ̂", "gain", "routing events", "refinements", "items"],
        body,
        align="llrrrrrrrrr",
    )


def provenance_table_data(runs: Sequence[Any]) -> Table:
    """What each run ran with (``run.versions["runtime"]``, ``srd_worker.provenance``): one row per distinct
    record (a run whose workers differed has several). Runs recorded before srdq kept these say so."""
    from srd_worker.provenance import summary

    body = []
    for run in runs:
        rows = summary(getattr(run, "versions", None) or {})
        if not rows:
            body.append([run.run_id, "not recorded", "", "", "", "", "", ""])
        for r in rows:
            body.append(
                [
                    run.run_id,
                    r["engine"],
                    r["host"] or "–",
                    r["model"],
                    r["revision"],
                    r["reward"],
                    r["reward_revision"],
                    r["server"] or "–",
                ]
            )
    return Table(
        ["run", "engine (version)", "host", "model", "model revision", "reward", "reward revision", "server"],
        body,
        align="llllllll",
    )


def failed_items_table_data(runs: Sequence[Any], limit: int = 20) -> Table | None:
    """The items that failed (error rows: a prompt that does not fit, an item isolated by
    ``srd_worker.isolation``, a grading failure), at most ``limit`` per run, with the first line of
    their error; None when no item failed."""
    rows: list[list[Any]] = []
    for run in runs:
        failed = [r for r in run.records if r.get("error")]
        for r in failed[:limit]:
            fault = (r.get("extra") or {}).get("fault") or {}
            error = str(r["error"]).splitlines()[0]
            rows.append(
                [
                    run.run_id,
                    r.get("item_id"),
                    r.get("position"),
                    fault.get("kind", "–"),
                    fault.get("round", "–"),
                    error if len(error) <= 160 else error[:157] + "...",
                ]
            )
        if len(failed) > limit:
            rows.append([run.run_id, f"… and {len(failed) - limit} more", "", "", "", "see `srdq export`"])
    if not rows:
        return None
    return Table(["run", "item", "position", "fault", "round", "error"], rows, align="llrlrl")


# ------------------------------------------------------------------- the same tables as Markdown text
def summary_table(summaries: Sequence[RunSummary]) -> str:
    return summary_table_data(summaries).markdown()


def component_table(rows: Sequence[ComponentRow]) -> str:
    return component_table_data(rows).markdown()


def component_tokens_table(rows: Sequence[ComponentRow]) -> str:
    return component_tokens_table_data(rows).markdown()


def routing_table(rows: Sequence[RoutingRow]) -> str:
    return routing_table_data(rows).markdown()


def provenance_table(runs: Sequence[Any]) -> str:
    return provenance_table_data(runs).markdown()


def failed_items_table(runs: Sequence[Any], limit: int = 20) -> str | None:
    table = failed_items_table_data(runs, limit)
    return None if table is None else table.markdown()
