"""Pinned behaviours, each checked against hand-worked expectations so that the named mutation fails.

1. Cluster bootstrap (``stats.bootstrap_ci``): a resampled problem keeps ALL its seed cells together.
2. ∇-Reasoner (``NablaReasoner._decide``, ALGORITHMS.md §9.2): a proposal replaces the current rollout
   only if its reward is strictly higher; on a tie (or NaN) the current rollout stays.
3. SRD's initial routing (``SRDLoop._initial_route``, §1.5/§1.7): the refinement queue is in rank order
   (best reward first), not in candidate-id order; a REFINE candidate with c = n_refine is dropped. In
   the batch form a spent τ′ stays queued (and ranked against) until popped; with rank_unfinished_only a
   τ′ is ranked among the unfinished candidates only.
4. SRD's ``self_compare`` policy (§1.6): τ′ is kept iff R(τ′) ≥ R(τ) + δ (the margin on the refined side;
   equality kept).
5. Rejection sampling ``variant=absolute`` (§3.2): a reward equal to the threshold survives (≥); NaN never
   passes, not even through the min-1 guard when a finite reward is there.

Every test is pure (no model, no engine): the smallest unit that shows the behaviour.
"""

from __future__ import annotations

import math

import pytest

from srd_worker.methods.pool import new_trajectory
from srd_worker.methods.registry import build_method
from srd_worker.methods.routing import DISCARD, KEEP
from srd_worker.reports.stats import Interval, bootstrap_ci

pytestmark = pytest.mark.unit

JUST_BELOW_HALF = math.nextafter(0.5, -math.inf)


# ------------------------------------------------------------------------------ 1. cluster bootstrap


def test_bootstrap_keeps_each_problems_seeds_together():
    # 50 identical problems, each with seeds [0, 1]: every problem's mean is 0.5, and a replicate draws
    # problems with all their seed cells, so every replicate mean is 0.5. The two-stage bootstrap (seed
    # columns drawn again per problem) made replicates of 100 coin flips: an interval about [0.40, 0.60].
    values = [[0.0, 1.0]] * 50
    for seed in (0, 1):
        assert bootstrap_ci(values, seed=seed) == Interval(0.5, 0.5, 0.5, 50, 2)


def test_bootstrap_spread_is_that_of_the_problem_means():
    # 50 problems [1, 0] (mean 0.5) and 50 problems [1, 1] (mean 1): a replicate mean is 0.5 + 0.5·X/100,
    # X ~ Binomial(100, 1/2) the drawn [1, 1] problems, whose 2.5% / 97.5% quantiles are 40 / 60
    # (P[X <= 39] = 0.018, P[X <= 40] = 0.028): the interval [0.70, 0.80]. Drawing the seed columns again
    # would add the [1, 0] problems' coin flips (sd 0.025 more in quadrature): about [0.68, 0.82].
    values = [[1.0, 0.0]] * 50 + [[1.0, 1.0]] * 50
    ci = bootstrap_ci(values, seed=0)
    assert ci.mean == 0.75
    assert ci.low == pytest.approx(0.70, abs=0.006), ci
    assert ci.high == pytest.approx(0.80, abs=0.006), ci


def test_bootstrap_needs_two_problems_or_two_seeds():
    assert bootstrap_ci([[1.0]]).low is None
    two_problems = bootstrap_ci([[0.0], [1.0]])
    assert (two_problems.low, two_problems.high) == (0.0, 1.0)
    two_seeds = bootstrap_ci([[0.0, 1.0]])
    assert (two_seeds.low, two_seeds.high) == (0.0, 1.0)


# ------------------------------------------------------------------------------ 2. ∇-Reasoner acceptance


class _FixedScoreCtx:
    """Just what ``NablaReasoner._decide`` uses of a StepContext: every score call answers ``reward``."""

    def __init__(self, reward: float | None) -> None:
        self.reward = reward
        self.calls: list[int] = []

    def score(self, calls):
        self.calls.append(len(calls))
        return [self.reward for _ in calls]

    def decode(self, tokens):
        return " ".join(map(str, tokens))


