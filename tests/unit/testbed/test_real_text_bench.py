"""benchmarks/real_text.py's AUROC (hand-worked values, ties counted half) and its interval over problems."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks.real_text import auroc, order_text, reward_auroc, right_above_wrong

pytestmark = pytest.mark.unit


def test_auroc_by_hand():
    # pairs (correct, wrong): (0.35, 0.1) > , (0.35, 0.4) <, (0.8, 0.1) >, (0.8, 0.4) > -> 3/4
    assert auroc([0.1, 0.4, 0.35, 0.8], [False, False, True, True]) == pytest.approx(0.75)
    assert auroc([0.5, 0.5], [True, False]) == pytest.approx(0.5)  # a tie counts half
    assert auroc([0.2, 0.2, 0.9], [False, True, True]) == pytest.approx(0.75)
    assert auroc([0.1, 0.2], [True, True]) is None  # no wrong response: undefined
    assert auroc([0.9, 0.1], [True, False]) == 1.0 and auroc([0.1, 0.9], [True, False]) == 0.0


def test_reward_auroc_pools_candidates_and_bootstraps_problems():
    def rec(pairs, item):
        return {
            "item_id": item,
            "candidates": [{"reward": r, "correct": c} for r, c in pairs]
            + [{"reward": None, "correct": True}],
        }

    runs = [
        SimpleNamespace(
            records=[rec([(0.9, True), (0.1, False)], "a"), rec([(0.8, True), (0.2, False)], "b")]
        )
    ]
    out = reward_auroc(runs, resamples=200)
    assert out["auroc"] == 1.0 and (out["low"], out["high"]) == (1.0, 1.0)
    assert (out["responses"], out["correct"], out["problems"]) == (4, 2, 2)  # unscored candidates left out
    assert out["above"]["mean"] == 1.0 and out["above"]["problems"] == 2


def test_within_problem_order_can_disagree_with_the_pooled_auroc():
    """Each problem orders its candidates perfectly, but the scores of an easy problem sit above a hard
    one's: the pooled AUROC falls below 1, the within-problem order (what Best-of-N acts on) does not;
    a problem with only right (or only wrong) candidates has no pair and is left out."""

    def rec(pairs):
        return {"candidates": [{"reward": r, "correct": c} for r, c in pairs]}

    runs = [
        SimpleNamespace(
            records=[
                rec([(0.9, True), (0.7, False)]),  # easy problem: high scores
                rec([(0.3, True), (0.1, False), (0.1, False)]),  # hard problem: low scores
                rec([(0.5, True), (0.6, True)]),  # no wrong candidate: no pair
            ]
        )
    ]
    out = reward_auroc(runs, resamples=200)
    assert out["auroc"] < 1.0  # the hard problem's right (0.3) below the easy one's wrong (0.7)
    assert out["above"]["mean"] == 1.0 and out["above"]["problems"] == 2
    assert right_above_wrong([(0.4, True), (0.4, False), (0.2, False)]) == pytest.approx(0.75)  # tie half
    text = order_text(out["above"])
    assert "**100.0%**" in text and "the 2 problems with both)" in text
    flipped = reward_auroc([SimpleNamespace(records=[rec([(0.1, True), (0.9, False)])])])
    assert flipped["above"]["mean"] == 0.0 and flipped["above"]["low"] is None  # one problem: no interval
    assert "**0.0%** of pairs" in order_text(flipped["above"])
    assert order_text(reward_auroc([SimpleNamespace(records=[rec([(0.5, True)])])])["above"]) == ""


def test_state_snapshot_round_trips_a_store_and_never_overwrites_one(tmp_path):
    """The grid's store carried to a new machine: a snapshot taken while a connection holds the store
    open (WAL, as a running grid does) restores to the same rows; a store already in --work is newer and
    is left alone; no store, no snapshot."""
    import sqlite3

    from benchmarks.real_text import restore_state, save_state

    work, state = tmp_path / "run" / "logprob", tmp_path / "state"
    assert save_state(work, state) is None
    work.mkdir(parents=True)
    live = sqlite3.connect(work / "srdq.db")
    live.execute("PRAGMA journal_mode=WAL")
    live.execute("CREATE TABLE shard (id INTEGER PRIMARY KEY, status TEXT)")
    live.executemany("INSERT INTO shard (status) VALUES (?)", [("done",), ("done",), ("pending",)])
    live.commit()  # committed to the WAL, not yet checkpointed into the main file
    saved = save_state(work, state)
    assert saved == state / "logprob"
    live.execute("UPDATE shard SET status = 'done'")
    live.commit()
    assert not restore_state(work, state)  # the store in work is newer: kept
    live.close()

    elsewhere = tmp_path / "new-machine" / "logprob"
    assert restore_state(elsewhere, state)
    got = sqlite3.connect(elsewhere / "srdq.db")
    try:
        assert got.execute("SELECT status FROM shard ORDER BY id").fetchall() == [
            ("done",),
            ("done",),
            ("pending",),
        ]
    finally:
        got.close()
    assert not restore_state(elsewhere, state)  # restored once; never over a store


def _store(path, runs: dict[str, int], cache: int):
    """A store shaped like srdq's: a run table, run-owned rows (``run_id``) and a run-less score cache."""
    import sqlite3

    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE IF NOT EXISTS run (id TEXT PRIMARY KEY, status TEXT)")
    con.execute("CREATE TABLE IF NOT EXISTS result (id INTEGER PRIMARY KEY, run_id TEXT, record BLOB)")
    con.execute("CREATE INDEX IF NOT EXISTS ix_result_run_id ON result (run_id)")
    con.execute("CREATE TABLE IF NOT EXISTS score_cache (key TEXT PRIMARY KEY, score REAL)")
    con.execute("CREATE TABLE IF NOT EXISTS sweep (id INTEGER PRIMARY KEY, run_ids TEXT)")
    con.execute("INSERT INTO sweep (run_ids) VALUES (?)", (",".join(runs),))  # each invocation adds one
    for run_id, n in runs.items():
        con.execute("INSERT OR IGNORE INTO run VALUES (?, 'done')", (run_id,))
        con.executemany(
            "INSERT INTO result (run_id, record) VALUES (?, ?)",
            [(run_id, bytes([i % 256]) * 40) for i in range(n)],
        )
    have = con.execute("SELECT count(*) FROM score_cache").fetchone()[0]
    con.executemany(
        "INSERT INTO score_cache VALUES (?, ?)", [(f"k{have + i:06d}", i / 7) for i in range(cache)]
    )
    con.commit()
    return con


