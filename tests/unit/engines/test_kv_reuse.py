"""Prefix KV reuse in the transformers engine (``SRDQ_KV_REUSE``, ``engines/prefix_kv.py``) on the tiny
random Llama in float32: a continuation fed from the store sees the same next-token distribution as a
full re-feed (up to float rounding), an edit-like request is served by cropping a stored sequence, the
LRU budget evicts without changing answers, SRD really reuses, and what a resumed run reproduces in each
mode (README, *Engine modes*): byte-identical records in the deterministic mode
(``tests/unit/test_whole_budget.py``, here for SRD), the same per-token distributions with reuse."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from srd_worker.engines.base import GenerationRequest, SamplingParams
from srd_worker.engines.prefix_kv import BLOCK
from srd_worker.engines.transformers_engine import TransformersEngine
from srd_worker.methods.registry import build_method
from srd_worker.runner import run_shard
from srd_worker.settings import Settings
from srd_worker.tasks.base import Item
from srd_worker.tasks.gsm8k import GSM8KTask
from tests.doubles import Crash, CrashingEngine, HashReward, MemoryStore

QUESTIONS = ["What is 3 + 4?", "Tom has 5 apples and eats 2. How many are left?"]
SRD = {"n": 6, "max_new_tokens": 24, "chunk_tokens": 6, "scoring_interval": 3, "l_max": 5}
TOL = 1e-4  # fp32 logprobs: cached vs re-fed differ by float rounding (measured ~1e-6)


def _engine(model, **kw) -> TransformersEngine:
    return TransformersEngine(model[0], model[1], model_name="tiny-random-llama", **kw)


def _prompts(engine) -> list[list[int]]:
    return [engine.tokenizer.chat_prompt_ids([{"role": "user", "content": q}]) for q in QUESTIONS]


def _req(ids, seed, n=8, temperature=1.0) -> GenerationRequest:
    return GenerationRequest(
        tuple(ids), SamplingParams(temperature=temperature, max_new_tokens=n, seed=seed, logprobs=True)
    )


def _rounds(engine, prompts, rounds=4, per_round=8):
    """Chunked continuation: every round asks for prompt + everything drawn so far (the runner's pattern)."""
    cur = [list(p) for p in prompts]
    lps: list[list[float]] = [[] for _ in prompts]
    for r in range(rounds):
        gens = engine.generate([_req(c, 100 * r + k, per_round) for k, c in enumerate(cur)])
        for k, g in enumerate(gens):
            cur[k] += g.token_ids
            lps[k] += g.logprobs
    return cur, lps


def test_cached_prefix_gives_the_refed_next_token_distribution(model):
    engine = _engine(model, kv_reuse=True)
    prompt = _prompts(engine)[0]
    (gen,) = engine.generate([_req(prompt, 1, n=20, temperature=0.0)])
    fed = tuple(prompt) + tuple(gen.token_ids[:-1])
    seq = list(prompt) + gen.token_ids  # the next round's prompt: one token past the stored sequence
    entry, common = engine.kv_store.lookup(seq)
    assert entry is not None and entry.tokens == fed and common == len(fed) == len(seq) - 1
    with torch.inference_mode():
        cache = engine._padded_prefix_cache([(entry, len(fed))], len(fed))
        cached = model[0](
            input_ids=torch.tensor([seq[-1:]]),
            position_ids=torch.tensor([[len(fed)]]),
            attention_mask=torch.ones((1, len(seq)), dtype=torch.long),
            **{engine._cache_kw: cache},  # the KV-cache argument's name in this transformers release
        ).logits[0, -1]
        full = model[0](input_ids=torch.tensor([seq])).logits[0, -1]
    diff = (cached - full).abs().max().item()
    assert diff < TOL, diff
    assert torch.equal(cached.argmax(), full.argmax())


ENGINE_MODES = [
    {},  # batch-invariant, 4 rows per pass (the default)
    {"invariant_rows": 0},  # rows follow the group
    {"batch_invariant": False},  # one padded batch (cached rows of any cached length packed in it)
]


@pytest.mark.parametrize("kw", ENGINE_MODES, ids=["fixed-rows", "group-rows", "padded"])
def test_continuation_from_cache_matches_the_refed_one(model, kw):
    det, reuse = _engine(model, **kw), _engine(model, kv_reuse=True, **kw)
    assert det.mode == "deterministic" and reuse.mode.startswith("kv-reuse")
    prompts = [p for p in _prompts(det) for _ in range(3)]
    seqs_d, lps_d = _rounds(det, prompts)
    seqs_r, lps_r = _rounds(reuse, prompts)
    # rounds 2-4 fed one token per row instead of the whole prefix
    assert det.stats.reused_tokens == 0 and reuse.stats.reused_tokens > 0
    assert reuse.stats.prefill_tokens < det.stats.prefill_tokens / 3
    assert reuse.stats.generated_tokens == det.stats.generated_tokens
    # on this model and these seeds the tokens are the same (verified); the logprobs agree to rounding
    assert seqs_r == seqs_d
    for a, b in zip(lps_r, lps_d, strict=True):
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < TOL


def test_cached_rows_stay_batch_invariant(model):
    """With the same history, a cached request's tokens do not depend on the rest of its batch."""
    a, b = _engine(model, kv_reuse=True), _engine(model, kv_reuse=True)
    prompts = _prompts(a) * 2
    first = [_req(p, k, 8) for k, p in enumerate(prompts)]
    ga, gb = a.generate(first), b.generate(first)
    nxt = [_req(list(p) + g.token_ids, 50 + k, 8) for k, (p, g) in enumerate(zip(prompts, ga, strict=True))]
    alone = a.generate(nxt[:1])[0]
    company = b.generate(nxt)[0]
    assert [g.token_ids for g in ga] == [g.token_ids for g in gb]
    assert alone.token_ids == company.token_ids and alone.logprobs == company.logprobs
    assert a.stats.reused_tokens > 0 and b.stats.reused_tokens > 0


def test_an_edit_is_served_by_cropping_a_stored_sequence(model):
    det, reuse = _engine(model), _engine(model, kv_reuse=True)
    prompt = _prompts(det)[1]
    (g,) = reuse.generate([_req(prompt, 3, n=24, temperature=0.0)])
    assert len(g.token_ids) == 24
    j = 9  # an SRD edit: keep τ[:j], regenerate from there with the editor's seed
    edit = _req(list(prompt) + g.token_ids[:j], 77, n=12)
    entry, common = reuse.kv_store.lookup(edit.prompt_ids)
    assert entry is not None and len(entry.tokens) > len(edit.prompt_ids) and common == len(edit.prompt_ids)
    before_fed, before_reused = reuse.stats.prefill_tokens, reuse.stats.reused_tokens
    (got,) = reuse.generate([edit])
    assert reuse.stats.prefill_tokens - before_fed == 1  # the cropped cache holds all but the last token
    assert reuse.stats.reused_tokens - before_reused == len(edit.prompt_ids) - 1
    (want,) = det.generate([edit])
    assert got.token_ids == want.token_ids
    assert max(abs(x - y) for x, y in zip(got.logprobs, want.logprobs, strict=True)) < TOL


def test_lru_budget_evicts_and_answers_stay_right(model):
    det = _engine(model)
    prompts = [
        det.tokenizer.chat_prompt_ids([{"role": "user", "content": f"Question {k}: what is {k} + {k}?"}])
        for k in range(4)
    ]
    # one fed sequence (prompt + 7 tokens) in this model: 2 layers x (K, V) x 2 heads x 16 dims x fp32
    per_token = 2 * 2 * 2 * 16 * 4
    budget = 2.5 * per_token * (len(prompts[0]) + 7) / (1 << 20)  # two sequences fit, not three
    small = _engine(model, kv_reuse=True, kv_reuse_mb=budget)
    seqs_d, lps_d = _rounds(det, prompts, rounds=3)
    seqs_s, lps_s = _rounds(small, prompts, rounds=3)
    store = small.kv_store
    assert store.evictions > 0 and len(store) <= 2 and store.nbytes <= store.budget_bytes
    assert 0 < small.stats.reused_tokens  # the two kept sequences were reused, the evicted re-fed
    assert small.stats.prefill_tokens > sum(len(p) for p in prompts) + 2 * len(prompts)
    assert seqs_s == seqs_d
    for a, b in zip(lps_s, lps_d, strict=True):
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < TOL


def test_settings_choose_the_mode_and_default_to_reuse():
    assert Settings().kv_reuse is True and Settings().kv_reuse_mb == 1024
    on = TransformersEngine.from_name("tiny-random-llama", settings=Settings(device="cpu", dtype="float32"))
    off = TransformersEngine.from_name(
        "tiny-random-llama", settings=Settings(device="cpu", dtype="float32", kv_reuse=False)
    )
    assert on.mode == "kv-reuse (1024 MB)" and on.kv_store.budget_bytes == 1024 << 20
    assert off.mode == "deterministic" and off.kv_store is None


def test_cudnn_attention_setting_turns_the_backend_off_for_the_process(monkeypatch):
    """SRDQ_CUDNN_ATTENTION=false turns PyTorch's cuDNN attention backend off when the engine is built (a
    process-wide flag, read by the CUDA kernels only); the default leaves PyTorch's choice alone."""
    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        TransformersEngine.from_name("tiny-random-llama", settings=Settings(device="cpu", dtype="float32"))
        assert torch.backends.cuda.cudnn_sdp_enabled()
        monkeypatch.setenv("SRDQ_CUDNN_ATTENTION", "false")
        settings = Settings(device="cpu", dtype="float32")
        assert settings.cudnn_attention is False
        engine = TransformersEngine.from_name("tiny-random-llama", settings=settings)
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert len(engine.generate([GenerationRequest((1, 2, 3), SamplingParams(max_new_tokens=2))])) == 1
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


# ------------------------------------------------------------------ SRD runs and resume


class Recording(CrashingEngine):
    """The real engine; records every (request, generation) with logprobs, and can die on call k."""

    def __init__(self, inner, crash_on: int | None = None) -> None:
        super().__init__(inner, crash_on)
        self.log = []

    def _generate(self, requests):
        asked = [
            GenerationRequest(r.prompt_ids, dataclasses.replace(r.params, logprobs=True)) for r in requests
        ]
        out = self.inner.generate(asked)
        self.log += [(r, dataclasses.replace(g)) for r, g in zip(asked, out, strict=True)]
        for r, g in zip(requests, out, strict=True):
            if not r.params.logprobs:
                g.logprobs = None
        return out


ITEMS = [Item(f"q{i}", q, "0") for i, q in enumerate(QUESTIONS)]


def _shard(store, engine, *, crash_on=None):
    rec = Recording(engine, crash_on)
    try:
        out = run_shard(
            items=ITEMS,
            positions=list(range(len(ITEMS))),
            method=build_method("srd", SRD),
            task=GSM8KTask(),
            engine=rec,
            reward=HashReward(),
            run_seed=7,
            store=store,
        )
    except Crash:
        out = None
    return out, rec


def _records(outcome) -> str:
    return json.dumps(
        [{k: v for k, v in r.items() if k != "timing"} for r in outcome.records], sort_keys=True
    )


def _max_logprob_gap(log, reference) -> float:
    """Largest |logprob the run drew a token with - the full re-feed's teacher-forced logprob|."""
    pairs = [(list(r.prompt_ids), g.token_ids) for r, g in log if g.token_ids]
    forced = reference.logprobs(pairs)
    return max(
        abs(a - b)
        for (_r, g), f in zip([x for x in log if x[1].token_ids], forced, strict=True)
        for a, b in zip(g.logprobs, f, strict=True)
    )


def test_srd_reuses_most_of_its_prefill(model):
    det, reuse = _engine(model), _engine(model, kv_reuse=True)
    full_d, _ = _shard(MemoryStore(), det)
    full_r, rec = _shard(MemoryStore(), reuse)
    assert full_d.finished and full_r.finished and full_r.rounds > 2
    assert det.stats.reused_tokens == 0 and reuse.stats.reused_tokens > 0
    # round 0 feeds the prompts; every later request (continuations and edits) fed one token
    first = len(QUESTIONS) * SRD["n"]
    assert [len(r.prompt_ids) for r, _ in rec.log[:first]] and rec.inner is reuse
    round0 = sum(len(r.prompt_ids) for r, _ in rec.log[:first])
    assert reuse.stats.prefill_tokens == round0 + len(rec.log) - first
    assert reuse.stats.prefill_tokens < det.stats.prefill_tokens / 2
    # edits (prompt + τ[:j*], strictly inside a stored sequence) were served by cropping
    assert reuse.stats.reuse_crops > 0
    edits = [
        r
        for k, (r, _g) in enumerate(rec.log)
        if any(
            len(r.prompt_ids) < len(q.prompt_ids) + len(h.token_ids) - 1
            and (q.prompt_ids + tuple(h.token_ids))[: len(r.prompt_ids)] == r.prompt_ids
            for q, h in rec.log[:k]
        )
    ]
    assert edits, "SRD with this reward should edit"


def test_resume_with_kv_reuse_draws_every_token_from_the_refed_distribution(model):
    """Reuse mode: a crashed run resumed by a fresh process (empty store) finishes, and every token of
    both runs was drawn with the logprob a full re-feed gives it (to float rounding): the same
    distributions; the token sequences may differ where rounding flips a near-tie."""
    det = _engine(model)
    full, rec_full = _shard(MemoryStore(), _engine(model, kv_reuse=True))
    assert full.finished
    store = MemoryStore()
    crashed, rec_crashed = _shard(store, _engine(model, kv_reuse=True), crash_on=5)
    assert crashed is None and store.checkpoints
    resumed, rec_resumed = _shard(store, _engine(model, kv_reuse=True))  # a restarted process
    assert resumed.finished and len(resumed.records) == len(ITEMS)
    for rec in (rec_full, rec_crashed, rec_resumed):
        assert _max_logprob_gap(rec.log, det) < TOL
    assert rec_resumed.inner.stats.reused_tokens > 0


def test_resume_in_deterministic_mode_is_byte_identical_for_srd(model):
    full, _ = _shard(MemoryStore(), _engine(model, kv_reuse=False))
    store = MemoryStore()
    crashed, _ = _shard(store, _engine(model, kv_reuse=False), crash_on=5)
    assert crashed is None and store.checkpoints
    resumed, _ = _shard(store, _engine(model, kv_reuse=False))
    assert resumed.finished and _records(resumed) == _records(full)


def test_block_is_the_smallest_reuse(model):
    assert BLOCK == 16
    engine = _engine(model, kv_reuse=True)
    short = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]  # under one block: never stored, never reused
    (g,) = engine.generate([_req(short, 1, n=4)])
    assert len(engine.kv_store) == 0
    engine.generate([_req(short + g.token_ids, 2, n=4)])
    assert engine.stats.reused_tokens == 0


