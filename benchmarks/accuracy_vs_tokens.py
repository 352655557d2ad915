"""Accuracy (with 95% intervals) vs mean generated tokens for sampling, Best-of-N, Speculative Rejection,
SRD and rejection sampling at several budgets on the same problems; plus SRD's routing statistics (paper
Table 6 layout) and the coupled SRD vs rejection-sampling comparison from identical seeded drafts (paper
Table 7 layout). By default on the CPU testbed (its trained policy and outcome RM, where the methods'
accuracies differ from 0); ``--model smollm2 --dataset gsm8k --reward arithmetic`` gives the real-text
variant (SmolLM2-135M solves none of the first problems within a short budget).

    .venv/bin/python benchmarks/accuracy_vs_tokens.py [--items 200] [--max-new-tokens 64] [--seed 0]

Runs go through the embedded runner into --work (default /tmp/srdq-bench); run ids are deterministic,
so an interrupted benchmark resumes and finished configurations are not generated again. Writes
docs/accuracy_vs_tokens.png and three sections of docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._doc import replace_section  # noqa: E402


def configs(max_new: int, chunk: int) -> list[tuple[str, str, dict]]:
    base = {"max_new_tokens": max_new, "chunk_tokens": chunk}
    out = [("sampling", "sampling", dict(base))]
    out += [(f"best_of_n n={n}", "best_of_n", {**base, "n": n}) for n in (2, 4, 8)]
    out += [(f"speculative_rejection n={n}", "speculative_rejection", {**base, "n": n}) for n in (4, 8)]
    out += [(f"srd n={n}", "srd", {**base, "n": n}) for n in (4, 8)]
    out += [(f"rejection_sampling n={n}", "rejection_sampling", {**base, "n": n}) for n in (4, 8)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="testbed", help="any --model srdq run takes (testbed, smollm2, ...)")
    ap.add_argument("--dataset", default="testbed", help="a built-in dataset name (srdq datasets) or a file")
    ap.add_argument("--reward", default="hf-orm:testbed-rm", help="any --reward srdq run takes")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--items", type=int, default=200)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--chunk-tokens", type=int, default=16, help="drafting / decision interval Δ")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default="/tmp/srdq-bench")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    from srd_worker.engines.registry import build_engine
    from srd_worker.local import run_local
    from srd_worker.reports.coupled import compare
    from srd_worker.reports.plots import plot_frontier
    from srd_worker.reports.rows import Point, correct_value, tokens_value
    from srd_worker.reports.stats import bootstrap_ci
    from srd_worker.reports.tables import pct_ci
    from srd_worker.settings import Settings
    from srd_worker.spec import prepare_run

    settings = Settings(device="cpu", dtype=args.dtype)
    engine = build_engine("transformers", args.model, settings)
    rows = []
    records: dict[str, list[dict]] = {}
    for label, method, params in configs(args.max_new_tokens, args.chunk_tokens):
        prepared = prepare_run(
            dataset=args.dataset,
            method=method,
            params=params,
            model=args.model,
            reward=args.reward,
            seed=args.seed,
            limit=args.items,
            settings=settings,
        )
        summary = run_local(prepared, out_dir=args.work, settings=settings, engine=engine)
        recs = [json.loads(line) for line in Path(summary.results_path).read_text().splitlines()]
        records[label] = recs
        # compute time as the runs measured it (per item, per component), so a re-run that only
        # re-reports finished runs shows the same figure
        timings = Path(summary.results_path).with_name("timings.jsonl").read_text().splitlines()
        compute_s = sum(sum((json.loads(t)["timing"] or {}).values()) for t in timings)
        rewards = [r["reward"] for r in recs if r["reward"] is not None]
        rows.append(
            {
                "label": label,
                "method": method,
                "n": params.get("n", 1),
                "accuracy": bootstrap_ci([correct_value(r) for r in recs]),
                "tokens": bootstrap_ci([tokens_value(r) for r in recs]),
                "correct": summary.correct,
                "items": summary.items,
                "reward": sum(rewards) / len(rewards) if rewards else None,
                "seconds": compute_s,
                "run_id": summary.run_id,
            }
        )
        r = rows[-1]
        print(
            f"{label:28s} acc {pct_ci(r['accuracy'].mean, (r['accuracy'].low, r['accuracy'].high))}  tokens {r['tokens'].mean:7.1f}  "
            f"{compute_s:6.1f}s",
            flush=True,
        )

    # ---- plot: accuracy vs mean generated tokens, one series per method, 95% intervals over problems
    points = [
        Point(args.dataset, "accuracy", r["method"], r["n"], f"n={r['n']}", r["tokens"].mean, r["accuracy"].mean,
              x_ci=(r["tokens"].low, r["tokens"].high), y_ci=(r["accuracy"].low, r["accuracy"].high),
              problems=r["accuracy"].problems)
        for r in rows
    ]  # fmt: skip
    png = ROOT / "docs" / "accuracy_vs_tokens.png"
    if not args.no_write:
        plot_frontier(
            points,
            png,
            title=f"{args.dataset}: accuracy vs generated tokens ({args.model}, reward {args.reward})",
            subtitle=f"{args.items} problems × 1 seed ({args.seed}); 95% bootstrap intervals over problems",
        )

    setting = (
        f"{args.items} problems of `{args.dataset}` (the first {args.items} rows), 1 seed ({args.seed}), "
        f"model `{args.model}` ({args.dtype}, CPU), reward `{args.reward}`, max_new_tokens={args.max_new_tokens}, "
        f"Δ = chunk_tokens = {args.chunk_tokens}, the methods' default sampling and SRD parameters "
        f"(`srdq methods srd`). Intervals: 95% bootstrap over problems (one seed: they do not include the "
        f"seed-to-seed variation; `benchmarks/testbed.py` has the multi-seed figures)."
    )
    table = [
        setting,
        "",
        "![accuracy vs tokens](accuracy_vs_tokens.png)",
        "",
        "| method | n | accuracy [95% CI] | correct/items | mean gen tokens [95% CI] | mean reward of answer | model + reward s |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *[
            f"| {r['method']} | {r['n']} | {pct_ci(r['accuracy'].mean, (r['accuracy'].low, r['accuracy'].high))} | {r['correct']}/{r['items']} | "
            f"{r['tokens'].text(digits=1)} "
            f"| {r['reward'] if r['reward'] is not None else float('nan'):.3f} | {r['seconds']:.0f} |"
            for r in rows
        ],
        "",
        f"Command: `.venv/bin/python benchmarks/accuracy_vs_tokens.py --model {args.model} --dataset {args.dataset} "
        f"--reward {args.reward} --items {args.items} --max-new-tokens {args.max_new_tokens} "
        f"--chunk-tokens {args.chunk_tokens} --seed {args.seed} --dtype {args.dtype}`",
    ]

    # ---- routing statistics, pooled over routing events (Table 6 layout)
    routing = [
        "| run | p̂_H | p̂_M | p̂_L | ρ̂ | gain 1 + ρ̂·p̂_M/p̂_H | refinements |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, recs in records.items():
        if not label.startswith("srd"):
            continue
        tiers = {"keep": 0, "refine": 0, "discard": 0}
        refs = kept = 0
        for r in recs:
            ex = r.get("extra") or {}
            for k in tiers:
                tiers[k] += int((ex.get("routing") or {}).get(k, 0))
            refs += int(ex.get("refinements") or 0)
            kept += int(ex.get("refine_kept") or 0)
        total = sum(tiers.values()) or 1
        ph, pm, pl = (tiers[k] / total for k in ("keep", "refine", "discard"))
        rho = kept / refs if refs else None
        gain = 1 + rho * pm / ph if rho is not None and ph else None

        def fmt(v):
            return "n/a" if v is None else f"{v:.3f}"

        routing.append(f"| {label} | {ph:.3f} | {pm:.3f} | {pl:.3f} | {fmt(rho)} | {fmt(gain)} | {refs} |")

    # ---- coupled comparison (Table 7 layout)
    coupled = [
        "| n | items | mean R_max SRD | mean R_max RS | Δ_n | wins / ties / losses | refinements improved "
        "| reward before → after refine |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in (4, 8):
        c = compare(records[f"srd n={n}"], records[f"rejection_sampling n={n}"])

        def f3(v):
            return "n/a" if v is None else f"{v:.3f}"

        coupled.append(
            f"| {n} | {c.items} | {f3(c.mean_rmax_srd)} | {f3(c.mean_rmax_rs)} | {f3(c.delta_n)} | "
            f"{c.wins} / {c.ties} / {c.losses} | {f3(c.refinements_improved)} | "
            f"{f3(c.reward_before_refine)} → {f3(c.reward_after_refine)} |"
        )

    text = "\n".join(table)
    print(text, "\n", "\n".join(routing), "\n", "\n".join(coupled), sep="\n")
    if not args.no_write:
        perf = ROOT / "docs" / "PERFORMANCE.md"
        replace_section(perf, "accuracy-vs-tokens", text)
        replace_section(perf, "routing-stats", "\n".join(routing))
        replace_section(perf, "coupled", "\n".join(coupled))


if __name__ == "__main__":
    main()
