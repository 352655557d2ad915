"""benchmarks/reward_rescore.py: stored candidates re-scored by another (real, rule-based) reward, scores kept
per problem so an interrupted re-scoring resumes, and the comparison it prints (AUROC, Best-of-k, paired)."""

from __future__ import annotations

import json

import pytest

from srd_worker.reports.rows import RunRecords
from srd_worker.rewards.registry import build_reward

pytestmark = pytest.mark.unit

RIGHT = "2 + 3 = 5, 5 * 4 = 20. The answer is 20."
WRONG = "2 + 3 = 7. The answer is 28."


def _run(n_problems: int, seed: int = 0) -> RunRecords:
    """Best-of-4 records whose own reward ranks the wrong candidates first (two right, two wrong each)."""
    records = []
    for i in range(n_problems):
        cands = [
            {
                "id": j,
                "text": text,
                "reward": reward,
                "correct": text == RIGHT,
                "answer": text[-3:-1],
                "n_tokens": 10,
            }
            for j, (text, reward) in enumerate([(WRONG, 0.9), (RIGHT, 0.1), (WRONG, 0.8), (RIGHT, 0.2)])
        ]
        records.append({"item_id": f"line-{i}", "question": "What is (2 + 3) * 4?", "candidates": cands})
    spec = {"method": "best_of_n", "params": {"n": 4}, "reward": "logprob", "seed": seed}
    return RunRecords(f"run-s{seed}", "best_of_n-gsm8k", spec, "done", n_problems, None, records)


class Counting:
    """The arithmetic reward, counting the responses it is asked to score."""

    def __init__(self) -> None:
        self.inner = build_reward("arithmetic", None)
        self.name = self.inner.name
        self.scored = 0

    def score(self, prompts, responses):
        self.scored += len(responses)
        return self.inner.score(prompts, responses)


def test_rescoring_resumes_from_its_cache_and_leaves_the_run_alone(tmp_path):
    from benchmarks.reward_rescore import rescore, scoreable, with_scores

    run = _run(3)
    cache = tmp_path / "scores-arithmetic.jsonl"
    reward = Counting()
    first, _ = rescore(scoreable(run.records, 2), lambda: reward, cache, progress=False)
    assert reward.scored == 8 and len(cache.read_text().splitlines()) == 2
    assert first["line-0"] == {0: pytest.approx(1 / 3), 1: 0.75, 2: pytest.approx(1 / 3), 3: 0.75}
    again = Counting()
    scores, _ = rescore(scoreable(run.records, 3), lambda: again, cache, progress=False)
    assert again.scored == 4  # only the third problem was scored; the first two came from the cache
    assert scores["line-0"] == first["line-0"] and set(scores) == {"line-0", "line-1", "line-2"}
    assert [json.loads(x)["item"] for x in cache.read_text().splitlines()] == ["line-0", "line-1", "line-2"]

    def unbuildable():
        raise AssertionError("every score is cached: the reward (a judge model, say) must not be built")

    cached, spent = rescore(scoreable(run.records, 3), unbuildable, cache, progress=False)
    assert cached == scores
    rows = [json.loads(x) for x in cache.read_text().splitlines()]
    assert spent == pytest.approx(sum(r["s"] for r in rows))
    cache.write_text("".join(json.dumps({**r, "s": 10.0 * (i + 1)}) + "\n" for i, r in enumerate(rows)))
    _, fewer = rescore(scoreable(run.records, 2), unbuildable, cache, progress=False)
    assert fewer == pytest.approx(30.0)  # the time of the problems asked for (10 + 20 s), not the whole cache

    rescored = with_scores(run, run.records, scores)
    assert [c["reward"] for c in rescored.records[0]["candidates"]][1] == 0.75
    assert run.records[0]["candidates"][1]["reward"] == 0.1  # the run itself is untouched


def test_a_last_line_cut_short_by_a_kill_is_scored_again(tmp_path):
    from benchmarks.reward_rescore import rescore, scoreable

    run = _run(3)
    cache = tmp_path / "scores-arithmetic.jsonl"
    first, _ = rescore(scoreable(run.records, 2), Counting, cache, progress=False)
    whole = cache.read_text()
    cache.write_text(whole[: len(whole) - 20])  # the second problem's line, half written
    again = Counting()
    scores, _ = rescore(scoreable(run.records, 3), lambda: again, cache, progress=False)
    assert again.scored == 8  # the cut line's problem and the third one
    assert scores["line-1"] == first["line-1"]
    assert [json.loads(x)["item"] for x in cache.read_text().splitlines()] == ["line-0", "line-1", "line-2"]
    cache.write_text("{not json\n" + cache.read_text())  # a broken line before the last: refused, kept
    with pytest.raises(SystemExit, match="line 1 is not JSON"):
        rescore(scoreable(run.records, 3), Counting, cache, progress=False)


