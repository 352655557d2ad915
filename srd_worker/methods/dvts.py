"""Diverse Verifier Tree Search (DVTS; ALGORITHMS.md §8.2): N/M independent subtrees, each a greedy
beam of width M by (process) reward score, so the N beams stay diverse.

Source: Edward Beeching, Lewis Tunstall, Sasha Rush, "Scaling test-time compute with open models"
(Hugging Face blog, December 2024), code ``huggingface/search-and-learn``
(``sal/search/diverse_verifier_tree_search.py``). The step machinery (one reasoning step per search
step up to ``step_delimiter``, step scores, aggregation, the answer rules) is shared with beam search
(``step_search.py``).

Per item and step: every subtree j that has not ended samples M (``beam_width``) one-step expansions of
its beam (slots j·M … j·M+M−1; the first step expands the empty response), all subtrees of all items in
ONE engine batch and ONE reward batch; the subtree's beam becomes its best expansion by aggregated score
(ties: the lower slot). A subtree ends when that best expansion has finished (EOS or the
``max_new_tokens`` cap); its finished expansions of that step join the answer pool (search-and-learn
returns the M expansions of each subtree's last step; the unfinished ones among them are left out here,
as they are not answers). The item is done when every subtree has ended; the ``max_steps``-th step
generates without the delimiter, so every subtree ends there.
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


def subtree_beam(state: SearchState, subtree: int) -> tuple[int, Beam] | None:
    """(slot, beam) of subtree ``subtree``'s current beam, None before the first step."""
    for slot, beam in enumerate(state["beams"]):
        if beam["subtree"] == subtree and beam["kept"]:
            return slot, beam
    return None


class DVTS(Method[SearchState, SearchParams]):
    name = "dvts"
    Params = SearchParams
    summary = (
        "diverse verifier tree search: n/M independent subtrees, each a greedy beam of width M by reward"
    )
    needs_reward = True

    def init_state(self, item_id: str, question: str, prompt_ids: Sequence[int]) -> SearchState:
        return init_search_state(item_id, question, prompt_ids)

    def step(self, states: list[SearchState], ctx: StepContext) -> list[SearchState]:
        p: SearchParams = self.params
        m = p.beam_width
        jobs: list[tuple[SearchState, int, Beam | None, int, int]] = []
        for state in states:
            for j in range(p.n // m):
                current = subtree_beam(state, j)
                if current is not None and is_finished(current[1]):
                    continue  # this subtree has ended
                parent_slot, parent = current if current is not None else (-1, None)
                jobs.extend((state, j * m + i, parent, parent_slot, j) for i in range(m))
        children = expand(ctx, p, jobs)
        score_beams(ctx, p, [(job[0], child) for job, child in zip(jobs, children, strict=True)])
        new: dict[int, dict[int, Beam]] = {}
        for (state, slot, *_), child in zip(jobs, children, strict=True):
            new.setdefault(id(state), {})[slot] = child
        for state in states:
            fresh = new.get(id(state), {})
            if not state["beams"]:
                state["beams"] = [fresh[slot] for slot in range(p.n)]
            else:
                for slot, child in fresh.items():
                    state["beams"][slot] = child
            for j in sorted({fresh[slot]["subtree"] for slot in fresh}):
                slots = range(j * m, (j + 1) * m)
                best = min(slots, key=lambda s: rank_key(state["beams"][s], s))
                state["beams"][best]["kept"] = True
                if is_finished(state["beams"][best]):
                    state["pool"].extend(
                        archive_entry(state["beams"][s]) for s in slots if is_finished(state["beams"][s])
                    )
            state["round"] += 1
            ended = all(is_finished(b) for b in state["beams"] if b["kept"])
            if ended or state["round"] >= p.max_steps:
                finish_item(ctx, p, state)
        return states

    anytime = True

    def current_best(self, state: SearchState, ctx: StepContext) -> tuple[str, float | None]:
        return search_best(ctx, self.params, state)

    def result(self, state: SearchState) -> dict[str, Any]:
        return search_result(state)
