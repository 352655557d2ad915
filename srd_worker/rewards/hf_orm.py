"""Outcome reward model with a Hugging Face sequence-classification head (AceMath-RM style; ALGORITHMS.md §0.2).

Input: the RM's OWN chat template (from its tokenizer) with user = the question and assistant = the
(partial) response, stop strings removed (``stop``: the response is cut at the first one), rendered without
a generation prompt and tokenised without extra special tokens, exactly as the AceMath-7B-RM model card
does. A system turn is added when ``system`` is given; ``system="auto"`` (the default) uses the model
card's system prompt for the models listed in ``KNOWN_SYSTEM_PROMPTS`` (AceMath-RM) and none otherwise.
A tokenizer without a chat template gets ``question + "\\n\\n" + response``.

Output: the scalar logit of the head (``num_labels=1``) at the last token, unnormalised (AceMath-7B-RM
gives about 17-20 on MATH500). The last token's hidden state is taken by position, so padding and a pad
token that also ends the template cannot shift it.

Batching: sequences are sorted by length and packed under ``max_tokens_per_batch`` padded tokens
(``rewards.batching``); scores come back in input order. A sequence longer than the model's
``max_position_embeddings`` raises RewardError naming the item.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from srd_worker.errors import RewardError
from srd_worker.rewards.batching import cut_at_stop
from srd_worker.rewards.hf_common import (
    SOFT_MARK,
    SoftScoring,
    load_head_model,
    load_tokenizer,
    pad_id_of,
    resolve_device,
    right_padded,
    run_batches,
    split_at_mark,
)

#: Model-card system prompts, matched by a lower-case substring of the model name.
KNOWN_SYSTEM_PROMPTS = {
    "acemath": "Please reason step by step, and check your final answer within \\boxed{}.",
}


def default_system(model_name: str) -> str | None:
    low = model_name.lower()
    return next((p for key, p in KNOWN_SYSTEM_PROMPTS.items() if key in low), None)


def rm_chat_text(tokenizer: Any, question: str, response: str, *, system: str | None = None) -> str:
    """The RM's chat template over (system, user=question, assistant=response), as text."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": system}] if system else []
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": response}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    return (f"{system}\n\n" if system else "") + f"{question}\n\n{response}"


def rm_chat_ids(tokenizer: Any, question: str, response: str, *, system: str | None = None) -> list[int]:
    """Token ids of the RM's chat template over (system, user=question, assistant=response)."""
    return list(
        tokenizer.encode(rm_chat_text(tokenizer, question, response, system=system), add_special_tokens=False)
    )


def check_pairs(prompts: Sequence[str], responses: Sequence[str]) -> None:
    if len(prompts) != len(responses):
        raise RewardError(f"got {len(prompts)} prompts but {len(responses)} responses")
    for i, (q, r) in enumerate(zip(prompts, responses, strict=True)):
        if not isinstance(q, str) or not isinstance(r, str):
            raise RewardError(
                f"item {i}: prompt and response must be text, got {type(q).__name__} and {type(r).__name__}"
            )


