"""Runner overhead: generated tokens/s of a Best-of-N shard through the runner (chunked rounds, reward
scoring, SQLite checkpoint after every round, grading) divided by the engine's raw batched tokens/s at
the same batch size (one ``generate`` call, no chunking, no reward, no store), measured in one run.

    .venv/bin/python benchmarks/runner_overhead.py [--items 10] [--n 4] [--max-new-tokens 128]

Prints a table and writes it into docs/PERFORMANCE.md (between the runner-overhead markers).
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._doc import replace_section  # noqa: E402
from benchmarks._requests import round_requests  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default=str(ROOT / "examples" / "gsm8k_sample.jsonl"))
    ap.add_argument("--items", type=int, default=10)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--chunk-tokens", type=int, default=100, help="the methods' default drafting interval")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/PERFORMANCE.md alone")
    args = ap.parse_args()

    import torch

    from srd_worker.engines.transformers_engine import TransformersEngine
    from srd_worker.local import run_local
    from srd_worker.settings import Settings
    from srd_worker.spec import prepare_run

    settings = Settings(device="cpu")
    engine = TransformersEngine.from_name(args.model, settings=settings)
    params = {"n": args.n, "max_new_tokens": args.max_new_tokens, "chunk_tokens": args.chunk_tokens}
    prepared = prepare_run(
        dataset=args.dataset,
        method="best_of_n",
        params=params,
        model=args.model,
        reward="arithmetic",
        limit=args.items,
    )

    # 1. the runner: a Best-of-N shard, SQLite checkpoints every round, results graded and written
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        summary = run_local(prepared, out_dir=out, settings=settings, engine=engine)
        runner_s = time.perf_counter() - t0
    runner_tokens = summary.mean_gen_tokens * summary.items
    batch = args.items * args.n

    # 2. the engine alone: the same prompts, batch size, sampling params and token cap, one generate
    # call (other seeds, so lengths differ a little; tokens/s normalises for that).
    reqs = round_requests(
        engine.tokenizer,
        prepared.task,
        prepared.items,
        prepared.method.params,
        n=args.n,
        max_new_tokens=args.max_new_tokens,
    )
    t0 = time.perf_counter()
    gens = engine.generate(reqs)
    engine_s = time.perf_counter() - t0
    engine_tokens = sum(len(g.token_ids) for g in gens)

    runner_tps = runner_tokens / runner_s
    engine_tps = engine_tokens / engine_s
    rows = [
        (
            "runner (Best-of-N shard, chunked, reward, checkpoints)",
            batch,
            int(runner_tokens),
            runner_s,
            runner_tps,
        ),
        ("engine (one raw batched generate)", batch, engine_tokens, engine_s, engine_tps),
    ]
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()} CPU ({torch.get_num_threads()} threads), "
        f"model {args.model} (bf16), {args.items} GSM8K problems × n={args.n}, max_new_tokens={args.max_new_tokens}, "
        f"chunk_tokens={args.chunk_tokens}, reward arithmetic.",
        "",
        f"**Runner tokens/s ÷ engine tokens/s = {runner_tps / engine_tps:.2f}**",
        "",
        "| path | batch | generated tokens | wall s | tokens/s |",
        "|---|---:|---:|---:|---:|",
        *[f"| {name} | {b} | {t} | {s:.1f} | {tps:.1f} |" for name, b, t, s, tps in rows],
        "",
        f"Command: `.venv/bin/python benchmarks/runner_overhead.py --items {args.items} --n {args.n} "
        f"--max-new-tokens {args.max_new_tokens} --chunk-tokens {args.chunk_tokens}`",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        replace_section(ROOT / "docs" / "PERFORMANCE.md", "runner-overhead", text)


if __name__ == "__main__":
    main()
