"""Sampling, Best-of-N and self-consistency on the tiny random Llama: invariants and worked examples."""

from __future__ import annotations

import json

import pytest

from srd_worker.errors import ConfigError
from srd_worker.methods.base import StepContext, derive_seed
from srd_worker.methods.best_of_n import argmax_first
from srd_worker.methods.registry import METHODS, build_method
from srd_worker.methods.self_consistency import majority
from srd_worker.rewards.arithmetic import ArithmeticReward

QUESTIONS = ["What is 3 + 4?", "Tom has 5 apples and eats 2. How many are left?", "Compute 6 * 7."]


def run_to_end(method, engine, reward, seed=0, max_rounds=50):
    ctx = StepContext(engine, reward, seed, extract_answer=lambda t: t.strip()[-1:] or None)
    states = [
        method.init_state(f"q{i}", q, engine.tokenizer.chat_prompt_ids([{"role": "user", "content": q}]))
        for i, q in enumerate(QUESTIONS)
    ]
    for _ in range(max_rounds):
        active = [s for s in states if not method.done(s)]
        if not active:
            break
        method.step(active, ctx)
        json.dumps(active)  # states stay JSON-serialisable after every round
    assert all(method.done(s) for s in states)
    return states


def test_best_of_n_with_n1_equals_sampling(tiny_engine):
    params = {"max_new_tokens": 40, "chunk_tokens": 16}
    sampling = build_method("sampling", params)
    bon = build_method("best_of_n", {**params, "n": 1})
    a = run_to_end(sampling, tiny_engine, None)
    b = run_to_end(bon, tiny_engine, ArithmeticReward())
    assert [sampling.result(s)["response"] for s in a] == [bon.result(s)["response"] for s in b]
    assert [s["ledger"]["gen_tokens"] for s in a] == [s["ledger"]["gen_tokens"] for s in b]


def test_best_of_n_picks_the_highest_reward(tiny_engine):
    bon = build_method("best_of_n", {"n": 4, "max_new_tokens": 24, "chunk_tokens": 24})
    states = run_to_end(bon, tiny_engine, ArithmeticReward())
    for s in states:
        res = bon.result(s)
        assert res["reward"] == max(res["rewards"])
        assert res["chosen"] == res["rewards"].index(max(res["rewards"]))
        assert s["ledger"]["rm_calls"] == 4


def test_ledger_adds_up(tiny_engine):
    bon = build_method("best_of_n", {"n": 3, "max_new_tokens": 30, "chunk_tokens": 10})
    for s in run_to_end(bon, tiny_engine, ArithmeticReward()):
        led = s["ledger"]
        assert led["gen_tokens"] == sum(len(c["tokens"]) for c in s["candidates"])
        assert led["gen_tokens"] == led["components"]["drafter"]["out_tokens"]
        assert led["components"]["drafter"]["calls"] == s["round"]  # one batched draft per round
        assert led["prefill_tokens"] >= led["lm_calls"] * len(s["prompt_ids"])


def test_chunked_drafting_respects_budget(tiny_engine):
    m = build_method("sampling", {"max_new_tokens": 25, "chunk_tokens": 10, "temperature": 0})
    for s in run_to_end(m, tiny_engine, None):
        cand = s["candidates"][0]
        assert len(cand["tokens"]) <= 25
        assert cand["finish"] in ("eos", "stop", "length")
        if cand["finish"] == "length":
            assert len(cand["tokens"]) == 25 and s["round"] == 3


def test_self_consistency_majority():
    assert majority(["4", "5", "4", None]) == 0
    assert majority([None, "7", "8", "8"]) == 2
    assert majority(["1", "2"]) == 0  # tie: first seen wins
    assert majority([None, None]) is None
    assert majority([" 1 2", "1  2", "3"]) == 0


def test_argmax_first_ties():
    assert argmax_first([0.5, 0.7, 0.7]) == 1
    assert argmax_first([1.0]) == 0
    nan = float("nan")
    assert argmax_first([nan, 1.0, 2.0]) == 2  # a NaN reward never wins, wherever it stands
    assert argmax_first([1.0, nan, 1.0]) == 0
    assert argmax_first([nan, nan]) == 0
    assert argmax_first([-float("inf"), nan]) == 0


