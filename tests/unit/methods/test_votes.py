"""Majority votes over answer classes: the pure rules, the math tasks' equivalence (real math-verify),
and where the classes reach (self-consistency, the records' candidates, the k-curves, regrade)."""

from __future__ import annotations

import pytest

from srd_worker.methods.base import StepContext
from srd_worker.methods.registry import build_method
from srd_worker.reports.kcurves import vote_at_k
from srd_worker.runner import run_shard
from srd_worker.tasks.base import Item, same_answer_of, vote_candidates
from srd_worker.tasks.gsm8k import GSM8KTask
from srd_worker.tasks.hotpotqa import HotpotQATask
from srd_worker.tasks.math500 import Math500Task
from srd_worker.tasks.regrade import regrade_candidates
from srd_worker.votes import answer_classes, majority, whitespace_classes
from tests.doubles import MemoryStore


def by_value(a: str, b: str) -> bool:
    return float(a) == float(b)


def test_classes_are_the_first_index_of_each_class():
    assert whitespace_classes(["4", None, " 4", "5", "4  "]) == [0, None, 0, 3, 0]
    assert whitespace_classes([" 1 2", "1  2", "12"]) == [0, 0, 2]
    assert answer_classes(["2", "2.0", "3", "3.00", None, "2e0"], by_value) == [0, 0, 2, 2, None, 0]
    assert answer_classes([None, None]) == [None, None]


def test_an_answer_joins_the_first_class_whose_first_answer_it_equals():
    # a non-transitive "same": b is near both a and c, which are not near each other
    def near(x: str, y: str) -> bool:
        return abs(float(x) - float(y)) <= 1

    assert answer_classes(["0", "2", "1"], near) == [0, 1, 0]  # "1" joins "0"'s class, seen first
    assert answer_classes(["2", "0", "1"], near) == [0, 1, 0]
    # only a class's first answer is compared: "2" is near "1" (in 0's class) but not near "0"
    assert answer_classes(["0", "1", "2"], near) == [0, 0, 2]


def test_a_same_answer_that_raises_means_different_and_each_string_is_compared_once():
    calls = []

    def same(a: str, b: str) -> bool:
        calls.append((a, b))
        if "x" in (a + b):
            raise ValueError("unparsable")
        return float(a) == float(b)

    assert answer_classes(["1", "x", "1.0", "1.0", "x", "1"], same) == [0, 1, 0, 0, 1, 0]
    assert calls == [("x", "1"), ("1.0", "1")]  # repeats reuse their string's class


def test_majority_counts_classes_and_weights():
    assert majority([0, 1, 1, None]) == 1
    assert majority([0, 1, 0, 1]) == 0  # tie: the class seen first
    assert majority([None, None]) is None
    assert majority([0, 1, 1], [0.9, 0.3, 0.5]) == 0  # 0.9 > 0.8
    assert majority([0, 1, 1], [0.9, 0.5, float("nan")]) == 0  # NaN adds nothing
    assert majority([0, 1, 1], [0.9, 0.5, 0.5]) == 1


@pytest.mark.parametrize(
    "task,answers,classes",
    [
        (Math500Task(), ["0.5", "\\frac{1}{2}", "3", "1/2", "\\dfrac12"], [0, 0, 2, 0, 0]),
        (Math500Task(), ["x^2+1", "1+x^2", "(1, 2)", "(2, 1)"], [0, 0, 2, 3]),
        (GSM8KTask(), ["18", "18.00", "\\$18", "19"], [0, 0, 0, 3]),
        (HotpotQATask(), ["The Beatles", "beatles", "Beatles!", "Queen"], [0, 0, 0, 3]),
    ],
)
def test_the_tasks_equivalence_makes_the_classes(task, answers, classes):
    assert answer_classes(answers, same_answer_of(task)) == classes


def test_a_task_without_same_answer_compares_strings():
    class Plain:
        pass

    assert same_answer_of(Plain()) is None
    cands = [{"answer": "0.5"}, {"answer": "\\frac12"}, {"answer": " 0.5"}, {"answer": None}]
    vote_candidates(Plain(), cands)
    assert [c["vote"] for c in cands] == [0, 1, 0, None]


def _sc_state(answers):
    from srd_worker.methods.pool import new_candidate

    cands = [new_candidate() for _ in answers]
    for i, c in enumerate(cands):
        c["text"], c["finish"] = f"response {i}", "eos"
    return {"answers": list(answers), "candidates": cands}


