"""Teacher-forced scoring in the transformers engine (``TransformersEngine.logprobs``) with shared work:
continuations that differ only in their last token are one computation, and with the prefix store
(``kv_reuse``) a scored sequence's keys and values are kept with the logprobs it computed, so re-scoring a
grown or regenerated response feeds only what changed. On the tiny random Llama in float32: every score
must equal a full teacher-forced pass of the same model (exactly where nothing is reused, up to float
rounding where cached keys and values are read), while the tokens fed drop.
"""

from __future__ import annotations

import random

import pytest
import torch

from srd_worker.engines.base import GenerationRequest, SamplingParams
from srd_worker.engines.prefix_kv import BLOCK
from srd_worker.engines.transformers_engine import TransformersEngine

pytestmark = pytest.mark.unit

TOL = 1e-4  # fp32: cached vs re-fed keys and values differ by float rounding


def _engine(model, **kw) -> TransformersEngine:
    return TransformersEngine(model[0], model[1], model_name="tiny-random-llama", **kw)


def _tokens(engine, n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, engine.tokenizer.hf.vocab_size) for _ in range(n)]


def _full_pass(model, prefix, cont) -> list[float]:
    """The reference: one unpadded forward of prefix + continuation, no cache, log_softmax per position."""
    seq = torch.tensor([list(prefix) + list(cont)])
    with torch.inference_mode():
        logp = torch.log_softmax(model[0](input_ids=seq).logits[0].float(), -1)
    return [float(logp[len(prefix) + j - 1, t]) for j, t in enumerate(cont)]


def _close(got, want):
    assert len(got) == len(want)
    assert max((abs(a - b) for a, b in zip(got, want, strict=True)), default=0.0) < TOL


@pytest.mark.parametrize("mode", ["padded", "invariant"])
def test_candidates_after_one_prefix_are_one_row(model, mode):
    """A judge asks for several one-token answers after the same prompt: one row, not one per answer."""
    engine = _engine(model, batch_invariant=mode == "invariant")
    prefix = _tokens(engine, 40, 1)
    answers = [11, 12, 13, 14]
    other = (_tokens(engine, 30, 2), [15, 16, 17])
    pairs = [(prefix, [a]) for a in answers] + [other] + [(prefix, [a]) for a in answers[:2]]
    before = engine.stats.prefill_tokens
    got = engine.logprobs(pairs)
    assert engine.stats.prefill_tokens - before == len(prefix) + len(other[0]) + 2  # stems fed once each
    want = [_full_pass(model, p, c) for p, c in pairs]
    for g, w in zip(got, want, strict=True):
        _close(g, w)
    assert got[0] != got[1] and got[-2:] == got[:2]  # each answer reads its own token
    if mode == "invariant":  # rows never depend on their company: the same floats as alone
        assert got == [engine.logprobs([p])[0] for p in pairs]


def test_without_the_store_nothing_is_kept_and_every_scoring_feeds_it_all(model):
    engine = _engine(model)  # the deterministic mode: no prefix store
    prefix, resp = _tokens(engine, 40, 3), _tokens(engine, 48, 4)
    for cut in (16, 48):
        before = engine.stats.prefill_tokens
        _close(engine.logprobs([(prefix, resp[:cut])])[0], _full_pass(model, prefix, resp[:cut]))
        assert engine.stats.prefill_tokens - before == len(prefix) + cut - 1
    assert engine.stats.reused_tokens == 0


@pytest.mark.parametrize("mode", ["padded", "invariant"])
def test_a_growing_response_is_scored_past_what_was_scored_before(model, mode):
    engine = _engine(model, kv_reuse=True, batch_invariant=mode == "invariant")
    prefixes = [_tokens(engine, 40, 5), _tokens(engine, 27, 6)]
    resps = [_tokens(engine, 64, 7), _tokens(engine, 64, 8)]
    for cut in (16, 32, 48, 64):  # SRD re-scores each response every Δ = 16 tokens
        pairs = [(p, r[:cut]) for p, r in zip(prefixes, resps, strict=True)]
        before, reused = engine.stats.prefill_tokens, engine.stats.reused_tokens
        got = engine.logprobs(pairs)
        for g, (p, c) in zip(got, pairs, strict=True):
            _close(g, _full_pass(model, p, c))
        fed = engine.stats.prefill_tokens - before
        if cut == 16:
            assert fed == sum(len(p) + cut - 1 for p in prefixes)  # nothing stored yet
        else:  # each feeds its 16 new tokens, and the one before them (whose logits score the first)
            assert fed == 2 * 17 and engine.stats.reused_tokens - reused == sum(
                len(p) + cut - 18 for p in prefixes
            )


def test_a_regenerated_suffix_reuses_the_kept_prefix(model):
    """An SRD edit keeps τ[:j*] and redraws the rest: the kept part comes from the store."""
    engine = _engine(model, kv_reuse=True)
    prefix, resp = _tokens(engine, 40, 9), _tokens(engine, 64, 10)
    engine.logprobs([(prefix, resp)])
    edited = resp[:37] + _tokens(engine, 20, 11)
    before = engine.stats.prefill_tokens
    got = engine.logprobs([(prefix, edited)])[0]
    _close(got, _full_pass(model, prefix, edited))
    assert engine.stats.prefill_tokens - before == len(edited) - 37 + 0  # tokens 37 … of the stem, and τ[36]
    # the stem is prefix + edited[:-1]: fed from position len(prefix) + 36 (the last shared token)


