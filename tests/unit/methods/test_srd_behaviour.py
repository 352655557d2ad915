"""SRD behaviour pinned by hand-computed expectations, on the real tiny random Llama.

Every case builds an item whose drafts are already written (ASCII text, one byte token per character, so
a prefix of n characters is the first n tokens) and finished by the length cap, with a scripted reward
written in the test: the reward of an original prefix is a table indexed by its length, the reward of
any other text (an editor's regeneration) is a fixed value per candidate, recognised by the candidate's
first character. One routing round (``one_round``: a step that routes the pool, then a step per
refinement wave) runs the refinement queue with the real engine; a spy on the engine records every ``GenerationRequest``. Expected boundaries, budgets and routing tiers
are computed by hand in the comments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from srd_worker.methods.base import StepContext
from srd_worker.methods.registry import build_method
from srd_worker.methods.routing import find_boundary, resolve_boundary

QUESTION = "What is 2 + 2?"
LENGTH = 20  # every hand-written draft has 20 characters = 20 tokens


class SpyEngine:
    """Forwards to the real engine and records every GenerationRequest it receives."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.requests: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def generate(self, requests):
        self.requests.extend(requests)
        return self.inner.generate(requests)


class ScriptedReward:
    """reward(text) from a function written in the test; records (text, finished) of every call."""

    name = "scripted"

    def __init__(self, fn: Callable[[str], float]) -> None:
        self.fn = fn
        self.calls: list[tuple[str, bool]] = []

    def score(self, prompts, responses, finished=None):
        flags = list(finished) if finished is not None else [False] * len(responses)
        self.calls.extend(zip(responses, flags, strict=True))
        return [self.fn(r) for r in responses]


def draft_text(k: int) -> str:
    """Candidate k's draft: a marker letter (A, B, C, ...) then lowercase letters, LENGTH characters."""
    return (chr(ord("A") + k) + "abcdefghijklmnopqrstuvwxyz")[:LENGTH]


def scripted(prefix_scores: dict[int, dict[int, float]], edited: dict[int, float]) -> Callable[[str], float]:
    """prefix_scores[k][length]: reward of candidate k's original prefix of that length (other lengths:
    the closest listed length below); edited[k]: reward of any other text starting with k's marker."""

    def fn(text: str) -> float:
        k = ord(text[0]) - ord("A") if text else -1
        if k not in prefix_scores:
            return 0.0
        if draft_text(k).startswith(text):
            table = prefix_scores[k]
            return table[max(j for j in table if j <= len(text))] if len(text) >= min(table) else 0.0
        return edited[k]

    return fn


def end_scores(*rewards: float) -> dict[int, dict[int, float]]:
    """Candidates whose only relevant reward is a flat one (no drop anywhere)."""
    return {k: {1: r} for k, r in enumerate(rewards)}


def setup(engine, params: dict[str, Any], rewards: Callable[[str], float], method: str = "srd"):
    """A method, a spy engine, a reward, a context and one item whose drafts are written and finished."""
    m = build_method(method, {"max_new_tokens": LENGTH, "chunk_tokens": LENGTH, **params})
    spy = SpyEngine(engine)
    reward = ScriptedReward(rewards)
    ctx = StepContext(spy, reward, 7)
    prompt = engine.tokenizer.chat_prompt_ids([{"role": "user", "content": QUESTION}])
    state = m.init_state("item", QUESTION, prompt)
    tok = engine.tokenizer
    for cand in state["candidates"]:
        text = draft_text(cand["id"])
        cand["tokens"] = tok.encode(text)
        assert len(cand["tokens"]) == LENGTH and tok.decode(cand["tokens"]) == text
        cand["text"] = text
        cand["finish"] = "length"
        cand["finished_round"] = 0
        cand["reward"] = rewards(text)
        cand["S"] = {str(LENGTH): cand["reward"]}
    state["round"] = 1
    return m, spy, reward, ctx, state, prompt


