"""Transformers engine: batched sampling from token ids on CPU or GPU (DESIGN.md, Contracts: Engine).

What it does:
- one left-padded batch for all requests (optionally cut into ``max_batch_size`` chunks), a KV cache
  (``DynamicCache``), explicit position ids so left padding does not shift positions;
- per-request temperature / top-k / top-p / max_new_tokens / stop strings / seed. Each request owns a
  ``torch.Generator`` seeded with its seed, and a token is drawn by inverse-CDF sampling with one uniform
  number from that generator, so a request's draws never depend on which other requests share the batch;
- rows that finish are dropped from the batch and the cache, so long and short requests mix cheaply
  (except with fixed rows, below);
- batch invariance (``batch_invariant=True``, the constructor's default; srdq's settings default to the
  faster padded batch and turn this on in the deterministic mode, ``Settings.deterministic``): a seeded
  request gets the same tokens whatever else is in the batch. Two things would otherwise leak in. (1) Left padding to the longest row
  changes the length of the attention reductions, and so the float rounding of every logit: requests are
  grouped by prompt length and each group runs unpadded. (2) The CPU matrix kernels switch algorithm with
  the number of rows (SmolLM2 in bf16: 1–3 rows give the same logits, 4 or more differ in the last bits),
  so each group is cut into chunks of exactly ``invariant_rows`` rows (default 4; dummy copies of a
  prompt fill a short chunk) and a row that finishes stays in place, so every forward pass has the same
  shapes alone or in company; each row samples from its own logits alone. With ``invariant_rows=0`` the
  row count follows the group (padding invariance only). ``batch_invariant=False`` packs every request
  into one padded batch. ``benchmarks/batch_invariance.py`` measures the divergence and the cost of each
  mode; tests/unit/engines/test_transformers_engine.py checks alone == in company. Teacher-forced scoring groups
  the same way (by total and continuation length, in fixed-row chunks).
- per-token logprobs (raw model distribution, temperature 1, no filtering — vLLM's default
  ``raw_logprobs`` convention) and teacher-forced scoring of continuations (``logprobs``): pairs whose
  continuations differ only in their last token are one row (a judge's candidate answers), and with the
  prefix store below a scored sequence is kept with the logprobs it computed, so re-scoring a grown or
  regenerated response feeds only its new tokens.

- prefix KV reuse across calls (``kv_reuse=True``; ``SRDQ_KV_REUSE``, on by default in Settings, off by
  default in the constructor): when a request's generation ends, its per-layer keys and values are kept
  in a content-addressed store (``engines/prefix_kv.py``, LRU under ``kv_reuse_mb``); a later request
  whose prompt shares a prefix of at least 16 tokens with a stored sequence feeds only the rest (a round
  of SRD continuing a candidate feeds one token; an edit at j* crops the stored cache to j*). In the
  batch-invariant modes such requests are grouped by (cached length, prompt length), so every forward
  pass is still unpadded and of ``invariant_rows`` rows. With ``batch_invariant=False`` every request of
  the call, cached or not, joins the padded batch (chunks of ``max_batch_size``): a row is [left pad to
  the longest cached length][its cached L_i positions][pad to the longest fed suffix][its suffix], the
  2D attention mask is 0 at every pad and the positions continue from L_i; a row's snapshot gathers only
  its real cache columns. The cached keys and values were computed in other forward passes (other
  shapes) than a full re-feed would use, so the next-token distributions agree up to float rounding,
  not bit for bit: ``kv_reuse=False`` (the ``deterministic`` mode) re-feeds every prompt and is what
  makes a resumed run byte-identical (README, *Engine modes*).

What it leaves out: speculative decoding (``engines/speculative.py`` is a separate harness), beam search.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from srd_worker.engines.base import (
    CAP_FULL_LOGITS,
    CAP_GRADIENTS,
    CAP_LOGPROBS,
    CAP_SAMPLING,
    Generation,
    GenerationRequest,
    SamplingParams,
    token_budget,
)
from srd_worker.engines.prefix_kv import BLOCK, KVEntry, PrefixKVStore
from srd_worker.engines.sampling import filtered_probs
from srd_worker.errors import EngineError

if TYPE_CHECKING:
    from srd_worker.settings import Settings


def _generators(requests: Sequence[GenerationRequest]) -> list[Any]:
    """One CPU ``torch.Generator`` per request, seeded with its seed (an unseeded request: from entropy)."""
    import torch

    gens = []
    for r in requests:
        g = torch.Generator(device="cpu")
        if r.params.seed is not None:
            g.manual_seed(int(r.params.seed) & 0xFFFF_FFFF_FFFF_FFFF)
        else:
            g.seed()
        gens.append(g)
    return gens


class HFTokenizer:
    """Adapts a Hugging Face tokenizer to the engine's Tokenizer protocol."""

    def __init__(self, tokenizer: Any) -> None:
        self.hf = tokenizer
        eos = set()
        if tokenizer.eos_token_id is not None:
            eos.add(int(tokenizer.eos_token_id))
        vocab = tokenizer.get_vocab()
        # chat models end a turn with these; generation must stop there too
        for special in ("<|im_end|>", "<|eot_id|>", "<|end|>"):
            if special in vocab:
                eos.add(int(vocab[special]))
        self.eos_token_ids = frozenset(eos)
        pad = tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else next(iter(sorted(eos))) if eos else 0)

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=True)

    def chat_prompt_ids(
        self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True
    ) -> list[int]:
        if not getattr(self.hf, "chat_template", None):
            text = "\n\n".join(m["content"] for m in messages) + "\n\n"
            return self.encode(text)
        text = self.hf.apply_chat_template(
            list(messages), add_generation_prompt=add_generation_prompt, tokenize=False
        )
        return list(self.hf.encode(text, add_special_tokens=False))