def test_best_of_n_record_by_hand():
    bon = build_method("best_of_n", {"n": 3})
    state = bon.init_state("q4", "2 + 2?", [9, 8])
    assert (state["item_id"], state["question"], state["prompt_ids"]) == ("q4", "2 + 2?", [9, 8])
    assert len(state["candidates"]) == 3
    for i, (reward, finish) in enumerate([(0.2, "eos"), (0.7, "length"), (0.7, "stop")]):
        state["candidates"][i].update(tokens=[1] * (i + 1), text=f"answer {i}", finish=finish, reward=reward)
    rec = bon.result(state)
    # 0.7 twice: the lower index (1) answers, with its own text and finish reason
    assert (rec["chosen"], rec["response"], rec["reward"], rec["finish_reason"]) == (
        1,
        "answer 1",
        0.7,
        "length",
    )
    assert rec["rewards"] == [0.2, 0.7, 0.7]
    assert [(c["id"], c["n_tokens"], c["finish"]) for c in rec["candidates"]] == [
        (0, 1, "eos"),
        (1, 2, "length"),
        (2, 3, "stop"),
    ]


def test_self_consistency_runs(tiny_engine):
    sc = build_method("self_consistency", {"n": 3, "max_new_tokens": 12, "chunk_tokens": 12})
    for s in run_to_end(sc, tiny_engine, None):
        res = sc.result(s)
        assert len(res["answers"]) == 3 and res["response"] == s["candidates"][res["chosen"]]["text"]


def test_seed_derivation_is_stable_and_distinct():
    a = derive_seed(0, "q1", 0, 0, "draft")
    assert a == derive_seed(0, "q1", 0, 0, "draft")
    others = {
        derive_seed(0, "q1", 1, 0, "draft"),
        derive_seed(0, "q1", 0, 1, "draft"),
        derive_seed(0, "q2", 0, 0, "draft"),
        derive_seed(1, "q1", 0, 0, "draft"),
        derive_seed(0, "q1", 0, 0, "edit"),
    }
    assert a not in others and len(others) == 5
    assert 0 <= a < 2**63


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_documents_every_param(name):
    for pname, _t, _d, help_ in METHODS[name].params.describe():
        assert help_, f"{name}.{pname} has no help text"


def test_unknown_parameter_names_valid_ones():
    with pytest.raises(
        ConfigError, match=r"unknown parameter 'bogus' for method 'best_of_n'; valid: .*chunk_tokens"
    ):
        build_method("best_of_n", {"bogus": 1})


def test_bad_parameter_values():
    with pytest.raises(ConfigError, match="n must be >= 1"):
        build_method("best_of_n", {"n": "0"})
    with pytest.raises(ConfigError, match="expects an integer"):
        build_method("best_of_n", {"n": "many"})
    with pytest.raises(ConfigError, match="unknown method 'nope'; choose one of: .*best_of_n"):
        build_method("nope", {})
    assert build_method("best_of_n", {"n": "8", "temperature": "0.5"}).params.n == 8


@pytest.mark.parametrize(
    "params, message",
    [
        ({"n": "3.7"}, "parameter 'n' expects an integer, got '3.7'"),  # was truncated to 3
        ({"n": 3.7}, "parameter 'n' expects an integer"),
        ({"n": "1e3"}, "parameter 'n' expects an integer"),
        ({"n": True}, "parameter 'n' expects an integer"),
        ({"n": "100000000"}, "more than srdq accepts"),  # was accepted and started running
        ({"temperature": "nan"}, "parameter 'temperature' expects a finite number"),
        ({"temperature": "inf"}, "parameter 'temperature' expects a finite number"),
        ({"top_p": "-inf"}, "parameter 'top_p' expects a finite number"),
        ({"temperature": "warm"}, "parameter 'temperature' expects a number"),
        ({"temperature": True}, "parameter 'temperature' expects a number"),
        ({"top_k": "-2"}, "top_k must be >= 0"),
        ({"max_new_tokens": "100000000"}, "max_new_tokens = 100000000 is more than any model's context"),
    ],
)
def test_parameter_values_are_checked_strictly(params, message):
    with pytest.raises(ConfigError) as err:
        build_method("best_of_n", params)
    assert message in str(err.value)


def test_integral_values_are_accepted():
    assert build_method("best_of_n", {"n": 4.0}).params.n == 4  # YAML may give 4.0 for a sweep's n
    assert build_method("best_of_n", {"n": "4.0"}).params.n == 4  # integral: not a truncation
    assert build_method("best_of_n", {"n": " 4 ", "top_k": "0"}).params.top_k == 0
    assert build_method("best_of_n", {"n": "4096"}).params.n == 4096


