"""Decoding methods on real text: GSM8K with Qwen2.5-Coder-0.5B-Instruct (``make install-qwen``) on vLLM's
CPU build (``--dataset math500`` for MATH500, the paper's Tables 2, 6 and 7 setting at N = 10), for each reward that exists without a trained RM: the policy's own mean-token-logprob confidence
(``logprob``), a judge that is another model (``judge:qwen2.5-coder-1.5b``), the rule-based ``arithmetic``.

    .venv-vllm/bin/python benchmarks/real_text.py [--items 200] [--seeds 0,1] [--budgets 4,8]
        [--rewards logprob,judge:qwen2.5-coder-1.5b] [--model qwen2.5-coder-0.5b] [--engine vllm]
        [--max-new-tokens 512] [--chunk-tokens 128] [--work /tmp/srdq-real-text] [--methods M,...]
        [--analyse-only [FOLDER...]] [--no-write] [--state DIR [--save-state]]
        [--pool-from STORE [--pool-scores DIR]] [--search-n 8 [--search-reward R [--search-aggregation A]]]

Per reward, one sweep (``srd_worker.testbed.experiment.run_grid``: the ``srdq run --sweep`` runner, so an
interrupted benchmark resumes where it stopped, shard by shard) of ``best_of_n`` at the largest N (its
seeded candidates give sampling, Best-of-k, self-consistency = majority@k, weighted Best-of-k (the
reward-weighted majority@k, when no reward is negative) and pass@k for every k ≤ N, ``kcurves``), and ``rejection_sampling`` (rank variant, θ = SRD's θ_high), ``speculative_rejection`` and
``srd`` at every N (with ``--pool-from``, Best-of-N is another grid's, re-scored by this reward:
``rescored_pool``). The tables are those of ``benchmarks/testbed.py`` (accuracy and mean generated tokens
with bootstrap intervals over problems (each with its seeds); SRD's routing statistics with ρ̂ and the
gain formula; coupled SRD vs rejection sampling; SRD − Best-of-N, self-consistency − Best-of-N,
weighted Best-of-N − Best-of-N and SRD − weighted Best-of-N paired), plus the reward's AUROC for correct vs wrong finished responses, over Best-of-N's candidates
(an interval from a bootstrap over problems); with ``--search-n``, beam search and DVTS paired against
Best-of-N and SRD at the same N, and what their final candidates hold beside Best-of-N's (distinct
answers, some candidate right, a vote over them); ``--search-reward`` gives the searches a process reward
of their own (``judge-step:MODEL``: a second sweep whose runs go into the grid's store). Writes docs/real_text_<slug>.png and the
``real-text-<slug>`` section of docs/PERFORMANCE.md (``--tag T``: ``<slug>_T``).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._doc import replace_section  # noqa: E402
from benchmarks.testbed import _f, _pts, analyse, collect  # noqa: E402

#: the step-level searches (``--search-n``), which may score with a reward of their own (``--search-reward``)
SEARCH = ("beam_search", "dvts")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def real_sweep(
    *,
    reward: str,
    dataset: str = "gsm8k",
    model: str,
    engine: str,
    items: int,
    seeds: list[int],
    budgets: list[int],
    max_new: int,
    chunk: int,
    shard_size: int = 16,
    pool_n: int | None = None,
    search_n: list[int] | None = None,
    aggregation: str | None = None,
) -> dict:
    """The grid's sweep. ``search_n`` adds step-level beam search and DVTS at those N (M = 4, a step ends at
    a blank line or after ``chunk`` tokens); left out by default, so an earlier grid's sweep is unchanged.
    ``aggregation``: the searches' step-score aggregation where it is not the method's default (``last``;
    left out of the parameters otherwise, so their run ids stay those of the earlier grids)."""
    adaptive: dict[str, Any] = {"max_new_tokens": max_new, "chunk_tokens": chunk}
    step: dict[str, Any] = {"beam_width": 4} | ({"aggregation": aggregation} if aggregation else {})
    search: list[dict[str, Any]] = (
        [{"method": m, "n": search_n, "params": {**adaptive, **step}} for m in SEARCH] if search_n else []
    )
    return {
        "dataset": dataset,
        "model": model,
        "engine": engine,
        "reward": reward,
        "limit": items,
        "shard_size": shard_size,  # a crash loses at most the shard in progress
        "seeds": seeds,
        "methods": [
            {"method": "best_of_n", "n": pool_n or max(budgets), "params": {"max_new_tokens": max_new}},
            {"method": "srd", "n": budgets, "params": adaptive},
            {"method": "rejection_sampling", "n": budgets, "params": adaptive},
            {"method": "speculative_rejection", "n": budgets, "params": adaptive},
            *search,
        ],
    }


def state_file(work: Path, state: Path) -> Path:
    """Where the snapshot of the store in ``work`` lives under ``state``: the folder ``state/<work name>/``
    (``benchmarks/_snapshot.py``: one file per run, so a save adds only what changed to git)."""
    return state / work.name


def save_state(work: Path, state: Path) -> Path | None:
    """Snapshot the grid's store ``work/srdq.db`` into ``state/<work name>/`` (safe while a run writes to
    it: one read transaction); None without a store. The store is what the runner resumes from (finished
    shards, checkpoints), so a new machine carries a long grid on from the copy (``restore_state``). The
    single-file snapshot of earlier versions (``state/<work name>.db.gz``) is removed once replaced."""
    from benchmarks import _snapshot

    db = work / "srdq.db"
    if not db.is_file():
        return None
    out = state_file(work, state)
    counts = _snapshot.save(db, out)
    out.with_name(out.name + ".db.gz").unlink(missing_ok=True)
    print(
        f"{out}: {counts['written']} files written, {counts['unchanged']} unchanged, {counts['removed']} removed"
    )
    return out


def restore_state(work: Path, state: Path) -> Path | None:
    """Rebuild ``work/srdq.db`` from ``state/<work name>/`` (or an earlier version's single-file snapshot
    ``state/<work name>.db.gz``) when ``work`` has no store yet (never over one: the store in ``work`` is
    newer); the snapshot it read, or None."""
    import gzip
    import shutil

    from benchmarks import _snapshot

    folder = state_file(work, state)
    if (work / "srdq.db").exists():
        return None
    if _snapshot.is_snapshot(folder):
        _snapshot.restore(folder, work / "srdq.db")
        return folder
    legacy = folder.with_name(folder.name + ".db.gz")
    if not legacy.is_file():
        return None
    work.mkdir(parents=True, exist_ok=True)
    part = work / "srdq.db.part"
    with gzip.open(legacy, "rb") as f, part.open("wb") as dst:
        shutil.copyfileobj(f, dst)
    part.replace(work / "srdq.db")
    return legacy


def auroc(scores: list[float], labels: list[bool]) -> float | None:
    """P(score of a correct response > score of a wrong one), ties counted half; None without both."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    if not pos or not neg:
        return None
    ranked = sorted((s, i) for i, s in enumerate(scores))
    ranks = [0.0] * len(scores)
    k = 0
    while k < len(ranked):  # average ranks over ties
        j = k
        while j + 1 < len(ranked) and ranked[j + 1][0] == ranked[k][0]:
            j += 1
        for m in range(k, j + 1):
            ranks[ranked[m][1]] = (k + j) / 2 + 1
        k = j + 1
    r_pos = sum(r for r, y in zip(ranks, labels, strict=True) if y)
    return (r_pos - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg))