def one_round(m, ctx, state, steps: int = 10):
    """Step until the item's routing round closes (its draft and routing step, then a step per wave)."""
    start = state["round"]
    for _ in range(steps):
        m.step([state], ctx)
        if m.done(state) or state["round"] > start:
            return state
    raise AssertionError("the round did not close")


def run(m, ctx, state, steps: int = 10):
    for _ in range(steps):
        if m.done(state):
            return state
        m.step([state], ctx)
    raise AssertionError("did not finish")


# n = 3, θ_high = 0.6, θ_low = 0.3: u = 1 (rank 0) KEEP, u = 0.5 (rank 1) REFINE, u = 0 (rank 2) DISCARD.
THREE = {"n": 3, "theta_high": 0.6, "theta_low": 0.3, "scoring_interval": 5}


@pytest.mark.parametrize("form", ["incremental", "batch"])
def test_editor_request_temperature_top_p_top_k_budget_and_prefix(tiny_engine, form):
    # candidate 1 (middle): checkpoints 5: .50, 10: .60, 15: .40, 20: .45 → first drop 10 → 15, j* = 10;
    # L_max = 30 ≥ 20 so the cap is max(0, 20 - 30) = 0 and j* = 10; budget 20 - 10 = 10.
    table = {0: {1: 0.9}, 1: {5: 0.5, 10: 0.6, 15: 0.4, 20: 0.45}, 2: {1: 0.1}}
    params = {
        **THREE,
        "l_max": 30,
        "temperature": 0.7,
        "top_p": 0.85,
        "top_k": 20,
        "editor_temperature": 1.3,
        "n_refine": 1,
        "form": form,
    }
    m, spy, _, ctx, state, prompt = setup(tiny_engine, params, scripted(table, {1: 0.95}))
    tau = list(state["candidates"][1]["tokens"])
    run(m, ctx, state)
    assert len(spy.requests) == 1  # only the editor ran (drafts were finished)
    req = spy.requests[0]
    assert req.params.temperature == 1.3
    assert req.params.top_p == 0.85
    assert req.params.top_k == 20
    assert req.params.max_new_tokens == 10
    assert list(req.prompt_ids) == prompt + tau[:10]
    # τ' (reward .95) ranks first against KEEP {.9} → KEEP; its first j* = 10 tokens are τ's
    new = next(c for c in state["candidates"] if c["id"] == 1)
    assert new["tokens"][:10] == tau[:10]
    assert new["tokens"] != tau and new["c"] == 1


@pytest.mark.parametrize(
    ("table1", "l_max", "j_star"),
    [
        # drop 15 → 20 inside the tail [20 - 12, 20] = [8, 20]: j* = 15
        ({5: 0.5, 10: 0.6, 15: 0.7, 20: 0.4}, 12, 15),
        # no drop: j* = 20 - 12 = 8
        ({5: 0.1, 10: 0.2, 15: 0.3, 20: 0.35}, 12, 8),
        # drop 5 → 10 before the tail: max(5, 8) = 8 (whole-trajectory reading)
        ({5: 0.5, 10: 0.4, 15: 0.6, 20: 0.3}, 12, 8),
        # same with no cap (l_max = 0): the drop decides, j* = 5
        ({5: 0.5, 10: 0.4, 15: 0.6, 20: 0.3}, 0, 5),
    ],
)
@pytest.mark.parametrize("scoring", ["lazy", "eager"])
def test_boundary_from_reward_drops_sets_the_edit_budget(tiny_engine, table1, l_max, j_star, scoring):
    table = {0: {1: 0.9}, 1: table1, 2: {1: 0.1}}
    params = {**THREE, "l_max": l_max, "n_refine": 1, "checkpoint_scoring": scoring}
    m, spy, _, ctx, state, prompt = setup(tiny_engine, params, scripted(table, {1: 0.95}))
    cand = state["candidates"][1]
    if scoring == "eager":  # eager: every checkpoint was scored while drafting
        cand["S"] = {str(j): table1[j] for j in (5, 10, 15, 20)}
    tau = list(cand["tokens"])
    one_round(m, ctx, state)
    (req,) = spy.requests
    assert req.params.max_new_tokens == LENGTH - j_star
    assert list(req.prompt_ids) == prompt + tau[:j_star]


