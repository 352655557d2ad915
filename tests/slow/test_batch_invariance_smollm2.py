"""Full batch invariance on SmolLM2-135M-Instruct (bf16), whose CPU kernels switch with the row count (1–3
rows vs 4+): a seeded request gets the same tokens alone and inside a batch with rows of its own prompt
length and of other lengths when every forward pass has ``invariant_rows`` rows, and not when the row
count follows the group (the check has teeth)."""

from __future__ import annotations

import warnings

import pytest

from srd_worker.engines.base import GenerationRequest, SamplingParams

pytestmark = pytest.mark.slow

QUESTIONS = [
    "Tom has 5 apples and eats 2. How many are left?",
    "What is 12 times 13? Explain step by step.",
    "A train goes 60 km per hour for 2 hours. How far does it go?",
]


def _requests(engine, question, seeds):
    prompt = tuple(engine.tokenizer.chat_prompt_ids([{"role": "user", "content": question}]))
    return [
        GenerationRequest(
            prompt, SamplingParams(temperature=0.8, top_p=0.9, top_k=50, max_new_tokens=32, seed=s)
        )
        for s in seeds
    ]


def test_seeded_tokens_do_not_depend_on_the_batch(smollm2_engine_bf16):
    engine = smollm2_engine_bf16
    targets = _requests(engine, QUESTIONS[0], range(6))
    others = _requests(engine, QUESTIONS[0], [100, 101, 102]) + _requests(engine, QUESTIONS[1], [200, 201])
    others += _requests(engine, QUESTIONS[2], [300])
    saved = engine.batch_invariant, engine.invariant_rows
    try:
        engine.batch_invariant = True
        differ = {}
        for rows in (4, 0):
            engine.invariant_rows = rows
            alone = [engine.generate([r])[0].token_ids for r in targets]
            mixed = engine.generate(others[:2] + targets + others[2:])[2 : 2 + len(targets)]
            differ[rows] = sum(a != g.token_ids for a, g in zip(alone, mixed, strict=True))
    finally:
        engine.batch_invariant, engine.invariant_rows = saved
    assert differ[4] == 0  # the guarantee: fixed-row passes give a seeded request the same tokens
    if differ[0] == 0:
        # The control depends on the CPU's kernels, not on srdq: where the row count does not change the
        # kernel's reduction order, nothing diverges even without fixed rows, and the check above is
        # weaker here (it was seen to diverge on other CPUs; not on an AMD EPYC with AVX2).
        warnings.warn(
            "no request diverged with invariant_rows=0 on this CPU: the fixed-row check has no control here",
            stacklevel=1,
        )
