"""The shared candidate pool (methods/pool.py) and routing strategies (methods/routing.py), on the tiny
real Llama engine: one drafting path for plain candidates and trajectories, the finish rules, the
checkpointed key layout, scoring, and the answer rule."""

from __future__ import annotations

import json
import math

import pytest

from srd_worker.engines.base import Generation
from srd_worker.methods.base import StepContext, new_state
from srd_worker.methods.pool import (
    DraftParams,
    apply_generation,
    archive_entry,
    best_completed,
    cut_back,
    draft_round,
    new_candidate,
    new_positions,
    new_trajectory,
    score_positions,
    score_responses,
    scores,
)
from srd_worker.methods.routing import DISCARD, KEEP, RankRouter, ThresholdRouter, rank_normalise, route


class RecordingReward:
    """Scores a response by its length and records what the pool asked (a reward-model test double)."""

    name = "recording"

    def __init__(self) -> None:
        self.seen: list[tuple[str, bool]] = []

    def score(self, prompts, responses, *, finished=None):
        self.seen.extend(zip(responses, finished, strict=True))
        return [len(r) / 100 for r in responses]


class CountingEngine:
    def __init__(self, inner) -> None:
        self.inner = inner
        self.batches: list[list] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def generate(self, requests):
        self.batches.append(list(requests))
        return self.inner.generate(requests)


def _state(engine, item_id="q0", question="What is 2 + 2?"):
    prompt = engine.tokenizer.chat_prompt_ids([{"role": "user", "content": question}])
    return new_state(item_id, question, prompt)


def test_key_layout_is_the_checkpoint_format():
    """The state JSON depends on these key orders: changing them changes every stored checkpoint."""
    assert list(new_candidate()) == ["tokens", "text", "finish", "reward"]
    assert list(new_trajectory(3)) == ["id", "tokens", "text", "finish", "reward", "S", "c", "finished_round"]
    assert new_trajectory(3)["id"] == 3
    assert new_trajectory(0)["S"] is not new_trajectory(0)["S"]


def test_one_drafting_path_seeds_by_position_or_id(tiny_engine):
    """A plain candidate is seeded by its position, a trajectory by its id: a trajectory with id 2 alone
    in its pool draws exactly what the third plain candidate draws, and all drafts go in ONE batch."""
    p = DraftParams(max_new_tokens=10, chunk_tokens=4)
    engine = CountingEngine(tiny_engine)
    ctx = StepContext(engine, None, 5)
    plain = {**_state(tiny_engine), "candidates": [new_candidate() for _ in range(3)]}
    tracked = {**_state(tiny_engine), "candidates": [new_trajectory(2)]}
    drafted = draft_round([plain, tracked], ctx, p)
    assert len(engine.batches) == 1 and len(engine.batches[0]) == 4
    assert [old for _, _, old in drafted] == [0, 0, 0, 0]
    assert tracked["candidates"][0]["tokens"] == plain["candidates"][2]["tokens"]
    assert plain["candidates"][0]["tokens"] != plain["candidates"][2]["tokens"]
    assert list(plain["candidates"][0]) == ["tokens", "text", "finish", "reward"]  # no trajectory keys
    for cand in plain["candidates"] + tracked["candidates"]:
        assert cand["text"] == tiny_engine.tokenizer.decode(cand["tokens"])
        assert len(cand["tokens"]) <= 4


def test_draft_round_to_the_cap_skips_finished_and_records_the_round(tiny_engine):
    p = DraftParams(max_new_tokens=10, chunk_tokens=4)  # budgets 4, 4, 2
    ctx = StepContext(tiny_engine, None, 1)
    state = {**_state(tiny_engine), "candidates": [new_trajectory(i) for i in range(3)]}
    for _ in range(5):
        if all(c["finish"] is not None for c in state["candidates"]):
            break
        drafted = draft_round([state], ctx, p)
        assert all(cand["finish"] is None or old < len(cand["tokens"]) for _, cand, old in drafted)
        state["round"] += 1
    for cand in state["candidates"]:
        assert cand["finish"] in ("eos", "stop", "length")
        assert len(cand["tokens"]) <= 10
        assert cand["finished_round"] is not None and cand["finished_round"] <= 2
        if cand["finish"] == "length":
            assert len(cand["tokens"]) == 10
    assert draft_round([state], ctx, p) == []  # nothing left to draft
    json.dumps(state)


