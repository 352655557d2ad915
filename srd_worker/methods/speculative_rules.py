"""Verification rules of the speculative-decoding family (docs/ALGORITHMS.md §4–§6): pure math on numpy
arrays, no model. The engine's harness (``engines/speculative.py``) drafts γ tokens, runs the target once,
and calls ``rule.verify(row, step, rng)`` with the processed distributions q (draft, γ×V) and p (target,
(γ+1)×V), the raw logits of both, and the request's own random generator; the rule returns how many draft
tokens it keeps and the one token emitted after them (``engines.base.Verdict``).

- ``LosslessRule`` (§4): Leviathan / Chen accept–resample; the output follows p exactly. Greedy rows
  (temperature 0): keep while the draft token is the target's argmax, then emit the argmax.
- ``EASDRule`` (§5): the lossless test, then, on a token that passed, the entropy-aware penalty: both
  entropies ≥ their thresholds and top-N overlap ≥ ρ → reject and resample from p with the draft token's
  probability scaled by (1 − β).
- ``CSDRule`` (§6): greedy verification with rescue: on a mismatch the (draft, target) pair's count in
  the correction memory is incremented; the draft token is kept anyway when the count reaches λ and the
  target's logit gap z(x̃) − z(t*) ≥ ln τ.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from srd_worker.engines.base import SpecStep, Verdict


def draw(probs: np.ndarray, rng: Any) -> int:
    """Inverse-CDF draw from an (unnormalised) probability vector with one uniform; never a
    zero-probability token."""
    cdf = np.cumsum(probs, dtype=np.float64)
    u = rng.random() * cdf[-1]
    idx = min(int(np.searchsorted(cdf, u, side="right")), len(cdf) - 1)
    while probs[idx] <= 0 and idx > 0:
        idx -= 1
    return idx


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """normalise(max(0, p − q)); p itself when the residual has no mass (p ≤ q everywhere, i.e. p == q up
    to rounding: then a rejection had probability ~0)."""
    r = np.maximum(p.astype(np.float64) - q.astype(np.float64), 0.0)
    total = r.sum()
    return r / total if total > 0 else p.astype(np.float64) / p.sum()


def softmax(logits: np.ndarray) -> np.ndarray:
    """softmax in float64 (−inf logits allowed)."""
    z = logits.astype(np.float64)
    w = np.exp(z - z.max())
    return w / w.sum()


def entropy(logits: np.ndarray) -> float:
    """Entropy in nats of softmax(logits) (−inf logits allowed)."""
    z = logits.astype(np.float64)
    z = z - z.max()
    w = np.exp(z)
    s = w.sum()
    pr = w / s
    nz = pr > 0
    return float(-(pr[nz] * np.log(pr[nz])).sum())


def prob_entropy(probs: np.ndarray) -> float:
    """Entropy in nats of a probability vector."""
    pr = probs.astype(np.float64)
    pr = pr[pr > 0]
    pr = pr / pr.sum()
    return float(-(pr * np.log(pr)).sum())


def top_n_ids(scores: np.ndarray, n: int) -> set[int]:
    """The ids of the N highest scores, ties at the N-th score broken by the lower id (the first N of a
    stable descending sort), found by a linear-time partition instead of sorting the whole vocabulary."""
    if n >= len(scores):
        return set(range(len(scores)))
    kth = np.partition(scores, len(scores) - n)[len(scores) - n]  # the N-th highest score
    above = np.flatnonzero(scores > kth)
    tied = np.flatnonzero(scores == kth)[: n - len(above)]  # flatnonzero is in id order
    return set(above.tolist()) | set(tied.tolist())


def top_n_overlap(a: np.ndarray, b: np.ndarray, n: int) -> float:
    """|TopN(a) ∩ TopN(b)| / N for two score vectors (ties broken by the lower token id)."""
    n = min(n, len(a))
    return len(top_n_ids(a, n) & top_n_ids(b, n)) / n


class Stateless:
    """A rule that keeps nothing across iterations: what the harness cuts needs no forgetting."""

    def emitted(self, row: int, kept: int) -> None:
        """Nothing counted to take back (``engines.base.VerifyRule.emitted``)."""


class LosslessRule(Stateless):
    """Standard speculative sampling (§4.1)."""

    def verify(self, row: int, step: SpecStep, rng: Any) -> Verdict:
        gamma = len(step.draft_tokens)
        for i, x in enumerate(step.draft_tokens):
            if step.greedy:
                t = int(np.argmax(step.p[i]))
                if x != t:
                    return Verdict(i, t)
                continue
            px, qx = float(step.p[i][x]), float(step.q[i][x])
            if not rng.random() < min(1.0, px / qx if qx > 0 else math.inf):
                return Verdict(i, draw(residual(step.p[i], step.q[i]), rng))
        bonus = int(np.argmax(step.p[gamma])) if step.greedy else draw(step.p[gamma], rng)
        return Verdict(gamma, bonus)


class EASDRule(Stateless):
    """Entropy-aware speculative decoding (§5.2). Thresholds ``tau_q`` / ``tau_p`` in nats; entropies of the
    raw (``entropy_source='raw'``: softmax of the logits at temperature 1, before top-k/top-p), the tempered
    (``tempered``: softmax of the logits over ``temperature``, the full vocabulary before top-k/top-p) or
    the processed distributions; top-N sets from the raw logits. ``penalty_order``: the entropy test on the
    drafted tokens that passed the standard test (``accepted``, §5.2) or on every one before it (``first``)."""

    def __init__(
        self,
        *,
        tau_q: float,
        tau_p: float,
        top_n: int,
        overlap: float,
        beta: float,
        entropy_source: str,
        penalty_order: str = "accepted",
        temperature: float = 1.0,
    ) -> None:
        self.tau_q, self.tau_p, self.top_n = tau_q, tau_p, top_n
        self.overlap, self.beta, self.entropy_source = overlap, beta, entropy_source
        self.penalty_order, self.temperature = penalty_order, temperature

    def entropy_at(self, step: SpecStep, i: int, *, target: bool) -> float:
        """The draft's (or the target's) entropy at position ``i`` under ``entropy_source``."""
        if self.entropy_source == "processed":
            return prob_entropy((step.p if target else step.q)[i])
        logits = (step.p_logits if target else step.q_logits)[i]
        return entropy(logits / self.temperature if self.entropy_source == "tempered" else logits)

    def fires(self, step: SpecStep, i: int) -> bool:
        """Both entropies at or above their thresholds and the top-N sets overlapping at least ``overlap``."""
        # the target's entropy (a full-vocabulary pass) only when the draft's is at its threshold
        if (
            self.entropy_at(step, i, target=False) < self.tau_q
            or self.entropy_at(step, i, target=True) < self.tau_p
        ):
            return False
        return top_n_overlap(step.q_logits[i], step.p_logits[i], self.top_n) >= self.overlap

    def penalised(self, step: SpecStep, i: int, x: int, rng: Any) -> Verdict | None:
        """(b) the entropy-aware penalty on drafted token ``x`` at position ``i``: a resampled token from the
        target with x's probability scaled by 1 − β, or None when the test does not fire or changes nothing."""
        if not self.fires(step, i):
            return None
        # greedy: p is one-hot, so penalise the raw target distribution and take its argmax
        base = softmax(step.p_logits[i]) if step.greedy else step.p[i].astype(np.float64)
        pen = base.copy()
        pen[x] *= 1.0 - self.beta
        if pen.sum() <= 0:  # all the mass was on x: nothing else to resample; keep x
            return None
        token = int(np.argmax(pen)) if step.greedy else draw(pen / pen.sum(), rng)
        if step.greedy and token == x:  # a small β left x the argmax: nothing changes
            return None
        return Verdict(i, token, {"easd_rejected": 1})

    def verify(self, row: int, step: SpecStep, rng: Any) -> Verdict:
        gamma = len(step.draft_tokens)
        for i, x in enumerate(step.draft_tokens):
            if self.penalty_order == "first" and (v := self.penalised(step, i, x, rng)) is not None:
                return v
            # (a) the standard test
            if step.greedy:
                t = int(np.argmax(step.p[i]))
                if x != t:
                    return Verdict(i, t)
            else:
                px, qx = float(step.p[i][x]), float(step.q[i][x])
                if not rng.random() < min(1.0, px / qx if qx > 0 else math.inf):
                    return Verdict(i, draw(residual(step.p[i], step.q[i]), rng))
            # (b) on a token that passed (a)
            if self.penalty_order == "accepted" and (v := self.penalised(step, i, x, rng)) is not None:
                return v
        bonus = int(np.argmax(step.p[gamma])) if step.greedy else draw(step.p[gamma], rng)
        return Verdict(gamma, bonus)