def test_scoreable_skips_errors_and_problems_without_candidates():
    from benchmarks.reward_rescore import scoreable

    run = _run(3)
    run.records[0]["error"] = "boom"
    run.records[1]["candidates"] = []
    assert [r["item_id"] for r in scoreable(run.records, 5)] == ["line-2"]


def test_the_comparison_ranks_a_reward_that_finds_the_right_answers_above_one_that_does_not(tmp_path):
    from benchmarks.reward_rescore import compare, rescore, table, with_scores

    run = _run(6)
    scores, _ = rescore(run.records, Counting, tmp_path / "s.jsonl", progress=False)
    runs = {
        "logprob": [with_scores(run, run.records, None)],
        "arithmetic": [with_scores(run, run.records, scores)],
    }
    out = compare(runs, "logprob", [2, 4])
    own, arith = out["rewards"]["logprob"], out["rewards"]["arithmetic"]
    assert own["auroc"]["auroc"] == 0.0 and arith["auroc"]["auroc"] == 1.0
    # Best-of-4 by the run's reward takes a wrong candidate, by arithmetic a right one; Best-of-2 over the 6
    # pairs of 4 candidates: the run's reward is right only when both are right (1 of 6), arithmetic when
    # either is (5 of 6)
    assert own["best_of_4"].mean == 0.0 and arith["best_of_4"].mean == 1.0
    assert own["best_of_2"].mean == pytest.approx(1 / 6) and arith["best_of_2"].mean == pytest.approx(5 / 6)
    assert arith["paired_4"].diff.mean == pytest.approx(1.0) and arith["paired_4"].wins == 6
    assert out["sampling"].mean == pytest.approx(0.5) and out["pass"][4].mean == 1.0
    text = table(out, "logprob", [2, 4], {"arithmetic": 0.0})
    # within each problem the run's reward puts both wrong candidates above both right ones, arithmetic the reverse
    assert own["above"].mean == 0.0 and arith["above"].mean == 1.0
    # (every problem's share is 1: the exact interval over its 6 problems, [0.025^(1/6), 1])
    assert (
        "| `arithmetic` | 1.000 [1.000, 1.000] | 100.0 [54.1, 100.0] | 83.3" in text and "+100.0 pts" in text
    )


def test_seeds_pool_into_problem_seeds_and_other_configurations_are_refused(tmp_path):
    """--run A,B: each seed's candidates scored from its own cache, the comparison paired over
    problems × seeds; runs of different configurations, or two of one seed, are refused."""
    from dataclasses import replace

    from benchmarks.reward_rescore import check_seeded, compare, rescore, with_scores

    seeded = [_run(3, seed=0), _run(3, seed=1)]
    runs: dict[str, list] = {"logprob": [], "arithmetic": []}
    for r in seeded:
        scores, _ = rescore(r.records, Counting, tmp_path / r.run_id / "s.jsonl", progress=False)
        runs["logprob"].append(with_scores(r, r.records, None))
        runs["arithmetic"].append(with_scores(r, r.records, scores))
    out = compare(runs, "logprob", [4])
    paired = out["rewards"]["arithmetic"]["paired_4"]
    assert (paired.problems, paired.seeds, paired.wins, paired.losses) == (3, 2, 6, 0)
    assert out["rewards"]["arithmetic"]["auroc"]["problems"] == 3  # problems (each with its 2 seeds)
    assert sorted(p.parent.name for p in tmp_path.glob("*/s.jsonl")) == ["run-s0", "run-s1"]

    check_seeded(seeded)  # one configuration, two seeds
    with pytest.raises(SystemExit, match="share a seed"):
        check_seeded([seeded[0], replace(seeded[1], spec={**seeded[1].spec, "seed": 0})])
    with pytest.raises(SystemExit, match="differ in reward"):
        check_seeded([seeded[0], replace(seeded[1], spec={**seeded[1].spec, "reward": "judge:m"})])
    with pytest.raises(SystemExit, match="differ in params"):
        check_seeded([seeded[0], replace(seeded[1], spec={**seeded[1].spec, "params": {"n": 8}})])


