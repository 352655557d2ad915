"""An adaptive run's anytime curve against separate runs at a smaller N: what "stopping the big run early"
gives compared with "running a smaller pool", at matched generated tokens.

    .venv/bin/python benchmarks/anytime_vs_budget.py [--methods srd,rejection_sampling] [--big 8]
        [--small 2,4] [--items 100] [--seeds 0,1] [--max-new-tokens 96] [--chunk-tokens N]
        [--dataset testbed] [--model testbed] [--engine transformers] [--reward hf-orm:testbed-rm]
        [--work /tmp/srdq-anytime] [--section anytime-vs-budget-testbed] [--no-write]

Per method and seed, one run at N = --big and one run per N in --small, all through ``srdq run``'s code
path (``run_local``, one store under --work, one engine shared by every run; re-running the command
resumes or re-reads the runs already there). The big run's anytime curve (``reports.anytime``: every
problem's current best answer after round r, a finished problem keeping its own) is cut at the round r*
whose mean generated tokens come closest to the small run's, and the two are compared per problem and
seed (where even round 1 of the big run spends more than the small run in all, r* = 1 and the ratio of
tokens says so): accuracy with its bootstrap interval (over problems, each with its seeds), the paired difference
(cut − small run) with its interval, wins / ties / losses and McNemar's p, and the tokens both spent; and the first round at which the curve's accuracy reaches the
small run's, with the tokens spent by then over the small run's.
Writes a section of docs/PERFORMANCE.md and a plot (the curve with the small runs as separate points).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._doc import replace_section  # noqa: E402


def run_one(args: argparse.Namespace, method: str, n: int, seed: int, engine: Any) -> list[dict[str, Any]]:
    """The records of one run (``run_local``: resumed or re-read when the store already holds it)."""
    from srd_worker.local import run_local
    from srd_worker.settings import Settings
    from srd_worker.spec import prepare_run

    params: dict[str, Any] = {"n": n, "max_new_tokens": args.max_new_tokens}
    if args.chunk_tokens:
        params["chunk_tokens"] = args.chunk_tokens
    settings = Settings()
    prepared = prepare_run(
        dataset=args.dataset,
        method=method,
        params=params,
        model=args.model,
        engine=args.engine,
        reward=args.reward,
        seed=seed,
        limit=args.items,
        shard_size=args.shard_size,
        settings=settings,
    )
    t0 = time.perf_counter()
    summary = run_local(prepared, out_dir=args.work, settings=settings, engine=engine)
    print(f"  {method} N={n} seed {seed}: {summary.run_id} in {time.perf_counter() - t0:.0f} s", flush=True)
    lines = Path(summary.results_path).read_text(encoding="utf-8").splitlines()
    return sorted((json.loads(line) for line in lines), key=lambda r: r["position"])


def matrix(per_seed: list[list[Any]]) -> list[list[Any]]:
    """problems × seeds from one list of per-problem values per seed."""
    return [list(row) for row in zip(*per_seed, strict=True)]


def compare(big: list[list[dict]], small: list[list[dict]]) -> dict[str, Any]:
    """The big runs (one per seed) cut at the round whose mean tokens are closest to the small runs'."""
    from srd_worker.reports.anytime import at_round, entries
    from srd_worker.reports.stats import bootstrap_ci, paired

    def ok(r: dict) -> float | None:
        return None if r.get("error") or r.get("correct") is None else float(bool(r["correct"]))

    def tokens(r: dict) -> float | None:
        return None if r.get("error") else float((r.get("ledger") or {}).get("gen_tokens", 0))

    small_acc = matrix([[ok(r) for r in run] for run in small])
    small_tok = matrix([[tokens(r) for r in run] for run in small])
    curves = [[entries(r) for r in run] for run in big]
    last = max(int(e[-1]["round"]) for run in curves for e in run if e)
    target = bootstrap_ci(small_tok).mean or 0.0

    def cut(rnd: int, key: str) -> list[list[Any]]:
        """problems × seeds: each problem's ``key`` (tokens or correct) after round ``rnd``."""
        return matrix([[float(at_round(e, rnd).get(key) or 0) if e else None for e in run] for run in curves])

    means = {rnd: bootstrap_ci(cut(rnd, "tokens")).mean for rnd in range(1, last + 1)}
    scored = [(abs(m - target), rnd) for rnd, m in means.items() if m is not None]
    assert scored, "the big runs have no anytime entries"
    r_star = min(scored)[1]
    cut_acc, cut_tok = cut(r_star, "correct"), cut(r_star, "tokens")
    # the first round whose accuracy reaches the small run's (point estimates), and what it has spent then
    small_mean = bootstrap_ci(small_acc).mean or 0.0
    reach: tuple[int, float] | None = next(
        (
            (rnd, float(means[rnd] or 0.0))
            for rnd in range(1, last + 1)
            if (acc := bootstrap_ci(cut(rnd, "correct")).mean) is not None and acc >= small_mean
        ),
        None,
    )
    full_acc = matrix([[ok(r) for r in run] for run in big])
    full_tok = matrix([[tokens(r) for r in run] for run in big])
    return {
        "round": r_star,
        "rounds": last,
        "small_acc": bootstrap_ci(small_acc),
        "small_tok": bootstrap_ci(small_tok),
        "cut_acc": bootstrap_ci(cut_acc),
        "cut_tok": bootstrap_ci(cut_tok),
        "full_acc": bootstrap_ci(full_acc),
        "full_tok": bootstrap_ci(full_tok),
        "diff": paired(cut_acc, small_acc),
        "reach": reach,
    }