def test_self_consistency_votes_by_value_when_its_state_has_classes():
    method = build_method("self_consistency", {"n": 5})
    answers = ["3", "0.5", "\\frac{1}{2}", "1/2", "3"]
    # as strings "3" has 2 votes and each form of a half 1; by value the half has 3
    assert (method.result(_sc_state(answers))["chosen"], method.result(_sc_state(answers))["votes"]) == (0, 2)
    state = {**_sc_state(answers), "classes": answer_classes(answers, same_answer_of(Math500Task()))}
    rec = method.result(state)
    assert (rec["chosen"], rec["votes"], rec["response"]) == (1, 3, "response 1")


def test_majority_at_k_counts_the_records_vote_classes():
    cands = [
        {"answer": "3", "correct": False, "reward": 0.1},
        {"answer": "0.5", "correct": True, "reward": 0.2},
        {"answer": "\\frac12", "correct": True, "reward": 0.3},
    ]
    assert vote_at_k(cands, 3) == 0.0  # a record without votes: three one-vote strings, "3" first
    vote_candidates(Math500Task(), cands)
    assert [c["vote"] for c in cands] == [0, 1, 1]
    assert vote_at_k(cands, 3) == 1.0
    # k = 2: of the 3 pairs, {0.5, 1/2} votes right; {3, 0.5} and {3, 1/2} tie and "3" (first) wins
    assert vote_at_k(cands, 2) == pytest.approx(1 / 3)


def test_regrade_sets_the_votes_of_an_old_record():
    item = Item("q", "half", "\\frac12")
    old = [{"text": "so \\boxed{0.5}", "answer": "0.5", "correct": True}, {"text": "\\boxed{1/2}"}]
    new = regrade_candidates(Math500Task(), item, old)
    assert [(c["answer"], c["correct"], c["vote"]) for c in new] == [("0.5", True, 0), ("1/2", True, 0)]


def test_a_runs_records_carry_the_tasks_vote_classes(tiny_engine):
    task = GSM8KTask()
    items = [Item(f"q{i}", q, "7") for i, q in enumerate(["What is 3 + 4?", "Compute 6 * 7."])]
    out = run_shard(
        items=items,
        positions=[0, 1],
        method=build_method("self_consistency", {"n": 4, "max_new_tokens": 12, "chunk_tokens": 12}),
        task=task,
        engine=tiny_engine,
        reward=None,
        run_seed=3,
        store=(store := MemoryStore()),
    )
    assert out.finished
    assert store.results
    for rec in store.results:
        answers = [c["answer"] for c in rec["candidates"]]
        classes = answer_classes(answers, task.same_answer)
        assert [c["vote"] for c in rec["candidates"]] == classes
        chosen = rec["extra"]["chosen"]
        assert chosen == (majority(classes) or 0)
        assert rec["extra"]["votes"] == sum(c is not None and c == classes[chosen] for c in classes)


@pytest.mark.parametrize(
    "a,b,same",
    [("18", "18.00", True), ("0.5", "1/2", True), (" -3 ", "-3.0", True), (".5", "0.50", True),
     ("+7", "7", True), ("1/3", "0.3333", False), ("12", "13", False), ("2/0", "2/0", True),
     ("1.5/2", "0.75", True)],
)  # fmt: skip
def test_plain_numbers_vote_by_exact_value_without_the_grader(monkeypatch, a, b, same):
    from srd_worker.tasks import grading

    assert grading.same_answer(a, b) is same
    if grading.plain_number(a) is not None and grading.plain_number(b) is not None:

        def no_grader(*args, **kwargs):
            raise AssertionError("math_equal called for two plain numbers")

        monkeypatch.setattr(grading, "math_equal", no_grader)
        assert grading.same_answer(a, b) is same


def test_anything_but_two_plain_numbers_goes_to_math_verify():
    from srd_worker.tasks import grading

    assert grading.plain_number("\\frac{1}{2}") is None and grading.plain_number("x") is None
    assert grading.same_answer("\\frac{1}{2}", "0.5") and not grading.same_answer("\\frac{1}{3}", "0.5")


