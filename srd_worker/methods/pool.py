"""The candidate pool every sampling-based method builds on: candidates, drafting, scoring, the archive.

Candidates (typed dicts, stored as they are in the checkpointed state)
    ``PoolCandidate`` — a response drafted in chunks: tokens, text, ``finish`` (None while drafting,
    else the finish reason) and ``reward``. Sampling, Best-of-N and self-consistency keep a fixed list
    of them; a candidate is identified by its position in that list.
    ``Trajectory`` — a pool candidate that can be pruned, cut back and regenerated (SRD, rejection
    sampling, speculative rejection): it adds a stable ``id`` (its initial index, which follows it
    through its edits), ``S`` (checkpoint scores: str(position) → reward of tokens[:position]), ``c``
    (refinements so far) and ``finished_round``.

Drafting (ALGORITHMS.md §1.3: the paper setting for every method is temperature 0.8, top-p 0.9, top-k 50)
    ONE path: ``continuation_call`` builds an engine request that continues a candidate from its token
    ids (prompt + kept prefix, never re-tokenised text); ``draft_call`` sizes it as one drafting chunk;
    ``apply_generation`` appends the generated tokens and applies the finish rules; ``draft_round``
    extends every unfinished candidate of many items by one chunk in ONE engine batch. Seeds are
    ``ctx.seed(state, candidate id, kind)`` — kind ``draft`` for drafts, so every method draws the same
    chunk for the same candidate and round. The fixed pools (sampling, Best-of-N, self-consistency)
    default to ``chunk_tokens`` 0: the whole budget in one engine call, one round (they decide nothing
    between rounds); their first ``chunk_tokens`` tokens are still the chunked methods' round-0 draft.

Scoring
    ``score_responses`` (the whole response of each candidate) and ``score_positions`` (checkpoints of
    trajectories), each ONE reward batch; the reward is told whether a text is a finished response
    (EOS / stop string) or a prefix.

Archive
    ``archive_entry`` records a completed trajectory; ``best_completed`` picks the answer among entries
    (highest reward; ties → earliest finished round, then lowest id, then earliest listed).

Answer rules (``ANSWER_RULES``: the ``answer`` of Best-of-N, SRD, rejection sampling and Speculative
    Rejection; ``choose_answer`` picks from archived entries)
    ``best``, the highest reward, or ``weighted_majority``, search-and-learn's weighted Best-of-N: the
    answer class (``votes.answer_classes`` with the task's equivalence) whose members' rewards sum
    highest (``weighted_winner``; a NaN or missing reward adds nothing), answered by its best member.
    The weights are raw rewards, meant for rewards that are never negative; a negative one is a
    ``ValueError`` (the item fails naming the rule).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple, TypedDict, TypeVar, cast, overload

from srd_worker.engines.base import Generation, SamplingParams
from srd_worker.errors import ConfigError
from srd_worker.methods.base import GenCall, ItemState, MethodParams, ScoreCall, StepContext, param
from srd_worker.votes import majority

# ---------------------------------------------------------------------------------------------------
# Parameters

#: ``keep_candidates`` values; ``auto`` is the default and is left out of ``to_dict`` (``in_id_at_default``)
#: so the run ids of runs made before the parameter existed do not change.
KEEP_CANDIDATES = ("auto", "full", "answers", "none")
#: ``auto`` keeps the candidates' text up to this many candidates per problem.
FULL_CANDIDATES_MAX = 64
#: ``chunk_tokens`` of the fixed pools (sampling, best_of_n, self_consistency): 0 = whole budget.
WHOLE_BUDGET_HELP = (
    "tokens drafted per round; 0 (default) = the whole max_new_tokens budget in ONE engine call (one "
    "round, checkpointed when it ends); a positive value drafts in rounds of that many tokens with a "
    "checkpoint after each (finer checkpoints, slower: every round re-feeds the prefix)"
)


@dataclasses.dataclass(frozen=True)
class DraftParams(MethodParams):
    temperature: float = param(0.8, "drafter sampling temperature (0 = greedy)")
    top_p: float = param(0.9, "drafter nucleus (top-p) mass")
    top_k: int = param(50, "drafter top-k (0 = off)")
    max_new_tokens: int = param(
        500, "maximum generated tokens per candidate (paper: 500 MATH500/HotpotQA, 1000 GPQA/AlpacaEval)"
    )
    chunk_tokens: int = param(100, "tokens drafted per round (the drafting interval; a checkpoint per round)")
    keep_candidates: str = param(
        "auto",
        "what the result record keeps of every candidate: full (text, reward, answer, tokens, finish), "
        "answers (the same without the text), none; auto = full for up to 64 candidates, else answers",
        in_id_at_default=False,
    )

    #: May ``chunk_tokens`` be 0 (the whole budget in one round)? Only the fixed pools, which make no
    #: decision between rounds; SRD, rejection sampling and Speculative Rejection need their interval Δ.
    whole_budget_allowed: ClassVar[bool] = False
    #: What ``chunk_tokens`` 0 means to a method that takes it for something else (beam search / DVTS: no
    #: per-step cap); empty where 0 is refused.
    chunk_tokens_zero: ClassVar[str] = ""

    def validate(self) -> None:
        if self.keep_candidates not in KEEP_CANDIDATES:
            raise ConfigError(
                f"keep_candidates must be one of {', '.join(KEEP_CANDIDATES)}, got {self.keep_candidates!r}"
            )
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        zero = "the whole budget in one round" if self.whole_budget_allowed else self.chunk_tokens_zero
        if self.chunk_tokens < (0 if zero else 1):
            low = f"0 (0 = {zero})" if zero else "1"
            raise ConfigError(f"chunk_tokens must be >= {low}, got {self.chunk_tokens}")

    def candidates_mode(self, n_candidates: int) -> str:
        """``full``, ``answers`` or ``none`` for a problem with ``n_candidates`` candidates."""
        if self.keep_candidates != "auto":
            return self.keep_candidates
        return "full" if n_candidates <= FULL_CANDIDATES_MAX else "answers"


@dataclasses.dataclass(frozen=True)
class PoolParams(DraftParams):
    """Drafting parameters plus the pool size n (methods redeclare n to set their own default/help)."""

    n: int = param(4, "number of candidates drafted per problem")

    def validate(self) -> None:
        super().validate()
        if self.n < 1:
            raise ConfigError(f"n must be >= 1, got {self.n}")


# ---------------------------------------------------------------------------------------------------
# Candidates


class PoolCandidate(TypedDict):
    tokens: list[int]
    text: str  # decode(tokens)
    finish: str | None  # None while drafting; "eos" | "stop" | "length" once finished
    reward: float | None


class Trajectory(PoolCandidate):
    """A candidate with an identity and a history (key order: id, tokens, text, finish, reward, S, c,
    finished_round — as ``new_trajectory`` writes it)."""

    id: int
    S: dict[str, float]  # str(position) → reward of tokens[:position]
    c: int  # refinements over the trajectory's life (SRD's N_refine counter)
    finished_round: int | None


class PoolState(ItemState):
    """State of the fixed-pool methods (sampling, Best-of-N, self-consistency)."""

    candidates: list[PoolCandidate]


class TrajectoryState(ItemState):
    """State of the methods whose pool is trajectories (SRD, rejection sampling, speculative rejection)."""

    candidates: list[Trajectory]


_PoolStateT = TypeVar("_PoolStateT", bound=PoolState)
_TrajectoryStateT = TypeVar("_TrajectoryStateT", bound=TrajectoryState)
_AnyPoolStateT = TypeVar("_AnyPoolStateT", bound=PoolState | TrajectoryState)


class ArchiveEntry(TypedDict):
    """A completed trajectory, as kept for the answer rule."""

    id: int
    text: str
    reward: float | None
    finish: str | None
    round: int | None  # the round it finished in
    n_tokens: int
    c: int  # refinements of the trajectory when it finished (absent in checkpoints older than the field)


def new_candidate() -> PoolCandidate:
    """An empty candidate (not drafted yet)."""
    return {"tokens": [], "text": "", "finish": None, "reward": None}


def new_trajectory(cid: int) -> Trajectory:
    """An empty trajectory with the stable id ``cid``."""
    return {"id": cid, **new_candidate(), "S": {}, "c": 0, "finished_round": None}


def is_finished(cand: PoolCandidate) -> bool:
    return cand["finish"] is not None


def cut_back(ctx: StepContext, cand: Trajectory, j: int) -> Trajectory:
    """A copy of ``cand`` cut back to its first ``j`` tokens, unfinished, unscored at the end (its
    checkpoint scores up to j stay); same id and refinement count."""
    return {
        **cand,
        "tokens": cand["tokens"][:j],
        "text": ctx.decode(cand["tokens"][:j]),
        "finish": None,
        "reward": None,
        "S": {k: v for k, v in cand["S"].items() if int(k) <= j},
        "finished_round": None,
    }


def scores(cands: Sequence[PoolCandidate]) -> list[float]:
    """Rewards for ranking: an unscored candidate counts as NaN (ranks last)."""
    return [math.nan if c["reward"] is None else c["reward"] for c in cands]


def checkpoint_scores(cand: Trajectory) -> dict[int, float]:
    """``S`` keyed by int position."""
    return {int(k): v for k, v in cand["S"].items()}


# ---------------------------------------------------------------------------------------------------
# Drafting


def continuation_call(
    ctx: StepContext,
    state: ItemState,
    cand: PoolCandidate,
    *,
    cid: int,
    kind: str,
    budget: int,
    temperature: float,
    top_p: float,
    top_k: int,
    component: str,
    by_round: bool = True,
) -> GenCall:
    """An engine request continuing ``cand`` by at most ``budget`` tokens, seeded by (cid, kind) and,
    unless ``by_round`` is false, the item's round."""
    sp = SamplingParams(
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        max_new_tokens=budget,
        seed=ctx.seed(state, cid, kind, by_round=by_round),
    )
    return GenCall(state, state["prompt_ids"] + cand["tokens"], sp, component)


