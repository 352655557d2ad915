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
    assert "| `arithmetic` | 1.000 [1.000, 1.000] | 83.3" in text and "+100.0 pts" in text


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
    assert out["rewards"]["arithmetic"]["auroc"]["problems"] == 6  # problem-seeds
    assert sorted(p.parent.name for p in tmp_path.glob("*/s.jsonl")) == ["run-s0", "run-s1"]

    check_seeded(seeded)  # one configuration, two seeds
    with pytest.raises(SystemExit, match="share a seed"):
        check_seeded([seeded[0], replace(seeded[1], spec={**seeded[1].spec, "seed": 0})])
    with pytest.raises(SystemExit, match="differ in reward"):
        check_seeded([seeded[0], replace(seeded[1], spec={**seeded[1].spec, "reward": "judge:m"})])
    with pytest.raises(SystemExit, match="differ in params"):
        check_seeded([seeded[0], replace(seeded[1], spec={**seeded[1].spec, "params": {"n": 8}})])
