"""Runs one shard: batched rounds, a checkpoint after every round, resume from the last checkpoint.

Each round is ONE ``method.step`` over every unfinished item of the shard, so the engine sees one large
batch. When that call raises, ``isolation.py`` splits the batch until the failing item is found; that
item becomes an error row and the others go on (an out-of-memory error first lowers the batch size;
an infrastructure fault still fails the call). After the round, every stepped item's state is
written in one transaction (``ShardStore``); a process that dies at any point restarts from the last
committed round and, because every random draw is seeded from (run seed, item, candidate, round, call
kind), produces the same results as a run that never stopped. When every item is done, the results
are graded and stored (idempotently).

The runner knows nothing about SQL, Celery or S3: the store is injected (``ShardStore`` protocol).
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from srd_worker.engines.base import Engine
from srd_worker.isolation import Isolation, IsolationLog
from srd_worker.methods.base import Method, StepContext
from srd_worker.rewards.base import RewardModel
from srd_worker.tasks.base import Item, Task, grade_candidate

log = logging.getLogger("srdq.runner")

#: Test hook: the process exits abruptly (os._exit, no cleanup) right after committing this round.
CRASH_ENV = "SRDQ_CRASH_AFTER_ROUND"


class ShardStore(Protocol):
    def load_checkpoints(self) -> dict[str, tuple[int, dict[str, Any]]]: ...

    def save_checkpoints(self, round_: int, states: dict[str, dict[str, Any]]) -> None: ...

    def save_results(self, records: list[dict[str, Any]]) -> int: ...


@dataclass
class RoundReport:
    """Progress after one round (for progress bars and status)."""

    round: int
    items_done: int
    items_total: int
    gen_tokens: int
    round_seconds: float
    checkpoint_seconds: float


@dataclass
class ShardOutcome:
    finished: bool
    rounds: int
    records: list[dict[str, Any]] = field(default_factory=list)
    round_seconds: float = 0.0
    checkpoint_seconds: float = 0.0
    isolation: IsolationLog = field(default_factory=IsolationLog)  # item faults, splits, OOM limit


def _prompt_state(method: Method, task: Task, engine: Engine, item: Item) -> dict[str, Any]:
    """A fresh state, or an error state when the prompt cannot fit the model's context."""
    prompt_ids = engine.tokenizer.chat_prompt_ids(task.messages(item))
    if len(prompt_ids) >= engine.max_context:
        return {
            "item_id": item.id,
            "done": True,
            "round": 0,
            "error": f"prompt of {len(prompt_ids)} tokens does not fit the model context of {engine.max_context}",
        }
    return method.init_state(item.id, item.question, prompt_ids)


def _is_done(method: Method, state: dict[str, Any]) -> bool:
    return bool(state.get("error")) or method.done(state)


def candidate_records(
    method: Method, task: Task, item: Item, candidates: Sequence[dict[str, Any]]
) -> list[dict[str, Any]] | None:
    """The record's ``candidates``: each candidate of the method's result with its extracted ``answer``
    (``task.extract_answer``) and ``correct`` (``task.grade``; None when ungraded), kept as the method's
    ``keep_candidates`` parameter says: ``full`` keeps the text, ``answers`` drops it, ``none`` keeps
    nothing (the field is null); ``auto`` is full for up to 64 candidates, else answers."""
    mode_of = getattr(method.params, "candidates_mode", None)
    mode = mode_of(len(candidates)) if mode_of is not None else "full"
    if mode == "none":
        return None
    out = []
    for cand in candidates:
        entry = dict(cand)
        entry["answer"], entry["correct"] = grade_candidate(task, item, cand.get("text") or "")
        if mode != "full":
            entry.pop("text", None)
        out.append(entry)
    return out