def draft_call(
    ctx: StepContext,
    state: ItemState,
    cand: PoolCandidate,
    p: DraftParams,
    *,
    cid: int,
    kind: str = "draft",
    component: str = "drafter",
) -> tuple[GenCall, int]:
    """A drafter continuation of ``cand`` by one chunk (and its token budget); ``chunk_tokens`` 0 (fixed
    pools only) = the rest of the budget."""
    remaining = p.max_new_tokens - len(cand["tokens"])
    budget = min(p.chunk_tokens, remaining) if p.chunk_tokens > 0 else remaining
    call = continuation_call(
        ctx,
        state,
        cand,
        cid=cid,
        kind=kind,
        budget=budget,
        temperature=p.temperature,
        top_p=p.top_p,
        top_k=p.top_k,
        component=component,
    )
    return call, budget


def apply_generation(
    ctx: StepContext,
    state: ItemState,
    cand: PoolCandidate,
    gen: Generation,
    budget: int,
    max_new_tokens: int,
) -> None:
    """Append a continuation and apply the finish rules: the engine's finish reason (EOS / stop string),
    else "length" at the ``max_new_tokens`` cap or when the engine stopped short of ``budget`` (the
    context window is full). A trajectory records the round it finished in."""
    cand["tokens"].extend(gen.token_ids)
    cand["text"] = ctx.decode(cand["tokens"])
    if gen.finished:
        cand["finish"] = gen.finish_reason
    elif len(cand["tokens"]) >= max_new_tokens or len(gen.token_ids) < budget or not gen.token_ids:
        cand["finish"] = "length"
    if cand["finish"] is not None and "finished_round" in cand:
        cast(Trajectory, cand)["finished_round"] = state["round"]  # the key says it is a trajectory