EOS = frozenset({99})


def _nabla_decide(proposal_reward: float | None, *, current_reward: float = 0.25, **params):
    method = build_method("nabla_reasoner", params)
    state = method.init_state("q0", "question", [1, 2, 3])
    state.update(started=True, past=[5], ahead=[7, 8, 9], ahead_finish="eos", reward=current_reward)
    plan = {"state": state, "token": 11, "call": None, "budget": 3}
    method._decide(_FixedScoreCtx(proposal_reward), [(plan, [12, 13], "eos")], EOS)
    return state


def _accepted(state) -> bool:
    if state["past"] == [5, 11] and state["ahead"] == [12, 13]:
        return True
    assert state["past"] == [5, 7] and state["ahead"] == [8, 9], state  # rejected: ahead[0] committed
    return False


def test_nabla_tie_keeps_the_current_rollout():
    state = _nabla_decide(0.25, current_reward=0.25)
    assert not _accepted(state)
    assert state["reward"] == 0.25 and state["ahead_finish"] == "eos"
    assert state["stats"]["n_rejections"] == 1 and state["stats"]["n_acceptance_checks"] == 1
    assert not state["done"]


def test_nabla_strictly_higher_reward_replaces_the_rollout():
    up = _nabla_decide(math.nextafter(0.25, math.inf), current_reward=0.25)
    assert _accepted(up) and up["reward"] == math.nextafter(0.25, math.inf)
    assert up["stats"]["n_rejections"] == 0 and up["stats"]["n_acceptance_checks"] == 1


def test_nabla_lower_or_nan_reward_is_rejected():
    assert not _accepted(_nabla_decide(math.nextafter(0.25, -math.inf), current_reward=0.25))
    nan = _nabla_decide(math.nan, current_reward=0.25)
    assert not _accepted(nan) and nan["reward"] == 0.25


def test_nabla_without_rejection_sampling_always_accepts():
    state = _nabla_decide(0.0, current_reward=0.25, rejection_sampling=False)
    assert _accepted(state)
    assert state["stats"]["n_acceptance_checks"] == 0 and state["stats"]["n_rejections"] == 0


# ------------------------------------------------------------------------------ 3./4. SRD routing, policy


def _traj(cid: int, reward: float, c: int = 0):
    return {**new_trajectory(cid), "tokens": [1, 2], "text": "t", "finish": "eos", "reward": reward, "c": c}


def test_srd_refinement_queue_is_in_rank_order_not_id_order():
    # n_P = 5 with θ_high 0.9, θ_low 0.1: u = 1, 0.75, 0.5, 0.25, 0 by rank → KEEP, REFINE ×3, DISCARD.
    # Rewards by id: 0.1, 0.5, 0.3, 0.9, 0.7 → rank order 3, 4, 1, 2, 0.
    method = build_method("srd", {"n": 5, "theta_high": 0.9, "theta_low": 0.1, "n_refine": 2})
    state = method.init_state("q0", "question", [1, 2, 3])
    pool = [_traj(i, r) for i, r in enumerate([0.1, 0.5, 0.3, 0.9, 0.7])]
    keep, queue = method.loop._initial_route(state, pool)
    assert [c["id"] for c in keep] == [3]
    assert [c["id"] for c in queue] == [4, 1, 2]  # id order would be [1, 2, 4]
    assert state["dropped"] == [0]
    assert state["stats"]["routing"] == {KEEP: 1, "refine": 3, DISCARD: 1}


