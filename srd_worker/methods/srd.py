"""Selective Regenerative Decoding (SRD; Pu et al., arXiv 2608.24338) — ALGORITHMS.md §1.

Implemented
    §1.4  rank normalisation (Eq. 2), routing (Eq. 3), FINDBOUNDARY (Eq. 4) with the span cap
          (Alg. 1 lines 17-18), regeneration (Eq. 5) by the same LM at the editor temperature, and the
          closed-form tier sizes (``routing_counts``). These are pure module-level functions.
    §1.5  Algorithm A, the literal batch form (``form=batch``): draft every candidate to completion,
          route once, then run the refinement queue; a refined trajectory that lost its EOS is extended
          to EOS / max length at the drafter temperature before it is judged.
    §1.6  all refinement policies: reroute_global (default), keep_on_refine, self_compare (with the
          drop-both or fall-back-to-τ failure path), force_keep and refine_bob.
    §1.7  Algorithm B, the incremental form (``form=incremental``, default): per round one batched
          DRAFT, one batched SCORE, ROUTE, then REFINE in waves (one engine batch per wave over every
          item; a wave is one generation of the refinement queue; decisions are applied sequentially in
          rank order per item, exactly as the sequential Algorithm 1 would); the min-1 guard; finished
          candidates stay in the pool (or, with ``rank_unfinished_only``, leave it and are kept as they
          are); the ``archive_all`` answer rule; lazy or eager checkpoint scoring.
    §1.8  the rejection-sampling ablation is this loop with ``n_refine=0`` and ``theta_low == theta_high``
          (see ``rejection_sampling.py``, which reuses this class).
    §1.10 per-item routing statistics: tier counts per routing event (p_H, p_M, p_L), refinements and
          how many ended in KEEP (ρ), the efficiency gain 1 + ρ·p_M/p_H, mean reward before → after
          refinement, R_max.

PROPOSED choices (ALGORITHMS.md marks them so; each is a parameter or documented below)
    - n_P = 1 ⇒ u = 1; ties are broken by a stable sort in candidate-id order; NaN rewards rank last.
    - ``route`` compares with a tolerance ``ROUTE_EPS`` (1e-9) so that u = θ exactly (e.g. u = 0.5 when
      r = (n_P-1)/2) is not lost to float error; valid while 1/((n_P-1)·den(θ)) ≫ 1e-9.
    - FINDBOUNDARY reads checkpoints at multiples of m plus the current end ``length`` when it is not a
      multiple of m; without a drop j* = max(0, length - L_max); then j* ← max(j*, length - L_max).
      The earliest drop is searched over the WHOLE trajectory, so a drop before the last L_max tokens
      yields j* = length - L_max even if a later drop lies inside the tail (literal Alg. 1 reading).
      ``l_max = 0`` disables the cap (the L_max = ∞ ablation of §1.12).
    - Lazy checkpoint scoring scores only what routing needs (chunk ends; final ends in the batch form)
      and fills S on demand before an edit. Because of the whole-trajectory reading above, a drop before
      the tail decides j*, so filling only the last L_max tokens would NOT give the eager decisions;
      lazy therefore scans checkpoints from the start, scoring the missing ones up to the first drop
      already known (or, if a known drop lies at or before length - L_max, nothing), in one reward batch
      per wave. Decisions are identical to eager by construction (tested).
    - N_refine counts refinements per trajectory over its whole life (Alg. 1's c, never reset); a
      REFINE-tier candidate with c ≥ N_refine is dropped. ``n_refine = 0`` disables the editor.
    - Editor: same LM, temperature ``editor_temperature`` (1.0), drafter top-p / top-k; the regeneration
      budget is length - j* and it stops early at EOS. In the incremental form an edited trajectory that
      lost its EOS continues drafting in the next round.
    - self_compare failure drops τ' and τ (``self_compare_fallback=true`` keeps τ instead).
    - refine_bob: B regenerations from the same boundary, the highest reward wins (ties: lowest b),
      then reroute_global decides on the winner.
    - Routing statistics: p_H/p_M/p_L pool the tiers of the per-round routing of the candidate pool
      (batch form: the single initial routing); re-routing decisions on refined trajectories are
      counted apart (``refine_outcomes``: keep / requeue / discard). ρ = refinements whose τ' went to
      KEEP in that decision / refinements.
      Gain = 1 + ρ·p_M/p_H; None when p_H = 0, or when p_M > 0 but nothing was refined; 1.0 when p_M = 0.
    - Final answer: argmax final reward over the completed trajectories of the kept set (ties: earliest
      finished round, then lowest candidate id), or over every completed trajectory ever produced
      (drafts, refinements, refine_bob losers) with ``archive_all``.
    - Seeds: ``ctx.seed(state, candidate_id, kind)`` with kinds ``draft`` (shared with rejection
      sampling and Best-of-N), ``edit<w>`` (wave w of the round), ``bob<w>.<b>`` and ``extend<b>``;
      candidate ids are the initial indices and follow a trajectory through its edits.
    - Ledger: drafts are charged to ``drafter``, regenerations to ``editor`` (batch-form extensions of an
      edited trajectory to ``drafter``), every reward call to ``scorer``; ``router`` counts one call per
      item per routing pass (initial routing, each wave's decisions) and its wall time.

Left out
    - PRM step reduction (§0.2) lives in the reward model, not here; S-SRD (a larger editor model);
      prefix caching; early stop on reward; the "min active" rule beyond the degenerate cases described
      (top-ranked is always KEEP when θ_high ≤ 1, so the guard only restores the best when nothing
      survived, e.g. under an absolute threshold).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from srd_worker.engines.base import Generation, SamplingParams
from srd_worker.errors import ConfigError
from srd_worker.methods.base import GenCall, Method, ScoreCall, StepContext, new_state, param
from srd_worker.methods.drafting import DraftParams, PoolParams

#: Tolerance of ``route`` at θ equality (documented in the module docstring).
ROUTE_EPS = 1e-9
KEEP, REFINE, DISCARD = "keep", "refine", "discard"
POLICIES = ("reroute_global", "keep_on_refine", "self_compare", "force_keep", "refine_bob")


# ---------------------------------------------------------------------------------------------------
# Pure functions (§1.4)


def rank_order(scores: Sequence[float]) -> list[int]:
    """Candidate indices from best to worst: descending score, stable (ties keep index order), NaN last."""

    def key(i: int) -> tuple[int, float]:
        return (0, 0.0) if math.isnan(scores[i]) else (1, scores[i])

    return sorted(range(len(scores)), key=key, reverse=True)  # reverse=True keeps the sort stable


def ranks(scores: Sequence[float]) -> list[int]:
    """Rank r of each candidate (0 = best) under ``rank_order``."""
    r = [0] * len(scores)
    for pos, i in enumerate(rank_order(scores)):
        r[i] = pos
    return r


def rank_normalise(scores: Sequence[float]) -> list[float]:
    """u = 1 - r/(n-1) [PAPER Eq. 2], computed exactly (Fraction) then rounded once to float.

    n = 1 ⇒ [1.0]; n = 0 ⇒ []. u = 0.5 comes out exactly when r = (n-1)/2.
    """
    n = len(scores)
    if n == 0:
        return []
    if n == 1:
        return [1.0]
    return [float(1 - Fraction(r, n - 1)) for r in ranks(scores)]


def route(u: float, theta_high: float, theta_low: float) -> str:
    """'keep' if u ≥ θ_high, 'refine' if θ_low < u < θ_high, else 'discard' [PAPER Eq. 3].

    KEEP is tested first, so θ_low = θ_high leaves no REFINE band. Equalities are judged with the
    tolerance ``ROUTE_EPS`` so a u that equals θ in exact arithmetic is never lost to float error.
    """
    if u >= theta_high - ROUTE_EPS:
        return KEEP
    if u > theta_low + ROUTE_EPS:
        return REFINE
    return DISCARD


def _exact(x: float) -> Fraction:
    """The decimal a threshold was written as (0.3 → 3/10), so closed forms match ``route``."""
    return Fraction(repr(float(x)))


def routing_counts(n: int, theta_high: float, theta_low: float) -> tuple[int, int, int]:
    """(#KEEP, #REFINE, #DISCARD) for a pool of n distinct ranks (§1.4 closed form).

    #KEEP = ⌊(1-θ_high)(n-1)⌋ + 1 (ranks r ≤ (1-θ_high)(n-1)); ranks r ≥ ⌈(1-θ_low)(n-1)⌉ are
    DISCARD unless already KEEP; REFINE is the rest. Exact rational arithmetic on the thresholds.
    """
    if n <= 0:
        return (0, 0, 0)
    if n == 1:
        tier = route(1.0, theta_high, theta_low)
        return (int(tier == KEEP), int(tier == REFINE), int(tier == DISCARD))
    d = n - 1
    keep_bound = (1 - _exact(theta_high)) * d
    keep = 0 if keep_bound < 0 else min(n, math.floor(keep_bound) + 1)
    discard_from = min(n, max(0, math.ceil((1 - _exact(theta_low)) * d)))
    discard = n - max(keep, discard_from)
    return (keep, n - keep - discard, discard)


def checkpoint_positions(m: int, length: int) -> list[int]:
    """Checkpoints FINDBOUNDARY reads: m, 2m, … ≤ length, plus ``length`` if it is not a multiple of m."""
    if m < 1:
        raise ValueError(f"scoring interval m must be >= 1, got {m}")
    pos = list(range(m, length + 1, m))
    if length > 0 and length % m:
        pos.append(length)
    return pos


def _tail_start(length: int, l_max: float) -> int:
    return int(max(0, length - l_max))


def resolve_boundary(
    scores: Mapping[int, float], m: int, length: int, l_max: float
) -> tuple[int | None, list[int]]:
    """FINDBOUNDARY on possibly incomplete checkpoint scores.

    Returns ``(j*, [])`` when the known scores already decide j* (as ``find_boundary`` would on the full
    set), else ``(None, missing)``: the checkpoints whose scores are needed (every unknown checkpoint
    before the first drop that is already known).
    """
    tail = _tail_start(length, l_max)
    pos = checkpoint_positions(m, length)
    missing: list[int] = []
    for a, b in zip(pos, pos[1:], strict=False):
        for x in (a, b):
            if x not in scores and (not missing or missing[-1] != x):
                missing.append(x)
        if a in scores and b in scores and scores[b] < scores[a]:
            if not missing:
                return max(a, tail), []
            if a <= tail:  # the earliest drop is at or before a ≤ tail: the cap decides
                return tail, []
            return None, missing
    if missing:
        return None, missing
    return tail, []


def find_boundary(checkpoint_scores: dict[int, float], m: int, length: int, l_max: int) -> int:
    """Regeneration boundary j* [PAPER Eq. 4 + Alg. 1 lines 17-18].

    Reading: checkpoints are m, 2m, … ≤ ``length`` plus ``length`` itself when it is not a multiple of m;
    j*_drop is the earliest checkpoint whose next checkpoint scores strictly lower; without a drop
    j* = max(0, length - l_max); then the span cap j* ← max(j*, length - l_max), never below 0. So at most
    the last ``l_max`` tokens are regenerated and a drop only matters when it lies inside that tail.
    A checkpoint absent from ``checkpoint_scores`` is skipped (the next checkpoint is the next present
    one); other keys (e.g. 0 or stale chunk ends) are ignored.
    """
    tail = _tail_start(length, l_max)
    pos = [j for j in checkpoint_positions(m, length) if j in checkpoint_scores]
    for a, b in zip(pos, pos[1:], strict=False):
        if checkpoint_scores[b] < checkpoint_scores[a]:
            return max(a, tail)
    return tail


def efficiency_gain(p_h: float | None, p_m: float | None, rho: float | None) -> float | None:
    """1 + ρ·p_M/p_H [PAPER Thm 3.3]; None when p_H = 0, or ρ is unknown while p_M > 0."""
    if not p_h or p_m is None:
        return None
    if p_m == 0:
        return 1.0
    if rho is None:
        return None
    return 1 + rho * p_m / p_h


# ---------------------------------------------------------------------------------------------------
# Candidate helpers shared with rejection_sampling.py and speculative_rejection.py


def new_srd_candidate(cid: int) -> dict[str, Any]:
    """A trajectory with a stable id; ``S`` maps str(position) → reward of tokens[:position]."""
    return {
        "id": cid,
        "tokens": [],
        "text": "",
        "finish": None,
        "reward": None,
        "S": {},
        "c": 0,
        "finished_round": None,
    }


def draft_call(
    ctx: StepContext,
    state: dict[str, Any],
    cand: dict[str, Any],
    p: DraftParams,
    *,
    kind: str,
    component: str = "drafter",
) -> tuple[GenCall, int]:
    """A drafter continuation of ``cand`` by one chunk (and its token budget)."""
    budget = min(p.chunk_tokens, p.max_new_tokens - len(cand["tokens"]))
    sp = SamplingParams(
        temperature=p.temperature,
        top_p=p.top_p,
        top_k=p.top_k,
        max_new_tokens=budget,
        seed=ctx.seed(state, cand["id"], kind),
    )
    return GenCall(state, state["prompt_ids"] + cand["tokens"], sp, component), budget


def apply_generation(
    ctx: StepContext,
    state: dict[str, Any],
    cand: dict[str, Any],
    gen: Generation,
    budget: int,
    max_new_tokens: int,
) -> None:
    """Append a continuation and set ``finish`` as ``drafting.draft_round`` does."""
    cand["tokens"].extend(gen.token_ids)
    cand["text"] = ctx.decode(cand["tokens"])
    if gen.finished:
        cand["finish"] = gen.finish_reason
    elif len(cand["tokens"]) >= max_new_tokens or len(gen.token_ids) < budget or not gen.token_ids:
        cand["finish"] = "length"  # the cap, or the engine stopped short: the context is full
    if cand["finish"] is not None:
        cand["finished_round"] = state["round"]


def new_positions(m: int, old_len: int, new_len: int, eager: bool) -> list[int]:
    """Positions to score after tokens (old_len, new_len] appeared: the end, plus multiples of m if eager."""
    pos = list(range((old_len // m + 1) * m, new_len + 1, m)) if eager else []
    if new_len not in pos:
        pos.append(new_len)
    return pos


def score_positions(
    ctx: StepContext, jobs: Sequence[tuple[dict[str, Any], dict[str, Any], Sequence[int]]]
) -> None:
    """ONE reward batch: S[j] = R(question, decode(tokens[:j])) for every (state, cand, positions) job;
    ``reward`` becomes S[len(tokens)] when that was scored."""
    calls: list[ScoreCall] = []
    where: list[tuple[dict[str, Any], int]] = []
    for state, cand, positions in jobs:
        for j in sorted(set(positions)):
            text = cand["text"] if j == len(cand["tokens"]) else ctx.decode(cand["tokens"][:j])
            complete = j == len(cand["tokens"]) and cand["finish"] in ("eos", "stop")
            calls.append(ScoreCall(state, text, j, "scorer", finished=complete))
            where.append((cand, j))
    for (cand, j), r in zip(where, ctx.score(calls), strict=True):
        cand["S"][str(j)] = r
    for _, cand, _ in jobs:
        end = str(len(cand["tokens"]))
        if end in cand["S"]:
            cand["reward"] = cand["S"][end]


def archive_entry(cand: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": cand["id"],
        "text": cand["text"],
        "reward": cand["reward"],
        "finish": cand["finish"],
        "round": cand["finished_round"],
        "n_tokens": len(cand["tokens"]),
    }


def best_completed(entries: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Highest reward; ties → earliest finished round, then lowest id, then earliest listed."""

    def key(item: tuple[int, dict[str, Any]]) -> tuple[float, int, int, int]:
        pos, e = item
        r = e["reward"]
        r = -math.inf if r is None or math.isnan(r) else r
        return (-r, e["round"] if e["round"] is not None else 1 << 30, e["id"], pos)

    if not entries:
        return None
    return min(enumerate(entries), key=key)[1]


def _scores(cands: Sequence[dict[str, Any]]) -> list[float]:
    return [math.nan if c["reward"] is None else c["reward"] for c in cands]


def _int_scores(cand: dict[str, Any]) -> dict[int, float]:
    return {int(k): v for k, v in cand["S"].items()}


# ---------------------------------------------------------------------------------------------------
# The method


@dataclasses.dataclass(frozen=True)
class SRDParams(PoolParams):
    n: int = param(10, "initial candidates N")
    theta_high: float = param(0.5, "KEEP if rank-normalised score u >= theta_high")
    theta_low: float = param(0.3, "DISCARD if u <= theta_low; REFINE in between")
    scoring_interval: int = param(10, "m: checkpoint spacing in tokens for boundary localisation")
    l_max: int = param(30, "L_max: at most this many trailing tokens are regenerated (0 = no cap)")
    n_refine: int = param(
        2, "N_refine: refinements per trajectory over its life; 0 disables the editor [PROPOSED]"
    )
    editor_temperature: float = param(
        1.0, "editor sampling temperature (top-p/top-k as the drafter) [PROPOSED]"
    )
    policy: str = param("reroute_global", "refinement policy: " + " | ".join(POLICIES))
    self_compare_delta: float = param(
        0.02, "self_compare: keep τ' iff R(τ') >= R(τ) + delta (raw reward units)"
    )
    self_compare_fallback: bool = param(
        False, "self_compare failure keeps τ instead of dropping both [PROPOSED]"
    )
    bob_b: int = param(3, "refine_bob: parallel regenerations B per refinement")
    checkpoint_scoring: str = param(
        "lazy",
        "eager: score every checkpoint each round (paper cost profile); "
        "lazy: score chunk ends, fill checkpoints on demand (same "
        "decisions)",
    )
    form: str = param(
        "incremental",
        "incremental (Algorithm B, what the experiments ran) | batch (Algorithm A, literal Alg. 1)",
    )
    archive_all: bool = param(False, "answer from every completed trajectory ever produced, not only kept")
    rank_unfinished_only: bool = param(
        False,
        "incremental: finished candidates leave the ranking pool and are kept as they are (§1.7 alternative)",
    )

    def validate(self) -> None:
        super().validate()
        _check(
            0 <= self.theta_low <= self.theta_high <= 1,
            f"need 0 <= theta_low <= theta_high <= 1, got theta_low={self.theta_low}, "
            f"theta_high={self.theta_high}",
        )
        _check(self.scoring_interval >= 1, f"scoring_interval must be >= 1, got {self.scoring_interval}")
        _check(self.l_max >= 0, f"l_max must be >= 0 (0 = no cap), got {self.l_max}")
        _check(self.n_refine >= 0, f"n_refine must be >= 0, got {self.n_refine}")
        _check(
            self.editor_temperature >= 0, f"editor_temperature must be >= 0, got {self.editor_temperature}"
        )
        _check(self.policy in POLICIES, f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        _check(self.bob_b >= 1, f"bob_b must be >= 1, got {self.bob_b}")
        _check(
            self.checkpoint_scoring in ("lazy", "eager"),
            f"checkpoint_scoring must be lazy or eager, got {self.checkpoint_scoring!r}",
        )
        _check(self.form in ("incremental", "batch"), f"form must be incremental or batch, got {self.form!r}")
        _check(
            not (self.rank_unfinished_only and self.form == "batch"),
            "rank_unfinished_only applies to form=incremental only",
        )


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def _new_stats() -> dict[str, Any]:
    return {
        "routing": {KEEP: 0, REFINE: 0, DISCARD: 0},
        "refine_outcomes": {"keep": 0, "requeue": 0, "discard": 0},
        "refinements": 0,
        "refine_kept": 0,
        "refine_improved": 0,
        "exhausted": 0,
        "reward_before_sum": 0.0,
        "reward_after_sum": 0.0,
        "rounds": [],  # per round: {"round", "pool", "keep", "refine", "discard", "waves": [entries per wave]}
    }


class SRD(Method):
    name = "srd"
    Params = SRDParams
    summary = "Selective Regenerative Decoding: rank-route partial drafts, regenerate the weak tails"
    needs_reward = True

    def __init__(self, params: SRDParams) -> None:
        super().__init__(params)
        #: the SRD configuration the loop runs with (rejection_sampling derives its own)
        self.cfg: SRDParams = params

    # -- state ---------------------------------------------------------------------------------------
    def init_state(self, item_id: str, question: str, prompt_ids: Sequence[int]) -> dict[str, Any]:
        state = new_state(item_id, question, prompt_ids)
        state.update(
            {
                "candidates": [new_srd_candidate(i) for i in range(self.cfg.n)],
                "archive": [],
                "dropped": [],
                "stats": _new_stats(),
                "phase": "draft",  # batch form: draft → refine → done
                "queue": [],  # batch form: ids waiting for the next wave, in order
                "pending": [],  # batch form: regenerations of the current wave awaiting completion
                "wave": 0,
            }
        )
        return state

    def step(self, states: list[dict[str, Any]], ctx: StepContext) -> list[dict[str, Any]]:
        if self.cfg.form == "batch":
            self._step_batch(states, ctx)
        else:
            self._step_incremental(states, ctx)
        return states

    # -- building blocks -----------------------------------------------------------------------------
    @property
    def _eager(self) -> bool:
        return self.cfg.checkpoint_scoring == "eager"

    @property
    def _l_max(self) -> float:
        return self.cfg.l_max if self.cfg.l_max > 0 else math.inf

    def _route_pool(self, scores: Sequence[float]) -> list[str]:
        """Tier of each pool member (pool in candidate-id order). Rejection sampling overrides this."""
        return [route(u, self.cfg.theta_high, self.cfg.theta_low) for u in rank_normalise(scores)]

    def _charge_router(self, state: dict[str, Any], t0: float) -> None:
        state["timing"]["router"] += time.perf_counter() - t0
        state["ledger"]["components"]["router"]["calls"] += 1

    def _archive(self, state: dict[str, Any], cand: dict[str, Any]) -> None:
        if cand["finish"] is not None:
            state["archive"].append(archive_entry(cand))

    def _fill_boundaries(
        self, ctx: StepContext, jobs: Sequence[tuple[dict[str, Any], dict[str, Any]]]
    ) -> None:
        """Lazy scoring: one reward batch with every checkpoint FINDBOUNDARY still needs."""
        need = []
        for state, cand in jobs:
            j, missing = resolve_boundary(
                _int_scores(cand), self.cfg.scoring_interval, len(cand["tokens"]), self._l_max
            )
            if j is None:
                need.append((state, cand, missing))
        score_positions(ctx, need)

    def _boundary(self, cand: dict[str, Any]) -> int:
        j, missing = resolve_boundary(
            _int_scores(cand), self.cfg.scoring_interval, len(cand["tokens"]), self._l_max
        )
        if j is None:  # lazy filling runs first; reaching this is a bug
            raise RuntimeError(f"candidate {cand['id']}: checkpoint scores missing at {missing}")
        return j

    def _edit_calls(
        self, ctx: StepContext, state: dict[str, Any], cand: dict[str, Any], wave: int
    ) -> list[tuple[GenCall, dict[str, Any], int]]:
        """The editor regeneration(s) of ``cand`` from its boundary: (call, new candidate, budget)."""
        p = self.cfg
        j = self._boundary(cand)
        budget = len(cand["tokens"]) - j
        b_count = p.bob_b if p.policy == "refine_bob" else 1
        out = []
        for b in range(b_count):
            kind = f"bob{wave}.{b}" if p.policy == "refine_bob" else f"edit{wave}"
            sp = SamplingParams(
                temperature=p.editor_temperature,
                top_p=p.top_p,
                top_k=p.top_k,
                max_new_tokens=budget,
                seed=ctx.seed(state, cand["id"], kind),
            )
            new = {
                **cand,
                "tokens": cand["tokens"][:j],
                "text": "",
                "finish": None,
                "reward": None,
                "S": {k: v for k, v in cand["S"].items() if int(k) <= j},
                "c": cand["c"] + 1,
                "finished_round": None,
                "boundary": j,
            }
            new["text"] = ctx.decode(new["tokens"])
            out.append((GenCall(state, state["prompt_ids"] + new["tokens"], sp, "editor"), new, budget))
        return out

    def _decide(
        self,
        state: dict[str, Any],
        keep: list[dict[str, Any]],
        entries: list[dict[str, Any]],
        variants: list[list[dict[str, Any]]],
    ) -> list[dict[str, Any]]:
        """Apply one wave's outcomes sequentially in queue (rank) order; returns the next wave's queue.
        ``keep`` grows in place; an entry that is neither kept nor re-queued is dropped."""
        p = self.cfg
        st = state["stats"]
        t0 = time.perf_counter()
        next_gen: list[dict[str, Any]] = []
        for idx, (tau, outs) in enumerate(zip(entries, variants, strict=True)):
            new = outs[0]
            if p.policy == "refine_bob":
                new = outs[rank_order(_scores(outs))[0]]
            st["refinements"] += 1
            st["reward_before_sum"] += tau["reward"]
            st["reward_after_sum"] += new["reward"]
            st["refine_improved"] += int(new["reward"] > tau["reward"])
            new.pop("boundary", None)
            if p.policy in ("reroute_global", "keep_on_refine", "refine_bob"):
                pool = sorted(keep + entries[idx + 1 :] + next_gen + [new], key=lambda c: c["id"])
                u = rank_normalise(_scores(pool))[next(k for k, c in enumerate(pool) if c is new)]
                tier = route(u, p.theta_high, p.theta_low)
                if tier == REFINE and p.policy == "keep_on_refine":
                    tier = KEEP
            elif p.policy == "force_keep":
                tier = KEEP
            else:  # self_compare
                tier = KEEP if new["reward"] >= tau["reward"] + p.self_compare_delta else DISCARD
            if tier == KEEP:
                keep.append(new)
                st["refine_kept"] += 1
                st["refine_outcomes"]["keep"] += 1
            elif tier == REFINE and new["c"] < p.n_refine:
                next_gen.append(new)
                st["refine_outcomes"]["requeue"] += 1
            else:
                st["refine_outcomes"]["discard"] += 1
                if p.policy == "self_compare" and p.self_compare_fallback:
                    keep.append(tau)
                else:
                    state["dropped"].append(new["id"])
        self._charge_router(state, t0)
        return next_gen

    def _initial_route(
        self, state: dict[str, Any], pool: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Route the pool (candidate-id order): returns (KEEP, refinement queue in rank order)."""
        t0 = time.perf_counter()
        st = state["stats"]
        scores = _scores(pool)
        tiers = self._route_pool(scores)
        keep, queue = [], []
        for i in rank_order(scores):
            cand, tier = pool[i], tiers[i]
            st["routing"][tier] += 1
            if tier == KEEP:
                keep.append(cand)
            elif tier == REFINE and cand["c"] < self.cfg.n_refine:
                queue.append(cand)
            else:
                if tier == REFINE:
                    st["exhausted"] += 1
                state["dropped"].append(cand["id"])
        st["rounds"].append(
            {
                "round": state["round"],
                "pool": len(pool),
                **{t: tiers.count(t) for t in (KEEP, REFINE, DISCARD)},
                "waves": [],
            }
        )
        self._charge_router(state, t0)
        return keep, queue

    # -- Algorithm B: incremental form (§1.7) ----------------------------------------------------------
    def _step_incremental(self, states: list[dict[str, Any]], ctx: StepContext) -> None:
        p = self.cfg
        # (1) DRAFT: one engine batch over every unfinished candidate of every item
        calls, targets = [], []
        for state in states:
            for cand in state["candidates"]:
                if cand["finish"] is None:
                    call, budget = draft_call(ctx, state, cand, p, kind="draft")
                    calls.append(call)
                    targets.append((state, cand, budget, len(cand["tokens"])))
        jobs = []
        for (state, cand, budget, old), gen in zip(targets, ctx.generate(calls), strict=True):
            apply_generation(ctx, state, cand, gen, budget, p.max_new_tokens)
            jobs.append(
                (state, cand, new_positions(p.scoring_interval, old, len(cand["tokens"]), self._eager))
            )
        # (2) SCORE: one reward batch (chunk ends; every new checkpoint if eager)
        score_positions(ctx, jobs)
        for state, cand, _ in jobs:
            self._archive(state, cand)
        # (3) ROUTE every item's pool
        keeps: dict[int, list[dict[str, Any]]] = {}
        queues: dict[int, list[dict[str, Any]]] = {}
        tops: dict[int, dict[str, Any] | None] = {}
        for i, state in enumerate(states):
            cands = state["candidates"]
            pool = [c for c in cands if c["finish"] is None] if p.rank_unfinished_only else list(cands)
            bypass = [c for c in cands if c["finish"] is not None] if p.rank_unfinished_only else []
            tops[i] = pool[rank_order(_scores(pool))[0]] if pool else None
            if pool:
                keeps[i], queues[i] = self._initial_route(state, pool)
            else:
                keeps[i], queues[i] = [], []
            keeps[i].extend(bypass)
        # (4) REFINE in waves: each wave is ONE editor batch and ONE reward batch over every item
        wave = 0
        while any(queues.values()):
            self._refine_wave(states, ctx, keeps, queues, wave)
            wave += 1
        # (5) survivors; min-1 guard; stop rule
        for i, state in enumerate(states):
            survivors = keeps[i]
            if not survivors and tops[i] is not None:
                survivors = [tops[i]]
                if tops[i]["id"] in state["dropped"]:
                    state["dropped"].remove(tops[i]["id"])
            state["candidates"] = sorted(survivors, key=lambda c: c["id"])
            state["round"] += 1
            state["done"] = all(c["finish"] is not None for c in state["candidates"])
            if state["done"]:
                state["phase"] = "done"

    def _refine_wave(
        self,
        states: list[dict[str, Any]],
        ctx: StepContext,
        keeps: dict[int, list[dict[str, Any]]],
        queues: dict[int, list[dict[str, Any]]],
        wave: int,
    ) -> None:
        p = self.cfg
        active = [i for i in queues if queues[i]]
        if not self._eager:
            self._fill_boundaries(ctx, [(states[i], c) for i in active for c in queues[i]])
        calls, made = [], []
        for i in active:
            states[i]["stats"]["rounds"][-1]["waves"].append(len(queues[i]))
            for cand in queues[i]:
                outs = self._edit_calls(ctx, states[i], cand, wave)
                calls.extend(call for call, _, _ in outs)
                made.append((i, [(new, budget) for _, new, budget in outs]))
        gens = iter(ctx.generate(calls))
        jobs = []
        for i, outs in made:
            for new, budget in outs:
                apply_generation(ctx, states[i], new, next(gens), budget, p.max_new_tokens)
                jobs.append(
                    (
                        states[i],
                        new,
                        new_positions(
                            p.scoring_interval, new.pop("boundary"), len(new["tokens"]), self._eager
                        ),
                    )
                )
        score_positions(ctx, jobs)
        for state, new, _ in jobs:
            self._archive(state, new)
        by_item: dict[int, list[list[dict[str, Any]]]] = {i: [] for i in active}
        for i, outs in made:
            by_item[i].append([new for new, _ in outs])
        for i in active:
            queues[i] = self._decide(states[i], keeps[i], queues[i], by_item[i])

    # -- Algorithm A: batch form (§1.5) ----------------------------------------------------------------
    def _step_batch(self, states: list[dict[str, Any]], ctx: StepContext) -> None:
        """One engine batch per step: drafts of items still drafting, the editor wave of items whose
        queue is ready, and extensions of edited trajectories that lost their EOS."""
        p = self.cfg
        starting = [s for s in states if s["phase"] == "refine" and not s["pending"]]
        by_id = {id(s): {c["id"]: c for c in s["candidates"]} for s in states}
        if not self._eager:
            self._fill_boundaries(ctx, [(s, by_id[id(s)][cid]) for s in starting for cid in s["queue"]])
        calls: list[GenCall] = []
        targets: list[tuple[dict[str, Any], dict[str, Any], int, int]] = []
        for s in states:
            if s["phase"] == "draft":
                for cand in s["candidates"]:
                    if cand["finish"] is None:
                        call, budget = draft_call(ctx, s, cand, p, kind="draft")
                        calls.append(call)
                        targets.append((s, cand, budget, len(cand["tokens"])))
            elif s["phase"] == "refine" and not s["pending"]:
                s["stats"]["rounds"][-1]["waves"].append(len(s["queue"]))
                for cid in s["queue"]:
                    outs = self._edit_calls(ctx, s, by_id[id(s)][cid], s["wave"])
                    s["pending"].append({"id": cid, "variants": [new for _, new, _ in outs]})
                    for call, new, budget in outs:
                        calls.append(call)
                        targets.append((s, new, budget, new.pop("boundary")))
            elif s["phase"] == "refine":
                for entry in s["pending"]:
                    for b, new in enumerate(entry["variants"]):
                        if new["finish"] is None:
                            call, budget = draft_call(ctx, s, new, p, kind=f"extend{b}")
                            calls.append(call)
                            targets.append((s, new, budget, len(new["tokens"])))
        jobs = []
        for (s, cand, budget, old), gen in zip(targets, ctx.generate(calls), strict=True):
            apply_generation(ctx, s, cand, gen, budget, p.max_new_tokens)
            if self._eager:
                jobs.append((s, cand, new_positions(p.scoring_interval, old, len(cand["tokens"]), True)))
            elif cand["finish"] is not None:  # lazy: the batch form only needs final rewards
                jobs.append((s, cand, [len(cand["tokens"])]))
        score_positions(ctx, jobs)
        for s, cand, _ in jobs:
            self._archive(s, cand)
        for s in states:
            if s["phase"] == "draft" and all(c["finish"] is not None for c in s["candidates"]):
                keep, queue = self._initial_route(s, s["candidates"])
                s["candidates"] = sorted(keep + queue, key=lambda c: c["id"])
                s["queue"] = [c["id"] for c in queue]
                s["phase"] = "refine" if queue else "done"
            elif (
                s["phase"] == "refine"
                and s["pending"]
                and all(v["finish"] is not None for e in s["pending"] for v in e["variants"])
            ):
                cands = {c["id"]: c for c in s["candidates"]}
                entries = [cands[cid] for cid in s["queue"]]
                keep = [c for c in s["candidates"] if c["id"] not in set(s["queue"])]
                next_gen = self._decide(s, keep, entries, [e["variants"] for e in s["pending"]])
                s["candidates"] = sorted(keep + next_gen, key=lambda c: c["id"])
                s["queue"] = [c["id"] for c in next_gen]
                s["pending"] = []
                s["wave"] += 1
                if not next_gen:
                    s["phase"] = "done"
            s["round"] += 1
            s["done"] = s["phase"] == "done"

    # -- result --------------------------------------------------------------------------------------
    def result(self, state: dict[str, Any]) -> dict[str, Any]:
        p = self.cfg
        kept = [archive_entry(c) for c in state["candidates"] if c["finish"] is not None]
        pool = state["archive"] if p.archive_all else kept
        best = best_completed(pool)
        best_kept = best_completed(kept)
        st = state["stats"]
        events = sum(st["routing"].values())
        p_h, p_m, p_l = ((st["routing"][t] / events if events else None) for t in (KEEP, REFINE, DISCARD))
        n_ref = st["refinements"]
        rho = st["refine_kept"] / n_ref if n_ref else None
        return {
            "response": best["text"] if best else "",
            "reward": best["reward"] if best else None,
            "finish_reason": best["finish"] if best else None,
            "chosen": best["id"] if best else None,
            "rewards": [c["reward"] for c in state["candidates"]],
            "kept_ids": [c["id"] for c in state["candidates"]],
            "form": p.form,
            "policy": p.policy,
            "checkpoint_scoring": p.checkpoint_scoring,
            "routing": dict(st["routing"]),
            "refine_outcomes": dict(st["refine_outcomes"]),
            "p_H": p_h,
            "p_M": p_m,
            "p_L": p_l,
            "refinements": n_ref,
            "refine_kept": st["refine_kept"],
            "refine_improved": st["refine_improved"],
            "refine_exhausted": st["exhausted"],
            "rho": rho,
            "efficiency_gain": efficiency_gain(p_h, p_m, rho),
            "reward_before_refine": st["reward_before_sum"] / n_ref if n_ref else None,
            "reward_after_refine": st["reward_after_sum"] / n_ref if n_ref else None,
            "R_max": best_kept["reward"] if best_kept else None,
            "archive_size": len(state["archive"]),
            "rounds": state["round"],
            "round_log": st["rounds"],
            "ledger_components": {k: dict(v) for k, v in state["ledger"]["components"].items()},
        }
