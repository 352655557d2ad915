"""The report's numbers over runs' result records: a run's records (``RunRecords``), per-run summaries
(``summarise``, ``score_records``), seed pooling with bootstrap intervals, paired seed groups, the Table 2
component rows, the Table 6 routing rows and the frontier points. Pure functions; the Markdown tables are
``tables.py``, the figures ``plots.py`` and ``build_report`` is ``builder.py``.

What a report holds, per ALGORITHMS.md §0.3 and §1.10 and the SRD paper's layouts:

- **Summary** per run: method, non-default parameters, budget N, items, done, failed, pending,
  accuracy, mean reward, mean generated tokens, wall time.
- **Figure 2 layout**: accuracy (or the mean reward when the task has no gold answers, e.g. AlpacaEval)
  against mean generated tokens per problem; one series per method, one point per run (budget N).
  One PNG per task and metric.
- **Table 2 layout**: per run, accuracy, mean time per problem, mean input (prefill) and output
  (generated) tokens per problem, and for Drafter / Scorer / Editor / Router the mean wall time (s) and
  mean number of invocations per problem; plus the mean input/output tokens of each component.
- **Table 6 layout** (runs whose records carry SRD routing statistics): p̂_H, p̂_M, p̂_L = tier
  frequencies pooled over every routing event of the run (not averages of per-item ratios), ρ̂ =
  refinements whose result went to KEEP / refinements, gain = 1 + ρ̂·p̂_M/p̂_H.

Definitions (``score_records``, shared with ``srdq run``'s summary.json): accuracy = correct / graded,
over items that did not fail (failed items are counted in ``failed``, not as wrong answers); mean reward
over items that did not fail and have a finite one; token and time means over the items that have a compute ledger (a problem whose
prompt did not fit the context has none). Wall time = the run's last status change minus its creation.
Time per component comes from each record's ``timing`` (absent in ``results.jsonl``: shown as n/a).

Why this file is about 700 lines: it is one noun, the report's numbers (summaries, seed pooling with
bootstrap intervals, component and routing rows, frontier and k-curve points) and ``build_report`` that
assembles them; the Markdown tables live in ``report_tables.py`` and the figures in ``report_plots.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from srd_worker.methods.base import COMPONENTS
from srd_worker.reports.stats import Interval, bootstrap_ci

#: How the report names a dataset (``datasets.dataset_name``); any other dataset by its own name.
DATASET_LABELS = {
    "gsm8k": "GSM8K",
    "math500": "MATH500",
    "gpqa": "GPQA Diamond",
    "alpaca_eval": "AlpacaEval",
    "hotpotqa": "HotpotQA",
    "testbed": "CPU testbed (arithmetic word problems)",
}


def dataset_key(spec: dict[str, Any]) -> str:
    """The dataset a run's spec names, as ``datasets.dataset_name`` gives it (the task when none)."""
    from srd_worker.datasets import dataset_name

    value = spec.get("dataset")
    return dataset_name(value) if value else str(spec.get("task", "?"))


def dataset_label(key: str) -> str:
    return DATASET_LABELS.get(key, key)


@dataclass
class RunRecords:
    """One run as the report sees it: its spec and its result records (dataset order)."""

    run_id: str
    name: str
    spec: dict[str, Any]
    status: str
    n_items: int
    wall_s: float | None
    records: list[dict[str, Any]]
    #: the run's ``versions`` (package versions; ``runtime``: engine, model and reward revisions)
    versions: dict[str, Any] = field(default_factory=dict)

    @property
    def method(self) -> str:
        return str(self.spec.get("method", "?"))

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.spec.get("params") or {})

    @property
    def budget(self) -> int | None:
        n = self.params.get("n")
        return n if isinstance(n, int) and not isinstance(n, bool) else None


# ------------------------------------------------------------------------------------------- numbers
def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _ok(record: dict[str, Any]) -> bool:
    return not record.get("error")


def _ledger(record: dict[str, Any]) -> dict[str, Any] | None:
    ledger = record.get("ledger")
    return ledger if isinstance(ledger, dict) else None


