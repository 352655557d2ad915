"""The engine contract (tests/unit/engines/test_engine_contract.py) on the real vLLM engine (CPU build), over the
tiny random Llama in float32; plus prefix caching on."""

from __future__ import annotations

import pytest

from tests.unit.engines import test_engine_contract as contract
from tests.vllm.judging import answers_both_ways

for _name in dir(contract):
    if _name.startswith("test_"):
        globals()[_name] = getattr(contract, _name)


@pytest.fixture(scope="module")
def engine(vllm_engine):
    return vllm_engine


def test_real_vllm_not_the_shim(engine):
    assert contract.kind_of(engine) == "vllm"
    assert type(engine.llm).__module__.startswith("vllm.")


def test_prefix_caching_is_on(engine):
    cfg = engine.llm.llm_engine.vllm_config.cache_config
    assert cfg.enable_prefix_caching is True
    assert cfg.kv_cache_memory_bytes == 1 << 30  # SRDQ_VLLM_CPU_KV_CACHE_GB=1, not a share of RAM


def test_a_cpu_model_step_may_take_an_hour(engine):
    """vLLM's 300 s step limit killed a MATH500 run scoring long candidates on two cores."""
    import vllm.envs

    assert vllm.envs.VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS == 3600


def test_scoring_reads_the_prefix_cache_and_equals_a_full_pass(engine):
    """A response re-scored as it grows: the second call reads the blocks the first one cached (vLLM
    returns prompt logprobs only past the hit; the memo fills the rest) and gives a full pass's logprobs."""
    p = tuple(engine.tokenizer.chat_prompt_ids([{"role": "user", "content": "Count on from 100."}]))
    r = tuple(range(100, 180))
    engine.logprobs([(p, r[:40])])
    reused = engine.stats.reused_tokens
    (grown,) = engine.logprobs([(p, r)])
    assert engine.stats.reused_tokens - reused > len(p)  # the hit reached into the response
    engine.score_from_cache = False
    try:
        (full,) = engine.logprobs([(p, r)])  # the cache skipped: every position computed
    finally:
        engine.score_from_cache = True
    assert len(grown) == len(r) and grown == pytest.approx(full, abs=1e-3)


def test_prefixes_of_one_response_are_read_from_the_longest(engine):
    """SRD's boundary search scores prefixes of one response in one call: one pass over the longest (the
    prefill counter grows by at most its length), each prefix equal to a full pass of its own."""
    p = tuple(engine.tokenizer.chat_prompt_ids([{"role": "user", "content": "Count on from 3."}]))
    r = tuple(range(3, 99))
    cuts = (16, 40, 64, 96)
    engine.score_from_cache = False
    try:
        fed = engine.stats.prefill_tokens
        together = engine.logprobs([(p, r[:c]) for c in cuts])
        assert engine.stats.prefill_tokens - fed <= len(p) + len(r)
        alone = [engine.logprobs([(p, r[:c])])[0] for c in cuts]
    finally:
        engine.score_from_cache = True
    assert [len(x) for x in together] == list(cuts)
    for got, want in zip(together, alone, strict=True):
        assert got == pytest.approx(want, abs=1e-3)


def test_a_judges_answers_are_read_from_the_next_tokens_top_logprobs(engine):
    """One-token answers after one prompt come from one greedy request's top logprobs of the next token
    and equal what prompt logprobs give each answer alone (to float rounding); an answer outside the top
    20 is scored alone."""
    p = tuple(engine.tokenizer.chat_prompt_ids([{"role": "user", "content": "Is 2 + 2 = 4? Yes or No."}]))
    top = engine._next_token_logprobs([p])[0]
    assert len(top) >= 20
    fast, slow = answers_both_ways(engine, list(p), top)
    assert fast == pytest.approx(slow, abs=1e-3)
