"""A stand-in for the parts of the ``vllm`` package that srdq uses, backed by a TransformersEngine.

It lets the vLLM adapters' translation code (sampling parameters, token-id prompts, finish reasons, EOS,
logprob entries, prompt logprobs, pooled rewards) run on a CPU. It mimics vLLM V1 behaviour the adapters
rely on and nothing more: outputs in input order; ``max_tokens >= 1``; ``top_k`` is -1 or positive; a stop
token (EOS or ``stop_token_ids``) is kept in ``token_ids``; the length cap is checked before EOS (so EOS on
the last allowed token reports ``"length"``); ``logprobs`` entries are ``{token id: Logprob}``;
``prompt_logprobs`` starts with None. vLLM's own ``text`` is deliberately wrong, since the adapter must
decode token ids itself. It is NOT vLLM: passing against it says nothing about vLLM's kernels or numerics.
"""

from __future__ import annotations

import contextlib
import sys
import types
from dataclasses import dataclass
from typing import Any

from srd_worker.engines.base import GenerationRequest
from srd_worker.engines.base import SamplingParams as SrdqParams


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None


class SamplingParams:
    def __init__(
        self,
        n: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        max_tokens: int | None = 16,
        seed: int | None = None,
        stop: list[str] | None = None,
        stop_token_ids: list[int] | None = None,
        include_stop_str_in_output: bool = False,
        logprobs: int | None = None,
        prompt_logprobs: int | None = None,
        detokenize: bool = True,
        skip_reading_prefix_cache: bool | None = None,
    ) -> None:
        if n != 1:
            raise ValueError("fake vllm: n must be 1")
        if max_tokens is None or max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        if top_k == 0 or top_k < -1:
            raise ValueError(f"top_k must be -1 (disable), or at least 1, got {top_k}")
        self.n, self.temperature, self.top_p, self.top_k = n, temperature, top_p, top_k
        self.max_tokens, self.seed, self.stop, self.stop_token_ids = max_tokens, seed, stop, stop_token_ids
        self.include_stop_str_in_output, self.logprobs = include_stop_str_in_output, logprobs
        self.prompt_logprobs, self.detokenize = prompt_logprobs, detokenize
        # vLLM V1: a request with prompt logprobs skips the prefix cache unless told otherwise
        self.skip_reading_prefix_cache = (
            prompt_logprobs is not None if skip_reading_prefix_cache is None else skip_reading_prefix_cache
        )


def TokensPrompt(*, prompt_token_ids: list[int]) -> dict[str, Any]:  # noqa: N802 - vLLM's name
    return {"prompt_token_ids": list(prompt_token_ids)}


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    prompt_token_ids: list[int]
    prompt_logprobs: list[dict[int, Logprob] | None] | None
    outputs: list[CompletionOutput]
    num_cached_tokens: int | None = 0


@dataclass
class PoolingOutput:
    data: Any


@dataclass
class PoolingRequestOutput:
    prompt_token_ids: list[int]
    outputs: PoolingOutput