def candidate_id(cand: PoolCandidate, index: int) -> int:
    """The seed identity of a candidate: a trajectory's ``id``, else its position in the pool."""
    return cast(Trajectory, cand)["id"] if "id" in cand else index  # the key says it is a trajectory


# No state is both (candidates is list[Trajectory] in one, list[PoolCandidate] in the other, and lists are
# invariant), but mypy's overlap check of generic overloads does not see it.
@overload
def draft_round(  # type: ignore[overload-overlap]
    states: Sequence[_TrajectoryStateT], ctx: StepContext, p: DraftParams, *, kind: str = "draft"
) -> list[tuple[_TrajectoryStateT, Trajectory, int]]: ...


@overload
def draft_round(
    states: Sequence[_PoolStateT], ctx: StepContext, p: DraftParams, *, kind: str = "draft"
) -> list[tuple[_PoolStateT, PoolCandidate, int]]: ...


def draft_round(
    states: Sequence[_AnyPoolStateT], ctx: StepContext, p: DraftParams, *, kind: str = "draft"
) -> list[tuple[_AnyPoolStateT, Any, int]]:
    """Extend every unfinished candidate (pool candidate or trajectory) of every state by one chunk, in
    ONE engine batch (states in order, candidates in pool order). Returns (state, candidate, length
    before) per drafted candidate, in batch order (the candidate typed as the states' candidates)."""
    calls, drafts = draft_calls(states, ctx, p, kind=kind)
    for d, gen in zip(drafts, ctx.generate(calls), strict=True):
        apply_generation(ctx, d.state, d.cand, gen, d.budget, p.max_new_tokens)
    return [(d.state, d.cand, d.before) for d in drafts]


class Draft(NamedTuple):
    """One candidate's chunk of a draft batch: its state, the candidate, its length before, its budget."""

    state: Any
    cand: Any
    before: int
    budget: int


