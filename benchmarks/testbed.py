"""Decoding methods on the CPU testbed (srd_worker/testbed): accuracy and mean generated tokens per problem,
with 95% intervals, for sampling, Best-of-N, self-consistency, rejection sampling, Speculative Rejection and
SRD at several budgets N, with the arithmetic reward and with the testbed's learned reward model; SRD's
routing statistics and the paper's gain formula beside the measured token ratio; the coupled SRD vs
rejection-sampling comparison; paired SRD vs Best-of-N tests.

    .venv/bin/python benchmarks/testbed.py [--items 300] [--seeds 0,1,2] [--budgets 2,4,8]
        [--rewards arithmetic,hf-orm:testbed-rm] [--rm-items N] [--max-new-tokens 96] [--chunk-tokens 16]

Every reward runs one sweep (``srd_worker.testbed.experiment.run_grid``: the ``srdq run --sweep`` runner)
into --work: ``best_of_n`` at the largest N (sampling, Best-of-k and self-consistency = majority@k for every
k ≤ N come from its seeded candidates, ``kcurves``), and ``rejection_sampling`` (rank variant, θ = 0.5 =
SRD's θ_high), ``speculative_rejection`` and ``srd`` at every N. ``--rm-items`` runs the learned-RM grid on
the first N problems only (cost). Intervals: bootstrap over problems, each with its seeds
(``stats.bootstrap_ci``); paired differences: ``reports.paired_seed_groups`` (McNemar for accuracy).
Run ids are deterministic: an interrupted benchmark resumes. The engine runs with ``batch_invariant`` off
(one padded batch per round), as ``make demo``. Writes docs/testbed_<arithmetic|rm>.png and the
``testbed-arithmetic`` / ``testbed-rm`` sections of docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._doc import replace_section  # noqa: E402

if TYPE_CHECKING:
    from srd_worker.reports.rows import RunRecords
    from srd_worker.reports.stats import Interval
    from srd_worker.settings import Settings


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def sweep_for(
    reward: str, items: int, seeds: list[int], budgets: list[int], max_new: int, chunk: int
) -> dict:
    adaptive = {"max_new_tokens": max_new, "chunk_tokens": chunk}
    return testbed_sweep(
        reward,
        items,
        seeds,
        [
            {"method": "best_of_n", "n": max(budgets), "params": {"max_new_tokens": max_new}},
            {"method": "rejection_sampling", "n": budgets, "params": adaptive},
            {"method": "speculative_rejection", "n": budgets, "params": adaptive},
            {"method": "srd", "n": budgets, "params": adaptive},
        ],
    )


def testbed_sweep(reward: str, items: int, seeds: list[int], methods: list[dict]) -> dict:
    """A sweep (the ``srdq run --sweep`` format) of ``methods`` on the testbed's first ``items`` problems."""
    return {
        "dataset": "testbed",
        "model": "testbed",
        "reward": reward,
        "limit": items,
        "seeds": seeds,
        "methods": methods,
    }


def collect(
    sweep: dict, folders: list[Path], *, settings: Settings | None = None, missing_ok: bool = False
) -> list:
    """The grid's finished runs, found by run id in any srdq.db under ``folders`` (runs made by several
    processes); a grid point without a finished run is an error naming it (``missing_ok``: left out, and
    named on stderr). ``settings``: the ones the grid ran with (default: ``run_grid``'s), since run ids name
    the engine settings that change results."""
    from srd_worker.reports.loading import load_report_runs
    from srd_worker.store.db import open_sqlite
    from srd_worker.sweep import parse_sweep, prepare_sweep
    from srd_worker.testbed.experiment import grid_settings

    _, prepared = prepare_sweep(parse_sweep(sweep), settings=grid_settings(settings))
    wanted = [p.spec.run_id() for p in prepared]
    found: dict[str, object] = {}
    for folder in folders:
        for path in sorted(folder.rglob("srdq.db")):
            db = open_sqlite(path)  # a store of an older srdq is brought to this schema
            try:
                import sqlite3

                with sqlite3.connect(path) as con:
                    done = {r[0] for r in con.execute("select id from run where status = 'done'")}
                ids = [i for i in wanted if i in done and i not in found]
                for run in load_report_runs(db, ids):
                    found[run.run_id] = run
            finally:
                db.dispose()
    missing = [i for i in wanted if i not in found]
    if missing and not missing_ok:
        raise SystemExit(f"runs not finished in {folders}: {missing}")
    if missing:
        points = [
            f"{p.spec.method} seed {p.spec.seed} ({p.spec.run_id()})"
            for p in prepared
            if p.spec.run_id() in missing
        ]
        print(f"left out, not finished: {', '.join(points)}", file=sys.stderr)
    return [found[i] for i in wanted if i in found]


