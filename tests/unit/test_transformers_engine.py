"""Transformers-engine specifics. The Engine contract (order kept, seeds reproducible and batch-independent,
continuation from a prefix equals one-shot generation, stop conditions, EOS, logprobs consistent with
teacher-forced scoring, context refusal) is tested for every engine in tests/unit/test_engine_contract.py."""

from __future__ import annotations

import pytest

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


def _random_requests(vocab: int, lengths: list[int], seeds: list[int], max_new_tokens: int = 24):
    import torch

    g = torch.Generator().manual_seed(sum(lengths) + sum(seeds))
    return [
        GenerationRequest(
            tuple(torch.randint(3, vocab, (length,), generator=g).tolist()),
            SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_new_tokens, seed=seed),
        )
        for length, seed in zip(lengths, seeds, strict=True)
    ]


@pytest.fixture(scope="module")
def bf16_model():
    """The tiny random Llama in bfloat16 (a copy: the shared fp32 fixture must keep its weights)."""
    import torch

    from srd_worker.engines.loading import build_tiny_llama

    model, _tokenizer = build_tiny_llama(seed=0)
    return model.to(torch.bfloat16)


def test_seeded_request_gets_the_same_tokens_whatever_shares_its_batch(tiny_engine, bf16_model):
    """bf16 makes padding noise large enough to flip sampled tokens: 12 seeded requests of one length,
    generated alone and inside a batch with rows of other lengths (and of the same length). On this tiny
    model the row count of a group does not change the kernels; on SmolLM2 it does from 4 rows on, which
    grouping cannot remove (see the engine's docstring and benchmarks/batch_invariance.py)."""
    model = bf16_model
    vocab = model.config.vocab_size
    targets = _random_requests(vocab, [20] * 12, list(range(12)))
    others = _random_requests(vocab, [3, 7, 41, 90, 20], [103, 107, 141, 190, 120])
    results = {}
    for invariant in (True, False):
        engine = TransformersEngine(model, tiny_engine.tokenizer, batch_invariant=invariant)
        alone = [engine.generate([r])[0] for r in targets]
        mixed = engine.generate(others + targets)[len(others) :]
        results[invariant] = (alone, mixed)
    alone, mixed = results[True]
    assert [g.token_ids for g in alone] == [g.token_ids for g in mixed]
    assert [g.finish_reason for g in alone] == [g.finish_reason for g in mixed]
    # the check has teeth: one padded batch does change the tokens of some of these requests
    alone, mixed = results[False]
    assert [g.token_ids for g in alone] != [g.token_ids for g in mixed]


def test_batch_invariant_scoring_is_the_same_alone_and_mixed(tiny_engine, bf16_model):
    model = bf16_model
    engine = TransformersEngine(model, tiny_engine.tokenizer, batch_invariant=True)
    reqs = _random_requests(model.config.vocab_size, [5, 9, 9, 30], [1, 2, 3, 4], max_new_tokens=6)
    pairs = [(r.prompt_ids, tuple(range(10, 16))) for r in reqs]
    together = engine.logprobs(pairs)
    assert together == [engine.logprobs([p])[0] for p in pairs]  # exact, not approximately


def test_batches_group_equal_lengths_in_a_fixed_order(tiny_engine):
    engine = TransformersEngine(
        tiny_engine.model, tiny_engine.tokenizer, max_batch_size=2, batch_invariant=True
    )
    assert engine._batches([5, 3, 5, 5, 3]) == [[1, 4], [0, 2], [3]]
    engine.batch_invariant = False
    assert engine._batches([5, 3, 5, 5, 3]) == [[0, 1], [2, 3], [4]]
