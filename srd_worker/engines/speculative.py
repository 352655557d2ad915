"""The speculative-decoding harness of the transformers engine (docs/ALGORITHMS.md §4.3).

A draft model (same tokenizer as the engine's model, the *target*) proposes γ tokens per iteration, one
target forward pass scores them, and a verification rule (``engines.base.VerifyRule``; the rules are pure
math in ``methods/speculative_rules.py``) keeps a prefix of them and emits one more token. The harness
owns everything model-side:

- **Distributions.** Both models' next-token logits go through the same processing as the engine's
  sampler (temperature → top-k → top-p with the smallest prefix reaching top-p kept → renormalised;
  one-hot at the argmax for temperature 0): ``processed_probs``. The rule gets the processed ``q``/``p``
  and the raw logits of both models.
- **Randomness.** Each request owns a ``numpy.random.Generator`` seeded with its seed; the harness draws
  the draft tokens from it (inverse CDF, one uniform per token) and hands it to the rule, so a request's
  draws never depend on the other rows of its batch.
- **KV caches, batched.** Draft and target each keep one ``DynamicCache`` for the whole batch. Rows
  accept different numbers of tokens per iteration, so instead of cropping (which would need the same
  length in every row) a rejected token's cache slot is *masked*: the attention mask of that row is set to
  0 at the slot, and position ids are explicit per row (the live-token count), so a dead slot is never
  attended to and does not shift positions. The cache therefore grows by γ+1 slots per iteration in the
  target and up to γ+1 in the draft whatever was accepted; the cost is attention over the dead slots,
  never a wrong result. Tokens a model has not seen yet ("pending": the emitted correction/bonus, and
  the last draft token when all γ were accepted) are fed at the start of the next iteration, left-padded
  with masked slots to the longest pending list of the batch. The first iteration's pending list is the
  whole prompt (prefill and first draft step are one forward). Rows that finish (EOS, a stop string, the
  token budget) leave the batch and both caches.
- **Batches**: requests of equal prompt length together when the engine is batch-invariant (else in
  input order), in chunks of the engine's ``max_batch_size``. The engine's fixed-row scheme for plain
  generation (``invariant_rows``) is not applied: a row's tokens may depend on how many rows share its
  batch in the last bits of the logits (so on a near-tie); a resumed round batches the same items, so
  resume stays exact.
- **Draft models** are loaded once per engine and cached by name (``draft_for``): a local model folder, a
  name ``engines.loading`` knows (``testbed-draft``, ``tiny-random-llama``, ``smollm2``, ...), with the
  target's dtype and device. A draft whose vocabulary differs from the target's is refused.

An iteration can emit up to γ+1 tokens; the emitted tokens are cut at the first EOS, at a stop string and
at the request's token budget, so a request never returns more than ``max_new_tokens`` tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from srd_worker.engines.base import (
    GenerationRequest,
    SpecStep,
    SpeculativeGeneration,
    VerifyRule,
    token_budget,
)
from srd_worker.errors import ConfigError, EngineError


@dataclass
class DraftModel:
    model: Any
    cache_kw: str
    has_logits_to_keep: bool
    max_context: int
    vocab: int


def verified_positions(accepted: int, gamma: int) -> int:
    """Draft positions one verification tested: the ``accepted`` ones, plus the one that stopped it when
    fewer than γ were kept. Summed over iterations, accepted / verified estimates the per-token acceptance
    probability a = E[Σ min(p, q)] of §4.1 (the positions after a rejection are never tested, so
    accepted / drafted underestimates it)."""
    return accepted + (1 if accepted < gamma else 0)


def _model_info(model: Any) -> tuple[str, bool, int]:
    import inspect

    params = inspect.signature(model.forward).parameters
    return (
        "cache" if "cache" in params else "past_key_values",
        "logits_to_keep" in params,
        int(getattr(model.config, "max_position_embeddings", 2048) or 2048),
    )


def _drafts(engine: Any) -> dict[str, DraftModel]:
    cache = getattr(engine, "_spec_drafts", None)
    if cache is None:
        cache = {}
        engine._spec_drafts = cache
    return cache


def register_draft(engine: Any, name: str, model: Any, tokenizer: Any) -> DraftModel:
    """Make ``model`` (with ``tokenizer``) the draft called ``name`` on ``engine`` (tests, benchmarks, and
    ``draft_for`` after loading). Refuses a tokenizer whose vocabulary differs from the target's."""
    target_vocab = engine.tokenizer.hf.get_vocab()
    if tokenizer.get_vocab() != target_vocab:
        raise ConfigError(
            f"draft model '{name}' does not share the target model's tokenizer "
            f"({len(tokenizer.get_vocab())} vs {len(target_vocab)} entries, or different ids); "
            "speculative decoding needs the same vocabulary"
        )
    cache_kw, has_ltk, max_context = _model_info(model)
    vocab = min(int(model.config.vocab_size), int(engine.model.config.vocab_size))
    if vocab < len(target_vocab):
        raise ConfigError(
            f"draft model '{name}': logits cover {vocab} tokens, the tokenizer has {len(target_vocab)}"
        )
    draft = DraftModel(model, cache_kw, has_ltk, max_context, vocab)
    _drafts(engine)[name] = draft
    return draft


