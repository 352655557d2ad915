"""SRD, rejection sampling and Speculative Rejection on the tiny random Llama (a real transformers model).

Every configuration runs once (cached for the module) with a JSON snapshot of all states after every
round; the snapshot of the second-to-last round is resumed and must reach identical results. Rewards: ``ArithmeticReward`` (the project's
CPU reward; on random text it is mostly the neutral 0.5, so ranks fall back to candidate ids) and
``HashReward``, a deterministic test double giving distinct pseudo-random prefix rewards so that reward
drops, refinements and re-routing all occur.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from srd_worker.methods.base import StepContext
from srd_worker.methods.registry import METHODS, build_method
from srd_worker.methods.speculative_rejection import keep_count
from srd_worker.rewards.arithmetic import ArithmeticReward
from tests.doubles import HashReward

QUESTIONS = ["What is 3 + 4?", "Compute 6 * 7 and add 5."]
BASE = {"n": 6, "max_new_tokens": 12, "chunk_tokens": 6}
SRD_BASE = {**BASE, "scoring_interval": 3, "l_max": 5}
POLICIES = ["reroute_global", "keep_on_refine", "self_compare", "force_keep", "refine_bob"]


class CountingEngine:
    """Forwards everything to the real engine and records the size of every generate batch."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def generate(self, requests):
        self.calls.append(len(requests))
        return self.inner.generate(requests)


def _srd(policy: str, **kw: Any) -> dict[str, Any]:
    extra = {"bob_b": 2} if policy == "refine_bob" else {}
    if policy == "self_compare":
        extra = {"self_compare_fallback": True}
    return {**SRD_BASE, "policy": policy, **extra, **kw}


#: ArithmeticReward where ties do not spoil what the case checks
ARITH = {"inc_force_keep", "batch_keep_on_refine", "srd_no_editor", "rs_rank"}
CASES: dict[str, tuple[str, dict[str, Any], str]] = {
    **{f"inc_{p}": ("srd", _srd(p), "hash") for p in POLICIES},
    **{f"batch_{p}": ("srd", _srd(p, form="batch"), "hash") for p in POLICIES},
    "inc_reroute_global_eager": ("srd", _srd("reroute_global", checkpoint_scoring="eager"), "hash"),
    "batch_reroute_global_eager": (
        "srd",
        _srd("reroute_global", form="batch", checkpoint_scoring="eager"),
        "hash",
    ),
    # a wide REFINE band: several refinement waves per round, re-queued trajectories
    "inc_wide_band": ("srd", _srd("reroute_global", n=8, theta_high=0.9, theta_low=0.1), "hash"),
    "batch_wide_band": (
        "srd",
        _srd("reroute_global", n=8, theta_high=0.9, theta_low=0.1, form="batch"),
        "hash",
    ),
    "inc_unfinished_archive": (
        "srd",
        _srd("reroute_global", rank_unfinished_only=True, archive_all=True),
        "hash",
    ),
    "srd_no_editor": ("srd", {**SRD_BASE, "n_refine": 0, "theta_low": 0.5}, "hash"),
    "rs_rank": ("rejection_sampling", BASE, "hash"),
    "rs_absolute": ("rejection_sampling", {**BASE, "variant": "absolute", "threshold": 0.6}, "hash"),
    "specrej": ("speculative_rejection", BASE, "hash"),
    # Δ = 2 of 12 tokens: 6 -> 3 -> 2 -> 1 -> round(0.5) = 0 before anything finishes by length
    "specrej_floor": ("speculative_rejection", {**BASE, "chunk_tokens": 2}, "hash"),
    "specrej_reference": ("speculative_rejection", {**BASE, "chunk_tokens": 2, "min_keep": 0}, "hash"),
    # n = 4, Δ = 4 of 12: 4 -> 2 -> 1, and the last one finishes (length) in the round that keeps none
    "specrej_reference_ends": (
        "speculative_rejection",
        {**BASE, "n": 4, "chunk_tokens": 4, "min_keep": 0},
        "hash",
    ),
}
CASES = {k: (m, p, "arith" if k in ARITH else r) for k, (m, p, r) in CASES.items()}


