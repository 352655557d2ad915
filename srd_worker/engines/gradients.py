"""Differentiable access to a transformers policy (``PolicyGradients`` in engines/base.py, CAP_GRADIENTS).

Used by gradient-based decoding (∇-Reasoner, ALGORITHMS.md §9) and by rewards that score with the
policy itself (the LM judge's soft score). The operations:

- ``teacher_forced_logits(prefix, tokens)``: one no-grad forward over ``prefix + tokens`` giving the
  logits that predict each of ``tokens`` (the rollout's per-position ``Z`` of §9.1);
- ``soft_logits(segments)``: one forward with ``inputs_embeds`` built from token ids and soft one-hot
  matrices (``soft @ W_in``, the soft matrix cast to the embedding's dtype); gradients flow to the soft
  matrices only: the weights are never updated and their gradients are never accumulated (callers take
  ``torch.autograd.grad`` w.r.t. their own tensors);
- ``teacher_forced_hidden`` / ``project``: the same positions' final hidden states, and the output head
  that maps them to logits (differentiably), for the ``latents`` embedder;
- ``vocab_tokens()``: the token string of every embedding row, for vocabulary alignment with a reward
  model's tokenizer.

Each call is one sequence (no batching, no padding), so a forward never depends on other requests.
``forward_passes`` counts the forwards made here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from srd_worker.errors import EngineError


class TransformersGradients:
    """``PolicyGradients`` over a Hugging Face causal LM (see the module docstring)."""

    def __init__(self, model: Any, hf_tokenizer: Any, max_context: int) -> None:
        self.model = model
        self.hf_tokenizer = hf_tokenizer
        self.max_context = max_context
        self.embeddings = model.get_input_embeddings().weight
        self.vocab_size = int(self.embeddings.shape[0])
        self.device = self.embeddings.device
        self.forward_passes = 0
        self._vocab: list[str | None] | None = None

    def vocab_tokens(self) -> list[str | None]:
        if self._vocab is None:
            inverse = {int(i): t for t, i in self.hf_tokenizer.get_vocab().items()}
            self._vocab = [inverse.get(i) for i in range(self.vocab_size)]
        return self._vocab

    def _check_length(self, n: int) -> None:
        if n > self.max_context:
            raise EngineError(f"{n} tokens exceed the policy's context of {self.max_context}")

    def teacher_forced_logits(self, prefix_ids: Sequence[int], tokens: Sequence[int]) -> Any:
        import torch

        if not prefix_ids:
            raise EngineError("teacher-forced logits need a non-empty prefix")
        seq = list(prefix_ids) + list(tokens)
        self._check_length(len(seq))
        if not tokens:
            return torch.zeros((0, self.vocab_size), dtype=torch.float32, device=self.device)
        ids = torch.tensor([seq], dtype=torch.long, device=self.device)
        with torch.inference_mode():
            logits = self.model(input_ids=ids, use_cache=False).logits[0].float()
        self.forward_passes += 1
        start = len(prefix_ids) - 1  # logits[i] predicts seq[i + 1]
        return logits[start : start + len(tokens)].clone()

    def teacher_forced_hidden(self, prefix_ids: Sequence[int], tokens: Sequence[int]) -> Any:
        import torch

        if not prefix_ids:
            raise EngineError("teacher-forced hidden states need a non-empty prefix")
        seq = list(prefix_ids) + list(tokens)
        self._check_length(len(seq))
        ids = torch.tensor([seq], dtype=torch.long, device=self.device)
        with torch.inference_mode():
            hidden = self.model(input_ids=ids, use_cache=False, output_hidden_states=True).hidden_states[-1][
                0
            ]
        self.forward_passes += 1
        start = len(prefix_ids) - 1
        return hidden[start : start + len(tokens)].float().clone()

    def project(self, hidden: Any) -> Any:
        head = self.model.get_output_embeddings()
        return head(hidden.to(head.weight.dtype)).float()

    def soft_logits(self, segments: Sequence[Any]) -> Any:
        import torch

        parts = []
        for seg in segments:
            if isinstance(seg, torch.Tensor):
                if seg.dim() != 2 or seg.shape[1] != self.vocab_size:
                    raise EngineError(f"a soft segment must be [L, {self.vocab_size}], got {list(seg.shape)}")
                parts.append(seg.to(device=self.device, dtype=self.embeddings.dtype) @ self.embeddings)
            elif len(seg):
                ids = torch.tensor(list(seg), dtype=torch.long, device=self.device)
                parts.append(self.embeddings[ids].detach())
        if not parts:
            raise EngineError("soft_logits needs at least one token")
        embeds = torch.cat(parts, 0).unsqueeze(0)
        self._check_length(int(embeds.shape[1]))
        with torch.enable_grad():
            logits = self.model(inputs_embeds=embeds, use_cache=False).logits[0].float()
        self.forward_passes += 1
        return logits
