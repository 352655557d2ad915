"""Coupled SRD vs rejection-sampling comparison on hand-made records (numbers checked by hand)."""

from __future__ import annotations

import pytest

from srd_worker.reports.coupled import compare


def rec(item, rmax, refinements=0, improved=0, before=None, after=None):
    return {
        "item_id": item,
        "extra": {
            "R_max": rmax,
            "refinements": refinements,
            "refine_improved": improved,
            "reward_before_refine": before,
            "reward_after_refine": after,
        },
    }


def test_wins_ties_losses_and_delta():
    srd = [rec("a", 0.9, 2, 1, 0.4, 0.6), rec("b", 0.5), rec("c", 0.2, 1, 0, 0.3, 0.1), rec("d", None)]
    rs = [rec("a", 0.7), rec("b", 0.5), rec("c", 0.4), rec("d", 0.1)]
    c = compare(srd, rs)
    assert c.items == 3  # d has no kept trajectory in SRD
    assert (c.wins, c.ties, c.losses) == (1, 1, 1)
    assert c.mean_rmax_srd == pytest.approx((0.9 + 0.5 + 0.2) / 3)
    assert c.mean_rmax_rs == pytest.approx((0.7 + 0.5 + 0.4) / 3)
    assert c.delta_n == pytest.approx((0.2 + 0.0 - 0.2) / 3)
    assert c.refinements == 3 and c.refinements_improved == pytest.approx(1 / 3)
    # means weighted by each item's number of refinements
    assert c.reward_before_refine == pytest.approx((0.4 * 2 + 0.3) / 3)
    assert c.reward_after_refine == pytest.approx((0.6 * 2 + 0.1) / 3)


def test_items_must_match():
    with pytest.raises(ValueError, match="not in the rejection-sampling run"):
        compare([rec("a", 1.0)], [rec("b", 1.0)])


def test_no_refinements_gives_none():
    c = compare([rec("a", 1.0)], [rec("a", 1.0)])
    assert c.refinements == 0 and c.refinements_improved is None and c.reward_before_refine is None


def test_delta_n_has_a_paired_bootstrap_interval():
    srd = [rec(str(i), 0.5 + 0.1 * (i % 3)) for i in range(12)]
    rs = [rec(str(i), 0.5) for i in range(12)]
    c = compare(srd, rs)
    lo, hi = c.delta_n_ci
    assert lo <= c.delta_n <= hi and lo >= 0.0 and hi <= 0.2


def test_paired_records_of_any_two_runs():
    from srd_worker.reports.coupled import paired_records
    from srd_worker.reports.stats import mcnemar_exact

    def graded(item, ok, reward=None):
        return {"item_id": item, "correct": ok, "reward": reward, "error": None}

    a = [graded(str(i), i < 11) for i in range(14)] + [graded("x", True)]
    b = [graded(str(i), i >= 10) for i in range(14)]
    metric, res = paired_records(a, b)  # discordant: A wins 0..9 (10), B wins 11..13 (3)
    assert metric == "accuracy" and res.pairs == 14 and (res.wins, res.ties, res.losses) == (10, 1, 3)
    assert res.mcnemar_p == pytest.approx(mcnemar_exact(10, 3))
    assert res.diff.mean == pytest.approx(7 / 14)
    metric, res = paired_records([graded("a", None, 0.4)], [graded("a", None, 0.2)])
    assert metric == "reward" and res.wins == 1 and res.mcnemar_p is None
    with pytest.raises(ValueError, match="share no item"):
        paired_records([graded("a", True)], [graded("b", True)])