def draft_for(engine: Any, name: str) -> DraftModel:
    """The draft model ``name`` of ``engine``, loaded on first use (target's dtype and device)."""
    cache = _drafts(engine)
    if name in cache:
        return cache[name]
    import torch

    from srd_worker.engines.loading import load_model
    from srd_worker.errors import ModelLoadError
    from srd_worker.settings import Settings

    dtype = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}.get(
        next(engine.model.parameters()).dtype, "float32"
    )
    try:
        model, tokenizer = load_model(
            name, cache_dir=Settings().cache_dir, dtype=dtype, device=str(engine.device)
        )
    except ModelLoadError as exc:
        raise ConfigError(f"draft_model '{name}': {exc}") from exc
    return register_draft(engine, name, model, tokenizer)


# ---------------------------------------------------------------------------------------------------
# Distributions


def processed_probs(logits: Any, temps: Any, top_k: Any, top_p: Any) -> Any:
    """Row-wise processed distributions of ``logits`` (B×V, float32): temperature, then top-k (0 = off),
    then top-p (the smallest prefix of the sorted distribution whose mass reaches top_p; the first token
    always kept), renormalised; a row with temperature 0 is one-hot at its argmax (first on ties). The
    filtering is the transformers engine's own sampler's (``engines/sampling.filtered_probs``: only the
    top max(k) logits are selected when every sampled row has a top-k), scattered back over the vocabulary."""
    import torch

    from srd_worker.engines.sampling import filtered_probs

    greedy = temps == 0
    out = torch.zeros_like(logits)
    out.scatter_(1, torch.argmax(logits, dim=-1, keepdim=True), 1.0)
    if bool(greedy.all()):
        return out
    probs, sorted_idx = filtered_probs(logits, temps, top_k, top_p)
    sampled = torch.zeros_like(logits).scatter_(1, sorted_idx, probs)
    return torch.where(greedy.unsqueeze(1), out, sampled)


def sample_from(probs: Any, rng: Any) -> int:
    """Inverse-CDF draw from a numpy probability vector with one uniform from ``rng``; never a
    zero-probability token."""
    import numpy as np

    cdf = np.cumsum(probs, dtype=np.float64)
    u = rng.random() * cdf[-1]
    idx = int(np.searchsorted(cdf, u, side="right"))
    idx = min(idx, len(cdf) - 1)
    while probs[idx] <= 0 and idx > 0:  # float edge at the top of the cdf
        idx -= 1
    return idx


# ---------------------------------------------------------------------------------------------------
# The harness


def batches(lengths: Sequence[int], size: int, by_length: bool) -> list[list[int]]:
    """Request indices per harness batch: chunks of ``size`` in input order, or (``by_length``) of each
    group of equal prompt length, shortest first, so a row is never left-padded at the start."""
    order = list(range(len(lengths)))
    groups = [order]
    if by_length:
        keyed: dict[int, list[int]] = {}
        for i in order:
            keyed.setdefault(lengths[i], []).append(i)
        groups = [keyed[k] for k in sorted(keyed)]
    return [g[s : s + size] for g in groups for s in range(0, len(g), size)]


