"""``make demo``: sampling, Best-of-N, self-consistency and SRD at the same budget N on the first problems of
the testbed's test split, with the testbed policy and its learned reward model, on the CPU. ``make
demo-real`` runs the same comparison on real text (``--dataset gsm8k --model qwen2.5-coder-0.5b --engine
vllm --reward logprob``).

    python -m srd_worker.testbed.demo [--limit 30] [--n 4] [--seed 0] [--out srdq-out/testbed-demo]
        [--dataset testbed] [--model testbed] [--engine transformers] [--reward hf-orm:testbed-rm]
        [--max-new-tokens 96] [--chunk-tokens 16]

Two runs go through the embedded runner (``srdq run --sweep`` underneath): ``best_of_n`` at N (its
candidates also give sampling = one candidate and self-consistency = majority of N, ``kcurves``) and
``srd`` at N. It prints accuracy and mean generated tokens per problem with 95% bootstrap intervals and
SRD vs Best-of-N paired (McNemar). The engine runs with ``batch_invariant`` off (one padded batch per round)
for speed. Rerunning with the same arguments re-reports the finished runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=30, help="first LIMIT test problems")
    ap.add_argument("--n", type=int, default=4, help="budget N (candidates per problem)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reward", default="hf-orm:testbed-rm")
    ap.add_argument("--out", default="srdq-out/testbed-demo")
    ap.add_argument("--dataset", default="testbed", help="a built-in dataset name or a file")
    ap.add_argument("--model", default="testbed")
    ap.add_argument("--engine", default="transformers", help="transformers or vllm")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--chunk-tokens", type=int, default=16, help="SRD's scoring interval Δ")
    ap.add_argument(
        "--doc",
        default=None,
        help="also write the printed table to this file (docs/demo_table.md: the README quotes it)",
    )
    args = ap.parse_args(argv)

    from srd_worker.reports.rows import paired_seed_groups
    from srd_worker.settings import Settings
    from srd_worker.testbed.experiment import kcurve_rows, markdown, run_grid, run_rows

    params = {"max_new_tokens": args.max_new_tokens, "chunk_tokens": args.chunk_tokens}
    sweep = {
        "dataset": args.dataset,
        "model": args.model,
        "engine": args.engine,
        "reward": args.reward,
        "limit": args.limit,
        "seeds": [args.seed],
        "methods": [
            {"method": "best_of_n", "n": args.n, "params": {"max_new_tokens": args.max_new_tokens}},
            {"method": "srd", "n": args.n, "params": params},
        ],
    }
    runs = run_grid(sweep, Path(args.out), settings=Settings(device="cpu", batch_invariant=False))
    bon = [r for r in runs if r.method == "best_of_n"]
    srd = [r for r in runs if r.method == "srd"]
    rows = kcurve_rows(bon, [1, args.n]) + run_rows(srd)
    _, p, _ = paired_seed_groups(srd, bon, metric="accuracy")
    d = p.diff
    ci = "" if d.low is None else f" [{100 * d.low:+.1f}, {100 * (d.high or 0):+.1f}]"
    mcnemar = "n/a" if p.mcnemar_p is None else f"{p.mcnemar_p:.3g}"
    text = "\n".join(
        [
            f"{args.dataset}: first {args.limit} problems, seed {args.seed}, policy `{args.model}` on "
            f"{args.engine}, reward {args.reward}, N = {args.n}, T 0.8 / top-p 0.9 / top-k 50, at most "
            f"{args.max_new_tokens} tokens",
            markdown(rows),
            "",
            f"SRD − Best-of-{args.n} accuracy: {100 * (d.mean or 0):+.1f} points{ci} (paired, 95%, "
            f"{p.pairs} problems); wins/ties/losses {p.wins}/{p.ties}/{p.losses}, exact McNemar p = {mcnemar}",
        ]
    )
    print()
    print(text)
    (Path(args.out) / "demo.md").write_text(text + "\n", encoding="utf-8")
    if args.doc:
        Path(args.doc).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