def test_find_boundary_hand_cases():
    s = {10: 0.5, 20: 0.6, 30: 0.4, 40: 0.5, 47: 0.45}
    # earliest drop 20 → 30, then 40 → 47: j* = 20 when uncapped
    assert find_boundary(s, 10, 47, float("inf")) == 20
    # tail starts at 47 - 20 = 27 > 20: j* = 27
    assert find_boundary(s, 10, 47, 20) == 27
    # no drop: 47 - 20 = 27; and never below 0
    up = {10: 0.1, 20: 0.2, 30: 0.3, 40: 0.4, 47: 0.5}
    assert find_boundary(up, 10, 47, 20) == 27
    assert find_boundary(up, 10, 47, 100) == 0
    # resolve_boundary on the full set agrees; with 20 unknown it asks for it
    assert resolve_boundary(s, 10, 47, float("inf")) == (20, [])
    assert resolve_boundary({k: v for k, v in s.items() if k != 20}, 10, 47, float("inf")) == (None, [20])


def test_every_refinement_keeps_the_prefix(tiny_engine):
    # n = 5, θ_high = 0.8, θ_low = 0.2: u = 1, .75, .5, .25, 0 → ranks 0 KEEP; 1, 2, 3 REFINE; 4 DISCARD.
    # Middle candidates 1, 2, 3 each drop 10 → 15 (j* = 10 uncapped); regenerations score 0.99, 0.98, 0.97.
    drop = {5: 0.5, 10: 0.6, 15: 0.4}
    table = {
        0: {1: 0.9},
        1: {k: v + 0.2 for k, v in drop.items()},
        2: {k: v + 0.1 for k, v in drop.items()},
        3: drop,
        4: {1: 0.05},
    }
    params = {"n": 5, "theta_high": 0.8, "theta_low": 0.2, "scoring_interval": 5, "l_max": 0, "n_refine": 1}
    m, spy, _, ctx, state, prompt = setup(tiny_engine, params, scripted(table, {1: 0.95, 2: 0.97, 3: 0.99}))
    taus = {c["id"]: list(c["tokens"]) for c in state["candidates"]}
    one_round(m, ctx, state)
    assert len(spy.requests) == 3
    for req in spy.requests:
        cont = list(req.prompt_ids)[len(prompt) :]
        assert len(cont) == 10 and req.params.max_new_tokens == 10
        assert any(cont == t[:10] for t in taus.values())
    kept = {c["id"]: c for c in state["candidates"]}
    assert set(kept) == {0, 1, 2, 3}
    for cid in (1, 2, 3):
        assert kept[cid]["tokens"][:10] == taus[cid][:10] and kept[cid]["c"] == 1


# Global re-routing case: n = 5, θ_high = 0.75, θ_low = 0.25 → u = 1, .75 KEEP (ids 0, 1: .9, .8);
# u = .5 REFINE (id 2: .5); u = .25, 0 DISCARD (ids 3, 4). τ' is ranked in KEEP ∪ queue ∪ {τ'} =
# {.9, .8, R(τ')}: n = 3, u ∈ {1, .5, 0}. Id 2 drops 5 → 10, so j* = 5 (= 20 - L_max, L_max = 15): every
# regeneration keeps the marker letter that identifies it to the scripted reward.
FIVE = {"n": 5, "theta_high": 0.75, "theta_low": 0.25, "scoring_interval": 5, "l_max": 15}
FIVE_TABLE = {0: {1: 0.9}, 1: {1: 0.8}, 2: {5: 0.6, 10: 0.5}, 3: {1: 0.2}, 4: {1: 0.1}}


