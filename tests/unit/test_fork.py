"""`srdq fork` on the embedded path, on the CPU testbed (its trained policy and learned reward model).

A parent SRD run (n=8, Δ=6 tokens, so items route over 4-5 rounds) is forked at the runner's round 2
(two steps: SRD drafts and routes in a step and runs each refinement wave in a step) with another θ_high. The fork's states at rounds <= 2 are the parent's (the same drafts), its records are those of an
independent in-process run of the same definition (the parent's parameters for two rounds, then the
fork's), its routing equals the parent's up to round 2 and differs after; a fork with no change
reproduces the parent's records (the fork's randomness after R is the parent's). Refusals name the key or
round and write nothing. The deterministic engine mode (no prefix KV reuse, float32) makes records
comparable exactly, as the resume-equality tests do.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from sqlalchemy import text

from srd_worker.engines.registry import build_engine
from srd_worker.errors import ConfigError
from srd_worker.fork import fork_run, plan_fork
from srd_worker.local import fork_local, run_local, versions
from srd_worker.methods.base import StepContext
from srd_worker.methods.registry import build_method
from srd_worker.rewards.registry import build_reward
from srd_worker.runner import build_record, run_shard
from srd_worker.settings import Settings
from srd_worker.spec import prepare_run
from srd_worker.store import crud
from srd_worker.store.db import make_engine, session_scope, sqlite_url, upgrade
from srd_worker.store.shard_store import SqlShardStore
from srd_worker.tasks.gsm8k import GSM8KTask
from tests.cli import run_srdq, srdq_env

PARAMS = {"n": 8, "max_new_tokens": 96, "chunk_tokens": 6}
SEED = 3
LIMIT = 3
# the score cache off: the in-process reference scores everything, and the cache would change the ledger
# (hits) and the reward's batch-mates, and a batched RM's score moves in its last float bits with those
# (tests/unit/testbed/test_score_cache_runs.py covers the cache)
DETERMINISTIC = {
    "SRDQ_KV_REUSE": "false",
    "SRDQ_DTYPE": "float32",
    "SRDQ_DEVICE": "cpu",
    "SRDQ_SCORE_CACHE": "false",
}


def last_round(out: Path, run_id: str) -> int:
    """The furthest round any shard of ``run_id`` reached (what ``srdq fork --at-round`` checks against)."""
    db = make_engine(sqlite_url(out / "srdq.db"))
    try:
        with session_scope(db) as session:
            return max(s.round for s in crud.list_shards(session=session, run_id=run_id))
    finally:
        db.dispose()


@pytest.fixture(scope="module")
def settings() -> Settings:
    return Settings(kv_reuse=False, dtype="float32", device="cpu", score_cache=False)


@pytest.fixture(scope="module")
def engine(settings):
    return build_engine("transformers", "testbed", settings)


def _prepared(settings, **kw):
    return prepare_run(
        dataset="testbed",
        method="srd",
        params=dict(PARAMS),
        model="testbed",
        reward="hf-orm:testbed-rm",
        seed=SEED,
        limit=LIMIT,
        settings=settings,
        **kw,
    )


def records(out: Path, run_id: str) -> list[dict]:
    lines = (out / run_id / "results.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def snapshots(out: Path, run_id: str, max_round: int) -> dict[tuple[str, int], dict]:
    db = make_engine(sqlite_url(out / "srdq.db"))
    try:
        with db.connect() as conn:
            rows = conn.execute(
                text(
                    "select i.item_key, c.round, c.state_z from checkpoint_round c join item i on i.id = c.item_id "
                    "where c.run_id = :r and c.round <= :m"
                ),
                {"r": run_id, "m": max_round},
            ).all()
    finally:
        db.dispose()
    return {(key, r): crud.unpack_state(blob) for key, r, blob in rows}


def run_ids(out: Path) -> list[str]:
    db = make_engine(sqlite_url(out / "srdq.db"))
    try:
        with db.connect() as conn:
            return sorted(r for (r,) in conn.execute(text("select id from run")))
    finally:
        db.dispose()


@pytest.fixture(scope="module")
def parent(tmp_path_factory, settings, engine):
    out = tmp_path_factory.mktemp("fork")
    summary = run_local(_prepared(settings), out_dir=out, settings=settings, engine=engine)
    return out, summary.run_id


@pytest.fixture(scope="module")
def forked(parent, settings, engine):
    out, parent_id = parent
    summary = fork_local(parent_id, 2, {"theta_high": "0.9"}, out_dir=out, settings=settings, engine=engine)
    return out, parent_id, summary.run_id


def _reference(engine, settings) -> list[dict]:
    """The fork's definition run in-process, without the store: the parent's method for two rounds over
    the shard's unfinished items, then the fork's method until every item is done."""
    task = GSM8KTask()
    prepared = _prepared(settings)
    items = list(prepared.items)
    parent_m = build_method("srd", PARAMS)
    fork_m = build_method("srd", {**PARAMS, "theta_high": 0.9})
    reward = build_reward("hf-orm:testbed-rm", engine, settings=settings)
    ctx = StepContext(
        engine, reward, SEED, extract_answer=task.extract_answer, stop=getattr(task, "stop", ())
    )
    states = [
        parent_m.init_state(it.id, it.question, engine.tokenizer.chat_prompt_ids(task.messages(it)))
        for it in items
    ]
    for method, rounds in ((parent_m, 2), (fork_m, 50)):
        for _ in range(rounds):
            active = [s for s in states if not method.done(s)]
            if not active:
                break
            method.step(active, ctx)
    return [build_record(fork_m, task, it, i, s) for i, (it, s) in enumerate(zip(items, states, strict=True))]


def _strip(recs: list[dict]) -> list[dict]:
    """Records without timing and without the anytime curve (the shard runner's, from the per-round
    checkpoints; the in-process reference has none, and the curve is compared with the parent's apart)."""
    out = []
    for r in recs:
        r = {k: v for k, v in r.items() if k != "timing"}
        r["extra"] = {k: v for k, v in (r.get("extra") or {}).items() if k != "anytime"}
        out.append(r)
    return out


def test_fork_shares_the_parents_round_2_states_and_continues_as_a_fresh_run_of_its_definition(
    forked, engine, settings
) -> None:
    out, parent_id, fork_id = forked
    assert fork_id != parent_id
    # the same drafts/states at rounds <= 2: the fork's snapshots are the parent's
    mine, theirs = snapshots(out, fork_id, 2), snapshots(out, parent_id, 2)
    assert mine == theirs and {r for _, r in mine} == {1, 2}
    # the fork's records are those of an independent run of its definition (parent for 2 rounds, then fork)
    ref = json.loads(json.dumps(_strip(_reference(engine, settings))))
    fork_records = records(out, fork_id)
    assert _strip(fork_records) == ref
    # routing is the parent's up to round 2 and differs after, where θ_high changes the KEEP tier
    parent_records = records(out, parent_id)
    differs = 0
    # the runner's round 2 is two steps; an SRD item's own routing rounds done by then are its state's
    # ``round`` (a step drafts and routes, or runs one refinement wave)
    done_at_fork = {key: state["round"] for (key, _), state in sorted(mine.items())}
    assert max(done_at_fork.values()) >= 1
    for p, f in zip(parent_records, fork_records, strict=True):
        k = done_at_fork[p["item_id"]]
        assert f["extra"]["round_log"][:k] == p["extra"]["round_log"][:k]
        # the anytime curve up to the fork's round is the parent's (same states, same tokens)
        assert [pt for pt in f["extra"]["anytime"] if pt["round"] <= k] == [
            pt for pt in p["extra"]["anytime"] if pt["round"] <= k
        ]
        differs += f["extra"]["round_log"][k:] != p["extra"]["round_log"][k:]
    assert differs >= 1
    assert [r["response"] for r in fork_records] != [r["response"] for r in parent_records]
    # the spec: the parent's, with the change and forked_from hashed in
    db = make_engine(sqlite_url(out / "srdq.db"))
    try:
        with session_scope(db) as session:
            spec = crud.get_run(session=session, run_id=fork_id).spec
            parent_spec = crud.get_run(session=session, run_id=parent_id).spec
    finally:
        db.dispose()
    assert spec["forked_from"] == {"run": parent_id, "round": 2}
    assert spec["params"] == {**parent_spec["params"], "theta_high": 0.9}
    assert "forked_from" not in parent_spec
    assert {k: v for k, v in spec.items() if k not in ("params", "forked_from")} == {
        k: v for k, v in parent_spec.items() if k != "params"
    }


def test_a_fork_without_change_reproduces_the_parent(parent, settings, engine) -> None:
    out, parent_id = parent
    summary = fork_local(parent_id, 2, {"theta_high": "0.5"}, out_dir=out, settings=settings, engine=engine)
    assert summary.run_id != parent_id
    assert _strip(records(out, summary.run_id)) == _strip(records(out, parent_id))


def test_compare_paired_on_parent_and_fork(forked) -> None:
    out, parent_id, fork_id = forked
    proc = run_srdq(
        "compare", parent_id, fork_id, "--paired", "--metric", "reward", "--db", str(out), "--json"
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    # every problem paired, nothing that breaks the coupling (same data, seed, limit), and the rewards differ
    assert data["pairs"] == LIMIT and data["notes"] == [], data
    assert data["wins"] + data["losses"] >= 1, data


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (["--set", "model=smollm2"], "--set model: a fork cannot change it"),
        (["--set", "seed=4"], "--set seed: a fork cannot change it"),
        (["--set", "temperature=0.5"], "cannot change temperature from 0.8"),
        (["--set", "n=4"], "cannot change n from 8"),
        (["--set", "max_new_tokens=10"], "cannot change max_new_tokens from 96"),
        (["--set", "form=batch"], "cannot change form from incremental"),
        (["--set", "theta_hgih=0.9"], "unknown parameter 'theta_hgih'"),
        (["--set", "theta_high=2"], "theta_high"),
        (["--set", "theta_high"], "--set expects key=value"),
    ],
)
def test_a_change_that_would_invalidate_the_shared_prefix_is_refused(forked, sets, expected) -> None:
    out, parent_id, _ = forked
    before = run_ids(out)
    proc = run_srdq(
        "fork", parent_id, "--db", str(out), "--at-round", "2", *sets, env=srdq_env(**DETERMINISTIC)
    )
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], proc.stderr
    assert run_ids(out) == before


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--at-round", "99"], "has checkpoints up to round {furthest} only"),
        (["--at-round", "0"], "--at-round must be >= 1"),
        (["--at-round", "2", "--db", "postgresql://x@127.0.0.1/y"], "add --submit"),
    ],
)
def test_a_round_beyond_the_parent_is_refused(forked, args, expected) -> None:
    out, parent_id, _ = forked
    # the parent's last round depends on the CPU's numerics (its dtype and kernels): read it from the store
    furthest = last_round(out, parent_id)
    assert 2 < furthest < 99  # the fork at round 2 was inside the parent, round 99 is beyond it
    expected = expected.format(furthest=furthest)
    before = run_ids(out)
    proc = run_srdq("fork", parent_id, "--db", str(out), *args)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], proc.stderr
    assert run_ids(out) == before