def test_srd_refine_tier_with_exhausted_refinements_is_dropped():
    # as above, but id 4 (rank 1) has had c = n_refine = 2 refinements: dropped, counted as exhausted;
    # id 1 with c = 1 < 2 is still queued
    method = build_method("srd", {"n": 5, "theta_high": 0.9, "theta_low": 0.1, "n_refine": 2})
    state = method.init_state("q0", "question", [1, 2, 3])
    rewards, cs = [0.1, 0.5, 0.3, 0.9, 0.7], [0, 1, 0, 0, 2]
    pool = [_traj(i, r, c) for i, (r, c) in enumerate(zip(rewards, cs, strict=True))]
    keep, queue = method.loop._initial_route(state, pool)
    assert [c["id"] for c in keep] == [3]
    assert [c["id"] for c in queue] == [1, 2]
    assert state["dropped"] == [4, 0]
    assert state["stats"]["exhausted"] == 1


def test_srd_batch_form_keeps_a_spent_refinement_in_the_queue_until_it_is_popped():
    # Algorithm 1 (§1.5), N_refine = 1, θ 0.5 / 0.3: K = five trajectories (.9 .8 .7 .6 .5), the queue
    # [τa (.45), τb (.45)]. τa′ = .55 ranks 4th of 7 (K, τb, τa′): u = 1/3, REFINE, pushed back spent (c = 1).
    # τb′ = .65 then ranks 3rd of 7 (K, τa′ still queued, τb′): u = 1/2, KEEP. Dropping τa′ at once made
    # the pool 6 (u = 2/5, REFINE, and τb′ dropped too). Popped next wave, τa′ is dropped unregenerated.
    method = build_method("srd", {"form": "batch", "n_refine": 1, "theta_high": 0.5, "theta_low": 0.3})
    state = method.init_state("q0", "question", [1, 2, 3])
    keep = [_traj(i, r) for i, r in enumerate([0.9, 0.8, 0.7, 0.6, 0.5])]
    entries = [_traj(5, 0.45), _traj(6, 0.45)]
    a2, b2 = _traj(5, 0.55, c=1), _traj(6, 0.65, c=1)
    next_gen = method.loop._decide(state, keep, entries, [[a2], [b2]])
    assert next_gen == [a2] and keep[-1] is b2
    st = state["stats"]
    assert st["refine_outcomes"] == {"keep": 1, "requeue": 1, "discard": 0}
    assert method.loop._decide(state, keep, next_gen, [[]]) == []  # popped spent: no regeneration
    assert state["dropped"] == [5] and st["exhausted"] == 1 and st["refinements"] == 2
    # the incremental form drops a spent τ′ at once (§1.7): τb′ then ranks 3rd of 6 and is dropped too
    inc = build_method("srd", {"form": "incremental", "n_refine": 1, "theta_high": 0.5, "theta_low": 0.3})
    state = inc.init_state("q0", "question", [1, 2, 3])
    keep = [_traj(i, r) for i, r in enumerate([0.9, 0.8, 0.7, 0.6, 0.5])]
    entries = [_traj(5, 0.45), _traj(6, 0.45)]
    assert inc.loop._decide(state, keep, entries, [[_traj(5, 0.55, c=1)], [_traj(6, 0.65, c=1)]]) == []
    assert len(keep) == 5 and state["dropped"] == [5, 6]


def test_srd_rank_unfinished_only_ranks_a_refinement_among_unfinished_candidates():
    # Kept: two finished (.9, .8) and one unfinished (.2); τ′ = .5. Among the unfinished (.2, τ′) τ′ ranks
    # first, u = 1: KEEP. Ranked with the finished ones too it is 3rd of 4, u = 1/3: REFINE (requeued).
    def decide(unfinished_only: bool):
        method = build_method(
            "srd", {"rank_unfinished_only": unfinished_only, "theta_high": 0.5, "theta_low": 0.3}
        )
        state = method.init_state("q0", "question", [1, 2, 3])
        keep = [_traj(0, 0.9), _traj(1, 0.8), {**_traj(2, 0.2), "finish": None}]
        new = {**_traj(3, 0.5, c=1), "finish": None}
        next_gen = method.loop._decide(state, keep, [{**_traj(3, 0.1), "finish": None}], [[new]])
        return keep[-1] is new, next_gen == [new]

    assert decide(True) == (True, False)
    assert decide(False) == (False, True)