@pytest.mark.e2e
def test_compare_command_on_two_real_coupled_runs(tmp_path, tiny_engine):
    import json

    from click.testing import CliRunner
    from srdq_cli.main import cli

    from srd_worker.local import run_local
    from srd_worker.settings import Settings
    from srd_worker.spec import prepare_run

    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(
            json.dumps({"question": f"What is {i} + {i}?", "answer": f"#### {2 * i}"}) + "\n"
            for i in range(3)
        )
    )
    ids = {}
    for method in ("srd", "rejection_sampling", "best_of_n"):
        prepared = prepare_run(
            dataset=data,
            method=method,
            params={"n": 6, "max_new_tokens": 24, "chunk_tokens": 8},
            model="tiny-random-llama",
            reward="arithmetic",
            seed=4,
        )
        ids[method] = run_local(
            prepared, out_dir=tmp_path / "out", settings=Settings(), engine=tiny_engine
        ).run_id
    runner = CliRunner()
    ok = runner.invoke(
        cli, ["compare", ids["srd"], ids["rejection_sampling"], "--db", str(tmp_path / "out"), "--json"]
    )
    assert ok.exit_code == 0, ok.output
    data = json.loads(ok.output)
    assert data["items"] == 3 and data["wins"] + data["ties"] + data["losses"] == 3
    wrong = runner.invoke(cli, ["compare", ids["srd"], ids["best_of_n"], "--db", str(tmp_path / "out")])
    assert wrong.exit_code == 1 and "is a best_of_n run, not rejection_sampling" in wrong.output
    args = ["compare", ids["srd"], ids["best_of_n"], "--paired", "--db", str(tmp_path / "out")]
    pj = runner.invoke(cli, [*args, "--json"])
    assert pj.exit_code == 0, pj.output
    res = json.loads(pj.output)
    assert (
        res["metric"] == "accuracy" and res["pairs"] == 3 and res["wins"] + res["ties"] + res["losses"] == 3
    )
    assert 0 <= res["mcnemar_p"] <= 1 and res["notes"] == []
    text = runner.invoke(cli, args)
    assert text.exit_code == 0 and "McNemar exact p" in text.output and "wins / ties / losses" in text.output
    # one run against itself is a slip (every pair ties): refused, with or without --paired
    for extra in ([], ["--paired"]):
        same = runner.invoke(cli, ["compare", ids["srd"], ids["srd"], *extra, "--db", str(tmp_path / "out")])
        assert same.exit_code == 2 and f"A and B are both {ids['srd']}" in same.output


def _specs():
    common = {"dataset_sha256": "ab", "task": "gsm8k", "fields": {}, "model": "m", "engine": "transformers"}
    common |= {"reward": "arithmetic", "seed": 3, "limit": None}
    draft = {
        "n": 10,
        "temperature": 0.8,
        "top_p": 0.9,
        "top_k": 50,
        "max_new_tokens": 500,
        "chunk_tokens": 100,
    }
    draft |= {"archive_all": False, "rank_unfinished_only": False}
    srd = common | {
        "method": "srd",
        "params": draft | {"theta_high": 0.5, "theta_low": 0.3, "form": "incremental"},
    }
    rs = common | {"method": "rejection_sampling", "params": draft | {"variant": "rank", "theta": 0.5}}
    return srd, rs


def test_a_coupled_pair_has_no_mismatch():
    from srd_worker.reports.coupled import coupling_mismatches

    assert coupling_mismatches(*_specs()) == []


@pytest.mark.parametrize(
    "side,path,value,message",
    [
        ("rs", ("params", "n"), 8, "parameter n differs: 10 vs 8"),
        ("rs", ("params", "temperature"), 1.0, "parameter temperature differs"),
        ("srd", ("params", "max_new_tokens"), 400, "parameter max_new_tokens differs"),
        ("srd", ("params", "chunk_tokens"), 50, "parameter chunk_tokens differs"),
        ("rs", ("params", "theta"), 0.6, "theta 0.6 differs from SRD's theta_high 0.5"),
        ("rs", ("params", "variant"), "absolute", "variant=absolute, not rank"),
        ("srd", ("params", "form"), "batch", "form=batch"),
        ("rs", ("seed",), 4, "seed differs: 3 vs 4"),
        ("rs", ("dataset_sha256",), "cd", "dataset_sha256 differs"),
        ("rs", ("model",), "other", "model differs"),
        ("srd", ("reward",), "lm_judge", "reward differs"),
        ("rs", ("method",), "best_of_n", "the second run is a best_of_n run, not rejection_sampling"),
        ("srd", ("method",), "best_of_n", "the first run is a best_of_n run, not srd"),
    ],
)
def test_each_broken_coupling_is_named(side, path, value, message):
    from srd_worker.reports.coupled import coupling_mismatches

    srd, rs = _specs()
    target = srd if side == "srd" else rs
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    problems = coupling_mismatches(srd, rs)
    assert len(problems) == 1 and message in problems[0], problems