def test_a_generated_sequence_serves_its_prompt_but_not_its_logprobs(model):
    """Generation stores keys and values without teacher-forced logprobs: scoring its tokens reuses the
    prompt (positions before the first scored token) and computes every continuation logit."""
    engine = _engine(model, kv_reuse=True)
    prompt = _tokens(engine, 40, 12)
    (gen,) = engine.generate(
        [GenerationRequest(tuple(prompt), SamplingParams(temperature=1.0, max_new_tokens=24, seed=3))]
    )
    before, reused = engine.stats.prefill_tokens, engine.stats.reused_tokens
    got = engine.logprobs([(prompt, gen.token_ids)])[0]
    _close(got, _full_pass(model, prompt, gen.token_ids))
    assert engine.stats.reused_tokens - reused == len(prompt) - 1
    assert engine.stats.prefill_tokens - before == len(gen.token_ids)


def test_the_judge_prompt_reuses_up_to_where_the_response_grew(model):
    """A judge's prompt puts a fixed question after the response: growing the response keeps only the
    part before its new tokens, and every answer is still exact."""
    engine = _engine(model, kv_reuse=True)
    head, resp, tail = _tokens(engine, 30, 13), _tokens(engine, 60, 14), _tokens(engine, 12, 15)
    for cut in (20, 60):
        prefix = head + resp[:cut] + tail
        pairs = [(prefix, [a]) for a in (21, 22, 23)]
        before = engine.stats.prefill_tokens
        got = engine.logprobs(pairs)
        for g, (p, c) in zip(got, pairs, strict=True):
            _close(g, _full_pass(model, p, c))
        if cut == 60:  # the stored head + resp[:20] (cropped at a whole block) serves the new prompt
            common = len(head) + 20
            assert engine.stats.prefill_tokens - before == len(prefix) - min(common, len(prefix) - 1)


def test_the_store_budget_and_the_switch(model):
    engine = _engine(model, kv_reuse=True, kv_reuse_mb=0.05)  # room for about one sequence
    prefix = _tokens(engine, 40, 16)
    resps = [_tokens(engine, 40, 17 + k) for k in range(4)]
    engine.logprobs([(prefix, r) for r in resps])
    assert engine.kv_store.nbytes <= engine.kv_store.budget_bytes and engine.kv_store.evictions > 0
    for r in resps:  # evicted or not, the answer is the same
        _close(engine.logprobs([(prefix, r + [30, 31])])[0], _full_pass(model, prefix, r + [30, 31]))
    off = _engine(model, kv_reuse=True)
    off.score_from_cache = False
    off.logprobs([(prefix, resps[0])])
    assert len(off.kv_store) == 0 and off.stats.reused_tokens == 0
    assert BLOCK == 16  # the tests above size their prefixes against it


class _ScoreLog:
    """The logprob reward over ``engine``, logging every (question, response, score) it gave."""

    def __init__(self, engine) -> None:
        from srd_worker.rewards.logprob import MeanLogprobReward

        self.inner = MeanLogprobReward(engine)
        self.name = self.inner.name
        self.log: list[tuple[str, str, float]] = []

    def score(self, prompts, responses):
        out = self.inner.score(prompts, responses)
        self.log += list(zip(prompts, responses, out, strict=True))
        return out


def test_srd_with_the_logprob_reward_reuses_its_scoring_and_scores_as_a_full_pass(model):
    """SRD re-scores each candidate every few tokens: with the store, the scorer feeds far fewer tokens
    than the same run with every scoring in full, and every score it gave equals a full pass's."""
    from srd_worker.methods.registry import build_method
    from srd_worker.runner import run_shard
    from srd_worker.tasks.base import Item
    from srd_worker.tasks.gsm8k import GSM8KTask
    from tests.doubles import MemoryStore

    items = [Item("q0", "Tom has 5 apples and eats 2. How many are left?", "3")]
    params = {"n": 4, "max_new_tokens": 48, "chunk_tokens": 8, "scoring_interval": 8, "l_max": 5}
    fed = {}
    for reuse in (False, True):
        engine = _engine(model, kv_reuse=True)
        engine.score_from_cache = reuse
        reward = _ScoreLog(engine)
        out = run_shard(
            items=items,
            positions=[0],
            method=build_method("srd", params),
            task=GSM8KTask(),
            engine=engine,
            reward=reward,
            run_seed=3,
            store=MemoryStore(),
        )
        assert out.finished and len(reward.log) > 8
        fed[reuse] = engine.stats.prefill_tokens
        if reuse:
            reference = _engine(model)  # no store: every scoring a full pass
            want = _ScoreLog(reference).score(
                [q for q, _r, _s in reward.log], [r for _q, r, _s in reward.log]
            )
            assert max(abs(s - w) for (_q, _r, s), w in zip(reward.log, want, strict=True)) < TOL
    assert fed[True] < 0.7 * fed[False]