def _self_compare(delta: float, pairs, *, fallback: bool = False):
    """One wave of ``self_compare`` decisions: ``pairs`` = [(R(τ), R(τ′)), ...], τ of id i."""
    method = build_method(
        "srd", {"policy": "self_compare", "self_compare_delta": delta, "self_compare_fallback": fallback}
    )
    state = method.init_state("q0", "question", [1, 2, 3])
    entries = [_traj(i, r) for i, (r, _) in enumerate(pairs)]
    variants = [[_traj(i, r2, c=1)] for i, (_, r2) in enumerate(pairs)]
    keep: list = []
    next_gen = method.loop._decide(state, keep, entries, variants)
    return state, keep, entries, variants, next_gen


def test_self_compare_margin_is_on_the_refined_side():
    # δ = 0.25, R(τ) = 0.5 throughout (all values exact in binary):
    #   R(τ′) = 0.75  → 0.75 ≥ 0.75: KEPT (boundary; a strict > would drop it)
    #   R(τ′) = 0.6   → 0.6 < 0.75: dropped (δ on τ's side: 0.85 ≥ 0.5 would keep it)
    #   R(τ′) = 0.375 → dropped (δ on τ's side: 0.625 ≥ 0.5 would keep it)
    #   R(τ′) = 1.0   → kept
    #   R(τ′) = 0.5   → dropped (not improved either: refine_improved counts strict gains only)
    pairs = [(0.5, 0.75), (0.5, 0.6), (0.5, 0.375), (0.5, 1.0), (0.5, 0.5)]
    state, keep, _, variants, next_gen = _self_compare(0.25, pairs)
    assert [c["id"] for c in keep] == [0, 3]
    assert keep[0] is variants[0][0] and keep[1] is variants[3][0]  # the refined τ′, not τ
    assert next_gen == []  # self_compare never re-queues
    assert state["dropped"] == [1, 2, 4]
    st = state["stats"]
    assert st["refinements"] == 5 and st["refine_kept"] == 2
    assert st["refine_outcomes"] == {"keep": 2, "requeue": 0, "discard": 3}
    assert st["refine_improved"] == 3  # 0.75, 0.6, 1.0 > 0.5; the tie 0.5 is not an improvement


def test_self_compare_with_a_negative_reward_scale():
    # raw rewards may be negative: R(τ) = -1.0, δ = 0.5 → keep iff R(τ′) ≥ -0.5
    pairs = [(-1.0, -0.5), (-1.0, -0.75), (-1.0, -1.25)]
    state, keep, _, _, _ = _self_compare(0.5, pairs)
    assert [c["id"] for c in keep] == [0]  # δ on τ's side would keep -0.75 and -1.25 too
    assert state["dropped"] == [1, 2]


def test_self_compare_fallback_keeps_tau_and_counts_the_failed_edit():
    pairs = [(0.5, 0.6), (0.5, 0.75)]
    state, keep, entries, variants, _ = _self_compare(0.25, pairs, fallback=True)
    assert keep[0] is entries[0] and keep[0]["reward"] == 0.5 and keep[0]["c"] == 1  # τ, not τ′
    assert keep[1] is variants[1][0]
    assert state["dropped"] == []


# ------------------------------------------------------------------------------ 5. absolute threshold


def test_rejection_sampling_absolute_threshold_keeps_equality_and_never_nan():
    method = build_method("rejection_sampling", {"variant": "absolute", "threshold": 0.5})
    router = method.loop.router
    assert router([0.5, JUST_BELOW_HALF, math.nan, 0.75]) == [KEEP, DISCARD, DISCARD, KEEP]
    # a non-dyadic threshold compared exactly, no tolerance either way
    assert build_method("rejection_sampling", {"variant": "absolute", "threshold": 0.1}).loop.router(
        [0.1, math.nextafter(0.1, -math.inf)]
    ) == [KEEP, DISCARD]
    # NaN does not pass when another candidate does
    assert router([math.nan, 0.5]) == [DISCARD, KEEP]
    # none passes: the min-1 guard keeps the best-ranked one, and NaN ranks last
    assert router([math.nan, JUST_BELOW_HALF, 0.25]) == [DISCARD, KEEP, DISCARD]


