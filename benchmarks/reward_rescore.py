"""Rewards for real text compared on the same candidates: a finished Best-of-N run's stored candidates
re-scored by other rewards (no generation), then for each reward its AUROC for correct vs wrong responses
and the Best-of-k accuracy it would select, paired against the run's own reward.

    .venv/bin/python benchmarks/reward_rescore.py --store benchmarks/state/real_text/logprob \\
        --rewards arithmetic,judge:qwen2.5-coder-1.5b --items 50 [--run RUN_ID[,RUN_ID...]] [--work DIR]
        [--prefix-tokens 128,256 [--prefix-candidates 4] [--thetas 0.5,0.3]] [--section NAME] [--no-write]

Every candidate is scored as the methods score a finished response: the task's question and the whole
response text (cut-off ones included, as Best-of-N ranks them). A judge (``judge:MODEL``) runs on
``SRDQ_JUDGE_ENGINE`` (default transformers); a reward that reads the policy (``logprob``, ``lm_judge``)
gets an engine for the run's own model (``--engine``, default transformers). Scores go to
``--work/scores-<reward>.jsonl`` one problem per line as they are made, so an interrupted re-scoring
resumes where it stopped. ``--prefix-tokens`` adds when each reward can tell: the first C candidates of
each problem cut at those token counts and scored as SRD scores a partial response at a routing point
(cached apart, ``scores-<reward>-first<k>.jsonl``), against the finished responses' correctness
(``early_stats``). Writes the ``reward-rescore`` section of docs/PERFORMANCE.md (``--section``).
"""

from __future__ import annotations

import argparse
import copy
import functools
import gzip
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORK = "/tmp/srdq-reward-rescore"  # the score caches' default folder
sys.path.insert(0, str(ROOT))

from benchmarks._doc import replace_section  # noqa: E402
from benchmarks.real_text import (  # noqa: E402
    Group,
    _ints,
    by_problem,
    groups_auroc,
    reward_auroc,
    within_problem_order,
)
from benchmarks.testbed import _pts  # noqa: E402


def open_store(store: Path, scratch: Path) -> Path:
    """The SQLite file of ``store``: a ``srdq.db``, a folder holding one, a snapshot folder
    (``benchmarks/state/real_text/logprob``, rebuilt into ``scratch``) or an older gzipped single-file
    snapshot (``*.db.gz``, unpacked into ``scratch``)."""
    from benchmarks import _snapshot

    if _snapshot.is_snapshot(store):
        out = scratch / f"{store.name}.db"
        _snapshot.restore(store, out)
        return out
    if store.is_dir():
        store = store / "srdq.db"
    if not store.exists():
        raise SystemExit(f"--store {store}: no such file")
    if store.suffix == ".gz":
        out = scratch / store.name.removesuffix(".gz")
        with gzip.open(store, "rb") as src, out.open("wb") as dst:
            shutil.copyfileobj(src, dst)
        return out
    return store


def cache_file(work: Path, run_id: str, reward: str, suffix: str = "") -> Path:
    """The score cache of ``reward`` for the run ``run_id`` under ``work`` (one per run and reward, so adding
    a seed later reuses the others' scores); ``suffix`` names a variant (``-first128``: cut scores)."""
    return work / run_id / f"scores-{reward.replace(':', '_').replace('/', '_')}{suffix}.jsonl"


def finished_specs(db_file: Path) -> dict[str, dict[str, Any]]:
    """The spec of every finished run in the SQLite store ``db_file``, by run id (read-only)."""
    import sqlite3

    with sqlite3.connect(f"file:{db_file}?mode=ro", uri=True) as con:
        return {
            rid: json.loads(spec or "{}")
            for rid, spec in con.execute("select id, spec from run where status = 'done'")
        }