def test_a_report_gives_an_old_records_candidates_their_votes():
    from srd_worker.reports.loading import add_votes

    def old_records():
        cands = [{"answer": "0.5"}, {"answer": "\\frac12"}, {"answer": "3"}]
        return [{"candidates": cands}, {"candidates": None}, {"candidates": [{"answer": "1", "vote": 7}]}]

    records = old_records()
    add_votes({"task": "math500"}, records)
    assert [c["vote"] for c in records[0]["candidates"]] == [0, 0, 2]  # by value, as the run's task says
    assert records[1]["candidates"] is None and records[2]["candidates"] == [{"answer": "1", "vote": 7}]
    records = old_records()
    add_votes({"task": "a-plugin-task-no-longer-installed"}, records)
    assert [c["vote"] for c in records[0]["candidates"]] == [0, 1, 2]  # strings, as before


# ---- weighted Best-of-N (best_of_n answer=weighted_majority) ---------------------------------------------
def test_weighted_choice_by_hand():
    from srd_worker.methods.best_of_n import weighted_choice

    # class 1 sums 0.5 + 0.6 = 1.1 > class 0's 0.9; its best-scored member is 2; candidate 3 has no answer
    assert weighted_choice([0, 1, 1, None], [0.9, 0.5, 0.6, 1.0], fallback=3) == 2
    assert weighted_choice([0, 1, 1, None], [0.9, 0.4, 0.5, 1.0], fallback=3) == 0  # 0.9 = 0.9: first class
    assert weighted_choice([0, 1, 1], [0.2, 0.5, 0.5], fallback=0) == 1  # members tie: the lower index
    assert weighted_choice([0, 1, 1], [0.9, 0.5, float("nan")], fallback=0) == 0  # NaN adds nothing
    assert weighted_choice([None, None], [0.1, 0.7], fallback=1) == 1  # nobody answered: Best-of-N's pick
    assert weighted_choice([0, 1, 1], [0.0, 0.0, 0.2], fallback=2) == 2  # a zero reward is no negative one
    with pytest.raises(ValueError, match="answer=weighted_majority.*-0.3.*answer=best"):
        weighted_choice([0, 1], [0.9, -0.3], fallback=0)


def test_the_answer_rule_is_checked_and_best_keeps_the_run_id():
    from srd_worker.errors import ConfigError

    assert "answer" not in build_method("best_of_n", {"n": 4, "answer": "best"}).params.to_dict()
    assert build_method("best_of_n", {"n": 4, "answer": "weighted_majority"}).params.to_dict()["answer"]
    with pytest.raises(ConfigError, match="answer must be one of best, weighted_majority, got 'vote'"):
        build_method("best_of_n", {"n": 4, "answer": "vote"})


def test_weighted_best_of_n_is_the_k_curves_weighted_majority_at_n(tiny_engine):
    """Per problem, a weighted_majority run answers as right as weighted majority@n over the candidates
    of a best run with the same seed (the same draws and rewards), and answers with a candidate of the
    class that wins by reward sum."""
    from srd_worker.rewards.arithmetic import ArithmeticReward

    task = GSM8KTask()
    questions = ["What is 3 + 4?", "Compute 6 * 7.", "What is 10 - 2?", "Half of 9?"]
    items = [Item(f"q{i}", q, "7") for i, q in enumerate(questions)]

    def run(answer):
        store = MemoryStore()
        params = {"n": 6, "max_new_tokens": 16, "answer": answer}
        out = run_shard(
            items=items,
            positions=list(range(len(items))),
            method=build_method("best_of_n", params),
            task=task,
            engine=tiny_engine,
            reward=ArithmeticReward(),
            run_seed=5,
            store=store,
        )
        assert out.finished and store.results
        return store.results

    best, weighted = run("best"), run("weighted_majority")
    voted = 0
    for b, w in zip(best, weighted, strict=True):
        cands = b["candidates"]
        assert [c["text"] for c in cands] == [c["text"] for c in w["candidates"]]
        assert w["correct"] == bool(vote_at_k(cands, len(cands), weighted=True))
        classes = [c["vote"] for c in cands]
        if any(c is not None for c in classes):
            voted += 1
            winner = majority(classes, [c["reward"] for c in cands])
            assert classes[w["extra"]["chosen"]] == classes[winner]
    assert voted  # some problem had answers to vote on


# ---- SRD and rejection sampling answering by the weighted vote (answer=weighted_majority) ---------------
def _entry(cid, reward, text="", rnd=0):
    return {"id": cid, "text": text, "reward": reward, "finish": "stop", "round": rnd, "n_tokens": 1, "c": 0}


