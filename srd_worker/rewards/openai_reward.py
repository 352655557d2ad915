"""Outcome reward served by a model server: ``openai-rm:MODEL`` (vLLM's ``POST /pooling``).

For a fleet whose workers hold no model (``--engine openai``, README *Model servers*): the reward model
runs on a server of its own (``vllm serve RM --runner pooling --served-model-name rm``) and the worker
sends it token ids. MODEL is the name the server serves the reward model under.

Input: the same as ``hf-orm`` and ``vllm-rm`` (``hf_orm.rm_chat_ids``: the RM's chat template, user =
the question, assistant = the partial response with stop strings removed, the model card's system prompt
for known RMs), built with the RM's tokenizer, loaded locally from ``SRDQ_RM_TOKENIZER`` (default MODEL;
only tokenizer files are read), and sent as token ids, never as text.

Request: one ``POST /pooling`` at the server's root (``SRDQ_RM_BASE_URL`` without its ``/v1``: vLLM
serves its pooling endpoints beside ``/v1``, not under it) per batch of sequences (packed under
``max_tokens_per_batch`` prompt tokens) with ``input`` = the token id lists, ``task`` = ``classify`` (a
sequence-classification RM: one value per sequence) and ``use_activation: false``, so the score is the
head's raw logit, as ``hf-orm`` gives it on the same checkpoint. A server that refuses ``classify`` for
the model (HTTP 400) is asked with ``token_classify`` (a per-token reward model: the last token's value
is taken) from then on. Anything else (several labels) raises RewardError: use ``hf-prm`` for process
reward models.

Transport: ``engines.openai_engine.OpenAIClient`` (retries with backoff on connection errors, timeouts,
429 and 5xx for ``SRDQ_OPENAI_RETRY_S``, then ``EngineUnavailable``, which puts a fleet's shard back
without counting an attempt), with the ``SRDQ_OPENAI_API_KEY``, ``SRDQ_OPENAI_TIMEOUT_S`` settings.

Scores are not kept in the score cache: the weights live on the server, so their revision is unknown to
srdq (``provenance.score_identity``). Verified against vLLM's own OpenAI server (CPU build, tests/vllm)
on a random-weight ``LlamaForSequenceClassification``: the scores equal ``hf-orm``'s on the same folder.
Not verified: other servers (TGI, SGLang), real 7B reward models, CUDA GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from srd_worker.errors import EngineError, EngineUnavailable, RewardError
from srd_worker.rewards.batching import cut_at_stop, pack_batches
from srd_worker.rewards.hf_orm import check_pairs, default_system, rm_chat_ids

#: Pooling tasks tried in order: one value per sequence, then one per token (the last one taken).
POOLING_TASKS = ("classify", "token_classify")


def last_scalar(data: Any, n_tokens: int, i: int) -> float:
    """The one score in a pooled output (JSON lists): a single value, or the last token's of one value per
    token; RewardError naming item ``i`` for any other shape."""
    if isinstance(data, int | float):
        return float(data)
    if isinstance(data, list) and len(data) == 1 and isinstance(data[0], int | float):
        return float(data[0])
    if isinstance(data, list) and len(data) == n_tokens and n_tokens > 0:
        last = data[-1]
        if isinstance(last, int | float):
            return float(last)
        if isinstance(last, list) and len(last) == 1 and isinstance(last[0], int | float):
            return float(last[0])
    shape = f"a list of {len(data)}" if isinstance(data, list) else type(data).__name__
    raise RewardError(
        f"item {i}: the reward server returned {shape} values for a sequence of {n_tokens} tokens; "
        "openai-rm takes one scalar per sequence or per token (use hf-prm for process reward models)"
    )


class OpenAIReward:
    """Scalar reward of a served pooling model on (question, partial response); module docstring."""

    def __init__(
        self,
        model: str,
        *,
        client: Any,
        tokenizer: Any,
        tokenizer_source: str | None = None,
        system: str | None = "auto",
        stop: Sequence[str] = (),
        max_tokens_per_batch: int = 65536,
    ) -> None:
        if max_tokens_per_batch < 1:
            raise RewardError(f"max_tokens_per_batch must be >= 1, got {max_tokens_per_batch}")
        self.name = f"openai-rm:{model}"
        self.model_name = str(model)
        self.tokenizer_source = str(tokenizer_source or model)
        self.base_url = str(client.base_url)
        # the model card's system prompt is found by the checkpoint's name, which the tokenizer's source
        # gives (the served name is often a short alias such as "rm")
        self.system = default_system(self.tokenizer_source) if system == "auto" else system
        self.stop = tuple(stop)
        self.max_tokens_per_batch = int(max_tokens_per_batch)
        self.task = POOLING_TASKS[0]
        self._client = client
        self._tokenizer = tokenizer

    def close(self) -> None:
        self._client.close()

    def input_ids(self, question: str, response: str) -> list[int]:
        return rm_chat_ids(self._tokenizer, question, cut_at_stop(response, self.stop), system=self.system)

    def _pool(self, ids: list[list[int]]) -> list[Any]:
        """The pooled outputs of ``ids`` in order, under ``self.task`` (moving to the next task the server
        accepts when it refuses this one)."""
        while True:
            body = {"model": self.model_name, "input": ids, "task": self.task, "use_activation": False}
            try:
                answer = self._client.call("POST", "/pooling", body)
                break
            except EngineUnavailable:
                raise  # the server is down, not refusing: the slice ends and resumes later
            except EngineError as exc:
                later = POOLING_TASKS[POOLING_TASKS.index(self.task) + 1 :]
                if "HTTP 400" not in str(exc) or not later:
                    raise RewardError(f"{self.name}: the reward server refused the request: {exc}") from exc
                self.task = later[0]
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, list) or len(data) != len(ids):
            got = len(data) if isinstance(data, list) else "no"
            raise RewardError(
                f"{self.name}: the reward server returned {got} results for {len(ids)} sequences"
            )
        by_index = {int(d.get("index", k)): d.get("data") for k, d in enumerate(data) if isinstance(d, dict)}
        if sorted(by_index) != list(range(len(ids))):
            raise RewardError(f"{self.name}: the reward server's results do not cover the {len(ids)} inputs")
        return [by_index[k] for k in range(len(ids))]

    def score(self, prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
        check_pairs(prompts, responses)
        ids = [self.input_ids(q, r) for q, r in zip(prompts, responses, strict=True)]
        out: list[float] = [0.0] * len(ids)
        for batch in pack_batches([len(s) for s in ids], self.max_tokens_per_batch):
            pooled = self._pool([ids[i] for i in batch])
            for i, data in zip(batch, pooled, strict=True):
                out[i] = last_scalar(data, len(ids[i]), i)
        return out