def test_finish_rules(tiny_engine):
    ctx = StepContext(tiny_engine, None, 0)
    state = _state(tiny_engine)
    state["round"] = 4

    def applied(cand, token_ids, reason, budget, cap=10):
        apply_generation(ctx, state, cand, Generation(token_ids, "", reason), budget, cap)
        return cand

    eos = applied(new_trajectory(0), [65, 66], "eos", 4)
    assert (eos["finish"], eos["finished_round"]) == ("eos", 4)
    assert applied(new_candidate(), [65, 66, 67, 68], "length", 4)["finish"] is None  # full chunk
    assert applied(new_candidate(), [65, 66], "length", 4)["finish"] == "length"  # stopped short
    assert applied(new_candidate(), [], "length", 4)["finish"] == "length"
    capped = {**new_trajectory(1), "tokens": list(range(65, 73))}
    assert applied(capped, [65, 66], "length", 2)["finish"] == "length"  # the max_new_tokens cap
    unfinished = applied(new_trajectory(2), [65, 66, 67, 68], "length", 4)
    assert unfinished["finish"] is None and unfinished["finished_round"] is None
    plain = applied(new_candidate(), [65], "stop", 4)
    assert plain["finish"] == "stop" and "finished_round" not in plain


def test_scoring_positions_and_responses_in_one_batch(tiny_engine):
    reward = RecordingReward()
    ctx = StepContext(tiny_engine, reward, 0)
    state = _state(tiny_engine)
    a = {**new_trajectory(0), "tokens": [72, 101, 108, 108, 111], "finish": "eos"}
    a["text"] = tiny_engine.tokenizer.decode(a["tokens"])
    b = {**new_trajectory(1), "tokens": [72, 105], "text": tiny_engine.tokenizer.decode([72, 105])}
    score_positions(ctx, [(state, a, new_positions(2, 0, 5, eager=True)), (state, b, [1])])
    assert sorted(a["S"], key=int) == ["2", "4", "5"] and a["reward"] == a["S"]["5"]
    assert b["S"] == {"1": b["S"]["1"]} and b["reward"] is None  # the end was not scored
    # only the complete response (EOS, whole length) is marked finished
    assert [f for _, f in reward.seen] == [False, False, True, False]
    assert state["ledger"]["components"]["scorer"]["calls"] == 1 and state["ledger"]["rm_calls"] == 4
    plain = {**new_candidate(), "text": "abc", "tokens": [97, 98, 99], "finish": "length"}
    score_responses(ctx, [(state, plain)])
    assert plain["reward"] == pytest.approx(0.03) and reward.seen[-1] == ("abc", False)


def test_new_positions():
    assert new_positions(3, 0, 7, eager=False) == [7]
    assert new_positions(3, 0, 7, eager=True) == [3, 6, 7]
    assert new_positions(3, 4, 9, eager=True) == [6, 9]


def test_cut_back_keeps_identity_and_scores_up_to_the_boundary(tiny_engine):
    ctx = StepContext(tiny_engine, None, 0)
    cand = {
        **new_trajectory(4),
        "tokens": [72, 101, 108, 108, 111],
        "finish": "eos",
        "reward": 0.7,
        "S": {"2": 0.1, "4": 0.5, "5": 0.7},
        "c": 1,
        "finished_round": 3,
    }
    cut = cut_back(ctx, cand, 3)
    assert list(cut) == list(new_trajectory(0))
    assert cut["tokens"] == [72, 101, 108] and cut["text"] == tiny_engine.tokenizer.decode([72, 101, 108])
    assert (cut["id"], cut["c"], cut["finish"], cut["reward"], cut["finished_round"]) == (
        4,
        1,
        None,
        None,
        None,
    )
    assert cut["S"] == {"2": 0.1}
    assert cand["tokens"] == [72, 101, 108, 108, 111]  # the original is untouched


def test_best_completed_tie_breaks():
    def entry(cid, reward, round_):
        cand = {**new_trajectory(cid), "reward": reward, "finish": "eos", "finished_round": round_}
        return archive_entry(cand)

    assert best_completed([]) is None
    assert best_completed([entry(0, 0.5, 2), entry(1, 0.9, 3)])["id"] == 1
    assert best_completed([entry(3, 0.9, 2), entry(1, 0.9, 3)])["id"] == 3  # earlier round
    assert best_completed([entry(3, 0.9, 2), entry(1, 0.9, 2)])["id"] == 1  # lower id
    assert best_completed([entry(0, math.nan, 0), entry(1, None, 0), entry(2, 0.0, 5)])["id"] == 2
    assert list(entry(0, 0.1, 1)) == ["id", "text", "reward", "finish", "round", "n_tokens", "c"]


def test_routers():
    s = [0.2, 0.9, math.nan, 0.5, 0.4]
    rank = RankRouter(0.5, 0.3)
    assert rank(s) == [route(u, 0.5, 0.3) for u in rank_normalise(s)]
    assert ThresholdRouter(0.45)(s) == [DISCARD, KEEP, DISCARD, KEEP, DISCARD]  # NaN never passes
    assert ThresholdRouter(0.95)(s) == [DISCARD, KEEP, DISCARD, DISCARD, DISCARD]  # min-1 guard
    assert ThresholdRouter(0.95)([]) == []
    assert scores([new_candidate(), {**new_candidate(), "reward": 0.3}])[1] == 0.3
    assert math.isnan(scores([new_candidate()])[0])