def test_store_longest_prefix_supersede_and_lru_order():
    from srd_worker.engines.prefix_kv import PrefixKVStore

    def kv(n):  # one layer, one head, 2 dims: 16 bytes per token
        return [(torch.zeros(1, n, 2), torch.zeros(1, n, 2))]

    store = PrefixKVStore(budget_bytes=16 * 100)
    a = tuple(range(40))
    b = a[:20] + tuple(range(100, 120))
    store.put(a, kv(40), supersedes=None)
    store.put(b, kv(40), supersedes=None)
    assert store.lookup(a + (7,))[0].tokens == a and store.lookup(a + (7,))[1] == 40
    assert store.lookup(a[:33] + (999,) * 10)[1] == 33  # an edit inside a: longest common prefix
    assert store.lookup(b[:25] + (999,))[0].tokens == b
    assert store.lookup(a[:15] + (999,) * 10) == (None, 0)  # under one block
    assert store.lookup((5,) * 40) == (None, 0)
    # a's continuation replaces a (a prefix of it); b stays
    (entry_a, _) = store.lookup(a + (7,))
    a2 = a + (7, 8)
    store.put(a2, kv(42), supersedes=entry_a)
    assert len(store) == 2 and store.lookup(a + (7,))[0].tokens == a2
    # over budget: the least recently used goes first (b, touched before a2)
    store.lookup(a2 + (1,))
    store.put(tuple(range(500, 530)), kv(30), supersedes=None)
    assert b not in [e.tokens for e in store.entries.values()]
    assert store.lookup(b + (1,))[1] == 20  # now only a2's first 20 tokens match
    assert store.lookup(a2 + (1,))[0].tokens == a2
    assert store.evictions == 1 and store.nbytes <= store.budget_bytes