def changed_params(method: str, params: dict[str, Any]) -> dict[str, Any]:
    """The parameters that differ from the method's defaults (all of them for an unknown method)."""
    try:
        from srd_worker.methods.registry import METHODS

        defaults = {name: default for name, _, default, _ in METHODS[method].params.describe()}
    except (ImportError, KeyError):
        return dict(params)
    return {k: v for k, v in params.items() if k not in defaults or defaults[k] != v}


@dataclass
class RunSummary:
    run_id: str
    name: str
    method: str
    task: str
    model: str
    reward: str | None
    params: dict[str, Any]  # non-default parameters
    budget: int | None
    status: str
    items: int
    done: int
    failed: int
    pending: int
    graded: int
    correct: int
    accuracy: float | None
    mean_reward: float | None
    mean_gen_tokens: float | None
    wall_s: float | None
    problems: int = 0  # items with a grade (accuracy) — the n of the accuracy interval
    seeds: int = 1
    accuracy_ci: Interval | None = None
    tokens_ci: Interval | None = None
    reward_ci: Interval | None = None
    dataset: str = ""  # dataset_key of the run
    #: the run's own compute: the engines', rewards' and router's wall seconds summed over its items (each
    #: batched call apportioned to its items), so runs of one sweep or queue do not add up, as ``wall_s``
    #: (submit to finish) does
    compute_s: float | None = None


@dataclass
class Scores:
    """The figures every summary of result records reports (``srdq run``'s summary.json and the
    report's run table), by the definitions in this module's docstring."""

    done: int
    failed: int
    graded: int
    correct: int
    accuracy: float | None
    mean_reward: float | None
    mean_gen_tokens: float | None


def score_records(records: Sequence[dict[str, Any]]) -> Scores:
    ok = [r for r in records if _ok(r)]
    graded = [r for r in ok if r.get("correct") is not None]
    correct = sum(1 for r in graded if r["correct"])
    rewards = [v for r in ok if (v := reward_value(r)) is not None]
    gen = [float(led.get("gen_tokens", 0)) for r in records if (led := _ledger(r)) is not None]
    return Scores(
        done=len(ok),
        failed=len(records) - len(ok),
        graded=len(graded),
        correct=correct,
        accuracy=correct / len(graded) if graded else None,
        mean_reward=_mean(rewards),
        mean_gen_tokens=_mean(gen),
    )


def summarise(run: RunRecords) -> RunSummary:
    """The report's summary of one run: ``score_records`` plus the run's spec, status and wall time."""
    scores = score_records(run.records)
    return RunSummary(
        run_id=run.run_id,
        name=run.name,
        method=run.method,
        task=str(run.spec.get("task", "?")),
        model=str(run.spec.get("model", "?")),
        reward=run.spec.get("reward"),
        params=changed_params(run.method, {k: v for k, v in run.params.items() if k != "n"}),
        budget=run.budget,
        status=run.status,
        items=run.n_items,
        done=scores.done,
        failed=scores.failed,
        pending=max(run.n_items - len(run.records), 0),
        graded=scores.graded,
        correct=scores.correct,
        accuracy=scores.accuracy,
        mean_reward=scores.mean_reward,
        mean_gen_tokens=scores.mean_gen_tokens,
        wall_s=run.wall_s,
        problems=scores.graded,
        seeds=1,
        accuracy_ci=bootstrap_ci([correct_value(r) for r in run.records]),
        tokens_ci=bootstrap_ci([tokens_value(r) for r in run.records]),
        reward_ci=bootstrap_ci([reward_value(r) for r in run.records]),
        dataset=dataset_key(run.spec),
        compute_s=compute_seconds(run.records),
    )


def compute_seconds(records: Sequence[dict[str, Any]]) -> float | None:
    """The wall seconds of every component summed over the records' ``timing`` (None when none has one)."""
    timed = [r["timing"] for r in records if isinstance(r.get("timing"), dict)]
    if not timed:
        return None
    return sum(float(v) for t in timed for v in t.values() if isinstance(v, int | float))