def test_an_unknown_parent_is_refused(forked) -> None:
    out, _, _ = forked
    proc = run_srdq("fork", "run-000000000000", "--db", str(out), "--at-round", "1")
    assert proc.returncode != 0 and "no run 'run-000000000000'" in proc.stderr


def test_max_new_tokens_may_change_when_no_draft_reached_either_budget() -> None:
    spec = {
        "dataset": "testbed",
        "dataset_sha256": "0" * 64,
        "task": "gsm8k",
        "method": "srd",
        "params": build_method("srd", PARAMS).params.to_dict(),
        "model": "testbed",
        "reward": "hf-orm:testbed-rm",
        "shard_size": 3,
    }
    plan = plan_fork("run-aaaaaaaaaaaa", spec, 2, {"max_new_tokens": "200", "policy": "self_compare"})
    assert plan.changed == {"max_new_tokens": (96, 200), "policy": ("reroute_global", "self_compare")}
    with pytest.raises(ConfigError, match="max_new_tokens"):
        plan_fork("run-aaaaaaaaaaaa", spec, 16, {"max_new_tokens": "200"})  # 16 x 6 = 96 tokens reached
    changed = plan_fork("run-aaaaaaaaaaaa", spec, 2, {"reward": "arithmetic"})
    assert changed.spec.reward == "arithmetic" and changed.spec.run_id() != plan.spec.run_id()


