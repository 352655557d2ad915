"""Accuracy (and reward of the chosen answer) vs mean generated tokens for sampling, Best-of-N,
Speculative Rejection and SRD at several budgets, on the same GSM8K problems, with SmolLM2-135M-Instruct
and the rule-based arithmetic reward; plus SRD's routing statistics (paper Table 6 layout) and the
coupled SRD vs rejection-sampling comparison from identical seeded drafts (paper Table 7 layout).

    .venv/bin/python benchmarks/accuracy_vs_tokens.py [--items 12] [--max-new-tokens 192] [--seed 0]

Runs go through the embedded runner into --work (default /tmp/srdq-bench); run ids are deterministic,
so an interrupted benchmark resumes and finished configurations are not generated again. Writes
docs/accuracy_vs_tokens.png and three sections of docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
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
    ap.add_argument("--dataset", default="gsm8k", help="a built-in dataset name (srdq datasets) or a file")
    ap.add_argument("--items", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--chunk-tokens", type=int, default=64, help="drafting / decision interval Δ")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default="/tmp/srdq-bench")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from srd_worker.engines.transformers_engine import TransformersEngine
    from srd_worker.local import run_local
    from srd_worker.reports.coupled import compare
    from srd_worker.settings import Settings
    from srd_worker.spec import prepare_run

    settings = Settings(device="cpu")
    engine = TransformersEngine.from_name("smollm2", settings=settings)
    rows = []
    records: dict[str, list[dict]] = {}
    for label, method, params in configs(args.max_new_tokens, args.chunk_tokens):
        prepared = prepare_run(
            dataset=args.dataset,
            method=method,
            params=params,
            model="smollm2",
            reward="arithmetic",
            seed=args.seed,
            limit=args.items,
        )
        summary = run_local(prepared, out_dir=args.work, settings=settings, engine=engine)
        import json

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
                "accuracy": summary.accuracy or 0.0,
                "correct": summary.correct,
                "items": summary.items,
                "tokens": summary.mean_gen_tokens,
                "reward": sum(rewards) / len(rewards) if rewards else None,
                "seconds": compute_s,
            }
        )
        print(
            f"{label:28s} acc {rows[-1]['accuracy']:.3f}  tokens {summary.mean_gen_tokens:7.1f}  "
            f"reward {rows[-1]['reward'] if rows[-1]['reward'] is not None else float('nan'):.3f}  {compute_s:6.1f}s",
            flush=True,
        )

    # ---- plot: accuracy and chosen-answer reward vs mean generated tokens, one series per method
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    # distinct markers and line styles: methods with identical points (e.g. Speculative Rejection with
    # alpha 0.5 and rank rejection sampling share seeds and survivors) stay visible on top of each other
    styles = {
        "sampling": ("o", "-"),
        "best_of_n": ("s", "-"),
        "speculative_rejection": ("^", "--"),
        "srd": ("D", "-"),
        "rejection_sampling": ("x", ":"),
    }
    for method, (marker, line) in styles.items():
        pts = sorted((r for r in rows if r["method"] == method), key=lambda r: r["tokens"])
        if not pts:
            continue
        xs = [p["tokens"] for p in pts]
        axes[0].plot(
            xs,
            [100 * p["accuracy"] for p in pts],
            marker=marker,
            linestyle=line,
            label=method,
            markersize=7,
            markerfacecolor="none",
        )
        axes[1].plot(
            xs,
            [p["reward"] if p["reward"] is not None else float("nan") for p in pts],
            marker=marker,
            linestyle=line,
            label=method,
            markersize=7,
            markerfacecolor="none",
        )
        for p in pts:
            axes[0].annotate(
                f"n={p['n']}",
                (p["tokens"], 100 * p["accuracy"]),
                fontsize=7,
                textcoords="offset points",
                xytext=(3, 3),
            )
    axes[0].set(
        xlabel="mean generated tokens per problem",
        ylabel="accuracy (%)",
        title=f"GSM8K, {args.items} problems, SmolLM2-135M",
    )
    axes[1].set(
        xlabel="mean generated tokens per problem",
        ylabel="arithmetic reward of the answer",
        title="reward of the chosen response",
    )
    axes[0].set_ylim(bottom=0, top=max(5.0, 1.2 * max(100 * r["accuracy"] for r in rows)))
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    png = ROOT / "docs" / "accuracy_vs_tokens.png"
    if not args.no_write:
        fig.savefig(png, dpi=110)

    setting = (
        f"{args.items} GSM8K test problems (the first {args.items} rows), 1 seed ({args.seed}), "
        f"SmolLM2-135M-Instruct bf16 on CPU, arithmetic reward, max_new_tokens={args.max_new_tokens}, "
        f"Δ = chunk_tokens = {args.chunk_tokens}, drafter T=0.8 / top-p 0.9 / top-k 50; SRD defaults "
        f"θ_high 0.5, θ_low 0.3, m 10, L_max 30, N_refine 2, editor T 1.0, reroute_global, lazy checkpoint scoring (the default)."
    )
    table = [
        setting,
        "",
        "![accuracy vs tokens](accuracy_vs_tokens.png)",
        "",
        "| method | n | accuracy | correct/items | mean gen tokens | mean reward of answer | model + reward s |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *[
            f"| {r['method']} | {r['n']} | {100 * r['accuracy']:.1f}% | {r['correct']}/{r['items']} | {r['tokens']:.1f} "
            f"| {r['reward'] if r['reward'] is not None else float('nan'):.3f} | {r['seconds']:.0f} |"
            for r in rows
        ],
        "",
        f"Command: `.venv/bin/python benchmarks/accuracy_vs_tokens.py --items {args.items} "
        f"--max-new-tokens {args.max_new_tokens} --chunk-tokens {args.chunk_tokens} --seed {args.seed}`",
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