# ------------------------------------------------------------------------------ seeds and intervals
def correct_value(record: dict[str, Any]) -> float | None:
    """1/0 for a graded item that did not fail, else None (as ``score_records`` counts accuracy)."""
    if not _ok(record) or record.get("correct") is None:
        return None
    return 1.0 if record["correct"] else 0.0


def tokens_value(record: dict[str, Any]) -> float | None:
    led = _ledger(record)
    return None if led is None else float(led.get("gen_tokens", 0))


def reward_value(record: dict[str, Any]) -> float | None:
    """The reward of an item that did not fail, None when it has no finite one (a NaN reward is none)."""
    value = record.get("reward")
    if not _ok(record) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def config_key(spec: dict[str, Any]) -> str:
    """What makes runs the same experiment up to the seed: the spec without ``seed`` and the dataset's
    path (its sha256 stays) — runs sharing it are pooled as seeds."""
    import json

    return json.dumps({k: v for k, v in spec.items() if k not in ("seed", "dataset")}, sort_keys=True)


def seed_matrix(runs: Sequence[RunRecords], value: Any) -> list[list[float | None]]:
    """``problems × seeds``: one row per item id (first-seen order), one column per run."""
    order: dict[str, None] = {}
    by_run = []
    for run in runs:
        cells = {str(r.get("item_id")): value(r) for r in run.records}
        order.update(dict.fromkeys(cells))
        by_run.append(cells)
    return [[cells.get(item) for cells in by_run] for item in order]


@dataclass
class PooledRun:
    """Runs of one configuration over several seeds, pooled (intervals over problems and seeds)."""

    run_ids: list[str]
    method: str
    dataset: str  # dataset_key of the runs
    budget: int | None
    seeds: int
    problems: int
    accuracy: Interval
    tokens: Interval
    reward: Interval

    @property
    def label(self) -> str:
        return self.run_ids[0] + (f" (+{len(self.run_ids) - 1} seeds)" if len(self.run_ids) > 1 else "")


def pool_seeds(runs: Sequence[RunRecords]) -> list[PooledRun]:
    """Group runs by ``config_key`` (first-seen order) and pool each group's seeds."""
    groups: dict[str, list[RunRecords]] = {}
    for run in runs:
        groups.setdefault(config_key(run.spec), []).append(run)
    out = []
    for group in groups.values():
        acc = bootstrap_ci(seed_matrix(group, correct_value))
        out.append(
            PooledRun(
                run_ids=[r.run_id for r in group],
                method=group[0].method,
                dataset=dataset_key(group[0].spec),
                budget=group[0].budget,
                seeds=len({r.spec.get("seed") for r in group}),
                problems=acc.problems,
                accuracy=acc,
                tokens=bootstrap_ci(seed_matrix(group, tokens_value)),
                reward=bootstrap_ci(seed_matrix(group, reward_value)),
            )
        )
    return out


def paired_seed_groups(
    a: Sequence[RunRecords], b: Sequence[RunRecords], *, metric: str = "auto", seed: int = 0
) -> tuple[str, Any, list[int]]:
    """Paired comparison of two configurations pooled over their seeds (e.g. two methods of one sweep):
    each side is one configuration (``config_key``) run with several seeds; seeds are paired by value
    and problems by item id, giving ``problems × seeds`` matrices for ``stats.paired``. Returns (metric,
    ``stats.Paired``, the paired seeds). ``ValueError`` names what does not pair."""
    from srd_worker.reports.stats import paired

    for side, group in (("A", a), ("B", b)):
        if not group:
            raise ValueError(f"{side} has no runs")
        keys = {config_key(r.spec) for r in group}
        if len(keys) > 1:
            raise ValueError(
                f"{side} holds {len(keys)} configurations, not one over seeds: select one "
                "(e.g. SWEEP:METHOD:n=4) so that its runs differ only in seed"
            )
        group_seeds = [r.spec.get("seed") for r in group]
        if len(set(group_seeds)) != len(group_seeds):
            raise ValueError(f"{side} has two runs with the same seed")
    by_seed_a = {int(r.spec.get("seed", 0)): r for r in a}
    by_seed_b = {int(r.spec.get("seed", 0)): r for r in b}
    seeds = sorted(by_seed_a.keys() & by_seed_b.keys())
    if not seeds:
        raise ValueError(f"A and B share no seed (A: {sorted(by_seed_a)}, B: {sorted(by_seed_b)})")
    recs_a = [{str(r.get("item_id")): r for r in by_seed_a[s].records} for s in seeds]
    recs_b = [{str(r.get("item_id")): r for r in by_seed_b[s].records} for s in seeds]
    items = [i for i in recs_a[0] if all(i in m for m in recs_a + recs_b)]
    if not items:
        raise ValueError("A and B share no item: a paired comparison needs the same problems")
    if metric == "auto":
        graded = all(
            any(correct_value(m[i]) is not None for m in side for i in items) for side in (recs_a, recs_b)
        )
        metric = "accuracy" if graded else "reward"
    if metric not in ("accuracy", "reward"):
        raise ValueError(f"unknown metric {metric!r} (accuracy, reward or auto)")
    value = correct_value if metric == "accuracy" else reward_value
    ma = [[value(m[i]) for m in recs_a] for i in items]
    mb = [[value(m[i]) for m in recs_b] for i in items]
    return metric, paired(ma, mb, seed=seed), seeds