def test_rejection_sampling_absolute_threshold_in_the_loops_routing():
    method = build_method("rejection_sampling", {"variant": "absolute", "threshold": 0.5, "n": 4})
    state = method.init_state("q0", "question", [1, 2, 3])
    pool = [_traj(0, JUST_BELOW_HALF), _traj(1, 0.5), _traj(2, math.nan), _traj(3, 0.5)]
    keep, queue = method.loop._initial_route(state, pool)
    assert [c["id"] for c in keep] == [1, 3]  # both exactly at the threshold (ties keep id order)
    assert queue == []  # no editor: n_refine = 0 and no REFINE band
    assert sorted(state["dropped"]) == [0, 2]
    assert state["stats"]["routing"] == {KEEP: 2, "refine": 0, DISCARD: 2}


# ---- self-consistency's vote record, by hand (mutation testing: docs/MUTANTS.md) -------------------------
def _sc_state(answers, finishes=None):
    from srd_worker.methods.pool import new_candidate

    cands = [new_candidate() for _ in answers]
    for i, c in enumerate(cands):
        c["text"], c["finish"] = f"response {i}", (finishes or ["eos"] * len(answers))[i]
    return {"answers": list(answers), "candidates": cands}


def test_self_consistency_record_names_the_first_majority_candidate_and_its_votes():
    method = build_method("self_consistency", {"n": 5})
    # "4" (candidates 1, 4) ties "5" (2, 3 after whitespace normalisation): the first seen wins
    rec = method.result(_sc_state([None, "4", " 5", "5 ", "4"], ["length", "stop", "eos", "eos", "eos"]))
    assert (rec["chosen"], rec["votes"], rec["response"], rec["finish_reason"]) == (
        1,
        2,
        "response 1",
        "stop",
    )
    assert "reward" in rec and rec["reward"] is None  # self-consistency uses no reward model
    assert rec["answers"] == [None, "4", " 5", "5 ", "4"] and len(rec["candidates"]) == 5
    spaced = method.result(_sc_state(["1  2", "3", "1 2"]))
    assert (spaced["chosen"], spaced["votes"]) == (0, 2)  # "1  2" and "1 2" are one answer


def test_self_consistency_without_any_answer_falls_back_to_candidate_zero_with_no_votes():
    rec = build_method("self_consistency", {"n": 3}).result(_sc_state([None, None, None]))
    assert (rec["chosen"], rec["votes"], rec["response"]) == (0, 0, "response 0")


def test_self_consistency_counts_rounds_one_per_step(tiny_engine):
    from srd_worker.methods.base import StepContext

    method = build_method("self_consistency", {"n": 2, "max_new_tokens": 24, "chunk_tokens": 8})
    ctx = StepContext(tiny_engine, None, 0, extract_answer=lambda t: t.strip()[-1:] or None)
    prompt = tiny_engine.tokenizer.chat_prompt_ids([{"role": "user", "content": "1+1?"}])
    state = method.init_state("q", "1+1?", prompt)
    assert (state["item_id"], state["question"]) == ("q", "1+1?")
    for k in (1, 2):
        method.step([state], ctx)
        assert state["round"] == k


# ---- Speculative Rejection's record and CSD's memory file, by hand ---------------------------------------
def _entry(i, reward, finish="eos", rnd=1):
    return {"id": i, "text": f"t{i}", "reward": reward, "finish": finish, "round": rnd, "n_tokens": 3, "c": 0}


