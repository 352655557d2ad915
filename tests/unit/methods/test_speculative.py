"""The speculative-decoding family (speculative_sampling, easd, csd): the verification rules as pure math,
the harness on real transformers models (tiny random Llamas built here; the testbed's trained policy and
draft, which share a character tokenizer), resume, and the submit-time checks.

Statistical bound used for "matches the target distribution": with N independent draws from a
distribution p over K outcomes, the empirical distribution p̂ has E[TV(p̂, p)] ≤ ½ Σ_k sqrt(p_k / N)
(Cauchy–Schwarz on E|p̂_k − p_k|), and TV changes by at most 1/N per draw, so McDiarmid gives
P(TV ≥ E + t) ≤ exp(−2 N t²). The tests accept TV ≤ ½ Σ sqrt(p_k / N) + sqrt(ln(1/δ) / (2N)) with
δ = 1e-6, and check that the same bound rejects the draft distribution q (so the test can fail).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from srd_worker.engines.base import GenerationRequest, SamplingParams, SpecStep
from srd_worker.errors import CapabilityError, ConfigError
from srd_worker.methods.base import StepContext
from srd_worker.methods.registry import build_method
from srd_worker.methods.speculative_rules import (
    CSDRule,
    EASDRule,
    LosslessRule,
    draw,
    entropy,
    residual,
    top_n_ids,
    top_n_overlap,
)
from tests.threads import TORCH_THREADS

DELTA = 1e-6


def tv(a: np.ndarray, b: np.ndarray) -> float:
    return 0.5 * float(np.abs(a - b).sum())


def tv_bound(p: np.ndarray, n: int) -> float:
    return 0.5 * float(np.sqrt(p / n).sum()) + math.sqrt(math.log(1 / DELTA) / (2 * n))


def empirical(tokens: list[int], k: int) -> np.ndarray:
    return np.bincount(np.asarray(tokens), minlength=k)[:k] / len(tokens)


# ---------------------------------------------------------------------------------------------------
# The rules on toy categorical "models" (docs/ALGORITHMS.md §7)


TOY = [
    (np.array([0.5, 0.3, 0.2, 0.0, 0.0]), np.array([0.1, 0.1, 0.2, 0.3, 0.3])),  # disjoint-ish supports
    (np.array([0.7, 0.3]), np.array([0.2, 0.8])),  # the 2-token pair of §7
    (np.array([0.25, 0.25, 0.25, 0.25]), np.array([0.97, 0.01, 0.01, 0.01])),
]


@pytest.mark.parametrize("p, q", TOY)
def test_lossless_rule_reproduces_p_on_toy_distributions(p, q):
    rng = np.random.default_rng(0)
    rule = LosslessRule()
    n = 20_000
    out = []
    for _ in range(n):
        x = draw(q, rng)
        step = SpecStep(
            [x], q[None], np.stack([p, p]), np.log(q + 1e-30)[None], np.log(np.stack([p, p]) + 1e-30), False
        )
        v = rule.verify(0, step, rng)
        out.append(x if v.accepted == 1 else v.token)
    emp = empirical(out, len(p))
    assert tv(emp, p) <= tv_bound(p, n)
    assert tv(emp, q) > tv_bound(q, n)  # the bound is tight enough to tell q from p


def test_greedy_rule_accepts_while_draft_is_argmax():
    p = np.eye(4)[[2, 1, 3, 0]]  # target argmax per position: 2, 1, 3, 0
    step = SpecStep(
        [2, 1, 0], np.eye(4)[[2, 1, 0]], p, np.log(np.eye(4)[[2, 1, 0]] + 1e-9), np.log(p + 1e-9), True
    )
    v = LosslessRule().verify(0, step, np.random.default_rng(0))
    assert (v.accepted, v.token) == (2, 3)
    step.draft_tokens = [2, 1, 3]
    assert (LosslessRule().verify(0, step, None).accepted, LosslessRule().verify(0, step, None).token) == (
        3,
        0,
    )


def test_easd_rule_rejects_only_when_both_uncertain_and_overlapping():
    flat = np.full(6, 1 / 6)
    logits = np.log(flat)
    step = SpecStep([1], flat[None], np.stack([flat, flat]), logits[None], np.stack([logits, logits]), True)
    step.p = np.stack([np.eye(6)[1], np.eye(6)[0]])  # greedy target agrees on token 1
    fire = EASDRule(tau_q=0.0, tau_p=0.0, top_n=3, overlap=0.5, beta=1.0, entropy_source="raw")
    v = fire.verify(0, step, None)
    assert v.accepted == 0 and v.token != 1 and v.counts == {"easd_rejected": 1}
    never = EASDRule(tau_q=math.log(6) + 1, tau_p=0.0, top_n=3, overlap=0.5, beta=1.0, entropy_source="raw")
    assert never.verify(0, step, None).accepted == 1


def test_csd_rule_counts_and_rescues():
    z = np.array([[0.0, 2.0, 1.9], [0.0, 2.0, 1.9]])  # target prefers 1; the draft says 2 (gap −0.1)
    p = np.stack([np.eye(3)[1], np.eye(3)[1]])
    step = SpecStep([2], np.eye(3)[[2]], p, np.zeros((1, 3)), z, True)
    online = [{}]
    rule = CSDRule(offline={"2,1": 1}, online=online, lam=3, tau=0.5, update_before_test=True)
    v1 = rule.verify(0, step, None)
    assert (v1.accepted, v1.token, online[0]) == (0, 1, {"2,1": 1})  # count 2 < λ = 3
    v2 = rule.verify(0, step, None)
    assert (v2.accepted, v2.counts["rescued"], online[0]["2,1"]) == (1, 1, 2)  # 1 + 2 ≥ 3, gap ≥ ln 0.5
    closed = CSDRule(offline={"2,1": 99}, online=[{}], lam=0, tau=2.0, update_before_test=True)
    assert closed.verify(0, step, None).accepted == 0  # the gate: −0.1 < ln 2


# ---------------------------------------------------------------------------------------------------
# The rules' exact decisions, with the uniforms placed by hand (docs/ALGORITHMS.md §4.1, §5.2, §6.3)


class Uniforms:
    """Stands in for the request's numpy Generator: hands out the given uniforms in order, so a test puts u
    exactly where it wants (on an interval's edge, on the acceptance ratio); ``left`` shows none was spare."""

    def __init__(self, *us: float) -> None:
        self.left = list(us)

    def random(self) -> float:
        return self.left.pop(0)


def _step(tokens, q, p, *, greedy=False, q_logits=None, p_logits=None) -> SpecStep:
    q, p = np.asarray(q, dtype=np.float64), np.asarray(p, dtype=np.float64)
    return SpecStep(
        list(tokens),
        q,
        p,
        np.log(q + 1e-30) if q_logits is None else np.asarray(q_logits, dtype=np.float64),
        np.log(p + 1e-30) if p_logits is None else np.asarray(p_logits, dtype=np.float64),
        greedy,
    )


def test_draw_gives_each_token_the_half_open_interval_of_its_mass():
    probs = np.array([0.25, 0.25, 0.5])
    # token k owns [cdf_{k-1}, cdf_k): an edge belongs to the token that starts there
    assert [draw(probs, Uniforms(u)) for u in (0.0, 0.24, 0.25, 0.49, 0.5, 0.99)] == [0, 0, 1, 1, 2, 2]
    assert draw(np.array([0.0, 1.0]), Uniforms(0.0)) == 1  # u = 0 never lands on a zero-mass token
    assert draw(np.array([1.0, 3.0]), Uniforms(0.3)) == 1  # unnormalised: u is scaled by the total, 1.2
    # the running sum is float64: a float32 vector's tiny entry keeps its own interval [1, 1 + 1e-8)
    # (a float32 sum would give 1 + 1e-8 = 1, an empty interval); u = 0.5 · (2 + 1e-8) falls inside it
    assert draw(np.array([1.0, 1e-8, 1.0], dtype=np.float32), Uniforms(0.5)) == 1


def test_residual_is_the_normalised_positive_part_and_falls_back_to_p():
    # max(0, p − q) = [0.25, 0.125, 0], mass 0.375
    r = residual(np.array([0.5, 0.25, 0.25]), np.array([0.25, 0.125, 0.625]))
    assert r.tolist() == pytest.approx([2 / 3, 1 / 3, 0.0])
    # no positive part (p == q): p itself, normalised like any residual, and no 0 / 0
    same = np.array([1.0, 3.0])
    assert residual(same, same).tolist() == [0.25, 0.75]


def test_entropy_of_softmax_logits_in_nats():
    assert entropy(np.array([0.0, 0.0, -np.inf])) == pytest.approx(math.log(2))  # a −inf logit adds 0
    assert entropy(np.array([1000.0, 1000.0], dtype=np.float32)) == pytest.approx(math.log(2))  # no overflow
    # p = (1, e) / (1 + e): H = −Σ p ln p = ln(1 + e) − e / (1 + e)
    assert entropy(np.array([0.0, 1.0])) == pytest.approx(math.log(1 + math.e) - math.e / (1 + math.e))


def test_top_n_overlap_counts_shared_ids_and_breaks_ties_by_the_lower_id():
    a, b = np.array([4.0, 3.0, 2.0, 1.0]), np.array([4.0, 3.0, 1.0, 2.0])
    assert top_n_overlap(a, b, 2) == 1.0  # {0, 1} and {0, 1}
    assert top_n_overlap(a, b, 3) == pytest.approx(2 / 3)  # {0, 1, 2} and {0, 1, 3}
    assert top_n_overlap(a, -a, 2) == 0.0  # the top of one is the bottom of the other
    assert top_n_overlap(a, b, 10) == 1.0  # N capped at the vocabulary size
    # 32 tokens share the top score: the top 5 are the five lowest ids among them (0, 2, 4, 6, 8), the
    # same set as a tie-free ranking in id order (an unstable sort picks other tied ids here)
    tied = np.array([1.0, 0.0] * 32)
    ranked = tied - 1e-3 * np.arange(64)
    assert top_n_overlap(tied, ranked, 5) == 1.0
    assert top_n_overlap(ranked, tied, 5) == 1.0


def test_top_n_ids_equal_the_first_n_of_a_stable_descending_sort():
    """The partition-based top-N against the plain stable sort, on vectors full of ties and −inf."""
    rng = np.random.default_rng(0)
    for trial in range(300):
        size = int(rng.integers(1, 60))
        scores = rng.integers(-3, 4, size=size).astype(np.float64)  # a handful of values: many ties
        scores[rng.random(size) < 0.2] = -np.inf
        for n in (1, 2, 5, size - 1, size, size + 3):
            if n < 1:
                continue
            want = set(np.argsort(-scores, kind="stable")[:n].tolist())
            assert top_n_ids(scores, n) == want, (trial, n, scores.tolist())


# Two drafted tokens over a vocabulary of 3. Position 0: x = 0, p/q = 0.25/0.5 = 0.5. Position 1: x = 1,
# p/q = 0.125/0.5 = 0.25, residual max(0, p − q) = [0.25, 0, 0.125] → [2/3, 0, 1/3]. Bonus p = [.25, .25, .5]
# (cdf 0.25, 0.5, 1). Every value is a binary fraction, so each ratio is exact and u can sit on it.
LOSSLESS_Q = [[0.5, 0.25, 0.25], [0.125, 0.5, 0.375]]
LOSSLESS_P = [[0.25, 0.375, 0.375], [0.375, 0.125, 0.5], [0.25, 0.25, 0.5]]
LOSSLESS_CASES = {
    # u below both ratios: keep both; the bonus is drawn from p (u = 0.125 → token 0, not its argmax 2)
    "both kept": ([0, 1], LOSSLESS_Q, LOSSLESS_P, (0.375, 0.125, 0.125), (2, 0)),
    # u equal to the ratio rejects (accept iff u < p/q); the residual draw u = 0.5 → token 0
    "u on the ratio": ([0, 1], LOSSLESS_Q, LOSSLESS_P, (0.375, 0.25, 0.5), (1, 0)),
    # p(x) = 0 is rejected even at u = 0; residual [0, .5, .5], u = 0.5 → token 2
    "p(x) = 0": ([0], [[0.5, 0.25, 0.25]], [[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]], (0.0, 0.5), (0, 2)),
    # q(x) = 0 (ratio ∞) is kept at any u; bonus u = 0.125 → token 0
    "q(x) = 0": ([0], [[0.0, 0.5, 0.5]], [[0.5, 0.25, 0.25], LOSSLESS_P[2]], (0.99, 0.125), (1, 0)),
}
LOSSLESS_RULES = {
    "lossless": LosslessRule,
    "easd that never fires": lambda: EASDRule(
        tau_q=math.inf, tau_p=math.inf, top_n=2, overlap=0.0, beta=1.0, entropy_source="raw"
    ),
    "csd that never rescues": lambda: CSDRule(
        offline={}, online=[{}], lam=99, tau=0.0, update_before_test=True
    ),
}


@pytest.mark.parametrize("case", LOSSLESS_CASES)
@pytest.mark.parametrize("name", LOSSLESS_RULES)
def test_stochastic_rows_follow_the_lossless_test_exactly(name, case):
    tokens, q, p, us, expected = LOSSLESS_CASES[case]
    rng = Uniforms(*us)
    v = LOSSLESS_RULES[name]().verify(0, _step(tokens, q, p), rng)
    assert (v.accepted, v.token) == expected
    assert rng.left == []  # one uniform per tested token and one for the emitted draw
    counts = {}
    if name.startswith("csd"):
        counts = {"rescued": 0, "rejected": 1} if v.accepted < len(tokens) else {"rescued": 0}
    assert v.counts == counts


def test_easd_greedy_verdicts():
    p = np.eye(3)[[1, 2, 2]]  # target argmax 1, 2; bonus 2
    z = np.log(p + 1e-9)
    quiet = EASDRule(tau_q=math.inf, tau_p=math.inf, top_n=2, overlap=0.0, beta=1.0, entropy_source="raw")
    v = quiet.verify(0, _step([1, 0], p[:2], p, greedy=True, q_logits=z[:2], p_logits=z), None)
    assert (v.accepted, v.token, v.counts) == (1, 2, {})  # mismatch at 1: the target's argmax
    v = quiet.verify(0, _step([1, 2], p[:2], p, greedy=True, q_logits=z[:2], p_logits=z), None)
    assert (v.accepted, v.token, v.counts) == (2, 2, {})  # all kept: the bonus argmax
    # Firing (τ = 0, top-2 {1, 2} on both sides) on x = 1 with raw target logits [0, 2, 1]: β = 1 removes x
    # and the argmax of the rest is 2; β = 0.5 leaves x ahead (e²/2 ≈ 3.69 > e ≈ 2.72 in softmax's
    # numerators), so x is kept and the next position is tested (a mismatch there: argmax 0).
    z_fire = np.array([[0.0, 2.0, 1.0], [5.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    p_fire = np.eye(3)[[1, 0, 0]]
    step = _step([1, 2], p_fire[:2], p_fire, greedy=True, q_logits=z_fire[:2], p_logits=z_fire)

    def fire(beta: float) -> EASDRule:
        return EASDRule(tau_q=0.0, tau_p=0.0, top_n=2, overlap=0.5, beta=beta, entropy_source="raw")

    v = fire(1.0).verify(0, step, None)
    assert (v.accepted, v.token, v.counts) == (0, 2, {"easd_rejected": 1})
    v = fire(0.5).verify(0, step, None)
    assert (v.accepted, v.token, v.counts) == (1, 0, {})


def test_easd_stochastic_penalty_resamples_from_the_processed_target():
    # x = 0 passes the lossless test (p/q = 1); the raw logits are flat (H = ln 4 ≥ 0, top-2 {0, 1} on both
    # sides) so the penalty fires. The processed p = [.5, .5, 0, 0] (say after top-k) with β = 0.5 gives
    # [.25, .5, 0, 0] → [1/3, 2/3, 0, 0]: u = 0.25 → token 0, u = 0.4 → token 1. (The flat raw softmax would
    # give [1/7, 2/7, 2/7, 2/7]; setting p(x) to 1 − β instead of scaling it, [.5, .5] → u = 0.4 → 0.)
    flat = np.zeros((2, 4))
    step = _step([0], [[0.5, 0.25, 0.25, 0.0]], [[0.5, 0.5, 0.0, 0.0]] * 2, q_logits=flat[:1], p_logits=flat)
    rule = EASDRule(tau_q=0.0, tau_p=0.0, top_n=2, overlap=1.0, beta=0.5, entropy_source="raw")
    for u, token in ((0.25, 0), (0.4, 1)):
        rng = Uniforms(0.9, u)
        v = rule.verify(0, step, rng)
        assert (v.accepted, v.token, v.counts, rng.left) == (0, token, {"easd_rejected": 1}, [])


def test_easd_keeps_x_when_the_target_had_no_other_mass_and_goes_on():
    # Position 0: p = one-hot on x = 0 (p/q = 2, kept); the penalty fires with β = 1 and leaves no mass, so
    # x stays and position 1 is tested: p(x = 1) = 0 → rejected, residual [0, 0, 1, 0] → token 2.
    flat = np.zeros((3, 4))
    q = [[0.5, 0.5, 0.0, 0.0]] * 2
    p = [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.25] * 4]
    rule = EASDRule(tau_q=0.0, tau_p=0.0, top_n=2, overlap=1.0, beta=1.0, entropy_source="raw")
    rng = Uniforms(0.5, 0.5, 0.5)
    v = rule.verify(0, _step([0, 1], q, p, q_logits=flat[:2], p_logits=flat), rng)
    assert (v.accepted, v.token, v.counts, rng.left) == (1, 2, {}, [])


def test_easd_full_penalty_resamples_from_a_tiny_leftover_and_never_emits_x():
    # β = 1 removes x = 0 entirely; the target left only 1e-170 elsewhere (token 1): the resample is
    # renormalised first (1e-170 / 1e-170 = 1), so it emits token 1 at any u, never x
    flat = np.zeros((2, 4))
    step = _step([0], [[0.5, 0.5, 0.0, 0.0]], [[1.0, 1e-170, 0.0, 0.0]] * 2, q_logits=flat[:1], p_logits=flat)
    rule = EASDRule(tau_q=0.0, tau_p=0.0, top_n=2, overlap=1.0, beta=1.0, entropy_source="raw")
    for u in (0.0, 0.5, 0.99):
        v = rule.verify(0, step, Uniforms(0.5, u))
        assert (v.accepted, v.token, v.counts) == (0, 1, {"easd_rejected": 1})


def test_easd_fires_on_the_chosen_entropies_at_their_thresholds():
    flat, peaked = np.zeros(4), np.array([10.0, 0.0, 0.0, 0.0])
    one_hot, uniform = np.eye(4)[0], np.full(4, 0.25)

    def rule(source: str, tau_q: float = 1.0, tau_p: float = 1.0) -> EASDRule:
        return EASDRule(tau_q=tau_q, tau_p=tau_p, top_n=2, overlap=1.0, beta=1.0, entropy_source=source)

    # raw logits flat (H = ln 4 ≈ 1.39 ≥ 1) but the processed distributions one-hot (H = 0), and the reverse
    raw_high = _step([0], [one_hot], [one_hot] * 2, q_logits=[flat], p_logits=[flat] * 2)
    processed_high = _step([0], [uniform], [uniform] * 2, q_logits=[peaked], p_logits=[peaked] * 2)
    assert rule("raw").fires(raw_high, 0) and not rule("processed").fires(raw_high, 0)
    assert rule("processed").fires(processed_high, 0) and not rule("raw").fires(processed_high, 0)
    # tempered: softmax(z / T) over the whole vocabulary. z = [ln 3, 0, 0, 0]: H(softmax(z)) = H(.5, 1/6 ×3)
    # = 1.2425 nats; at T = 0.5, softmax(2z) = (.75, 1/12 ×3), H = 0.8676. τ = 1 between them: raw fires,
    # tempered at T = 0.5 does not, tempered at T = 1 is raw
    z = np.array([math.log(3), 0.0, 0.0, 0.0])
    mid = _step([0], [one_hot], [one_hot] * 2, q_logits=[z], p_logits=[z] * 2)
    tempered = EASDRule(
        tau_q=1.0, tau_p=1.0, top_n=2, overlap=1.0, beta=1.0, entropy_source="tempered", temperature=0.5
    )
    assert tempered.entropy_at(mid, 0, target=True) == pytest.approx(
        -(0.75 * math.log(0.75) + 0.25 * math.log(1 / 12))
    )
    assert rule("raw").fires(mid, 0) and not tempered.fires(mid, 0)
    at_one = EASDRule(tau_q=1.0, tau_p=1.0, top_n=2, overlap=1.0, beta=1.0, entropy_source="tempered")
    assert at_one.fires(mid, 0) and at_one.entropy_at(mid, 0, target=False) == rule("raw").entropy_at(
        mid, 0, target=False
    )
    # entropy exactly at a threshold fires (H ≥ τ): two equal logits, H = −2 · ½ ln ½ = ln 2 exactly
    two = _step([0], [[0.5, 0.5]], [[0.5, 0.5]] * 2, q_logits=[[0.0, 0.0]], p_logits=[[0.0, 0.0]] * 2)
    ln2 = math.log(2)
    assert rule("raw", tau_q=ln2, tau_p=0.0).fires(two, 0) and rule("raw", tau_q=0.0, tau_p=ln2).fires(two, 0)
    above = math.nextafter(ln2, math.inf)
    assert not rule("raw", tau_q=above, tau_p=0.0).fires(two, 0)
    assert not rule("raw", tau_q=0.0, tau_p=above).fires(two, 0)


def test_csd_greedy_verdicts_and_counts():
    # target logits per position: argmax 0, 2, 1; bonus argmax 2
    z = np.array([[2.0, 1.5, 0.0], [0.0, 1.5, 2.0], [0.0, 2.0, 0.0], [0.0, 1.0, 2.0]])
    p = np.eye(3)[[0, 2, 1, 2]]

    def step(tokens: list[int]) -> SpecStep:
        return SpecStep(list(tokens), np.eye(3)[tokens], p, np.zeros((3, 3)), z, True)

    def rule(online: list) -> CSDRule:
        # every pair below is frequent enough; ln 0.5 ≈ −0.69 is the gate
        offline = {"1,0": 5, "1,2": 5, "0,1": 5}
        return CSDRule(offline=offline, online=online, lam=3, tau=0.5, update_before_test=True)

    online: list[dict[str, int]] = [{}]
    # 1 vs 0 (gap −0.5) and 1 vs 2 (gap −0.5) rescued; 0 vs 1 (gap −2 < ln 0.5) refused by the gate
    v = rule(online).verify(0, step([1, 1, 0]), None)
    assert (v.accepted, v.token, v.counts) == (2, 1, {"rescued": 2, "rejected": 1})
    assert online == [{"1,0": 1, "1,2": 1, "0,1": 1}]
    v = rule([{}]).verify(0, step([0, 0, 1]), None)  # a match, then 0 vs 2: rare (count 1), refused
    assert (v.accepted, v.token, v.counts) == (1, 2, {"rescued": 0, "rejected": 1})
    v = rule([{}]).verify(0, step([0, 2, 1]), None)  # all match: the bonus argmax
    assert (v.accepted, v.token, v.counts) == (3, 2, {"rescued": 0})


@pytest.mark.parametrize("update_before_test, lam", [(True, 2), (False, 1)])
def test_csd_memory_counts_each_mismatch_once_before_or_after_the_test(update_before_test, lam):
    # x = 1 against t* = 0 with the gate open (τ = 0), no offline count: only the row's own count decides.
    # Counted before the test, the first mismatch sees 1 < λ = 2; counted after, it sees 0 < λ = 1: both
    # reject it, and both rescue the second one (2 ≥ 2, 1 ≥ 1).
    step = SpecStep(
        [1], np.eye(2)[[1]], np.eye(2)[[0, 0]], np.zeros((1, 2)), np.array([[1.0, 0.0]] * 2), True
    )
    online: list[dict[str, int]] = [{}, {}]
    rule = CSDRule(offline={}, online=online, lam=lam, tau=0.0, update_before_test=update_before_test)
    v = rule.verify(1, step, None)
    assert (v.accepted, v.token, v.counts) == (0, 0, {"rescued": 0, "rejected": 1})
    v = rule.verify(1, step, None)
    assert (v.accepted, v.token, v.counts) == (1, 0, {"rescued": 1})
    assert online == [{}, {"1,0": 2}]  # row 1's own memory, one count per mismatch


def test_csd_gate_admits_a_gap_equal_to_ln_tau():
    # a tie in the target's logits: argmax picks 0, the draft says 1, gap 0 = ln 1
    step = SpecStep(
        [1], np.eye(2)[[1]], np.eye(2)[[0, 1]], np.zeros((1, 2)), np.array([[1.0, 1.0], [0.0, 1.0]]), True
    )
    rule = CSDRule(offline={"1,0": 1}, online=[{}], lam=1, tau=1.0, update_before_test=False)
    v = rule.verify(0, step, None)
    assert (v.accepted, v.token, v.counts) == (1, 1, {"rescued": 1})


# Stochastic CSD: x = 1 at both positions, rejected by the lossless test at u = 0.75 (p/q = 0.5, then 0.25);
# the target's processed argmax is t* = 2 at both, and the raw gap z(1) − z(2) is −0.5 ≥ ln 0.5 unless
# position 1's logits say −3. The offline memory knows (1, 2) five times (λ = 3).
CSD_Q = [[0.25, 0.5, 0.25], [0.125, 0.5, 0.375]]
CSD_P = [[0.25, 0.25, 0.5], [0.375, 0.125, 0.5], [0.25, 0.25, 0.5]]


def _csd_stochastic(online: list) -> CSDRule:
    return CSDRule(offline={"1,2": 5, "2,2": 5}, online=online, lam=3, tau=0.5, update_before_test=False)


def test_csd_stochastic_rescues_rejected_tokens_then_draws_the_bonus_from_p():
    z = [[-5.0, -0.5, 0.0]] * 3
    online: list[dict[str, int]] = [{}]
    rng = Uniforms(0.75, 0.75, 0.125)
    v = _csd_stochastic(online).verify(0, _step([1, 1], CSD_Q, CSD_P, p_logits=z), rng)
    assert (v.accepted, v.token, v.counts, rng.left) == (2, 0, {"rescued": 2}, [])  # bonus u = .125 → 0
    assert online == [{"1,2": 2}]


def test_csd_stochastic_refused_rescue_emits_the_residual_draw():
    z = [[-5.0, -0.5, 0.0], [-5.0, -3.0, 0.0], [0.0, 0.0, 0.0]]
    online: list[dict[str, int]] = [{}]
    rng = Uniforms(0.75, 0.75, 0.5)
    v = _csd_stochastic(online).verify(0, _step([1, 1], CSD_Q, CSD_P, p_logits=z), rng)
    # position 1: gap −3 < ln 0.5; residual max(0, p − q) = [.25, 0, .125] → [2/3, 0, 1/3], u = 0.5 → 0
    assert (v.accepted, v.token, v.counts, rng.left) == (1, 0, {"rescued": 1, "rejected": 1}, [])
    assert online == [{"1,2": 2}]  # the refused mismatch is counted too


def test_csd_stochastic_rescues_the_targets_own_argmax_by_the_same_test():
    # x = 2 is t* itself (p/q = 0.5, rejected at u = 0.75): the same rescue test runs on the pair (2, 2).
    # The offline memory holds 5 of it (counted after the test here): 5 ≥ λ = 3 and the gap 0 ≥ ln 0.5:
    # rescued, then the bonus from p_1 at u = 0.25 (cdf .375, .5, 1 → token 0). With no count for (2, 2):
    # 0 < 3, refused, and the residual [.25, .25, 0] → [.5, .5, 0] at u = .25 → 0.
    step = _step([2], [[0.0, 0.0, 1.0]], CSD_P[:2], p_logits=np.zeros((2, 3)))
    online: list[dict[str, int]] = [{}]
    rng = Uniforms(0.75, 0.25)
    v = _csd_stochastic(online).verify(0, step, rng)
    assert (v.accepted, v.token, v.counts, rng.left) == (1, 0, {"rescued": 1}, [])
    assert online == [{"2,2": 1}]
    refused = CSDRule(offline={}, online=[{}], lam=3, tau=0.5, update_before_test=False)
    rng = Uniforms(0.75, 0.25)
    v = refused.verify(0, step, rng)
    assert (v.accepted, v.token, v.counts, rng.left) == (0, 0, {"rescued": 0, "rejected": 1}, [])
    assert refused.online == [{"2,2": 1}]


def _processed_reference(logits: np.ndarray, temp: float, top_k: int, top_p: float) -> np.ndarray:
    """One row's processed distribution written out plainly: a full stable sort of the whole vocabulary."""
    vocab = len(logits)
    out = np.zeros(vocab)
    if temp == 0:
        out[int(np.argmax(logits))] = 1.0
        return out
    z = logits.astype(np.float64) / temp
    order = np.argsort(-z, kind="stable")
    k = top_k if 0 < top_k < vocab else vocab
    kept = z[order[:k]]
    w = np.exp(kept - kept.max())
    w /= w.sum()
    before = np.cumsum(w) - w
    w = np.where(before < top_p, w, 0.0)
    out[order[:k]] = w / w.sum()
    return out


@pytest.mark.parametrize(
    "rows",
    [
        # every sampled row has a top-k below the vocabulary: the top-k selection path (a greedy row's
        # top-k of 0 must not force the full sort on the others)
        [(0.8, 50, 0.9), (1.0, 3, 1.0), (0.0, 0, 1.0), (1.3, 50, 0.5), (0.5, 1, 0.9)],
        # a sampled row without top-k (0, or at least the vocabulary): the full sort for the batch
        [(0.8, 50, 0.9), (1.0, 0, 0.95), (0.7, 1_000_000, 0.8), (0.0, 7, 1.0)],
    ],
)
def test_processed_probs_equal_a_full_sort_of_the_vocabulary(rows):
    """The harness's q and p (temperature, top-k, top-p, renormalised; one-hot for greedy) against a plain
    per-row reference, on a vocabulary the size of Qwen2.5's and logits with no ties."""
    import torch

    from srd_worker.engines.speculative import processed_probs

    vocab = 151_936
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn((len(rows), vocab), generator=gen) * 4
    temps = torch.tensor([r[0] for r in rows], dtype=torch.float32)
    ks = torch.tensor([r[1] for r in rows], dtype=torch.long)
    ps = torch.tensor([r[2] for r in rows], dtype=torch.float32)
    got = processed_probs(logits, temps, ks, ps).numpy()
    for i, (t, k, top_p) in enumerate(rows):
        want = _processed_reference(logits[i].numpy(), t, k, top_p)
        # float32 against float64 sums: the top-p cut may move by a token in a long tail, nothing more
        assert np.abs(got[i] - want).sum() < 1e-3, f"row {i}"
        assert abs(int((got[i] > 0).sum()) - int((want > 0).sum())) <= 2, f"row {i}: support size"
        assert got[i].sum() == pytest.approx(1.0, abs=1e-5)
        if 0 < k < vocab and t > 0:
            np.testing.assert_array_equal(got[i] > 0, want > 0, err_msg=f"row {i}: support differs")


# ---------------------------------------------------------------------------------------------------
# The harness on tiny random Llamas


@pytest.fixture(scope="module")
def tiny_pair():
    """Target: the tiny random Llama (seed 0); draft: a smaller random Llama with untied embeddings (a
    tied random Llama mostly repeats its input token, so two of them would agree on nearly everything),
    same tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from srd_worker.engines.loading import build_tiny_llama
    from srd_worker.engines.speculative import register_draft
    from srd_worker.engines.transformers_engine import TransformersEngine

    torch.set_num_threads(TORCH_THREADS)
    model, tok = build_tiny_llama(seed=0)
    cfg = LlamaConfig(
        **{**model.config.to_dict(), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    )
    cfg.tie_word_embeddings = False
    with torch.random.fork_rng():
        torch.manual_seed(1)
        draft = LlamaForCausalLM(cfg).eval()
    engine = TransformersEngine(
        model.to(torch.float32), tok, model_name="tiny-random-llama", max_batch_size=512
    )
    register_draft(engine, "tiny-draft", draft.to(torch.float32), tok)
    return engine


def _prompt(engine, text: str) -> tuple[int, ...]:
    return tuple(engine.tokenizer.chat_prompt_ids([{"role": "user", "content": text}]))


def _target_probs(engine, prefix: tuple[int, ...], sp: SamplingParams) -> np.ndarray:
    import torch

    from srd_worker.engines.speculative import processed_probs

    with torch.inference_mode():
        logits = engine.model(input_ids=torch.tensor([prefix])).logits[:, -1, :].float()
    return processed_probs(
        logits, torch.tensor([sp.temperature]), torch.tensor([sp.top_k]), torch.tensor([sp.top_p])
    )[0].numpy()


def test_speculative_sampling_matches_the_target_distribution(tiny_pair):
    """Seeded draws of the first two tokens (γ = 1: the first is accepted or resampled from the residual,
    the second is then either the bonus token or drafted again) against the target's processed p."""
    sp = dict(temperature=1.0, top_k=8, top_p=0.95, max_new_tokens=2)
    prompt = tuple(tiny_pair.tokenizer.encode("2+3="))
    n = 2000
    reqs = [GenerationRequest(prompt, SamplingParams(**sp, seed=s)) for s in range(n)]
    gens = tiny_pair.speculate(reqs, LosslessRule(), draft_model="tiny-draft", gamma=1)
    vocab = tiny_pair.model.config.vocab_size
    p1 = _target_probs(tiny_pair, prompt, SamplingParams(**sp))
    first = [g.token_ids[0] for g in gens]
    assert tv(empirical(first, vocab), p1) <= tv_bound(p1, n)
    q1 = _target_probs_draft(tiny_pair, prompt, SamplingParams(**sp))
    assert tv(q1, p1) > tv_bound(p1, n)  # the draft alone would fail the same bound
    assert 0 < sum(g.stats["accepted"] for g in gens) < n  # both the accept and the residual path ran
    # the second token, given the most frequent first token
    top = int(np.argmax(np.bincount(first)))
    second = [g.token_ids[1] for g in gens if g.token_ids[0] == top and len(g.token_ids) > 1]
    p2 = _target_probs(tiny_pair, prompt + (top,), SamplingParams(**sp))
    assert len(second) > 300
    assert tv(empirical(second, vocab), p2) <= tv_bound(p2, len(second))


def _target_probs_draft(engine, prefix, sp):
    import torch

    from srd_worker.engines.speculative import draft_for, processed_probs

    d = draft_for(engine, "tiny-draft")
    with torch.inference_mode():
        logits = d.model(input_ids=torch.tensor([prefix])).logits[:, -1, :].float()
    return processed_probs(
        logits, torch.tensor([sp.temperature]), torch.tensor([sp.top_k]), torch.tensor([sp.top_p])
    )[0].numpy()


QUESTIONS = ["What is 3 + 4?", "Tom has 5 apples and eats 2. How many are left?", "Compute 6 * 7."]


def test_greedy_speculative_equals_target_greedy_on_tiny_pair(tiny_pair):
    reqs = [
        GenerationRequest(_prompt(tiny_pair, q), SamplingParams(temperature=0, max_new_tokens=30))
        for q in QUESTIONS
    ]
    ref = tiny_pair.generate(reqs)
    for gamma in (1, 3):
        out = tiny_pair.speculate(reqs, LosslessRule(), draft_model="tiny-draft", gamma=gamma)
        assert [g.token_ids for g in out] == [g.token_ids for g in ref]
        assert [g.finish_reason for g in out] == [g.finish_reason for g in ref]


def run_method(method, engine, seed=0):
    ctx = StepContext(engine, None, seed)
    states = [method.init_state(f"q{i}", q, list(_prompt(engine, q))) for i, q in enumerate(QUESTIONS)]
    snaps = []
    for _ in range(50):
        active = [s for s in states if not method.done(s)]
        if not active:
            return states, snaps
        method.step(active, ctx)
        snaps.append(json.dumps(states))
    raise AssertionError("did not finish")


_RUNS: dict[str, tuple[Any, list[dict[str, Any]], list[str]]] = {}


def cached_run(engine, name: str, params: dict[str, Any]):
    """(method, final states, per-round snapshots) of one configuration, run once per test session."""
    key = json.dumps([name, params], sort_keys=True)
    if key not in _RUNS:
        method = build_method(name, params)
        states, snaps = run_method(method, engine)
        _RUNS[key] = (method, states, snaps)
    return _RUNS[key]


def _det(states: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in s.items() if k != "timing"} for s in states]


BASE = {"draft_model": "tiny-draft", "max_new_tokens": 16, "chunk_tokens": 6}


def test_easd_that_never_fires_equals_speculative_sampling(tiny_pair):
    _, a, _ = cached_run(tiny_pair, "speculative_sampling", {**BASE, "gamma": 3})
    _, b, _ = cached_run(tiny_pair, "easd", {**BASE, "gamma": 3, "tau_q": 1e9, "tau_p": 1e9})
    assert [s["candidates"] for s in a] == [s["candidates"] for s in b]
    assert all(s["spec"]["easd_rejected"] == 0 for s in b)
    # thresholds at 0 and overlap 0: the penalty fires on every token that passes the standard test
    fire = build_method("easd", {**BASE, "gamma": 3, "tau_q": 0, "tau_p": 0, "overlap": 0})
    c, _ = run_method(fire, tiny_pair)
    assert sum(s["spec"]["easd_rejected"] for s in c) > 0
    assert all(s["spec"]["accepted"] == 0 for s in c)


def test_csd_with_empty_memory_and_closed_gate_equals_greedy_speculative(tiny_pair):
    _, a, _ = cached_run(tiny_pair, "speculative_sampling", {**BASE, "temperature": 0, "gamma": 4})
    _, b, _ = cached_run(tiny_pair, "csd", {**BASE, "gamma": 4, "tau": 2.0})
    assert [s["candidates"] for s in a] == [s["candidates"] for s in b]
    assert all(s["spec"]["rescued"] == 0 for s in b)
    assert sum(sum(s["memory"].values()) for s in b) == sum(s["spec"]["rejected"] for s in b) > 0


def test_csd_that_rescues_everything_keeps_every_draft_token(tiny_pair):
    """λ = 0 and τ = 0 (ln τ = −∞): every mismatch is rescued, so every iteration keeps all γ draft tokens
    (then the target's bonus token), and the text differs from greedy speculative decoding's."""
    _, states, _ = cached_run(tiny_pair, "csd", {**BASE, "gamma": 4, "tau": 0.0, "lambda_count": 0})
    for s in states:
        assert s["spec"]["accepted"] == s["spec"]["drafted"] > 0
    assert sum(s["spec"]["rescued"] for s in states) > 0
    _, greedy, _ = cached_run(tiny_pair, "speculative_sampling", {**BASE, "temperature": 0, "gamma": 4})
    assert [s["candidates"] for s in states] != [s["candidates"] for s in greedy]
    # sampling (temperature 0.8): every lossless rejection meets the same test, the target's own argmax
    # included, so again every draft token is kept
    _, sampled, _ = cached_run(
        tiny_pair, "csd", {**BASE, "gamma": 4, "tau": 0.0, "lambda_count": 0, "temperature": 0.8}
    )
    for s in sampled:
        assert s["spec"]["accepted"] == s["spec"]["drafted"] > 0
    assert sum(s["spec"]["rescued"] for s in sampled) > 0


def test_accepted_over_verified_estimates_the_per_token_acceptance_a():
    """§4.1: a = Σ min(p, q) = 0.6 for p = [.6, .3, .1], q = [.2, .3, .5]; with γ = 5 a pass emits
    (1 − a^6)/(1 − a) = 2.38 tokens on average. Over 20,000 lossless verifications accepted / verified is
    a (accepted / drafted, the positions after a rejection counted as tested, is about 0.28)."""
    from srd_worker.engines.speculative import verified_positions

    p, q, gamma = np.array([0.6, 0.3, 0.1]), np.array([0.2, 0.3, 0.5]), 5
    rng = np.random.default_rng(0)
    rule, accepted, verified, emitted = LosslessRule(), 0, 0, 0
    for _ in range(20_000):
        draft = [int(rng.choice(3, p=q)) for _ in range(gamma)]
        step = SpecStep(draft, np.tile(q, (gamma, 1)), np.tile(p, (gamma + 1, 1)), None, None, False)
        v = rule.verify(0, step, rng)
        accepted += v.accepted
        verified += verified_positions(v.accepted, gamma)
        emitted += v.accepted + 1
    a = accepted / verified
    assert a == pytest.approx(0.6, abs=0.01)
    assert accepted / (20_000 * gamma) == pytest.approx(0.28, abs=0.01)
    assert emitted / 20_000 == pytest.approx((1 - a ** (gamma + 1)) / (1 - a), rel=0.02)


class KeptRecorder:
    """A verification rule around another: records each verify's verdict length and what ``emitted`` said
    was kept, per row."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.calls = inner, []

    def verify(self, row: int, step: SpecStep, rng: Any):
        verdict = self.inner.verify(row, step, rng)
        self.calls.append([row, verdict.accepted + 1, None])
        return verdict

    def emitted(self, row: int, kept: int) -> None:
        assert self.calls[-1][0] == row and self.calls[-1][2] is None  # once, right after its verify
        self.calls[-1][2] = kept
        self.inner.emitted(row, kept)


def test_the_harness_tells_the_rule_how_many_tokens_of_each_verdict_it_kept(tiny_pair):
    """After every verify the harness says how many of the verdict's tokens it emitted: all of them, but
    fewer where the budget cut the iteration (the tokens a request got add up to what was kept)."""
    reqs = [
        GenerationRequest(_prompt(tiny_pair, q), SamplingParams(temperature=0, max_new_tokens=budget))
        for q, budget in zip(QUESTIONS, (5, 7, 11), strict=True)
    ]
    online: list[dict[str, int]] = [{} for _ in reqs]
    # λ = 0, τ = 0: every mismatch rescued, so every iteration keeps γ + 1 = 5 tokens and budgets 7 and 11 cut
    rule = KeptRecorder(CSDRule(offline={}, online=online, lam=0, tau=0.0, update_before_test=True))
    out = tiny_pair.speculate(reqs, rule, draft_model="tiny-draft", gamma=4)
    for row, gen in enumerate(out):
        calls = [(n, kept) for r, n, kept in rule.calls if r == row]
        assert all(kept is not None and 1 <= kept <= n for n, kept in calls)
        assert sum(kept for _, kept in calls) == len(gen.token_ids)
        assert all(kept == n for n, kept in calls[:-1])  # only the last iteration is cut
    assert sum(kept < n for _, n, kept in rule.calls) == 2  # budgets 7 and 11 fell inside an iteration
    assert rule.inner.counted == {}  # nothing left over to take back
    # what the memory holds is what the kept text met: no more mismatches than kept draft positions
    assert 0 < sum(sum(m.values()) for m in online) <= sum(len(g.token_ids) for g in out)


@pytest.mark.parametrize("update_before_test", [True, False])
def test_csd_takes_back_the_mismatches_counted_past_what_the_harness_kept(update_before_test):
    """The harness cut a verdict (EOS, a stop string, the round's budget): the mismatches counted at draft
    positions past the cut leave the memory, since the next round drafts there again and counts anew.
    Greedy, the target's argmax 0 everywhere, λ = 10 (nothing rescued)."""
    z = np.array([[1.0, 0.0, 0.0]] * 3)
    p = np.eye(3)[[0, 0, 0]]
    online: list[dict[str, int]] = [{"1,0": 1}]  # from an earlier round
    rule = CSDRule(offline={}, online=online, lam=10, tau=0.0, update_before_test=update_before_test)

    def verify(tokens: list[int]) -> tuple[int, int]:
        v = rule.verify(0, SpecStep(tokens, np.eye(3)[tokens], p, np.zeros((2, 3)), z, True), None)
        return v.accepted, v.token

    assert verify([1, 1]) == (0, 0) and online == [{"1,0": 2}]  # 1 vs 0 at position 0
    rule.emitted(0, 1)  # the target's token at position 0 kept: the count stays
    assert online == [{"1,0": 2}]
    assert verify([2, 2]) == (0, 0) and online == [{"1,0": 2, "2,0": 1}]
    rule.emitted(0, 0)  # cut before position 0: taken back, and a count back at 0 leaves no key
    assert online == [{"1,0": 2}]
    assert verify([0, 1]) == (1, 0) and online == [{"1,0": 3}]  # a match, then 1 vs 0 at position 1
    rule.emitted(0, 1)  # the match kept, the mismatch cut
    assert online == [{"1,0": 2}]
    rule.emitted(0, 0)  # nothing counted since the last verify: nothing more to take back
    assert online == [{"1,0": 2}] and rule.counted == {}


@pytest.mark.parametrize(
    "name, params",
    [
        ("speculative_sampling", {"gamma": 3}),
        ("speculative_sampling", {"gamma": 4, "temperature": 0}),
        ("easd", {"gamma": 3, "tau_q": 2.0, "tau_p": 2.0, "overlap": 0.2}),
        ("csd", {"gamma": 4, "lambda_count": 1, "tau": 0.001}),
    ],
)
def test_resume_from_a_checkpoint_is_identical_and_ledger_adds_up(tiny_pair, name, params):
    method, states, snaps = cached_run(tiny_pair, name, {**BASE, **params})
    assert len(snaps) >= 3
    resumed = [json.loads(snaps[1])[i] for i in range(len(QUESTIONS))]
    ctx = StepContext(tiny_pair, None, 0)
    while not all(method.done(s) for s in resumed):
        method.step([s for s in resumed if not method.done(s)], ctx)
    assert _det(resumed) == _det(states)
    for s in states:
        res = method.result(s)
        json.dumps(res)
        sp, led = s["spec"], s["ledger"]
        assert led["gen_tokens"] == len(s["candidates"][0]["tokens"]) <= 16
        assert sp["draft_forward_passes"] == method.params.gamma * sp["target_forward_passes"]
        assert 0 <= sp["accepted"] <= sp["drafted"] == method.params.gamma * sp["iterations"]
        assert res["acceptance_rate"] == sp["accepted"] / sp["drafted"]
        # every iteration tests its kept positions plus the one that stopped it (none when all γ are kept)
        assert sp["accepted"] <= sp["verified"] <= sp["accepted"] + sp["iterations"]
        assert res["acceptance_alpha"] == sp["accepted"] / sp["verified"]
        assert res["mean_accepted_length"] == led["gen_tokens"] / sp["target_forward_passes"]
        assert led["components"]["drafter"]["calls"] == s["round"]


# ---------------------------------------------------------------------------------------------------
# Checks before anything runs


def test_refusals():
    from srd_worker.wiring import check_spec

    with pytest.raises(ConfigError, match="needs a draft model: --set draft_model="):
        build_method("speculative_sampling", {})
    with pytest.raises(ConfigError, match="easd needs entropy thresholds"):
        build_method("easd", {"draft_model": "testbed-draft"})
    with pytest.raises(ConfigError, match="gamma must be >= 1"):
        build_method("csd", {"draft_model": "testbed-draft", "gamma": 0})
    with pytest.raises(ConfigError, match="memory file 'nope.json' does not exist"):
        build_method("csd", {"draft_model": "testbed-draft", "memory": "nope.json"})
    m = build_method("speculative_sampling", {"draft_model": "testbed-draft"})
    check_spec(m, engine="transformers", reward=None)
    with pytest.raises(
        CapabilityError,
        match="method 'speculative_sampling' needs engine capabilities full_logits, which the 'vllm' engine",
    ):
        check_spec(m, engine="vllm", reward=None)
    bad = build_method("easd", {"draft_model": "/no/such/folder", "tau_q": 1, "tau_p": 1})
    with pytest.raises(ConfigError, match="draft_model '/no/such/folder' is not a local model folder"):
        check_spec(bad, engine="transformers", reward=None)


def test_draft_with_another_vocabulary_is_refused(tiny_pair, tmp_path):
    from srd_worker.engines.loading import TESTBED_DIR, load_model
    from srd_worker.engines.speculative import check_draft_model, register_draft

    model, tok = load_model("testbed-draft", cache_dir=tmp_path, dtype="float32")
    with pytest.raises(ConfigError, match="does not share the target model's tokenizer"):
        register_draft(tiny_pair, "testbed-draft", model, tok)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="has no config.json"):
        check_draft_model(str(tmp_path / "empty"))
    check_draft_model(str(TESTBED_DIR / "draft"))


# ---------------------------------------------------------------------------------------------------
# The testbed's trained pair: real text


@pytest.fixture(scope="module")
def testbed_engine(tmp_path_factory):
    import torch

    from srd_worker.engines.loading import load_model
    from srd_worker.engines.transformers_engine import TransformersEngine

    torch.set_num_threads(TORCH_THREADS)
    model, tok = load_model("testbed", cache_dir=tmp_path_factory.mktemp("cache"), dtype="float32")
    return TransformersEngine(model, tok, model_name="testbed")


def test_greedy_speculative_equals_target_greedy_on_the_testbed(testbed_engine):
    from srd_worker.engines.loading import TESTBED_DIR

    rows = [json.loads(line) for line in (TESTBED_DIR / "data" / "test.jsonl").read_text().splitlines()[:2]]
    reqs = [
        GenerationRequest(
            _prompt(testbed_engine, r["question"]), SamplingParams(temperature=0, max_new_tokens=40)
        )
        for r in rows
    ]
    ref = testbed_engine.generate(reqs)
    out = testbed_engine.speculate(reqs, LosslessRule(), draft_model="testbed-draft", gamma=4)
    assert [g.token_ids for g in out] == [g.token_ids for g in ref]
    assert sum(g.stats["accepted"] for g in out) > 0  # the trained draft does get tokens accepted


def test_easd_penalty_order_first_tests_every_drafted_token_before_the_standard_test():
    """§5.2's ordering is PROPOSED: ``penalty_order=first`` runs the entropy test before the standard one,
    so a token the standard test would reject is penalised instead (counted as an EASD rejection, one
    uniform); the default ``accepted`` rejects it by the standard test (residual, not counted)."""
    flat = np.zeros((2, 4))  # raw logits flat: H = ln 4 ≥ 0 and top-2 {0, 1} on both sides, so it fires
    # x = 0 with p/q = 0.1 / 0.9: u = 0.5 rejects it; the residual max(0, p − q) = [0, .8, 0, 0] → token 1
    step = _step([0], [[0.9, 0.1, 0.0, 0.0]], [[0.1, 0.9, 0.0, 0.0]] * 2, q_logits=flat[:1], p_logits=flat)

    def rule(order: str) -> EASDRule:
        return EASDRule(
            tau_q=0.0, tau_p=0.0, top_n=2, overlap=1.0, beta=1.0, entropy_source="raw", penalty_order=order
        )

    rng = Uniforms(0.5, 0.5)
    v = rule("accepted").verify(0, step, rng)
    assert (v.accepted, v.token, v.counts, rng.left) == (0, 1, {}, [])
    rng = Uniforms(0.5, 0.5)  # β = 1 removes x from p: [0, .9, 0, 0] → token 1, one uniform left unused
    v = rule("first").verify(0, step, rng)
    assert (v.accepted, v.token, v.counts, rng.left) == (0, 1, {"easd_rejected": 1}, [0.5])
    # greedy, a draft token that is not the target's argmax: the standard test's argmax, or the penalty's
    z = np.array([[0.0, 2.0, 1.0], [0.0, 0.0, 0.0]])
    p = np.eye(3)[[1, 0]]
    g = _step([2], p[:1], p, greedy=True, q_logits=z[:1], p_logits=z)
    assert rule("accepted").verify(0, g, None).counts == {}
    v = rule("first").verify(0, g, None)
    assert (v.accepted, v.token, v.counts) == (0, 1, {"easd_rejected": 1})


def test_easd_penalty_order_is_a_parameter_that_keeps_old_run_ids():
    from srd_worker.errors import ConfigError
    from srd_worker.methods.registry import build_method

    base = {"tau_q": 1.0, "tau_p": 1.0, "draft_model": "d"}
    assert "penalty_order" not in build_method("easd", base).params.to_dict()
    assert (
        build_method("easd", {**base, "penalty_order": "first"}).params.to_dict()["penalty_order"] == "first"
    )
    with pytest.raises(ConfigError, match="penalty_order must be one of accepted, first"):
        build_method("easd", {**base, "penalty_order": "before"})


def test_easd_tempered_entropies_need_a_sampling_temperature():
    base = {"tau_q": 1.0, "tau_p": 1.0, "draft_model": "d", "entropy_source": "tempered"}
    assert build_method("easd", {**base, "temperature": 0.8}).params.entropy_source == "tempered"
    with pytest.raises(ConfigError, match="entropy_source=tempered needs temperature > 0"):
        build_method("easd", {**base, "temperature": 0})
    with pytest.raises(ConfigError, match="entropy_source must be one of raw, tempered, processed"):
        build_method("easd", {**base, "entropy_source": "full"})