def draft_calls(
    states: Sequence[TrajectoryState | PoolState], ctx: StepContext, p: DraftParams, *, kind: str = "draft"
) -> tuple[list[GenCall], list[Draft]]:
    """The calls of ``draft_round`` without running them (states in order, candidates in pool order), for a
    method that puts them in one engine batch with other calls; apply each with ``apply_generation``."""
    calls: list[GenCall] = []
    drafts: list[Draft] = []
    for state in states:
        for index, cand in enumerate(state["candidates"]):
            if is_finished(cand):
                continue
            call, budget = draft_call(ctx, state, cand, p, cid=candidate_id(cand, index), kind=kind)
            calls.append(call)
            drafts.append(Draft(state, cand, len(cand["tokens"]), budget))
    return calls, drafts


# ---------------------------------------------------------------------------------------------------
# Scoring


def _complete(cand: PoolCandidate, j: int) -> bool:
    """Is tokens[:j] a finished response (not a prefix)?"""
    return j == len(cand["tokens"]) and cand["finish"] in ("eos", "stop")


def score_responses(ctx: StepContext, jobs: Sequence[tuple[ItemState, PoolCandidate]]) -> None:
    """ONE reward batch: ``reward`` = R(question, text) of each candidate's current text."""
    calls = [
        ScoreCall(state, cand["text"], len(cand["tokens"]), finished=_complete(cand, len(cand["tokens"])))
        for state, cand in jobs
    ]
    for (_, cand), r in zip(jobs, ctx.score(calls), strict=True):
        cand["reward"] = r


