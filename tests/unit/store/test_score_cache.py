"""The score cache (``store.score_cache``, ``provenance.score_identity``, ``StepContext.score``): what its key
pins, that a hit returns the identical score and is counted apart from reward calls, and that an older store
upgrades to it. On the CPU testbed's trained policy and learned reward model (real models, no doubles)."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, func
from sqlmodel import select

from srd_worker.engines.registry import build_engine
from srd_worker.methods.base import ScoreCall, StepContext, new_state
from srd_worker.paths import TESTBED_ARTIFACTS_DIR
from srd_worker.provenance import score_cache, score_identity
from srd_worker.rewards.hf_orm import HFOutcomeReward
from srd_worker.rewards.registry import build_reward
from srd_worker.settings import Settings
from srd_worker.store import crud
from srd_worker.store.db import make_engine, session_scope, sqlite_url, upgrade
from srd_worker.store.models import ScoreCacheRow
from srd_worker.store.score_cache import SqlScoreCache, score_key
from tests.store_cases import make_items

RM = "hf-orm:testbed-rm"
QUESTION = "Tom has 3 apples and buys 4 more. How many apples does he have?"


@pytest.fixture(scope="module")
def testbed() -> tuple[object, object]:
    settings = Settings()
    engine = build_engine("transformers", "testbed", settings)
    return engine, build_reward(RM, engine, settings=settings)


@pytest.fixture
def db(tmp_path: Path) -> Engine:
    url = sqlite_url(tmp_path / "srdq.db")
    upgrade(url)
    engine = make_engine(url)
    yield engine
    engine.dispose()


def spec(reward: str = RM) -> SimpleNamespace:
    return SimpleNamespace(reward=reward, model="testbed", engine="transformers", engine_config={})


def rows(db: Engine) -> int:
    with session_scope(db) as session:
        return session.exec(select(func.count()).select_from(ScoreCacheRow)).one()


def test_score_key_pins_every_field() -> None:
    base = score_key("rm-a", "q", "4 + 3 = 7", False)
    assert base == score_key("rm-a", "q", "4 + 3 = 7", False) and len(base) == 64
    others = {
        score_key("rm-b", "q", "4 + 3 = 7", False),  # another reward identity
        score_key("rm-a", "q2", "4 + 3 = 7", False),  # another question
        score_key("rm-a", "q", "4 + 3 = 8", False),  # one character of the response
        score_key("rm-a", "q", "4 + 3 = 7", True),  # finished
        score_key("rm-a", "q4", " + 3 = 7", False),  # the same bytes split differently
    }
    assert base not in others and len(others) == 5


def test_identity_pins_revision_params_and_reward(testbed, tmp_path: Path) -> None:
    engine, reward = testbed
    settings = Settings()
    ident = score_identity(spec(), engine, reward, settings=settings)
    assert ident is not None and ident["reward"]["revision"].startswith("sha256:")
    assert ident["params"]["model_dtype"] == str(reward.model.dtype)
    assert score_identity(spec(), engine, reward, settings=settings)["hash"] == ident["hash"]  # stable
    # another revision of the same reward model: one byte of its config changed
    copy = tmp_path / "rm"
    shutil.copytree(TESTBED_ARTIFACTS_DIR / "rm", copy)
    (copy / "config.json").write_text((copy / "config.json").read_text().replace("{", '{"x": 1, ', 1))
    other = HFOutcomeReward(str(copy), device="cpu", dtype=reward.model.dtype)
    moved = score_identity(spec(f"hf-orm:{copy}"), engine, other, settings=settings)
    assert moved is not None and moved["reward"]["revision"] != ident["reward"]["revision"]
    assert moved["hash"] != ident["hash"]
    # the same weights with another parameter (a system prompt) or another dtype
    prompted = HFOutcomeReward(
        str(TESTBED_ARTIFACTS_DIR / "rm"), device="cpu", dtype=reward.model.dtype, system="x"
    )
    assert score_identity(spec(), engine, prompted, settings=settings)["hash"] != ident["hash"]
    dtype = "float32" if "bfloat16" in str(reward.model.dtype) else "bfloat16"
    recast = HFOutcomeReward(str(TESTBED_ARTIFACTS_DIR / "rm"), device="cpu", dtype=dtype)
    assert score_identity(spec(), engine, recast, settings=settings)["hash"] != ident["hash"]
    # another reward altogether; the policy's own logprob reward names the policy's revision
    arith = score_identity(spec("arithmetic"), engine, build_reward("arithmetic", engine), settings=settings)
    logprob = score_identity(spec("logprob"), engine, build_reward("logprob", engine), settings=settings)
    assert len({ident["hash"], arith["hash"], logprob["hash"]}) == 3
    assert logprob["policy"]["model"]["revision"].startswith("sha256:")


def test_unpinned_reward_or_switch_off_means_no_cache(testbed, db: Engine) -> None:
    engine, reward = testbed
    assert score_cache(db, spec(), engine, reward, settings=Settings(score_cache=False)) is None
    assert score_cache(db, spec(), engine, None, settings=Settings()) is None
    # a reward model this machine cannot pin (a hub id not in the local cache) is not cached
    assert score_identity(spec("hf-orm:nobody/not-cached-rm"), engine, reward, settings=Settings()) is None
    assert isinstance(score_cache(db, spec(), engine, reward, settings=Settings()), SqlScoreCache)


def _calls(state, texts, tokens):
    return [ScoreCall(state, t, len(ids)) for t, ids in zip(texts, tokens, strict=True)]


def test_hit_returns_identical_score_and_is_not_a_reward_call(testbed, db: Engine) -> None:
    engine, reward = testbed
    ident = score_identity(spec(), engine, reward, settings=Settings())
    tok = engine.tokenizer
    ids = [tok.encode("3 + 4 = 7. The answer is 7."), tok.encode("3 + 4 = 8. The answer is 8.")]
    texts = [tok.decode(i) for i in ids]

    cold = StepContext(engine, reward, 0, score_cache=SqlScoreCache(db, ident["hash"]))
    s1 = new_state("a", QUESTION, [1, 2])
    first = cold.score(_calls(s1, texts, ids))
    cold.score_cache.flush()
    assert (s1["ledger"]["rm_calls"], s1["ledger"]["rm_cache_hits"]) == (2, 0) and rows(db) == 2
    assert first == reward.score([QUESTION] * 2, texts)  # what the reward gives without a cache

    # a new process (a new cache object) on the same store: identical floats, no reward call
    warm = StepContext(engine, reward, 0, score_cache=SqlScoreCache(db, ident["hash"]))
    s2 = new_state("b", QUESTION, [1, 2])
    assert warm.score(_calls(s2, texts, ids)) == first
    led = s2["ledger"]
    assert (led["rm_calls"], led["rm_tokens"], led["rm_cache_hits"]) == (0, 0, 2)
    assert led["rm_cache_hit_tokens"] == sum(len(i) for i in ids)
    assert led["components"]["scorer"] == {"calls": 0, "in_tokens": 0, "out_tokens": 0}

    # one changed token misses (and is scored by the reward); another reward identity misses everything
    changed = list(ids[0])
    changed[-2] = tok.encode(" 9")[-1] if changed[-2] != tok.encode(" 9")[-1] else tok.encode(" 6")[-1]
    s3 = new_state("c", QUESTION, [1, 2])
    got = warm.score(_calls(s3, [tok.decode(changed), texts[1]], [changed, ids[1]]))
    assert (s3["ledger"]["rm_calls"], s3["ledger"]["rm_cache_hits"]) == (1, 1)
    assert got[0] == reward.score([QUESTION], [tok.decode(changed)])[0] and got[1] == first[1]
    other = StepContext(engine, reward, 0, score_cache=SqlScoreCache(db, "another-revision"))
    s4 = new_state("d", QUESTION, [1, 2])
    other.score(_calls(s4, texts, ids))
    assert (s4["ledger"]["rm_calls"], s4["ledger"]["rm_cache_hits"]) == (2, 0)


def test_repeats_within_a_batch_are_scored_once(testbed, db: Engine) -> None:
    engine, reward = testbed
    ctx = StepContext(engine, reward, 0, score_cache=SqlScoreCache(db, "rm"))
    state = new_state("a", QUESTION, [1])
    got = ctx.score([ScoreCall(state, "3 + 4 = 7", 5), ScoreCall(state, "3 + 4 = 7", 5)])
    assert got[0] == got[1] and (state["ledger"]["rm_calls"], state["ledger"]["rm_cache_hits"]) == (1, 1)
    assert rows(db) == 0  # nothing is written before the round's checkpoint (flush)
    ctx.score_cache.flush()
    assert rows(db) == 1


def test_an_older_store_upgrades_and_its_checkpoints_still_score(testbed, tmp_path: Path) -> None:
    """A store at revision 0006 (the one before the cache): the upgrade adds the table, the stored run and its
    checkpoint (a ledger without the hit counters) are read back and go on counting hits. The run is written
    by this srdq, then the store is taken down to 0006 (today's models name columns 0006 lacks)."""
    engine, reward = testbed
    url = sqlite_url(tmp_path / "old.db")
    config = Config()
    import importlib.resources

    with importlib.resources.as_file(importlib.resources.files("srdq_migrations")) as location:
        config.set_main_option("script_location", str(location))
        config.set_main_option("sqlalchemy.url", url)
        command.upgrade(config, "head")
    db = make_engine(url)
    try:
        old_state = new_state("q0", QUESTION, [1])
        for key in ("rm_cache_hits", "rm_cache_hit_tokens"):
            del old_state["ledger"][key]
        with session_scope(db) as session:
            crud.create_run(
                session=session,
                run_id="run-old",
                name="old",
                spec={},
                config_hash="h",
                versions={},
                items=make_items(1),
                shard_size=1,
            )
            crud.save_checkpoints(
                session=session, run_id="run-old", shard_index=0, round=1, states={"q0": old_state}
            )
        with importlib.resources.as_file(importlib.resources.files("srdq_migrations")) as location:
            config.set_main_option("script_location", str(location))
            command.downgrade(config, "0006")
        before, after = upgrade(url)
        assert before == "0006" and after >= "0007"  # the cache came with 0007; later revisions follow it
        with session_scope(db) as session:
            (_, state) = crud.load_checkpoints(session=session, run_id="run-old", shard_index=0)["q0"]
        cache = SqlScoreCache(db, "rm")
        cache.add({cache.key(QUESTION, "3 + 4 = 7", False): 1.25})
        cache.flush()
        got = StepContext(engine, reward, 0, score_cache=cache).score([ScoreCall(state, "3 + 4 = 7", 5)])
        assert got == [1.25] and state["ledger"]["rm_cache_hits"] == 1 and state["ledger"]["rm_calls"] == 0
    finally:
        db.dispose()


def test_a_store_without_the_table_turns_the_cache_off(testbed, tmp_path: Path) -> None:
    """A fleet database not upgraded yet: the run goes on, every score computed, a warning logged."""
    engine, reward = testbed
    db = make_engine(sqlite_url(tmp_path / "empty.db"))
    try:
        cache = SqlScoreCache(db, "rm")
        state = new_state("a", QUESTION, [1])
        got = StepContext(engine, reward, 0, score_cache=cache).score([ScoreCall(state, "3 + 4 = 7", 5)])
        assert got == reward.score([QUESTION], ["3 + 4 = 7"]) and state["ledger"]["rm_calls"] == 1
        assert cache.enabled is False
    finally:
        db.dispose()