# ------------------------------------------------------------------ packed batches (batch_invariant=False)


def _stored_round(engine, prompts, ns):
    """Round 0 of each prompt (greedy, ``ns[k]`` tokens), stored; returns the generations."""
    return engine.generate(
        [_req(p, k, n=n, temperature=0.0) for k, (p, n) in enumerate(zip(prompts, ns, strict=True))]
    )


def _mixed_requests(engine):
    """A continuation, an edit (a cropped stored sequence) and an uncached prompt: three cached lengths
    (one of them 0) and three fed-suffix lengths, in one generate call."""
    prompts = _prompts(engine)
    ga, gb = _stored_round(engine, prompts, [20, 24])
    fresh = engine.tokenizer.chat_prompt_ids([{"role": "user", "content": "Name a prime above 10."}])
    reqs = [
        _req(list(prompts[0]) + ga.token_ids + [65, 66, 67], 11, n=10),  # continuation, 4 tokens fed
        _req(list(prompts[1]) + gb.token_ids[:7], 12, n=10),  # an edit at j* = 7: crop, 1 token fed
        _req(fresh, 13, n=10),  # nothing stored
        _req(list(prompts[1]) + gb.token_ids[:7] + [70, 71], 14, n=6, temperature=0.0),
    ]
    return reqs


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_padded_prefix_cache_with_holes_gives_each_rows_refed_logits(attn):
    """The packed layout at the model level: rows [left pad][cached L_i][pad][suffix s_i] with a 2D mask
    of zeros at every pad, explicit positions and a pre-filled, left-padded DynamicCache give each row
    the logits of a full re-feed of that row alone, at every suffix position (sdpa and eager)."""
    from srd_worker.engines.loading import build_tiny_llama

    m, tok = build_tiny_llama(seed=0)
    m = m.to(torch.float32)
    m.set_attn_implementation(attn)
    assert m.config._attn_implementation == attn
    engine = _engine((m, tok), kv_reuse=True, batch_invariant=False)
    reqs = _mixed_requests(engine)
    plan = engine._reuse_plan(reqs)
    lens = [p[1] if p is not None else 0 for p in plan]
    assert lens[2] == 0 and len(set(lens)) == 4  # four different cached lengths, one uncached
    suffix = [list(r.prompt_ids[k:]) for r, k in zip(reqs, lens, strict=True)]
    assert len({len(s) for s in suffix}) >= 3
    lmax, smax = max(lens), max(len(s) for s in suffix)
    ids = torch.full((len(reqs), smax), engine.tokenizer.pad_token_id)
    mask = torch.zeros((len(reqs), lmax + smax), dtype=torch.long)
    pos = torch.zeros((len(reqs), smax), dtype=torch.long)
    for row, (s, k) in enumerate(zip(suffix, lens, strict=True)):
        ids[row, smax - len(s) :] = torch.tensor(s)
        mask[row, lmax - k : lmax] = 1
        mask[row, lmax + smax - len(s) :] = 1
        pos[row, smax - len(s) :] = torch.arange(k, k + len(s))
    with torch.inference_mode():
        cache = engine._padded_prefix_cache(plan, lmax)
        packed = m(input_ids=ids, attention_mask=mask, position_ids=pos, **{engine._cache_kw: cache}).logits
        for row, (r, s) in enumerate(zip(reqs, suffix, strict=True)):
            alone = m(input_ids=torch.tensor([list(r.prompt_ids)])).logits[0, -len(s) :]
            got = packed[row, smax - len(s) :]
            diff = (got - alone).abs().max().item()
            assert diff < TOL, (row, diff)
            assert torch.isfinite(packed[row]).all()


