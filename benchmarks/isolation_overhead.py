"""What per-item fault isolation (srd_worker/isolation.py) costs.

1. Every round, before ``method.step``, the runner pickles the active states (the snapshot a failed
   attempt is rolled back to). Measured against the JSON encoding of the same states, which the runner's
   checkpoint already does every round: states shaped like Best-of-N's (``--items`` items, n candidates
   of t random token ids, 4 characters of text per token).
2. A shard with one poisoned item against the same shard without it: ``run_shard`` with the sampling
   method on the tiny random Llama (real engine; the poisoned prompt raises in a wrapper), clean and
   poisoned runs interleaved over ``--reps`` repetitions, medians reported.

    .venv/bin/python benchmarks/isolation_overhead.py [--items 16] [--reps 3]

Prints the tables and writes them into docs/PERFORMANCE.md (between the isolation-overhead markers).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._doc import replace_section  # noqa: E402

POISON = "[poison]"
SHAPES = [(16, 4, 256), (64, 4, 1024), (64, 16, 1024)]  # items, candidates, tokens per candidate


def pool_states(items: int, n: int, tokens: int, rng: random.Random) -> list[dict]:
    from srd_worker.methods.base import new_state
    from srd_worker.methods.pool import new_trajectory

    states = []
    for i in range(items):
        state = dict(new_state(f"q{i}", "What is 2 + 2? " * 8, [rng.randrange(50_000) for _ in range(200)]))
        cands = []
        for c in range(n):
            cand = new_trajectory(c)
            cand["tokens"] = [rng.randrange(50_000) for _ in range(tokens)]
            cand["text"] = "abcd" * tokens
            cands.append(cand)
        state["candidates"] = cands
        states.append(state)
    return states


def snapshot_table(reps: int) -> str:
    rng = random.Random(0)
    rows = [
        "| items × n × tokens | states (JSON) | snapshot (pickle) | checkpoint encode (JSON) | ratio |",
        "|---|---:|---:|---:|---:|",
    ]
    for items, n, tokens in SHAPES:
        states = pool_states(items, n, tokens, rng)
        snap, enc = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            pickle.dumps(states, protocol=pickle.HIGHEST_PROTOCOL)
            t1 = time.perf_counter()
            text = json.dumps(states)
            t2 = time.perf_counter()
            snap.append(t1 - t0)
            enc.append(t2 - t1)
        s, e = statistics.median(snap), statistics.median(enc)
        rows.append(
            f"| {items} × {n} × {tokens} | {len(text) / 1e6:.1f} MB | {s * 1e3:.1f} ms | {e * 1e3:.1f} ms "
            f"| {s / e:.2f} |"
        )
    return "\n".join(rows)


class PoisonedEngine:
    """The real engine; a batch holding a prompt with POISON raises (as a broken request would)."""

    def __init__(self, inner, poison: bool) -> None:
        self.inner, self.poison = inner, poison
        self.name, self.capabilities = inner.name, inner.capabilities
        self.tokenizer, self.max_context = inner.tokenizer, inner.max_context
        self.calls = 0

    def generate(self, requests):
        self.calls += 1
        if self.poison and any(POISON in self.tokenizer.decode(list(r.prompt_ids)) for r in requests):
            raise RuntimeError("injected fault")
        return self.inner.generate(requests)

    def logprobs(self, pairs):
        return self.inner.logprobs(pairs)


def run_once(engine, items, poison: bool, tmp: Path, tag: str):
    from srd_worker.methods.registry import build_method
    from srd_worker.runner import run_shard
    from srd_worker.store import crud
    from srd_worker.store.db import make_engine, session_scope, sqlite_url, upgrade
    from srd_worker.store.shard_store import SqlShardStore
    from srd_worker.tasks.gsm8k import GSM8KTask

    url = sqlite_url(tmp / f"{tag}.db")
    upgrade(url)
    db = make_engine(url)
    with session_scope(db) as session:
        crud.create_run(
            session=session,
            run_id="r",
            name=tag,
            spec={},
            config_hash="",
            versions={},
            items=items,
            shard_size=len(items),
        )
    wrapped = PoisonedEngine(engine, poison)
    t0 = time.perf_counter()
    out = run_shard(
        items=items,
        positions=list(range(len(items))),
        method=build_method("sampling", {"max_new_tokens": 16, "chunk_tokens": 8}),
        task=GSM8KTask(),
        engine=wrapped,
        reward=None,
        run_seed=0,
        store=SqlShardStore(db, "r", 0),
    )
    wall = time.perf_counter() - t0
    db.dispose()
    assert out.finished
    errors = sum(1 for r in out.records if r["error"])
    return wall, wrapped.calls, out.isolation, errors


def isolation_table(n_items: int, reps: int) -> str:
    import torch

    from srd_worker.engines.loading import build_tiny_llama
    from srd_worker.engines.transformers_engine import TransformersEngine
    from srd_worker.tasks.base import Item

    torch.set_num_threads(2)
    model, tokenizer = build_tiny_llama(seed=0)
    engine = TransformersEngine(model.to(torch.float32), tokenizer, max_batch_size=64)
    poisoned_at = n_items // 3
    clean_items = [Item(f"q{i}", f"What is {i} + {i + 3}?", str(2 * i + 3)) for i in range(n_items)]
    bad_items = [
        Item(it.id, it.question + (f" {POISON}" if i == poisoned_at else ""), it.gold)
        for i, it in enumerate(clean_items)
    ]
    walls: dict[bool, list[float]] = {False: [], True: []}
    info = {}
    with tempfile.TemporaryDirectory() as d:
        for rep in range(reps):
            for poison in (False, True):  # interleaved: the machine's load hits both alike
                wall, calls, iso, errors = run_once(
                    engine, bad_items if poison else clean_items, poison, Path(d), f"{rep}-{poison}"
                )
                walls[poison].append(wall)
                info[poison] = (calls, iso, errors)
    clean, bad = statistics.median(walls[False]), statistics.median(walls[True])
    rows = [
        "| shard | engine calls (failed ones too) | splits | isolated items | wall (median) | wall range |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for poison, wall in ((False, clean), (True, bad)):
        calls, iso, errors = info[poison]
        label = f"{n_items} items, 1 poisoned" if poison else f"{n_items} items, clean"
        rows.append(
            f"| {label} | {calls} | {iso.splits} | {errors} | {wall:.2f} s | "
            f"{min(walls[poison]):.2f}–{max(walls[poison]):.2f} s |"
        )
    rows.append("")
    rows.append(
        f"Poisoned ÷ clean wall time: **{bad / clean:.2f}** (median of {reps} interleaved repetitions; "
        f"sampling, 16 new tokens in rounds of 8, the poisoned item fails in round 1). The extra engine "
        f"calls are the failed attempts (1 + log2 of the batch; the injected fault raises before generating, "
        f"so they are cheap here, while a fault late in a real forward pass costs up to the failed batch's "
        f"compute each time: n + n/2 + n/4 + ... < 2n items' work on top of the round) and the halves that "
        f"succeed, which run as separate smaller batches."
    )
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/PERFORMANCE.md alone")
    args = ap.parse_args()
    import logging

    logging.getLogger("srdq.isolation").setLevel(logging.ERROR)  # one warning per split otherwise

    snap = snapshot_table(max(args.reps, 3))
    iso = isolation_table(args.items, args.reps)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    body = "\n".join(
        [
            f"Measured with `.venv/bin/python benchmarks/isolation_overhead.py --items {args.items} "
            f"--reps {args.reps}` on {platform.machine()} / {os.cpu_count()} CPUs (load average "
            f"{load:.1f} at the end), Python {platform.python_version()}.",
            "",
            "Per-round snapshot of the active states (taken before every `method.step`; a failed attempt "
            "is rolled back to it), against the JSON encoding of the same states that the round's "
            "checkpoint already does (median of the repetitions):",
            "",
            snap,
            "",
            "Isolating one poisoned item (tiny random Llama, `run_shard` on SQLite):",
            "",
            iso,
        ]
    )
    print(body)
    if not args.no_write:
        replace_section(ROOT / "docs" / "PERFORMANCE.md", "isolation-overhead", body)


if __name__ == "__main__":
    main()