class Group(list[tuple[float, bool]]):
    """One problem-seed's (score, right) pairs; ``key`` names the problem (its item id), so the intervals
    resample problems with all their seeds together (``clusters``)."""

    def __init__(self, pairs: Any = (), key: Any = None) -> None:
        super().__init__(pairs)
        self.key = key


def clusters(groups: Sequence[list[tuple[float, bool]]]) -> list[list[int]]:
    """The indices of ``groups`` by problem (a ``Group``'s ``key``; any other list is a problem of its
    own), in first-seen order: the units a bootstrap over problems resamples."""
    out: dict[Any, list[int]] = {}
    for i, g in enumerate(groups):
        key = getattr(g, "key", None)
        out.setdefault(("problem", key) if key is not None else ("group", i), []).append(i)
    return list(out.values())


def by_problem(
    groups: Sequence[list[tuple[float, bool]]], values: list[float | None]
) -> list[list[float | None]]:
    """``values`` (one per group) as a problems × seeds matrix for ``stats.bootstrap_ci``: a row per
    problem (``clusters``), None where a problem has fewer groups or a group no value."""
    rows = [[values[i] for i in c] for c in clusters(groups)]
    width = max((len(r) for r in rows), default=0)
    return [r + [None] * (width - len(r)) for r in rows]


def problem_groups(runs: list) -> list[Group]:
    """(reward, right) of the graded candidates of every problem of ``runs`` (one ``Group`` per
    problem-seed, keyed by the item id)."""
    groups = []
    for run in runs:
        for rec in run.records:
            g = Group(
                (
                    (float(c["reward"]), bool(c["correct"]))
                    for c in rec.get("candidates") or []
                    if c.get("reward") is not None and c.get("correct") is not None
                ),
                key=rec.get("item_id"),
            )
            if g:
                groups.append(g)
    return groups


def reward_auroc(bon_runs: list, *, resamples: int = 1000, seed: int = 0) -> dict:
    """AUROC of the reward over Best-of-N's finished, graded candidates (``groups_auroc``), and under
    ``"above"`` the order within a problem (``within_problem_order``)."""
    groups = problem_groups(bon_runs)
    above = within_problem_order(groups).to_dict()
    return {**groups_auroc(groups, resamples=resamples, seed=seed), "above": above}


def right_above_wrong(group: list[tuple[float, bool]]) -> float | None:
    """The share of one problem's (right, wrong) candidate pairs whose right one scores higher, ties half;
    None without both. What Best-of-N and a rank router act on: an order within the problem."""
    right = [s for s, y in group if y]
    wrong = [s for s, y in group if not y]
    if not right or not wrong:
        return None
    return sum((r > w) + 0.5 * (r == w) for r in right for w in wrong) / (len(right) * len(wrong))


def within_problem_order(groups: Sequence[list[tuple[float, bool]]]) -> Any:
    """``right_above_wrong`` averaged over the problems with right and wrong candidates, with its bootstrap
    interval over problems (a ``reports.stats.Interval``; ``problems`` counts those problems). Chance is 0.5: what Best-of-N and a rank router act on, where the pooled
    AUROC also compares candidates across problems."""
    from srd_worker.reports.stats import bootstrap_ci

    return bootstrap_ci(by_problem(groups, [right_above_wrong(g) for g in groups]))  # all-None rows: left out