def _reward(kind: str):
    return HashReward() if kind == "hash" else ArithmeticReward()


def _loop(method, engine: CountingEngine, reward, states, steps: list[list[int]]):
    """Run to the end; returns the final states and a JSON snapshot taken after every round."""
    ctx = StepContext(engine, reward, 0)
    snapshots = []
    for _ in range(40):
        active = [s for s in states if not method.done(s)]
        if not active:
            return states, snapshots
        before = len(engine.calls)
        method.step(active, ctx)
        steps.append(engine.calls[before:])
        snapshots.append(json.dumps(states))  # JSON-serialisable after every round
    raise AssertionError("method did not finish")


class Run:
    def __init__(self, name: str, engine: Any) -> None:
        method_name, params, reward = CASES[name]
        self.method = build_method(method_name, params)
        self.reward = reward
        self.engine = CountingEngine(engine)
        prompts = [engine.tokenizer.chat_prompt_ids([{"role": "user", "content": q}]) for q in QUESTIONS]
        states = [
            self.method.init_state(f"q{i}", q, p)
            for i, (q, p) in enumerate(zip(QUESTIONS, prompts, strict=True))
        ]
        self.steps: list[list[int]] = []
        self.states, snapshots = _loop(self.method, self.engine, _reward(reward), states, self.steps)
        self.results = [self.method.result(s) for s in self.states]
        # resume from the second-to-last round (cheaper than round 1, still mid-run)
        self.snapshot = snapshots[-2] if len(snapshots) > 1 else None

    def resumed(self) -> list[dict[str, Any]]:
        states = json.loads(self.snapshot)
        states, _ = _loop(self.method, CountingEngine(self.engine.inner), _reward(self.reward), states, [])
        return states


@pytest.fixture(scope="module")
def runs(tiny_engine):
    cache: dict[str, Run] = {}

    def get(name: str) -> Run:
        if name not in cache:
            cache[name] = Run(name, tiny_engine)
        return cache[name]

    return get