def _rows(path):
    import sqlite3

    con = sqlite3.connect(path)
    try:
        return {
            t: con.execute(f'SELECT rowid, * FROM "{t}" ORDER BY rowid').fetchall()
            for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
    finally:
        con.close()


def test_a_snapshot_adds_only_what_changed(tmp_path, monkeypatch):
    """The committed copy of a long grid's store: one file per run and blocks of the run-less rows, so a
    save after one more run rewrites that run's file and the last block and leaves every other file's bytes
    alone; the store it rebuilds holds the same rows with the same rowids, and saving that again changes
    nothing; a run gone from the store takes its file with it."""
    from benchmarks import _snapshot

    monkeypatch.setattr(_snapshot, "BLOCK", 10)
    db, folder = tmp_path / "srdq.db", tmp_path / "state" / "logprob"
    live = _store(db, {"run-a": 5, "run-b": 3}, cache=25)
    assert _snapshot.save(db, folder) == {"written": 6, "unchanged": 0, "removed": 0}
    names = sorted(p.name for p in folder.iterdir())
    assert names == [
        "common-score_cache-0.db.gz",
        "common-score_cache-1.db.gz",
        "common-score_cache-2.db.gz",
        "common-sweep-0.db.gz",
        "run-a.db.gz",
        "run-b.db.gz",
    ]
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    # one more run, one more sweep, three more scores (the last block grows)
    _store(db, {"run-c": 4}, cache=3).close()
    assert _snapshot.save(db, folder) == {"written": 3, "unchanged": 4, "removed": 0}
    after = {p.name: p.read_bytes() for p in folder.iterdir()}
    changed = {n for n in after if after[n] != before.get(n)}
    assert changed == {"run-c.db.gz", "common-score_cache-2.db.gz", "common-sweep-0.db.gz"}

    rebuilt = tmp_path / "elsewhere" / "srdq.db"
    assert _snapshot.restore(folder, rebuilt) == 7
    assert _rows(rebuilt) == _rows(db)
    assert _snapshot.save(rebuilt, folder) == {"written": 0, "unchanged": 7, "removed": 0}
    with pytest.raises(FileExistsError):
        _snapshot.restore(folder, rebuilt)  # never over a store

    live.execute("DELETE FROM result WHERE run_id = 'run-b'")
    live.execute("DELETE FROM run WHERE id = 'run-b'")
    live.commit()
    live.close()
    assert _snapshot.save(db, folder)["removed"] == 1
    assert not (folder / "run-b.db.gz").exists()


def test_a_single_file_copy_of_an_earlier_version_is_read_then_replaced(tmp_path):
    """A state folder holding only ``<name>.db.gz`` (the single-file snapshot of earlier versions) still
    restores; the next save writes the per-run folder and removes the single file."""
    import gzip

    from benchmarks.real_text import restore_state, save_state

    src = tmp_path / "old.db"
    _store(src, {"run-a": 2}, cache=1).close()
    state = tmp_path / "state"
    state.mkdir()
    (state / "logprob.db.gz").write_bytes(gzip.compress(src.read_bytes()))
    work = tmp_path / "run" / "logprob"
    assert restore_state(work, state) == state / "logprob.db.gz"
    assert _rows(work / "srdq.db") == _rows(src)
    assert save_state(work, state) == state / "logprob"
    assert not (state / "logprob.db.gz").exists()
    assert sorted(p.name for p in (state / "logprob").iterdir()) == [
        "common-score_cache-0.db.gz",
        "common-sweep-0.db.gz",
        "run-a.db.gz",
    ]


def test_the_best_of_n_pool_can_be_larger_than_every_budget():
    """--pool-n 8 --budgets 4: Best-of-8's candidates give the k-curves beside SRD and rejection sampling at
    N = 4; without it, Best-of-N's N is the largest budget (the run ids of an earlier grid stay the same)."""
    from benchmarks.real_text import real_sweep

    common = dict(reward="logprob", model="m", engine="vllm", items=8, seeds=[0], max_new=64, chunk=16)
    ns = {m["method"]: m["n"] for m in real_sweep(budgets=[4], pool_n=8, **common)["methods"]}
    assert ns == {"best_of_n": 8, "srd": [4], "rejection_sampling": [4], "speculative_rejection": [4]}
    ns = {m["method"]: m["n"] for m in real_sweep(budgets=[4, 8], **common)["methods"]}
    assert ns["best_of_n"] == 8 and ns["srd"] == [4, 8]


def test_srd_is_paired_against_speculative_rejection_by_problem_and_seed():
    """The paired table's SRD − Speculative Rejection column: accuracy differences over the problems both
    runs hold (a problem only one side has is left out), and n/a where the grid left the method out."""
    from benchmarks.testbed import _paired_vs

    def run(method, correct):
        records = [{"item_id": f"p{i}", "correct": c} for i, c in enumerate(correct)]
        return SimpleNamespace(spec={"method": method, "n": 4, "seed": 0}, records=records)

    srd = [run("srd", [True, True, True, False, True])]
    other = [run("speculative_rejection", [True, False, False, False])]  # p4 missing: not paired
    # 2 wins, 2 ties over the 4 shared problems: +50 points
    assert _paired_vs(srd, other).startswith("+50.0 pts [")
    assert _paired_vs(other, srd).startswith("-50.0 pts [")
    assert _paired_vs(srd, None) == "n/a (not run)" and _paired_vs(srd, []) == "n/a (not run)"


def test_the_coupled_table_pairs_only_the_seeds_both_methods_have():
    """``--partial`` while rejection sampling's seed 1 is still running: the coupled SRD vs RS cells pair
    seed 0 alone (SRD's seed 1 has no partner from the same drafts) instead of failing, and two methods
    with no seed in common are refused with both seed lists named."""
    from benchmarks.testbed import coupled_cells

    def run(method, seed, rmax):
        records = [{"item_id": f"p{i}", "extra": {"R_max": r}} for i, r in enumerate(rmax)]
        return SimpleNamespace(spec={"method": method, "n": 4, "seed": seed}, records=records)

    srd = [run("srd", 0, [0.9, 0.5, 0.7]), run("srd", 1, [0.1, 0.1, 0.1])]
    rs = [run("rejection_sampling", 0, [0.8, 0.5, 0.9])]
    cells = coupled_cells(srd, rs)
    # seed 0 only: one win, one tie, one loss over 3 problems; seed 1's low R_max would make Δ_n negative
    assert cells["items"] == "3" and cells["wtl"] == "1 / 1 / 1"
    assert cells["rmax_srd"] == "0.700" and cells["rmax_rs"] == "0.733"
    assert cells["delta"].startswith("-0.033 [")
    both = coupled_cells(srd, [*rs, run("rejection_sampling", 1, [0.1, 0.2, 0.1])])
    assert both["items"] == "6" and both["wtl"] == "1 / 3 / 2"
    with pytest.raises(ValueError, match=r"seeds \[1\].*seeds \[0\]"):
        coupled_cells(srd[1:], rs)


def test_the_coupled_table_gives_the_reward_before_and_after_a_refinement():
    """ALGORITHMS §1.10's mean reward before → after refinement, weighted by refinements over every seed:
    seed 0 has 1 refinement 0.2 → 0.6, seed 1 has 3 refinements averaging 0.4 → 0.5: (0.2 + 3·0.4) / 4 =
    0.35 before, (0.6 + 3·0.5) / 4 = 0.525 after."""
    from benchmarks.testbed import coupled_cells

    def run(method, seed, extra):
        return SimpleNamespace(
            spec={"method": method, "n": 4, "seed": seed}, records=[{"item_id": "p0", "extra": extra}]
        )

    srd = [
        run(
            "srd",
            0,
            {"R_max": 0.6, "refinements": 1, "reward_before_refine": 0.2, "reward_after_refine": 0.6},
        ),
        run(
            "srd",
            1,
            {"R_max": 0.5, "refinements": 3, "reward_before_refine": 0.4, "reward_after_refine": 0.5},
        ),
    ]
    rs = [run("rejection_sampling", 0, {"R_max": 0.6}), run("rejection_sampling", 1, {"R_max": 0.5})]
    assert coupled_cells(srd, rs)["before_after"] == "0.350 → 0.525"
    assert coupled_cells(srd[:1], rs[:1])["before_after"] == "0.200 → 0.600"


def test_compute_matched_best_of_k_includes_one_sample():
    """SRD's compute-matched Best-of-k is the largest k of the k-curve at no more tokens than SRD; one
    sample (the k-curve's sampling row, k = 1) counts, so an SRD cheaper than Best-of-2 is paired with it
    instead of "every Best-of-k costs more"; adaptive methods' rows never count."""
    from benchmarks.testbed import compute_matched

    def row(method, n, tokens):
        return SimpleNamespace(method=method, n=n, tokens=SimpleNamespace(mean=tokens))

    rows = [
        row("sampling", 1, 300.0),
        row("best_of_n", 2, 600.0),
        row("best_of_n", 4, 1200.0),
        row("srd", 4, 800.0),
    ]
    assert compute_matched(rows, 900.0).n == 2
    assert compute_matched(rows, 1200.0).n == 4
    assert compute_matched(rows, 500.0).method == "sampling"
    assert compute_matched(rows, 200.0) is None and compute_matched(rows, None) is None


def test_wins_against_a_k_curve_expectation_are_expected_discordant_counts():
    """Best-of-k from a larger pool is an expectation over k-subsets (0.9 is not a 0): A right where B is
    0.9 counts 0.1 towards "only A", not a whole win; 0/1 on both sides keeps the counts."""
    from benchmarks.testbed import discordant
    from srd_worker.testbed.experiment import paired_values

    a = {"x": {0: 1.0}, "y": {0: 0.0}, "z": {0: 1.0}}
    b = {"x": {0: 0.9}, "y": {0: 0.5}, "z": {0: 1.0}}
    assert discordant(paired_values(a, b)) == "0.1 only A / 0.5 only B (expected)"
    binary = {"x": {0: 0.0}, "y": {0: 0.0}, "z": {0: 1.0}}
    assert discordant(paired_values(a, binary)) == "1 / 2 / 0"


def test_beam_search_and_dvts_join_the_grid_only_when_asked():
    """--search-n 8 adds step-level beam search and DVTS at N = 8 (M = 4, the reward scoring each step), and
    the sweep validates; without it the grid, and so every run id, is the one earlier sessions ran."""
    from benchmarks.real_text import real_sweep
    from srd_worker.sweep import parse_sweep, prepare_sweep
    from srd_worker.testbed.experiment import grid_settings

    common = dict(
        reward="arithmetic", model="tiny", engine="transformers", items=4, seeds=[0], max_new=64, chunk=16
    )
    plain = real_sweep(budgets=[4], **common)
    searched = real_sweep(budgets=[4], search_n=[8], **common)
    assert [m["method"] for m in searched["methods"]] == [m["method"] for m in plain["methods"]] + [
        "beam_search",
        "dvts",
    ]
    assert searched["methods"][:4] == plain["methods"]
    for m in searched["methods"][4:]:
        assert m["n"] == [8] and m["params"] == {"max_new_tokens": 64, "chunk_tokens": 16, "beam_width": 4}
    _, prepared = prepare_sweep(parse_sweep(searched), settings=grid_settings(None))
    _, before = prepare_sweep(parse_sweep(plain), settings=grid_settings(None))
    ids = {p.spec.method: p.spec.run_id() for p in prepared}
    assert set(ids) >= {"beam_search", "dvts"}
    assert {p.spec.run_id() for p in before} <= {p.spec.run_id() for p in prepared}


def test_a_search_reward_of_its_own_gets_its_aggregation_and_new_run_ids():
    """--search-reward judge-step:... runs the searches as a sweep of their own with a step aggregation
    (min by default): the parameter is in their params and so in their run ids, which differ from those of
    the same searches scored the grid's way; without the aggregation nothing changes."""
    from benchmarks.real_text import SEARCH, real_sweep
    from srd_worker.sweep import parse_sweep, prepare_sweep
    from srd_worker.testbed.experiment import grid_settings

    common = dict(
        reward="arithmetic", model="tiny", engine="transformers", items=4, seeds=[0], max_new=64, chunk=16
    )
    default = real_sweep(budgets=[4], search_n=[8], **common)
    assert real_sweep(budgets=[4], search_n=[8], aggregation=None, **common) == default

    def search_ids(sweep):
        _, prepared = prepare_sweep(parse_sweep(sweep), settings=grid_settings(None))
        return {p.spec.method: p.spec.run_id() for p in prepared if p.spec.method in SEARCH}

    lowest = real_sweep(budgets=[4], search_n=[8], aggregation="min", **common)
    for m in lowest["methods"]:
        assert ("aggregation" in m["params"]) == (m["method"] in SEARCH)
        if m["method"] in SEARCH:
            assert m["params"]["aggregation"] == "min"
    before, after = search_ids(default), search_ids(lowest)
    assert set(before) == set(after) == set(SEARCH)
    assert all(before[m] != after[m] for m in SEARCH)


def test_a_search_reward_needs_the_searches_n():
    import subprocess
    import sys

    from benchmarks.real_text import ROOT

    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "real_text.py"), "--search-reward", "judge-step:x"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "--search-reward needs --search-n" in out.stderr


