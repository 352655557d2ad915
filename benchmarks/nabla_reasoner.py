"""∇-Reasoner (``nabla_reasoner``) against Best-of-N(8) and self-consistency(8) on the CPU testbed: the
same test problems, the testbed's policy and its learned outcome reward model (``hf-orm``), one seed.

    nice -n 5 .venv/bin/python benchmarks/nabla_reasoner.py [--items 40] [--max-new-tokens 128] [--seed 0]

Per method: accuracy with its 95% bootstrap interval over problems, mean generated (sampled) tokens,
model passes outside sampling (policy forwards / backwards, reward forwards / backwards), the §8.6
"LLM calls" count, and the wall time of the run. Two ∇-Reasoner settings run: the reference's
thresholds (grad-norm 4, which the testbed's small models almost never reach, so it is mostly one
sampled rollout), a grad-norm threshold scaled to the testbed (``--grad-threshold``, default 0.5), and
that threshold with a 10x learning rate (lr 0.1: the reference's 20 Adam steps at lr 0.01 move a logit
by at most about 0.2, which rarely changes the testbed policy's token).
The paired differences against Best-of-8 come with exact McNemar p-values.

Runs go through the embedded runner into --work (default /tmp/srdq-bench-nabla); run ids are
deterministic, so an interrupted benchmark resumes. Writes the ``nabla_reasoner`` section of
docs/PERFORMANCE.md (unless --no-write).
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

DATA = "srd_worker/testbed/artifacts/data/test.jsonl"
REWARD = "hf-orm:srd_worker/testbed/artifacts/rm"


def configs(max_new: int, grad_threshold: float) -> list[tuple[str, str, dict]]:
    draft = {"max_new_tokens": max_new, "chunk_tokens": max_new}
    return [
        ("best_of_n n=8", "best_of_n", {**draft, "n": 8}),
        ("nabla_reasoner (reference thresholds)", "nabla_reasoner", {"max_new_tokens": max_new}),
        (
            f"nabla_reasoner grad_norm_threshold={grad_threshold}",
            "nabla_reasoner",
            {"max_new_tokens": max_new, "grad_norm_threshold": grad_threshold},
        ),
        (
            f"nabla_reasoner grad_norm_threshold={grad_threshold} lr=0.1",
            "nabla_reasoner",
            {"max_new_tokens": max_new, "grad_norm_threshold": grad_threshold, "lr": 0.1},
        ),
    ]


def passes(method: str, rec: dict) -> dict[str, float]:
    """Model passes of one problem. Baselines: every sampled token is one policy step (the §8.6 count
    for SC/BoN is the generated tokens), one reward forward per scored candidate."""
    led, ex = rec["ledger"], rec.get("extra") or {}
    if method == "nabla_reasoner":
        return {
            "lm_fwd": ex["lm_forward_passes"],
            "lm_bwd": ex["lm_backward_passes"],
            "rm_fwd": ex["rm_forward_passes"],
            "rm_bwd": ex["rm_backward_passes"],
            "llm_calls": ex["num_llm_calls"],
        }
    return {"lm_fwd": 0, "lm_bwd": 0, "rm_fwd": led["rm_calls"], "rm_bwd": 0, "llm_calls": led["gen_tokens"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=40)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--grad-threshold", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (1: on a shared, busy machine 2 was ~50x slower)",
    )
    ap.add_argument("--work", default="/tmp/srdq-bench-nabla")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    import torch

    from srd_worker.engines.transformers_engine import TransformersEngine
    from srd_worker.local import run_local
    from srd_worker.methods.self_consistency import majority
    from srd_worker.reports.stats import bootstrap_ci, paired
    from srd_worker.settings import Settings
    from srd_worker.spec import prepare_run

    torch.set_num_threads(args.threads)
    settings = Settings(device="cpu", dtype="float32")
    engine = TransformersEngine.from_name("testbed", settings=settings)
    rows: list[dict[str, Any]] = []
    correct: dict[str, list[float | None]] = {}
    for label, method, params in configs(args.max_new_tokens, args.grad_threshold):
        prepared = prepare_run(
            dataset=str(ROOT / DATA),
            method=method,
            params=params,
            model="testbed",
            reward=REWARD,
            seed=args.seed,
            limit=args.items,
        )
        t0 = time.perf_counter()
        summary = run_local(prepared, out_dir=args.work, settings=settings, engine=engine)
        recs = [json.loads(line) for line in Path(summary.results_path).read_text().splitlines()]
        timings = Path(summary.results_path).with_name("timings.jsonl").read_text().splitlines()
        compute_s = sum(sum((json.loads(t)["timing"] or {}).values()) for t in timings)
        scorer_s = sum((json.loads(t)["timing"] or {}).get("scorer", 0.0) for t in timings)
        correct[label] = [None if r["correct"] is None else float(r["correct"]) for r in recs]
        counts = [passes(method, r) for r in recs]
        row: dict[str, Any] = {
            "label": label,
            "acc": bootstrap_ci(correct[label]),
            "tokens": bootstrap_ci([r["ledger"]["gen_tokens"] for r in recs]),
            **{
                k: sum(c[k] for c in counts) / len(counts)
                for k in ("lm_fwd", "lm_bwd", "rm_fwd", "rm_bwd", "llm_calls")
            },
            "compute_s": compute_s,
            "wall_s": time.perf_counter() - t0,
            "items": len(recs),
        }
        if method == "nabla_reasoner":
            ex = [r["extra"] for r in recs]
            row["nabla"] = {
                k: sum(e[k] for e in ex) / len(ex)
                for k in ("n_generations", "n_dto_calls", "n_revisions", "n_rejections", "num_grad_steps")
            }
        rows.append(row)
        if method == "best_of_n":
            # self-consistency(8) votes over the SAME 8 candidates: srdq seeds a candidate's draft by
            # (run seed, item, candidate, round, "draft"), so self_consistency with n=8 and the same
            # drafting parameters draws these very tokens (ALGORITHMS.md §0.6); only the answer rule differs
            sc = []
            for r in recs:
                answers = [c["answer"] for c in r["candidates"]]
                chosen = majority(answers)
                c = r["candidates"][0 if chosen is None else chosen]["correct"]
                sc.append(None if c is None else float(c))
            correct["self_consistency n=8"] = sc
            rows.append(
                {
                    **row,
                    "label": "self_consistency n=8",
                    "acc": bootstrap_ci(sc),
                    "rm_fwd": 0.0,
                    "compute_s": compute_s - scorer_s,
                }
            )
        print(
            f"{label:42s} acc {row['acc'].text()}  tokens {row['tokens'].mean:7.1f}  "
            f"lm fwd/bwd {row['lm_fwd']:.1f}/{row['lm_bwd']:.1f}  rm fwd/bwd {row['rm_fwd']:.1f}/{row['rm_bwd']:.1f}  "
            f"calls {row['llm_calls']:.0f}  {compute_s:.0f}s",
            flush=True,
        )

    base = rows[0]["label"]
    manifest = json.loads((ROOT / "srd_worker/testbed/artifacts/manifest.json").read_text())
    sha = {k: manifest["files"][f"{k}/model.safetensors"]["sha256"][:12] for k in ("policy", "rm")}
    lines = [
        f"{args.items} testbed test problems (the first {args.items} rows of `{DATA}`), one seed ({args.seed}), "
        f"the testbed policy (0.62M parameters) and its learned ORM (`{REWARD}`), fp32 on {args.threads} CPU thread(s), "
        f"max_new_tokens={args.max_new_tokens}; model files sha256 policy {sha['policy']}…, rm {sha['rm']}… "
        "(the testbed's manifest at the time of the run). Best-of-N and self-consistency draw at T 0.8 / top-p 0.9 / "
        "top-k 50 (srdq's defaults); ∇-Reasoner at its reference settings (rollouts T 0.6 / top-p 0.95, "
        "resample T 0.5, 20 Adam steps at lr 0.01, confidence 0.97, at most 8 rollouts).",
        "",
        "| method | accuracy [95% CI] | mean gen tokens [95% CI] | LM fwd | LM bwd | RM fwd | RM bwd "
        "| §8.6 LLM calls | compute s | wall s |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['acc'].text()} | {r['tokens'].text(1)} | {r['lm_fwd']:.1f} | {r['lm_bwd']:.1f} "
            f"| {r['rm_fwd']:.1f} | {r['rm_bwd']:.1f} | {r['llm_calls']:.0f} | {r['compute_s']:.0f} | {r['wall_s']:.0f} |"
        )
    lines += [
        "",
        "Per problem, means. LM fwd / bwd: policy passes outside autoregressive sampling (∇-Reasoner's "
        "teacher-forced rollout prefills, grad-norm probes and full DTO steps); every sampled token is one "
        "more policy step, counted in gen tokens. RM fwd / bwd: reward-model passes (Best-of-N scores its 8 "
        "candidates, a text identical to one already scored read from the score cache; self-consistency none). Self-consistency(8) is the majority vote over Best-of-8's own "
        "candidates (srdq seeds drafts per candidate, so a self_consistency run with n=8 draws the same "
        "tokens; ALGORITHMS.md §0.6), so its tokens and time are Best-of-8's without the reward. §8.6 LLM calls: the ∇-Reasoner paper's count (rollout tokens "
        "+ 4 per full DTO step + 2 per acceptance check); for the baselines the generated tokens, as the "
        "paper counts them. Compute s: the runs' own per-component wall time, summed over problems; wall s: the whole "
        "run (checkpoints and grading included; self-consistency shares Best-of-8's run, so its compute is "
        "that run's minus the reward's time and its wall is the same run's).",
        "",
        "| ∇-Reasoner setting | rollouts | DTO calls | revisions | rejections | full DTO steps |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "nabla" in r:
            n = r["nabla"]
            lines.append(
                f"| {r['label']} | {n['n_generations']:.2f} | {n['n_dto_calls']:.2f} | {n['n_revisions']:.2f} "
                f"| {n['n_rejections']:.2f} | {n['num_grad_steps']:.2f} |"
            )
    lines += ["", "Paired against Best-of-8 (same problems):", ""]
    lines += [
        "| method | wins / ties / losses | accuracy difference [95% CI] | McNemar p |",
        "|---|---|---|---:|",
    ]
    for r in rows[1:]:
        pr = paired(correct[r["label"]], correct[base])
        p_text = f"{pr.mcnemar_p:.3f}" if pr.mcnemar_p is not None else "n/a"
        lines.append(f"| {r['label']} | {pr.wins} / {pr.ties} / {pr.losses} | {pr.diff.text()} | {p_text} |")
    lines += [
        "",
        f"Command: `nice -n 5 .venv/bin/python benchmarks/nabla_reasoner.py --items {args.items} "
        f"--max-new-tokens {args.max_new_tokens} --grad-threshold {args.grad_threshold} --seed {args.seed} "
        f"--threads {args.threads}`",
    ]
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        replace_section(ROOT / "docs" / "PERFORMANCE.md", "nabla_reasoner", body)


if __name__ == "__main__":
    main()
