"""What batch-invariant generation costs: the transformers engine's tokens/s with ``batch_invariant=True``
(requests grouped by prompt length, one unpadded batch per group) divided by ``batch_invariant=False``
(one left-padded batch), on the same requests in one run, and how many seeded requests get different
tokens alone than inside the padded batch.

The requests are a Best-of-N round's drafts: ``--items`` GSM8K prompts (each a different length) times
``--n`` seeded candidates, so invariant mode runs ``items`` groups of ``n`` rows.

    .venv/bin/python benchmarks/batch_invariance.py [--items 8] [--n 4] [--max-new-tokens 64]

Prints a table and writes it into docs/PERFORMANCE.md (between the batch-invariance markers).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._doc import replace_section  # noqa: E402
from benchmarks._requests import round_requests  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="gsm8k", help="built-in dataset name or a path")
    ap.add_argument("--items", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/PERFORMANCE.md alone")
    args = ap.parse_args()

    import torch

    from srd_worker.datasets import resolve_dataset
    from srd_worker.engines.transformers_engine import TransformersEngine
    from srd_worker.methods.pool import DraftParams
    from srd_worker.settings import Settings
    from srd_worker.tasks.gsm8k import GSM8KTask

    torch.set_num_threads(2)
    settings = Settings(device="cpu", dtype="bfloat16")
    engine = TransformersEngine.from_name(args.model, settings=settings)
    task = GSM8KTask()
    items = task.load(resolve_dataset(args.dataset))[: args.items]
    requests = round_requests(
        engine.tokenizer, task, items, DraftParams(), n=args.n, max_new_tokens=args.max_new_tokens
    )
    lengths = sorted({len(r.prompt_ids) for r in requests})

    rows = []
    outputs = {}
    for invariant in (False, True):
        engine.batch_invariant = invariant
        engine.generate(requests[:2])  # warm-up
        passes = engine.stats.forward_passes
        t0 = time.perf_counter()
        gens = engine.generate(requests)
        wall = time.perf_counter() - t0
        tokens = sum(len(g.token_ids) for g in gens)
        outputs[invariant] = gens
        rows.append((invariant, tokens, wall, tokens / wall, engine.stats.forward_passes - passes))

    engine.batch_invariant = True
    alone = [engine.generate([r])[0].token_ids for r in requests]
    differ = {inv: sum(a != g.token_ids for a, g in zip(alone, outputs[inv], strict=True)) for inv in outputs}

    ratio = rows[1][3] / rows[0][3]
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()} CPU (2 threads, torch {torch.__version__}), "
        f"model {args.model} (bfloat16), {len(items)} GSM8K prompts ({len(lengths)} distinct lengths, "
        f"{lengths[0]}–{lengths[-1]} tokens) × n={args.n} seeded requests = batch {len(requests)}, "
        f"max_new_tokens={args.max_new_tokens}, T 0.8 / top-p 0.9 / top-k 50.",
        "",
        f"**batch-invariant ÷ one padded batch = {ratio:.2f}** (tokens/s, same requests, one run)",
        "",
        "| mode | engine batches | forward passes | generated tokens | wall s | tokens/s | requests whose tokens differ from the same request alone |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for invariant, tokens, wall, tps, passes in rows:
        mode = "batch_invariant=true (default)" if invariant else "batch_invariant=false (one padded batch)"
        batches = len(lengths) if invariant else 1
        lines.append(
            f"| {mode} | {batches} | {passes} | {tokens} | {wall:.1f} | {tps:.1f} | "
            f"{differ[invariant]} of {len(requests)} |"
        )
    lines += [
        "",
        "Read plainly: grouping by prompt length removes padding (requests of other lengths no longer change a "
        "request's tokens) but not the effect of the group's row count, which changes the CPU matrix kernels "
        "(on SmolLM2, 1–3 rows give identical logits and 4 or more do not); here each group has n rows and "
        "the reference is the request alone (1 row), so most sampled continuations still diverge after a "
        "near-tie. Full batch invariance would need a fixed row count per forward pass.",
        "",
        "Command: `.venv/bin/python benchmarks/batch_invariance.py "
        f"--items {args.items} --n {args.n} --max-new-tokens {args.max_new_tokens}`",
    ]
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        replace_section(ROOT / "docs" / "PERFORMANCE.md", "batch-invariance", body)


if __name__ == "__main__":
    main()