def test_packed_batch_mixes_cached_lengths_and_matches_each_row_alone(model):
    """batch_invariant=False with reuse: cached rows of different cached and fed lengths and an uncached
    row run as ONE padded batch (forward passes = the longest generation), after the uncached prompt,
    fed whole beside rows fed 1-4 tokens, went through the prefix store in a pass of its own
    (``_prefill_apart``), and each row gets the tokens and (to float rounding) the logprobs it gets
    alone with a full re-feed."""
    engine = _engine(model, kv_reuse=True, batch_invariant=False)
    reqs = _mixed_requests(engine)
    before = dict(vars(engine.stats))
    got = engine.generate(reqs)
    d = {k: v - before[k] for k, v in vars(engine.stats).items()}
    assert d["prefills_apart"] == 1
    assert d["forward_passes"] == max(len(g.token_ids) for g in got) + 1
    assert d["generated_tokens"] == sum(len(g.token_ids) for g in got)  # the pass apart's token: not counted
    plan_lens = [len(r.prompt_ids) for r in reqs]
    assert d["reused_tokens"] > 0 and d["prefill_tokens"] < sum(plan_lens) / 2
    ref = _engine(model)  # deterministic: every prompt re-fed, each request alone
    for r, g in zip(reqs, got, strict=True):
        (want,) = ref.generate([r])
        assert g.token_ids == want.token_ids
        assert max(abs(x - y) for x, y in zip(g.logprobs, want.logprobs, strict=True)) < TOL