def groups_auroc(groups: Sequence[list[tuple[float, bool]]], *, resamples: int = 1000, seed: int = 0) -> dict:
    """AUROC of (score, right) pairs grouped by problem, with a 95% percentile interval from resampling
    problems (a problem's candidates stay together, those of all its seeds: they share a question)."""
    flat = [c for g in groups for c in g]
    point = auroc([s for s, _ in flat], [y for _, y in flat])
    units = [[c for i in unit for c in groups[i]] for unit in clusters(groups)]
    rng = random.Random(seed)
    draws = []
    for _ in range(resamples if point is not None else 0):
        sample = [c for _ in units for c in units[rng.randrange(len(units))]]
        a = auroc([s for s, _ in sample], [y for _, y in sample])
        if a is not None:
            draws.append(a)
    draws.sort()
    low = draws[int(0.025 * len(draws))] if draws else None
    high = draws[min(len(draws) - 1, int(0.975 * len(draws)))] if draws else None
    return {
        "auroc": point,
        "low": low,
        "high": high,
        "responses": len(flat),
        "correct": sum(y for _, y in flat),
        "problems": len(units),
    }


def order_text(above: dict) -> str:
    """The reward line's within-problem clause (``within_problem_order``'s dict): a right candidate above a
    wrong one of the same problem."""
    if above["mean"] is None:
        return ""
    ci = f" [{100 * above['low']:.1f}, {100 * above['high']:.1f}]" if above["low"] is not None else ""
    seeds = f", over {above['seeds']} seeds" if above.get("seeds", 1) > 1 else ""
    return (
        f"; a right candidate above a wrong one of the same problem in **{100 * above['mean']:.1f}%**{ci} of "
        f"pairs (chance 50%; the {above['problems']} problems with both{seeds})"
    )


def cutoff_text(bon_runs: list) -> str | None:
    """Best-of-N's candidates cut at the token cap (``finish`` "length": no end of sequence, so as a rule
    no answer): how many, their mean reward beside the ended ones', how often Best-of-N's pick (``kcurves.best_index``:
    the highest reward, the first on a tie) was one, and Best-of-N ranking only the ended candidates (all of them
    where none ended) paired with it by problem and seed. None when no scored candidate was cut."""
    from srd_worker.reports.kcurves import best_index
    from srd_worker.reports.stats import bootstrap_ci
    from srd_worker.testbed.experiment import paired_values

    cut_rewards: list[float] = []
    ended_rewards: list[float] = []
    picked_cut = cells = 0
    argmax: dict[str, dict[int, float | None]] = {}
    ended_only: dict[str, dict[int, float | None]] = {}
    for run in bon_runs:
        seed = _seed(run)
        for rec in run.records:
            cands = [
                c
                for c in rec.get("candidates") or []
                if c.get("reward") is not None and c.get("correct") is not None and c.get("finish")
            ]
            if not cands:
                continue
            cells += 1
            for c in cands:
                (cut_rewards if c["finish"] == "length" else ended_rewards).append(float(c["reward"]))
            every = range(len(cands))
            best = cands[best_index(cands, every)]  # Best-of-k's rule: ties to the lowest index
            ended = [i for i in every if cands[i]["finish"] != "length"] or every
            best_ended = cands[best_index(cands, ended)]
            picked_cut += best["finish"] == "length"
            key = str(rec.get("item_id"))
            argmax.setdefault(key, {})[seed] = float(bool(best["correct"]))
            ended_only.setdefault(key, {})[seed] = float(bool(best_ended["correct"]))
    if not cut_rewards:
        return None
    seeds = sorted({s for v in argmax.values() for s in v})

    def acc(values: dict[str, dict[int, float | None]]) -> str:  # "12.0% [5.0, 20.0]"
        ci = bootstrap_ci([[v.get(s) for s in seeds] for v in values.values()])
        interval = "" if ci.low is None or ci.high is None else f" [{100 * ci.low:.1f}, {100 * ci.high:.1f}]"
        return f"{100 * (ci.mean or 0.0):.1f}%{interval}"

    p = paired_values(ended_only, argmax)
    mean_ended = sum(ended_rewards) / len(ended_rewards) if ended_rewards else None
    mcnemar = "" if p.mcnemar_p is None else f", McNemar p {p.mcnemar_p:.3f}"
    return (
        f"Candidates cut at the `max_new_tokens` cap (no end of sequence, so as a rule no answer): "
        f"**{len(cut_rewards)} of {len(cut_rewards) + len(ended_rewards)}**, mean reward "
        f"{_f(sum(cut_rewards) / len(cut_rewards))} against {_f(mean_ended)} for those that ended; "
        f"Best-of-N's pick was one of them in **{picked_cut} of {cells}** problem-seeds. Ranking only the "
        f"candidates that ended (all of them where none did): {acc(ended_only)} against {acc(argmax)} "
        f"(paired {_pts(p.diff)}, {p.wins} / {p.ties} / {p.losses}{mcnemar})."
    )


