"""Speculative Rejection behaviour pinned by hand-computed expectations, on the real tiny random Llama.

Candidates start from hand-written ASCII prefixes (one byte token per character) whose first letter
identifies the candidate to a scripted reward written in the test; the real engine drafts the chunks.
"""

from __future__ import annotations

import pytest

from srd_worker.methods.base import StepContext
from srd_worker.methods.registry import build_method
from tests.unit.methods.test_srd_behaviour import QUESTION, ScriptedReward, SpyEngine

MARK = "ABCDEFGH"


def setup(engine, params, reward_fn, prefixes: dict[int, str]):
    m = build_method("speculative_rejection", params)
    reward = ScriptedReward(reward_fn)
    ctx = StepContext(SpyEngine(engine), reward, 5)
    prompt = engine.tokenizer.chat_prompt_ids([{"role": "user", "content": QUESTION}])
    state = m.init_state("item", QUESTION, prompt)
    for cand in state["candidates"]:
        text = prefixes[cand["id"]]
        cand["tokens"] = engine.tokenizer.encode(text)
        assert len(cand["tokens"]) == len(text)
        cand["text"] = text
    return m, ctx, state


@pytest.mark.parametrize(
    ("n", "kept"),
    [
        # rewards by candidate: .3 .9 .1 .7 .5 .2; k = round(0.5 · 6) = 3 → the three best: ids 1, 3, 4
        (6, [1, 3, 4]),
        # n = 5 (rewards .3 .9 .1 .7 .5): k = round(2.5) = 2 (banker's rounding) → ids 1, 3
        (5, [1, 3]),
    ],
)
def test_keeps_exactly_the_top_k_by_reward(tiny_engine, n, kept):
    by_id = [0.3, 0.9, 0.1, 0.7, 0.5, 0.2]
    params = {"n": n, "alpha": 0.5, "max_new_tokens": 60, "chunk_tokens": 5}
    m, ctx, state = setup(
        tiny_engine, params, lambda t: by_id[MARK.index(t[0])], {i: MARK[i] + "bcd" for i in range(n)}
    )
    m.step([state], ctx)
    assert [c["id"] for c in state["candidates"]] == kept
    assert state["pool_sizes"] == [[n, len(kept)]]


def test_candidate_rejected_in_the_round_it_finishes_is_not_an_answer(tiny_engine):
    # n = 4, α = 0.5. Candidate 0 starts with 35 tokens, so the first 5-token chunk takes it to the
    # 40-token cap: it finishes in round 0 with reward .5. Candidates 1, 2, 3 start with 5 tokens and are
    # partial after round 0 (≤ 10 characters): rewards .9, .8, .7. Round 0 ranks {.5, .9, .8, .7} and keeps
    # k = 2: ids 1 and 2 — candidate 0 is rejected in the round it finished. Once longer than 10
    # characters, 1 and 2 score .1. The reference keeps only finished survivors, so the answer is 1 or 2
    # (reward .1), never the rejected candidate 0 (.5).
    def reward(text: str) -> float:
        k = MARK.index(text[0])
        if k == 0:
            return 0.5
        return 0.1 if len(text) > 10 else [0.0, 0.9, 0.8, 0.7][k]

    prefixes = {0: "A" + "x" * 34, 1: "Bbcde", 2: "Cbcde", 3: "Dbcde"}
    params = {"n": 4, "alpha": 0.5, "max_new_tokens": 40, "chunk_tokens": 5}
    m, ctx, state = setup(tiny_engine, params, reward, prefixes)
    m.step([state], ctx)
    assert state["candidates"][0]["id"] != 0 and state["candidates"][0]["finish"] is None  # 0 was finished
    assert [c["id"] for c in state["candidates"]] == [1, 2]
    assert state["finished"] == []  # the finished candidate 0 did not survive: not archived
    for _ in range(20):
        if m.done(state):
            break
        m.step([state], ctx)
    res = m.result(state)
    assert 0 not in res["finished_ids"]
    assert res["chosen"] in (1, 2)
    # every archived candidate survived the ranking of the round it finished in
    assert all(e["id"] in (1, 2) for e in state["finished"])


def test_finished_survivor_is_archived_once_and_stays_an_answer(tiny_engine):
    # Candidate 0 finishes in round 0 at the cap with the best reward .95: it survives (k = 2 of 4), is
    # archived once, and is the answer even after later rounds push it out of the pool.
    def reward(text: str) -> float:
        return [0.95, 0.6, 0.4, 0.2][MARK.index(text[0])]

    prefixes = {0: "A" + "x" * 34, 1: "Bbcde", 2: "Cbcde", 3: "Dbcde"}
    params = {"n": 4, "alpha": 0.5, "max_new_tokens": 40, "chunk_tokens": 5}
    m, ctx, state = setup(tiny_engine, params, reward, prefixes)
    m.step([state], ctx)
    assert [c["id"] for c in state["candidates"]] == [0, 1]
    assert [e["id"] for e in state["finished"]] == [0]
    assert state["round"] == 1 and state["finished"][0]["round"] == 0  # archived with the round it finished
    steps = 1
    for _ in range(20):
        if m.done(state):
            break
        m.step([state], ctx)
        steps += 1
        assert state["round"] == steps  # one decision per step
    res = m.result(state)
    assert res["finished_ids"].count(0) == 1
    assert res["chosen"] == 0 and res["reward"] == 0.95
    # candidate 1 (5 tokens, drafted 5 a round) reaches the 40-token cap in round 6 at the latest: more
    # than one decision, and every later finisher is archived with a round after candidate 0's
    assert steps >= 2 and res["rounds"] == steps
    assert all(0 < e["round"] < steps for e in state["finished"][1:])