def speculate(
    engine: Any, requests: Sequence[GenerationRequest], rule: VerifyRule, *, draft_model: str, gamma: int
) -> list[SpeculativeGeneration]:
    """``SpeculativeEngine.speculate`` for a ``TransformersEngine`` (see the module docstring)."""
    if gamma < 1:
        raise ConfigError(f"gamma must be >= 1, got {gamma}")
    draft = draft_for(engine, draft_model)
    slots: list[SpeculativeGeneration | None] = [None] * len(requests)
    for batch in batches(
        [len(r.prompt_ids) for r in requests], engine.max_batch_size, engine.batch_invariant
    ):
        gens = _speculate_batch(engine, draft, [requests[i] for i in batch], batch, rule, gamma)
        for i, gen in zip(batch, gens, strict=True):
            slots[i] = gen
    out = [g for g in slots if g is not None]
    if len(out) != len(requests):
        raise EngineError(f"speculate returned {len(out)} generations for {len(requests)} requests")
    return out


class _Side:
    """One model's cache, attention mask and per-row pending tokens over the batch's active rows."""

    def __init__(self, model: Any, cache_kw: str, has_ltk: bool, pending: list[list[int]]) -> None:
        from transformers import DynamicCache

        self.model, self.cache_kw, self.has_ltk = model, cache_kw, has_ltk
        self.cache = DynamicCache()
        self.mask: Any = None  # (rows, slots) long
        self.pending = pending  # per active row: tokens committed but not yet fed
        self.passes = 0

    def forward(self, ids: Any, new_mask: Any, positions: Any, keep: int) -> Any:
        import torch

        self.mask = new_mask if self.mask is None else torch.cat([self.mask, new_mask], 1)
        kwargs = {self.cache_kw: self.cache, "use_cache": True}
        if self.has_ltk:
            kwargs["logits_to_keep"] = keep
        out = self.model(input_ids=ids, attention_mask=self.mask, position_ids=positions, **kwargs).logits
        self.passes += 1
        return out[:, -keep:, :].float()

    def select(self, rows: list[int]) -> None:
        import torch

        sel = torch.tensor(rows, dtype=torch.long, device=self.mask.device)
        self.cache.batch_select_indices(sel)
        self.mask = self.mask[sel]
        self.pending = [self.pending[r] for r in rows]


def _pending_batch(
    side: _Side, lengths: list[int], extra: Any, pad: int, device: Any
) -> tuple[Any, Any, Any]:
    """Input ids, new mask columns and positions for feeding each row's pending tokens (left-padded to
    the longest) followed by ``extra`` (rows×e tensor of draft tokens, or None)."""
    import torch

    rows = len(side.pending)
    width = max(len(p) for p in side.pending)
    e = 0 if extra is None else extra.shape[1]
    ids = torch.full((rows, width + e), pad, dtype=torch.long)
    mask = torch.zeros((rows, width + e), dtype=torch.long)
    pos = torch.zeros((rows, width + e), dtype=torch.long)
    for r, p in enumerate(side.pending):
        m = len(p)
        start = lengths[r] - m  # position of the first pending token
        if m:
            ids[r, width - m : width] = torch.tensor(p, dtype=torch.long)
            mask[r, width - m : width] = 1
            pos[r, width - m : width] = torch.arange(start, start + m)
        if e:
            mask[r, width:] = 1
            pos[r, width:] = torch.arange(lengths[r], lengths[r] + e)
    if e:
        ids[:, width:] = extra
    return ids.to(device), mask.to(device), pos.to(device)