def analyse_pool(bon_runs: list, budgets: list[int]) -> dict:
    """The tables a Best-of-N run gives alone (no adaptive method in the grid): sampling, Best-of-k,
    self-consistency = majority@k and pass@k for every k, with self-consistency − Best-of-N and
    Best-of-N − sampling paired."""
    from srd_worker.testbed.experiment import kcurve_rows, markdown, paired_values

    ks = sorted({1, *budgets})
    rows = kcurve_rows(bon_runs, ks, oracle=True, weighted=True)
    by = {(r.method, r.n): r for r in rows}
    paired = [
        "| N | self-consistency − Best-of-N [95% CI] | wins / ties / losses | Best-of-N − sampling [95% CI] "
        "| weighted Best-of-N − Best-of-N [95% CI] |",
        "|---:|---:|---:|---:|---:|",
    ]
    for n in ks[1:]:
        sc = paired_values(by[("self_consistency", n)].values or {}, by[("best_of_n", n)].values or {})
        bo = paired_values(by[("best_of_n", n)].values or {}, by[("sampling", 1)].values or {})
        w = by.get(("weighted_best_of_n", n))  # none when a reward is negative
        wb = _pts(paired_values(w.values or {}, by[("best_of_n", n)].values or {}).diff) if w else "n/a"
        paired.append(
            f"| {n} | {_pts(sc.diff)} | {sc.wins} / {sc.ties} / {sc.losses} | {_pts(bo.diff)} | {wb} |"
        )
    return {"rows": [r.to_dict() for r in rows], "table": markdown(rows), "paired": "\n".join(paired)}


def adaptive_text(out: dict, *, rs_missing: str | None) -> list[str]:
    """The method table, routing, coupled and paired sections of a grid with SRD (``analyse``);
    ``rs_missing``: why the grid has no rejection-sampling run (then no coupled table), else None."""
    coupled = (
        [f"Rejection sampling {rs_missing}: no coupled comparison."]
        if rs_missing
        else [
            "Coupled SRD vs rejection sampling from identical seeded drafts (paper Table 7 layout):",
            "",
            out["coupled"],
        ]
    )
    return [
        out["table"],
        "",
        "SRD's routing statistics (pooled over routing events and seeds; paper Table 6 layout) and the "
        "paper's gain formula beside what was measured against rejection sampling at the same N:",
        "",
        out["routing"],
        "",
        *coupled,
        "",
        "SRD against Best-of-N at the same N, paired by problem and seed, and self-consistency against "
        "Best-of-N (the same candidates, voted or ranked by the reward):",
        "",
        out["paired"],
        "",
        *(
            [
                "SRD, rejection sampling and Speculative Rejection answering by the weighted vote "
                "(`--set answer=weighted_majority`): each record re-answered from its own answer pool (SRD's "
                "and rejection sampling's kept candidates, Speculative Rejection's finished survivors), their "
                "rewards and vote classes (the draws and the routing do not depend on the answer rule, so "
                "this is what that run would answer), paired with the runs' argmax and with weighted "
                "Best-of-N at the same N:",
                "",
                out["revote"],
                "",
            ]
            if out.get("revote")
            else []
        ),
    ]


def _seed(run: Any) -> int:
    return int(run.spec.get("seed", 0))


def _runs_on(runs: list, method: str, budget: int, seeds: set[int]) -> list:
    """The runs of ``method`` at ``budget`` on ``seeds`` (the seeds a search run has)."""
    return [r for r in runs if r.method == method and r.budget == budget and _seed(r) in seeds]


