"""Runner overhead: generated tokens/s of a shard through the runner (rounds, reward scoring, SQLite
checkpoint after every round, grading) divided by the engine's raw batched tokens/s on a batch of the
same size (one ``generate`` call, no rounds, no reward, no store), for Best-of-N (default: its whole
budget in one engine call, ``chunk_tokens`` 0), Best-of-N in chunked rounds, and SRD (rounds of Δ).

The machine is shared and noisy, so the two paths are interleaved: every repetition runs, per method,
the runner and the raw engine back to back (alternating which goes first), and the table reports the
median of the per-repetition ratios with their range.

    .venv/bin/python benchmarks/runner_overhead.py [--items 10] [--n 4] [--max-new-tokens 256] [--reps 3]

Prints a table and writes it into docs/PERFORMANCE.md (between the runner-overhead markers).
"""

from __future__ import annotations

import argparse
import platform
import statistics
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
    ap.add_argument("--chunk-tokens", type=int, default=100, help="Δ of SRD and of chunked Best-of-N")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions of both paths")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/PERFORMANCE.md alone")
    args = ap.parse_args()

    import torch

    from srd_worker.engines.transformers_engine import TransformersEngine
    from srd_worker.local import run_local
    from srd_worker.settings import Settings
    from srd_worker.spec import prepare_run

    torch.set_num_threads(args.threads)
    settings = Settings(device="cpu")
    engine = TransformersEngine.from_name(args.model, settings=settings)
    base = {"n": args.n, "max_new_tokens": args.max_new_tokens}
    configs = [
        ("Best-of-N (default: whole budget, one engine call)", "best_of_n", base),
        (
            f"Best-of-N, chunked (chunk_tokens={args.chunk_tokens})",
            "best_of_n",
            {**base, "chunk_tokens": args.chunk_tokens},
        ),
        (f"SRD (Δ = chunk_tokens = {args.chunk_tokens})", "srd", {**base, "chunk_tokens": args.chunk_tokens}),
    ]
    prepared = {
        label: prepare_run(
            dataset=args.dataset,
            method=method,
            params=params,
            model=args.model,
            reward="arithmetic",
            limit=args.items,
        )
        for label, method, params in configs
    }
    first = next(iter(prepared.values()))
    reqs = round_requests(
        engine.tokenizer,
        first.task,
        first.items,
        first.method.params,
        n=args.n,
        max_new_tokens=args.max_new_tokens,
    )

    def runner(label: str) -> tuple[float, float]:
        with tempfile.TemporaryDirectory() as out:
            t0 = time.perf_counter()
            summary = run_local(prepared[label], out_dir=out, settings=settings, engine=engine)
            wall = time.perf_counter() - t0
        return summary.mean_gen_tokens * summary.items, wall

    def raw() -> tuple[float, float]:
        # the same prompts, batch size, sampling params and token cap in one generate call (other seeds,
        # so lengths differ a little; tokens/s normalises for that)
        t0 = time.perf_counter()
        gens = engine.generate(reqs)
        return sum(len(g.token_ids) for g in gens), time.perf_counter() - t0

    engine.generate(reqs[:2])  # warm-up
    samples: dict[str, list[tuple[float, float, float, float]]] = {label: [] for label, _, _ in configs}
    for rep in range(args.reps):
        for label, _, _ in configs:
            if rep % 2 == 0:
                (rt, rs), (et, es) = runner(label), raw()
            else:
                (et, es), (rt, rs) = raw(), runner(label)
            samples[label].append((rt, rs, et, es))
            print(
                f"rep {rep + 1} {label}: runner {rt / rs:.1f} tok/s, engine {et / es:.1f} tok/s, "
                f"ratio {(rt / rs) / (et / es):.2f}",
                flush=True,
            )

    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()} CPU ({args.threads} thread(s), shared with "
        f"other jobs), model {args.model} (bf16, batch-invariant engine defaults), {args.items} GSM8K problems "
        f"× n={args.n}, max_new_tokens={args.max_new_tokens}, reward arithmetic; {args.reps} interleaved "
        "repetitions (per repetition and method: the runner and the raw engine back to back).",
        "",
        "| path | batch | runner tokens/s (median) | engine tokens/s (median) | **runner ÷ engine, median** | range over repetitions |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for label, _, _ in configs:
        rows = samples[label]
        ratios = [(rt / rs) / (et / es) for rt, rs, et, es in rows]
        lines.append(
            f"| {label} | {args.items * args.n} | {statistics.median(rt / rs for rt, rs, _, _ in rows):.1f} | "
            f"{statistics.median(et / es for _, _, et, es in rows):.1f} | **{statistics.median(ratios):.2f}** | "
            f"{min(ratios):.2f}–{max(ratios):.2f} ({', '.join(f'{r:.2f}' for r in ratios)}) |"
        )
    lines += [
        "",
        f"Command: `.venv/bin/python benchmarks/runner_overhead.py --items {args.items} --n {args.n} "
        f"--max-new-tokens {args.max_new_tokens} --chunk-tokens {args.chunk_tokens} --reps {args.reps} "
        f"--threads {args.threads}`",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        replace_section(ROOT / "docs" / "PERFORMANCE.md", "runner-overhead", text)


if __name__ == "__main__":
    main()
