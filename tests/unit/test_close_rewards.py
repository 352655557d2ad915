"""A run that built its engine closes the rewards it built too: a judge on vLLM (``SRDQ_JUDGE_ENGINE=vllm``)
holds vLLM processes of its own, which ``srdq run`` and a sweep shut down with the policy's engine instead
of leaving them to interpreter exit. One judge serves every point of a sweep and is closed once, at its end.
Here the judge runs on the transformers engine (the same code path; no vLLM needed)."""

from __future__ import annotations

import pytest

from srd_worker.local import run_local
from srd_worker.rewards import registry
from srd_worker.rewards.lm_judge import LMJudgeReward
from srd_worker.settings import Settings
from srd_worker.spec import prepare_run

pytestmark = pytest.mark.unit

JUDGE = "judge:tiny-random-llama"


@pytest.fixture
def closes(monkeypatch):
    """The judge rewards closed, in order (LMJudgeReward.close still runs)."""
    registry.close_rewards()
    seen: list[LMJudgeReward] = []
    real = LMJudgeReward.close

    def close(self: LMJudgeReward) -> None:
        seen.append(self)
        real(self)

    monkeypatch.setattr(LMJudgeReward, "close", close)
    yield seen
    registry.close_rewards()


def _prepare(tmp_path, datasets_dir):
    settings = Settings(
        cache_dir=tmp_path / "cache", device="cpu", dtype="float32", judge_engine="transformers"
    )
    prepared = prepare_run(
        dataset=datasets_dir / "gsm8k_test.jsonl",
        method="best_of_n",
        params={"n": 2, "max_new_tokens": 8},
        model="tiny-random-llama",
        reward=JUDGE,
        limit=2,
        shard_size=2,
        settings=settings,
    )
    return settings, prepared


def _judges() -> list[LMJudgeReward]:
    return [r for r in registry._BUILT.values() if isinstance(r, LMJudgeReward)]


def test_srdq_run_closes_the_judge_it_built(tmp_path, datasets_dir, closes):
    settings, prepared = _prepare(tmp_path, datasets_dir)
    during: list[list[LMJudgeReward]] = []
    summary = run_local(
        prepared, out_dir=tmp_path / "out", settings=settings, on_round=lambda _: during.append(_judges())
    )
    assert summary.done == 2
    [judge] = during[-1]  # the run scored with a judge of its own ...
    assert judge.separate
    assert closes == [judge] and not registry._BUILT  # ... closed and forgotten when the run ended


def test_a_run_on_a_lent_engine_leaves_the_rewards_to_its_caller(tmp_path, datasets_dir, closes, tiny_engine):
    settings, prepared = _prepare(tmp_path, datasets_dir)
    run_local(prepared, out_dir=tmp_path / "out", settings=settings, engine=tiny_engine)
    [judge] = _judges()  # still open: the caller (a sweep, a benchmark) may run more with it
    assert closes == []
    registry.close_rewards()
    assert closes == [judge]


def test_a_sweep_shares_one_judge_and_closes_it_once(tmp_path, datasets_dir, closes):
    from srd_worker.sweep import plan_sweep, run_sweep_local

    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        f"dataset: {datasets_dir / 'gsm8k_test.jsonl'}\nmodel: tiny-random-llama\nreward: {JUDGE}\nlimit: 2\n"
        "seeds: [0, 1]\nmethods:\n  - method: best_of_n\n    n: 2\n    params: {max_new_tokens: 8}\n",
        encoding="utf-8",
    )
    settings = Settings(
        cache_dir=tmp_path / "cache", device="cpu", dtype="float32", judge_engine="transformers"
    )
    seen: list[list[LMJudgeReward]] = []
    results = run_sweep_local(
        plan_sweep(sweep),
        out_dir=tmp_path / "out",
        settings=settings,
        on_done=lambda _: seen.append(_judges()),
    )
    assert len(results) == 2
    [a], [b] = seen
    assert a is b  # one judge for both points ...
    assert closes == [a] and not registry._BUILT  # ... closed once, when the sweep ended
