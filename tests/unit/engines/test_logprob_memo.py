"""Teacher-forced scoring that reads vLLM's prefix cache (``PrefixLogprobs``, ``VLLMEngine.logprobs``).

vLLM returns prompt logprobs only past a cache hit, so the tokens the hit covers come from remembered
sequences; a hit past what is remembered is scored again without the cache. Driven through the fake
vLLM of ``fake_vllm.py`` with a prefix cache of 4-token blocks, its logprobs from a real tiny Llama: every
score must equal a full teacher-forced pass of the same model.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from srd_worker.engines.base import GenerationRequest, SamplingParams
from srd_worker.engines.logprob_memo import PrefixLogprobs, prefix_roots
from tests.unit.engines import fake_vllm

pytestmark = pytest.mark.unit


def test_memo_finds_a_sequence_sharing_the_block_aligned_prefix_and_evicts_the_oldest():
    memo = PrefixLogprobs(block_size=4, capacity=2)
    a = list(range(10, 23))  # 13 tokens: blocks end at 4, 8, 12
    memo.remember(a, [math.nan] + [-float(t) for t in a[1:]])
    # a sequence sharing a's first 9 tokens reads tokens 1 … 8 of a; one sharing only 8 cannot
    got = memo.lookup([*a[:9], 99, 98], 8)
    assert got is not None and len(got) == 9 and got[1:] == [-float(t) for t in a[1:9]]
    assert memo.lookup([*a[:8], 99, 98, 97], 8) is None
    assert memo.lookup(a, 6) is None  # not a block boundary: never a vLLM hit
    assert memo.lookup(a, 13) is None and memo.lookup(a, 0) == [0.0]
    b, c = [1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]
    memo.remember(b, [0.0] * 6)
    memo.remember(c, [0.0] * 6)  # capacity 2: a, the least recently used, goes
    assert len(memo) == 2 and memo.lookup(a, 8) is None and memo.lookup(c, 4) == [0.0] * 5
    with pytest.raises(ValueError, match="3 logprobs for 6 tokens"):
        memo.remember(b, [0.0] * 3)
    with pytest.raises(ValueError, match="block_size"):
        PrefixLogprobs(0)


@pytest.fixture
def cached(tiny_engine):
    from srd_worker.engines.vllm_engine import VLLMEngine

    with fake_vllm.installed(backend=tiny_engine, cache_block=4) as vllm:
        yield VLLMEngine(vllm.LLM(model="tiny", enable_prefix_caching=True), tiny_engine.tokenizer)


def _same(engine, tiny_engine, pairs) -> bool:
    """``engine``'s scores of ``pairs`` equal a full teacher-forced pass of the tiny Llama."""
    got, want = engine.logprobs(pairs), tiny_engine.logprobs(pairs)
    assert [len(r) for r in got] == [len(c) for _, c in pairs]
    return [x for r in got for x in r] == pytest.approx([x for r in want for x in r], abs=1e-5)


def test_a_growing_response_is_scored_past_the_cache_hit_and_equals_a_full_pass(cached, tiny_engine):
    p = tuple(cached.tokenizer.chat_prompt_ids([{"role": "user", "content": "What is 6 times 7?"}]))
    r = tuple(range(70, 100))
    pairs = [(p, r[:10]), (p, r[:16])]
    assert _same(cached, tiny_engine, pairs)
    calls, reused = len(cached.llm.calls), cached.stats.reused_tokens
    # the response grows: one call, reading the blocks scored before, the same logprobs as a full pass
    grown = [(p, r[:30]), (p, (*r[:12], 5, 6, 7, 8, 9))]  # the second: a suffix regenerated after token 12
    assert _same(cached, tiny_engine, grown)
    assert len(cached.llm.calls) == calls + 1 and not cached.llm.calls[-1][1][0].skip_reading_prefix_cache
    # both hits reach into the responses scored before (at least 9 and 13 tokens past the prompt)
    assert cached.stats.reused_tokens - reused > 2 * len(p) + 16
    assert cached.llm.calls[-1][1][0].detokenize is False


def test_a_hit_nobody_scored_is_scored_again_without_the_cache(cached, tiny_engine):
    """A generation fills the cache with prompt + completion; scoring that sequence hits blocks whose
    logprobs no scoring remembers, so that request is re-run with the cache skipped."""
    p = tuple(cached.tokenizer.chat_prompt_ids([{"role": "user", "content": "hi"}]))
    (g,) = cached.generate([GenerationRequest(p, SamplingParams(temperature=0.0, max_new_tokens=12))])
    other = (p, (3, 4, 5))  # shares only the prompt's blocks: served from the cache, no re-run
    pairs = [(p, tuple(g.token_ids)), other]
    calls = len(cached.llm.calls)
    assert _same(cached, tiny_engine, pairs)
    retry_prompts, retry_params = cached.llm.calls[-1]
    assert len(cached.llm.calls) == calls + 2 and retry_params[0].skip_reading_prefix_cache
    assert retry_prompts == [{"prompt_token_ids": [*p, *g.token_ids]}]


