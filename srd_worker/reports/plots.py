"""``srdq report``'s figures (matplotlib, no pyplot: no global state, no GUI backend): the accuracy-vs-tokens
frontier of the SRD paper's Figure 2 with 95% error bars, and one run's k-curves. Split from ``reports.py``,
which computes what these draw."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from srd_worker.reports.anytime import AnytimePoint
    from srd_worker.reports.kcurves import KPoint
    from srd_worker.reports.rows import Point

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
TITLE_WIDTH = 72  # characters a title line holds at the figures' width and font size before it is cut off
KCURVE_METRICS = (
    ("pass@k", "pass_at_k"),
    ("majority@k", "majority"),
    ("Best-of-k", "best_of"),
    ("weighted majority@k", "weighted_majority"),
)


def plot_frontier(points: Sequence[Point], path: str | Path, *, title: str, subtitle: str = "") -> Path:
    """Figure 2 layout: one line per method through its runs (sorted by tokens), each point labelled
    with its budget; x = mean generated tokens per problem (log scale when it spans 10x or more)."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend (Agg canvas)

    metric = points[0].metric if points else "accuracy"
    fig = Figure(figsize=(7.0, 4.6), dpi=150, layout="constrained")
    ax = fig.add_subplot()
    methods = sorted({p.method for p in points})
    colors = [f"C{i % 10}" for i in range(len(methods))]
    for i, method in enumerate(methods):
        series = sorted((p for p in points if p.method == method), key=lambda p: (p.x, p.budget or 0))
        xs, ys = [p.x for p in series], [p.y for p in series]
        ax.plot(
            xs,
            ys,
            marker=MARKERS[i % len(MARKERS)],
            markersize=8,
            linewidth=1.8,
            color=colors[i],
            label=method,
            clip_on=False,
        )  # a point at accuracy 0 or 1 sits on the frame, drawn whole
        _error_bars(ax, series, colors[i])
        for p in series:
            ax.annotate(
                p.label, (p.x, p.y), textcoords="offset points", xytext=(8, 7), fontsize=8, color=colors[i]
            )
    xs = [p.x for p in points if p.x > 0]
    if xs and max(xs) / min(xs) >= 10:
        ax.set_xscale("log")
    if points:
        lo = min(min(p.y, p.y_ci[0] if p.y_ci[0] is not None else p.y) for p in points)
        hi = max(max(p.y, p.y_ci[1] if p.y_ci[1] is not None else p.y) for p in points)
        pad = max((hi - lo) * 0.15, 0.05 if metric == "accuracy" else abs(hi) * 0.05 or 0.05)
        if metric == "accuracy":
            ax.set_ylim(max(lo - pad, 0.0), min(hi + pad, 1.0))
        else:
            ax.set_ylim(lo - pad, hi + pad)
        xlo = min(min(p.x, p.x_ci[0] if p.x_ci[0] is not None else p.x) for p in points)
        xhi = max(max(p.x, p.x_ci[1] if p.x_ci[1] is not None else p.x) for p in points)
        if ax.get_xscale() == "linear":
            xpad = max((xhi - xlo) * 0.15, xhi * 0.05, 1.0)
            ax.set_xlim(max(xlo - xpad, 0), xhi + xpad)
    ax.set_xlabel("Mean generated tokens per problem")
    ax.set_ylabel("Accuracy" if metric == "accuracy" else "Mean reward")
    if metric == "accuracy":
        _percent_axis(ax)
    ax.set_title(wrap_title(title + (f"\n{subtitle}" if subtitle else "")), fontsize=11)
    ax.grid(True, alpha=0.3)
    if methods:
        ax.legend(title="method", loc="best", frameon=True)
    path = Path(path)
    fig.savefig(path, format="png")
    return path


def wrap_title(title: str, width: int = TITLE_WIDTH) -> str:
    """``title`` with each of its lines broken at spaces to at most ``width`` characters (a word longer
    than that stays whole): matplotlib cuts a long title off at the figure's edge instead of wrapping it."""
    import textwrap

    return "\n".join(
        "\n".join(textwrap.wrap(line, width, break_long_words=False, break_on_hyphens=False)) or line
        for line in title.split("\n")
    )


