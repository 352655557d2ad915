"""Reward-guided beam search over reasoning steps (ALGORITHMS.md §8.1); the step-search machinery it shares
with DVTS (``dvts.py``, §8.2) is ``step_search.py``.

Paper: Charlie Snell, Jaehoon Lee, Kelvin Xu, Aviral Kumar, "Scaling LLM Test-Time Compute Optimally can
be More Effective than Scaling Model Parameters", arXiv 2408.03314; run as ``huggingface/search-and-learn``
runs it. What a search step is (one reasoning step per beam, step scores, aggregation, the answer rules):
``step_search.py``.

Beam search, per item and step: N = ``n`` expansions of the beams kept at the previous step (the first
step samples N from the empty response), each kept beam expanded ``beam_width`` (M) times (when fewer
than N/M beams are kept, the N expansions are dealt round-robin over them, as search-and-learn
duplicates its active beams); the expansions that finished (EOS, or the ``max_new_tokens`` cap) join the
answer pool, the best N/M unfinished ones by aggregated score are kept (ties: the lower slot). The search
ends when the pool holds N candidates (search-and-learn answers from the first N beams to finish), when
no beam is left unfinished, or after ``max_steps`` steps (the last one generates without the delimiter,
to EOS or ``max_new_tokens``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from srd_worker.methods.base import Method, StepContext
from srd_worker.methods.pool import archive_entry, is_finished
from srd_worker.methods.step_search import (
    Beam,
    SearchParams,
    SearchState,
    expand,
    finish_item,
    init_search_state,
    rank_key,
    score_beams,
    search_best,
    search_result,
)


class BeamSearch(Method[SearchState, SearchParams]):
    name = "beam_search"
    Params = SearchParams
    summary = (
        "step-level beam search: keep the n/M best partial solutions by (process) reward, expand each M "
        "times per step"
    )
    needs_reward = True

    def init_state(self, item_id: str, question: str, prompt_ids: Sequence[int]) -> SearchState:
        return init_search_state(item_id, question, prompt_ids)

    def step(self, states: list[SearchState], ctx: StepContext) -> list[SearchState]:
        p: SearchParams = self.params
        jobs: list[tuple[SearchState, int, Beam | None, int, int]] = []
        for state in states:
            if state["round"] == 0:
                parents: list[tuple[int, Beam | None]] = [(-1, None)]
            else:
                parents = [(i, b) for i, b in enumerate(state["beams"]) if b["kept"]]
            for slot in range(p.n):
                parent_slot, parent = parents[slot % len(parents)]
                jobs.append((state, slot, parent, parent_slot, 0))
        children = expand(ctx, p, jobs)
        pairs = [(job[0], child) for job, child in zip(jobs, children, strict=True)]
        score_beams(ctx, p, pairs)
        keep = p.n // p.beam_width
        for state in states:
            beams = [child for s, child in pairs if s is state]
            state["beams"] = beams
            for beam in beams:
                if is_finished(beam) and len(state["pool"]) < p.n:
                    state["pool"].append(archive_entry(beam))
            unfinished = sorted(
                (slot for slot, b in enumerate(beams) if not is_finished(b)),
                key=lambda slot: rank_key(beams[slot], slot),
            )
            for slot in unfinished[:keep]:
                beams[slot]["kept"] = True
            state["round"] += 1
            if len(state["pool"]) >= p.n or not unfinished or state["round"] >= p.max_steps:
                finish_item(ctx, p, state)
        return states

    anytime = True

    def current_best(self, state: SearchState, ctx: StepContext) -> tuple[str, float | None]:
        return search_best(ctx, self.params, state)

    def result(self, state: SearchState) -> dict[str, Any]:
        return search_result(state)