def _deterministic(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in state.items() if k != "timing"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_runs_to_completion_and_resume_is_identical(runs, name):
    run = runs(name)
    assert all(run.method.done(s) for s in run.states)
    for res in run.results:
        # min_keep=0 (the reference code) may answer with the partial response a decision left no room for
        partial_ok = name == "specrej_reference" and res["finish_reason"] is None
        assert res["response"] and (res["finish_reason"] in ("eos", "stop", "length") or partial_ok)
        json.dumps(res)
    assert run.snapshot is not None, "the run should take more than one round"
    resumed = run.resumed()
    assert [run.method.result(s) for s in resumed] == run.results
    assert [_deterministic(s) for s in resumed] == [_deterministic(s) for s in run.states]


@pytest.mark.parametrize("name", sorted(CASES))
def test_ledger_adds_up(runs, name):
    run = runs(name)
    for s in run.states:
        led, comp = s["ledger"], s["ledger"]["components"]
        assert led["gen_tokens"] == comp["drafter"]["out_tokens"] + comp["editor"]["out_tokens"]
        assert led["prefill_tokens"] == comp["drafter"]["in_tokens"] + comp["editor"]["in_tokens"]
        assert led["rm_tokens"] == comp["scorer"]["in_tokens"]
        assert led["gen_tokens"] > 0 and led["rm_calls"] >= comp["scorer"]["calls"] > 0
        if run.method.name != "speculative_rejection":
            log = s["stats"]["rounds"]
            assert comp["router"]["calls"] == len(log) + sum(len(r["waves"]) for r in log)
            assert comp["editor"]["calls"] == sum(len(r["waves"]) for r in log)
            assert s["timing"]["router"] >= 0.0


@pytest.mark.parametrize("name", [n for n in sorted(CASES) if CASES[n][0] == "srd"])
def test_srd_answer_is_best_completed_kept(runs, name):
    run = runs(name)
    for s, res in zip(run.states, run.results, strict=True):
        assert all(c["finish"] is not None for c in s["candidates"])
        kept = [c["reward"] for c in s["candidates"]]
        assert res["R_max"] == max(kept)
        pool = [e["reward"] for e in s["archive"]] if run.method.cfg.archive_all else kept
        assert res["reward"] == max(pool)
        assert sum(res["routing"].values()) > 0
        assert res["p_H"] + res["p_M"] + res["p_L"] == pytest.approx(1.0)


@pytest.mark.parametrize("policy", POLICIES)
def test_refinements_happen_for_every_policy(runs, policy):
    for form in ("inc", "batch"):
        results = runs(f"{form}_{policy}").results
        assert sum(r["refinements"] for r in results) > 0
        for r in results:
            if r["refinements"]:
                assert r["rho"] == r["refine_kept"] / r["refinements"]
                assert r["reward_before_refine"] is not None
        if policy == "force_keep":
            assert all(r["rho"] in (None, 1.0) for r in results)


@pytest.mark.parametrize("form", ["inc", "batch"])
def test_lazy_and_eager_make_identical_decisions(runs, form):
    lazy, eager = runs(f"{form}_reroute_global"), runs(f"{form}_reroute_global_eager")
    assert lazy.steps == eager.steps  # the same engine batches, round by round
    assert sum(r["refinements"] for r in lazy.results) > 0
    for a, b, sa, sb in zip(lazy.results, eager.results, lazy.states, eager.states, strict=True):
        skip = {"checkpoint_scoring", "ledger_components"}
        assert {k: v for k, v in a.items() if k not in skip} == {k: v for k, v in b.items() if k not in skip}
        for comp in ("drafter", "editor"):
            assert sa["ledger"]["components"][comp] == sb["ledger"]["components"][comp]
        assert sa["ledger"]["rm_calls"] <= sb["ledger"]["rm_calls"]
    assert sum(s["ledger"]["rm_calls"] for s in lazy.states) < sum(
        s["ledger"]["rm_calls"] for s in eager.states
    )


def test_srd_without_editor_equals_rank_rejection_sampling(runs):
    srd, rs = runs("srd_no_editor"), runs("rs_rank")
    assert srd.steps == rs.steps
    for a, b, sa, sb in zip(srd.results, rs.results, srd.states, rs.states, strict=True):
        for key in (
            "response",
            "reward",
            "chosen",
            "routing",
            "kept_ids",
            "round_log",
            "R_max",
            "archive_size",
        ):
            assert a[key] == b[key], key
        assert sa["ledger"] == sb["ledger"]
        assert sa["candidates"] == sb["candidates"]
        assert b["routing"]["refine"] == 0 and b["refinements"] == 0


def test_incremental_steps_are_one_engine_batch_of_drafts_and_waves(runs):
    for policy in POLICIES:
        run = runs(f"inc_{policy}")
        # one engine batch per step: the drafts of items in their draft phase beside the refinement waves of
        # the others; every request of the run is in one of them
        assert all(len(c) <= 1 for c in run.steps)
        assert sum(map(sum, run.steps)) == sum(s["ledger"]["lm_calls"] for s in run.states)
        for s in run.states:  # each of an item's waves is one batch it took part in
            waves = [w for r in s["stats"]["rounds"] for w in r["waves"]]
            assert s["ledger"]["components"]["editor"]["calls"] == len(waves)
        assert any(r["waves"] for s in run.states for r in s["stats"]["rounds"])


def test_batch_form_is_one_engine_call_per_step(runs):
    for policy in POLICIES:
        run = runs(f"batch_{policy}")
        assert all(len(c) <= 1 for c in run.steps)
        assert len(run.steps) > 2  # drafting rounds, then refinement waves


def test_rank_unfinished_only_and_archive_all(runs):
    run = runs("inc_unfinished_archive")
    for s, res in zip(run.states, run.results, strict=True):
        assert res["reward"] == max(e["reward"] for e in s["archive"])
        assert res["archive_size"] >= len(s["candidates"])


def test_rejection_sampling_variants(runs):
    for res in runs("rs_rank").results:
        assert res["routing"]["refine"] == 0 and res["p_M"] == 0 and res["efficiency_gain"] == 1.0
    for s, res in zip(runs("rs_absolute").states, runs("rs_absolute").results, strict=True):
        assert all(r["keep"] >= 1 for r in s["stats"]["rounds"])  # min-1 guard
        assert res["variant"] == "absolute" and res["threshold"] == 0.6


def test_speculative_rejection_prunes_by_round_and_answers_best_finished(runs):
    run = runs("specrej")
    for s, res in zip(run.states, run.results, strict=True):
        sizes = s["pool_sizes"]
        assert sizes[0][0] == BASE["n"]
        for (pool, kept), nxt in zip(sizes, sizes[1:] + [None], strict=True):
            assert kept == keep_count(0.5, pool)
            if nxt is not None:
                assert nxt[0] == kept
        assert res["reward"] == max(e["reward"] for e in s["finished"])
        assert s["ledger"]["components"]["editor"]["calls"] == 0


def test_speculative_rejection_min_keep_floor_or_the_reference_codes_stop(runs):
    """At α = 0.5 a pool of one rounds to no survivor (round(0.5) = 0). srdq's default floor keeps the best
    candidate drafting to the end; min_keep=0 (the reference code, §2.3) ends the search there and answers
    with the best of the finished survivors and that round's scored drafts, which may be unfinished."""
    floor, ref = runs("specrej_floor"), runs("specrej_reference")
    for s in floor.states:
        assert all(kept >= 1 for _, kept in s["pool_sizes"]) and s["pool_sizes"][-1][1] == 1
        assert s["stopped"] == []
    stopped_any = False
    for s, res, f in zip(ref.states, ref.results, floor.states, strict=True):
        sizes = s["pool_sizes"]
        for pool, kept in sizes:
            assert kept == keep_count(0.5, pool, 0)
        pool_out = [e for e in s["stopped"] if e["finish"] is None]
        stopped_any |= bool(pool_out)
        if sizes[-1] == [1, 0]:  # the decision that kept none ended the search
            assert s["candidates"] == [] and len(sizes) < len(f["pool_sizes"])  # the floor drafts on
        entries = s["finished"] + s["stopped"]
        assert res["reward"] == max(e["reward"] for e in entries)
        assert {c["id"] for c in res["candidates"]} == {e["id"] for e in entries}
    assert stopped_any, "the search should have stopped with an unfinished draft in at least one problem"
    # the one candidate left finishes in the round whose decision keeps none: rejected by the ranking,
    # yet part of that round's scored candidates, so it is the answer (the reference code's last round)
    ends = runs("specrej_reference_ends")
    for s, res in zip(ends.states, ends.results, strict=True):
        assert s["pool_sizes"] == [[4, 2], [2, 1], [1, 0]] and s["finished"] == []
        assert [e["finish"] for e in s["stopped"]] == ["length"]
        assert res["response"] == s["stopped"][0]["text"] and res["finish_reason"] == "length"
    assert keep_count(0.5, 1) == 1 and keep_count(0.5, 1, 0) == 0 and keep_count(0.5, 3, 0) == 2
    p = build_method("speculative_rejection", {}).params
    assert "min_keep" not in p.to_dict()  # run ids made before the parameter existed stay
    assert build_method("speculative_rejection", {"min_keep": 0}).params.to_dict()["min_keep"] == 0


def test_params_validation():
    from srd_worker.errors import ConfigError

    with pytest.raises(ConfigError, match="theta_low <= theta_high"):
        build_method("srd", {"theta_low": 0.6, "theta_high": 0.5})
    with pytest.raises(ConfigError, match="policy must be one of"):
        build_method("srd", {"policy": "nope"})
    with pytest.raises(ConfigError, match="needs a reward threshold"):
        build_method("rejection_sampling", {"variant": "absolute"})
    for bad in (float("nan"), float("inf"), float("-inf")):  # no reward passes nan or inf: refused
        with pytest.raises(ConfigError, match="parameter .threshold. expects a finite number"):
            build_method("rejection_sampling", {"variant": "absolute", "threshold": bad})
    with pytest.raises(ConfigError, match="alpha"):
        build_method("speculative_rejection", {"alpha": 1.0})
    with pytest.raises(ConfigError, match="min_keep must be 0"):
        build_method("speculative_rejection", {"min_keep": 2})
    p = build_method("srd", {}).params
    assert (
        p.n,
        p.theta_high,
        p.theta_low,
        p.scoring_interval,
        p.chunk_tokens,
        p.l_max,
        p.n_refine,
        p.temperature,
        p.top_p,
        p.top_k,
        p.editor_temperature,
        p.max_new_tokens,
    ) == (10, 0.5, 0.3, 10, 100, 30, 2, 0.8, 0.9, 50, 1.0, 500)
    assert {"srd", "rejection_sampling", "speculative_rejection"} <= set(METHODS)


# ---- rejection sampling's SRD configuration and record, by hand (mutation testing: docs/MUTANTS.md) ----
RS_REFINE_FIELDS = {
    "policy",
    "refine_outcomes",
    "refine_improved",
    "refine_exhausted",
    "reward_before_refine",
    "reward_after_refine",
}


def test_rejection_sampling_is_srd_without_editor_with_its_own_draft_settings():
    from srd_worker.methods.rejection_sampling import RejectionSamplingParams
    from srd_worker.methods.routing import RankRouter
    from srd_worker.methods.srd_loop import SRDParams

    # every value differs from SRDParams' defaults, so a setting that is not passed on shows
    given = {
        "n": 7,
        "theta": 0.25,
        "temperature": 0.6,
        "top_p": 0.85,
        "top_k": 17,
        "max_new_tokens": 40,
        "chunk_tokens": 8,
        "archive_all": True,
        "rank_unfinished_only": True,
    }
    method = build_method("rejection_sampling", given)
    assert method.params == RejectionSamplingParams(**given)  # the runner reads keep_candidates there
    # §1.8: θ_low = θ_high = θ, no editor (n_refine = 0), lazy scoring, Algorithm B
    expected = SRDParams(
        n=7,
        theta_high=0.25,
        theta_low=0.25,
        n_refine=0,
        temperature=0.6,
        top_p=0.85,
        top_k=17,
        max_new_tokens=40,
        chunk_tokens=8,
        archive_all=True,
        rank_unfinished_only=True,
        checkpoint_scoring="lazy",
        form="incremental",
    )
    assert method.cfg == expected and method.loop.cfg == expected
    assert method.loop.router == RankRouter(0.25, 0.25)


def test_rejection_sampling_theta_bounds_are_inclusive():
    from srd_worker.errors import ConfigError

    for theta in (0.0, 1.0):  # both ends of [0, 1] are valid thresholds on u
        assert build_method("rejection_sampling", {"theta": theta}).cfg.theta_high == theta
    for theta in (-0.1, 1.5):
        with pytest.raises(ConfigError, match="theta must be in"):
            build_method("rejection_sampling", {"theta": theta})
    # Speculative Rejection: α = 0 (reject nothing) is allowed, α < 0 is not
    assert build_method("speculative_rejection", {"alpha": 0.0}).params.alpha == 0.0
    with pytest.raises(ConfigError, match="alpha"):
        build_method("speculative_rejection", {"alpha": -0.1})


def test_rejection_sampling_record_names_its_rule_and_drops_the_refinement_fields():
    rank = build_method("rejection_sampling", {"n": 2, "theta": 0.25})
    state = rank.init_state("q1", "what?", [1, 2])
    assert (state["item_id"], state["question"], len(state["candidates"])) == ("q1", "what?", 2)
    rec = rank.result(state)
    # the loop's record, less SRD's refinement fields, plus the rule: the rank variant reports θ
    assert set(rec) == (set(rank.loop.result(state)) - RS_REFINE_FIELDS) | {"variant", "threshold"}
    assert (rec["variant"], rec["threshold"]) == ("rank", 0.25)
    absolute = build_method("rejection_sampling", {"n": 2, "variant": "absolute", "threshold": 0.7})
    rec = absolute.result(absolute.init_state("q1", "what?", [1, 2]))
    assert (rec["variant"], rec["threshold"]) == ("absolute", 0.7)  # the raw reward threshold, not θ
    assert not RS_REFINE_FIELDS & set(rec)


def test_srd_state_keeps_the_question():
    state = build_method("srd", {"n": 3}).init_state("q2", "how many?", [5])
    assert (state["item_id"], state["question"], state["prompt_ids"]) == ("q2", "how many?", [5])
    assert [c["id"] for c in state["candidates"]] == [0, 1, 2]
