"""Runner overhead: generated tokens/s of a shard through the runner (rounds, reward scoring, SQLite
checkpoint after every round, grading) divided by the engine's raw batched tokens/s on a batch of the
same size (one ``generate`` call, no rounds, no reward, no store, no prefix reuse), for Best-of-N
(default: its whole budget in one engine call, ``chunk_tokens`` 0), Best-of-N in chunked rounds, and SRD
(rounds of Δ). The chunked rows and SRD run twice, with the transformers engine's prefix KV reuse on
(``SRDQ_KV_REUSE=true``, the default: a round feeds only the new token) and off (the deterministic mode:
every round re-feeds prompt + kept tokens); the two engines share one model, and the reuse engine's store
is emptied before every run so no run profits from the one before.

With ``--modes invariant,padded`` (the default) the chunked rows and SRD also run on engines with
``batch_invariant=False`` (``SRDQ_BATCH_INVARIANT=false``): every request of a call, cached or not, in
one padded batch. Their ratio is to a raw engine of the same mode (one padded batch of the same
requests), and the notes give the padded runner's tokens/s ÷ the batch-invariant one's, both with reuse.

The table also gives, per runner path, the generated tokens per forward pass (how full the engine's
passes of ``invariant_rows`` rows were; the raw engine's figure is listed below the table) and the share
of the runner's wall time spent inside ``generate`` (the rest: reward, checkpoints, grading).

The machine is shared and noisy, so the paths are interleaved: every repetition runs, per method, the
raw engine and the runner path(s) back to back (alternating the order), and the table reports the
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
    ap.add_argument(
        "--modes",
        default="invariant,padded",
        help="engine batching modes of the chunked rows and SRD: invariant (the default engine), padded "
        "(batch_invariant=False), or both, comma-separated",
    )
    ap.add_argument(
        "--rows",
        default="default,chunked,srd",
        help="which rows to measure: default (Best-of-N, whole budget), chunked (Best-of-N in rounds), srd; "
        "comma-separated (e.g. `--rows default --no-write` at a large size)",
    )
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/PERFORMANCE.md alone")
    args = ap.parse_args()
    rows = args.rows.split(",")
    if not rows or set(rows) - {"default", "chunked", "srd"}:
        ap.error("--rows: one or more of default, chunked, srd")

    import torch

    from srd_worker.engines.transformers_engine import TransformersEngine
    from srd_worker.local import run_local
    from srd_worker.settings import Settings
    from srd_worker.spec import prepare_run

    torch.set_num_threads(args.threads)
    settings = Settings(device="cpu")
    engine = TransformersEngine.from_name(args.model, settings=settings)  # kv_reuse: the default (on)
    assert engine.kv_store is not None, "SRDQ_KV_REUSE=false in the environment: this compares both modes"
    plain = TransformersEngine(
        engine.model,
        engine.tokenizer,
        model_name=args.model,
        batch_invariant=settings.batch_invariant,
        invariant_rows=settings.invariant_rows,
        kv_reuse=False,
    )
    modes = args.modes.split(",")
    if not modes or set(modes) - {"invariant", "padded"}:
        ap.error("--modes: invariant, padded or both")
    # padded (batch_invariant=False): reuse on and off, and its own raw engine (one padded batch)
    padded_on, padded_off = (
        TransformersEngine(
            engine.model,
            engine.tokenizer,
            model_name=args.model,
            batch_invariant=False,
            kv_reuse=reuse,
            kv_reuse_mb=settings.kv_reuse_mb,
        )
        for reuse in (True, False)
    )
    raw_of = {engine: plain, plain: plain, padded_on: padded_off, padded_off: padded_off}
    paths = []
    if "invariant" in modes:
        paths += [("KV reuse off", plain), ("KV reuse on", engine)]
    if "padded" in modes:
        paths += [("padded, KV reuse off", padded_off), ("padded, KV reuse on", padded_on)]
    base = {"n": args.n, "max_new_tokens": args.max_new_tokens}
    chunked = {**base, "chunk_tokens": args.chunk_tokens}
    # (label, method, params, [(mode label, engine), ...]): one raw engine sample per group and repetition
    groups = [
        ("Best-of-N (default: whole budget, one engine call)", "best_of_n", base, [("", engine)]),
        (
            f"Best-of-N, chunked (chunk_tokens={args.chunk_tokens})",
            "best_of_n",
            chunked,
            paths,
        ),
        (
            f"SRD (Δ = chunk_tokens = {args.chunk_tokens})",
            "srd",
            chunked,
            paths,
        ),
    ]
    groups = [g for g, row in zip(groups, ("default", "chunked", "srd"), strict=True) if row in rows]
    prepared = {
        label: prepare_run(
            dataset=args.dataset,
            method=method,
            params=params,
            model=args.model,
            reward="arithmetic",
            limit=args.items,
        )
        for label, method, params, _ in groups
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

    def runner(label: str, eng: TransformersEngine) -> tuple[float, float, int, int, float, float]:
        """Generated tokens, wall seconds, prompt tokens fed and reused, generated tokens per forward
        pass and the share of the wall time spent inside the engine, for one run of the runner."""
        if eng.kv_store is not None:
            eng.kv_store.clear()
        before = dict(vars(eng.stats))
        with tempfile.TemporaryDirectory() as out:
            t0 = time.perf_counter()
            summary = run_local(prepared[label], out_dir=out, settings=settings, engine=eng)
            wall = time.perf_counter() - t0
        d = {k: v - before[k] for k, v in vars(eng.stats).items()}
        per_pass = d["generated_tokens"] / max(d["forward_passes"], 1)
        return (
            summary.mean_gen_tokens * summary.items,
            wall,
            d["prefill_tokens"],
            d["reused_tokens"],
            per_pass,
            d["generate_seconds"] / wall,
        )

    def raw(eng: TransformersEngine) -> tuple[float, float]:
        # the same prompts, batch size, sampling params and token cap in one generate call (other seeds,
        # so lengths differ a little; tokens/s normalises for that); no prefix store
        t0 = time.perf_counter()
        passes = eng.stats.forward_passes
        gens = eng.generate(reqs)
        raw_per_pass[eng].append(sum(len(g.token_ids) for g in gens) / (eng.stats.forward_passes - passes))
        return sum(len(g.token_ids) for g in gens), time.perf_counter() - t0

    raw_per_pass: dict[TransformersEngine, list[float]] = {plain: [], padded_off: []}
    raw_speed: dict[TransformersEngine, list[float]] = {plain: [], padded_off: []}

    plain.generate(reqs[:2])  # warm-up
    # per (group label, mode label): (runner tokens, runner s, engine tokens, engine s, fed, reused,
    # tokens per forward pass, engine share of the runner's wall time)
    samples: dict[tuple[str, str], list[tuple[float, ...]]] = {
        (label, mode): [] for label, _, _, modes in groups for mode, _ in modes
    }
    for rep in range(args.reps):
        for label, _, _, modes in groups:
            order = modes if rep % 2 == 0 else modes[::-1]
            got: dict[str, tuple[float, float, int, int, float, float]] = {}
            raws = list(dict.fromkeys(raw_of[eng] for _, eng in modes))  # the raw engine(s) of this group
            engine_sample: dict[TransformersEngine, tuple[float, float]] = {}
            if rep % 2 == 1:
                engine_sample = {r: raw(r) for r in raws}
            for mode, eng in order:
                got[mode] = runner(label, eng)
            if rep % 2 == 0:
                engine_sample = {r: raw(r) for r in raws}
            for r, (t, sec) in engine_sample.items():
                raw_speed[r].append(t / sec)
            for mode, eng in modes:
                rt, rs, fed, reused, per_pass, share = got[mode]
                et, es = engine_sample[raw_of[eng]]
                samples[(label, mode)].append((rt, rs, et, es, fed, reused, per_pass, share))
                print(
                    f"rep {rep + 1} {label} {mode}: runner {rt / rs:.1f} tok/s, engine {et / es:.1f} tok/s, "
                    f"ratio {(rt / rs) / (et / es):.2f}, prompt tokens fed {fed:,} (reused {reused:,})",
                    flush=True,
                )

    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()} CPU ({args.threads} thread(s), shared with "
        f"other jobs), model {args.model} (bf16), {args.items} GSM8K problems "
        f"× n={args.n}, max_new_tokens={args.max_new_tokens}, reward arithmetic; {args.reps} interleaved "
        "repetitions (per repetition and method: the raw engine and the runner path(s) back to back, order "
        "alternating). Raw engine: one generate call of the whole budget, no prefix store, in the same "
        "batching mode as the row (invariant: the default, groups of equal prompt length in passes of "
        f"{settings.invariant_rows} rows; padded: `SRDQ_BATCH_INVARIANT=false`, one padded batch).",
        "",
        "| path | engine batches | KV reuse | batch | prompt tokens fed (reused) per run | generated tokens per forward pass "
        "| share of runner time in the engine | runner tokens/s (median) | engine tokens/s (median) | "
        "**runner ÷ engine, median** | range over repetitions |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for label, _, _, modes in groups:
        for mode, eng in modes:
            rows = samples[(label, mode)]
            ratios = [r[0] / r[1] / (r[2] / r[3]) for r in rows]
            fed_median = statistics.median(r[4] for r in rows)
            reused_median = statistics.median(r[5] for r in rows)
            lines.append(
                f"| {label} | {'invariant' if eng.batch_invariant else 'padded'} | "
                f"{'on' if eng.kv_store is not None else 'off'} | {args.items * args.n} | "
                f"{fed_median:,.0f} ({reused_median:,.0f}) | {statistics.median(r[6] for r in rows):.2f} | "
                f"{statistics.median(r[7] for r in rows):.0%} | {statistics.median(r[0] / r[1] for r in rows):.1f} | "
                f"{statistics.median(r[2] / r[3] for r in rows):.1f} | **{statistics.median(ratios):.2f}** | "
                f"{min(ratios):.2f}–{max(ratios):.2f} ({', '.join(f'{r:.2f}' for r in ratios)}) |"
            )
    lines.append("")
    lines.append(
        f"- Raw engine (invariant): {statistics.median(raw_per_pass[plain]):.2f} generated tokens per forward "
        f"pass (rows per pass: {settings.invariant_rows if settings.batch_invariant else 'the batch'}), "
        f"median {statistics.median(raw_speed[plain]):.1f} tokens/s."
    )
    if raw_per_pass[padded_off]:
        lines.append(
            f"- Raw engine (padded, one batch of {args.items * args.n}): "
            f"{statistics.median(raw_per_pass[padded_off]):.2f} generated tokens per forward pass, median "
            f"{statistics.median(raw_speed[padded_off]):.1f} tokens/s."
        )

    def per_rep(label: str, a: str, b: str) -> str:
        x, y = samples[(label, a)], samples[(label, b)]
        ups = [(q[0] / q[1]) / (p[0] / p[1]) for p, q in zip(x, y, strict=True)]
        return f"median **{statistics.median(ups):.2f}** ({', '.join(f'{u:.2f}' for u in ups)})"

    for label, _, _, mode_list in groups:
        names = [m for m, _ in mode_list]
        for prefix, what in (("", "invariant"), ("padded, ", "padded")):
            if f"{prefix}KV reuse off" in names and f"{prefix}KV reuse on" in names:
                lines.append(
                    f"- {label}, {what}: runner tokens/s with KV reuse ÷ without, per repetition: "
                    + per_rep(label, f"{prefix}KV reuse off", f"{prefix}KV reuse on")
                )
        if "KV reuse on" in names and "padded, KV reuse on" in names:
            lines.append(
                f"- {label}, KV reuse on: runner tokens/s padded ÷ invariant, per repetition: "
                + per_rep(label, "KV reuse on", "padded, KV reuse on")
            )
    command = (
        f".venv/bin/python benchmarks/runner_overhead.py --items {args.items} --n {args.n} "
        f"--max-new-tokens {args.max_new_tokens} --chunk-tokens {args.chunk_tokens} --reps {args.reps} "
        f"--threads {args.threads}"
    )
    command += "" if args.modes == "invariant,padded" else f" --modes {args.modes}"
    command += "" if args.rows == "default,chunked,srd" else f" --rows {args.rows}"
    lines += ["", f"Command: `{command}`"]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        replace_section(ROOT / "docs" / "PERFORMANCE.md", "runner-overhead", text)


if __name__ == "__main__":
    main()