@pytest.mark.parametrize(
    ("edited", "kept_ids", "dropped_new"),
    [
        # R(τ') = .6 < .8: rank 2 of 3, u = 0 → DISCARD. (Ranked without KEEP it would be alone, u = 1 →
        # KEEP; a self-compare .6 ≥ .5 + .02 would KEEP it too.)
        (0.6, [0, 1], True),
        # R(τ') = .95: rank 0, u = 1 → KEEP
        (0.95, [0, 1, 2], False),
    ],
)
@pytest.mark.parametrize("form", ["incremental", "batch"])
def test_reroute_global_ranks_against_keep_and_queue(tiny_engine, edited, kept_ids, dropped_new, form):
    params = {**FIVE, "n_refine": 1, "form": form}
    m, spy, _, ctx, state, _ = setup(tiny_engine, params, scripted(FIVE_TABLE, {2: edited}))
    run(m, ctx, state)
    assert [c["id"] for c in state["candidates"]] == kept_ids
    assert (2 in state["dropped"]) is dropped_new
    assert len(spy.requests) == 1


@pytest.mark.parametrize("form", ["incremental", "batch"])
@pytest.mark.parametrize("n_refine", [1, 2, 3])
def test_n_refine_refines_exactly_n_times_then_drops(tiny_engine, n_refine, form):
    # R(τ') = .85 always: in {.9, .8, .85} it has rank 1, u = .5 → REFINE → requeued while c < N_refine;
    # so exactly N_refine regenerations, N_refine - 1 requeues, then dropped. The batch form (Algorithm 1)
    # pushes the last τ' back too and drops it when it is popped with c = N_refine (exhausted).
    params = {**FIVE, "n_refine": n_refine, "form": form}
    m, spy, _, ctx, state, _ = setup(tiny_engine, params, scripted(FIVE_TABLE, {2: 0.85}))
    run(m, ctx, state)
    res = m.result(state)
    assert len(spy.requests) == n_refine
    assert all(r.params.temperature == m.cfg.editor_temperature for r in spy.requests)
    assert res["refinements"] == n_refine
    if form == "batch":
        assert res["refine_outcomes"] == {"keep": 0, "requeue": n_refine, "discard": 0}
        assert res["refine_exhausted"] == 1
    else:
        assert res["refine_outcomes"] == {"keep": 0, "requeue": n_refine - 1, "discard": 1}
        assert res["refine_exhausted"] == 0
    assert [c["id"] for c in state["candidates"]] == [0, 1]
    assert 2 in state["dropped"]


def test_n_refine_zero_never_edits(tiny_engine):
    m, spy, _, ctx, state, _ = setup(tiny_engine, {**FIVE, "n_refine": 0}, scripted(FIVE_TABLE, {2: 0.85}))
    run(m, ctx, state)
    assert spy.requests == []
    assert m.result(state)["refine_exhausted"] == 1


def test_finished_flag_reaches_the_reward(tiny_engine):
    # Drafting 48 candidates of up to 24 tokens at temperature 1 from a random model: some end by EOS.
    # Every reward call on a complete EOS-ended response must say finished; prefixes and length-capped
    # ends must not.
    m = build_method(
        "srd",
        {
            "n": 48,
            "max_new_tokens": 24,
            "chunk_tokens": 12,
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": 0,
            "n_refine": 0,
            "theta_low": 0.5,
            "archive_all": True,
            "checkpoint_scoring": "eager",
            "scoring_interval": 4,
        },
    )
    reward = ScriptedReward(lambda text: (len(text) % 7) / 7)
    ctx = StepContext(SpyEngine(tiny_engine), reward, 3)
    prompt = tiny_engine.tokenizer.chat_prompt_ids([{"role": "user", "content": QUESTION}])
    state = m.init_state("item", QUESTION, prompt)
    run(m, ctx, state)
    eos = [e for e in state["archive"] if e["finish"] == "eos"]
    assert eos, "no draft ended by EOS: pick a larger pool"
    flags: dict[str, set[bool]] = {}
    for text, flag in reward.calls:
        flags.setdefault(text, set()).add(flag)
    for e in state["archive"]:
        if e["finish"] == "eos":
            assert True in flags[e["text"]]
    assert any(flag is False for _, flag in reward.calls)
    n_true = sum(flag for _, flag in reward.calls)
    assert n_true == len({(e["id"], e["text"]) for e in eos})


