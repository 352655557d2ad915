"""Forks (``srdq fork RUN --at-round R --set KEY=VALUE``): a new run that starts from RUN's item states
after round R and goes on with changed parameters, sharing RUN's drafts up to round R.

What may change: what decides after round R (SRD's ``theta_high``/``theta_low``, the refinement
``policy``, ``n_refine``, ``chunk_tokens``, ``scoring_interval``, ``l_max``, ... any method parameter not
listed below) and the ``reward``. What may not, because the states at round R were made with it and the
fork would no longer continue them (``SPEC_FIXED``, ``PARAM_FIXED``): the model, engine, engine settings,
seed, dataset, task, limit, shard layout and method; the drafter's temperature, top-p, top-k; ``n`` (the
budget); ``form``; and ``max_new_tokens`` unless no draft of rounds <= R could have reached either budget.

R counts the runner's rounds (its steps, the rounds checkpoints are written at). For most methods that
is the method's round; SRD's incremental form takes a step to draft, score and route an item and a step
for each refinement wave, so its state at runner round R may be between a routing and its waves (the
queue was decided by the parent; the fork's parameters decide the waves' outcomes). An item's own
routing rounds done by then are its state's ``round`` (the anytime curve's rounds).

The fork's spec is the parent's with the changes and ``forked_from = {run, round}`` (so it hashes to its
own run id, and forking again with the same changes names the same run). Its shards and items are the
parent's; every item's checkpoint is the parent's latest snapshot at or before round R
(``store.forks.round_states``). Randomness after R: the fork keeps the parent's seed, and every draw is
seeded by (seed, item, candidate, the item's own round, call kind) as in any run (``derive_seed``), so
the fork draws after R what the parent drew for the same candidate, round and call (common random numbers),
and forking with no change reproduces the parent's records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from srd_worker.errors import ConfigError
from srd_worker.methods.base import Method
from srd_worker.methods.registry import build_method
from srd_worker.spec import RunSpec
from srd_worker.store import crud, forks
from srd_worker.store.db import session_scope

#: Spec fields a fork keeps from its parent (``--set KEY=...`` is refused), with the reason.
SPEC_FIXED: dict[str, str] = {
    "model": "the drafts up to the fork round were made by the parent's model",
    "engine": "the drafts up to the fork round were made by the parent's engine",
    "engine_config": "the drafts up to the fork round were made with the parent's engine settings",
    "seed": "the fork goes on with the parent's seed (its draws after the fork round are the parent's)",
    "dataset": "a fork runs the parent's items",
    "dataset_sha256": "a fork runs the parent's items",
    "task": "a fork runs the parent's task",
    "fields": "a fork runs the parent's task",
    "task_def": "a fork runs the parent's task",
    "limit": "a fork runs the parent's items",
    "shard_size": "a fork keeps the parent's shards (the batches its states were made in)",
    "method": "the states at the fork round are the parent method's",
    "params": "set the method's parameters one by one",
    "forked_from": "srdq sets it",
}
#: Method parameters that shaped the states up to the fork round.
PARAM_FIXED: dict[str, str] = {
    "n": "the budget: the states hold the parent's n candidates",
    "temperature": "the drafts up to the fork round were sampled at the parent's temperature",
    "top_p": "the drafts up to the fork round were sampled with the parent's top_p",
    "top_k": "the drafts up to the fork round were sampled with the parent's top_k",
    "form": "the states at the fork round are laid out for the parent's form",
    "beam_width": "the states hold the parent's beams",
    "step_delimiter": "the states' steps were cut at the parent's delimiter",
    "draft_model": "the drafts up to the fork round were made by the parent's draft model",
}
#: Methods whose round r drafts at most ``chunk_tokens`` tokens per candidate (``max_new_tokens`` may then
#: change when no candidate could have reached either budget by the fork round).
CHUNKED = ("srd", "rejection_sampling", "speculative_rejection")


@dataclass
class ForkPlan:
    parent_id: str
    at_round: int
    spec: RunSpec
    method: Method
    changed: dict[str, tuple[Any, Any]]  # key -> (the parent's value, the fork's)


@dataclass
class Forked:
    run_id: str
    created: bool
    n_items: int
    n_shards: int
    plan: ForkPlan


def plan_fork(
    parent_id: str, parent_spec: dict[str, Any], at_round: int, overrides: dict[str, str]
) -> ForkPlan:
    """The fork's spec and method, or ``ConfigError`` naming the first key (or round) it refuses. Reads
    nothing but the parent's spec; ``create_fork`` checks the parent's stored rounds."""
    from srd_worker.rewards.registry import check_reward_name
    from srd_worker.wiring import check_spec

    if at_round < 1:
        raise ConfigError(f"--at-round must be >= 1 (a round of run {parent_id}), got {at_round}")
    parent = RunSpec(**parent_spec)
    for key in overrides:
        if key in SPEC_FIXED:
            raise ConfigError(f"--set {key}: a fork cannot change it ({SPEC_FIXED[key]})")
    reward = parent.reward
    if "reward" in overrides:
        value = overrides["reward"]
        reward = None if value.lower() in ("", "none") else value
        if reward is not None:
            check_reward_name(reward)
    param_overrides = {k: v for k, v in overrides.items() if k != "reward"}
    method = build_method(parent.method, {**parent.params, **param_overrides})
    params = method.params.to_dict()
    changed: dict[str, tuple[Any, Any]] = {
        k: (parent.params.get(k), v) for k, v in params.items() if parent.params.get(k) != v
    }
    for key in changed:
        if key in PARAM_FIXED:
            old, new = changed[key]
            raise ConfigError(
                f"--set {key}={new}: a fork cannot change {key} from {old} ({PARAM_FIXED[key]})"
            )
    if "max_new_tokens" in changed:
        _check_budget(parent, at_round, *changed["max_new_tokens"])
    if reward != parent.reward:
        changed["reward"] = (parent.reward, reward)
    check_spec(method, engine=parent.engine, reward=reward)
    spec = RunSpec(
        **{
            **parent.model_dump(),
            "params": params,
            "reward": reward,
            "forked_from": {"run": parent_id, "round": at_round},
        }
    )
    return ForkPlan(parent_id=parent_id, at_round=at_round, spec=spec, method=method, changed=changed)


def _check_budget(parent: RunSpec, at_round: int, old: int, new: int) -> None:
    """``max_new_tokens`` may change only when no candidate could have reached either budget by the fork
    round: each round drafts at most ``chunk_tokens`` tokens (edits never lengthen a candidate), so
    ``at_round * chunk_tokens < min(old, new)`` keeps every draft of rounds <= R the same under both."""
    chunk = int(parent.params.get("chunk_tokens") or 0)
    incremental = parent.params.get("form", "incremental") == "incremental"
    if parent.method in CHUNKED and incremental and chunk > 0 and at_round * chunk < min(old, new):
        return
    raise ConfigError(
        f"--set max_new_tokens={new}: a fork at round {at_round} cannot change max_new_tokens from {old}: "
        f"the drafts of rounds <= {at_round} may depend on it (allowed only for {', '.join(CHUNKED)} "
        f"(incremental form) when {at_round} x chunk_tokens < min(old, new))"
    )


def create_fork(
    db: Engine,
    plan: ForkPlan,
    *,
    versions: dict[str, Any],
    name: str | None = None,
    queue: str | None = None,
) -> Forked:
    """Check the parent's stored rounds and create the fork: run, shards, items, the parent's snapshots up
    to the fork round, and each item's state at that round as its checkpoint, in ONE transaction (a
    refusal writes nothing). A fork that exists already (the same parent, round and changes) is returned
    as it is (``created`` false)."""
    run_id = plan.spec.run_id()
    parent_id, at_round = plan.parent_id, plan.at_round
    with session_scope(db) as session:
        parent = crud.get_run(session=session, run_id=parent_id)
        if _exists(session, run_id):
            run = crud.get_run(session=session, run_id=run_id)
            return Forked(run_id, False, run.n_items, run.n_shards, plan)
        shards = crud.list_shards(session=session, run_id=parent_id)
        furthest = max((s.round for s in shards), default=0)
        if at_round > furthest:
            raise ConfigError(
                f"--at-round {at_round}: run {parent_id} has checkpoints up to round {furthest} only"
            )
        for shard in shards:
            if shard.status != "done" and shard.round < at_round:
                raise ConfigError(
                    f"--at-round {at_round}: shard {shard.index} of run {parent_id} is unfinished and at round "
                    f"{shard.round}: its items have no round-{at_round} checkpoints yet (fork it when it has "
                    "passed that round)"
                )
        forks.insert_fork_run(
            session=session,
            run_id=run_id,
            parent_id=parent_id,
            name=name or f"{parent.name}-fork-r{at_round}",
            spec=plan.spec.stored(),
            config_hash=plan.spec.config_hash(),
            versions=versions,
            at_round=at_round,
            queue=queue,
        )
        for shard in shards:
            states, round_ = _states_at(session, parent_id, shard.index, at_round)
            forks.save_fork_states(
                session=session, run_id=run_id, shard_index=shard.index, round=round_, states=states
            )
        return Forked(run_id, True, parent.n_items, parent.n_shards, plan)


def _exists(session: Any, run_id: str) -> bool:
    from srd_worker.store.queries import run_exists

    return run_exists(session=session, run_id=run_id)


def _states_at(
    session: Any, parent_id: str, shard_index: int, at_round: int
) -> tuple[dict[str, dict[str, Any]], int]:
    """Every checkpointed item's state after round ``at_round`` in one shard of the parent, and the round
    the shard's runner goes on from. An item without any checkpoint was never stepped (its prompt did not
    fit: the fork's runner builds the same error state again)."""
    snapshots = forks.round_states(
        session=session, run_id=parent_id, shard_index=shard_index, at_round=at_round
    )
    latest = forks.checkpoint_rounds(session=session, run_id=parent_id, shard_index=shard_index)
    states: dict[str, dict[str, Any]] = {}
    rounds: list[int] = []
    for key, last in sorted(latest.items()):
        # a snapshot of an earlier round is the state at the fork round only if the item was not stepped
        # after it (it finished then); else the round's own snapshot was not kept
        if key in snapshots and snapshots[key][0] in (at_round, last):
            round_, state = snapshots[key]
        elif last <= at_round:  # not stepped after the fork round: its latest checkpoint is that state
            round_, state = last, forks.checkpoint_state(session=session, run_id=parent_id, item_key=key)
        else:
            raise ConfigError(
                f"--at-round {at_round}: run {parent_id} keeps no round-{at_round} state of item {key!r} "
                "(snapshots are kept for rounds <= SRDQ_SNAPSHOT_ROUNDS, and not by runs stored before "
                "migration 0008)"
            )
        states[key] = state
        rounds.append(round_)
    return states, max(rounds, default=0)


def fork_run(
    db: Engine,
    parent_id: str,
    at_round: int,
    overrides: dict[str, str],
    *,
    versions: dict[str, Any],
    name: str | None = None,
    queue: str | None = None,
) -> Forked:
    """``plan_fork`` over the parent's stored spec, then ``create_fork``."""
    with session_scope(db) as session:
        parent_spec = dict(crud.get_run(session=session, run_id=parent_id).spec)
    plan = plan_fork(parent_id, parent_spec, at_round, overrides)
    return create_fork(db, plan, versions=versions, name=name, queue=queue)