def test_srd_chooses_by_the_weighted_vote_then_its_own_tie_rule_within_the_class():
    from srd_worker.methods.srd_loop import SRDLoop, SRDParams

    loop = build_method("srd", {"n": 4, "answer": "weighted_majority"}).loop
    assert isinstance(loop, SRDLoop)
    pool = [_entry(0, 0.9, "a"), _entry(1, 0.5, "b", rnd=2), _entry(2, 0.5, "b2", rnd=1), _entry(3, 0.1, "c")]
    # class 1 (ids 1, 2) sums 1.0 > 0.9: its members tie on reward, so the earlier finished round wins
    assert loop.choose(pool, [0, 1, 1, 3])["id"] == 2
    # class sums tie (0.9 against 0.5 + 0.4): the class seen first in pool order
    tied = [_entry(0, 0.9), _entry(1, 0.5), _entry(2, 0.4)]
    assert loop.choose(tied, [0, 1, 1])["id"] == 0
    # a missing reward adds nothing; nobody answered: the argmax over the whole pool
    assert loop.choose([_entry(0, None), _entry(1, 0.2), _entry(2, 0.3)], [0, 0, 2])["id"] == 2
    assert loop.choose(pool, [None] * 4)["id"] == 0
    assert loop.choose([], []) is None
    with pytest.raises(ValueError, match="answer=weighted_majority.*-0.2"):
        loop.choose([_entry(0, 0.9), _entry(1, -0.2)], [0, 1])
    with pytest.raises(RuntimeError, match="classes"):
        loop.choose(pool, None)
    # answer=best ignores the classes: the argmax, whatever the votes say
    best = SRDLoop(SRDParams(n=4), loop.router)
    assert best.choose(pool, [0, 1, 1, 3])["id"] == 0


def test_speculative_rejection_chooses_by_the_weighted_vote_over_its_archive():
    method = build_method("speculative_rejection", {"n": 4, "answer": "weighted_majority", "min_keep": 0})
    state = method.init_state("q", "question", [1, 2])
    # finished survivors in the order they finished, then (min_keep=0) the last decision's candidates
    state["finished"] = [_entry(0, 0.9, "a", rnd=1), _entry(2, 0.5, "b", rnd=3)]
    state["stopped"] = [_entry(1, 0.5, "b2", rnd=3), _entry(3, 0.2, "c", rnd=3)]
    state["classes"] = [0, 1, 1, 3]  # class 1 (ids 2, 1) sums 1.0 > 0.9; its members tie: lowest id
    res = method.result(state)
    assert res["chosen"] == 1 and res["response"] == "b2" and res["reward"] == 0.5
    assert [c["id"] for c in res["candidates"]] == [0, 2, 1, 3]  # the pool the classes align with
    argmax = build_method("speculative_rejection", {"n": 4, "min_keep": 0})
    assert argmax.result(state)["chosen"] == 0  # answer=best ignores the classes
    # the anytime answer takes the classes itself (here: the text's first letter), by the same rule
    ctx = StepContext(None, None, 0, extract_answer=lambda text: text[:1])
    assert method.current_best(state, ctx) == ("b2", 0.5)
    assert argmax.current_best(state, ctx) == ("a", 0.9)
    del state["classes"]
    with pytest.raises(RuntimeError, match="classes"):
        method.result(state)
    state["finished"][1]["reward"] = -0.1
    state["classes"] = [0, 1, 1, 3]
    with pytest.raises(ValueError, match="answer=weighted_majority.*-0.1"):
        method.result(state)


def test_the_answer_rule_of_srd_and_rejection_sampling_is_checked_and_passed_to_the_loop():
    from srd_worker.errors import ConfigError

    for method in ("srd", "rejection_sampling", "speculative_rejection"):
        assert "answer" not in build_method(method, {"n": 4}).params.to_dict()  # the run id keeps
        with pytest.raises(ConfigError, match="answer must be one of best, weighted_majority, got 'mode'"):
            build_method(method, {"n": 4, "answer": "mode"})
    rs = build_method("rejection_sampling", {"n": 4, "answer": "weighted_majority"})
    assert rs.loop.cfg.answer == "weighted_majority" and rs.params.to_dict()["answer"] == "weighted_majority"