def test_refined_answers_counts_the_chosen_candidate_only():
    """SRD's answer from a refinement: the candidate extra.chosen names must be the refined one (a refined
    candidate beside an unrefined answer does not count); records without a choice are left out."""
    from benchmarks.testbed import refined_answers

    def rec(chosen, refined_ids, correct):
        cands = [{"id": i, "refined": i in refined_ids} for i in range(3)]
        return {"extra": {"chosen": chosen}, "candidates": cands, "correct": correct}

    runs = [
        SimpleNamespace(records=[rec(1, {1}, True), rec(0, {2}, True), rec(2, {2}, False)]),
        SimpleNamespace(
            records=[rec(0, {0}, True), {"extra": {"chosen": None}, "candidates": [], "correct": False}]
        ),
    ]
    assert refined_answers(runs) == "3 of 4 (2 right)"
    assert refined_answers([]) == "0 of 0 (0 right)"


def test_search_is_paired_with_best_of_n_and_srd_over_the_seeds_it_ran():
    """Beam search at N = 2 on seed 0 only, beside a two-seed grid: it is paired with Best-of-2 (the
    k-curve of the Best-of-2 candidates) and SRD at N = 2 on seed 0 alone; tokens as ratios."""
    from benchmarks.real_text import search_paired

    def run(method, budget, seed, records):
        spec = {"method": method, "n": budget, "seed": seed}
        return SimpleNamespace(
            method=method, budget=budget, spec=spec, run_id=f"{method}-{budget}-{seed}", records=records
        )

    def outcome(i, correct, tokens):
        return {"item_id": str(i), "correct": correct, "ledger": {"gen_tokens": tokens}}

    def pool(i, rewards_right):  # two candidates, 50 tokens each
        cands = [{"reward": r, "correct": c, "answer": str(c), "n_tokens": 50} for r, c in rewards_right]
        return {"item_id": str(i), "candidates": cands, "ledger": {"gen_tokens": 100}}

    # Best-of-2 picks the higher reward: right on items 0 and 1, wrong on 2 and 3
    bon0 = [pool(0, [(0.9, True), (0.1, False)]), pool(1, [(0.8, True), (0.2, True)]),
            pool(2, [(0.9, False), (0.1, True)]), pool(3, [(0.7, False), (0.3, False)])]  # fmt: skip
    bon1 = [pool(i, [(0.9, False), (0.1, False)]) for i in range(4)]  # seed 1: all wrong (left out)
    beam = [outcome(0, True, 200), outcome(1, False, 200), outcome(2, True, 200), outcome(3, True, 200)]
    srd0 = [outcome(0, True, 50), outcome(1, True, 50), outcome(2, True, 50), outcome(3, False, 50)]
    srd1 = [outcome(i, False, 50) for i in range(4)]
    runs = [run("best_of_n", 2, 0, bon0), run("best_of_n", 2, 1, bon1), run("beam_search", 2, 0, beam),
            run("srd", 2, 0, srd0), run("srd", 2, 1, srd1)]  # fmt: skip
    table = search_paired(runs, pool_n=2)
    assert table is not None
    row = table.splitlines()[2].split("|")
    # beam right on 0, 2, 3 vs Best-of-2 right on 0, 1: +25 points, wins item 2 and 3, loses item 1
    assert row[1].strip() == "beam_search" and row[3].strip() == "4 × 1"
    assert row[4].strip().startswith("+25.0 pts") and row[5].strip() == "2 / 1 / 1"
    assert row[7].strip() == "2.00"  # 200 tokens against Best-of-2's 100
    # SRD seed 0: 3 of 4 right; beam wins item 2 and loses item 1: McNemar p 1
    srd_cell = row[8].strip()
    assert srd_cell.startswith("+0.0 pts [") and srd_cell.endswith("], p 1.000") and row[9].strip() == "4.00"
    assert search_paired([r for r in runs if r.method != "beam_search"], pool_n=2) is None