def pct(iv: Any) -> str:
    return (
        "—"
        if iv.mean is None
        else f"{100 * iv.mean:.1f} [{100 * (iv.low or 0):.1f}, {100 * (iv.high or 0):.1f}]"
    )


def tok(iv: Any) -> str:
    return "—" if iv.mean is None else f"{iv.mean:.1f} [{iv.low or 0:.1f}, {iv.high or 0:.1f}]"


def table(rows: list[tuple[str, int, int, dict[str, Any]]]) -> str:
    head = [
        "method",
        "small N",
        "small run: accuracy %",
        "small run: tokens",
        "big N cut at round r* (of rounds)",
        "cut: accuracy %",
        "cut: tokens",
        "cut tokens ÷ small run's",
        "cut − small run, accuracy pts [95% CI]",
        "wins / ties / losses",
        "McNemar p",
        "curve reaches the small run's accuracy at round (tokens ÷ small run's)",
        "big run uncut: accuracy % / tokens",
    ]
    out = ["| " + " | ".join(head) + " |", "|---|---:|" + "---:|" * (len(head) - 2)]
    for method, n_small, n_big, c in rows:
        d = c["diff"]
        out.append(
            "| "
            + " | ".join(
                [
                    method,
                    str(n_small),
                    pct(c["small_acc"]),
                    tok(c["small_tok"]),
                    f"N={n_big}: {c['round']} (of {c['rounds']})",
                    pct(c["cut_acc"]),
                    tok(c["cut_tok"]),
                    f"{(c['cut_tok'].mean or 0) / c['small_tok'].mean:.2f}" if c["small_tok"].mean else "—",
                    f"{100 * d.diff.mean:+.1f} [{100 * (d.diff.low or 0):+.1f}, {100 * (d.diff.high or 0):+.1f}]",
                    f"{d.wins} / {d.ties} / {d.losses}",
                    f"{d.mcnemar_p:.3f}" if d.mcnemar_p is not None else "—",
                    (
                        f"{c['reach'][0]} ({c['reach'][1] / c['small_tok'].mean:.2f})"
                        if c["reach"] and c["small_tok"].mean
                        else "never"
                    ),
                    f"{pct(c['full_acc'])} / {c['full_tok'].mean:.1f}",
                ]
            )
            + " |"
        )
    return "\n".join(out)


