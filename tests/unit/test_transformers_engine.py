"""The transformers engine on a tiny random Llama: order kept, seeds reproducible, continuation from a
prefix equals one-shot generation, stop conditions, teacher-forced scoring consistent with sampling."""

from __future__ import annotations

import math

import pytest

from srd_worker.engines.base import CAP_SAMPLING, Engine, GenerationRequest, SamplingParams
from srd_worker.errors import EngineError

PROMPTS = ["hello there", "what is 2+2? think", "a much longer prompt about ducks and eggs", "x"]


def prompt_ids(engine, text: str) -> tuple[int, ...]:
    return tuple(engine.tokenizer.chat_prompt_ids([{"role": "user", "content": text}]))


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_new_tokens=n)


def test_satisfies_protocol(tiny_engine):
    assert isinstance(tiny_engine, Engine)
    assert CAP_SAMPLING in tiny_engine.capabilities


def test_batch_order_kept_and_equals_single_requests(tiny_engine):
    reqs = [GenerationRequest(prompt_ids(tiny_engine, p), greedy(12)) for p in PROMPTS]
    batch = tiny_engine.generate(reqs)
    assert len(batch) == len(reqs)
    singles = [tiny_engine.generate([r])[0] for r in reqs]
    assert [g.token_ids for g in batch] == [g.token_ids for g in singles]
    # reversing the batch reverses the outputs
    rev = tiny_engine.generate(reqs[::-1])
    assert [g.token_ids for g in rev] == [g.token_ids for g in batch][::-1]


def test_seeds_reproducible_and_batch_independent(tiny_engine):
    def req(text, seed):
        sp = SamplingParams(temperature=1.0, top_p=0.95, top_k=40, max_new_tokens=16, seed=seed)
        return GenerationRequest(prompt_ids(tiny_engine, text), sp)

    a = tiny_engine.generate([req(PROMPTS[0], 1), req(PROMPTS[1], 2)])
    b = tiny_engine.generate([req(PROMPTS[0], 1), req(PROMPTS[1], 2)])
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    # the same request in another batch, at another position, draws the same tokens
    c = tiny_engine.generate([req(PROMPTS[2], 9), req(PROMPTS[1], 2), req(PROMPTS[0], 1)])
    assert c[2].token_ids == a[0].token_ids and c[1].token_ids == a[1].token_ids
    # a different seed gives a different sample (16 tokens from a 259-token vocabulary)
    d = tiny_engine.generate([req(PROMPTS[0], 3)])
    assert d[0].token_ids != a[0].token_ids


def test_continuation_from_prefix_equals_one_shot_greedy(tiny_engine):
    p = prompt_ids(tiny_engine, PROMPTS[1])
    full = tiny_engine.generate([GenerationRequest(p, greedy(24))])[0].token_ids
    assert len(full) == 24
    head = tiny_engine.generate([GenerationRequest(p, greedy(10))])[0].token_ids
    tail = tiny_engine.generate([GenerationRequest(p + tuple(head), greedy(14))])[0].token_ids
    assert head + tail == full
    # continuation also holds inside a mixed batch
    mixed = tiny_engine.generate([GenerationRequest(prompt_ids(tiny_engine, "x"), greedy(5)),
                                  GenerationRequest(p + tuple(head), greedy(14))])
    assert mixed[1].token_ids == tail


def test_greedy_logprobs_match_teacher_forcing(tiny_engine):
    p = prompt_ids(tiny_engine, PROMPTS[0])
    gen = tiny_engine.generate([GenerationRequest(p, SamplingParams(temperature=0, max_new_tokens=8, logprobs=True))])[0]
    forced = tiny_engine.logprobs([(p, gen.token_ids)])[0]
    assert len(forced) == len(gen.logprobs) == 8
    for a, b in zip(gen.logprobs, forced, strict=True):
        assert math.isclose(a, b, abs_tol=1e-4)
    # a greedy token is the most likely one: its logprob is the max over the vocabulary, so any other
    # first token scores lower
    other = (gen.token_ids[0] + 1) % 200
    assert tiny_engine.logprobs([(p, [other])])[0][0] < forced[0]


def test_max_new_tokens_and_length_reason(tiny_engine):
    gens = tiny_engine.generate([GenerationRequest(prompt_ids(tiny_engine, "x"), greedy(n)) for n in (1, 3, 0)])
    assert [len(g.token_ids) for g in gens] == [1, 3, 0]
    assert all(g.finish_reason == "length" for g in gens)


def test_stop_string_ends_generation(tiny_engine):
    p = prompt_ids(tiny_engine, PROMPTS[2])
    full = tiny_engine.generate([GenerationRequest(p, greedy(30))])[0]
    stop = full.text[5:7]
    assert stop, "need some text to stop on"
    got = tiny_engine.generate([GenerationRequest(p, SamplingParams(temperature=0, max_new_tokens=30, stop=(stop,)))])[0]
    assert got.finish_reason == "stop"
    assert stop in got.text and got.text == full.text[: len(got.text)]
    assert len(got.token_ids) < 30


def test_eos_stops_and_is_counted(tiny_engine):
    # with a 259-token random model EOS comes up within 200 draws for most seeds (fixed seeds: no flake)
    p = prompt_ids(tiny_engine, "x")
    eos = next(iter(tiny_engine.tokenizer.eos_token_ids))
    seen = tiny_engine.generate([GenerationRequest(p, SamplingParams(temperature=1.0, max_new_tokens=200, seed=s))
                                 for s in range(8)])
    assert any(g.finish_reason == "eos" for g in seen)
    for g in seen:
        if g.finish_reason == "eos":
            assert g.token_ids[-1] == eos
        else:
            assert g.finish_reason == "length" and len(g.token_ids) == 200 and eos not in g.token_ids


def test_prompt_longer_than_context_is_refused(tiny_engine):
    too_long = tuple([5] * (tiny_engine.max_context + 1))
    with pytest.raises(EngineError, match="does not fit"):
        tiny_engine.generate([GenerationRequest(too_long, greedy(2))])