def _pooled(runs: list) -> RunRecords:
    """One RunRecords holding every seed's records (routing statistics pool over events)."""
    return replace(runs[0], records=[r for run in runs for r in run.records])


def _pts(d: Interval) -> str:
    """A difference of accuracies (fractions) as points with its interval (n/a where there is none)."""
    return _percent(d, signed=True)


def _pct(ci: Interval) -> str:
    """An accuracy (a fraction) in percent with its interval: ``28.0 [22.8, 33.5]``."""
    return _percent(ci, signed=False)


def _percent(d: Interval, *, signed: bool) -> str:
    if d.mean is None:
        return "n/a"
    spec, unit = ("+.1f", " pts") if signed else (".1f", "")
    if d.low is None or d.high is None:
        return f"{100 * d.mean:{spec}}{unit}"
    return f"{100 * d.mean:{spec}}{unit} [{100 * d.low:{spec}}, {100 * d.high:{spec}}]"


def _f(v: float | None, digits: int = 3) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def coupled_cells(srd: list, rs: list) -> dict[str, str]:
    """Coupled SRD vs rejection sampling (runs of one configuration over seeds), as table cells: ``compare()``
    per seed (the coupling needs the same seed), pooled; Δ_n's interval over problems and seeds from the
    per-(problem, seed) differences of R_max (bootstrap over problems). Only the seeds both methods have are
    paired (``--partial`` analyses a grid whose rejection sampling lacks a seed SRD has); none: ValueError."""
    from srd_worker.reports.coupled import compare
    from srd_worker.reports.stats import bootstrap_ci

    rs_by_seed = {r.spec.get("seed"): r for r in rs}
    pairs = [
        (s_run, rs_by_seed[s_run.spec.get("seed")]) for s_run in srd if s_run.spec.get("seed") in rs_by_seed
    ]
    if not pairs:
        raise ValueError(
            f"SRD (seeds {sorted(r.spec.get('seed') for r in srd)}) and rejection sampling (seeds "
            f"{sorted(rs_by_seed)}) share no seed: the coupling needs the same seed"
        )
    cs = []
    diff: dict[str, list[float | None]] = {}
    for k, (s_run, r_run) in enumerate(pairs):
        cs.append(compare(s_run.records, r_run.records))
        rs_by = {x["item_id"]: (x.get("extra") or {}).get("R_max") for x in r_run.records}
        for x in s_run.records:
            a, b = (x.get("extra") or {}).get("R_max"), rs_by.get(x["item_id"])
            diff.setdefault(x["item_id"], [None] * len(pairs))[k] = (
                None if a is None or b is None else float(a) - float(b)
            )
    ci = bootstrap_ci(list(diff.values()), difference=True)

    def wmean(
        attr: str, weight: str = "items"
    ) -> float | None:  # over the seeds, weighted per item or per refinement
        vals = [(getattr(c, attr), getattr(c, weight)) for c in cs if getattr(c, attr) is not None]
        total = sum(w for _, w in vals)
        return sum(v * w for v, w in vals) / total if total else None

    return {
        "items": str(sum(c.items for c in cs)),
        "rmax_srd": _f(wmean("mean_rmax_srd")),
        "rmax_rs": _f(wmean("mean_rmax_rs")),
        "delta": f"{_f(ci.mean)} [{_f(ci.low)}, {_f(ci.high)}]",
        "wtl": f"{sum(c.wins for c in cs)} / {sum(c.ties for c in cs)} / {sum(c.losses for c in cs)}",
        "improved": _f(wmean("refinements_improved", "refinements")),
        "before_after": f"{_f(wmean('reward_before_refine', 'refinements'))} → "
        f"{_f(wmean('reward_after_refine', 'refinements'))}",
    }


