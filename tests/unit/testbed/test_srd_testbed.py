"""SRD on trained models: the testbed policy with its learned reward model refines candidates and keeps
some of the refinements (issue 11: a refinement that actually happens and is kept, on real text).

On SmolLM2 with the arithmetic reward (tests/slow/test_methods_smollm2.py) refinements run but are
rarely kept; the testbed's policy and reward model are trained together, so the editor's τ' can beat
the trajectory it replaces. Deterministic: every draw is seeded."""

from __future__ import annotations

import pytest

from srd_worker.datasets import resolve_dataset
from srd_worker.engines.registry import build_engine
from srd_worker.methods.base import StepContext
from srd_worker.methods.registry import build_method
from srd_worker.rewards.registry import build_reward
from srd_worker.settings import Settings
from srd_worker.tasks.gsm8k import GSM8KTask
from tests.doubles import run_to_done


@pytest.fixture(scope="module")
def testbed():
    settings = Settings()
    engine = build_engine("transformers", "testbed", settings)
    return engine, build_reward("hf-orm:testbed-rm", engine, settings=settings)


def test_srd_keeps_some_refinements_on_the_testbed(testbed):
    engine, reward = testbed
    task = GSM8KTask()
    items = task.load(resolve_dataset("testbed"))[:16]
    method = build_method("srd", {"n": 8, "max_new_tokens": 160})
    ctx = StepContext(engine, reward, 3, extract_answer=task.extract_answer)
    states = [
        method.init_state(it.id, it.question, engine.tokenizer.chat_prompt_ids(task.messages(it)))
        for it in items
    ]
    run_to_done(method, states, ctx, 100)
    stats = [s["stats"] for s in states]
    refinements = sum(st["refinements"] for st in stats)
    kept = sum(st["refine_kept"] for st in stats)
    assert refinements > 0 and kept > 0, (refinements, kept)
    assert sum(sum(st["refine_outcomes"].values()) for st in stats) == refinements
    assert sum(st["refine_outcomes"]["keep"] for st in stats) == kept
    editor_tokens = sum(s["ledger"]["components"]["editor"]["out_tokens"] for s in states)
    assert editor_tokens > 0