def test_candidate_spread_counts_answers_the_ceiling_and_the_vote_of_final_candidates():
    """Best-of-3's independent samples against a search run's final beams, which repeat one answer: the
    distinct answers per problem, whether some candidate is right, and the majority vote over them."""
    from benchmarks.real_text import candidate_spread

    def cands(*pairs):
        return [{"answer": a, "correct": c, "reward": 0.5, "n_tokens": 10} for a, c in pairs]

    def run(method, seed, per_item):
        recs = [{"item_id": str(i), "candidates": cs} for i, cs in enumerate(per_item)]
        spec = {"method": method, "seed": seed}
        return SimpleNamespace(method=method, budget=3, spec=spec, run_id=f"{method}-{seed}", records=recs)

    bon = run(
        "best_of_n",
        0,
        [cands(("1", True), ("2", False), ("2", False)), cands(("6", True), ("5", False), ("7", False))],
    )
    beam = run(
        "dvts",
        0,
        [cands(("2", False), ("2", False), ("2", False)), cands(("6", True), ("6", True), (None, False))],
    )
    # seed 1 was not searched: its Best-of-3 is left out
    other_seed = run("best_of_n", 1, [cands(("9", False), ("9", False), ("9", False))] * 2)
    rows = {
        r.split("|")[1].strip(): r.split("|")
        for r in candidate_spread([bon, beam, other_seed], 3).splitlines()[2:]
    }
    # Best-of-3: answers {1, 2} and {6, 5, 7}; some candidate right in both; the vote picks 2 (wrong), then
    # breaks a three-way tie by the answer seen first (6, right)
    assert rows["best_of_n"][3].strip() == "2 × 1" and rows["best_of_n"][4].strip() == "2.50"
    assert rows["best_of_n"][5].strip().startswith("100.0 [") and rows["best_of_n"][6].strip().startswith(
        "50.0 ["
    )
    # the beams: one answer each (no answer does not count); right only in the second, where the vote is right
    assert rows["dvts"][4].strip() == "1.00" and rows["dvts"][5].strip().startswith("50.0 [")
    assert rows["dvts"][6].strip().startswith("50.0 [")
    assert candidate_spread([bon, other_seed], 3) is None