#: A call's long prompts are fed apart when that cuts the prompt positions it computes to this share or less.
PREFILL_APART_SHARE = 0.5


def prefill_split(fed: Sequence[int], prompts: Sequence[tuple[int, ...]]) -> int | None:
    """The fed length above which a padded call's rows are better fed apart first, or None. One padded
    batch computes rows × the longest fed suffix; feeding the distinct prompts of the rows above a
    threshold t first costs their count × their longest, and then every row is fed at most t tokens
    (those rows one: their prompt is stored). The t that costs least, when it cuts the positions to
    ``PREFILL_APART_SHARE`` of one batch's or less."""
    if len(fed) < 2:
        return None
    full = len(fed) * max(fed)
    best: tuple[int, int] | None = None
    for t in sorted(set(fed))[:-1] + [0]:
        long: dict[tuple[int, ...], int] = {}  # distinct long prompts, each fed its longest suffix
        for p, f in zip(prompts, fed, strict=True):
            if f > t:
                long[p] = max(long.get(p, 0), f)
        cost = len(long) * max(long.values()) + len(fed) * max(t, 1)
        if best is None or cost < best[0]:
            best = (cost, t)
    if best is None or best[0] > PREFILL_APART_SHARE * full:
        return None
    return best[1]


@dataclass
class _ScoreJob:
    """One distinct sequence to score: ``stem`` = prefix + continuation without its last token, ``need`` =
    the prefix's length (the first continuation token's index), ``last`` = the candidate last tokens
    read from the logits after the stem. Filled by ``_score_plan`` (entry, cached) and ``_score_batch``."""

    stem: tuple[int, ...]
    need: int
    last: list[int] = dataclasses.field(default_factory=list)
    entry: KVEntry | None = None
    cached: int = 0
    dummy: bool = False  # a fixed-row batch's filler
    body: list[float] = dataclasses.field(default_factory=list)
    last_logprobs: list[float] = dataclasses.field(default_factory=list)

    @property
    def plan(self) -> tuple[KVEntry, int] | None:
        return None if self.entry is None else (self.entry, self.cached)


@dataclass
class EngineStats:
    """Counters since the engine was built (for benchmarks and the ledger's sanity checks)."""

    generate_calls: int = 0
    generated_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens fed to the model
    reused_tokens: int = 0  # prompt tokens taken from the prefix KV store instead of fed
    reuse_crops: int = 0  # requests served by a stored sequence cut back (an SRD edit at j*)
    generate_seconds: float = 0.0
    forward_passes: int = 0
    prefills_apart: int = 0  # calls whose long prompts were fed apart first (``_prefill_apart``)