def _srd_records(tiny_engine, method, answer, **extra):
    from srd_worker.rewards.arithmetic import ArithmeticReward

    items = [Item(f"q{i}", q, "7") for i, q in enumerate(["What is 3 + 4?", "Compute 6 * 7.", "Half of 14?"])]
    params = {"n": 6, "max_new_tokens": 24, "chunk_tokens": 8, "answer": answer, **extra}
    out = run_shard(
        items=items,
        positions=list(range(len(items))),
        method=build_method(method, params),
        task=GSM8KTask(),
        engine=tiny_engine,
        reward=ArithmeticReward(),
        run_seed=11,
        store=(store := MemoryStore()),
    )
    assert out.finished and len(store.results) == len(items)
    return store.results


@pytest.mark.parametrize(
    ("method", "extra"),
    [
        ("srd", {}),
        ("rejection_sampling", {}),
        ("srd", {"archive_all": True}),
        ("speculative_rejection", {}),
        ("speculative_rejection", {"min_keep": 0}),
    ],
)
def test_a_weighted_vote_run_draws_as_the_argmax_run_and_answers_as_the_records_revote(
    tiny_engine, method, extra
):
    """The answer rule changes no draw or routing: the same candidates with the same statuses; the run's
    answer is in the class that wins the reward-weighted vote over its pool, and its grade is what
    ``kcurves.revoted_correct`` recomputes from the argmax run's record (the offline re-vote of the
    real-text sections)."""
    from srd_worker.reports.kcurves import revoted_correct

    archive = method == "speculative_rejection" or bool(extra.get("archive_all"))  # the answer pool
    best = _srd_records(tiny_engine, method, "best", **extra)
    voted = _srd_records(tiny_engine, method, "weighted_majority", **extra)
    answered = 0
    for b, w in zip(best, voted, strict=True):
        assert [(c["id"], c["text"], c.get("status")) for c in b["candidates"]] == [
            (c["id"], c["text"], c.get("status")) for c in w["candidates"]
        ]
        assert b["extra"].get("R_max") == w["extra"].get("R_max")
        assert b["extra"].get("pool_sizes") == w["extra"].get("pool_sizes")
        pool = (
            list(w["candidates"])
            if archive
            else sorted((c for c in w["candidates"] if c["status"] == "kept"), key=lambda c: c["id"])
        )
        classes = [c["vote"] for c in pool]
        if any(c is not None for c in classes):
            answered += 1
            winner = pool[majority(classes, [c["reward"] for c in pool])]["vote"]
            assert w["answer"] in {c["answer"] for c in pool if c["vote"] == winner}
        assert revoted_correct(b, archive_all=archive) == float(w["correct"])
    assert answered  # some problem's pool had answers to vote on


def test_revoted_correct_by_hand():
    from srd_worker.reports.kcurves import revoted_correct

    def cand(cid, vote, reward, correct, status="kept"):
        return {"id": cid, "vote": vote, "reward": reward, "correct": correct, "status": status}

    rec = {
        "correct": False,
        "candidates": [
            cand(3, 3, 0.9, False),
            cand(1, 1, 0.5, True),
            cand(0, 1, 0.5, True),
            cand(2, 2, 5.0, False, status="discarded"),  # discarded: no vote, unless archive_all
        ],
    }
    assert revoted_correct(rec) == 1.0  # class 1 sums 1.0 > 0.9
    assert revoted_correct(rec, archive_all=True) == 0.0  # the archive's class 2 sums 5.0
    # with archive_all the pool keeps the archive's order: a tie between class sums goes to the one listed first
    listed = {"correct": True, "candidates": [cand(5, 5, 0.5, False, "discarded"), cand(0, 0, 0.5, True)]}
    assert revoted_correct(listed, archive_all=True) == 0.0 and revoted_correct(listed) == 1.0
    tie = {"correct": True, "candidates": [cand(5, 5, 0.5, False), cand(0, 0, 0.5, True)]}
    assert revoted_correct(tie) == 1.0  # sums tie: the class seen first in id order
    assert revoted_correct({**rec, "error": "boom"}) is None
    assert revoted_correct({**rec, "correct": None}) is None
    assert revoted_correct({"correct": True, "candidates": [cand(0, 0, -0.1, True)]}) is None  # refused
    assert revoted_correct({"correct": True, "candidates": [cand(0, None, 0.3, False)]}) == 1.0  # own grade
    assert revoted_correct({"correct": True, "candidates": [{"id": 0, "status": "kept"}]}) is None  # no votes