class HFOutcomeReward(SoftScoring):
    """Scalar logit of a sequence-classification RM on (question, partial response); module docstring."""

    def __init__(
        self,
        model_name_or_path: str,
        *,
        device: str = "auto",
        dtype: Any = "bfloat16",
        max_tokens_per_batch: int = 16384,
        system: str | None = "auto",
        stop: Sequence[str] = (),
        model: Any = None,
        tokenizer: Any = None,
    ) -> None:
        """Load the RM from ``model_name_or_path`` (a local folder or a Hugging Face id), or wrap an already
        built ``model`` + ``tokenizer`` (benchmarks; ``model_name_or_path`` is then only its name)."""
        from transformers import AutoModelForSequenceClassification

        if max_tokens_per_batch < 1:
            raise RewardError(f"max_tokens_per_batch must be >= 1, got {max_tokens_per_batch}")
        self.name = f"hf-orm:{model_name_or_path}"
        self.model_name = str(model_name_or_path)
        self.max_tokens_per_batch = int(max_tokens_per_batch)
        self.system = default_system(self.model_name) if system == "auto" else system
        self.stop = tuple(stop)
        if model is not None:
            if tokenizer is None:
                raise RewardError("a reward model passed in needs its tokenizer too")
            self.tokenizer, self.model = tokenizer, model.eval()
            self.device = next(model.parameters()).device
        else:
            self.device = resolve_device(device)
            self.tokenizer = load_tokenizer(self.model_name)
            self.model = load_head_model(
                AutoModelForSequenceClassification,
                self.model_name,
                num_labels=1,
                dtype=dtype,
                device=self.device,
            )
        self.pad_id = pad_id_of(self.tokenizer)
        self.max_context = int(getattr(self.model.config, "max_position_embeddings", 0) or 0) or None
        # Take the last token's hidden state ourselves when the head is the usual ``score`` linear layer
        # (Llama, Qwen2, Mistral, ...); otherwise rely on the model's own pooling.
        # The model's base transformer module (any torch module), or None: used only when ``_manual``.
        self._base: Any = getattr(self.model, getattr(self.model, "base_model_prefix", ""), None)
        self._manual = self._base is not None and hasattr(self.model, "score")
        if not self._manual and getattr(self.model.config, "pad_token_id", None) is None:
            self.model.config.pad_token_id = self.pad_id

    def input_ids(self, question: str, response: str) -> list[int]:
        return rm_chat_ids(self.tokenizer, question, cut_at_stop(response, self.stop), system=self.system)

    def score(self, prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
        check_pairs(prompts, responses)
        return self.score_ids([self.input_ids(q, r) for q, r in zip(prompts, responses, strict=True)])

    def score_ids(self, ids: Sequence[Sequence[int]]) -> list[float]:
        """Scores of already tokenised RM inputs (``input_ids``), batched under the token budget."""
        seqs = [list(s) for s in ids]
        for i, s in enumerate(seqs):
            if not s:
                raise RewardError(f"item {i}: the reward input is empty")
            if self.max_context and len(s) > self.max_context:
                raise RewardError(
                    f"item {i}: the reward input has {len(s)} tokens, more than the reward "
                    f"model's context of {self.max_context}"
                )
        return run_batches(
            [len(s) for s in seqs],
            self.max_tokens_per_batch,
            lambda batch: self._score_batch([seqs[i] for i in batch]),
        )

    # ------------------------------------------------------------------ differentiable score (SoftScoring)
    def soft_score(self, question: str, prefix: str, soft: Any, policy_vocab: Sequence[str | None]) -> Any:
        """The head's logit on (question, ``prefix`` + soft tokens) under the same template as ``score``,
        differentiable w.r.t. ``soft`` (rewards/base.py ``DifferentiableReward``). The template is rendered
        with a mark where the soft tokens go and the text on each side is tokenised on its own (exactly the
        ids ``score`` uses for a tokenizer without merges across that boundary, such as the testbed's)."""
        import torch

        text = rm_chat_text(
            self.tokenizer, question, cut_at_stop(prefix, self.stop) + SOFT_MARK, system=self.system
        )
        before, after = split_at_mark(self.tokenizer, text)
        emb = self._soft()
        embeds = emb.embed(before, soft, after, policy_vocab)
        if self.max_context and embeds.shape[1] > self.max_context:
            raise RewardError(
                f"the reward input has {embeds.shape[1]} tokens, more than the reward model's context "
                f"of {self.max_context}"
            )
        with torch.enable_grad():
            if self._manual:
                hidden = self._base(inputs_embeds=embeds).last_hidden_state
                out = self.model.score(hidden[:, -1])[0, 0]
            else:
                out = self.model(inputs_embeds=embeds).logits[0, 0]
        emb.forward_passes += 1
        return out.float()

    def _score_batch(self, seqs: list[list[int]]) -> list[float]:
        import torch

        ids, mask = right_padded(seqs, self.pad_id, self.device)
        with torch.inference_mode():
            if self._manual:
                hidden = self._base(input_ids=ids, attention_mask=mask).last_hidden_state
                last = torch.tensor([len(s) - 1 for s in seqs], device=hidden.device)
                logits = self.model.score(hidden[torch.arange(len(seqs), device=hidden.device), last])
            else:
                logits = self.model(input_ids=ids, attention_mask=mask).logits
        return [float(x) for x in logits.float()[:, 0].cpu()]