class TransformersEngine:
    name = "transformers"
    capabilities = frozenset({CAP_SAMPLING, CAP_LOGPROBS, CAP_FULL_LOGITS, CAP_GRADIENTS})

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 64,
        model_name: str = "",
        batch_invariant: bool = True,
        invariant_rows: int = 4,
        kv_reuse: bool = False,
        kv_reuse_mb: float = 1024.0,
    ) -> None:
        import torch

        self._torch = torch
        self.model = model
        self.tokenizer = tokenizer if isinstance(tokenizer, HFTokenizer) else HFTokenizer(tokenizer)
        self.device = next(model.parameters()).device
        self.max_batch_size = max_batch_size
        self.batch_invariant = batch_invariant
        if invariant_rows < 0:
            raise EngineError(f"invariant_rows must be >= 0, got {invariant_rows}")
        self.invariant_rows = invariant_rows
        self.model_name = model_name
        self.max_context = int(getattr(model.config, "max_position_embeddings", 2048) or 2048)
        self.stats = EngineStats()
        self.kv_store = PrefixKVStore(int(kv_reuse_mb * (1 << 20))) if kv_reuse else None
        #: teacher-forced scoring reads and fills the prefix store too (with ``kv_reuse``; ``logprobs``)
        self.score_from_cache = True
        #: feed a padded call's long prompts apart first when that saves positions (``_prefill_apart``)
        self.prefill_apart = True
        # transformers >= 5.2x names the KV cache argument `cache`; older releases `past_key_values`
        import inspect

        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._has_logits_to_keep = "logits_to_keep" in params

    @classmethod
    def from_name(
        cls,
        name: str,
        *,
        settings: Settings,
        max_batch_size: int = 64,
        engine_args: dict[str, Any] | None = None,
    ) -> TransformersEngine:
        """Build from a model name (see ``engines.loading``) using the settings' cache, dtype and device.
        ``engine_args`` (checked: ``engines.engine_args.TRANSFORMERS_ARGS``) go to ``from_pretrained``;
        their ``dtype`` wins over the settings', their ``max_batch_size`` over the argument's."""
        import torch

        from srd_worker.engines.loading import apply_attention_settings, load_model

        load_kwargs = dict(engine_args or {})
        dtype = str(load_kwargs.pop("dtype", settings.dtype))
        max_batch_size = int(load_kwargs.pop("max_batch_size", max_batch_size))
        device = settings.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        apply_attention_settings(settings)
        model, tokenizer = load_model(
            name, cache_dir=settings.cache_dir, dtype=dtype, device=device, load_kwargs=load_kwargs
        )
        return cls(
            model,
            tokenizer,
            max_batch_size=max_batch_size,
            model_name=name,
            **cls.mode_args(settings),
        )

    @staticmethod
    def mode_args(settings: Settings) -> dict[str, Any]:
        """The constructor's engine-mode arguments as the settings give them (README, *Engine modes*)."""
        return dict(
            batch_invariant=settings.batch_invariant,
            invariant_rows=settings.invariant_rows,
            kv_reuse=settings.kv_reuse,
            kv_reuse_mb=settings.kv_reuse_mb,
        )

    @property
    def mode(self) -> str:
        """``kv-reuse`` or ``deterministic`` (recorded in a run's provenance: it changes results)."""
        if self.kv_store is None:
            return "deterministic"
        return f"kv-reuse ({self.kv_store.budget_bytes / (1 << 20):g} MB)"

    @property
    def fixed_rows(self) -> int:
        """Rows of every forward pass (full batch invariance), or 0 when the row count follows the batch."""
        return self.invariant_rows if self.batch_invariant else 0

    def _batches(self, keys: Sequence[Any]) -> list[list[int]]:
        """Indices of the engine batches, in a fixed order: chunks of ``max_batch_size`` of the requests
        in input order, or (batch-invariant) of each group of equal key ((cached length, prompt length)), smallest key
        first, in chunks of ``invariant_rows`` (``max_batch_size`` when that is 0)."""
        order = list(range(len(keys)))
        size = self.fixed_rows or self.max_batch_size
        if not self.batch_invariant:
            groups = [order]
        else:
            by_key: dict[Any, list[int]] = {}
            for i in order:
                by_key.setdefault(keys[i], []).append(i)
            groups = [by_key[k] for k in sorted(by_key)]
        return [g[s : s + size] for g in groups for s in range(0, len(g), size)]

    # ------------------------------------------------------------------ generation
    @property
    def gradients(self) -> Any:
        """CAP_GRADIENTS: differentiable access to the model (``engines/gradients.py``), built on first use."""
        if getattr(self, "_gradients", None) is None:
            from srd_worker.engines.gradients import TransformersGradients

            self._gradients = TransformersGradients(self.model, self.tokenizer.hf, self.max_context)
        return self._gradients

    def close(self) -> None:
        """Empty the prefix KV store (no processes; the model is freed with the object). engines/base.py."""
        if self.kv_store is not None:
            self.kv_store.clear()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        slots: list[Generation | None] = [None] * len(requests)
        t0 = time.perf_counter()
        run = self._generate_fixed_rows if self.fixed_rows else self._generate_batch
        # every lookup happens before anything runs, so the batches' order cannot change what is reused
        plan = self._reuse_plan(requests)
        if not self.batch_invariant and self._prefill_apart(requests, plan):
            plan = self._reuse_plan(requests)  # the long prompts now come from the store
        # batch-invariant: grouped by (cached length, prompt length), so every pass stays unpadded (fresh
        # requests, cached length 0, first); otherwise one padded batch in input order whatever each
        # row's cached length (chunks of max_batch_size)
        keys = [
            (p[1] if p is not None else 0, len(r.prompt_ids)) for p, r in zip(plan, requests, strict=True)
        ]
        for batch in self._batches(keys):
            rows = run([requests[i] for i in batch], [plan[i] for i in batch])
            for i, gen in zip(batch, rows, strict=True):
                slots[i] = gen
        self.stats.generate_calls += 1
        self.stats.generate_seconds += time.perf_counter() - t0
        out = [g for g in slots if g is not None]
        if len(out) != len(requests):
            raise EngineError(f"engine returned {len(out)} generations for {len(requests)} requests")
        return out

    def _prefill_apart(
        self, requests: Sequence[GenerationRequest], plan: Sequence[tuple[KVEntry, int] | None]
    ) -> bool:
        """The padded mode (not batch-invariant) with the prefix store: when the call's padded batch
        would compute far more prompt positions than it feeds (new prompts of hundreds of tokens beside
        continuations fed a few tokens each: a shard window's or a row cap's next items, or n candidates of one prompt), first
        feed each distinct long prompt once, in a batch of its own, into the prefix store; the call then
        feeds every row a short suffix (``prefill_split``). One forward pass more; next-token
        distributions are those of a full feed up to float rounding (as for any prefix reuse)."""
        if self.kv_store is None or not self.prefill_apart:
            return False
        rows = [
            i
            for i, r in enumerate(requests)
            if len(r.prompt_ids) < self.max_context and r.params.max_new_tokens > 0
        ]
        cached = [0 if p is None else p[1] for p in plan]
        fed = [len(requests[i].prompt_ids) - cached[i] for i in rows]
        threshold = prefill_split(fed, [tuple(requests[i].prompt_ids) for i in rows])
        if threshold is None:
            return False
        distinct: dict[tuple[int, ...], GenerationRequest] = {}
        one = SamplingParams(temperature=0.0, max_new_tokens=1)  # the token it generates is dropped
        for i, f in zip(rows, fed, strict=True):
            if f > threshold and len(requests[i].prompt_ids) > BLOCK:
                distinct.setdefault(
                    tuple(requests[i].prompt_ids), GenerationRequest(requests[i].prompt_ids, one)
                )
        if not distinct:
            return False
        firsts = list(distinct.values())
        firsts_plan = self._reuse_plan(firsts)
        generated = self.stats.generated_tokens
        for batch in self._batches([0] * len(firsts)):
            self._generate_batch([firsts[i] for i in batch], [firsts_plan[i] for i in batch])
        self.stats.generated_tokens = generated  # not a generation of the call's
        self.stats.prefills_apart += 1
        return True

    def _reuse_plan(self, requests: Sequence[GenerationRequest]) -> list[tuple[KVEntry, int] | None]:
        """Per request: (stored entry, cached length L) when at least ``BLOCK`` prompt tokens can come
        from the prefix store (L <= len(prompt) - 1: one token at least is fed), else None."""
        plan: list[tuple[KVEntry, int] | None] = [None] * len(requests)
        if self.kv_store is None:
            return plan
        for i, r in enumerate(requests):
            if len(r.prompt_ids) >= self.max_context or r.params.max_new_tokens <= 0:
                continue  # token_budget decides (and reports) these on the plain path
            entry, common = self.kv_store.lookup(r.prompt_ids)
            cached = min(common, len(r.prompt_ids) - 1)
            if entry is not None and cached >= BLOCK:
                plan[i] = (entry, cached)
                self.stats.reuse_crops += cached < len(entry.tokens)
        return plan

    def _padded_prefix_cache(self, rows: list[tuple[KVEntry, int] | None], length: int) -> Any:
        """A DynamicCache of ``length`` positions per row: row k holds the first L_k positions of its
        entry right-aligned (left padding of zeros; None: all padding). The mask must hide the pads."""
        from transformers import DynamicCache

        some = next(r[0] for r in rows if r is not None)
        layers = []
        for li in range(len(some.kv)):
            k0, v0 = some.kv[li]
            keys = k0.new_zeros((len(rows), k0.shape[0], length, k0.shape[2]))
            values = v0.new_zeros((len(rows), v0.shape[0], length, v0.shape[2]))
            for row, r in enumerate(rows):
                if r is not None and r[1]:
                    entry, cached = r
                    keys[row, :, length - cached :] = entry.kv[li][0][:, :cached]
                    values[row, :, length - cached :] = entry.kv[li][1][:, :cached]
            layers.append((keys, values))
        return DynamicCache(ddp_cache_data=layers)

    def _padded_inputs(
        self, seqs: Sequence[Sequence[int]], plan: Sequence[tuple[KVEntry, int] | None]
    ) -> tuple[Any, Any, Any, Any]:
        """One padded batch of ``seqs`` whose first L_i tokens come from the prefix store (``plan``: per
        row (entry, L_i) or None): per row [left pad to the longest L][cached L_i][pad to the longest fed
        part][fed seq[L_i:]], pads masked out, positions continuing from L_i. Returns the input ids, the
        attention mask over cache and input, the position ids (on the model's device) and the prefix
        cache (None when no row has a cached part)."""
        torch = self._torch
        lens = [0 if p is None else p[1] for p in plan]
        lmax, width = max(lens), max(len(s) - cached for s, cached in zip(seqs, lens, strict=True))
        ids = torch.full((len(seqs), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for row, (s, cached) in enumerate(zip(seqs, lens, strict=True)):
            fed = s[cached:]
            ids[row, width - len(fed) :] = torch.tensor(fed, dtype=torch.long)
            mask[row, width - len(fed) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        if not lmax:
            return ids, mask, positions, None
        positions = positions + torch.tensor(lens, device=self.device).unsqueeze(1)
        past = torch.zeros((len(seqs), lmax), dtype=mask.dtype)
        for row, cached in enumerate(lens):
            past[row, lmax - cached :] = 1
        return (
            ids,
            torch.cat([past.to(mask.device), mask], 1),
            positions,
            self._padded_prefix_cache(list(plan), lmax),
        )

    def _snapshot(
        self,
        cache: Any,
        row: int,
        cols: list[tuple[int, int]],
        tokens: tuple[int, ...],
        source: Any,
        *,
        logprobs: tuple[int, list[float]] | None = None,
    ) -> None:
        """Store row ``row``'s keys and values at the cache columns ``cols`` ([start, end) spans, in
        order; together one per token of ``tokens``; pads between them are left out). ``logprobs``:
        (first token j, the teacher-forced logprobs of tokens j …) known for ``tokens`` (scoring); a
        scored sequence replaces the stored one it extends."""
        if self.kv_store is None or len(tokens) < BLOCK:
            return
        cols = [(a, b) for a, b in cols if b > a]
        if sum(b - a for a, b in cols) != len(tokens):
            raise EngineError(f"snapshot of {len(tokens)} tokens from cache columns {cols}")
        torch = self._torch
        kv = [
            (
                torch.cat([layer.keys[row, :, a:b] for a, b in cols], 1),  # a copy, never a view
                torch.cat([layer.values[row, :, a:b] for a, b in cols], 1),
            )
            for layer in cache.layers
        ]
        whole = source is not None and (logprobs is not None or source[1] == len(source[0].tokens))
        self.kv_store.put(tokens, kv, supersedes=source[0] if whole else None, logprobs=logprobs)

    def _generate_batch(
        self, requests: list[GenerationRequest], prefix: Sequence[tuple[KVEntry, int] | None] | None = None
    ) -> list[Generation]:
        """One padded batch; ``prefix``: per request, (stored entry, cached length) or None (feed it all)."""
        torch = self._torch
        from transformers import DynamicCache

        n = len(requests)
        if n == 0:
            return []
        tok = self.tokenizer
        results: list[list[int]] = [[] for _ in range(n)]
        logps: list[list[float]] = [[] for _ in range(n)]
        reasons: list[str] = ["length"] * n
        budgets = [token_budget(i, r, self.max_context) for i, r in enumerate(requests)]
        active = [i for i in range(n) if budgets[i] > 0]
        if not active:
            return [Generation([], "", "length", [] if r.params.logprobs else None) for r in requests]

        gens = _generators(requests)

        plan = list(prefix) if prefix is not None else [None] * n
        lens = [0 if p is None else p[1] for p in plan]
        ids, mask, positions, cache = self._padded_inputs(
            [requests[i].prompt_ids for i in active], [plan[i] for i in active]
        )
        if cache is None:
            cache = DynamicCache()
        lmax, max_len = max(lens[i] for i in active), ids.shape[1]
        self.stats.prefill_tokens += sum(len(requests[i].prompt_ids) - lens[i] for i in active)
        self.stats.reused_tokens += sum(lens[i] for i in active)
        # cache columns of row i's fed tokens: the cached part, then the suffix and what it generates
        spans = [(lmax - lens[i], lmax + max_len - len(requests[i].prompt_ids) + lens[i]) for i in range(n)]
        stop_strings = [r.params.stop for r in requests]
        max_stop = [max((len(s) for s in ss), default=0) for ss in stop_strings]

        with torch.inference_mode():
            step_input, step_pos = ids, positions
            while active:
                kwargs = {self._cache_kw: cache, "use_cache": True}
                if self._has_logits_to_keep:
                    kwargs["logits_to_keep"] = 1  # prefill: skip the lm_head on every prompt position
                logits = (
                    self.model(input_ids=step_input, attention_mask=mask, position_ids=step_pos, **kwargs)
                    .logits[:, -1, :]
                    .float()
                )
                self.stats.forward_passes += 1
                next_tokens, next_logps = self._sample(
                    logits, [requests[i].params for i in active], [gens[i] for i in active]
                )
                keep_rows = []
                for row, i in enumerate(active):
                    t = int(next_tokens[row])
                    results[i].append(t)
                    logps[i].append(float(next_logps[row]))
                    reason = self._finish_reason(results[i], stop_strings[i], max_stop[i], budgets[i])
                    if reason is not None:
                        reasons[i] = reason
                        fed = tuple(requests[i].prompt_ids) + tuple(results[i][:-1])
                        first, start = spans[i]  # cached part at [first, lmax), then from start on
                        cols = [(first, lmax), (start, start + len(fed) - lens[i])]
                        self._snapshot(cache, row, cols, fed, plan[i])
                    else:
                        keep_rows.append(row)
                        continue
                self.stats.generated_tokens += len(active)
                if not keep_rows:
                    break
                step_input = next_tokens.view(-1, 1)
                step_pos = step_pos[:, -1:] + 1
                mask = torch.cat(
                    [mask, torch.ones((mask.shape[0], 1), dtype=mask.dtype, device=mask.device)], 1
                )
                if len(keep_rows) < len(active):
                    sel = torch.tensor(keep_rows, dtype=torch.long, device=self.device)
                    cache.batch_select_indices(sel)
                    step_input, step_pos, mask = step_input[sel], step_pos[sel], mask[sel]
                    active = [active[row] for row in keep_rows]

        out = []
        for i, r in enumerate(requests):
            out.append(
                Generation(
                    token_ids=results[i],
                    text=tok.decode(results[i]),
                    finish_reason=reasons[i],
                    logprobs=logps[i] if r.params.logprobs else None,
                )
            )
        return out

    def speculate(
        self, requests: Sequence[GenerationRequest], rule: Any, *, draft_model: str, gamma: int
    ) -> list[Any]:
        """Draft-and-verify decoding with draft model ``draft_model`` (engines/base.py SpeculativeEngine;
        the harness is ``engines/speculative.py``)."""
        from srd_worker.engines.speculative import speculate

        return speculate(self, requests, rule, draft_model=draft_model, gamma=gamma)

    def _generate_fixed_rows(
        self, requests: list[GenerationRequest], prefix: Sequence[tuple[KVEntry, int] | None] | None = None
    ) -> list[Generation]:
        """Full batch invariance: requests of ONE prompt length run in a batch of exactly
        ``invariant_rows`` rows (dummy copies of the first prompt fill the batch), and a row that finishes
        stays in place (fed a pad token, its output ignored) so the row count never changes during
        generation; each row samples from its own logits alone. Every forward pass then has the same
        shapes whatever else was in the batch, and the CPU and GPU kernels give each row results that do
        not depend on the other rows' contents or positions (measured: benchmarks/batch_invariance.py)."""
        torch = self._torch
        from transformers import DynamicCache

        n, rows = len(requests), self.fixed_rows
        if n == 0:
            return []
        length = len(requests[0].prompt_ids)
        if n > rows or any(len(r.prompt_ids) != length for r in requests):
            raise EngineError("a fixed-row batch holds at most invariant_rows requests of one prompt length")
        tok = self.tokenizer
        results: list[list[int]] = [[] for _ in range(n)]
        logps: list[list[float]] = [[] for _ in range(n)]
        reasons: list[str] = ["length"] * n
        budgets = [token_budget(i, r, self.max_context) for i, r in enumerate(requests)]
        live = [i for i in range(n) if budgets[i] > 0]
        gens = _generators(requests)
        stop_strings = [r.params.stop for r in requests]
        max_stop = [max((len(s) for s in ss), default=0) for ss in stop_strings]

        # prefix: per request (stored entry, cached length), one cached length for the whole group
        plan: list[tuple[KVEntry, int] | None] = list(prefix) if prefix is not None else [None] * n
        cached = plan[0][1] if plan[0] is not None else 0
        if any((r[1] if r is not None else 0) != cached for r in plan):
            raise EngineError("a fixed-row batch holds requests of one cached length")
        prompts = [r.prompt_ids[cached:] for r in requests] + [requests[0].prompt_ids[cached:]] * (rows - n)
        ids = torch.tensor(prompts, dtype=torch.long, device=self.device)
        mask = torch.ones((rows, length), dtype=torch.long, device=self.device)
        positions = torch.arange(cached, length, device=self.device).expand(rows, length - cached)
        if live:
            self.stats.prefill_tokens += n * (length - cached)
            self.stats.reused_tokens += n * cached
        if cached and live:
            cache = self._padded_prefix_cache(plan + [plan[0]] * (rows - n), cached)
        else:
            cache = DynamicCache()
        step_input, step_pos = ids, positions
        with torch.inference_mode():
            while live:
                kwargs = {self._cache_kw: cache, "use_cache": True}
                if self._has_logits_to_keep:
                    kwargs["logits_to_keep"] = 1
                logits = (
                    self.model(input_ids=step_input, attention_mask=mask, position_ids=step_pos, **kwargs)
                    .logits[:, -1, :]
                    .float()
                )
                self.stats.forward_passes += 1
                next_input = [tok.pad_token_id] * rows
                still = []
                for i in live:
                    token, logp = self._sample(logits[i : i + 1], [requests[i].params], [gens[i]])
                    t = int(token[0])
                    results[i].append(t)
                    logps[i].append(float(logp[0]))
                    next_input[i] = t
                    reason = self._finish_reason(results[i], stop_strings[i], max_stop[i], budgets[i])
                    if reason is not None:
                        reasons[i] = reason
                    else:
                        still.append(i)
                self.stats.generated_tokens += len(live)
                live = still
                if not live:
                    break
                step_input = torch.tensor(next_input, dtype=torch.long, device=self.device).view(-1, 1)
                step_pos = step_pos[:, -1:] + 1
                mask = torch.cat([mask, torch.ones((rows, 1), dtype=mask.dtype, device=mask.device)], 1)
            for i in range(n):  # finished rows stayed in place: their first positions are theirs
                if results[i]:
                    tokens = tuple(requests[i].prompt_ids) + tuple(results[i][:-1])
                    self._snapshot(cache, i, [(0, len(tokens))], tokens, plan[i])
        return [
            Generation(
                token_ids=results[i],
                text=tok.decode(results[i]),
                finish_reason=reasons[i],
                logprobs=logps[i] if r.params.logprobs else None,
            )
            for i, r in enumerate(requests)
        ]

    def _finish_reason(
        self, token_ids: list[int], stops: tuple[str, ...], max_stop: int, budget: int
    ) -> str | None:
        """Why a row whose last sampled token ends ``token_ids`` stops now (eos, a stop string, its
        budget), or None while it goes on."""
        if token_ids[-1] in self.tokenizer.eos_token_ids:
            return "eos"
        if max_stop and self._hit_stop(token_ids, stops, max_stop):
            return "stop"
        if len(token_ids) >= budget:
            return "length"
        return None

    def _hit_stop(self, token_ids: list[int], stops: tuple[str, ...], max_stop: int) -> bool:
        # Decode only a tail long enough to hold any stop string (every token decodes to >= 1 char,
        # except specials, which never end a stop string).
        tail = self.tokenizer.decode(token_ids[-(max_stop + 2) :])
        return any(s and s in tail for s in stops)

    def _sample(self, logits: Any, params: list[Any], gens: list[Any]) -> tuple[Any, Any]:
        """One token per row: greedy where temperature == 0, else top-k / top-p filtered sampling with
        a uniform number from the row's own generator. Returns (tokens, raw logprobs of the tokens)."""
        torch = self._torch
        raw_logp = torch.log_softmax(logits, dim=-1)
        temps = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=logits.device)
        greedy = temps == 0
        tokens = torch.argmax(logits, dim=-1)
        if not bool(greedy.all()):
            top_k = torch.tensor([p.top_k for p in params], device=logits.device)
            top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=logits.device)
            probs, sorted_idx = filtered_probs(logits, temps, top_k, top_p)
            width = probs.shape[1]
            cdf = probs.cumsum(-1)
            u = torch.stack([torch.rand((), generator=g) for g in gens]).to(logits.device)
            u = u * cdf[:, -1]
            pick = torch.searchsorted(cdf, u.unsqueeze(1)).clamp(max=width - 1)
            # never pick a zero-probability token (float edge at the top of the cdf)
            pick = torch.minimum(pick, (probs > 0).sum(-1, keepdim=True) - 1)
            sampled = sorted_idx.gather(1, pick).squeeze(1)
            tokens = torch.where(greedy, tokens, sampled)
        return tokens, raw_logp.gather(1, tokens.unsqueeze(1)).squeeze(1)

    # ------------------------------------------------------------------ scoring
    def logprobs(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[list[float]]:
        """Teacher-forced logprobs of each continuation after its prefix (raw distribution).

        Pairs whose continuations differ only in their last token (a judge's candidate answers after one
        prompt) are computed once: each reads its last token from the same logits. With the prefix store
        (``kv_reuse`` and ``score_from_cache``) a scored sequence's keys and values are kept with the
        logprobs it computed, so re-scoring a grown response (SRD every Δ tokens) feeds only its new
        tokens (``_score_plan``); the logprobs then agree with a full pass up to float rounding.
        """
        for i, (p, c) in enumerate(pairs):
            if not p:
                raise EngineError(f"pair {i}: teacher-forced scoring needs a non-empty prefix")
            if len(p) + len(c) > self.max_context:
                raise EngineError(
                    f"pair {i}: {len(p) + len(c)} tokens exceed the context of {self.max_context}"
                )
        stems: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
        jobs: list[_ScoreJob] = []
        member: list[int] = []
        for p, c in pairs:
            if not c:
                member.append(-1)
                continue
            key = (tuple(int(t) for t in p), tuple(int(t) for t in c[:-1]))
            if key not in stems:
                stems[key] = len(jobs)
                jobs.append(_ScoreJob(key[0] + key[1], len(p)))
            job = jobs[stems[key]]
            member.append(stems[key])
            if int(c[-1]) not in job.last:
                job.last.append(int(c[-1]))
        self._score_plan(jobs)
        # fixed rows: grouped by shapes (cached length, stem length, logits kept); otherwise (cached
        # length, stem length) groups only when batch-invariant (padding invariance)
        if self.fixed_rows:
            keys: list[Any] = [(j.cached, len(j.stem), len(j.stem) - j.need) for j in jobs]
        else:
            keys = [(j.cached, len(j.stem)) for j in jobs]
        for batch in self._batches(keys):
            chunk = [jobs[i] for i in batch]
            if self.fixed_rows:  # dummy copies of the first job fill the batch
                chunk += [dataclasses.replace(chunk[0], dummy=True)] * (self.fixed_rows - len(chunk))
            self._score_batch(chunk)
        out: list[list[float]] = []
        for (_p, c), m in zip(pairs, member, strict=True):
            if m < 0:
                out.append([])
                continue
            job = jobs[m]
            out.append([*job.body, job.last_logprobs[job.last.index(int(c[-1]))]])
        return out

    def _score_plan(self, jobs: list[_ScoreJob]) -> None:
        """Each job's cached length C and entry: the stem's first C positions come from the prefix store
        when C >= ``BLOCK``. A stored entry sharing the stem's first ``common`` tokens gives keys and
        values for C <= common positions; the logprobs of the continuation's tokens at or below C then
        come from the entry's own (a scored sequence keeps what it computed), so C = common − 1 where
        the entry knows them, else C = need − 1 (only prompt tokens cached; every continuation logit
        computed). At least one stem token is always fed."""
        if self.kv_store is None or not self.score_from_cache:
            return
        for job in jobs:
            entry, common = self.kv_store.lookup(job.stem)
            if entry is None:
                continue
            # tokens 0 … last match the entry's, so its logprobs of tokens 1 … last hold for the stem
            last = min(common, len(job.stem)) - 1
            cached = min(common, job.need - 1, len(job.stem) - 1)
            if entry.knows(job.need, last) and last > cached:
                cached = min(last, len(job.stem) - 1)
            if cached >= BLOCK:
                job.entry, job.cached = entry, cached

    def _score_batch(self, jobs: list[_ScoreJob]) -> None:
        """One forward pass over the jobs' stems: [left pad to the longest cached length][cached C_i]
        [pad to the longest fed part][fed stem[C_i:]]; fills each job's ``body`` (logprobs of the stem's
        continuation tokens) and ``last_logprobs`` (of its candidate last tokens) and stores the stem's
        keys and values with the logprobs known for it."""
        torch = self._torch
        from transformers import DynamicCache

        real = [j for j in jobs if not j.dummy]
        ids, mask, positions, cache = self._padded_inputs([j.stem for j in jobs], [j.plan for j in jobs])
        lmax, width = max(j.cached for j in jobs), ids.shape[1]
        store = self.kv_store is not None and self.score_from_cache
        if cache is None and store:  # a cache only where the store keeps what it fills
            cache = DynamicCache()
        kwargs: dict[str, Any] = {self._cache_kw: cache, "use_cache": True} if cache is not None else {}
        if self._has_logits_to_keep:
            # logits are needed at stem positions need−1 … m−1 (past the cache): right alignment puts
            # them in the last columns, so the lm_head runs on those only
            kwargs["logits_to_keep"] = max(len(j.stem) - max(j.cached, j.need - 1) for j in jobs)
        with torch.inference_mode():
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, **kwargs).logits
            kept = logits.shape[1]
            self.stats.forward_passes += 1
            self.stats.prefill_tokens += sum(len(j.stem) - j.cached for j in real)
            self.stats.reused_tokens += sum(j.cached for j in real)
            for row, j in enumerate(jobs):
                if j.dummy:
                    continue
                m = len(j.stem)
                lo = max(j.cached, m - kept)  # the first stem position with logits here
                logp = torch.log_softmax(logits[row, kept - (m - lo) :].float(), dim=-1)
                targets = torch.tensor(j.stem[lo + 1 :], dtype=torch.long, device=logp.device)
                computed = logp[:-1].gather(1, targets.unsqueeze(1)).squeeze(1).tolist()  # tokens lo+1 … m−1
                j.last_logprobs = logp[-1, torch.tensor(j.last, device=logp.device)].tolist()
                known_from, known = lo + 1, computed
                if j.entry is not None and j.need <= lo:  # tokens need … C from the entry
                    known_from = j.entry.lp_from
                    known = j.entry.known_logprobs(known_from, lo) + computed
                j.body = known[j.need - known_from :]
                if store:
                    cols = [(lmax - j.cached, lmax), (lmax + width - (m - j.cached), lmax + width)]
                    self._snapshot(cache, row, cols, j.stem, j.plan, logprobs=(known_from, known))