class LLM:
    """``LLM(**kwargs)``; ``backend`` (class attribute, set by ``installed``) serves generate calls,
    ``pooler`` (a function of token ids) serves reward calls. With ``cache_block`` set (``installed``) it
    keeps vLLM's prefix cache as far as prompt logprobs see it: every scored or generated sequence's
    block-aligned prefixes are cached, and a prompt-logprobs request that reads the cache gets real
    entries only past its hit (``num_cached_tokens``), as vLLM 0.32 does."""

    backend: Any = None
    pooler: Any = None
    instances: list[LLM] = []  # noqa: RUF012
    reject_runner = False
    cache_block: int | None = None

    def __init__(self, **kwargs: Any) -> None:
        if "runner" in kwargs and self.reject_runner:
            raise TypeError("LLM got an unexpected keyword argument 'runner'")
        self.kwargs = kwargs
        self.calls: list[tuple[list[dict[str, Any]], list[SamplingParams]]] = []
        max_len = kwargs.get("max_model_len") or (self.backend.max_context if self.backend else 2048)
        self.shutdowns = 0
        self.llm_engine = types.SimpleNamespace(
            model_config=types.SimpleNamespace(max_model_len=max_len),
            engine_core=types.SimpleNamespace(shutdown=self._shutdown),
        )
        self.cached: set[tuple[int, ...]] = set()  # block-aligned prefixes in the prefix cache
        if self.cache_block:
            self.llm_engine.vllm_config = types.SimpleNamespace(
                cache_config=types.SimpleNamespace(
                    block_size=self.cache_block,
                    enable_prefix_caching=bool(kwargs.get("enable_prefix_caching")),
                )
            )
        type(self).instances.append(self)

    def _shutdown(self) -> None:  # vLLM 0.32: llm.llm_engine.engine_core.shutdown()
        self.shutdowns += 1

    def generate(
        self, prompts: list[dict[str, Any]], sampling_params: Any = None, use_tqdm: bool = True
    ) -> list[RequestOutput]:
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        assert len(params) == len(prompts)
        self.calls.append((prompts, params))
        out: list[RequestOutput | None] = [None] * len(prompts)
        gen_rows = []
        for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
            ids = p["prompt_token_ids"]
            if len(ids) > self.llm_engine.model_config.max_model_len:
                raise ValueError("prompt longer than max_model_len")
            if sp.prompt_logprobs:
                lps = self.backend.logprobs([(ids[:1], ids[1:])])[0]
                hit = 0 if sp.skip_reading_prefix_cache else self._hit(ids)
                # vLLM 0.32: n entries, those of tokens 1 … hit hold no data (here: the right token
                # with a wrong logprob, so an adapter that reads them fails the tests)
                plp = [None] + [
                    {t: Logprob(0.0 if j < hit else v, 1)}
                    for j, (t, v) in enumerate(zip(ids[1:], lps, strict=True))
                ]
                out[i] = RequestOutput(ids, plp, [CompletionOutput(0, "", [0], None, "length")], hit)
                self._cache(ids)
            else:
                gen_rows.append(i)
        reqs = []
        for i in gen_rows:
            sp = params[i]
            reqs.append(
                GenerationRequest(
                    tuple(prompts[i]["prompt_token_ids"]),
                    SrdqParams(
                        temperature=sp.temperature,
                        top_p=sp.top_p,
                        top_k=sp.top_k if sp.top_k > 0 else 0,
                        max_new_tokens=sp.max_tokens,
                        stop=tuple(sp.stop or ()),
                        seed=sp.seed,
                        logprobs=sp.logprobs is not None,
                    ),
                )
            )
        gens = self.backend.generate(reqs) if reqs else []
        for i, g in zip(gen_rows, gens, strict=True):
            sp = params[i]
            stop_ids = set(sp.stop_token_ids or ()) | set(self.backend.tokenizer.eos_token_ids)
            if len(g.token_ids) >= sp.max_tokens:
                reason, why = "length", None
            elif g.token_ids and g.token_ids[-1] in stop_ids:
                reason, why = "stop", g.token_ids[-1]
            elif g.finish_reason == "stop":
                reason, why = "stop", next(s for s in sp.stop if s in g.text)
            else:
                reason, why = "length", None
            lps = (
                [{t: Logprob(v, 1)} for t, v in zip(g.token_ids, g.logprobs, strict=True)]
                if sp.logprobs
                else None
            )
            if sp.logprobs and sp.logprobs > 1:  # the top k of the first token (one-token requests only)
                assert sp.max_tokens == 1, "the fake gives top-k logprobs for one-token requests only"
                lps = [{**self._top(list(prompts[i]["prompt_token_ids"]), sp.logprobs), **lps[0]}]
            out[i] = RequestOutput(
                list(prompts[i]["prompt_token_ids"]),
                None,
                [CompletionOutput(0, "(vllm text: not used)", list(g.token_ids), lps, reason, why)],
            )
            self._cache(list(prompts[i]["prompt_token_ids"]) + list(g.token_ids))
        return [o for o in out if o is not None]

    def _top(self, ids: list[int], k: int) -> dict[int, Logprob]:
        """The k most likely next tokens after ``ids`` under the backend's model, with their logprobs."""
        import torch

        with torch.inference_mode():
            logits = self.backend.model(input_ids=torch.tensor([ids])).logits[0, -1].float()
        values, tokens = torch.log_softmax(logits, -1).topk(k)
        return {int(t): Logprob(float(v), r + 1) for r, (t, v) in enumerate(zip(tokens, values, strict=True))}

    def _hit(self, ids: list[int]) -> int:
        """The longest cached block-aligned prefix of ``ids``, short of its last token (as vLLM)."""
        b = self.cache_block or 0
        hit = 0
        while b and hit + b <= len(ids) - 1 and tuple(ids[: hit + b]) in self.cached:
            hit += b
        return hit

    def _cache(self, ids: list[int]) -> None:
        if self.cache_block and self.kwargs.get("enable_prefix_caching"):
            b = self.cache_block
            self.cached.update(tuple(ids[:j]) for j in range(b, len(ids) + 1, b))

    def reward(self, prompts: list[dict[str, Any]], use_tqdm: bool = True) -> list[PoolingRequestOutput]:
        self.calls.append((prompts, []))
        return [
            PoolingRequestOutput(p["prompt_token_ids"], PoolingOutput(self.pooler(p["prompt_token_ids"])))
            for p in prompts
        ]


@contextlib.contextmanager
def installed(
    backend: Any = None,
    pooler: Any = None,
    *,
    reject_runner: bool = False,
    cpu: bool = False,
    cache_block: int | None = None,
):
    """``import vllm`` / ``vllm.inputs`` / ``vllm.platforms`` give this fake inside the block; ``cpu``
    makes it look like vLLM's CPU build (``current_platform.is_cpu()``), else a CUDA build;
    ``cache_block`` gives it a prefix cache of blocks of that many tokens (``LLM``)."""
    mod = types.ModuleType("vllm")
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = TokensPrompt
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(is_cpu=lambda: cpu)
    mod.platforms = platforms
    llm_cls = type(
        "LLM",
        (LLM,),
        {
            "backend": backend,
            "pooler": staticmethod(pooler) if pooler else None,
            "instances": [],
            "reject_runner": reject_runner,
            "cache_block": cache_block,
        },
    )
    mod.LLM, mod.SamplingParams, mod.inputs = llm_cls, SamplingParams, inputs
    saved = {k: sys.modules.get(k) for k in ("vllm", "vllm.inputs", "vllm.platforms")}
    sys.modules["vllm"], sys.modules["vllm.inputs"], sys.modules["vllm.platforms"] = mod, inputs, platforms
    try:
        yield mod
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