def compute_matched(rows: list, tokens: float | None) -> Any:
    """The k-curve row of the largest Best-of-k that generated no more tokens per problem than ``tokens``
    (k = 1 is the k-curve's ``sampling`` row); None when every one costs more or ``tokens`` is unknown."""
    cheaper = [
        r
        for r in rows
        if r.method in ("best_of_n", "sampling")
        and tokens
        and r.tokens.mean is not None
        and r.tokens.mean <= tokens
    ]
    return max(cheaper, key=lambda r: r.n) if cheaper else None


def discordant(p: Any) -> str:
    """The wins / ties / losses cell of a ``paired_values`` comparison: counts when both sides are 0/1;
    when B is a k-curve's expectation over k-subsets (Best-of-k from a larger pool: 0.97 is not a loss),
    the expected discordant counts Σ a·(1 − b) / Σ (1 − a)·b instead (``Paired.only_a`` / ``only_b``)."""
    if p.mcnemar_p is not None:
        return f"{p.wins} / {p.ties} / {p.losses}"
    if not p.pairs:
        return "n/a"
    return f"{p.only_a:.1f} only A / {p.only_b:.1f} only B (expected)"


def refined_answers(runs: list) -> str:
    """How often SRD's answer (the candidate ``extra.chosen`` names) is a trajectory whose suffix was
    regenerated, and how many of those answers are right: ``k of n (r right)`` over problem-seeds. A
    refinement that raises the reward but never becomes the answer cannot change accuracy."""
    chosen = right = total = 0
    for run in runs:
        for rec in run.records:
            pick = (rec.get("extra") or {}).get("chosen")
            if pick is None:
                continue
            total += 1
            cand = next((c for c in rec.get("candidates") or [] if c.get("id") == pick), None)
            if cand is not None and cand.get("refined"):
                chosen += 1
                right += bool(rec.get("correct"))
    return f"{chosen} of {total} ({right} right)"


def _paired_vs(srd: list, other: list | None) -> str:
    """SRD's accuracy minus another adaptive method's at the same N, paired by problem then seed (the
    methods' runs share problems and seeds); ``n/a`` where the grid left that method out."""
    if not other:
        return "n/a (not run)"
    from srd_worker.reports.rows import paired_seed_groups

    _, p, _ = paired_seed_groups(srd, other, metric="accuracy")
    return _pts(p.diff)


def token_ratio(srd: list, other: list | None) -> float | None:
    """Mean generated tokens per problem of ``other`` over SRD's, each side over the seeds both have (a
    ``--partial`` grid may hold a seed of SRD that the other method has not run yet: pooling it would
    compare different drafts); None where the other method was not run or a side has no tokens."""
    from srd_worker.reports.rows import tokens_value

    if not other:
        return None
    common = {r.spec.get("seed") for r in srd} & {r.spec.get("seed") for r in other}

    def mean(runs: list) -> float | None:
        vals = [
            v for run in runs if run.spec.get("seed") in common for x in run.records
            if (v := tokens_value(x)) is not None
        ]  # fmt: skip
        return sum(vals) / len(vals) if vals else None

    a, b = mean(srd), mean(other)
    return b / a if a and b is not None else None


