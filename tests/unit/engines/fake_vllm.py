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


@dataclass
class PoolingOutput:
    data: Any


@dataclass
class PoolingRequestOutput:
    prompt_token_ids: list[int]
    outputs: PoolingOutput


class LLM:
    """``LLM(**kwargs)``; ``backend`` (class attribute, set by ``installed``) serves generate calls,
    ``pooler`` (a function of token ids) serves reward calls."""

    backend: Any = None
    pooler: Any = None
    instances: list[LLM] = []  # noqa: RUF012
    reject_runner = False

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
                plp = [None] + [{t: Logprob(v, 1)} for t, v in zip(ids[1:], lps, strict=True)]
                out[i] = RequestOutput(ids, plp, [CompletionOutput(0, "", [0], None, "length")])
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
            out[i] = RequestOutput(
                list(prompts[i]["prompt_token_ids"]),
                None,
                [CompletionOutput(0, "(vllm text: not used)", list(g.token_ids), lps, reason, why)],
            )
        return [o for o in out if o is not None]

    def reward(self, prompts: list[dict[str, Any]], use_tqdm: bool = True) -> list[PoolingRequestOutput]:
        self.calls.append((prompts, []))
        return [
            PoolingRequestOutput(p["prompt_token_ids"], PoolingOutput(self.pooler(p["prompt_token_ids"])))
            for p in prompts
        ]


@contextlib.contextmanager
def installed(backend: Any = None, pooler: Any = None, *, reject_runner: bool = False, cpu: bool = False):
    """``import vllm`` / ``vllm.inputs`` / ``vllm.platforms`` give this fake inside the block; ``cpu``
    makes it look like vLLM's CPU build (``current_platform.is_cpu()``), else a CUDA build."""
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