def test_specs_that_leave_variant_and_form_to_their_defaults_are_coupled():
    """rank is rejection sampling's default variant and incremental SRD's default form: a spec that does
    not name them is the coupled pair."""
    from srd_worker.reports.coupled import coupling_mismatches

    srd, rs = _specs()
    del srd["params"]["form"], rs["params"]["variant"]
    assert coupling_mismatches(srd, rs) == []


def test_equal_rewards_tie_and_missing_counts_weigh_nothing():
    # equal R_max is a tie, never both a win and a loss
    c = compare([rec("a", 0.5), rec("b", 0.7)], [rec("a", 0.5), rec("b", 0.2)])
    assert (c.wins, c.ties, c.losses) == (1, 1, 0)
    # a record's before/after rewards weigh by its refinement count: no count, no weight; no reward, 0
    no_count = {
        "item_id": "a",
        "extra": {"R_max": 0.5, "reward_before_refine": 0.9, "reward_after_refine": 0.9},
    }
    no_reward = {"item_id": "b", "extra": {"R_max": 0.5, "refinements": 2}}
    c = compare([no_count, no_reward, rec("c", 0.5, 1, 1, 0.3, 0.6)], [rec(i, 0.5) for i in "abc"])
    assert c.refinements == 3
    assert c.reward_before_refine == pytest.approx(0.3 / 3) and c.reward_after_refine == pytest.approx(
        0.6 / 3
    )


def test_no_pair_with_both_rewards_gives_no_means():
    c = compare([rec("a", None)], [rec("a", 0.5)])
    assert (c.items, c.mean_rmax_srd, c.mean_rmax_rs, c.delta_n) == (0, None, None, None)


def test_paired_records_auto_metric_needs_grades_on_both_sides_and_passes_its_seed():
    from srd_worker.reports.coupled import paired_records
    from srd_worker.reports.stats import paired

    a = [{"item_id": str(i), "correct": i % 2 == 0, "reward": 0.1 * i, "error": None} for i in range(6)]
    b = [{"item_id": str(i), "correct": None, "reward": 0.05 * i, "error": None} for i in range(6)]
    metric, res = paired_records(a, b)  # B has no grade: the rewards are compared
    assert metric == "reward"
    assert res == paired([0.1 * i for i in range(6)], [0.05 * i for i in range(6)], seed=0)
    _, seeded = paired_records(a, b, seed=5)
    assert seeded == paired([0.1 * i for i in range(6)], [0.05 * i for i in range(6)], seed=5)


def test_a_difference_of_exactly_tie_tol_is_a_tie():
    # 0.75 - 0.5 = 0.25 = tie_tol exactly (binary fractions): neither "a > b + tol" nor "b > a + tol"
    c = compare(
        [rec("a", 0.75), rec("b", 0.5), rec("c", 1.0)],
        [rec("a", 0.5), rec("b", 0.75), rec("c", 0.5)],
        tie_tol=0.25,
    )
    assert (c.wins, c.ties, c.losses) == (1, 2, 0)


def test_comparison_to_dict_gives_every_field():
    c = compare([rec("a", 0.75, 2, 1, 0.25, 0.5), rec("b", 0.5)], [rec("a", 0.5), rec("b", 0.5)])
    d = c.to_dict()
    assert d["items"] == 2 and (d["wins"], d["ties"], d["losses"]) == (1, 1, 0)
    assert d["delta_n"] == pytest.approx(0.125) and d["refinements"] == 2 and d["refinements_improved"] == 0.5
    assert (d["reward_before_refine"], d["reward_after_refine"]) == (0.25, 0.5)
    assert d["delta_n_ci"] == c.delta_n_ci and d["mean_rmax_srd"] == pytest.approx(0.625)