def _speculate_batch(
    engine: Any,
    draft: DraftModel,
    requests: list[GenerationRequest],
    index: list[int],
    rule: VerifyRule,
    gamma: int,
) -> list[SpeculativeGeneration]:
    import numpy as np
    import torch

    n = len(requests)
    if n == 0:
        return []
    tok = engine.tokenizer
    vocab = draft.vocab
    max_context = min(engine.max_context, draft.max_context)
    budgets = [token_budget(i, r, max_context) for i, r in enumerate(requests)]
    results: list[list[int]] = [[] for _ in range(n)]
    reasons = ["length"] * n
    stats = [
        {
            "draft_forward_passes": 0,
            "target_forward_passes": 0,
            "iterations": 0,
            "drafted": 0,
            "accepted": 0,
            "verified": 0,
        }
        for _ in range(n)
    ]
    counts: list[dict[str, int]] = [{} for _ in range(n)]
    rngs = [np.random.default_rng(None if r.params.seed is None else int(r.params.seed)) for r in requests]
    stop_strings = [r.params.stop for r in requests]
    max_stop = [max((len(s) for s in ss), default=0) for ss in stop_strings]

    active = [i for i in range(n) if budgets[i] > 0]
    lengths = {i: len(requests[i].prompt_ids) for i in active}  # live tokens per row (prompt + emitted)
    t_side = _Side(
        engine.model,
        engine._cache_kw,
        engine._has_logits_to_keep,
        [list(requests[i].prompt_ids) for i in active],
    )
    d_side = _Side(
        draft.model, draft.cache_kw, draft.has_logits_to_keep, [list(requests[i].prompt_ids) for i in active]
    )
    pad = tok.pad_token_id
    device = engine.device

    def param_tensors(rows: list[int]) -> tuple[Any, Any, Any]:
        ps = [requests[i].params for i in rows]
        return (
            torch.tensor([p.temperature for p in ps], dtype=torch.float32, device=device),
            torch.tensor([p.top_k for p in ps], dtype=torch.long, device=device),
            torch.tensor([p.top_p for p in ps], dtype=torch.float32, device=device),
        )

    with torch.inference_mode():
        while active:
            temps, ks, ps = param_tensors(active)
            greedy = [requests[i].params.temperature == 0 for i in active]
            lens = [lengths[i] for i in active]
            rows = len(active)
            # ---- draft γ tokens (the first step also feeds each row's pending tokens)
            q_logits = torch.empty((rows, gamma, vocab), dtype=torch.float32)
            q_probs = torch.empty((rows, gamma, vocab), dtype=torch.float32)
            drafted = torch.empty((rows, gamma), dtype=torch.long)
            ids, new_mask, pos = _pending_batch(d_side, lens, None, pad, device)
            for s in range(gamma):
                logits = d_side.forward(ids, new_mask, pos, 1)[:, -1, :vocab]
                probs = processed_probs(logits, temps, ks, ps)
                q_logits[:, s], q_probs[:, s] = logits.cpu(), probs.cpu()
                qn = q_probs[:, s].numpy()
                for r in range(rows):
                    drafted[r, s] = (
                        int(np.argmax(qn[r])) if greedy[r] else sample_from(qn[r], rngs[active[r]])
                    )
                if s < gamma - 1:
                    ids = drafted[:, s : s + 1].to(device)
                    new_mask = torch.ones((rows, 1), dtype=torch.long, device=device)
                    pos = torch.tensor([[lens[r] + s] for r in range(rows)], dtype=torch.long, device=device)
            d_fed = gamma - 1  # draft tokens the draft cache holds at the end of this iteration
            # ---- one target pass over pending + the γ draft tokens
            ids, new_mask, pos = _pending_batch(t_side, lens, drafted, pad, device)
            p_logits = t_side.forward(ids, new_mask, pos, gamma + 1)[:, :, :vocab]
            p_probs = processed_probs(
                p_logits.reshape(rows * (gamma + 1), vocab),
                temps.repeat_interleave(gamma + 1),
                ks.repeat_interleave(gamma + 1),
                ps.repeat_interleave(gamma + 1),
            ).reshape(rows, gamma + 1, vocab)
            p_logits_np, p_probs_np = p_logits.cpu().numpy(), p_probs.cpu().numpy()
            q_logits_np, q_probs_np, drafted_list = q_logits.numpy(), q_probs.numpy(), drafted.tolist()
            # ---- verify each row, emit, mask the rejected slots
            keep_rows: list[int] = []
            t_slots, d_slots = t_side.mask.shape[1], d_side.mask.shape[1]
            for r, i in enumerate(active):
                step = SpecStep(
                    draft_tokens=drafted_list[r],
                    q=q_probs_np[r],
                    p=p_probs_np[r],
                    q_logits=q_logits_np[r],
                    p_logits=p_logits_np[r],
                    greedy=greedy[r],
                )
                verdict = rule.verify(index[i], step, rngs[i])
                acc = int(verdict.accepted)
                if not 0 <= acc <= gamma:
                    raise EngineError(f"verification rule accepted {acc} of {gamma} draft tokens")
                st = stats[i]
                st["iterations"] += 1
                st["drafted"] += gamma
                st["accepted"] += acc
                st["verified"] += verified_positions(acc, gamma)
                st["draft_forward_passes"] += gamma
                st["target_forward_passes"] += 1
                for k, v in verdict.counts.items():
                    counts[i][k] = counts[i].get(k, 0) + int(v)
                finished = False
                emitted = 0
                for t in drafted_list[r][:acc] + [int(verdict.token)]:
                    results[i].append(t)
                    emitted += 1
                    if t in tok.eos_token_ids:
                        reasons[i], finished = "eos", True
                    elif max_stop[i] and engine._hit_stop(results[i], stop_strings[i], max_stop[i]):
                        reasons[i], finished = "stop", True
                    elif len(results[i]) >= budgets[i]:
                        reasons[i], finished = "length", True
                    if finished:
                        break
                rule.emitted(index[i], emitted)
                if finished:
                    continue
                keep_rows.append(r)
                lengths[i] += acc + 1
                # target slots of this iteration: the last gamma are the draft tokens
                if acc < gamma:
                    t_side.mask[r, t_slots - gamma + acc :] = 0
                # draft slots: the last d_fed are draft tokens 1..γ-1
                if acc < d_fed:
                    d_side.mask[r, d_slots - d_fed + acc :] = 0
                t_side.pending[r] = [int(verdict.token)]
                d_side.pending[r] = ([drafted_list[r][gamma - 1]] if acc == gamma else []) + [
                    int(verdict.token)
                ]
            if not keep_rows:
                break
            if len(keep_rows) < rows:
                t_side.select(keep_rows)
                d_side.select(keep_rows)
                active = [active[r] for r in keep_rows]

    engine.stats.forward_passes += t_side.passes
    engine.stats.generated_tokens += sum(len(x) for x in results)
    out = []
    for i in range(n):
        out.append(
            SpeculativeGeneration(
                token_ids=results[i],
                text=tok.decode(results[i]),
                finish_reason=reasons[i],
                logprobs=None,
                stats={**stats[i], **counts[i]},
            )
        )
    return out