def load_runs(db_file: Path, run_ids: list[str]) -> list[Any]:
    """The finished Best-of-N runs ``run_ids`` (default: the store's only finished best_of_n run), one
    configuration over different seeds: the same method, N, reward, model and dataset (else refused)."""
    from srd_worker.reports.loading import load_report_runs
    from srd_worker.store.db import open_sqlite

    done = [(rid, spec.get("method")) for rid, spec in finished_specs(db_file).items()]
    if not run_ids:
        bon = [rid for rid, method in done if method == "best_of_n"]
        if len(bon) != 1:
            raise SystemExit(f"{db_file}: {len(bon)} finished best_of_n runs ({bon}); name one with --run")
        run_ids = bon
    missing = [r for r in run_ids if r not in {rid for rid, _ in done}]
    if missing:
        raise SystemExit(f"{db_file}: no finished run {missing[0]!r}; finished: {[rid for rid, _ in done]}")
    if len(set(run_ids)) != len(run_ids):
        raise SystemExit(f"--run {','.join(run_ids)}: a run is named twice")
    db = open_sqlite(db_file)  # a snapshot stored by an older srdq is brought to this schema
    try:
        runs = load_report_runs(db, run_ids)
    finally:
        db.dispose()
    check_seeded(runs)
    return runs


def check_seeded(runs: list[Any]) -> None:
    """Refuse runs that are not one configuration over different seeds (they could not be pooled)."""
    first = runs[0]
    for run in runs[1:]:
        for field in ("method", "params", "reward", "model", "engine", "dataset", "dataset_sha256", "task"):
            if run.spec.get(field) != first.spec.get(field):
                raise SystemExit(
                    f"--run: {run.run_id} and {first.run_id} differ in {field} "
                    f"({run.spec.get(field)!r} vs {first.spec.get(field)!r}); name runs of one configuration"
                )
    seeds = [r.spec.get("seed", 0) for r in runs]
    if len(set(seeds)) != len(seeds):
        raise SystemExit(f"--run: two runs share a seed ({seeds}); name one run per seed")


def scoreable(records: list[dict], items: int) -> list[dict]:
    """The first ``items`` records that have candidates and no error (dataset order)."""
    out = [r for r in records if not r.get("error") and r.get("candidates")]
    return out[:items]