def pooled_points(pooled: Sequence[PooledRun]) -> list[Point]:
    """Frontier points of pooled runs, with their 95% intervals (as ``frontier_points``)."""
    points = []
    for g in pooled:
        if g.tokens.mean is None:
            continue
        metric, y = ("accuracy", g.accuracy) if g.accuracy.mean is not None else ("reward", g.reward)
        if y.mean is None:
            continue
        points.append(
            Point(
                g.dataset,
                metric,
                g.method,
                g.budget,
                g.label,
                g.tokens.mean,
                y.mean,
                x_ci=(g.tokens.low, g.tokens.high),
                y_ci=(y.low, y.high),
                seeds=g.seeds,
                problems=y.problems,
            )
        )
    return points


@dataclass
class ComponentStats:
    """Means per problem for one component."""

    time_s: float | None
    calls: float
    in_tokens: float
    out_tokens: float


@dataclass
class ComponentRow:
    """One run in the Table 2 layout (means per problem over the problems that have a ledger)."""

    run_id: str
    method: str
    budget: int | None
    problems: int
    accuracy: float | None
    time_s: float | None
    in_tokens: float
    out_tokens: float
    components: dict[str, ComponentStats] = field(default_factory=dict)
    #: reward calls (responses the reward scored) and score-cache hits (scores read instead), per problem
    rm_calls: float = 0.0
    rm_cache_hits: float = 0.0
    #: hits summed over the run's problems
    rm_cache_hits_total: int = 0
    #: response tokens the reward scored, and those of the cache hits (the scoring the cache saved)
    rm_tokens: float = 0.0
    rm_cache_hit_tokens: float = 0.0


def component_row(run: RunRecords, summary: RunSummary | None = None) -> ComponentRow | None:
    """Table 2 numbers of one run; None when no record has a compute ledger."""
    summary = summary or summarise(run)
    with_ledger = [r for r in run.records if _ledger(r) is not None]
    if not with_ledger:
        return None
    timed = [r["timing"] for r in with_ledger if isinstance(r.get("timing"), dict)]
    n = len(with_ledger)
    ledgers = [ledger for r in with_ledger if (ledger := _ledger(r)) is not None]

    def comp(ledger: dict[str, Any], name: str) -> dict[str, Any]:
        return (ledger.get("components") or {}).get(name) or {}

    def total(key: str) -> Any:
        """``key`` of the ledger summed over the run's problems (0 where a ledger lacks it)."""
        return sum(ledger.get(key, 0) for ledger in ledgers)

    components = {}
    for name in COMPONENTS:
        components[name] = ComponentStats(
            time_s=_mean([float(t.get(name, 0.0)) for t in timed]),
            calls=sum(comp(ledger, name).get("calls", 0) for ledger in ledgers) / n,
            in_tokens=sum(comp(ledger, name).get("in_tokens", 0) for ledger in ledgers) / n,
            out_tokens=sum(comp(ledger, name).get("out_tokens", 0) for ledger in ledgers) / n,
        )
    hits = total("rm_cache_hits")
    return ComponentRow(
        run_id=run.run_id,
        method=run.method,
        budget=run.budget,
        problems=n,
        accuracy=summary.accuracy,
        time_s=_mean([float(sum(t.values())) for t in timed]),
        in_tokens=total("prefill_tokens") / n,
        out_tokens=total("gen_tokens") / n,
        components=components,
        rm_calls=total("rm_calls") / n,
        rm_cache_hits=hits / n,
        rm_cache_hits_total=hits,
        rm_tokens=total("rm_tokens") / n,
        rm_cache_hit_tokens=total("rm_cache_hit_tokens") / n,
    )