def check_draft_model(name: str) -> None:
    """Refuse (``ConfigError``) a draft model name that cannot be loaded here, without loading it: a name
    ``engines.loading`` knows, a local folder holding ``config.json``, or a Hugging Face id already in the
    local cache."""
    from pathlib import Path

    from srd_worker.engines.loading import (
        DEFAULT_MODEL,
        SMOLLM2_NAMES,
        TESTBED_DIR,
        TESTBED_MODELS,
        TINY_MODEL,
    )

    if name in (TINY_MODEL, *SMOLLM2_NAMES):
        return
    if name in TESTBED_MODELS:
        folder = TESTBED_DIR / TESTBED_MODELS[name]
        if not (folder / "config.json").is_file():
            raise ConfigError(
                f"draft_model '{name}': the testbed model is missing ({folder}); run srdq testbed build"
            )
        return
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(
                f"draft_model '{name}': the folder has no config.json, so it is not a model folder"
            )
        return
    if name.count("/") == 1 and not name.startswith((".", "/", "~")):
        try:
            from huggingface_hub import try_to_load_from_cache

            if isinstance(try_to_load_from_cache(name, "config.json"), str):
                return
        except Exception:  # noqa: BLE001 - an invalid id is reported below
            pass
    raise ConfigError(
        f"draft_model '{name}' is not a local model folder, a Hugging Face id in the local cache, or a "
        f"model srdq knows ({', '.join(sorted(TESTBED_MODELS))}, {TINY_MODEL}, {DEFAULT_MODEL})"
    )