def search_paired(runs: list, pool_n: int) -> str | None:
    """Step-level search (beam search, DVTS) against Best-of-N at the same N (the k-curve of the Best-of-
    ``pool_n`` run) and against SRD at the same N where the grid has it, paired by problem over the seeds
    the search run has (the others are left out of the pairing); tokens as ratios of mean generated tokens.
    None without a search run."""
    from srd_worker.testbed.experiment import correctness, kcurve_rows, paired_values, run_rows

    search = [r for r in runs if r.method in SEARCH]
    if not search:
        return None
    lines = [
        "| method | N | problems × seeds | − Best-of-N [95% CI] | wins / ties / losses | McNemar p "
        "| tokens / Best-of-N's | − SRD [95% CI], McNemar p | tokens / SRD's |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in run_rows(search):
        group = [r for r in search if r.run_id in row.run_ids]
        seeds = {_seed(r) for r in group}
        mine = correctness(group)
        bon = _runs_on(runs, "best_of_n", pool_n, seeds)
        ref = next((k for k in kcurve_rows(bon, [row.n]) if k.method == "best_of_n"), None) if bon else None
        cells = ["n/a", "–", "n/a", "n/a"]
        if ref is not None and len(bon) == len(seeds):
            p = paired_values(mine, ref.values or {})
            ratio = row.tokens.mean / ref.tokens.mean if row.tokens.mean and ref.tokens.mean else None
            cells = [_pts(p.diff), f"{p.wins} / {p.ties} / {p.losses}", _f(p.mcnemar_p), _f(ratio, 2)]
        srd = _runs_on(runs, "srd", row.n, seeds)
        vs_srd = ["n/a", "n/a"]
        if srd and len(srd) == len(seeds):
            s_row = run_rows(srd)[0]
            ratio = row.tokens.mean / s_row.tokens.mean if row.tokens.mean and s_row.tokens.mean else None
            p = paired_values(mine, correctness(srd))
            vs_srd = [f"{_pts(p.diff)}, p {_f(p.mcnemar_p)}", _f(ratio, 2)]
        lines.append(
            f"| {row.method} | {row.n} | {row.accuracy.problems} × {row.accuracy.seeds} | "
            + " | ".join(cells + vs_srd)
            + " |"
        )
    return "\n".join(lines)


def candidate_spread(runs: list, pool_n: int) -> str | None:
    """What each search run's final candidates hold against Best-of-``pool_n``'s independent samples, on
    the seeds the search ran: distinct extracted answers per problem, the share of problems where some
    candidate is right (the ceiling of any selector over them), and a majority vote over them (ties as
    ``reports.kcurves.vote_at_k`` breaks them); each share with its 95% interval over problems and seeds.
    None without a search run."""
    from srd_worker.reports.kcurves import usable, vote_at_k
    from srd_worker.reports.stats import bootstrap_ci

    search = [r for r in runs if r.method in SEARCH]
    if not search:
        return None
    seeds = {_seed(r) for r in search}
    keys = dict.fromkeys([("best_of_n", pool_n), *((r.method, int(r.budget)) for r in search)])
    groups = {(m, n): group for m, n in keys if (group := _runs_on(runs, m, n, seeds))}

    def share(matrix: list[list[float | None]]) -> str:
        ci = bootstrap_ci(matrix)
        if ci.mean is None or ci.low is None or ci.high is None:
            return "n/a"
        return f"{100 * ci.mean:.1f} [{100 * ci.low:.1f}, {100 * ci.high:.1f}]"

    lines = [
        "| method | N | problems × seeds | distinct answers per problem | some candidate right % [95% CI] "
        "| majority vote over them % [95% CI] |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for (method, n), group in groups.items():
        group.sort(key=_seed)
        by_seed = [{str(rec["item_id"]): usable(rec) for rec in r.records} for r in group]
        items = [i for i in by_seed[0] if all(i in b for b in by_seed)]
        right: list[list[float | None]] = []
        vote: list[list[float | None]] = []
        distinct: list[int] = []
        for i in items:
            right.append([])
            vote.append([])
            for b in by_seed:
                cs = b[i]
                right[-1].append(None if not cs else float(any(c.get("correct") for c in cs)))
                vote[-1].append(None if not cs else vote_at_k(cs, len(cs)))
                if cs:
                    distinct.append(len({c.get("answer") for c in cs if c.get("answer")}))
        if not distinct:
            continue
        lines.append(
            f"| {method} | {n} | {len(items)} × {len(group)} | {sum(distinct) / len(distinct):.2f} "
            f"| {share(right)} | {share(vote)} |"
        )
    return "\n".join(lines)


def hosts_text(runs: list) -> str:
    """Which machines made the runs, from their runtime records' ``host`` (``srd_worker.provenance``): the
    same seed samples other text on a machine whose CPU kernels differ, so a grid carried between kinds of
    machine says so. Runs recorded before srdq kept the host are counted as such."""
    from srd_worker.provenance import summary

    unknown = "not recorded (made before srdq kept it)"  # a record without a host: that part of the run
    by_host: dict[str, list[str]] = {}
    for run in runs:
        if run.spec.get("rescored_from"):  # made in another grid, named there
            continue
        rows = summary(getattr(run, "versions", None) or {})
        for host in sorted({row["host"] or unknown for row in rows} or {unknown}):
            by_host.setdefault(host, []).append(f"{run.method} seed {_seed(run)}")
    if not by_host:
        return ""
    return (
        "Machines (each run's runtime records; a run resumed on another kind of machine counts under each): "
        + "; ".join(
            f"{host}: {len(names)} run{'s' if len(names) != 1 else ''}"
            + (f" ({', '.join(names)})" if len(by_host) > 1 else "")
            for host, names in sorted(by_host.items())
        )
        + "."
    )


def component_text(runs: list) -> list[str]:
    """Per-problem component costs of each run (paper Table 2 layout: time / calls per component, input and
    output tokens), from the compute ledger every record carries."""
    from srd_worker.reports.builder import REWARD_CALLS_NOTE
    from srd_worker.reports.rows import component_row
    from srd_worker.reports.tables import component_table, component_tokens_table, reward_calls_table_data

    rows = [row for row in (component_row(r) for r in runs) if row is not None]
    if not rows:
        return []
    text = [
        "Component costs per problem (paper Table 2 layout; time / calls, then input / output tokens):",
        "",
        component_table(rows),
        "",
        component_tokens_table(rows),
        "",
    ]
    if any(r.rm_cache_hits for r in rows):
        # The store's score cache is shared by its runs: SRD and rejection sampling of one seed draw the
        # same drafts, so the one made second reads most of its scores from it, and its Scorer cost above
        # is not what the method costs alone.
        text += [
            REWARD_CALLS_NOTE
            + " the run made second of a seed finds the drafts it shares with the first already scored, so"
            " read its Scorer cost above with its cache hits.",
            "",
            reward_calls_table_data(rows).markdown(),
            "",
        ]
    return text


def rescored_pool(
    store: Path,
    scores: Path,
    *,
    reward: str,
    pool_n: int,
    seeds: list[int],
    items: int,
    like: dict[str, Any] | None = None,
) -> list:
    """Best-of-``pool_n``'s candidates for a grid whose reward is ``reward``, taken from another grid's
    store (``store``: its finished best_of_n runs at N = ``pool_n``, one per seed of ``seeds``, over the
    same ``items`` problems; ``like``: spec fields, such as the dataset, model and max_new_tokens, it
    must match, a ``params.`` prefix for a method parameter) with every candidate re-scored by ``reward`` from ``benchmarks/reward_rescore.py``'s
    caches under ``scores``. Best-of-N's candidates do not depend on its reward, so this is the run
    Best-of-N with ``reward`` would make, without generating its candidates again; each run's spec says
    ``rescored_from`` (the reward it was made with). A problem with no cached score is an error naming the
    command that scores it."""
    import tempfile
    from dataclasses import replace

    from benchmarks.reward_rescore import (
        cache_file,
        finished_specs,
        load_runs,
        open_store,
        rescore,
        scoreable,
        with_scores,
    )

    with tempfile.TemporaryDirectory() as scratch:
        db_file = open_store(store, Path(scratch))
        specs = finished_specs(db_file)

        def field(spec: dict, key: str) -> Any:
            return (spec.get("params") or {}).get(key[7:]) if key.startswith("params.") else spec.get(key)

        want = {"method": "best_of_n", "params.n": pool_n, **(like or {})}
        by_seed: dict[int, list[str]] = {}
        for rid, spec in specs.items():
            if all(field(spec, k) == v for k, v in want.items()) and int(spec.get("limit") or 0) >= items:
                by_seed.setdefault(int(spec.get("seed", 0)), []).append(rid)
        twice = {s: ids for s, ids in by_seed.items() if s in seeds and len(ids) > 1}
        if twice:
            raise SystemExit(f"--pool-from {store}: more than one best_of_n run fits ({twice}); keep one")
        missing = [s for s in seeds if s not in by_seed]
        if missing:
            raise SystemExit(
                f"--pool-from {store}: no finished best_of_n run at N = {pool_n} for seeds {missing}"
            )
        runs = load_runs(db_file, [by_seed[s][0] for s in seeds])  # one configuration over the seeds
    out = []
    for run in runs:
        records = scoreable(run.records, items)
        if len(records) < items:
            raise SystemExit(
                f"--pool-from: {run.run_id} has {len(records)} scoreable problems, fewer than {items}"
            )

        def unscored(run_id: str = run.run_id) -> Any:
            raise SystemExit(
                f"--pool-from: {cache_file(scores, run_id, reward)} lacks scores of the first {items} problems; "
                f"score them with: benchmarks/reward_rescore.py --store {store} --run {run_id} --rewards {reward} "
                f"--items {items} --work {scores}"
            )

        got, _ = rescore(records, unscored, cache_file(scores, run.run_id, reward), progress=False)
        rescored = with_scores(run, records, got)
        out.append(
            replace(rescored, spec={**run.spec, "reward": reward, "rescored_from": run.spec.get("reward")})
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="gsm8k", help="gsm8k or math500 (the packaged test sets)")
    ap.add_argument("--items", type=int, default=200)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--budgets", default="4,8")
    ap.add_argument(
        "--pool-n",
        type=int,
        default=None,
        help="Best-of-N's N, whose seeded candidates give sampling, Best-of-k, self-consistency and pass@k "
        "(default the largest budget; may be larger, e.g. a Best-of-8 pool beside SRD at N = 4)",
    )
    ap.add_argument(
        "--pool-from",
        default=None,
        metavar="STORE",
        help="take Best-of-N's candidates from another grid's store (e.g. benchmarks/state/real_text/logprob: "
        "its best_of_n runs at --pool-n, one per seed) re-scored by this grid's reward from "
        "benchmarks/reward_rescore.py's caches (--pool-scores); this grid then generates no Best-of-N run",
    )
    ap.add_argument(
        "--pool-scores",
        default="benchmarks/state/reward_rescore",
        metavar="DIR",
        help="the score caches --pool-from reads (reward_rescore.py's --work)",
    )
    ap.add_argument(
        "--search-n",
        default="",
        help="also run step-level beam search and DVTS at these N (e.g. 8; M = 4, a step ends at a blank "
        "line or after --chunk-tokens tokens, scored by the reward); left out by default",
    )
    ap.add_argument(
        "--search-reward",
        default=None,
        metavar="REWARD",
        help="the process reward of --search-n's beam search and DVTS (e.g. judge-step:qwen2.5-coder-1.5b) in "
        "place of the grid's reward; their runs go into the grid's store and its section",
    )
    ap.add_argument(
        "--search-aggregation",
        default="min",
        choices=("last", "min", "prod"),
        help="with --search-reward: a beam's score from its step scores (default min: a step reward such as "
        "judge-step's rates one step, so a beam is as good as its weakest step)",
    )
    ap.add_argument("--rewards", default="logprob,judge:qwen2.5-coder-1.5b")
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--engine", default="vllm")
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--chunk-tokens", type=int, default=128, help="Δ, the adaptive methods' scoring interval")
    ap.add_argument("--work", default="/tmp/srdq-real-text")
    ap.add_argument(
        "--shard-size",
        type=int,
        default=16,
        help="problems per shard (each run resumes shard by shard; --items gives one shard per run)",
    )
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--methods", default=None, help="run only these methods of the grid; analyse nothing")
    ap.add_argument(
        "--without",
        default="",
        help="leave these methods out of the grid (run and analysis), e.g. speculative_rejection; "
        "best_of_n and srd are needed; without rejection_sampling there is no coupled table",
    )
    ap.add_argument("--analyse-only", nargs="*", default=None, metavar="FOLDER")
    ap.add_argument(
        "--partial",
        action="store_true",
        help="with --analyse-only: leave out the grid points not finished yet (named on stderr and in the "
        "section) instead of stopping; Best-of-N and SRD are still needed at every seed",
    )
    ap.add_argument(
        "--state",
        default=None,
        metavar="DIR",
        help="carry the grid across machines: before running, a reward's store missing from --work is "
        "rebuilt from DIR/<name>/ (benchmarks/state/real_text holds the committed copies); with "
        "--save-state, write those copies from --work (safe while a run is writing) and exit",
    )
    ap.add_argument("--save-state", action="store_true", help="only snapshot the stores into --state")
    ap.add_argument(
        "--tag",
        default="",
        help="write docs/real_text_<slug>_<tag>.png and the real-text-<slug>_<tag> section, so a partial or "
        "differently sized grid does not replace another's",
    )
    args = ap.parse_args()
    if args.save_state and not args.state:
        ap.error("--save-state needs --state DIR")
    if args.search_reward and not args.search_n:
        ap.error("--search-reward needs --search-n (the searches' N)")

    import matplotlib

    matplotlib.use("Agg")

    from srd_worker.rewards.registry import JUDGE_KINDS
    from srd_worker.settings import Settings
    from srd_worker.testbed.experiment import run_grid

    seeds, budgets = _ints(args.seeds), _ints(args.budgets)
    pool = args.pool_n or max(budgets)
    settings = Settings(device="cpu")
    grid = dict(
        dataset=args.dataset,
        model=args.model,
        engine=args.engine,
        items=args.items,
        seeds=seeds,
        budgets=budgets,
        max_new=args.max_new_tokens,
        chunk=args.chunk_tokens,
        shard_size=args.shard_size,
    )
    for reward in [x for x in args.rewards.split(",") if x]:
        sweep = real_sweep(
            reward=reward,
            pool_n=args.pool_n,
            search_n=None if args.search_reward else _ints(args.search_n) or None,
            **grid,
        )
        parts = [sweep]  # with --search-reward, a second sweep for the searches, its runs in the same store
        if args.search_reward:
            own = real_sweep(
                reward=args.search_reward,
                search_n=_ints(args.search_n),
                aggregation=args.search_aggregation,
                **grid,
            )
            parts.append({**own, "methods": [m for m in own["methods"] if m["method"] in SEARCH]})
        work = Path(args.work) / (
            reward.replace(":", "_")
            if args.dataset == "gsm8k"
            else f"{args.dataset}_{reward.replace(':', '_')}"
        )
        if args.state:
            if args.save_state:
                saved = save_state(work, Path(args.state))
                print(f"{reward}: " + (f"store saved to {saved}" if saved else f"no store in {work}"))
                continue
            restored = restore_state(work, Path(args.state))
            if restored:
                print(f"{reward}: store restored from {restored}")
        without = {m for m in args.without.split(",") if m}
        if args.pool_from:  # Best-of-N comes from another grid's candidates, re-scored: not generated here
            without.add("best_of_n")
        for part in parts:
            part["methods"] = [m for m in part["methods"] if m["method"] not in without]
        if args.methods:
            keep = args.methods.split(",")
            chosen = [
                {**part, "methods": [m for m in part["methods"] if m["method"] in keep]} for part in parts
            ]
            if not any(part["methods"] for part in chosen):
                ap.error(f"--methods {args.methods}: none of these is in this grid")
            for part in chosen:
                if part["methods"]:
                    run_grid(part, work, settings=settings)
            continue
        dataset_name = {"gsm8k": "GSM8K", "math500": "MATH500"}.get(args.dataset, args.dataset)
        t0 = time.perf_counter()
        runs: list = []
        for part in parts:
            if not part["methods"]:  # nothing to generate: a --pool-from grid of Best-of-N alone
                continue
            if args.analyse_only is not None:
                folders = [Path(f) for f in (args.analyse_only or [work])]
                runs += collect(part, folders, settings=settings, missing_ok=args.partial)
            else:
                runs += run_grid(part, work, settings=settings)
        wall = time.perf_counter() - t0
        have = {(r.method, int(r.budget or 0), _seed(r)) for r in runs}
        absent = [
            f"{m['method']} N = {n} seed {seed}"
            for part in parts
            for m in part["methods"]
            for n in (m["n"] if isinstance(m["n"], list) else [m["n"]])
            for seed in seeds
            if (m["method"], int(n), seed) not in have
        ]
        if args.pool_from:
            runs += rescored_pool(
                Path(args.pool_from),
                Path(args.pool_scores),
                reward=reward,
                pool_n=pool,
                seeds=seeds,
                items=args.items,
                like={
                    "dataset": args.dataset,
                    "model": args.model,
                    "engine": args.engine,
                    "params.max_new_tokens": args.max_new_tokens,
                },
            )
        slug = reward.split(":")[0].replace("-", "_")
        if args.dataset != "gsm8k":
            slug = f"{args.dataset}_{slug}"
        if args.tag:
            slug = f"{slug}_{args.tag}"
        png = None if args.no_write else ROOT / "docs" / f"real_text_{slug}.png"
        pool_only = "srd" in without  # a grid of Best-of-N alone: its k-curves
        needed = [("best_of_n", pool)] + ([] if pool_only else [("srd", n) for n in budgets])
        lacking = [
            f"{m} N = {n}" for m, n in needed if not any(r.method == m and r.budget == n for r in runs)
        ]
        if lacking:  # --partial leaves out other methods, not these
            raise SystemExit(f"no finished run of {', '.join(lacking)}: the tables need it; nothing analysed")
        if pool_only:
            out = analyse_pool([r for r in runs if r.method == "best_of_n"], sorted({*budgets, pool}))
        else:
            title = f"{dataset_name}, {args.model}: accuracy vs generated tokens, reward {reward}"
            out = analyse(reward, runs, budgets, png, title=title, pool_n=args.pool_n, weighted=True)
        roc = reward_auroc([r for r in runs if r.method == "best_of_n"])
        rescored = [r for r in runs if r.method == "best_of_n" and r.spec.get("rescored_from")]
        setting = (
            f"**Reward `{reward}`**: the first {args.items} {dataset_name} test problems × seeds "
            f"{', '.join(map(str, seeds))}; policy `{args.model}` on the `{args.engine}` engine, "
            f"max_new_tokens {args.max_new_tokens}, Δ = chunk_tokens {args.chunk_tokens} for the adaptive "
            f"methods, T 0.8 / top-p 0.9 / top-k 50, method defaults otherwise (SRD θ_high 0.5, θ_low 0.3; "
            f"rejection sampling rank variant θ 0.5; Speculative Rejection α 0.5"
            + (
                f"; beam search and DVTS M = 4, a step ending at a blank line or after {args.chunk_tokens} "
                + (
                    f"tokens, each step scored by `{args.search_reward}` and a beam's score the "
                    + {"last": "last step's", "min": "lowest of its steps'", "prod": "product of its steps'"}[
                        args.search_aggregation
                    ]
                    if args.search_reward
                    else "tokens, a beam's score its last step's"
                )
                if args.search_n
                else ""
            )
            + "). "
            + (
                f"Best-of-{pool}'s candidates are those of the `{rescored[0].spec['rescored_from']}` grid's "
                f"Best-of-{pool} runs ({', '.join(f'`{r.run_id}`' for r in rescored)}) re-scored by "
                f"`{reward}` (`benchmarks/reward_rescore.py`): Best-of-N's candidates do not depend on its "
                "reward, so this is the Best-of-N run this reward would make, not generated again. "
                if rescored
                else ""
            )
            + (
                f"Wall time of this grid on the shared 2-core machine (runs reused from an earlier "
                f"invocation count nothing): {wall / 60:.0f} min."
                if args.analyse_only is None
                else "Runs collected from their stores (`--analyse-only`)."
            )
            + (f" Not finished yet, so left out (`--partial`): {', '.join(absent)}." if absent else "")
        )
        a = roc["auroc"]
        roc_line = (
            f"Reward AUROC, correct vs wrong finished responses (Best-of-{pool}'s candidates: "
            f"{roc['responses']} responses of {roc['problems']} problems, {roc['correct']} correct): "
            + (
                "n/a"
                if a is None
                else f"**{a:.3f}** [{roc['low']:.3f}, {roc['high']:.3f}] (bootstrap over problems)"
            )
            + order_text(roc["above"])
        )
        body = [setting, "", roc_line, ""]
        cutoff = cutoff_text([r for r in runs if r.method == "best_of_n"])
        if cutoff:
            body += [cutoff, ""]
        machines = hosts_text(runs)
        if machines:
            body += [machines, ""]
        if pool_only:
            body += [
                out["table"],
                "",
                "Paired by problem (the same candidates: voted, ranked by the reward, or the first one):",
                "",
                out["paired"],
                "",
            ]
        else:
            rs_missing = None  # why there is no coupled table
            if "rejection_sampling" in without:
                rs_missing = "was left out of this grid (`--without`)"
            elif not any(r.method == "rejection_sampling" for r in runs):
                rs_missing = "is not finished yet (`--partial`)"
            body += ([f"![real text, {reward}]({png.name})", ""] if png is not None else []) + adaptive_text(
                out, rs_missing=rs_missing
            )
            searched = search_paired(runs, pool)
            if searched:
                body += [
                    "Step-level search against Best-of-N and SRD at the same N, paired by problem and seed "
                    "(over the seeds the search ran; Best-of-N from the k-curve of the Best-of-"
                    f"{pool} candidates):",
                    "",
                    searched,
                    "",
                    "What the final candidates hold (a search run's last beams against Best-of-"
                    f"{pool}'s independent samples):",
                    "",
                    candidate_spread(runs, pool) or "",
                    "",
                ]
            # a re-scored pool's costs are those of the grid it was made in, not this reward's: left out
            body += component_text([r for r in runs if not r.spec.get("rescored_from")])
        body.append(
            "Command: `"
            + (
                f"SRDQ_VLLM_CPU_MAX_MODEL_LEN={settings.vllm_cpu_max_model_len} "
                if settings.vllm_cpu_max_model_len and args.engine == "vllm"
                else ""
            )
            + (
                f"SRDQ_JUDGE_ENGINE={settings.judge_engine} "
                if {reward.partition(":")[0], (args.search_reward or "").partition(":")[0]} & JUDGE_KINDS
                and settings.judge_engine != "transformers"
                else ""
            )
            + f".venv-vllm/bin/python benchmarks/real_text.py --dataset {args.dataset} --rewards {reward} "
            f"--items {args.items} "
            f"--seeds {args.seeds} --budgets {args.budgets} --max-new-tokens {args.max_new_tokens} "
            f"--chunk-tokens {args.chunk_tokens} --model {args.model} --engine {args.engine} "
            f"--shard-size {args.shard_size}"
            + (f" --pool-n {args.pool_n}" if args.pool_n else "")
            + (f" --search-n {args.search_n}" if args.search_n else "")
            + (
                f" --search-reward {args.search_reward} --search-aggregation {args.search_aggregation}"
                if args.search_reward
                else ""
            )
            + (f" --pool-from {args.pool_from} --pool-scores {args.pool_scores}" if args.pool_from else "")
            + (f" --without {args.without}" if args.without else "")
            + (f" --tag {args.tag}" if args.tag else "")
            + "`"
        )
        text = "\n".join(body)
        print(text, flush=True)
        Path(args.work).mkdir(parents=True, exist_ok=True)
        (Path(args.work) / f"results-{slug}.json").write_text(
            json.dumps({**out, "auroc": roc, "wall_s": wall}, indent=1) + "\n", encoding="utf-8"
        )
        if not args.no_write:
            replace_section(ROOT / "docs" / "PERFORMANCE.md", f"real-text-{slug}", text)


if __name__ == "__main__":
    main()
