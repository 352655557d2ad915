"""Transformers-engine specifics. The Engine contract (order kept, seeds reproducible and batch-independent,
continuation from a prefix equals one-shot generation, stop conditions, EOS, logprobs consistent with
teacher-forced scoring, context refusal) is tested for every engine in tests/unit/test_engine_contract.py."""

from __future__ import annotations

from srd_worker.engines.base import GenerationRequest, SamplingParams
from srd_worker.engines.transformers_engine import TransformersEngine


def test_max_batch_size_chunks_keep_order_and_results(tiny_engine):
    small = TransformersEngine(tiny_engine.model, tiny_engine.tokenizer, max_batch_size=2)
    texts = ["hello there", "what is 2+2? think", "x", "ducks and eggs", "y"]
    reqs = [
        GenerationRequest(
            tuple(tiny_engine.tokenizer.chat_prompt_ids([{"role": "user", "content": t}])),
            SamplingParams(temperature=1.0, max_new_tokens=6, seed=i, logprobs=True),
        )
        for i, t in enumerate(texts)
    ]
    a, b = tiny_engine.generate(reqs), small.generate(reqs)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    pairs = [(r.prompt_ids, g.token_ids) for r, g in zip(reqs, a, strict=True)]
    for x, y in zip(tiny_engine.logprobs(pairs), small.logprobs(pairs), strict=True):
        assert max(abs(u - v) for u, v in zip(x, y, strict=True)) < 1e-4
