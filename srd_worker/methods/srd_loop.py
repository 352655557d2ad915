"""The SRD decoding loop (ALGORITHMS.md §1.5-§1.7, §1.10): one engine shared by SRD and rejection sampling.

``SRDLoop`` runs an incremental pool of trajectories (``pool.py``) under an SRD configuration
(``SRDParams``, defined here with the refinement policies) and a routing strategy (``routing.Router``): SRD gives it ``RankRouter(θ_high, θ_low)``;
rejection sampling gives it its own configuration (no editor, no REFINE band) and a ``RankRouter(θ, θ)``
or a ``ThresholdRouter``. Both methods hold a loop and delegate ``init_state``/``step``/``result`` to it;
neither inherits from the other.

Implemented
    §1.5  Algorithm A, the literal batch form (``form=batch``): draft every candidate to completion,
          route once, then run the refinement queue; a refined trajectory that lost its EOS is extended
          to EOS / max length at the drafter temperature before it is judged.
    §1.6  all refinement policies: reroute_global (default), keep_on_refine, self_compare (with the
          drop-both or fall-back-to-τ failure path), force_keep and refine_bob.
    §1.7  Algorithm B, the incremental form (``form=incremental``, default): per round DRAFT, SCORE,
          ROUTE, then REFINE in waves (a wave is one generation of the refinement queue). Each item moves
          through its own phases: a step drafts, scores and routes it, or runs its next wave, and ONE
          engine batch (and one reward batch) carries every item's step, so one item's wave shares an
          engine call with another's draft; decisions are applied sequentially in
          rank order per item, each τ' ranked against KEEP ∪ rest of the queue ∪ re-queued ∪ {τ'}, as the
          sequential Algorithm 1 processes its queue — see "Incremental vs batch" below for where the
          two forms differ); the min-1 guard; finished
          candidates stay in the pool (or, with ``rank_unfinished_only``, leave it and are kept as they
          are); the ``archive_all`` answer rule; lazy or eager checkpoint scoring.
    §1.10 per-item routing statistics (p_H, p_M, p_L, ρ, the efficiency gain, mean reward before →
          after refinement, R_max), see below.

Incremental vs batch (ALGORITHMS.md §1.7): the incremental form is NOT the batch form run in rounds.
    (a) A τ' that lost its EOS (or is otherwise unfinished) is judged on its partial text's reward; the
        batch form extends it to EOS / max length first and judges the complete response.
    (b) A kept unfinished τ' makes the item draft another round, which routes the whole pool again
        (with the defaults, about half survives); the batch form routes the drafts once.
    Edits are seeded by the trajectory and its edit count (``edit<c>``), not by the round or the wave,
    so a trajectory's c-th edit from the same boundary draws the same tokens in both forms (tested).
    Without (a) and (b) — every draft and every τ' finishes in its first round — the forms coincide.

PROPOSED choices (ALGORITHMS.md marks them so)
    - Lazy checkpoint scoring scores only what routing needs (chunk ends; final ends in the batch form)
      and fills S on demand before an edit (``routing.resolve_boundary``), in one reward batch per wave.
      Decisions are identical to eager by construction (tested).
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
      KEEP in that decision / refinements; gain = 1 + ρ·p_M/p_H (``routing.efficiency_gain``).
    - Seeds: ``ctx.seed(state, candidate_id, kind)`` with kinds ``draft`` (shared with rejection
      sampling and Best-of-N), ``edit<c>`` (the trajectory's c-th edit, c = its edit count after this
      edit; no round in the seed), ``bob<c>.<b>`` and ``extend<b>``; candidate ids are the initial
      indices and follow a trajectory through its edits. A self_compare fallback that keeps τ counts
      the failed edit in τ's c (Alg. 1's c counts refinements; without it a kept τ could be refined
      past N_refine in later rounds, and its next edit would repeat the failed one's seed).
    - ``answer=weighted_majority``: the answer from the same pool (the kept completed trajectories, or
      the archive with ``archive_all``) by search-and-learn's weighted vote (``pool.weighted_winner``:
      the answer class whose members' rewards sum highest), then ``best_completed`` within that class;
      the classes are taken when the item is done (``classes``, aligned with ``answer_pool``).
      ``answer=best`` (default) is the paper's argmax. R_max stays the best kept reward either way.
    - Ledger: drafts are charged to ``drafter``, regenerations to ``editor`` (batch-form extensions of an
      edited trajectory to ``drafter``), every reward call to ``scorer``; ``router`` counts one call per
      item per routing pass (initial routing, each wave's decisions) and its wall time.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Any, NamedTuple, NotRequired, TypedDict

from srd_worker.errors import ConfigError
from srd_worker.methods.base import GenCall, StepContext, new_state, param
from srd_worker.methods.pool import (
    ANSWER_HELP,
    ArchiveEntry,
    PoolParams,
    Trajectory,
    TrajectoryState,
    answer_now,
    apply_generation,
    archive_entries,
    archive_entry,
    best_completed,
    check_answer_rule,
    checkpoint_scores,
    choose_answer,
    continuation_call,
    cut_back,
    draft_call,
    draft_calls,
    entry_classes,
    is_finished,
    new_positions,
    new_trajectory,
    score_positions,
    scores,
)
from srd_worker.methods.routing import (
    BOUNDARY_SEARCHES,
    DISCARD,
    KEEP,
    REFINE,
    Router,
    efficiency_gain,
    rank_normalise,
    rank_order,
    resolve_boundary,
    route,
)

POLICIES = ("reroute_global", "keep_on_refine", "self_compare", "force_keep", "refine_bob")


@dataclasses.dataclass(frozen=True)
class SRDParams(PoolParams):
    n: int = param(10, "initial candidates N")
    theta_high: float = param(0.5, "KEEP if rank-normalised score u >= theta_high")
    theta_low: float = param(0.3, "DISCARD if u <= theta_low; REFINE in between")
    scoring_interval: int = param(10, "m: checkpoint spacing in tokens for boundary localisation")
    l_max: int = param(30, "L_max: at most this many trailing tokens are regenerated (0 = no cap)")
    boundary_search: str = param(
        "whole",
        "whole: earliest reward drop over the whole trajectory, then the L_max cap (literal Alg. 1); "
        "tail: earliest drop inside the regenerable tail [len - L_max, len] only [PROPOSED]",
    )
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
    answer: str = param(
        "best",
        "final answer from the completed pool (kept, or the archive with archive_all): "
        + ANSWER_HELP
        + " [PROPOSED]",
        in_id_at_default=False,
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
        _check(
            self.boundary_search in BOUNDARY_SEARCHES,
            f"boundary_search must be one of {', '.join(BOUNDARY_SEARCHES)}, got {self.boundary_search!r}",
        )
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
        check_answer_rule(self.answer)
        _check(
            not (self.rank_unfinished_only and self.form == "batch"),
            "rank_unfinished_only applies to form=incremental only",
        )


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


class RoundLog(TypedDict):
    round: int
    pool: int
    keep: int
    refine: int
    discard: int
    waves: list[int]  # queue length of each refinement wave


class SRDStats(TypedDict):
    routing: dict[str, int]  # KEEP / REFINE / DISCARD → routing events
    refine_outcomes: dict[str, int]  # keep / requeue / discard → decisions on refined trajectories
    refinements: int
    refine_kept: int
    refine_improved: int
    exhausted: int
    reward_before_sum: float
    reward_after_sum: float
    rounds: list[RoundLog]


class PendingEdit(TypedDict):
    """Batch form: the regeneration(s) of one queued trajectory, awaiting completion."""

    id: int
    variants: list[Trajectory]


class SRDState(TrajectoryState):
    archive: list[ArchiveEntry]  # every completed trajectory ever produced
    dropped: list[int]
    stats: SRDStats
    phase: str  # batch form: draft → refine → done
    queue: list[int]  # batch form: ids waiting for the next wave, in order
    pending: list[PendingEdit]  # batch form: regenerations of the current wave awaiting completion
    wave: int
    keep: list[Trajectory]  # incremental form, phase refine: the round's KEEP set so far
    refining: list[Trajectory]  # incremental form, phase refine: the next wave's queue, in rank order
    top: int | None  # incremental form: the id of the round's top-ranked candidate (the min-1 guard)
    classes: NotRequired[list[int | None]]  # answer=weighted_majority: answer_pool's classes, once done


class Edit(NamedTuple):
    """One editor regeneration: the engine call, the new trajectory, its budget and boundary j*."""

    call: GenCall
    new: Trajectory
    budget: int
    boundary: int


def new_stats() -> SRDStats:
    return {
        "routing": {KEEP: 0, REFINE: 0, DISCARD: 0},
        "refine_outcomes": {"keep": 0, "requeue": 0, "discard": 0},
        "refinements": 0,
        "refine_kept": 0,
        "refine_improved": 0,
        "exhausted": 0,
        "reward_before_sum": 0.0,
        "reward_after_sum": 0.0,
        "rounds": [],
    }


class SRDLoop:
    """SRD's Algorithms A and B over many items at once, routed by ``router``."""

    def __init__(self, cfg: SRDParams, router: Router) -> None:
        self.cfg, self.router = cfg, router

    # -- state ---------------------------------------------------------------------------------------
    def init_state(self, item_id: str, question: str, prompt_ids: Sequence[int]) -> SRDState:
        return {
            **new_state(item_id, question, prompt_ids),
            "candidates": [new_trajectory(i) for i in range(self.cfg.n)],
            "archive": [],
            "dropped": [],
            "stats": new_stats(),
            "phase": "draft",
            "queue": [],
            "pending": [],
            "wave": 0,
            "keep": [],
            "refining": [],
            "top": None,
        }

    def wave_rows(self, state: SRDState) -> int:
        """Rows of the item's next refinement wave in phase refine (incremental form; ``bob_b`` per queued
        trajectory with refine_bob), else 0: the item drafts next."""
        if state.get("phase") == "refine" and state.get("refining"):
            return len(state["refining"]) * (self.cfg.bob_b if self.cfg.policy == "refine_bob" else 1)
        return 0

    def step(self, states: list[SRDState], ctx: StepContext) -> list[SRDState]:
        if self.cfg.form == "batch":
            self._step_batch(states, ctx)
        else:
            self._step_incremental(states, ctx)
        if self.cfg.answer == "weighted_majority":
            for s in states:
                if s["done"] and "classes" not in s:
                    s["classes"] = self.pool_classes(s, ctx)
        return states

    # -- the answer pool -----------------------------------------------------------------------------
    def answer_pool(self, state: SRDState) -> list[ArchiveEntry]:
        """What the answer is chosen from: the completed kept trajectories, or the archive (``archive_all``)."""
        return list(state["archive"]) if self.cfg.archive_all else self.kept_entries(state)

    @staticmethod
    def kept_entries(state: SRDState) -> list[ArchiveEntry]:
        """The completed trajectories still kept, as archive entries (id order)."""
        return [archive_entry(c) for c in state["candidates"] if is_finished(c)]

    def pool_classes(self, state: SRDState, ctx: StepContext) -> list[int | None]:
        """``answer_pool``'s answer classes (the task's equivalence, ``StepContext.answer_classes``)."""
        return entry_classes(ctx, self.answer_pool(state))

    def choose(
        self, pool: Sequence[ArchiveEntry], classes: Sequence[int | None] | None
    ) -> ArchiveEntry | None:
        """The answer among ``pool`` by the ``answer`` rule (``pool.choose_answer``); ``classes`` are the
        pool's answer classes, needed by weighted_majority only."""
        return choose_answer(self.cfg.answer, pool, classes)

    def current_best(self, state: SRDState, ctx: StepContext) -> tuple[str, float | None]:
        """The answer the item would give now (anytime curves), by the same rule as ``result``."""
        return answer_now(self.cfg.answer, ctx, self.answer_pool(state))

    # -- building blocks -----------------------------------------------------------------------------
    @property
    def _eager(self) -> bool:
        return self.cfg.checkpoint_scoring == "eager"

    @property
    def _l_max(self) -> float:
        return self.cfg.l_max if self.cfg.l_max > 0 else math.inf

    def _charge_router(self, state: SRDState, t0: float) -> None:
        state["timing"]["router"] += time.perf_counter() - t0
        state["ledger"]["components"]["router"]["calls"] += 1

    def _archive(self, state: SRDState, cand: Trajectory) -> None:
        if is_finished(cand):
            state["archive"].append(archive_entry(cand))

    def _resolve(self, cand: Trajectory) -> tuple[int | None, list[int]]:
        return resolve_boundary(
            checkpoint_scores(cand),
            self.cfg.scoring_interval,
            len(cand["tokens"]),
            self._l_max,
            self.cfg.boundary_search,
        )

    def _fill_boundaries(self, ctx: StepContext, jobs: Sequence[tuple[SRDState, Trajectory]]) -> None:
        """Lazy scoring: one reward batch with every checkpoint FINDBOUNDARY still needs."""
        need = []
        for state, cand in jobs:
            j, missing = self._resolve(cand)
            if j is None:
                need.append((state, cand, missing))
        score_positions(ctx, need)

    def _boundary(self, cand: Trajectory) -> int:
        j, missing = self._resolve(cand)
        if j is None:  # lazy filling runs first; reaching this is a bug
            raise RuntimeError(f"candidate {cand['id']}: checkpoint scores missing at {missing}")
        return j

    def _edits(self, ctx: StepContext, state: SRDState, cand: Trajectory) -> list[Edit]:
        """The editor regeneration(s) of ``cand`` from its boundary [PAPER Eq. 5], seeded by the
        trajectory's id and edit count only, so both forms draw the same c-th edit."""
        p = self.cfg
        j = self._boundary(cand)
        budget = len(cand["tokens"]) - j
        out = []
        for b in range(p.bob_b if p.policy == "refine_bob" else 1):
            new = cut_back(ctx, cand, j)
            new["c"] = cand["c"] + 1
            call = continuation_call(
                ctx,
                state,
                new,
                cid=cand["id"],
                kind=f"bob{new['c']}.{b}" if p.policy == "refine_bob" else f"edit{new['c']}",
                budget=budget,
                temperature=p.editor_temperature,
                top_p=p.top_p,
                top_k=p.top_k,
                component="editor",
                by_round=False,
            )
            out.append(Edit(call, new, budget, j))
        return out

    def _decide(
        self,
        state: SRDState,
        keep: list[Trajectory],
        entries: list[Trajectory],
        variants: list[list[Trajectory]],
    ) -> list[Trajectory]:
        """Apply one wave's outcomes sequentially in queue (rank) order; returns the next wave's queue.
        ``keep`` grows in place; an entry that is neither kept nor re-queued is dropped (§1.6)."""
        p = self.cfg
        st = state["stats"]
        t0 = time.perf_counter()
        next_gen: list[Trajectory] = []
        for idx, (tau, outs) in enumerate(zip(entries, variants, strict=True)):
            if not outs:  # spent (batch form): popped with c ≥ N_refine and dropped, not regenerated (§1.5)
                st["exhausted"] += 1
                state["dropped"].append(tau["id"])
                continue
            new = outs[0]
            if p.policy == "refine_bob":
                new = outs[rank_order(scores(outs))[0]]
            st["refinements"] += 1
            r_tau, r_new = tau["reward"], new["reward"]
            # a routed trajectory and its regenerations are scored at their end (score_positions)
            assert r_tau is not None and r_new is not None
            st["reward_before_sum"] += r_tau
            st["reward_after_sum"] += r_new
            st["refine_improved"] += int(r_new > r_tau)
            if p.policy in ("reroute_global", "keep_on_refine", "refine_bob"):
                others = keep + entries[idx + 1 :] + next_gen
                if p.rank_unfinished_only:  # finished candidates left the ranking pool (§1.7 (3))
                    others = [c for c in others if not is_finished(c)]
                pool = sorted(others + [new], key=lambda c: c["id"])
                u = rank_normalise(scores(pool))[next(k for k, c in enumerate(pool) if c is new)]
                tier = route(u, p.theta_high, p.theta_low)
                if tier == REFINE and p.policy == "keep_on_refine":
                    tier = KEEP
            elif p.policy == "force_keep":
                tier = KEEP
            else:  # self_compare
                tier = KEEP if r_new >= r_tau + p.self_compare_delta else DISCARD
            if tier == KEEP:
                keep.append(new)
                st["refine_kept"] += 1
                st["refine_outcomes"]["keep"] += 1
            elif tier == REFINE and (new["c"] < p.n_refine or p.form == "batch"):
                # the batch form pushes τ' back whatever its count (Algorithm 1): spent, it stays in the
                # queue, and in the ranking pool of the τ' decided before it is popped, then is dropped
                next_gen.append(new)
                st["refine_outcomes"]["requeue"] += 1
            else:
                st["refine_outcomes"]["discard"] += 1
                if p.policy == "self_compare" and p.self_compare_fallback:
                    tau["c"] = new["c"]  # the failed edit counts (N_refine; the next edit's seed)
                    keep.append(tau)
                else:
                    state["dropped"].append(new["id"])
        if any(variants):  # dropping spent entries routes nothing
            self._charge_router(state, t0)
        return next_gen

    def _initial_route(
        self, state: SRDState, pool: list[Trajectory]
    ) -> tuple[list[Trajectory], list[Trajectory]]:
        """Route the pool (candidate-id order): returns (KEEP, refinement queue in rank order)."""
        t0 = time.perf_counter()
        st = state["stats"]
        pool_scores = scores(pool)
        tiers = self.router(pool_scores)
        keep, queue = [], []
        for i in rank_order(pool_scores):
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
                "keep": tiers.count(KEEP),
                "refine": tiers.count(REFINE),
                "discard": tiers.count(DISCARD),
                "waves": [],
            }
        )
        self._charge_router(state, t0)
        return keep, queue

    # -- Algorithm B: incremental form (§1.7) ----------------------------------------------------------
    def _step_incremental(self, states: list[SRDState], ctx: StepContext) -> None:
        """One step of every item in its own phase, in ONE engine batch and ONE reward batch: items in
        ``draft`` extend their unfinished candidates by a chunk, are scored and routed; items in ``refine``
        run their next refinement wave (lazy scoring first fills, in one reward batch, the checkpoints their
        boundaries need), are scored and decided. An item whose refinement queue is empty closes its round
        (survivors, the min-1 guard, the stop rule) in the same step and drafts in the next. Every draw is
        seeded by the item's round and the trajectory's edit count, never by the step, so an item's draws,
        ledger and record are those of running its round's draft and waves back to back, whichever items
        share its steps; the phases only let one item's wave share an engine call with another's draft."""
        p = self.cfg
        for s in states:  # a checkpoint written before the phases existed is at a round's start
            s.setdefault("keep", [])
            s.setdefault("refining", [])
            s.setdefault("top", None)
        drafting = [s for s in states if s["phase"] != "refine"]
        waving = [s for s in states if s["phase"] == "refine"]
        if waving and not self._eager:
            self._fill_boundaries(ctx, [(s, c) for s in waving for c in s["refining"]])
        calls, drafts = draft_calls(drafting, ctx, p)
        made: list[tuple[SRDState, list[Edit]]] = []
        for s in waving:
            s["stats"]["rounds"][-1]["waves"].append(len(s["refining"]))
            for cand in s["refining"]:
                made.append((s, self._edits(ctx, s, cand)))
        gens = iter(ctx.generate(calls + [e.call for _, edits in made for e in edits]))
        jobs = []
        for d in drafts:
            apply_generation(ctx, d.state, d.cand, next(gens), d.budget, p.max_new_tokens)
            positions = new_positions(p.scoring_interval, d.before, len(d.cand["tokens"]), self._eager)
            jobs.append((d.state, d.cand, positions))
        for s, edits in made:
            for e in edits:
                apply_generation(ctx, s, e.new, next(gens), e.budget, p.max_new_tokens)
                positions = new_positions(p.scoring_interval, e.boundary, len(e.new["tokens"]), self._eager)
                jobs.append((s, e.new, positions))
        score_positions(ctx, jobs)  # chunk ends (every new checkpoint if eager) of drafts and edits
        for state, cand, _ in jobs:
            self._archive(state, cand)
        for s in drafting:
            self._route_pool(s)
        by_item: dict[int, list[list[Trajectory]]] = {id(s): [] for s in waving}
        for s, edits in made:
            by_item[id(s)].append([e.new for e in edits])
        for s in waving:
            s["refining"] = self._decide(s, s["keep"], s["refining"], by_item[id(s)])
        for s in states:
            if not s["refining"]:
                self._close_round(s)

    def _route_pool(self, state: SRDState) -> None:
        """ROUTE the item's pool after its draft: KEEP → ``keep``, the refinement queue → ``refining`` (rank
        order, ``phase`` refine), the top-ranked candidate's id → ``top`` (the min-1 guard)."""
        cands = state["candidates"]
        finished = self.cfg.rank_unfinished_only
        pool = [c for c in cands if not is_finished(c)] if finished else list(cands)
        state["top"] = pool[rank_order(scores(pool))[0]]["id"] if pool else None
        keep, queue = self._initial_route(state, pool) if pool else ([], [])
        if finished:
            keep.extend(c for c in cands if is_finished(c))
        state["keep"], state["refining"] = keep, queue
        state["phase"] = "refine" if queue else "draft"

    def _close_round(self, state: SRDState) -> None:
        """The round's survivors (the min-1 guard restores the top-ranked when nothing survived), the next
        round, the stop rule."""
        survivors = state["keep"]
        top = state["top"]
        if not survivors and top is not None:
            survivors = [c for c in state["candidates"] if c["id"] == top]
            if top in state["dropped"]:
                state["dropped"].remove(top)
        state["candidates"] = sorted(survivors, key=lambda c: c["id"])
        state["keep"], state["refining"], state["top"] = [], [], None
        state["round"] += 1
        state["done"] = all(is_finished(c) for c in state["candidates"])
        state["phase"] = "done" if state["done"] else "draft"

    # -- Algorithm A: batch form (§1.5) ----------------------------------------------------------------
    def _step_batch(self, states: list[SRDState], ctx: StepContext) -> None:
        """One engine batch per step: drafts of items still drafting, the editor wave of items whose
        queue is ready, and extensions of edited trajectories that lost their EOS."""
        p = self.cfg
        starting = [s for s in states if s["phase"] == "refine" and not s["pending"]]
        by_id = {id(s): {c["id"]: c for c in s["candidates"]} for s in states}
        spent = {id(s): {cid for cid in s["queue"] if by_id[id(s)][cid]["c"] >= p.n_refine} for s in starting}
        if not self._eager:
            self._fill_boundaries(
                ctx,
                [(s, by_id[id(s)][cid]) for s in starting for cid in s["queue"] if cid not in spent[id(s)]],
            )
        calls: list[GenCall] = []
        targets: list[tuple[SRDState, Trajectory, int, int]] = []
        for s in states:
            if s["phase"] == "draft":
                for cand in s["candidates"]:
                    if not is_finished(cand):
                        call, budget = draft_call(ctx, s, cand, p, cid=cand["id"], kind="draft")
                        calls.append(call)
                        targets.append((s, cand, budget, len(cand["tokens"])))
            elif s["phase"] == "refine" and not s["pending"]:
                if len(s["queue"]) > len(spent[id(s)]):  # a wave of spent entries only calls no editor
                    s["stats"]["rounds"][-1]["waves"].append(len(s["queue"]) - len(spent[id(s)]))
                for cid in s["queue"]:
                    if cid in spent[id(s)]:  # no regeneration: dropped when the wave is decided
                        s["pending"].append({"id": cid, "variants": []})
                        continue
                    edits = self._edits(ctx, s, by_id[id(s)][cid])
                    s["pending"].append({"id": cid, "variants": [e.new for e in edits]})
                    for e in edits:
                        calls.append(e.call)
                        targets.append((s, e.new, e.budget, e.boundary))
            elif s["phase"] == "refine":
                for entry in s["pending"]:
                    for b, new in enumerate(entry["variants"]):
                        if not is_finished(new):
                            call, budget = draft_call(ctx, s, new, p, cid=new["id"], kind=f"extend{b}")
                            calls.append(call)
                            targets.append((s, new, budget, len(new["tokens"])))
        jobs = []
        for (s, cand, budget, old), gen in zip(targets, ctx.generate(calls), strict=True):
            apply_generation(ctx, s, cand, gen, budget, p.max_new_tokens)
            if self._eager:
                jobs.append((s, cand, new_positions(p.scoring_interval, old, len(cand["tokens"]), True)))
            elif is_finished(cand):  # lazy: the batch form only needs final rewards
                jobs.append((s, cand, [len(cand["tokens"])]))
        score_positions(ctx, jobs)
        for s, cand, _ in jobs:
            self._archive(s, cand)
        for s in states:
            if s["phase"] == "draft" and all(is_finished(c) for c in s["candidates"]):
                keep, queue = self._initial_route(s, s["candidates"])
                s["candidates"] = sorted(keep + queue, key=lambda c: c["id"])
                s["queue"] = [c["id"] for c in queue]
                s["phase"] = "refine" if queue else "done"
            elif (
                s["phase"] == "refine"
                and s["pending"]
                and all(is_finished(v) for e in s["pending"] for v in e["variants"])
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
    def result(self, state: SRDState) -> dict[str, Any]:
        """The answer (by the ``answer`` rule over the completed kept trajectories, or over the archive with
        ``archive_all``: the argmax final reward, ties → earliest finished round, then lowest id; or the
        weighted vote, ``choose``) and the §1.10 statistics."""
        p = self.cfg
        pool = self.answer_pool(state)
        best = self.choose(pool, state.get("classes"))
        # R_max: the best kept reward (the answer pool is the kept entries unless archive_all)
        best_kept = best_completed(self.kept_entries(state) if p.archive_all else pool)
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
            "candidates": archive_entries(state["archive"], state["candidates"]),
            "rounds": state["round"],
            "round_log": st["rounds"],
            "ledger_components": {k: dict(v) for k, v in state["ledger"]["components"].items()},
        }