def test_speculative_rejection_record_fields():
    from srd_worker.methods.base import new_state

    method = build_method("speculative_rejection", {"n": 4})
    state = method.init_state("q7", "what?", [1, 2])
    assert (state["item_id"], state["question"]) == ("q7", "what?")
    state = {**new_state("q7", "what?", [1, 2]), "finished": [_entry(2, 0.4), _entry(0, 0.9, "stop", 2)],
             "pool_sizes": [4, 2], "round": 2}  # fmt: skip
    rec = method.result(state)
    assert (rec["response"], rec["reward"], rec["finish_reason"], rec["chosen"]) == ("t0", 0.9, "stop", 0)
    assert rec["rewards"] == [0.4, 0.9] and rec["finished_ids"] == [2, 0]
    assert rec["pool_sizes"] == [4, 2] and rec["rounds"] == 2 and len(rec["candidates"]) == 2
    assert set(rec["ledger_components"]) == {"drafter", "scorer", "editor", "router"}
    # nothing finished: an empty answer, no reward, no choice
    empty = method.result({**state, "finished": []})
    assert (empty["response"], empty["reward"], empty["finish_reason"], empty["chosen"]) == (
        "",
        None,
        None,
        None,
    )


def test_csd_memory_file_and_record(tmp_path):
    from srd_worker.errors import ConfigError
    from srd_worker.methods.speculative import load_memory

    path = tmp_path / "memory.json"
    path.write_text('{"pairs": {"1,2": 3, "4,5": "6"}}', encoding="utf-8")
    assert load_memory(str(path)) == {"1,2": 3, "4,5": 6}
    path.write_text('{"counts": {}}', encoding="utf-8")
    with pytest.raises(ConfigError, match="not a correction memory"):
        load_memory(str(path))
    csd = build_method("csd", {"draft_model": "testbed-draft"})
    state = csd.init_state("q", "?", [1])
    state["memory"] = {"1,2": 3, "7,8": 1}  # pairs learnt online while decoding this item
    assert csd.result(state)["memory_pairs"] == 2


# ---- the speculative rules' numeric helpers ---------------------------------------------------------------
def test_softmax_is_normalised_shift_invariant_and_safe_for_large_logits():
    import numpy as np

    from srd_worker.methods.speculative_rules import softmax

    p = softmax(np.array([1000.0, 999.0, -np.inf], dtype=np.float32))  # float32 logits, huge values
    assert p.dtype == np.float64 and p.sum() == pytest.approx(1.0) and p[2] == 0.0
    assert p[0] / p[1] == pytest.approx(np.e)
    assert np.allclose(softmax(np.array([1.0, 2.0, 3.0])), softmax(np.array([11.0, 12.0, 13.0])))


def test_prob_entropy_in_nats_ignores_zeros_and_renormalises():
    import math

    import numpy as np

    from srd_worker.methods.speculative_rules import prob_entropy

    assert prob_entropy(np.array([0.5, 0.5, 0.0])) == pytest.approx(math.log(2))
    assert prob_entropy(np.array([2.0, 2.0, 4.0], dtype=np.float32)) == pytest.approx(
        -(0.25 * math.log(0.25) * 2 + 0.5 * math.log(0.5))
    )
    assert prob_entropy(np.array([1.0, 0.0])) == 0.0


def test_result_objects_serialise_every_field():
    import dataclasses
    import json

    from srd_worker.reports.coupled import compare
    from srd_worker.reports.kcurves import k_curve
    from srd_worker.reports.stats import bootstrap_ci, paired

    objs = [
        bootstrap_ci([1, 0, 1]),
        paired([1, 0, 1], [0, 0, 1]),
        compare([{"item_id": "a", "extra": {"R_max": 0.5}}], [{"item_id": "a", "extra": {"R_max": 0.4}}]),
        k_curve([{"candidates": [{"correct": True}, {"correct": False}]}])[0],
    ]
    for obj in objs:
        d = obj.to_dict()
        assert d == dataclasses.asdict(obj) and set(d) == {f.name for f in dataclasses.fields(obj)}
        json.dumps(d)
