"""The score cache on the CPU testbed (policy ``testbed``, reward ``hf-orm:testbed-rm``): reward calls saved
and wall time, with the cache on against every run cold (``SRDQ_SCORE_CACHE=false``).

    .venv/bin/python benchmarks/score_cache.py [--items 24] [--n 8] [--seed 0] [--max-new-tokens 96]
        [--thetas 0.4,0.5,0.6,0.7] [--work /tmp/srdq-score-cache] [--no-write]

Two experiments, each run twice from empty stores under --work (``srdq run``'s code path, ``run_local``,
one engine shared by every run):

- **coupled pair**: SRD (θ_high 0.5) then rejection sampling (rank variant, θ 0.5) with the same seed in
  one store with the cache on, against the same two runs each in a store of its own with the cache off.
  Rejection sampling draws SRD's round-0 drafts from the same seeds, so their scores are cache hits.
- **threshold sweep**: SRD at 4 values of θ_high (θ_low 0.3, or θ_high when that is lower) one after the
  other in one store with the cache on, against 4 separate cold runs.

Per run: reward calls (responses the reward scored), cache hits, the share of the cold run's reward calls
saved (1 − calls with cache / calls cold), the scorer's wall time and the run's wall time, both summed over
the runs; and whether the records equal the cold ones apart from the reward counters (scores are
deterministic for the same input). Writes the ``score-cache`` section of docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._doc import replace_section  # noqa: E402

RM = "hf-orm:testbed-rm"
COUNTERS = ("rm_calls", "rm_tokens", "rm_cache_hits", "rm_cache_hit_tokens")


def run_one(
    out: Path, method: str, params: dict[str, Any], args: argparse.Namespace, cache: bool, engine: Any
):
    from srd_worker.local import run_local
    from srd_worker.settings import Settings
    from srd_worker.spec import prepare_run

    settings = Settings(score_cache=cache)
    prepared = prepare_run(
        dataset="testbed",
        method=method,
        params={"n": args.n, "max_new_tokens": args.max_new_tokens, **params},
        model="testbed",
        reward=RM,
        seed=args.seed,
        limit=args.items,
        settings=settings,
    )
    t0 = time.perf_counter()
    summary = run_local(prepared, out_dir=out, settings=settings, engine=engine)
    wall = time.perf_counter() - t0
    records = [json.loads(line) for line in Path(summary.results_path).read_text().splitlines()]
    timings = [
        json.loads(line)
        for line in (Path(summary.results_path).parent / "timings.jsonl").read_text().splitlines()
    ]
    led = [r["ledger"] or {} for r in records]
    return {
        "records": records,
        "calls": sum(x.get("rm_calls", 0) for x in led),
        "hits": sum(x.get("rm_cache_hits", 0) for x in led),
        "scorer_s": sum((t.get("timing") or {}).get("scorer", 0.0) for t in timings),
        "wall_s": wall,
        "accuracy": summary.accuracy,
    }


def _strip(record: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(record))
    for key in COUNTERS:
        (out.get("ledger") or {}).pop(key, None)
    (out.get("ledger") or {}).get("components", {}).pop("scorer", None)
    (out.get("extra") or {}).get("ledger_components", {}).pop("scorer", None)
    return out


def same_records(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    return [_strip(r) for r in a] == [_strip(r) for r in b]


def row(label: str, warm: dict[str, Any], cold: dict[str, Any]) -> list[str]:
    saved = 1 - warm["calls"] / cold["calls"] if cold["calls"] else 0.0
    return [
        label,
        str(cold["calls"]),
        str(warm["calls"]),
        str(warm["hits"]),
        f"{100 * saved:.1f}%",
        f"{cold['scorer_s']:.1f} / {warm['scorer_s']:.1f}",
        f"{cold['wall_s']:.1f} / {warm['wall_s']:.1f}",
        "yes" if same_records(warm["records"], cold["records"]) else "NO",
    ]


def table(rows: list[list[str]]) -> str:
    head = [
        "run",
        "RM calls cold",
        "RM calls cached",
        "cache hits",
        "calls saved",
        "scorer s cold / cached",
        "wall s cold / cached",
        "records equal",
    ]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 2) + "---|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def total(label: str, pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> list[str]:
    def agg(runs: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "calls": sum(r["calls"] for r in runs),
            "hits": sum(r["hits"] for r in runs),
            "scorer_s": sum(r["scorer_s"] for r in runs),
            "wall_s": sum(r["wall_s"] for r in runs),
            "records": [x for r in runs for x in r["records"]],
        }

    warm, cold = agg([w for w, _ in pairs]), agg([c for _, c in pairs])
    return [f"**{x}**" for x in row(label, warm, cold)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=24)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--thetas", default="0.4,0.5,0.6,0.7")
    ap.add_argument("--work", type=Path, default=Path("/tmp/srdq-score-cache"))
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    import torch

    from srd_worker.engines.registry import build_engine
    from srd_worker.settings import Settings

    shutil.rmtree(args.work, ignore_errors=True)
    engine = build_engine("transformers", "testbed", Settings())
    pair = [("srd", {"theta_high": 0.5, "theta_low": 0.3}), ("rejection_sampling", {})]
    rows, pair_runs = [], []
    for i, (method, params) in enumerate(pair):
        warm = run_one(args.work / "pair-cached", method, params, args, True, engine)
        cold = run_one(args.work / f"pair-cold-{i}", method, params, args, False, engine)
        pair_runs.append((warm, cold))
        rows.append(row(f"pair: {method}" + (" (after SRD)" if i else ""), warm, cold))
        print(rows[-1], flush=True)
    rows.append(total("pair: both runs", pair_runs))
    sweep_runs = []
    for i, theta in enumerate(float(x) for x in args.thetas.split(",")):
        params = {"theta_high": theta, "theta_low": min(0.3, theta)}
        warm = run_one(args.work / "sweep-cached", "srd", params, args, True, engine)
        cold = run_one(args.work / f"sweep-cold-{i}", "srd", params, args, False, engine)
        sweep_runs.append((warm, cold))
        rows.append(row(f"sweep: srd θ_high {theta}", warm, cold))
        print(rows[-1], flush=True)
    rows.append(total("sweep: 4 runs", sweep_runs))
    text = table(rows)
    body = (
        f"`benchmarks/score_cache.py --items {args.items} --n {args.n} --seed {args.seed} "
        f"--max-new-tokens {args.max_new_tokens} --thetas {args.thetas}` ({platform.machine()}, "
        f"torch threads {torch.get_num_threads()}, one engine shared by every run; the machine was shared "
        "with other jobs, so wall times are indicative). Sample: the first "
        f"{args.items} testbed problems × 1 seed, N = {args.n}, policy `testbed`, reward `{RM}`. *Cold*: "
        "each run in a store of its own with `SRDQ_SCORE_CACHE=false`; *cached*: the runs one after the other "
        "in one store with the cache on. *calls saved* = 1 − cached / cold reward calls; *records equal*: "
        "every record equals the cold run's apart from the reward counters (`rm_calls`, `rm_tokens`, the "
        "hit counters, the scorer's invocations and tokens) and wall times.\n\n" + text
    )
    print(text)
    if not args.no_write:
        replace_section(ROOT / "docs" / "PERFORMANCE.md", "score-cache", body)


if __name__ == "__main__":
    main()
