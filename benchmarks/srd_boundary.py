"""SRD's boundary localisation on the CPU testbed (srd_worker/testbed): the effect of ``boundary_search``
(``whole``: the earliest reward drop over the whole trajectory, then the L_max cap; ``tail``: the earliest
drop inside the regenerable tail only) and of the cap ``l_max`` (0 = no cap), beside rejection sampling
(rank variant, θ 0.5: SRD without its editor, from the same seeds).

    .venv/bin/python benchmarks/srd_boundary.py [--items 300] [--seeds 0,1,2] [--n 8]
        [--rewards hf-orm:testbed-rm,arithmetic] [--configs whole:30,whole:8,tail:8,whole:0]
        [--max-new-tokens 96] [--chunk-tokens 16] [--work /tmp/srd-boundary] [--no-write]

The testbed's responses are short (about 30 generated tokens), so the paper's L_max = 30 (of ~500-token
responses) hardly binds; ``l_max`` 8 mimics the paper's ratio. Every reward runs one sweep
(``srd_worker.testbed.experiment.run_grid``, the ``srdq run --sweep`` runner) into --work; run ids are
deterministic, so an interrupted benchmark resumes. Per configuration: accuracy and mean generated tokens
with 95% intervals (bootstrap over problems, each with its seeds), refinements, ρ̂ (``reports.routing_row``),
editor tokens per refinement (the regenerated suffix: editor ``out_tokens`` from each record's
``ledger.components`` over the run's refinements) and the mean kept prefix j* per refinement (editor
``in_tokens`` per refinement minus the problem's prompt length: the editor is fed prompt + τ[:j*]), the
coupled Δ_n = R_max(SRD) − R_max(RS) per problem and seed (``testbed.coupled_cells``) and SRD − RS
accuracy, paired (McNemar). Writes the ``srd-boundary`` section of docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._doc import replace_section  # noqa: E402
from benchmarks.testbed import _f, _ints, _pooled, _pts, collect, coupled_cells, testbed_sweep  # noqa: E402

CONFIGS = "whole:30,whole:8,tail:8,whole:0,whole:8:3,tail:8:3"


def _configs(text: str) -> list[tuple[str, int, int | None]]:
    """``search:l_max[:m]`` items → (boundary_search, l_max, scoring_interval or None for the default)."""
    out = []
    for part in [x for x in text.split(",") if x.strip()]:
        search, cap, *m = part.strip().split(":")
        out.append((search, int(cap), int(m[0]) if m else None))
    return out


def sweep_for(
    reward: str,
    items: int,
    seeds: list[int],
    n: int,
    configs: list[tuple[str, int, int | None]],
    max_new: int,
    chunk: int,
) -> dict:
    """SRD at every (boundary_search, l_max, m) and rejection sampling (the no-editor baseline), all at N=n."""
    adaptive = {"max_new_tokens": max_new, "chunk_tokens": chunk}
    srd = [
        {
            "method": "srd",
            "n": n,
            "params": {
                **adaptive,
                "boundary_search": s,
                "l_max": cap,
                **({"scoring_interval": m} if m else {}),
            },
        }
        for s, cap, m in configs
    ]
    return testbed_sweep(
        reward, items, seeds, [{"method": "rejection_sampling", "n": n, "params": adaptive}, *srd]
    )


def label(spec: dict) -> str:
    p = spec.get("params") or {}
    if spec.get("method") != "srd":
        return f"{spec.get('method')} (θ {p.get('theta', 0.5)})"
    cap, m = int(p.get("l_max", 30)), int(p.get("scoring_interval", 10))
    return f"SRD {p.get('boundary_search', 'whole')}, L_max {cap or '∞ (0)'}" + (
        f", m {m}" if m != 10 else ""
    )


def prompt_lengths(task_name: str = "auto") -> dict[str, int]:
    """Each testbed problem's prompt length in the policy's tokens, built as the runner builds it (the
    task's chat messages through the policy tokenizer's chat template)."""
    from transformers import AutoTokenizer

    from srd_worker.datasets import resolve_dataset
    from srd_worker.engines.loading import TESTBED_DIR, TESTBED_MODELS
    from srd_worker.engines.transformers_engine import HFTokenizer
    from srd_worker.tasks.registry import load_items

    tok = HFTokenizer(AutoTokenizer.from_pretrained(TESTBED_DIR / TESTBED_MODELS["testbed"]))
    task, items = load_items(resolve_dataset("testbed"), task_name)
    return {str(item.id): len(tok.chat_prompt_ids(task.messages(item))) for item in items}


def editor_stats(runs: list, prompt_len: dict[str, int] | None) -> tuple[float | None, float | None]:
    """(editor out_tokens per refinement, mean kept prefix j* per refinement) pooled over the runs' records."""
    refs = out = prefix = 0
    for run in runs:
        for r in run.records:
            n_ref = int((r.get("extra") or {}).get("refinements") or 0)
            editor = (((r.get("ledger") or {}).get("components") or {}).get("editor")) or {}
            refs += n_ref
            out += int(editor.get("out_tokens", 0))
            if prompt_len is not None and n_ref:
                prefix += int(editor.get("in_tokens", 0)) - n_ref * prompt_len[str(r["item_id"])]
    if not refs:
        return None, None
    return out / refs, (prefix / refs if prompt_len is not None else None)