def test_coupled_rejection_sampling_drafts_are_srd_drafts(tiny_engine):
    # One round (chunk = max_new_tokens): both methods draft their n candidates once with the same seeds,
    # so every rejection-sampling survivor is one of SRD's archived drafts, token for token.
    base = {"n": 6, "max_new_tokens": 10, "chunk_tokens": 10, "archive_all": True}
    prompt = tiny_engine.tokenizer.chat_prompt_ids([{"role": "user", "content": QUESTION}])

    def go(method, params):
        m = build_method(method, params)
        spy = SpyEngine(tiny_engine)
        reward = ScriptedReward(lambda text: (sum(map(ord, text)) % 101) / 101)
        state = m.init_state("item", QUESTION, prompt)
        run(m, StepContext(spy, reward, 11), state)
        return state, spy

    srd, srd_spy = go("srd", {**base, "scoring_interval": 5, "l_max": 5})
    rs, rs_spy = go("rejection_sampling", base)
    assert srd_spy.requests[:6] == rs_spy.requests[:6]  # same first-round drafting requests (seeds too)
    srd_drafts = {(e["id"], e["text"]) for e in srd["archive"]}
    survivors = {(c["id"], c["text"]) for c in rs["candidates"]}
    assert len(survivors) == 3  # u >= 0.5 in a pool of 6: ranks 0, 1, 2
    assert survivors <= srd_drafts


def test_boundary_search_whole_and_tail_hand_cases():
    # m = 10, length 47, L_max = 20 → tail from 27. Drops: 10 → 20 and 30 → 40.
    s = {10: 1.0, 20: 0.9, 30: 1.0, 40: 0.5, 47: 0.6}
    # whole: the earliest drop 10 → 20 is before the tail: j* = max(10, 27) = 27
    assert find_boundary(s, 10, 47, 20, "whole") == 27
    assert resolve_boundary(s, 10, 47, 20, "whole") == (27, [])
    # tail: pairs ending after 27 are 20 → 30 (no drop) and 30 → 40 (drop): j* = 30
    assert find_boundary(s, 10, 47, 20, "tail") == 30
    assert resolve_boundary(s, 10, 47, 20, "tail") == (30, [])
    # tail, lazily: 30 and 40 unknown → those are asked for (nothing before the tail is needed)
    assert resolve_boundary({10: 1.0, 20: 0.9, 47: 0.6}, 10, 47, 20, "tail") == (None, [30, 40])
    # a drop straddling the tail start (20 → 30 with tail from 27) gives the cap: j* = 27
    assert find_boundary({10: 0.1, 20: 0.9, 30: 0.5, 40: 0.6, 47: 0.7}, 10, 47, 20, "tail") == 27
    # no drop inside the tail: 47 - 20 = 27
    assert find_boundary({10: 0.9, 20: 0.1, 30: 0.2, 40: 0.3, 47: 0.4}, 10, 47, 20, "tail") == 27
    # uncapped: both readings give the earliest drop, 10
    assert find_boundary(s, 10, 47, float("inf"), "tail") == find_boundary(s, 10, 47, float("inf")) == 10