def test_step_context_passes_finished_only_to_rewards_that_take_it(tiny_engine):
    from srd_worker.methods.base import ScoreCall, new_state

    seen = {}

    class Plain:
        name = "plain"

        def score(self, prompts, responses):
            seen["plain"] = len(responses)
            return [0.0] * len(responses)

    class Aware:
        name = "aware"

        def score(self, prompts, responses, *, finished=None):
            seen["aware"] = list(finished)
            return [1.0] * len(responses)

    state = new_state("q", "question", [1, 2])
    calls = [ScoreCall(state, "a", 1, finished=True), ScoreCall(state, "b", 1)]
    assert StepContext(tiny_engine, Plain(), 0).score(calls) == [0.0, 0.0]
    assert StepContext(tiny_engine, Aware(), 0).score(calls) == [1.0, 1.0]
    assert seen == {"plain": 2, "aware": [True, False]}


# --------------------------------------------------------------------------- every candidate kept
def _records(method, states):
    from srd_worker.runner import build_record
    from srd_worker.tasks.base import Item
    from srd_worker.tasks.gsm8k import GSM8KTask

    task = GSM8KTask()
    items = [Item(f"q{i}", q, "7") for i, q in enumerate(QUESTIONS)]
    return task, [
        build_record(method, task, it, i, s) for i, (it, s) in enumerate(zip(items, states, strict=True))
    ]


@pytest.mark.parametrize("name,n", [("sampling", 1), ("best_of_n", 3), ("self_consistency", 3)])
def test_records_list_every_candidate(tiny_engine, name, n):
    params = {"max_new_tokens": 24, "chunk_tokens": 12} | ({} if name == "sampling" else {"n": n})
    method = build_method(name, params)
    states = run_to_end(method, tiny_engine, ArithmeticReward())
    task, records = _records(method, states)
    for state, rec in zip(states, records, strict=True):
        cands = rec["candidates"]
        assert [c["id"] for c in cands] == list(range(n))
        assert [c["text"] for c in cands] == [c["text"] for c in state["candidates"]]
        assert [c["n_tokens"] for c in cands] == [len(c["tokens"]) for c in state["candidates"]]
        assert sum(c["n_tokens"] for c in cands) == rec["ledger"]["gen_tokens"]
        assert [c["answer"] for c in cands] == [task.extract_answer(c["text"]) for c in state["candidates"]]
        assert all(c["finish"] in ("eos", "stop", "length") for c in cands)
        assert cands[rec["extra"]["chosen"]]["text"] == rec["response"]
        if name == "best_of_n":
            assert [c["reward"] for c in cands] == rec["extra"]["rewards"]
        json.dumps(rec)


def test_keep_candidates_modes(tiny_engine):
    base = {"n": 2, "max_new_tokens": 12, "chunk_tokens": 12}
    assert "keep_candidates" not in build_method("best_of_n", base).params.to_dict()  # old run ids stay
    assert build_method("best_of_n", {**base, "keep_candidates": "answers"}).params.to_dict()[
        "keep_candidates"
    ] == ("answers")
    with pytest.raises(ConfigError, match="keep_candidates"):
        build_method("best_of_n", {**base, "keep_candidates": "some"})
    full = build_method("best_of_n", base)
    answers = build_method("best_of_n", {**base, "keep_candidates": "answers"})
    none = build_method("best_of_n", {**base, "keep_candidates": "none"})
    states = run_to_end(full, tiny_engine, ArithmeticReward())
    _, rec_full = _records(full, states)
    _, rec_ans = _records(answers, states)
    _, rec_none = _records(none, states)
    for f, a, z in zip(rec_full, rec_ans, rec_none, strict=True):
        assert [{k: v for k, v in c.items() if k != "text"} for c in f["candidates"]] == a["candidates"]
        assert z["candidates"] is None and z["response"] == f["response"]
    assert full.params.candidates_mode(64) == "full" and full.params.candidates_mode(65) == "answers"


def test_srd_records_list_completed_trajectories(tiny_engine):
    srd = build_method(
        "srd", {"n": 4, "max_new_tokens": 24, "chunk_tokens": 8, "scoring_interval": 4, "l_max": 8}
    )
    states = run_to_end(srd, tiny_engine, ArithmeticReward())
    _, records = _records(srd, states)
    for state, rec in zip(states, records, strict=True):
        cands = rec["candidates"]
        assert len(cands) == len(state["archive"])
        kept = [c for c in cands if c["status"] == "kept"]
        assert sorted(c["id"] for c in kept) == sorted(c["id"] for c in state["candidates"] if c["finish"])
        assert all(c["status"] in ("kept", "discarded") and isinstance(c["refined"], bool) for c in cands)
        if rec["extra"]["chosen"] is not None:
            assert rec["response"] in [c["text"] for c in cands]