@dataclass
class RoutingRow:
    """One run in the Table 6 layout: routing statistics pooled over all routing events."""

    run_id: str
    method: str
    budget: int | None
    items: int
    events: int
    keep: int
    refine: int
    discard: int
    p_h: float | None
    p_m: float | None
    p_l: float | None
    refinements: int
    refine_kept: int
    rho: float | None
    gain: float | None


def routing_row(run: RunRecords) -> RoutingRow | None:
    """Pooled routing statistics (ALGORITHMS.md §1.10); None when no record carries any."""
    from srd_worker.methods.routing import efficiency_gain

    routed = [
        r["extra"]
        for r in run.records
        if isinstance(r.get("extra"), dict) and isinstance(r["extra"].get("routing"), dict)
    ]
    if not routed:
        return None
    keep = sum(int(e["routing"].get("keep", 0)) for e in routed)
    refine = sum(int(e["routing"].get("refine", 0)) for e in routed)
    discard = sum(int(e["routing"].get("discard", 0)) for e in routed)
    events = keep + refine + discard
    refinements = sum(int(e.get("refinements") or 0) for e in routed)
    kept = sum(int(e.get("refine_kept") or 0) for e in routed)
    p_h, p_m, p_l = ((x / events) if events else None for x in (keep, refine, discard))
    rho = kept / refinements if refinements else None
    return RoutingRow(
        run_id=run.run_id,
        method=run.method,
        budget=run.budget,
        items=len(routed),
        events=events,
        keep=keep,
        refine=refine,
        discard=discard,
        p_h=p_h,
        p_m=p_m,
        p_l=p_l,
        refinements=refinements,
        refine_kept=kept,
        rho=rho,
        gain=efficiency_gain(p_h, p_m, rho),
    )


@dataclass
class Point:
    """One run on the accuracy (or reward) vs generated tokens plane."""

    dataset: str  # dataset_key of the run(s)
    metric: str  # accuracy | reward
    method: str
    budget: int | None
    run_id: str
    x: float
    y: float
    x_ci: tuple[float | None, float | None] = (None, None)  # 95% interval of x
    y_ci: tuple[float | None, float | None] = (None, None)
    seeds: int = 1
    problems: int = 0

    @property
    def label(self) -> str:
        return f"N={self.budget}" if self.budget is not None else self.run_id


def frontier_points(summaries: Sequence[RunSummary]) -> list[Point]:
    """Accuracy when the run has graded items, else the mean reward (tasks without gold answers);
    runs with neither, or without generated tokens, are left out."""
    points = []
    for s in summaries:
        if s.mean_gen_tokens is None:
            continue
        if s.accuracy is not None:
            points.append(
                Point(s.dataset, "accuracy", s.method, s.budget, s.run_id, s.mean_gen_tokens, s.accuracy)
            )
        elif s.mean_reward is not None:
            points.append(
                Point(s.dataset, "reward", s.method, s.budget, s.run_id, s.mean_gen_tokens, s.mean_reward)
            )
    return points


def kcurve_ks(n: int) -> list[int]:
    """The k of a k-curve table: powers of two up to n, and n."""
    ks = [1 << i for i in range(n.bit_length()) if 1 << i <= n]
    return ks + ([n] if ks[-1] != n else [])
