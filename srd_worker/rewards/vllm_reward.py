"""Outcome reward through vLLM's pooling (reward / classification) models; vLLM imported lazily.

Same input as the HF ORM (``hf_orm.rm_chat_ids``: the RM's chat template, user = question, assistant =
the partial response with stop strings removed, the model card's system prompt for known RMs), sent as
token ids (``TokensPrompt``). The reward is the model's scalar output at the LAST token: for a
sequence-classification RM (AceMath-7B-RM) vLLM pools the last token itself and returns one value; for a
per-token reward model it returns one value per token and the last one is taken. Anything else (several
labels per token) raises RewardError: use ``hf-prm`` for process reward models.

vLLM side: ``LLM(model, runner="pooling")`` (vLLM >= 0.10), falling back to ``task="reward"`` (older
releases), with ``gpu_memory_utilization`` for the RM's share of the GPU (the generator takes
``Settings.gpu_memory_utilization``; the two must sum below 1). Scores come from ``LLM.reward`` where it
exists (older vLLM), else ``LLM.encode(pooling_task=...)`` (``classify`` when the model is a sequence
classifier, else ``token_classify``; vLLM 0.32). Depending on the vLLM version and model, vLLM may
apply an activation (sigmoid) to classifier outputs: the scale can differ from ``hf-orm``'s raw logit, the ranking does not
(the activation is monotonic). Batching is vLLM's own scheduling; ``max_tokens_per_batch`` bounds how many
prompt tokens one ``reward`` call submits.

On vLLM's CPU build the RM gets a fixed KV cache of ``cpu_kv_cache_gb`` GiB (``kv_cache_memory_bytes``)
instead of ``gpu_memory_utilization``. ``close()`` shuts its engine down (as ``VLLMEngine.close``).

Verified on vLLM's CPU build (tests/vllm): a random-weight ``LlamaForSequenceClassification`` saved with
``save_pretrained``. Not verified: real 7B reward models, CUDA GPUs.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from srd_worker.errors import RewardError
from srd_worker.extras import vllm_hint
from srd_worker.rewards.batching import cut_at_stop, pack_batches
from srd_worker.rewards.hf_orm import check_pairs, default_system, rm_chat_ids

INSTALL_HINT = vllm_hint("the 'vllm-rm' reward", "use hf-orm:MODEL")


def _import_vllm() -> Any:
    try:
        return importlib.import_module("vllm")
    except ImportError as exc:
        raise RewardError(f"{INSTALL_HINT} ({exc})") from exc


def _last_scalar(data: Any, n_tokens: int, i: int) -> float:
    import torch

    t = torch.as_tensor(data).float().cpu()
    if t.numel() == 1:
        return float(t.reshape(-1)[0])
    if t.ndim == 1 and t.shape[0] == n_tokens:
        return float(t[-1])
    if t.ndim == 2 and t.shape[0] == n_tokens and t.shape[1] == 1:
        return float(t[-1, 0])
    raise RewardError(
        f"item {i}: vLLM returned a pooled output of shape {tuple(t.shape)} for {n_tokens} tokens; "
        "vllm-rm takes one scalar per sequence or per token (use hf-prm for process reward models)"
    )


class VLLMReward:
    """Scalar reward of a vLLM pooling model on (question, partial response); module docstring."""

    def __init__(
        self,
        model_name_or_path: str,
        *,
        gpu_memory_utilization: float = 0.3,
        cpu_kv_cache_gb: float = 1.0,
        tensor_parallel_size: int = 1,
        dtype: str = "bfloat16",
        max_tokens_per_batch: int = 65536,
        system: str | None = "auto",
        stop: Sequence[str] = (),
        llm: Any = None,
        tokenizer: Any = None,
        **llm_kwargs: Any,
    ) -> None:
        vllm = _import_vllm()
        from srd_worker.engines.vllm_engine import (
            LLMProcesses,
            close_at_exit,
            prepare_process,
            start_llm,
            vllm_on_cpu,
        )

        if max_tokens_per_batch < 1:
            raise RewardError(f"max_tokens_per_batch must be >= 1, got {max_tokens_per_batch}")
        self.name = f"vllm-rm:{model_name_or_path}"
        self.model_name = str(model_name_or_path)
        self.system = default_system(self.model_name) if system == "auto" else system
        self.stop = tuple(stop)
        self.max_tokens_per_batch = int(max_tokens_per_batch)
        self._tokens_prompt = importlib.import_module("vllm.inputs").TokensPrompt
        if tokenizer is None:
            from srd_worker.rewards.hf_common import load_tokenizer

            tokenizer = load_tokenizer(self.model_name)
        self.tokenizer = tokenizer
        self._owns_llm = llm is None
        self._procs = LLMProcesses()
        if llm is None:
            prepare_process({"tensor_parallel_size": int(tensor_parallel_size)})
            common = dict(
                model=self.model_name,
                dtype=dtype,
                tensor_parallel_size=int(tensor_parallel_size),
                **llm_kwargs,
            )
            if vllm_on_cpu():  # vLLM's CPU build: a fixed KV cache, not a share of the machine's RAM
                common.setdefault("kv_cache_memory_bytes", int(float(cpu_kv_cache_gb) * (1 << 30)))
            else:
                common["gpu_memory_utilization"] = float(gpu_memory_utilization)

            def make() -> Any:
                try:
                    return vllm.LLM(runner="pooling", **common)
                except TypeError:  # vLLM < 0.10 has no `runner`
                    return vllm.LLM(task="reward", **common)

            llm, self._procs = start_llm(make)
            close_at_exit(self)  # cached by the registry: closed when the process exits, if not before
        self.llm = llm

    def close(self) -> None:
        """Shut the pooling model's vLLM engine down (as ``VLLMEngine.close``); idempotent."""
        if not self._owns_llm:  # a lent LLM is its lender's to shut down
            self.llm = None
            return
        from srd_worker.engines.vllm_engine import close_llm

        close_llm(self, self._procs)

    def input_ids(self, question: str, response: str) -> list[int]:
        return rm_chat_ids(self.tokenizer, question, cut_at_stop(response, self.stop), system=self.system)

    def _pool(self, prompts: list[Any]) -> list[Any]:
        fn = getattr(self.llm, "reward", None)  # vLLM < 0.11
        if fn is not None:
            return list(fn(prompts, use_tqdm=False))
        task = self._pooling_task()
        if task is None:
            return list(self.llm.encode(prompts, use_tqdm=False))
        return list(self.llm.encode(prompts, use_tqdm=False, pooling_task=task))

    def _pooling_task(self) -> str | None:
        """vLLM >= 0.11 (0.32 checked) wants ``encode(..., pooling_task=...)``: ``classify`` for a
        sequence-classification RM (one score per sequence), else a per-token task (last token taken)."""
        tasks = getattr(self.llm, "supported_tasks", None)
        if not tasks:
            return None
        for task in ("classify", "token_classify", "reward"):
            if task in tasks:
                return task
        raise RewardError(f"{self.name}: vLLM serves this model for {sorted(tasks)}, not as a reward model")

    def score(self, prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
        check_pairs(prompts, responses)
        ids = [self.input_ids(q, r) for q, r in zip(prompts, responses, strict=True)]
        out: list[float] = [0.0] * len(ids)
        for batch in pack_batches([len(s) for s in ids], self.max_tokens_per_batch):
            results = self._pool([self._tokens_prompt(prompt_token_ids=ids[i]) for i in batch])
            if len(results) != len(batch):
                raise RewardError(f"vLLM returned {len(results)} rewards for {len(batch)} sequences")
            for i, res in zip(batch, results, strict=True):
                out[i] = _last_scalar(res.outputs.data, len(ids[i]), i)
        return out