def new_positions(m: int, old_len: int, new_len: int, eager: bool) -> list[int]:
    """Positions to score after tokens (old_len, new_len] appeared: the end, plus multiples of m if eager."""
    pos = list(range((old_len // m + 1) * m, new_len + 1, m)) if eager else []
    if new_len not in pos:
        pos.append(new_len)
    return pos


def score_positions(ctx: StepContext, jobs: Sequence[tuple[ItemState, Trajectory, Sequence[int]]]) -> None:
    """ONE reward batch: S[j] = R(question, decode(tokens[:j])) for every (state, cand, positions) job;
    ``reward`` becomes S[len(tokens)] when that was scored."""
    calls: list[ScoreCall] = []
    where: list[tuple[Trajectory, int]] = []
    for state, cand, positions in jobs:
        for j in sorted(set(positions)):
            text = cand["text"] if j == len(cand["tokens"]) else ctx.decode(cand["tokens"][:j])
            calls.append(ScoreCall(state, text, j, "scorer", finished=_complete(cand, j)))
            where.append((cand, j))
    for (cand, j), r in zip(where, ctx.score(calls), strict=True):
        cand["S"][str(j)] = r
    for _, cand, _ in jobs:
        end = str(len(cand["tokens"]))
        if end in cand["S"]:
            cand["reward"] = cand["S"][end]


# ---------------------------------------------------------------------------------------------------
# Archive and answer


def archive_entry(cand: Trajectory) -> ArchiveEntry:
    return {
        "id": cand["id"],
        "text": cand["text"],
        "reward": cand["reward"],
        "finish": cand["finish"],
        "round": cand["finished_round"],
        "n_tokens": len(cand["tokens"]),
        "c": cand["c"],
    }


class CandidateEntry(TypedDict, total=False):
    """One candidate of a problem as a method's result lists it (``result()['candidates']``); the runner
    adds the extracted ``answer`` and ``correct`` and applies ``keep_candidates`` (``runner.build_record``)."""

    id: int  # candidate index (fixed pools) or trajectory id (SRD family, speculative rejection)
    text: str
    reward: float | None
    finish: str | None
    n_tokens: int
    status: str  # SRD family / speculative rejection only: kept | discarded
    refined: bool  # SRD family only: the trajectory went through at least one edit


def pool_entries(cands: Sequence[PoolCandidate]) -> list[CandidateEntry]:
    """Every candidate of a fixed pool (sampling, Best-of-N, self-consistency), in index order."""
    return [
        {
            "id": i,
            "text": c["text"],
            "reward": c["reward"],
            "finish": c["finish"],
            "n_tokens": len(c["tokens"]),
        }
        for i, c in enumerate(cands)
    ]


def _entry_fields(e: ArchiveEntry) -> CandidateEntry:
    return {
        "id": e["id"],
        "text": e["text"],
        "reward": e["reward"],
        "finish": e["finish"],
        "n_tokens": e["n_tokens"],
    }


def archive_entries(entries: Sequence[ArchiveEntry], pool: Sequence[Trajectory]) -> list[CandidateEntry]:
    """Every completed trajectory of an SRD-family item (its archive, in the order they finished):
    ``status`` kept when it is still in the final pool (same id and tokens), else discarded; ``refined``
    when it went through at least one edit. Drafts pruned before they finished are not listed."""
    final = {(c["id"], len(c["tokens"]), c["text"]) for c in pool if is_finished(c)}
    return [
        {
            **_entry_fields(e),
            "status": "kept" if (e["id"], e["n_tokens"], e["text"]) in final else "discarded",
            "refined": bool(e.get("c", 0)),
        }
        for e in entries
    ]


def finished_entries(entries: Sequence[ArchiveEntry]) -> list[CandidateEntry]:
    """Speculative rejection: every finished survivor, in the order it finished (drafts rejected before
    they finished are not listed)."""
    return [_entry_fields(e) for e in entries]


def best_completed(entries: Sequence[ArchiveEntry]) -> ArchiveEntry | None:
    """Highest reward; ties → earliest finished round, then lowest id, then earliest listed."""

    def key(item: tuple[int, ArchiveEntry]) -> tuple[float, int, int, int]:
        pos, e = item
        r = e["reward"]
        r = -math.inf if r is None or math.isnan(r) else r
        return (-r, e["round"] if e["round"] is not None else 1 << 30, e["id"], pos)

    if not entries:
        return None
    return min(enumerate(entries), key=key)[1]


#: what a pool method may answer with (``answer``; module doc)
ANSWER_RULES = ("best", "weighted_majority")
ANSWER_HELP = (
    "best (the highest reward) or weighted_majority (the answer whose candidates' rewards sum highest, "
    "answered by its best-scored candidate; rewards must be >= 0)"
)


def check_answer_rule(answer: str) -> None:
    """``ConfigError`` unless ``answer`` is one of ``ANSWER_RULES`` (every method with an ``answer``)."""
    if answer not in ANSWER_RULES:
        raise ConfigError(f"answer must be one of {', '.join(ANSWER_RULES)}, got {answer!r}")


def weighted_winner(classes: Sequence[int | None], rewards: Sequence[float | None]) -> int | None:
    """Index of the first member of the answer class whose rewards sum highest (a NaN or missing reward
    adds nothing; ties: the class seen first); None when no candidate has an answer. ``ValueError`` for a
    negative reward: a vote it weighs would count against its answer."""
    weights = [math.nan if r is None else float(r) for r in rewards]
    negative = [r for r in weights if r < 0]  # NaN < 0 is False
    if negative:
        raise ValueError(
            f"answer=weighted_majority weighs votes by reward, which must be >= 0; this reward gave "
            f"{min(negative):.4g} (use answer=best with a reward that can be negative)"
        )
    return majority(classes, weights)


def entry_classes(ctx: StepContext, entries: Sequence[ArchiveEntry]) -> list[int | None]:
    """The answer classes of archived entries (the task's equivalence, ``StepContext.answer_classes``)."""
    return ctx.answer_classes([ctx.extract_answer(e["text"]) for e in entries])


def choose_answer(
    rule: str, entries: Sequence[ArchiveEntry], classes: Sequence[int | None] | None
) -> ArchiveEntry | None:
    """The answer among archived ``entries`` by an answer rule (module doc): ``best``, ``best_completed``;
    ``weighted_majority``, ``best_completed`` within the class that wins ``weighted_winner`` (``classes``
    aligned with ``entries``; nobody answered: ``best_completed`` over all). The pool methods' answer
    (SRD, rejection sampling, Speculative Rejection)."""
    if rule != "weighted_majority" or not entries:
        return best_completed(entries)
    if classes is None or len(classes) != len(entries):
        raise RuntimeError("answer=weighted_majority needs the answer pool's classes (pool.entry_classes)")
    first = weighted_winner(classes, [e["reward"] for e in entries])
    if first is None:  # no candidate has an answer: the argmax
        return best_completed(entries)
    return best_completed([e for e, c in zip(entries, classes, strict=True) if c == classes[first]])


def answer_now(rule: str, ctx: StepContext, entries: Sequence[ArchiveEntry]) -> tuple[str, float | None]:
    """The (text, reward) a pool method would answer with from ``entries`` now, by ``rule`` (its anytime
    curve's ``current_best``); ``("", None)`` when there is nothing to answer with."""
    classes = entry_classes(ctx, entries) if rule == "weighted_majority" else None
    best = choose_answer(rule, entries, classes)
    return (best["text"], best["reward"]) if best else ("", None)
