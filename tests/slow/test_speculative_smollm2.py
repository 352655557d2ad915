"""Greedy speculative decoding on SmolLM2-135M-Instruct (target, float32) with a layer-truncated copy of
itself as the draft (its first 6 of 30 decoder layers, same embeddings, head and tokenizer): the output
equals the target's own greedy decoding token for token on real prompts."""

from __future__ import annotations

import copy

import pytest

from srd_worker.engines.base import GenerationRequest, SamplingParams
from srd_worker.methods.speculative_rules import LosslessRule
from tests.threads import TORCH_THREADS

pytestmark = pytest.mark.slow

PROMPTS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "Write one sentence about the sea.",
]


def test_greedy_speculative_equals_greedy_with_a_truncated_draft():
    import torch

    pytest.importorskip("gguf")
    from srd_worker.engines.loading import load_model
    from srd_worker.engines.speculative import register_draft
    from srd_worker.engines.transformers_engine import TransformersEngine
    from srd_worker.settings import Settings

    torch.set_num_threads(TORCH_THREADS)
    model, tok = load_model("smollm2", cache_dir=Settings().cache_dir, dtype="float32")
    engine = TransformersEngine(model, tok, model_name="smollm2")
    draft = copy.deepcopy(model)
    draft.model.layers = draft.model.layers[:6]
    draft.config.num_hidden_layers = 6
    register_draft(engine, "smollm2-6-layers", draft, tok)
    reqs = [
        GenerationRequest(
            tuple(engine.tokenizer.chat_prompt_ids([{"role": "user", "content": p}])),
            SamplingParams(temperature=0, max_new_tokens=40),
        )
        for p in PROMPTS
    ]
    ref = engine.generate(reqs)
    out = engine.speculate(reqs, LosslessRule(), draft_model="smollm2-6-layers", gamma=4)
    assert [g.token_ids for g in out] == [g.token_ids for g in ref]
    assert sum(g.stats["accepted"] for g in out) > 0