def plot(
    path: Path, method: str, big: list[list[dict]], smalls: dict[int, list[list[dict]]], n_big: int
) -> None:
    from srd_worker.reports.anytime import anytime_curve
    from srd_worker.reports.plots import plot_anytime
    from srd_worker.reports.rows import Point
    from srd_worker.reports.stats import bootstrap_ci

    # the curve pools seeds as problems (one entry per problem-seed); the separate runs' points likewise
    curve = anytime_curve([r for run in big for r in run])
    points = []
    for n, runs in sorted(smalls.items()):
        recs = [r for run in runs for r in run if not r.get("error") and r.get("correct") is not None]
        acc = bootstrap_ci([float(bool(r["correct"])) for r in recs])
        tk = bootstrap_ci([float(r["ledger"]["gen_tokens"]) for r in recs])
        points.append(
            Point(
                "",
                "accuracy",
                method,
                n,
                "",
                tk.mean or 0.0,
                acc.mean or 0.0,
                (tk.low, tk.high),
                (acc.low, acc.high),
            )
        )
    plot_anytime(
        curve,
        path,
        title=f"{method}: the N={n_big} run stopped after round r vs runs at smaller N",
        runs=points,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--methods", default="srd,rejection_sampling")
    ap.add_argument("--big", type=int, default=8)
    ap.add_argument("--small", default="2,4")
    ap.add_argument("--items", type=int, default=100)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--chunk-tokens", type=int, default=0, help="Δ (0: each method's default)")
    ap.add_argument("--dataset", default="testbed")
    ap.add_argument("--model", default="testbed")
    ap.add_argument("--engine", default="transformers")
    ap.add_argument("--reward", default="hf-orm:testbed-rm")
    ap.add_argument("--shard-size", type=int, default=None)
    ap.add_argument("--work", type=Path, default=Path("/tmp/srdq-anytime"))
    ap.add_argument("--section", default="anytime-vs-budget-testbed")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    from srd_worker.engines.registry import build_engine
    from srd_worker.settings import Settings

    methods = [m for m in args.methods.split(",") if m]
    smalls = [int(x) for x in args.small.split(",") if x]
    seeds = [int(x) for x in args.seeds.split(",") if x]
    t0 = time.perf_counter()
    engine = build_engine(args.engine, args.model, Settings())
    rows, plots = [], []
    try:
        for method in methods:
            big = [run_one(args, method, args.big, s, engine) for s in seeds]
            small_runs = {n: [run_one(args, method, n, s, engine) for s in seeds] for n in smalls}
            for n in smalls:
                rows.append((method, n, args.big, compare(big, small_runs[n])))
            if not args.no_write:
                png = ROOT / "docs" / f"anytime_vs_budget_{args.dataset}_{method}.png"
                plot(png, method, big, small_runs, args.big)
                plots.append((method, png.name))
    finally:
        close = getattr(engine, "close", None)
        if callable(close):
            close()
    wall = time.perf_counter() - t0
    body = "\n".join(
        [
            f"`benchmarks/anytime_vs_budget.py {' '.join(sys.argv[1:])}` ({platform.machine()}, "
            f"{wall / 60:.0f} min wall in all). Sample: the first {args.items} `{args.dataset}` problems × "
            f"seeds {', '.join(map(str, seeds))}, policy `{args.model}` on `{args.engine}`, reward "
            f"`{args.reward}`, max_new_tokens {args.max_new_tokens}. Intervals: 95% bootstrap over problems "
            "(each with all its seeds); the difference is paired by problem and seed.",
            "",
            table(rows),
            "",
            *[f"![{m}: anytime curve vs smaller N](" + name + ")" for m, name in plots],
        ]
    )
    print(body)
    if not args.no_write:
        replace_section(ROOT / "docs" / "PERFORMANCE.md", args.section, body)


if __name__ == "__main__":
    main()
