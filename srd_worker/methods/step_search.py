"""The step-search machinery shared by reward-guided beam search (``beam_search.py``, ALGORITHMS.md §8.1)
and DVTS (``dvts.py``, §8.2): their parameters, beams and search state, one search step's expansion and
scoring, ranking, the answer rules and the result record. Neither method imports the other.

Paper: Charlie Snell, Jaehoon Lee, Kelvin Xu, Aviral Kumar, "Scaling LLM Test-Time Compute Optimally can
be More Effective than Scaling Model Parameters", arXiv 2408.03314; run as ``huggingface/search-and-learn``
(``sal/search/beam_search.py``) runs it, which is the baseline its users publish against.

A search step extends partial solutions by ONE reasoning step: the engine samples until the step
delimiter (a stop string, ``step_delimiter``), EOS, or ``chunk_tokens`` tokens (the per-step cap), in ONE
engine batch over every item; then every new partial solution is scored in ONE reward batch. A beam's
step scores are the rewards of its prefixes at the end of each of its steps (kept in the trajectory's
``S``, keyed by position); ``aggregation`` turns them into the beam's score (``last``, ``min``, ``prod``).
With the ``hf-prm`` reward (its step separator equal to ``step_delimiter``) the reward of a prefix that
ends on the delimiter is the PRM's score of that last step, so ``S`` holds exactly the PRM's step scores;
no reward in srdq returns the step scores of a text at once, so they are gathered step by step.

The answer: ``best`` (highest aggregated score in the pool; ties: earliest step, then lowest id) or
``weighted_majority`` (the answer class, ``votes.answer_classes`` with the task's equivalence, whose pool
candidates have the largest summed score; its best-scored candidate answers). How each method expands
and keeps beams: ``beam_search.py``, ``dvts.py``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, ClassVar, NotRequired

from srd_worker.engines.base import Generation
from srd_worker.errors import ConfigError
from srd_worker.methods.base import GenCall, ItemState, StepContext, new_state, param
from srd_worker.methods.pool import (
    ArchiveEntry,
    PoolParams,
    Trajectory,
    best_completed,
    check_answer_rule,
    continuation_call,
    finished_entries,
    new_trajectory,
    score_positions,
)
from srd_worker.votes import majority

AGGREGATIONS = ("last", "min", "prod")


def unescape(text: str) -> str:
    """A parameter string with backslash escapes (``\\n``, ``\\t``, ``\\\\``, ``\\u00e9``) made literal;
    other characters are kept as they are."""
    return text.encode("latin-1", "backslashreplace").decode("unicode_escape")


@dataclasses.dataclass(frozen=True)
class SearchParams(PoolParams):
    """Parameters of beam search and DVTS (the drafting parameters of §0.7 plus the search's own)."""

    chunk_tokens: int = param(
        100,
        "per-step token cap: a step ends at step_delimiter, at EOS or after this many tokens (0 = no cap)",
    )
    chunk_tokens_zero: ClassVar[str] = "no per-step cap"
    n: int = param(4, "N: expansions sampled per search step (beam search) / beams over all subtrees (DVTS)")
    beam_width: int = param(
        4, "M: expansions per kept beam (beam search keeps n/M beams) / width of each DVTS subtree"
    )
    max_steps: int = param(
        40, "search steps at most; the last one generates without the delimiter, to EOS or max_new_tokens"
    )
    step_delimiter: str = param(
        "\\n\\n", "stop string that ends a reasoning step, with backslash escapes (\\n is a newline)"
    )
    aggregation: str = param("last", "a beam's score from its step scores: last, min or prod")
    answer: str = param(
        "best",
        "final answer: best (highest aggregated score among finished candidates) or weighted_majority "
        "(the extracted answer with the largest summed score)",
    )

    def validate(self) -> None:
        super().validate()
        if self.beam_width < 1:
            raise ConfigError(f"beam_width must be >= 1, got {self.beam_width}")
        if self.n % self.beam_width:
            raise ConfigError(
                f"n must be a multiple of beam_width, got n={self.n}, beam_width={self.beam_width}"
            )
        if self.max_steps < 1:
            raise ConfigError(f"max_steps must be >= 1, got {self.max_steps}")
        if not self.delimiter:
            raise ConfigError("step_delimiter must not be empty")
        if self.aggregation not in AGGREGATIONS:
            raise ConfigError(
                f"aggregation must be one of {', '.join(AGGREGATIONS)}, got {self.aggregation!r}"
            )
        check_answer_rule(self.answer)

    @property
    def delimiter(self) -> str:
        """``step_delimiter`` with its escapes applied (the stop string sent to the engine)."""
        try:
            return unescape(self.step_delimiter)
        except UnicodeDecodeError as exc:
            raise ConfigError(f"step_delimiter {self.step_delimiter!r} has a bad escape: {exc}") from None


class Beam(Trajectory):
    """A partial solution of one search step (a trajectory: ``S`` holds its step scores by position,
    ``reward`` its aggregated score). ``id`` = step · n + slot; ``parent``: the slot it extends in the
    previous step's beams (-1 at the first step); ``subtree``: its DVTS subtree (0 in beam search);
    ``kept``: selected to be expanded at the next step (DVTS: the subtree's chosen beam)."""

    parent: int
    subtree: int
    kept: bool


class SearchState(ItemState):
    """State of beam search and DVTS (``init_search_state``)."""

    beams: list[Beam]  # the current step's expansions, in slot order
    pool: list[ArchiveEntry]  # the finished candidates, in the order they finished
    chosen: int | None  # pool index of the answer, set when the item is done
    answers: NotRequired[list[str | None]]  # the pool's extracted answers (weighted_majority only)


# ---------------------------------------------------------------------------------------------------
# One search step: expand, score


def aggregate(step_scores: dict[str, float], how: str) -> float:
    """A beam's score from its step scores (``S``, in position order): the last, the minimum or the
    product."""
    values = [step_scores[k] for k in sorted(step_scores, key=int)]
    if not values:
        return math.nan
    if how == "last":
        return values[-1]
    if how == "min":
        return min(values)
    return math.prod(values)


def child_of(parent: Beam | None, *, cid: int, parent_slot: int, subtree: int) -> Beam:
    """A new beam continuing ``parent`` (a copy of its tokens and step scores), or an empty one."""
    beam: Beam = {**new_trajectory(cid), "parent": parent_slot, "subtree": subtree, "kept": False}
    if parent is not None:
        beam["tokens"] = list(parent["tokens"])
        beam["text"] = parent["text"]
        beam["S"] = dict(parent["S"])
    return beam


def apply_step(
    ctx: StepContext,
    state: SearchState,
    beam: Beam,
    gen: Generation,
    budget: int,
    max_new_tokens: int,
    delimiter: str | None,
) -> None:
    """Append one step. Stopping at the step's ``delimiter`` ends the step, not the response; EOS finishes
    it (``eos``), and so does any other stop string, the task's (``stop``, §0.7; on the last step, which
    runs without the delimiter, every stop is the task's); so do the ``max_new_tokens`` cap, a full context
    (fewer tokens than ``budget``) and an empty step (``length``). A step cut at the per-step cap simply
    ends there."""
    beam["tokens"].extend(gen.token_ids)
    beam["text"] = ctx.decode(beam["tokens"])
    if gen.finish_reason == "eos":
        beam["finish"] = "eos"
    elif gen.finish_reason == "stop" and (
        delimiter is None or any(s != delimiter and s in gen.text for s in ctx.stop)
    ):
        beam["finish"] = "stop"
    elif not gen.token_ids or len(beam["tokens"]) >= max_new_tokens:
        beam["finish"] = "length"
    elif gen.finish_reason != "stop" and len(gen.token_ids) < budget:
        beam["finish"] = "length"
    if beam["finish"] is not None:
        beam["finished_round"] = state["round"]


def expand(
    ctx: StepContext,
    p: SearchParams,
    jobs: Sequence[tuple[SearchState, int, Beam | None, int, int]],
) -> list[Beam]:
    """ONE engine batch: for each (state, slot, parent, parent slot, subtree) a child of ``parent``
    extended by one step, seeded by (slot, step, ``step``). The state's last step (``round`` =
    ``max_steps`` − 1) generates without the delimiter, up to ``max_new_tokens``."""
    calls: list[GenCall] = []
    children: list[tuple[SearchState, Beam, int, str | None]] = []
    for state, slot, parent, parent_slot, subtree in jobs:
        child = child_of(parent, cid=state["round"] * p.n + slot, parent_slot=parent_slot, subtree=subtree)
        room = p.max_new_tokens - len(child["tokens"])
        last = state["round"] >= p.max_steps - 1
        budget = room if last or p.chunk_tokens <= 0 else min(p.chunk_tokens, room)
        call = continuation_call(
            ctx,
            state,
            child,
            cid=slot,
            kind="step",
            budget=budget,
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k,
            component="drafter",
        )
        if not last:
            call.params = dataclasses.replace(call.params, stop=(p.delimiter,))
        calls.append(call)
        children.append((state, child, budget, None if last else p.delimiter))
    for (state, child, budget, delimiter), gen in zip(children, ctx.generate(calls), strict=True):
        apply_step(ctx, state, child, gen, budget, p.max_new_tokens, delimiter)
    return [child for _, child, _, _ in children]


def score_beams(ctx: StepContext, p: SearchParams, jobs: Sequence[tuple[SearchState, Beam]]) -> None:
    """ONE reward batch: the step score of every beam's new prefix (``S[len]``, with the finished flag for
    a beam that ended with EOS), then ``reward`` = its aggregated score."""
    score_positions(ctx, [(state, beam, [len(beam["tokens"])]) for state, beam in jobs])
    for _, beam in jobs:
        beam["reward"] = aggregate(beam["S"], p.aggregation)


def rank_key(beam: Beam, slot: int) -> tuple[float, int]:
    """Sort key: higher score first (NaN last), then the lower slot."""
    r = beam["reward"]
    return (math.inf if r is None or math.isnan(r) else -r, slot)


# ---------------------------------------------------------------------------------------------------
# The answer


def weighted_majority(pool: Sequence[ArchiveEntry], classes: Sequence[int | None]) -> int | None:
    """Pool index of the answer: the answer class (``ctx.answer_classes`` of the extracted answers) with
    the largest sum of scores (NaN adds nothing; ties: the class seen first), answered by its
    best-scored candidate (``best_completed`` among them). None when no candidate has an answer."""
    scores = [math.nan if e["reward"] is None else float(e["reward"]) for e in pool]
    first = majority(classes, scores)
    if first is None:
        return None
    members = [i for i, c in enumerate(classes) if c is not None and c == classes[first]]
    best = best_completed([pool[i] for i in members])
    return next(i for i in members if pool[i] is best)


def choose(
    ctx: StepContext, p: SearchParams, pool: Sequence[ArchiveEntry]
) -> tuple[int | None, list[str | None] | None]:
    """(pool index of the answer, the pool's extracted answers for ``weighted_majority`` else None)."""
    chosen: int | None = None
    answers: list[str | None] | None = None
    if p.answer == "weighted_majority":
        answers = [ctx.extract_answer(e["text"]) for e in pool]
        chosen = weighted_majority(pool, ctx.answer_classes(answers))  # None: nobody answered
    if chosen is None and pool:
        best = best_completed(pool)
        chosen = next(i for i, e in enumerate(pool) if e is best)
    return chosen, answers


def finish_item(ctx: StepContext, p: SearchParams, state: SearchState) -> None:
    """Mark the item done and choose its answer from the pool."""
    state["done"] = True
    chosen, answers = choose(ctx, p, state["pool"])
    if answers is not None:
        state["answers"] = answers
    state["chosen"] = chosen


def search_best(ctx: StepContext, p: SearchParams, state: SearchState) -> tuple[str, float | None]:
    """(response, reward) the search would return if stopped now: its choice among the finished beams of
    the pool so far, as ``finish_item`` chooses (the chosen one once the item is done)."""
    pool = state["pool"]
    chosen = state.get("chosen") if state["done"] else choose(ctx, p, pool)[0]
    if chosen is None:
        return "", None
    return pool[chosen]["text"], pool[chosen]["reward"]


def search_result(state: SearchState) -> dict[str, Any]:
    """The result of a finished search: the chosen pool candidate, every pool candidate."""
    pool: list[ArchiveEntry] = state["pool"]
    chosen = state.get("chosen")
    entry = pool[chosen] if chosen is not None else None
    out: dict[str, Any] = {
        "response": entry["text"] if entry else "",
        "reward": entry["reward"] if entry else None,
        "finish_reason": entry["finish"] if entry else None,
        "chosen": chosen,
        "rewards": [e["reward"] for e in pool],
        "steps": state["round"],
    }
    if "answers" in state:
        out["answers"] = state["answers"]
    out["candidates"] = finished_entries(pool)
    return out


def init_search_state(item_id: str, question: str, prompt_ids: Sequence[int]) -> SearchState:
    return {**new_state(item_id, question, prompt_ids), "beams": [], "pool": [], "chosen": None}


# ---------------------------------------------------------------------------------------------------
# Beam search