def test_snapshot_after_a_packed_batch_holds_only_the_rows_real_positions(model):
    """After a packed batch, each row's stored sequence is prompt + generated[:-1] with the keys and
    values a full re-feed computes (pads left out), and the next packed round continues from it."""
    engine = _engine(model, kv_reuse=True, batch_invariant=False)
    reqs = _mixed_requests(engine)
    got = engine.generate(reqs)
    m = model[0]
    for r, g in zip(reqs, got, strict=True):
        fed = tuple(r.prompt_ids) + tuple(g.token_ids[:-1])
        entry, common = engine.kv_store.lookup(fed + (5,))
        assert entry is not None and entry.tokens == fed and common == len(fed)
        with torch.inference_mode():
            full = m(input_ids=torch.tensor([list(fed)]), use_cache=True).past_key_values
        for (k, v), layer in zip(entry.kv, full.layers, strict=True):
            assert k.shape == layer.keys[0].shape
            assert (k - layer.keys[0]).abs().max().item() < TOL
            assert (v - layer.values[0]).abs().max().item() < TOL
    # the next round: every row continues from its snapshot (one token fed each), still one batch
    nxt = [
        _req(list(r.prompt_ids) + g.token_ids, 40 + k, n=6)
        for k, (r, g) in enumerate(zip(reqs, got, strict=True))
    ]
    before = dict(vars(engine.stats))
    again = engine.generate(nxt)
    d = {k: v - before[k] for k, v in vars(engine.stats).items()}
    assert d["prefill_tokens"] == len(nxt) and d["forward_passes"] == max(len(g.token_ids) for g in again)
    ref = _engine(model)
    for r, g in zip(nxt, again, strict=True):
        (want,) = ref.generate([r])
        assert g.token_ids == want.token_ids
        assert max(abs(x - y) for x, y in zip(g.logprobs, want.logprobs, strict=True)) < TOL