def _save_accuracy_plot(fig: Any, ax: Any, path: str | Path, *, title: str, xlabel: str) -> Path:
    """The k-curve's and the anytime curve's shared frame (accuracy 0-100% with bootstrap intervals, a
    grid, the legend), written to ``path`` as PNG."""
    ax.set_ylim(0.0, 1.0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("Accuracy (95% bootstrap intervals over problems)")
    _percent_axis(ax)
    ax.set_title(wrap_title(title), fontsize=11)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best")
    out = Path(path)
    fig.savefig(out, format="png")
    return out


def _percent_axis(ax: Any) -> None:
    """Accuracy (a fraction) shown in percent on the y axis, as the CLI and the tables show it."""
    from matplotlib.ticker import PercentFormatter

    ax.yaxis.set_major_formatter(PercentFormatter(1.0))


def _error_bars(ax: Any, series: Sequence[Point], color: str) -> None:
    """95% intervals as error bars (points without an interval get none)."""

    def err(value: float, ci: tuple[float | None, float | None]) -> tuple[float, float]:
        lo, hi = ci
        return (0.0, 0.0) if lo is None or hi is None else (max(value - lo, 0.0), max(hi - value, 0.0))

    if not any(p.y_ci[0] is not None or p.x_ci[0] is not None for p in series):
        return
    yerr = [[err(p.y, p.y_ci)[0] for p in series], [err(p.y, p.y_ci)[1] for p in series]]
    xerr = [[err(p.x, p.x_ci)[0] for p in series], [err(p.x, p.x_ci)[1] for p in series]]
    ax.errorbar(
        [p.x for p in series],
        [p.y for p in series],
        yerr=yerr,
        xerr=xerr,
        fmt="none",
        ecolor=color,
        elinewidth=1.0,
        capsize=3,
        alpha=0.8,
    )


def plot_kcurve(rows: Sequence[KPoint], path: str | Path, *, title: str) -> Path:
    """pass@k, majority@k, Best-of-k and weighted majority@k against k (log2 x axis) for one run."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.0, 4.6), dpi=150, layout="constrained")
    ax = fig.add_subplot()
    for i, (name, attr) in enumerate(KCURVE_METRICS):
        pts = [r for r in rows if getattr(r, attr) is not None]
        if not pts:
            continue
        ks, ys = [r.k for r in pts], [getattr(r, attr) for r in pts]
        ax.plot(ks, ys, marker=MARKERS[i], label=name, color=f"C{i}", clip_on=False)
        cis = [r.ci.get(attr, (None, None)) for r in pts]
        if any(lo is not None and hi is not None for lo, hi in cis):
            low = [y - lo if lo is not None else 0.0 for y, (lo, _) in zip(ys, cis, strict=True)]
            high = [hi - y if hi is not None else 0.0 for y, (_, hi) in zip(ys, cis, strict=True)]
            ax.errorbar(
                ks, ys, yerr=[low, high], fmt="none", ecolor=f"C{i}", elinewidth=1.0, capsize=3, alpha=0.7
            )
    if rows and rows[-1].k >= 4:
        ax.set_xscale("log", base=2)
    return _save_accuracy_plot(fig, ax, path, title=title, xlabel="k (candidates per problem)")


def plot_anytime(
    points: Sequence[AnytimePoint], path: str | Path, *, title: str, runs: Sequence[Point] = ()
) -> Path:
    """One run's anytime curve (``reports.anytime``): accuracy against mean generated tokens after each
    round, with 95% bootstrap intervals over problems on both axes; ``runs``: separate runs of the same
    method (e.g. at smaller N) drawn as points of their own, labelled by their budget."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.0, 4.6), dpi=150, layout="constrained")
    ax = fig.add_subplot()
    drawn = [(p, p.accuracy) for p in points if p.accuracy is not None]  # rounds with a graded answer
    pts = [p for p, _ in drawn]
    xs, ys = [p.tokens for p in pts], [float(accuracy) for _, accuracy in drawn]
    ax.plot(xs, ys, marker="o", color="C0", label="anytime (this run stopped after round r)", clip_on=False)

    def err(vals: Sequence[float], cis: Sequence[tuple[float | None, float | None]]) -> list[list[float]]:
        low = [v - lo if lo is not None else 0.0 for v, (lo, _) in zip(vals, cis, strict=True)]
        high = [hi - v if hi is not None else 0.0 for v, (_, hi) in zip(vals, cis, strict=True)]
        return [low, high]

    if pts:
        ax.errorbar(
            xs,
            ys,
            xerr=err(xs, [p.tokens_ci for p in pts]),
            yerr=err(ys, [p.accuracy_ci for p in pts]),
            fmt="none",
            ecolor="C0",
            elinewidth=1.0,
            capsize=3,
            alpha=0.7,
        )
        for p, x, y in zip(pts, xs, ys, strict=True):
            ax.annotate(str(p.round), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    for i, run in enumerate(runs):
        color = f"C{i + 1}"
        ax.plot(
            [run.x],
            [run.y],
            marker=MARKERS[(i + 1) % len(MARKERS)],
            ls="none",
            color=color,
            label=f"separate run, {run.label}",
        )
        _error_bars(ax, [run], color)
    return _save_accuracy_plot(
        fig, ax, path, title=title, xlabel="Mean generated tokens per problem, spent by round r"
    )