@pytest.mark.parametrize(("search", "j_star"), [("whole", 12), ("tail", 15)])
@pytest.mark.parametrize("scoring", ["lazy", "eager"])
def test_boundary_search_sets_the_edit_budget(tiny_engine, search, j_star, scoring):
    # length 20, m = 5, L_max = 8 → tail from 12. Candidate 1: 5: .9, 10: .2, 15: .7, 20: .35 — drops
    # 5 → 10 (before the tail) and 15 → 20 (inside it). whole: the earliest drop 5 → 10 gives
    # max(5, 12) = 12 (budget 8); tail: the pairs ending after 12 are 10 → 15 (up) and 15 → 20 (drop),
    # j* = 15 (budget 5).
    table1 = {5: 0.9, 10: 0.2, 15: 0.7, 20: 0.35}
    table = {0: {1: 0.9}, 1: table1, 2: {1: 0.1}}
    params = {**THREE, "l_max": 8, "n_refine": 1, "checkpoint_scoring": scoring, "boundary_search": search}
    m, spy, _, ctx, state, prompt = setup(tiny_engine, params, scripted(table, {1: 0.95}))
    cand = state["candidates"][1]
    if scoring == "eager":
        cand["S"] = {str(j): table1[j] for j in (5, 10, 15, 20)}
    tau = list(cand["tokens"])
    one_round(m, ctx, state)
    (req,) = spy.requests
    assert req.params.max_new_tokens == LENGTH - j_star
    assert list(req.prompt_ids) == prompt + tau[:j_star]


def test_boundary_search_is_validated():
    from srd_worker.errors import ConfigError

    with pytest.raises(ConfigError, match="boundary_search"):
        build_method("srd", {"boundary_search": "nope"})


class RecordingEngine(SpyEngine):
    """A spy that also keeps each request's generated token ids."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.outputs: list[tuple[int, ...]] = []

    def generate(self, requests):
        gens = super().generate(requests)
        self.outputs.extend(tuple(g.token_ids) for g in gens)
        return gens


def test_both_forms_draw_the_same_first_edit(tiny_engine):
    # Drafts finish in one round (chunk = max_new_tokens) in both forms, so both route the same pool and
    # queue the same middle candidate. The incremental form edits it in round 0, the batch form in round 1
    # (the batch form bumps its round after drafting): edit seeds name the trajectory and its edit count,
    # not the round, so the two editor requests, and the tokens they draw, are identical.
    params = {"n": 3, "theta_high": 0.6, "theta_low": 0.3, "max_new_tokens": 12, "chunk_tokens": 12}
    params |= {"n_refine": 1, "editor_temperature": 0.7, "scoring_interval": 4, "l_max": 6}
    prompt = tiny_engine.tokenizer.chat_prompt_ids([{"role": "user", "content": QUESTION}])

    def first_edit(form):
        m = build_method("srd", {**params, "form": form})
        spy = RecordingEngine(tiny_engine)
        reward = ScriptedReward(lambda text: (sum(map(ord, text)) % 97) / 97)
        state = m.init_state("item", QUESTION, prompt)
        run(m, StepContext(spy, reward, 5), state)
        edits = [
            (r, out) for r, out in zip(spy.requests, spy.outputs, strict=True) if r.params.temperature == 0.7
        ]
        assert len(edits) == 1, f"{form}: expected one edit, got {len(edits)}"
        return edits[0]

    (inc_req, inc_out), (bat_req, bat_out) = first_edit("incremental"), first_edit("batch")
    assert inc_req.prompt_ids == bat_req.prompt_ids
    assert inc_req.params == bat_req.params  # seed included
    assert inc_out == bat_out


def test_self_compare_fallback_counts_the_failed_edit(tiny_engine):
    # self_compare with fallback: R(τ') = .3 < R(τ) + δ, so τ' is dropped and τ kept; the failed edit
    # counts in τ's c (Alg. 1's c), so with N_refine = 1 τ can never be edited again in a later round.
    params = {**THREE, "n_refine": 1, "policy": "self_compare", "self_compare_fallback": True}
    m, spy, _, ctx, state, _ = setup(tiny_engine, params, scripted(end_scores(0.9, 0.5, 0.1), {1: 0.3}))
    run(m, ctx, state)
    kept = {c["id"]: c for c in state["candidates"]}
    assert sorted(kept) == [0, 1]
    assert kept[1]["c"] == 1
    assert kept[1]["text"] == draft_text(1)
    assert len(spy.requests) == 1