def test_a_cached_problem_missing_a_candidate_is_scored_again(tmp_path):
    """A cache row written for fewer candidates than are now asked for is not taken as complete."""
    from benchmarks.reward_rescore import rescore, scoreable

    run = _run(2)
    cache = tmp_path / "s.jsonl"
    few = [{**r, "candidates": r["candidates"][:2]} for r in scoreable(run.records, 2)]
    rescore(few, Counting, cache, progress=False)
    again = Counting()
    scores, _ = rescore(scoreable(run.records, 2), lambda: again, cache, progress=False)
    assert again.scored == 8 and set(scores["line-0"]) == {0, 1, 2, 3}
    reread, _ = rescore(scoreable(run.records, 2), Counting, cache, progress=False)
    assert reread == scores  # the later, complete line replaces the earlier one when read back


def test_cut_records_cuts_at_the_policy_tokens_and_keeps_the_final_label():
    """Byte-level tokenizer (one token a byte): a text longer than the cut is cut to exactly that many
    tokens and marked, a shorter one is kept whole; only the first C candidates by id are taken."""
    from benchmarks.reward_rescore import cut_records
    from srd_worker.engines.loading import build_tiny_llama

    _, tok = build_tiny_llama()
    rec = {
        "item_id": "line-0",
        "question": "q",
        "candidates": [
            {"id": 2, "text": "short", "correct": True},
            {"id": 0, "text": "a long response here", "correct": False},
            {"id": 1, "text": "another long one", "correct": True},
        ],
    }
    (out,) = cut_records([rec], tok, 8, 2)
    assert [c["id"] for c in out["candidates"]] == [0, 1]
    assert [c["text"] for c in out["candidates"]] == ["a long r", "another "]
    assert all(c["cut"] for c in out["candidates"]) and [c["correct"] for c in out["candidates"]] == [
        False,
        True,
    ]
    (whole,) = cut_records([rec], tok, 8, 3)
    assert whole["candidates"][2] == {"id": 2, "text": "short", "cut": False, "correct": True}


def test_early_stats_measure_how_the_rank_router_treats_the_right_candidates():
    """Hand-made pools of four (θ 0.5 / 0.3: ranks 0-1 kept, rank 2 refined, rank 3 discarded)."""
    from benchmarks.reward_rescore import early_groups, early_stats, early_table

    # problem A: the right one scores lowest (discarded); problem B: the right one scores highest (kept);
    # problem C: all tied, the right one is the last by id (discarded by the tie break); D: none right
    groups = [
        [(0.9, False), (0.8, False), (0.7, False), (0.1, True)],
        [(0.2, False), (0.9, True), (0.5, False), (0.4, False)],
        [(0.5, False), (0.5, False), (0.5, False), (0.5, True)],
        [(0.3, False), (0.6, False), (0.2, False), (0.1, False)],
    ]
    st = early_stats(groups, (0.5, 0.3))
    assert st["above"].mean == pytest.approx((0.0 + 1.0 + 0.5) / 3)
    assert st["tied"].mean == pytest.approx((0 + 0 + 1 + 0) / 4)
    assert st["kept"].mean == pytest.approx(1 / 3) and st["dropped"].mean == pytest.approx(2 / 3)
    assert st["keep_share"] == 0.5 and st["drop_share"] == 0.25
    assert st["auroc"]["problems"] == 4
    row = early_table([("logprob", "128 tokens", 4, 16, st)]).splitlines()[2].split("|")
    assert row[6].strip() == "25.00"  # the tied share alone: a share of pairs has no 0/1 interval
    assert row[7].strip().startswith("33.3 [")  # the right ones kept, with their interval

    cut = [
        {
            "item_id": "p",
            "candidates": [
                {"id": 0, "cut": True, "correct": True},
                {"id": 1, "cut": False, "correct": False},
            ],
        }
    ]
    # the cut candidate takes its prefix score, the one that had finished its final score
    assert early_groups(cut, {"p": {0: 0.2}}, {"p": {0: 0.9, 1: 0.7}}) == [[(0.2, True), (0.7, False)]]


def test_thetas_default_to_srds_and_bad_ones_are_refused():
    from benchmarks.reward_rescore import _thetas
    from srd_worker.methods.srd_loop import SRDParams

    assert _thetas("") == (SRDParams().theta_high, SRDParams().theta_low)
    assert _thetas("0.75,0.25") == (0.75, 0.25)
    for bad in ("0.3,0.5", "0.5", "high,low", "1.5,0.2"):
        with pytest.raises(SystemExit, match="--thetas"):
            _thetas(bad)