def rescore(
    records: list[dict], make_reward: Callable[[], Any], cache: Path, *, progress: bool = True
) -> tuple[dict[str, dict[int, float]], float]:
    """``{item_id: {candidate id: score}}`` of every candidate of ``records`` under the reward that
    ``make_reward()`` builds and the seconds spent scoring them (this call and earlier ones, from ``cache``).
    Scores already in ``cache`` (one JSON line per problem) are reused, and the reward (a judge model, say)
    is built only when some problem has none; new ones are appended as each problem is scored."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    scores: dict[str, dict[int, float]] = {}
    spent_on: dict[str, float] = {}
    if cache.exists():
        lines = [x for x in cache.read_text(encoding="utf-8").splitlines() if x.strip()]
        for i, line in enumerate(lines):
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                if i < len(lines) - 1:
                    raise SystemExit(
                        f"{cache}: line {i + 1} is not JSON; move the file away to score anew"
                    ) from None
                # the last line, cut short by a kill mid-write: dropped, and its problem scored again
                cache.write_text("".join(x + "\n" for x in lines[:-1]), encoding="utf-8")
                break
            scores[row["item"]] = {int(k): float(v) for k, v in row["scores"].items()}
            spent_on[row["item"]] = float(row.get("s", 0.0))
    # the time spent on these records only: the cache may hold more problems than asked for
    seconds = sum(spent_on.get(r["item_id"], 0.0) for r in records)
    # a problem is scored again when its cached row lacks one of the candidates asked for (say, more of
    # them are asked for than were scored); its new line, read later, replaces the old one
    todo = [
        r for r in records if not all(int(c["id"]) in scores.get(r["item_id"], {}) for c in r["candidates"])
    ]
    if not todo:
        return scores, seconds
    reward = make_reward()
    cache.parent.mkdir(parents=True, exist_ok=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with cache.open("a", encoding="utf-8") as out, Progress(*columns, disable=not progress) as bar:
        task = bar.add_task(f"scoring with {reward.name}", total=len(todo))
        for rec in todo:
            cands = rec["candidates"]
            t0 = time.perf_counter()
            values = reward.score([rec["question"]] * len(cands), [c.get("text") or "" for c in cands])
            spent = time.perf_counter() - t0
            seconds += spent
            row = {int(c["id"]): float(v) for c, v in zip(cands, values, strict=True)}
            scores[rec["item_id"]] = row
            out.write(json.dumps({"item": rec["item_id"], "scores": row, "s": round(spent, 3)}) + "\n")
            out.flush()
            bar.advance(task)
    return scores, seconds


def with_scores(run: Any, records: list[dict], scores: dict[str, dict[int, float]] | None) -> Any:
    """A copy of ``run`` holding ``records`` whose candidates carry ``scores`` as their reward (``None``:
    the run's own rewards)."""
    from dataclasses import replace

    out = []
    for rec in records:
        rec = copy.deepcopy(rec)
        if scores is not None:
            row = scores[rec["item_id"]]
            for c in rec["candidates"]:
                c["reward"] = row[int(c["id"])]
        out.append(rec)
    return replace(run, records=out)


def _pct(ci: Any) -> str:
    return f"{100 * ci.mean:.1f} [{100 * ci.low:.1f}, {100 * ci.high:.1f}]"


def compare(runs: dict[str, list[Any]], base: str, ks: list[int]) -> dict[str, Any]:
    """Per reward (its copies of the seeds' runs): AUROC with its bootstrap interval, Best-of-k accuracy
    for each k, and Best-of-k − ``base``'s Best-of-k paired by problem (over the seeds); plus the
    reward-free rows (sampling, majority@k, pass@k)."""
    from srd_worker.reports.stats import Interval
    from srd_worker.testbed.experiment import kcurve_rows, paired_values

    rows = {
        name: {(r.method, r.n): r for r in kcurve_rows(seeded, [1, *ks], oracle=True)}
        for name, seeded in runs.items()
    }
    out: dict[str, Any] = {"rewards": {}}
    for name, seeded in runs.items():
        roc = reward_auroc(seeded)
        entry: dict[str, Any] = {"auroc": roc, "above": Interval(**roc["above"])}  # reward_auroc's order
        for k in ks:
            mine = rows[name][("best_of_n", k)]
            entry[f"best_of_{k}"] = mine.accuracy
            entry[f"paired_{k}"] = paired_values(mine.values or {}, rows[base][("best_of_n", k)].values or {})
        out["rewards"][name] = entry
    ref = rows[base]
    out["sampling"] = ref[("sampling", 1)].accuracy
    out["majority"] = {k: ref[("self_consistency", k)].accuracy for k in ks}
    out["pass"] = {k: ref[("pass@k", k)].accuracy for k in ks}
    return out


def table(out: dict[str, Any], base: str, ks: list[int], seconds: dict[str, float]) -> str:
    head = "| reward | AUROC correct vs wrong [95% CI] | right above wrong, same problem % [95% CI] | "
    head += " | ".join(f"Best-of-{k} % [95% CI]" for k in ks)
    head += " | " + " | ".join(f"Best-of-{k} − `{base}` [95% CI]" for k in ks) + " | scoring time |"
    lines = [head, "|---|---:|---:|" + "---:|" * (2 * len(ks)) + "---:|"]
    for name, e in out["rewards"].items():
        roc = e["auroc"]
        auc = "n/a" if roc["auroc"] is None else f"{roc['auroc']:.3f} [{roc['low']:.3f}, {roc['high']:.3f}]"
        cells = [_pct(e[f"best_of_{k}"]) for k in ks]
        diffs = []
        for k in ks:
            p = e[f"paired_{k}"]
            d = p.diff
            diffs.append("—" if name == base else f"{_pts(d)} ({p.wins} / {p.ties} / {p.losses})")
        spent = seconds.get(name)
        lines.append(
            f"| `{name}` | {auc} | {_pct(e['above'])} | {' | '.join(cells)} | {' | '.join(diffs)} | "
            + ("(the run's own)" if spent is None else f"{spent / 60:.1f} min")
            + " |"
        )
    refs = [
        ("one sample (no reward)", {k: out["sampling"] for k in ks}),
        ("majority vote (no reward)", out["majority"]),
        ("pass@k (some candidate right)", out["pass"]),
    ]
    for label, by_k in refs:
        lines.append(
            f"| {label} | — | — | " + " | ".join(_pct(by_k[k]) for k in ks) + " |" + " — |" * len(ks) + " — |"
        )
    return "\n".join(lines)


def cut_records(records: list[dict], tokenizer: Any, tokens: int, candidates: int) -> list[dict]:
    """The first ``candidates`` candidates (by id) of each record with each text cut to its first ``tokens``
    tokens under ``tokenizer`` (the policy's): what a reward sees at a routing point ``tokens`` tokens into
    the response. A candidate that finished before it keeps its whole text and is marked ``cut: False``
    (its score there is its final score). ``correct`` stays the finished response's."""
    out = []
    for rec in records:
        cands = []
        for c in sorted(rec["candidates"], key=lambda c: int(c["id"]))[:candidates]:
            text = c.get("text") or ""
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            cut = len(ids) > tokens
            cands.append(
                {
                    "id": int(c["id"]),
                    "text": tokenizer.decode(ids[:tokens]) if cut else text,
                    "cut": cut,
                    "correct": c.get("correct"),
                }
            )
        out.append({"item_id": rec["item_id"], "question": rec["question"], "candidates": cands})
    return out


def early_stats(groups: list[list[tuple[float, bool]]], thetas: tuple[float, float]) -> dict[str, Any]:
    """How well scores at one routing point foretell the finished responses' correctness, from ``groups``
    (one list of (score, finally right) per problem, candidates in id order): the pooled AUROC; per
    problem with right and wrong candidates, the share of (right, wrong) pairs in which the right one
    scores higher (ties half: what a rank router acts on); the share of tied pairs; and the share of the
    right candidates SRD's first routing (``RankRouter(θ_high, θ_low)``, ties broken by candidate id)
    would keep and discard, against the share of every candidate it keeps and discards (what a score
    unrelated to correctness would give). Intervals: bootstrap over problems."""
    from srd_worker.methods.routing import DISCARD, KEEP, RankRouter
    from srd_worker.reports.stats import bootstrap_ci

    router = RankRouter(*thetas)
    tied: list[float | None] = []
    kept: list[float | None] = []
    dropped: list[float | None] = []
    keep_all, drop_all = [], []
    for g in groups:
        scores = [s for s, _ in g]
        pairs = [(a, b) for i, a in enumerate(scores) for b in scores[i + 1 :]]
        tied.append(sum(a == b for a, b in pairs) / len(pairs) if pairs else None)
        tiers = router(scores)
        keep_all.append(tiers.count(KEEP) / len(tiers))
        drop_all.append(tiers.count(DISCARD) / len(tiers))
        right_tiers = [t for t, (_, y) in zip(tiers, g, strict=True) if y]
        kept.append(right_tiers.count(KEEP) / len(right_tiers) if right_tiers else None)
        dropped.append(right_tiers.count(DISCARD) / len(right_tiers) if right_tiers else None)

    def ci(values: list[float | None]) -> Any:  # over problems, a problem's seeds together
        return bootstrap_ci(by_problem(groups, values))

    return {
        "auroc": groups_auroc(groups),
        "above": within_problem_order(groups),
        "tied": ci(tied),
        "kept": ci(kept),
        "dropped": ci(dropped),
        "keep_share": sum(keep_all) / len(keep_all) if keep_all else None,
        "drop_share": sum(drop_all) / len(drop_all) if drop_all else None,
    }


def early_groups(
    cut: list[dict], prefix_scores: dict[str, dict[int, float]], final: dict[str, dict[int, float]]
) -> list[Group]:
    """(score, finally right) per candidate of each cut record: its prefix's score where it was cut, its
    final score (``final``) where it had finished before the cut; graded candidates only."""
    groups = []
    for rec in cut:
        g = Group(key=rec["item_id"])
        for c in rec["candidates"]:
            if c.get("correct") is None:
                continue
            cid = c["id"]
            g.append(
                (
                    prefix_scores[rec["item_id"]][cid] if c["cut"] else final[rec["item_id"]][cid],
                    bool(c["correct"]),
                )
            )
        if g:
            groups.append(g)
    return groups


def early_table(rows: list[tuple[str, str, int, int, dict[str, Any]]]) -> str:
    """The table of ``early_stats`` rows: (reward, where, cut candidates, candidates, stats)."""
    keep = next((st["keep_share"] for *_, st in rows if st["keep_share"] is not None), None)
    drop = next((st["drop_share"] for *_, st in rows if st["drop_share"] is not None), None)
    base_k = "" if keep is None else f" (all candidates: {100 * keep:.0f}%)"
    base_d = "" if drop is None else f" (all candidates: {100 * drop:.0f}%)"
    lines = [
        "| reward | scored at | cut / candidates | AUROC [95% CI] | right above wrong, same problem [95% CI] "
        f"| tied pairs % (a share: no interval) | right ones kept{base_k} [95% CI] "
        f"| right ones discarded{base_d} [95% CI] |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]

    def pct(ci: Any) -> str:
        return "n/a" if ci.mean is None else _pct(ci) if ci.low is not None else f"{100 * ci.mean:.1f}"

    def share(ci: Any) -> str:  # a mean of per-problem shares, not a 0/1 measure: the mean alone
        return "n/a" if ci.mean is None else f"{100 * ci.mean:.2f}"

    for name, where, n_cut, n, st in rows:
        roc = st["auroc"]
        auc = "n/a" if roc["auroc"] is None else f"{roc['auroc']:.3f} [{roc['low']:.3f}, {roc['high']:.3f}]"
        lines.append(
            f"| `{name}` | {where} | {n_cut} / {n} | {auc} | {pct(st['above'])} | {share(st['tied'])} | "
            f"{pct(st['kept'])} | {pct(st['dropped'])} |"
        )
    return "\n".join(lines)


def early_text(
    early: list[tuple[str, str, int, int, dict[str, Any]]],
    prefix: list[int],
    candidates: int,
    thetas: tuple[float, float],
) -> list[str]:
    """The paragraph and table of the early scores (nothing without ``--prefix-tokens``)."""
    if not early:
        return []
    cuts = ", ".join(str(k) for k in prefix)
    return [
        "",
        f"How early each reward tells: the first {candidates} candidates of each problem cut at {cuts} tokens "
        "(the policy's tokenizer; a candidate that finished before a cut is scored whole there) and scored as "
        "SRD scores a partial response at a routing point, against whether the finished response is right. "
        "*Right above wrong* is, per problem with right and wrong candidates, the share of (right, wrong) "
        "pairs the early score orders rightly (ties half), averaged over problems: what a rank router acts "
        f"on (0.5 is chance). *Kept / discarded*: SRD's first routing of these {candidates} "
        f"(rank-normalised, θ_high {thetas[0]}, θ_low {thetas[1]}, ties broken by candidate id) applied to the "
        "early scores, the share of the right candidates that would be kept / discarded, beside the share "
        "of all candidates (what a score blind to correctness gives). Intervals: bootstrap over problems.",
        "",
        early_table(early),
    ]


def _thetas(text: str) -> tuple[float, float]:
    """``θ_high,θ_low`` (default: SRD's own defaults), checked as SRD checks them."""
    from srd_worker.methods.srd_loop import SRDParams

    if not text.strip():
        defaults = SRDParams()
        return defaults.theta_high, defaults.theta_low
    try:
        high, low = (float(x) for x in text.split(","))
    except ValueError:
        raise SystemExit(f"--thetas {text!r}: give θ_high,θ_low, e.g. 0.5,0.3") from None
    if not 0 <= low <= high <= 1:
        raise SystemExit(f"--thetas {text!r}: need 0 <= θ_low <= θ_high <= 1")
    return high, low


def early_rows(
    seeded: list[Any],
    records: dict[str, list[dict]],
    finals: dict[str, dict[str, dict[str, dict[int, float]]]],
    prefix: list[int],
    candidates: int,
    thetas: tuple[float, float],
    make: Callable[[str], Any],
    cache: Callable[..., Path],
    settings: Any,
) -> list[tuple[str, str, int, int, dict[str, Any]]]:
    """For each reward of ``finals`` and each cut of ``prefix``: ``early_stats`` of the first ``candidates``
    candidates of every problem scored at that cut (cut prefixes scored by ``make(reward)``, cached per run
    in ``cache(run_id, reward, "-first<k>")``), then the same candidates' final scores."""
    from transformers import AutoTokenizer

    from srd_worker.engines.loading import resolve_model_path

    model = str(seeded[0].spec.get("model"))
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(model, settings.cache_dir))
    cut = {
        k: {r.run_id: cut_records(records[r.run_id], tokenizer, k, candidates) for r in seeded}
        for k in prefix
    }
    rows = []
    for name, by_run in finals.items():
        for k in prefix:
            groups: list[list[tuple[float, bool]]] = []
            n_cut = n = 0
            for r in seeded:
                recs = cut[k][r.run_id]
                todo = [{**rec, "candidates": [c for c in rec["candidates"] if c["cut"]]} for rec in recs]
                scores, _ = rescore(
                    [rec for rec in todo if rec["candidates"]],
                    functools.partial(make, name),
                    cache(r.run_id, name, f"-first{k}"),
                )
                groups += early_groups(recs, scores, by_run[r.run_id])
                n_cut += sum(c["cut"] for rec in recs for c in rec["candidates"])
                n += sum(len(rec["candidates"]) for rec in recs)
            rows.append((name, f"{k} tokens", n_cut, n, early_stats(groups, thetas)))
        groups = []
        for r in seeded:  # the same candidates scored whole: their final scores, cut or not
            groups += early_groups(cut[prefix[0]][r.run_id], by_run[r.run_id], by_run[r.run_id])
        rows.append((name, "the end (finished)", 0, n, early_stats(groups, thetas)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--store",
        required=True,
        help="srdq.db, a folder holding one, a snapshot folder (benchmarks/state/...) or a .db.gz",
    )
    ap.add_argument(
        "--run",
        default="",
        help="the finished best_of_n run, or several of one configuration over different seeds, "
        "comma-separated (pooled: problems × seeds); default: the store's only one",
    )
    ap.add_argument("--rewards", required=True, help="comma-separated reward names (srdq's --reward names)")
    ap.add_argument("--items", type=int, default=50, help="the first ITEMS problems of the run")
    ap.add_argument("--ks", default="4,8", help="Best-of-k sizes to compare (at most the run's N)")
    ap.add_argument("--engine", default="transformers", help="engine for a reward that reads the policy")
    ap.add_argument("--work", default=WORK, help="score caches (resume)")
    ap.add_argument(
        "--prefix-tokens",
        default="",
        help="also score each candidate cut at these token counts (comma-separated, e.g. 128,256: SRD's "
        "routing points at chunk 128) and say how well those early scores foretell the final correctness",
    )
    ap.add_argument(
        "--prefix-candidates",
        type=int,
        default=4,
        help="the first C candidates of each problem are cut and scored (a pool of N = C, as SRD's first "
        "routing at N = C sees it)",
    )
    ap.add_argument(
        "--thetas",
        default="",
        help="θ_high,θ_low of the rank routing emulated on the early scores (default: SRD's defaults)",
    )
    ap.add_argument("--section", default="reward-rescore")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    from srd_worker.errors import SrdqError
    from srd_worker.local import close_all
    from srd_worker.rewards.registry import (
        JUDGE_KINDS,
        REWARDS,
        build_reward,
        check_reward_name,
        close_rewards,
    )
    from srd_worker.settings import Settings

    names = [x for x in args.rewards.split(",") if x.strip()]
    try:
        for name in names:
            check_reward_name(name)
    except SrdqError as exc:
        raise SystemExit(f"--rewards: {exc}") from None
    ks = [int(k) for k in args.ks.split(",") if k.strip()]
    try:
        prefix = _ints(args.prefix_tokens)
    except ValueError:
        raise SystemExit(f"--prefix-tokens {args.prefix_tokens!r}: give token counts, e.g. 128,256") from None
    if any(k < 1 for k in prefix) or args.prefix_candidates < 2:
        raise SystemExit("--prefix-tokens must be positive and --prefix-candidates at least 2")
    thetas = _thetas(args.thetas)
    with tempfile.TemporaryDirectory() as scratch:
        seeded = load_runs(open_store(Path(args.store), Path(scratch)), [x for x in args.run.split(",") if x])
    run = seeded[0]
    n = run.budget or 0
    if not ks or min(ks) < 2 or max(ks) > n:
        raise SystemExit(f"--ks {args.ks}: each k must be in 2..{n} (the run's N)")
    records = {r.run_id: scoreable(r.records, args.items) for r in seeded}
    for r in seeded:
        if len(records[r.run_id]) < args.items:
            raise SystemExit(
                f"{r.run_id} has {len(records[r.run_id])} scoreable problems, fewer than --items {args.items}"
            )
    base = str(run.spec.get("reward"))
    settings = Settings(device="cpu")
    policy = None
    runs = {base: [with_scores(r, records[r.run_id], None) for r in seeded]}
    seconds: dict[str, float] = {}
    # each reward's final scores by run: {item: {candidate id: score}} (the base reward's are stored)
    finals: dict[str, dict[str, dict[str, dict[int, float]]]] = {
        base: {
            r.run_id: {
                rec["item_id"]: {int(c["id"]): float(c["reward"]) for c in rec["candidates"]}
                for rec in records[r.run_id]
            }
            for r in seeded
        }
    }
    early: list[tuple[str, str, int, int, dict[str, Any]]] = []
    if "none" in names:
        raise SystemExit("--rewards: 'none' gives no scores")

    def make(name: str) -> Any:
        nonlocal policy
        if name in REWARDS and policy is None and name != "arithmetic":  # it reads the policy
            from srd_worker.engines.registry import build_engine

            policy = build_engine(args.engine, str(run.spec.get("model")), settings)
        return build_reward(name, policy, settings=settings)

    cache = functools.partial(cache_file, Path(args.work))

    try:
        for name in names:
            if name == base:
                continue  # the run's own scores are in the store
            runs[name] = []
            seconds[name] = 0.0
            finals[name] = {}
            for r in seeded:
                scores, spent = rescore(
                    records[r.run_id], functools.partial(make, name), cache(r.run_id, name)
                )
                seconds[name] += spent
                finals[name][r.run_id] = scores
                runs[name].append(with_scores(r, records[r.run_id], scores))
        if prefix:
            early = early_rows(
                seeded, records, finals, prefix, args.prefix_candidates, thetas, make, cache, settings
            )
    finally:
        close_rewards()
        close_all([policy] if policy is not None else [])
    out = compare(runs, base, ks)
    n_cands = sum(len(rec["candidates"]) for recs in records.values() for rec in recs)
    ids = ", ".join(f"`{r.run_id}`" for r in seeded)
    seed_list = ", ".join(str(r.spec.get("seed", 0)) for r in seeded)
    judged = any(name.partition(":")[0] in JUDGE_KINDS for name in names)
    judge_env = (
        f"SRDQ_JUDGE_ENGINE={settings.judge_engine} "
        if judged and settings.judge_engine != "transformers"
        else ""
    )
    # vLLM lives in its own virtualenv (make .venv-vllm/.installed), so a judge served by it runs from there
    served = (settings.judge_engine if judged else "", args.engine)
    python = ".venv-vllm/bin/python" if "vllm" in served else ".venv/bin/python"
    work_arg = "" if args.work == WORK else f" --work {args.work}"  # where the score cache is kept
    if args.section != "reward-rescore":
        work_arg += f" --section {args.section}"
    early_args = ""
    if prefix:
        early_args = f" --prefix-tokens {args.prefix_tokens} --prefix-candidates {args.prefix_candidates}"
        early_args += f" --thetas {args.thetas}" if args.thetas else ""
        early_args += f" --engine {args.engine}" if args.engine != "transformers" else ""
    text = "\n".join(
        [
            f"The candidates of {ids} ({run.spec.get('method')} N = {n}, reward `{base}`, model "
            f"`{run.spec.get('model')}`, {run.spec.get('dataset')}), the first {args.items} problems × "
            f"{len(seeded)} seed{'s' if len(seeded) > 1 else ''} ({n_cands} responses, seed"
            f"{'s' if len(seeded) > 1 else ''} {seed_list}), re-scored by each reward; Best-of-k is exact over "
            "the k-subsets of each problem's candidates, intervals are bootstraps over problems (a "
            "problem with all its seeds), differences are paired by problem over the seeds (wins / ties / "
            "losses count problem-seeds). *Right above wrong*: per problem-seed with right and wrong "
            "candidates, the share of (right, wrong) pairs the reward orders rightly (ties half), averaged: the order within "
            "a problem, which is all Best-of-N uses (the AUROC also asks scores to compare across problems). "
            "Scoring time on the shared 2-core machine.",
            "",
            table(out, base, ks, seconds),
            *early_text(early, prefix, args.prefix_candidates, thetas),
            "",
            f"Command: `{judge_env}{python} benchmarks/reward_rescore.py --store {args.store} "
            f"--run {','.join(r.run_id for r in seeded)} --rewards {args.rewards} --items {args.items} --ks {args.ks}"
            f"{work_arg}{early_args}`",
        ]
    )
    print(text, flush=True)
    if not args.no_write:
        replace_section(ROOT / "docs" / "PERFORMANCE.md", args.section, text)


if __name__ == "__main__":
    main()
