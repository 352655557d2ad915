"""Beam search and DVTS against Best-of-N on the CPU testbed: the same test problems, the same budgets N,
with the rule-based arithmetic reward and with the testbed's learned reward model; accuracy with 95%
bootstrap intervals over problems (``srd_worker.reports.stats``), the paired accuracy difference to Best-of-N at
the same N and reward (exact McNemar p), mean generated tokens and mean reward calls per problem.

    nice -n 5 .venv/bin/python benchmarks/search_baselines.py [--items 300] [--budgets 4,8] [--seed 0]

Runs go through the embedded runner (``run_local``) into --work (default /tmp/srdq-search-bench); run ids
are deterministic, so an interrupted benchmark resumes and finished configurations are re-reported, not
regenerated. Writes the ``search-baselines`` section of docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._doc import replace_section  # noqa: E402
from srd_worker.testbed import ARTIFACTS_DIR as TESTBED  # noqa: E402

REWARDS = {"arithmetic": "arithmetic", "learned RM": f"hf-orm:{TESTBED / 'rm'}"}


def configs(budgets: list[int], beam_width: int, max_new: int, step_tokens: int) -> list[tuple[str, dict]]:
    """(method, params) per budget: Best-of-N, beam search and DVTS with the same n."""
    search: dict[str, Any] = {"beam_width": beam_width, "step_delimiter": "\\n", "chunk_tokens": step_tokens}
    out = []
    for n in budgets:
        out.append(("best_of_n", {"n": n, "max_new_tokens": max_new}))
        out.append(("beam_search", {"n": n, "max_new_tokens": max_new, **search}))
        out.append(("dvts", {"n": n, "max_new_tokens": max_new, **search}))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=300, help="the first ITEMS test problems")
    ap.add_argument("--budgets", default="4,8", help="comma-separated n values")
    ap.add_argument("--beam-width", type=int, default=2, help="M for beam search and DVTS")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--step-tokens", type=int, default=40, help="per-step token cap (chunk_tokens)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--work", default="/tmp/srdq-search-bench")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]

    import numpy as np
    import torch

    from srd_worker.engines.transformers_engine import TransformersEngine
    from srd_worker.local import run_local
    from srd_worker.reports.stats import bootstrap_ci, paired
    from srd_worker.settings import Settings
    from srd_worker.spec import prepare_run

    # one padded batch per engine call: with batch invariance every prompt length (prompt + a beam's
    # prefix: nearly one per request in a search step) would be its own sequence of 4-row passes
    settings = Settings(device="cpu", dtype="float32", batch_invariant=False)
    engine = TransformersEngine.from_name("testbed", settings=settings)
    # one thread: on a shared 2-core machine two torch threads spin-wait on each other (measured here:
    # 40x slower for the same Best-of-4 batch under a load of 16); the figures do not depend on it
    torch.set_num_threads(args.threads)
    dataset = TESTBED / "data" / "test.jsonl"
    rows: list[dict] = []
    correct: dict[tuple[str, str, int], np.ndarray] = {}
    t_all = time.perf_counter()
    for reward_label, reward in REWARDS.items():
        for method, params in configs(budgets, args.beam_width, args.max_new_tokens, args.step_tokens):
            t0 = time.perf_counter()
            prepared = prepare_run(
                dataset=dataset,
                method=method,
                params=params,
                model="testbed",
                reward=reward,
                seed=args.seed,
                limit=args.items,
                shard_size=args.items,  # one shard: every problem in each engine batch
            )
            summary = run_local(prepared, out_dir=args.work, settings=settings, engine=engine)
            recs = [json.loads(x) for x in Path(summary.results_path).read_text().splitlines()]
            recs.sort(key=lambda r: r["position"])
            ok = np.array([[1.0 if r["correct"] else 0.0] for r in recs])
            correct[(reward_label, method, params["n"])] = ok
            rows.append(
                {
                    "reward": reward_label,
                    "method": method,
                    "n": params["n"],
                    "acc": bootstrap_ci(ok, seed=args.seed),
                    "correct": int(ok.sum()),
                    "items": len(recs),
                    "tokens": float(np.mean([r["ledger"]["gen_tokens"] for r in recs])),
                    "rm_calls": float(np.mean([r["ledger"]["rm_calls"] for r in recs])),
                    "failed": sum(1 for r in recs if r["error"]),
                }
            )
            r = rows[-1]
            print(
                f"{reward_label:10s} {method:12s} n={r['n']:<3d} acc {r['acc'].text()}  "
                f"tokens {r['tokens']:7.1f}  rm calls {r['rm_calls']:5.1f}  ({time.perf_counter() - t0:.0f}s)",
                flush=True,
            )

    lines = [
        f"The first {args.items} problems of the testbed's test split (`srd_worker/testbed/artifacts/data/"
        f"test.jsonl`), 1 seed ({args.seed}), the testbed policy (float32, CPU, one padded batch per engine "
        f"call: `SRDQ_BATCH_INVARIANT=false`), `max_new_tokens` "
        f"{args.max_new_tokens}, drafter T 0.8 / top-p 0.9 / top-k 50. Beam search and DVTS: beam width M = "
        f"{args.beam_width}, `step_delimiter=\\n` (the testbed writes one equation per line), per-step cap "
        f"{args.step_tokens} tokens, `aggregation=last`, `answer=best`. Rewards: `arithmetic` (share of correct "
        "claims, smoothed) and the testbed's learned outcome RM (`hf-orm:srd_worker/testbed/artifacts/rm`, "
        "scored on each partial solution: it is not a process RM). Accuracy: mean over problems with a 95% "
        "bootstrap interval; Δ vs Best-of-N: paired difference on the same problems with its 95% interval "
        "and the exact McNemar p. Tokens and reward calls: mean per problem (every sampled step counts, "
        "pruned beams included).",
        "",
        "| reward | method | N | accuracy [95% CI] | correct/items | Δ vs best_of_n [95% CI], McNemar p "
        "| mean gen tokens | mean reward calls |",
        "|---|---|---:|---|---:|---|---:|---:|",
    ]
    for r in rows:
        if r["method"] == "best_of_n":
            delta = "–"
        else:
            cmp = paired(
                correct[(r["reward"], r["method"], r["n"])], correct[(r["reward"], "best_of_n", r["n"])]
            )
            delta = (
                f"{cmp.diff.text()}, p = {cmp.mcnemar_p:.2g}"
                if cmp.mcnemar_p is not None
                else cmp.diff.text()
            )
        lines.append(
            f"| {r['reward']} | {r['method']} | {r['n']} | {r['acc'].text()} | {r['correct']}/{r['items']} "
            f"| {delta} | {r['tokens']:.1f} | {r['rm_calls']:.1f} |"
        )
    failed = sum(r["failed"] for r in rows)
    lines += [
        "",
        f"Items that failed: {failed}. Wall time of the whole benchmark: {time.perf_counter() - t_all:.0f} s "
        "(2 busy CPU cores; finished runs are re-reported, not regenerated).",
        "",
        f"Command: `nice -n 5 .venv/bin/python benchmarks/search_baselines.py --items {args.items} "
        f"--budgets {args.budgets} --beam-width {args.beam_width} --max-new-tokens {args.max_new_tokens} "
        f"--step-tokens {args.step_tokens} --seed {args.seed}`",
    ]
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        replace_section(ROOT / "docs" / "PERFORMANCE.md", "search-baselines", body)


if __name__ == "__main__":
    main()