def memory_key(draft_token: int, target_token: int) -> str:
    """A correction-memory key (JSON objects need string keys)."""
    return f"{draft_token},{target_token}"


class CSDRule:
    """Calibrated speculative decoding (§6.3): greedy verification with frequency-guided rescue.

    ``offline`` is the calibrated memory (shared, read-only); ``online[row]`` is request ``row``'s own
    counts, updated on every mismatch (the item's state keeps it between rounds). A stochastic row keeps
    the lossless test first and tries the rescue only when it rejects, with t* = argmax p, the draft token
    itself included [PROPOSED]."""

    def __init__(
        self,
        *,
        offline: dict[str, int],
        online: Sequence[dict[str, int]],
        lam: int,
        tau: float,
        update_before_test: bool,
    ) -> None:
        self.offline, self.online = offline, online
        self.lam, self.update_before_test = lam, update_before_test
        self.log_tau = math.log(tau) if tau > 0 else -math.inf
        # the mismatches the last verify of each row counted, as (draft position, memory key)
        self.counted: dict[int, list[tuple[int, str]]] = {}

    def _rescue(self, row: int, step: SpecStep, i: int, x: int, t: int) -> bool:
        key = memory_key(x, t)
        mem = self.online[row]
        if self.update_before_test:
            mem[key] = mem.get(key, 0) + 1
        count = self.offline.get(key, 0) + mem.get(key, 0)
        ok = count >= self.lam and float(step.p_logits[i][x] - step.p_logits[i][t]) >= self.log_tau
        if not self.update_before_test:
            mem[key] = mem.get(key, 0) + 1
        self.counted.setdefault(row, []).append((i, key))
        return ok

    def emitted(self, row: int, kept: int) -> None:
        """The harness kept only the first ``kept`` tokens of this row's last verdict (a cut at EOS, a stop
        string or the round's budget): the mismatches counted at later draft positions are taken back out
        of the online memory, since the next round drafts those positions again and meets (and counts)
        them anew. So T counts each mismatch of the emitted text once, whatever the round length."""
        mem = self.online[row]
        for i, key in self.counted.pop(row, []):
            if i >= kept:
                left = mem[key] - 1
                if left:
                    mem[key] = left
                else:
                    del mem[key]

    def verify(self, row: int, step: SpecStep, rng: Any) -> Verdict:
        self.counted[row] = []
        gamma = len(step.draft_tokens)
        rescued = 0
        for i, x in enumerate(step.draft_tokens):
            if step.greedy:
                t = int(np.argmax(step.p_logits[i]))
                if x == t:
                    continue
                if self._rescue(row, step, i, x, t):
                    rescued += 1
                    continue
                return Verdict(i, t, {"rescued": rescued, "rejected": 1})
            px, qx = float(step.p[i][x]), float(step.q[i][x])
            if rng.random() < min(1.0, px / qx if qx > 0 else math.inf):
                continue
            # the same rescue test even when x is t* itself (rejected only because q(x) > p(x)): the
            # gate passes (gap 0), the pair (x, x) is counted like any other (§6.1, Sampling)
            t = int(np.argmax(step.p[i]))
            if self._rescue(row, step, i, x, t):
                rescued += 1
                continue
            return Verdict(i, draw(residual(step.p[i], step.q[i]), rng), {"rescued": rescued, "rejected": 1})
        bonus = int(np.argmax(step.p[gamma])) if step.greedy else draw(step.p[gamma], rng)
        return Verdict(gamma, bonus, {"rescued": rescued})