def test_packing_takes_fewer_forward_passes_than_grouping(model):
    """The same call grouped by (cached length, prompt length) (batch-invariant, rows following the
    group) runs one batch per group; packed, one batch in all (after one pass over the uncached prompt,
    fed apart)."""
    packed = _engine(model, kv_reuse=True, batch_invariant=False)
    grouped = _engine(model, kv_reuse=True, invariant_rows=0)
    results = []
    for engine in (packed, grouped):
        reqs = _mixed_requests(engine)
        before = engine.stats.forward_passes
        gens = engine.generate(reqs)
        results.append((engine.stats.forward_passes - before, [g.token_ids for g in gens]))
    (p_passes, p_tokens), (g_passes, g_tokens) = results
    assert p_tokens == g_tokens  # same tokens on this model and these seeds
    assert p_passes == max(len(t) for t in p_tokens) + 1
    assert g_passes == sum(len(t) for t in g_tokens)  # four groups of one: one pass per token
    assert p_passes < g_passes


def test_prefill_split_feeds_long_prompts_apart_only_when_it_saves_half_the_positions():
    from srd_worker.engines.transformers_engine import prefill_split

    a, b = (1,) * 200, (2,) * 200
    # n = 4 candidates of two fresh prompts: one pass over the two distinct prompts, then 1 token each
    assert prefill_split([200] * 8, [a] * 4 + [b] * 4) == 0
    # a new item's prompt beside continuations fed a few tokens: the prompt goes apart
    assert prefill_split([200, 3, 2, 3, 1], [a, (3,), (4,), (5,), (6,)]) == 3
    # distinct prompts of equal length, or rows fed about as much: one padded batch
    assert prefill_split([200, 190, 210], [a, b, (3,) * 210]) is None
    assert prefill_split([30, 20, 25, 28], [(k,) for k in range(4)]) is None
    assert prefill_split([200], [a]) is None
    # one prompt fed whole in one row and mostly cached in another costs its longest suffix apart
    # (200 + 2 positions against one batch's 400: not worth a pass), whichever row comes last
    assert prefill_split([200, 10], [a, a]) is None
    assert prefill_split([10, 200], [a, a]) is None


def test_n_candidates_of_one_prompt_feed_it_once_and_keep_their_tokens(model):
    """A fresh call of 4 candidates of each of 2 prompts (a shard's first round): each prompt is fed
    once, apart, then every row is fed its last prompt token from the store; the rows' tokens are those
    of the same call without the store (every row fed its whole prompt), and about a quarter of the
    prompt positions are computed."""
    reuse = _engine(model, kv_reuse=True, batch_invariant=False)
    plain = _engine(model, kv_reuse=False, batch_invariant=False)
    prompts = _prompts(reuse)[:2]
    reqs = [_req(list(p), 100 + k, n=8) for p in prompts for k in range(4)]
    before = dict(vars(reuse.stats))
    got = reuse.generate(reqs)
    d = {k: v - before[k] for k, v in vars(reuse.stats).items()}
    want = plain.generate(reqs)
    assert d["prefills_apart"] == 1
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert d["prefill_tokens"] < 0.5 * sum(len(r.prompt_ids) for r in reqs)