class _Length:
    """A rule-based stand-in for another reward (a judge, say): a response's length, so its scores differ
    from the run's own."""

    name = "judge:m"

    def score(self, prompts, responses):
        return [len(r) / 100 for r in responses]


def test_a_pool_from_another_grid_carries_its_candidates_rescored(tmp_path, tiny_engine, datasets_dir):
    """--pool-from: another grid's Best-of-N run (a real one, made here on the tiny model) with every
    candidate's reward replaced by the cached re-scoring under this grid's reward; its spec names the
    reward it was made with; a problem without a cached score stops with the command that scores it."""
    from benchmarks.real_text import rescored_pool
    from benchmarks.reward_rescore import load_runs, rescore, scoreable
    from srd_worker.local import run_local
    from tests.unit.test_local_shard_status import _prepared

    settings, prepared = _prepared(tmp_path, datasets_dir, "best_of_n", {"n": 2, "max_new_tokens": 8})
    out = tmp_path / "grid"
    run_local(prepared, out_dir=out, settings=settings, engine=tiny_engine)
    run_id = prepared.spec.run_id()
    scores = tmp_path / "scores"
    with pytest.raises(SystemExit, match=f"--run {run_id} --rewards judge:m --items 4"):
        rescored_pool(out, scores, reward="judge:m", pool_n=2, seeds=[0], items=4)

    (run,) = load_runs(out / "srdq.db", [run_id])
    records = scoreable(run.records, 4)
    rescore(records, _Length, scores / run_id / "scores-judge_m.jsonl", progress=False)
    (pool,) = rescored_pool(out, scores, reward="judge:m", pool_n=2, seeds=[0], items=4)
    assert pool.run_id == run_id
    assert (pool.spec["reward"], pool.spec["rescored_from"]) == ("judge:m", "arithmetic")
    assert [[c["reward"] for c in r["candidates"]] for r in pool.records] == [
        [len(c.get("text") or "") / 100 for c in r["candidates"]] for r in records
    ]
    assert [[c["reward"] for c in r["candidates"]] for r in records] != [
        [c["reward"] for c in r["candidates"]] for r in pool.records
    ]  # the run's own rewards were others
    with pytest.raises(SystemExit, match="no finished best_of_n run at N = 4 for seeds"):
        rescored_pool(out, scores, reward="judge:m", pool_n=4, seeds=[0], items=4)
    with pytest.raises(SystemExit, match="no finished best_of_n run at N = 2 for seeds"):  # another model's
        rescored_pool(out, scores, reward="judge:m", pool_n=2, seeds=[0], items=4, like={"model": "other"})
    with pytest.raises(SystemExit, match="no finished best_of_n run"):  # other max_new_tokens
        rescored_pool(
            out, scores, reward="judge:m", pool_n=2, seeds=[0], items=4, like={"params.max_new_tokens": 9}
        )
    (same,) = rescored_pool(
        out, scores, reward="judge:m", pool_n=2, seeds=[0], items=4, like={"params.max_new_tokens": 8}
    )
    assert same.run_id == run_id