def analyse(
    reward: str,
    runs: list,
    budgets: list[int],
    png: Path | None,
    *,
    title: str | None = None,
    pool_n: int | None = None,
    weighted: bool = False,
) -> dict:
    """The grid's tables at every N of ``budgets``; Best-of-N's k-curves come from its run at ``pool_n``
    (default the largest budget), which may be larger than every budget (a Best-of-8 pool beside SRD at N = 4).
    ``weighted`` adds weighted Best-of-N rows (``kcurve_rows``)."""
    from srd_worker.reports.rows import Point, routing_row
    from srd_worker.testbed.experiment import (
        correctness,
        kcurve_rows,
        markdown,
        paired_values,
        run_rows,
    )

    by: dict[tuple[str, int], list[Any]] = {}
    for r in runs:
        by.setdefault((r.method, r.budget), []).append(r)
    pool = pool_n or max(budgets)
    bon = by[("best_of_n", pool)]
    # a pool larger than the budgets also gives Best-of-k at the powers of two below it, so the adaptive
    # methods' token counts fall between selectors' points on the frontier
    ks = {1, *budgets, pool} | (
        {2**i for i in range(1, pool.bit_length()) if 2**i < pool} if pool_n else set()
    )
    rows = kcurve_rows(bon, sorted(ks), oracle=True, weighted=weighted) + run_rows(
        [r for r in runs if r.method != "best_of_n"]
    )
    rows.sort(key=lambda r: (["sampling", "best_of_n", "self_consistency", "weighted_best_of_n", "rejection_sampling",
                              "speculative_rejection", "srd", "beam_search", "dvts", "pass@k"].index(r.method), r.n))  # fmt: skip
    if png is not None:
        from srd_worker.reports.plots import plot_frontier

        points = [
            Point("testbed", "accuracy", r.method, r.n, r.source, r.tokens.mean, r.accuracy.mean,
                  x_ci=(r.tokens.low, r.tokens.high), y_ci=(r.accuracy.low, r.accuracy.high),
                  seeds=r.accuracy.seeds, problems=r.accuracy.problems)
            for r in rows if r.tokens.mean is not None and r.accuracy.mean is not None
        ]  # fmt: skip
        seeds = rows[0].accuracy.seeds
        # a method measured on fewer seeds than the rest (a partial grid) says so in the subtitle
        fewer = sorted({f"{r.method}: {r.accuracy.seeds} seed{'' if r.accuracy.seeds == 1 else 's'}"
                        for r in rows if r.accuracy.seeds != seeds})  # fmt: skip
        plot_frontier(
            points,
            png,
            title=title or f"testbed: accuracy vs generated tokens, reward {reward}",
            subtitle=f"{rows[0].accuracy.problems} problems × {seeds} seed{'' if seeds == 1 else 's'}"
            + (f" ({', '.join(fewer)})" if fewer else "")
            + "; 95% intervals",
        )
    tok = {(r.method, r.n): r for r in rows}
    routing = ["| N | events | p̂_H | p̂_M | p̂_L | refinements | ρ̂ | formula 1 + ρ̂·p̂_M/p̂_H "
               "| measured tokens RS / SRD | measured accuracy SRD − RS | answers from a refinement (right) |",
               "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    coupled = ["| N | items × seeds | mean R_max SRD | mean R_max RS | Δ_n [95% CI] | wins / ties / losses "
               "| refinements improved | reward before → after a refinement |",
               "|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    paired = ["| N | SRD − Best-of-N accuracy [95% CI] | wins / ties / losses (or expected discordant) | McNemar p "
              "| SRD tokens / Best-of-N tokens | self-consistency − Best-of-N [95% CI] "
              "| SRD − Best-of-k at ≤ SRD's tokens [95% CI] | SRD − Speculative Rejection [95% CI] |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    if weighted:
        paired[0] += " weighted Best-of-N − Best-of-N [95% CI] | SRD − weighted Best-of-N [95% CI] |"
        paired[1] += "---:|---:|"
    for n in budgets:
        srd, rs = by[("srd", n)], by.get(("rejection_sampling", n))  # a grid may leave RS out
        row = routing_row(_pooled(srd))
        t_srd = tok[("srd", n)].tokens.mean
        vs_rs, vs_sr = _paired_vs(srd, rs), _paired_vs(srd, by.get(("speculative_rejection", n)))
        if row is not None:
            routing.append(
                f"| {n} | {row.events} | {_f(row.p_h)} | {_f(row.p_m)} | {_f(row.p_l)} | {row.refinements} "
                f"| {_f(row.rho)} | {_f(row.gain)} | {_f(token_ratio(srd, rs))} | {vs_rs} "
                f"| {refined_answers(srd)} |"
            )
        if rs:
            c = coupled_cells(srd, rs)
            coupled.append(
                f"| {n} | {c['items']} | {c['rmax_srd']} | {c['rmax_rs']} | {c['delta']} | {c['wtl']} "
                f"| {c['improved']} | {c['before_after']} |"
            )
        bo = tok[("best_of_n", n)]
        ratio = t_srd / bo.tokens.mean if t_srd and bo.tokens.mean else None
        srd_correct = correctness(srd)
        p_bon = paired_values(srd_correct, bo.values or {})
        # a --partial grid's SRD may lack a seed Best-of-N has: paired on the seeds both have, and said so
        paired_on = f" ({p_bon.problems} × {p_bon.seeds} paired)" if p_bon.seeds != bo.accuracy.seeds else ""
        d = p_bon.diff
        # self-consistency and Best-of-N at the same k come from the same candidates: a paired difference
        sc = paired_values(tok[("self_consistency", n)].values or {}, bo.values or {}).diff
        matched = "n/a (every Best-of-k costs more)"
        k_row = compute_matched(rows, t_srd)
        if k_row is not None:
            p_k = paired_values(srd_correct, k_row.values or {})
            matched = f"k = {k_row.n}: {_pts(p_k.diff)} ({discordant(p_k)})"
        weighted_cells = ""
        if weighted:  # weighted Best-of-N (absent when a reward is negative): against Best-of-N and SRD
            w = tok.get(("weighted_best_of_n", n))
            wb = _pts(paired_values(w.values or {}, bo.values or {}).diff) if w else "n/a"
            sw = _pts(paired_values(srd_correct, w.values or {}).diff) if w else "n/a"
            weighted_cells = f" {wb} | {sw} |"
        paired.append(
            f"| {n} | {_pts(d)}{paired_on} | {discordant(p_bon)} | {_f(p_bon.mcnemar_p, 3)} "
            f"| {_f(ratio, 2)} | {_pts(sc)} | {matched} | {vs_sr} |{weighted_cells}"
        )
    return {
        "rows": [r.to_dict() for r in rows],
        "table": markdown(rows),
        "routing": "\n".join(routing),
        "coupled": "\n".join(coupled),
        "paired": "\n".join(paired),
        "revote": revote_table(by, tok, budgets) if weighted else None,
    }


def revote_table(
    by: dict[tuple[str, int], list[Any]], tok: dict[tuple[str, int], Any], budgets: list[int]
) -> str:
    """SRD, rejection sampling and Speculative Rejection re-answered by the weighted vote over their answer
    pools (the kept candidates; Speculative Rejection's archive of finished survivors): what
    ``answer=weighted_majority`` answers from the same draws, since routing does not depend on the answer
    rule; against their own argmax and against weighted Best-of-N at the same N."""
    from srd_worker.reports.kcurves import record_pool
    from srd_worker.reports.stats import bootstrap_ci
    from srd_worker.testbed.experiment import answers_from_archive, correctness, paired_values, revoted

    lines = [
        "| N | method | argmax (the runs) % [95% CI] | weighted vote over its answer pool % [95% CI] "
        "| vote − argmax [95% CI] | wins / ties / losses | vote − weighted Best-of-N [95% CI] "
        "| answer pool per problem (distinct answers) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for n in budgets:
        w = tok.get(("weighted_best_of_n", n))
        for method in ("srd", "rejection_sampling", "speculative_rejection"):
            runs = by.get((method, n))
            if not runs:
                continue
            own, voted = correctness(runs), revoted(runs)
            cells = [[v for _, v in sorted(seeds.items())] for seeds in voted.values()]
            acc = bootstrap_ci(cells)
            gain = paired_values(voted, own)
            vs_w = _pts(paired_values(voted, w.values or {}).diff) if w else "n/a"
            argmax = tok[(method, n)].accuracy
            kept = [
                [c.get("vote") for c in record_pool(x, archive_all=answers_from_archive(r.spec))]
                for r in runs
                for x in r.records
                if not x.get("error")
            ]
            size = sum(len(k) for k in kept) / len(kept) if kept else None
            distinct = sum(len(set(k) - {None}) for k in kept) / len(kept) if kept else None
            lines.append(
                f"| {n} | {method} | {_pct(argmax)} | {_pct(acc)} | {_pts(gain.diff)} "
                f"| {gain.wins} / {gain.ties} / {gain.losses} | {vs_w} | {_f(size, 2)} ({_f(distinct, 2)}) |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=300)
    ap.add_argument(
        "--rm-items", type=int, default=None, help="problems for the learned-RM grid (default --items)"
    )
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--budgets", default="2,4,8")
    ap.add_argument("--rewards", default="arithmetic,hf-orm:testbed-rm")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--chunk-tokens", type=int, default=16)
    ap.add_argument("--work", default="/tmp/srdq-testbed-bench")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument(
        "--methods",
        default=None,
        help="run only these methods of the grid (comma-separated; e.g. to run srd in a second process "
        "into another --work folder), and analyse nothing",
    )
    ap.add_argument(
        "--analyse-only",
        nargs="*",
        default=None,
        metavar="FOLDER",
        help="run nothing: collect the grid's finished runs from the srdq.db files under these folders "
        "(default --work) and write the tables",
    )
    args = ap.parse_args()

    import matplotlib

    matplotlib.use("Agg")

    from srd_worker.settings import Settings
    from srd_worker.testbed.experiment import run_grid

    seeds, budgets = _ints(args.seeds), _ints(args.budgets)
    settings = Settings(device="cpu", batch_invariant=False)
    manifest = json.loads((ROOT / "srd_worker/testbed/artifacts/manifest.json").read_text())
    for reward in [x for x in args.rewards.split(",") if x]:
        items = args.rm_items if (args.rm_items and reward != "arithmetic") else args.items
        sweep = sweep_for(reward, items, seeds, budgets, args.max_new_tokens, args.chunk_tokens)
        if args.methods:
            keep = args.methods.split(",")
            sweep["methods"] = [m for m in sweep["methods"] if m["method"] in keep]
            run_grid(sweep, Path(args.work) / reward.replace(":", "_"), settings=settings)
            continue
        t0 = time.perf_counter()
        if args.analyse_only is not None:
            runs = collect(sweep, [Path(f) for f in (args.analyse_only or [args.work])], settings=settings)
        else:
            runs = run_grid(sweep, Path(args.work) / reward.replace(":", "_"), settings=settings)
        wall = time.perf_counter() - t0
        slug = "arithmetic" if reward == "arithmetic" else "rm"
        png = None if args.no_write else ROOT / "docs" / f"testbed_{slug}.png"
        out = analyse(reward, runs, budgets, png)
        setting = (
            f"**Reward `{reward}`**: the first {items} problems of the testbed's test split × seeds "
            f"{', '.join(map(str, seeds))}; policy `testbed` ({manifest['parameters']['policy']:,} parameters), "
            f"max_new_tokens {args.max_new_tokens}, Δ = chunk_tokens {args.chunk_tokens} for the adaptive "
            f"methods, T 0.8 / top-p 0.9 / top-k 50, method defaults otherwise (SRD θ_high 0.5, θ_low 0.3; "
            f"rejection sampling rank variant θ 0.5; Speculative Rejection α 0.5); the engine with "
            f"batch_invariant off. "
            + (
                f"Wall time of this grid (incl. runs reused from an earlier invocation): {wall / 60:.0f} min."
                if args.analyse_only is None
                else "Runs collected from their stores (`--analyse-only`)."
            )
        )
        body = [setting, ""]
        if png is not None:
            body += [f"![testbed, {reward}]({png.name})", ""]
        body += [
            out["table"],
            "",
            "SRD's routing statistics (pooled over routing events and seeds; paper Table 6 layout), the "
            "paper's gain formula (Thm 3.3: drafts rejection sampling needs per SRD draft for the same kept "
            "set) beside what was measured against rejection sampling at the same N:",
            "",
            out["routing"],
            "",
            "Coupled SRD vs rejection sampling from identical seeded drafts (paper Table 7 layout; pooled "
            "over seeds):",
            "",
            out["coupled"],
            "",
            "SRD against Best-of-N at the same N, paired by problem and seed (Best-of-N's correctness per problem "
            "is the expectation over its k-subsets, so McNemar applies only where it is 0/1: at the largest N), "
            "and self-consistency against Best-of-N (the same candidates, voted or ranked by the reward):",
            "",
            out["paired"],
            "",
        ]
        command = (
            f"Command: `.venv/bin/python benchmarks/testbed.py --rewards {reward} --items {items} "
            f"--seeds {args.seeds} --budgets {args.budgets} --max-new-tokens {args.max_new_tokens} "
            f"--chunk-tokens {args.chunk_tokens}`"
        )
        body.append(command)
        text = "\n".join(body)
        print(text, flush=True)
        Path(args.work).mkdir(parents=True, exist_ok=True)
        (Path(args.work) / f"results-{slug}.json").write_text(
            json.dumps(out, indent=1) + "\n", encoding="utf-8"
        )
        if not args.no_write:
            replace_section(ROOT / "docs" / "PERFORMANCE.md", f"testbed-{slug}", text)


if __name__ == "__main__":
    main()