def _tokens_diff(a: list, b: list) -> str:
    """Mean generated tokens of A − B, paired by problem and seed (``stats.paired``), as table text."""
    from srd_worker.reports.rows import tokens_value
    from srd_worker.reports.stats import paired
    from srd_worker.testbed.experiment import _by_seed

    sa, sb = _by_seed(a), _by_seed(b)
    seeds = sorted(sa)
    items = [i for i in sa[seeds[0]] if all(i in sa[s] and i in sb.get(s, {}) for s in seeds)]
    d = paired(
        [[tokens_value(sa[s][i]) for s in seeds] for i in items],
        [[tokens_value(sb[s][i]) for s in seeds] for i in items],
    ).diff
    return f"{d.mean or 0:+.1f} [{d.low or 0:+.1f}, {d.high or 0:+.1f}]"


def analyse(runs: list, prompt_len: dict[str, int] | None) -> str:
    from srd_worker.reports.rows import paired_seed_groups, routing_row
    from srd_worker.testbed.experiment import interval_cells, run_rows

    groups: dict[str, list] = {}
    for r in runs:
        groups.setdefault(label(r.spec), []).append(r)
    rs_label = next(k for k in groups if not k.startswith("SRD"))
    rs = groups[rs_label]
    first = next(k for k in groups if k.startswith("SRD"))
    rows = {tuple(row.run_ids): row for row in run_rows(runs)}
    lines = [
        "| configuration | accuracy % [95% CI] | mean gen tokens [95% CI] | refinements | ρ̂ "
        "| editor tokens / refinement | kept prefix j* / refinement | Δ_n [95% CI] | wins / ties / losses "
        f"| SRD − RS accuracy [95% CI] | McNemar p | tokens − {first} (paired) [95% CI] |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, group in groups.items():
        row = rows[tuple(r.run_id for r in group)]
        acc, tok = interval_cells(row)
        if group is rs:
            lines.append(f"| {name} | {acc} | {tok} | – | – | – | – | – | – | – | – | – |")
            continue
        routing = routing_row(_pooled(group))
        per_ref, prefix = editor_stats(group, prompt_len)
        c = coupled_cells(group, rs)
        _, p, _ = paired_seed_groups(group, rs, metric="accuracy")
        lines.append(
            f"| {name} | {acc} | {tok} | {routing.refinements if routing else 0} "
            f"| {_f(routing.rho if routing else None)} | {_f(per_ref, 1)} | {_f(prefix, 1)} | {c['delta']} | {c['wtl']} "
            f"| {_pts(p.diff)} | {_f(p.mcnemar_p, 3)} | {'reference' if name == first else _tokens_diff(group, groups[first])} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=300)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--rewards", default="hf-orm:testbed-rm,arithmetic")
    ap.add_argument(
        "--configs",
        default=CONFIGS,
        help="SRD boundary_search:l_max[:m] items (l_max 0 = no cap; m = scoring_interval, default 10)",
    )
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--chunk-tokens", type=int, default=16)
    ap.add_argument("--work", default="/tmp/srd-boundary")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument(
        "--analyse-only",
        action="store_true",
        help="run nothing: collect the finished runs from the srdq.db files under --work",
    )
    args = ap.parse_args()

    import torch

    from srd_worker.settings import Settings
    from srd_worker.testbed.experiment import run_grid

    torch.set_num_threads(1)
    seeds, configs = _ints(args.seeds), _configs(args.configs)
    settings = Settings(device="cpu", batch_invariant=False)
    sections = []
    for reward in [x for x in args.rewards.split(",") if x]:
        sweep = sweep_for(reward, args.items, seeds, args.n, configs, args.max_new_tokens, args.chunk_tokens)
        out = Path(args.work) / reward.replace(":", "_")
        t0 = time.perf_counter()
        runs = (
            collect(sweep, [out], settings=settings)
            if args.analyse_only
            else run_grid(sweep, out, settings=settings)
        )
        wall = time.perf_counter() - t0
        table = analyse(runs, prompt_lengths(str(runs[0].spec.get("task", "auto"))))
        sections.append((reward, table, wall))
        print(f"\nreward {reward} ({wall / 60:.1f} min)\n{table}", flush=True)
    manifest = json.loads((ROOT / "srd_worker/testbed/artifacts/manifest.json").read_text())
    body = [
        f"The first {args.items} problems of the testbed's test split × seeds {', '.join(map(str, seeds))}; "
        f"policy `testbed` ({manifest['parameters']['policy']:,} parameters), N = {args.n}, max_new_tokens "
        f"{args.max_new_tokens}, Δ = chunk_tokens {args.chunk_tokens}, T 0.8 / top-p 0.9 / top-k 50, SRD "
        "defaults otherwise (θ_high 0.5, θ_low 0.3, m = scoring_interval 10 unless the row says m, N_refine 2, "
        "incremental form, lazy scoring); rejection sampling rank variant, θ 0.5; the engine with batch_invariant "
        "off, prefix KV reuse on (the default). Δ_n and "
        "SRD − RS are paired by problem and seed against the rejection-sampling run of the same seed.",
        "",
    ]
    for reward, table, wall in sections:
        when = (
            "collected from the stores"
            if args.analyse_only
            else f"wall time {wall / 60:.0f} min, runs finished earlier reused"
        )
        body += [f"**Reward `{reward}`** ({when}):", "", table, ""]
    body.append(
        f"Command: `.venv/bin/python benchmarks/srd_boundary.py --items {args.items} --seeds {args.seeds} "
        f"--n {args.n} --rewards {args.rewards} --configs {args.configs} --max-new-tokens "
        f"{args.max_new_tokens} --chunk-tokens {args.chunk_tokens}`"
    )
    text = "\n".join(body)
    if not args.no_write:
        replace_section(ROOT / "docs" / "PERFORMANCE.md", "srd-boundary", text)


if __name__ == "__main__":
    main()