def test_the_token_ratio_compares_the_seeds_both_methods_have():
    """The routing row's measured tokens RS / SRD under ``--partial``: SRD's seed 1, which rejection sampling
    has not run yet, is left out of SRD's mean (pooling it compares different drafts); None without RS."""
    from benchmarks.testbed import token_ratio

    def run(method, seed, tokens):
        records = [{"item_id": f"p{i}", "ledger": {"gen_tokens": t}} for i, t in enumerate(tokens)]
        return SimpleNamespace(spec={"method": method, "n": 4, "seed": seed}, records=records)

    srd = [run("srd", 0, [100, 300]), run("srd", 1, [1000, 1000])]
    rs = [run("rejection_sampling", 0, [150, 250])]
    assert token_ratio(srd, rs) == pytest.approx(1.0)  # seed 0 alone: 200 / 200
    both = [*rs, run("rejection_sampling", 1, [500, 500])]
    assert token_ratio(srd, both) == pytest.approx(350 / 600)
    assert token_ratio(srd, None) is None and token_ratio(srd, []) is None


def test_the_section_names_the_machines_that_made_its_runs():
    """A grid whose runs were made on two kinds of machine lists each run under its host; runs recorded
    before srdq kept the host are named as such; a re-scored pool (made in another grid) is left out."""
    from benchmarks.real_text import hosts_text

    def run(method, seed, *hosts, rescored=False):
        runtime = [{"engine": {"name": "vllm"}, "host": h} for h in hosts]
        spec = {"seed": seed} | ({"rescored_from": "logprob"} if rescored else {})
        return SimpleNamespace(method=method, spec=spec, versions={"runtime": runtime} if hosts else {})

    epyc = {"arch": "x86_64", "cpu": "AMD EPYC", "isa": ["avx2"]}
    xeon = {"arch": "x86_64", "cpu": "Intel Xeon", "isa": ["avx2", "amx_bf16"]}
    one = hosts_text([run("srd", 0, epyc), run("rejection_sampling", 0, epyc)])
    assert one == (
        "Machines (each run's runtime records; a run resumed on another kind of machine counts under each): "
        "AMD EPYC; avx2: 2 runs."
    )
    mixed = hosts_text([run("srd", 0, epyc, xeon), run("srd", 1), run("best_of_n", 0, xeon, rescored=True)])
    assert "AMD EPYC; avx2: 1 run (srd seed 0)" in mixed
    assert "Intel Xeon; avx2 amx_bf16: 1 run (srd seed 0)" in mixed  # resumed on the other machine
    assert "not recorded (made before srdq kept it): 1 run (srd seed 1)" in mixed
    assert "best_of_n" not in mixed
    assert hosts_text([run("best_of_n", 0, xeon, rescored=True)]) == ""
    # begun before srdq kept the host, resumed after: both parts named
    resumed = hosts_text([run("srd", 0, {}, epyc)])
    assert "AMD EPYC; avx2: 1 run (srd seed 0)" in resumed and "not recorded" in resumed