def test_an_unfinished_parent_is_forked_only_where_every_item_has_its_round_state(
    tmp_path, settings, engine
) -> None:
    """A parent stopped mid-way (fleet slices of 2 and 1 rounds), keeping no snapshots
    (SRDQ_SNAPSHOT_ROUNDS=0): refused beyond its rounds, at a round a shard has not reached, and at a
    round whose states were not kept; allowed once every item's state at the round exists."""
    prepared = _prepared(settings, shard_size=2)
    spec = prepared.spec
    url = sqlite_url(tmp_path / "srdq.db")
    upgrade(url)
    db = make_engine(url)
    method = build_method("srd", spec.params)
    task = GSM8KTask()
    reward = build_reward("hf-orm:testbed-rm", engine, settings=settings)
    items = list(prepared.items)
    with session_scope(db) as session:
        crud.create_run(
            session=session,
            run_id=spec.run_id(),
            name="partial",
            spec=spec.stored(),
            config_hash=spec.config_hash(),
            versions={},
            items=items,
            shard_size=2,
        )

    def slice_(index: int, rounds: int) -> None:
        part = items[index * 2 : index * 2 + 2]
        run_shard(
            items=part,
            positions=list(range(index * 2, index * 2 + len(part))),
            method=method,
            task=task,
            engine=engine,
            reward=reward,
            run_seed=SEED,
            store=SqlShardStore(db, spec.run_id(), index, snapshot_rounds=0),
            max_rounds=rounds,
        )

    slice_(0, 2)
    slice_(1, 1)
    try:
        for at_round, expected in (
            (3, "has checkpoints up to round 2 only"),
            (2, "shard 1 of run .* is unfinished and at round 1"),
            (1, "keeps no round-1 state of item 'test-1'"),
        ):
            with pytest.raises(ConfigError, match=expected):
                fork_run(db, spec.run_id(), at_round, {"theta_high": "0.9"}, versions=versions())
        assert run_ids(tmp_path) == [spec.run_id()]  # the refusals wrote nothing
        slice_(1, 1)  # shard 1 reaches round 2 too: every item's round-2 state exists (latest checkpoints)
        forked = fork_run(db, spec.run_id(), 2, {"theta_high": "0.9"}, versions=versions())
        assert forked.created
        with session_scope(db) as session:
            shards = crud.list_shards(session=session, run_id=forked.run_id)
            states = crud.load_checkpoints(session=session, run_id=forked.run_id, shard_index=0)
            parent_states = crud.load_checkpoints(session=session, run_id=spec.run_id(), shard_index=0)
        assert [(s.status, s.round) for s in shards] == [("pending", 2), ("pending", 2)]
        assert states == parent_states
        again = fork_run(db, spec.run_id(), 2, {"theta_high": "0.9"}, versions=versions())
        assert again.run_id == forked.run_id and not again.created
    finally:
        db.dispose()


def test_states_round_trip_through_the_snapshot_encoding() -> None:
    state = {"text": "a\x00b", "reward": float("nan"), "ids": [1, 2, 3], "nested": {"S": {"10": -1.5}}}
    back = crud.unpack_state(crud.pack_state(copy.deepcopy(state)))
    assert back["text"] == "a\x00b" and back["ids"] == [1, 2, 3] and back["nested"] == state["nested"]
    assert back["reward"] != back["reward"]  # NaN kept