def test_without_a_prefix_cache_every_scoring_is_a_full_pass(tiny_engine):
    from srd_worker.engines.vllm_engine import VLLMEngine

    with fake_vllm.installed(backend=tiny_engine, cache_block=4) as vllm:
        engine = VLLMEngine(vllm.LLM(model="tiny", enable_prefix_caching=False), tiny_engine.tokenizer)
        p = tuple(engine.tokenizer.chat_prompt_ids([{"role": "user", "content": "hi"}]))
        pairs = [(p, (7, 8, 9, 10, 11)), (p, (7, 8, 9, 10, 11, 12, 13))]
        for _ in range(2):
            assert _same(engine, tiny_engine, pairs)
            assert engine.llm.calls[-1][1][0].skip_reading_prefix_cache
        assert engine.stats.reused_tokens == 0


def test_a_judges_answers_after_one_prompt_are_one_request_for_its_next_token(cached, tiny_engine):
    """One-token continuations of one prefix (a judge's "Yes" / "No" spellings) are read from the top
    logprobs of the prefix's next token: one request per prefix, no prompt logprobs; an answer outside
    the top returned is scored alone, and every value equals a full teacher-forced pass."""
    p = tuple(cached.tokenizer.chat_prompt_ids([{"role": "user", "content": "Is 2 + 2 = 4?"}]))
    top = cached._next_token_logprobs([p])[0]
    assert len(top) == cached.next_token_top_k
    inside = sorted(top, key=top.get)[:3]
    outside = next(t for t in range(10, 1000) if t not in top)
    pairs = [(p, (t,)) for t in [*inside, outside]] + [(p, (7, 8)), ((*p, 9), (inside[0],))]
    calls = len(cached.llm.calls)
    assert _same(cached, tiny_engine, pairs)
    judged, *scored = cached.llm.calls[
        calls:
    ]  # then the rest (re-run without the cache where a hit needs it)
    assert [q["prompt_token_ids"] for q in judged[0]] == [list(p)] and judged[1][0].prompt_logprobs is None
    assert judged[1][0].logprobs == 20 and judged[1][0].max_tokens == 1
    asked = {tuple(q["prompt_token_ids"]) for prompts, _ in scored for q in prompts}
    assert asked == {(*p, outside), (*p, 7, 8), (*p, 9, inside[0])}
    cached.next_token_top_k = 0  # off: every pair its own scoring
    calls = len(cached.llm.calls)
    assert _same(cached, tiny_engine, pairs[:2])
    assert all(params[0].prompt_logprobs for _prompts, params in cached.llm.calls[calls:])
    cached.next_token_top_k = 20
    cached.llm.llm_engine.model_config.max_logprobs = 5  # an engine built with max_logprobs=5
    assert len(cached._next_token_logprobs([p])[0]) == 5 and cached.llm.calls[-1][1][0].logprobs == 5


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), max_size=6), max_size=12))
def test_each_sequence_is_read_from_a_longest_sequence_that_starts_with_it(seqs):
    root = prefix_roots(seqs)
    assert len(root) == len(seqs)
    for i, r in enumerate(root):
        assert seqs[r][: len(seqs[i])] == seqs[i]  # the root starts with the sequence
        assert root[r] == r  # and is its own root: a prefix of no other sequence but its equals
        assert not any(len(t) > len(seqs[r]) and t[: len(seqs[r])] == seqs[r] for t in seqs)
    # equal sequences share one root
    assert all(root[i] == root[j] for i, s in enumerate(seqs) for j, t in enumerate(seqs) if s == t)


def test_prefixes_of_one_response_scored_together_are_one_request(cached, tiny_engine):
    """SRD's boundary search scores prefixes of one response in one call: only the longest is sent, the
    others read from its pass (also one whose prompt holds part of the response), each equal to a full
    pass; a sequence no other one starts with is still sent."""
    p = tuple(cached.tokenizer.chat_prompt_ids([{"role": "user", "content": "Count from 30."}]))
    r = tuple(range(30, 56))
    pairs = [(p, r[:8]), (p, r), (p, r[:20]), ((*p, *r[:5]), r[5:12]), (p, r[:20]), (p, (*r[:6], 3))]
    calls = len(cached.llm.calls)
    assert _same(cached, tiny_engine, pairs)
    sent = [tuple(q["prompt_token_ids"]) for prompts, _ in cached.llm.calls[calls:] for q in prompts]
    # (the second may be sent again without the cache: its hit can reach blocks the first filled)
    assert set(sent) == {(*p, *r), (*p, *r[:6], 3)}