@pytest.mark.e2e
def test_searches_with_a_reward_of_their_own_run_into_the_grids_store_and_section(tmp_path):
    """The benchmark end to end on the tiny random Llama: --search-reward judge-step:... runs beam search and
    DVTS as a second sweep into the grid's store, scored by the step judge and aggregated by min, and the
    grid's section pairs them with its Best-of-N and SRD; --analyse-only finds them again."""
    import json
    import os
    import sqlite3
    import subprocess
    import sys

    from benchmarks.real_text import ROOT

    args = [sys.executable, str(ROOT / "benchmarks" / "real_text.py"), "--model", "tiny-random-llama"]
    args += ["--engine", "transformers", "--rewards", "judge:tiny-random-llama", "--search-n", "4"]
    args += ["--search-reward", "judge-step:tiny-random-llama", "--items", "2", "--seeds", "0"]
    args += ["--budgets", "2", "--max-new-tokens", "16", "--chunk-tokens", "8", "--shard-size", "2"]
    args += ["--without", "speculative_rejection", "--work", str(tmp_path), "--no-write"]
    env = {**os.environ, "SRDQ_JUDGE_ENGINE": "transformers"}
    out = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "each step scored by `judge-step:tiny-random-llama` and a beam's score the lowest" in out.stdout
    assert "--search-reward judge-step:tiny-random-llama --search-aggregation min" in out.stdout
    with sqlite3.connect(tmp_path / "judge_tiny-random-llama" / "srdq.db") as con:
        specs = [json.loads(s) for (s,) in con.execute("select spec from run where status = 'done'")]
    rewards = {s["method"]: s["reward"] for s in specs}
    assert rewards == {
        "best_of_n": "judge:tiny-random-llama",
        "srd": "judge:tiny-random-llama",
        "rejection_sampling": "judge:tiny-random-llama",
        "beam_search": "judge-step:tiny-random-llama",
        "dvts": "judge-step:tiny-random-llama",
    }
    assert {s["params"].get("aggregation") for s in specs if s["method"] in ("beam_search", "dvts")} == {
        "min"
    }
    again = subprocess.run(
        [*args, "--analyse-only", str(tmp_path / "judge_tiny-random-llama")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    searched = [line for line in again.stdout.splitlines() if line.startswith("| beam_search | 4 | 2 × 1")]
    assert len(searched) == 2  # paired against Best-of-N and SRD, and what its final candidates hold


def test_intervals_resample_problems_with_all_their_seeds():
    """Two seeds of the same problems are one unit each: the same 40 problems run under a second,
    identical seed give the same AUROC interval as one seed (a bootstrap over problem-seeds would see 80
    units and narrow it), and the within-problem order counts problems, over 2 seeds."""

    def rec(item, pairs):
        return {"item_id": item, "candidates": [{"reward": r, "correct": c} for r, c in pairs]}

    records = [
        rec(f"p{i}", [(0.1 * (i % 7), True), (0.1 * (i % 5), False), (0.05 * (i % 3), i % 2 == 0)])
        for i in range(40)
    ]
    one = reward_auroc([SimpleNamespace(records=records)], resamples=300)
    two = reward_auroc([SimpleNamespace(records=records), SimpleNamespace(records=records)], resamples=300)
    assert one["auroc"] == two["auroc"] and one["problems"] == two["problems"] == 40
    assert (two["low"], two["high"]) == pytest.approx((one["low"], one["high"]), abs=0.02)
    assert one["high"] - one["low"] > 0.1  # a real interval, not a point
    assert two["above"]["problems"] == 40 and two["above"]["seeds"] == 2
    assert (two["above"]["low"], two["above"]["high"]) == (one["above"]["low"], one["above"]["high"])
    assert "problems with both, over 2 seeds)" in order_text(two["above"])


def test_the_revote_answers_each_method_from_its_answer_pool():
    """``experiment.revoted``: SRD's record is re-voted over its kept candidates, Speculative Rejection's
    (whose record lists only its archive of finished survivors, without statuses) and an ``archive_all``
    run's over every listed candidate; a record whose pool is refused gives None."""
    from srd_worker.testbed.experiment import answers_from_archive, revoted

    def cand(cid, vote, reward, correct, **extra):
        return {"id": cid, "vote": vote, "reward": reward, "correct": correct, **extra}

    # kept: class 0 (0.6) beats class 1 (0.5); with the discarded candidate, class 1 sums 1.4
    srd_cands = [
        cand(0, 0, 0.6, False, status="kept"),
        cand(1, 1, 0.5, True, status="kept"),
        cand(2, 1, 0.9, True, status="discarded"),
    ]
    spec_cands = [{k: v for k, v in c.items() if k != "status"} for c in srd_cands]

    def run(method, cands, seed=0, **params):
        spec = {"method": method, "seed": seed, "params": params}
        records = [
            {"item_id": "p", "correct": False, "candidates": cands},
            {"item_id": "q", "correct": True, "candidates": [cand(0, 0, -0.2, True, status="kept")]},
        ]
        return SimpleNamespace(spec=spec, records=records)

    assert revoted([run("srd", srd_cands)]) == {"p": {0: 0.0}, "q": {0: None}}
    assert revoted([run("srd", srd_cands, archive_all=True)])["p"] == {0: 1.0}
    assert revoted([run("speculative_rejection", spec_cands)])["p"] == {0: 1.0}
    # each seed is re-voted over its own run's pool
    two = revoted([run("srd", srd_cands, seed=0), run("srd", srd_cands, seed=1, archive_all=True)])
    assert two["p"] == {0: 0.0, 1: 1.0}
    assert answers_from_archive({"method": "speculative_rejection"})
    assert answers_from_archive({"method": "srd", "params": {"archive_all": True}})
    assert not answers_from_archive({"method": "rejection_sampling", "params": {}})


def test_the_revote_table_counts_each_methods_answer_pool():
    """``revote_table``: one row per pool method present; the pool size counts SRD's kept candidates and
    Speculative Rejection's whole archive, distinct answers among them; the vote's accuracy pairs with
    the run's own and with weighted Best-of-N's."""
    from benchmarks.testbed import revote_table
    from srd_worker.reports.stats import Interval

    def cand(cid, vote, reward, correct, **extra):
        return {"id": cid, "vote": vote, "reward": reward, "correct": correct, **extra}

    def run(method, records):
        return SimpleNamespace(spec={"method": method, "seed": 0, "params": {}}, records=records)

    srd_records = [  # p: the kept pool votes class 1 (1.0 > 0.6); q: one kept candidate
        {
            "item_id": "p",
            "correct": False,
            "candidates": [
                cand(0, 0, 0.6, False, status="kept"),
                cand(1, 1, 0.5, True, status="kept"),
                cand(2, 1, 0.5, True, status="kept"),
                cand(3, 3, 0.9, False, status="discarded"),
            ],
        },
        {"item_id": "q", "correct": True, "candidates": [cand(0, 0, 0.4, True, status="kept")]},
    ]
    spec_records = [  # Speculative Rejection lists its archive only, without statuses
        {"item_id": "p", "correct": False, "candidates": [cand(0, 0, 0.9, False), cand(4, 4, 0.2, True)]},
        {"item_id": "q", "correct": True, "candidates": [cand(0, 0, 0.4, True)]},
    ]
    by = {
        ("srd", 4): [run("srd", srd_records)],
        ("speculative_rejection", 4): [run("speculative_rejection", spec_records)],
    }
    acc = Interval(0.5, 0.0, 1.0, 2, 1)
    tok = {
        ("srd", 4): SimpleNamespace(accuracy=acc),
        ("speculative_rejection", 4): SimpleNamespace(accuracy=acc),
        ("weighted_best_of_n", 4): SimpleNamespace(values={"p": {0: 0.0}, "q": {0: 1.0}}),
    }
    rows = [line for line in revote_table(by, tok, [4]).splitlines() if line.startswith("| 4 |")]
    assert [r.split(" | ")[1] for r in rows] == ["srd", "speculative_rejection"]  # no rejection_sampling runs
    srd, spec = ([c.strip() for c in r.strip("|").split("|")] for r in rows)
    # SRD: the vote answers p right (a win), q unchanged; 3 and 1 kept candidates, 2 and 1 distinct answers
    assert srd[4].startswith("+50.0 pts") and srd[5] == "1 / 1 / 0" and srd[6].startswith("+50.0 pts")
    assert srd[7] == "2.00 (1.50)"
    # Speculative Rejection: its archive of two (0.9 > 0.2) keeps the argmax: no change
    assert spec[4].startswith("+0.0 pts") and spec[5] == "0 / 2 / 0" and spec[7] == "1.50 (1.50)"


def test_cutoff_counts_cut_candidates_the_picks_among_them_and_ranking_only_ended_ones():
    """Two problems × two seeds: the reward ranks a cut-off candidate first three times; ranking only the
    candidates that ended changes the answer where a right one ended; a problem-seed whose candidates were
    all cut keeps its pick; a tie keeps the first; without a cut candidate there is no line."""
    from benchmarks.real_text import cutoff_text

    def run(seed, records):
        return SimpleNamespace(spec={"seed": seed}, records=records)

    def rec(item, cands):
        return {
            "item_id": item,
            "candidates": [{"reward": r, "correct": c, "finish": f} for r, c, f in cands]
            + [{"reward": None, "correct": True, "finish": "eos"}],  # unscored: left out
        }

    runs = [
        run(0, [rec("a", [(0.9, False, "length"), (0.5, True, "eos")]),  # cut picked; ended right
                rec("b", [(0.8, True, "eos"), (0.8, False, "length")])]),  # tie: the first (ended) kept
        run(1, [rec("a", [(0.9, False, "length"), (0.4, False, "eos")]),  # cut picked; ended wrong too
                rec("b", [(0.7, False, "length"), (0.6, False, "length")])]),  # all cut: pick stays
    ]  # fmt: skip
    text = cutoff_text(runs)
    assert text is not None
    assert "**5 of 8**" in text and "mean reward 0.780 against 0.567" in text
    assert "pick was one of them in **3 of 4** problem-seeds" in text
    # ended only: right on (a, 0) and (b, 0) = 50%; argmax: right on (b, 0) = 25%; one win, three ties
    assert "ended (all of them where none did): 50.0% [" in text and "against 25.0% [" in text
    assert "(paired +25.0 pts [" in text and ", 1 / 3 / 0, McNemar p 1.000)" in text
    no_cut = [run(0, [rec("a", [(0.9, False, "eos"), (0.5, True, "stop")])])]
    assert cutoff_text(no_cut) is None