def build_record(
    method: Method, task: Task, item: Item, position: int, state: dict[str, Any]
) -> dict[str, Any]:
    """The stored result of one item. Everything here is deterministic except ``timing``."""
    record: dict[str, Any] = {
        "item_id": item.id,
        "position": position,
        "question": item.question,
        "gold": item.gold,
        "method": method.name,
        "response": None,
        "answer": None,
        "correct": None,
        "grader_version": task.grader_version,
        "metrics": {},
        "reward": None,
        "finish_reason": None,
        "ledger": state.get("ledger"),
        "error": state.get("error"),
        "extra": {},
        "candidates": None,
        "timing": state.get("timing"),
    }
    if record["error"]:
        if state.get("fault"):  # isolated by srd_worker.isolation: round, kind, traceback
            record["extra"]["fault"] = state["fault"]
        return record
    try:
        res = dict(method.result(state))
        record["response"] = res.pop("response")
        record["reward"] = res.pop("reward", None)
        record["finish_reason"] = res.pop("finish_reason", None)
        candidates = res.pop("candidates", None)
        record["extra"] = res
        record["answer"] = task.extract_answer(record["response"])
        if candidates is not None:
            record["candidates"] = candidate_records(method, task, item, candidates)
        record["correct"] = None if (graded := task.grade(record["response"], item)) is None else bool(graded)
        record["metrics"] = task.metrics(record["response"], item)
    except Exception as exc:  # one item's grading failure must not stop the run
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["correct"] = None
        record["extra"]["traceback"] = traceback.format_exc(limit=3)
    return record


def run_shard(
    *,
    items: Sequence[Item],
    positions: Sequence[int],
    method: Method,
    task: Task,
    engine: Engine,
    reward: RewardModel | None,
    run_seed: int,
    store: ShardStore,
    max_rounds: int | None = None,
    max_seconds: float | None = None,
    on_round: Callable[[RoundReport], None] | None = None,
) -> ShardOutcome:
    """Run (or resume) a shard until every item is done, or until ``max_rounds`` rounds or
    ``max_seconds`` seconds have passed in this call (checked between rounds), whichever comes first."""
    checkpoints = store.load_checkpoints()
    states: list[dict[str, Any]] = []
    for item in items:
        if item.id in checkpoints:
            states.append(checkpoints[item.id][1])
        else:
            states.append(_prompt_state(method, task, engine, item))
    shard_round = max((r for r, _ in checkpoints.values()), default=0)
    if checkpoints:
        log.info("resuming from checkpointed round %d (%d items checkpointed)", shard_round, len(checkpoints))
    ctx = StepContext(engine, reward, run_seed, extract_answer=task.extract_answer)
    crash_after = int(os.environ.get(CRASH_ENV, "0") or 0)
    outcome = ShardOutcome(finished=False, rounds=shard_round)
    isolation = Isolation()  # one failing item becomes an error row (srd_worker/isolation.py)
    outcome.isolation = isolation.log
    rounds_this_call = 0
    started = time.perf_counter()

    while True:
        active = [s for s in states if not _is_done(method, s)]
        if not active:
            break
        if max_rounds is not None and rounds_this_call >= max_rounds:
            return outcome
        if max_seconds is not None and rounds_this_call and time.perf_counter() - started >= max_seconds:
            return outcome
        t0 = time.perf_counter()
        isolation.step(method, active, ctx)
        t1 = time.perf_counter()
        shard_round += 1
        rounds_this_call += 1
        store.save_checkpoints(shard_round, {s["item_id"]: s for s in active})
        t2 = time.perf_counter()
        outcome.rounds = shard_round
        outcome.round_seconds += t2 - t0
        outcome.checkpoint_seconds += t2 - t1
        if on_round is not None:
            on_round(
                RoundReport(
                    round=shard_round,
                    items_done=sum(_is_done(method, s) for s in states),
                    items_total=len(states),
                    gen_tokens=sum(s.get("ledger", {}).get("gen_tokens", 0) for s in states),
                    round_seconds=t2 - t0,
                    checkpoint_seconds=t2 - t1,
                )
            )
        if crash_after and shard_round == crash_after:
            os._exit(86)

    outcome.records = [
        build_record(method, task, item, pos, state)
        for item, pos, state in zip(items, positions, states, strict=True)
    ]
    store.save_results(outcome.records)
    outcome.finished = True
    return outcome
