"""Temperature, top-k and top-p filtering of a batch of logits, the one implementation behind the transformers engine's
sampler (``TransformersEngine._sample``) and the speculative harness's processed distributions
(``engines/speculative.processed_probs``). torch is imported when called."""

from __future__ import annotations

from typing import Any


def filtered_probs(logits: Any, temps: Any, top_k: Any, top_p: Any) -> tuple[Any, Any]:
    """Row-wise temperature, then top-k (0 or ≥ the vocabulary = off), then top-p filtering of a batch of
    logits (B×V): each row's renormalised probabilities over its highest logits, in descending order, and
    their token ids, both B×W. top-p keeps the smallest prefix whose mass reaches it (the first token
    always). A greedy row (temperature 0) is scaled by 1 and counts as top-k 1, so it never widens the
    other rows' selection; its caller takes its argmax instead. When every row has a top-k below the
    vocabulary, W is the largest k and only those logits are selected (``torch.topk``, linear in the
    vocabulary); otherwise W is the vocabulary, stably sorted. Exactly tied logits at the k-th place may be
    chosen differently by the two paths. Shared by the transformers engine's sampler and the speculative
    harness's q and p (``engines/speculative.py``)."""
    import torch

    vocab = logits.shape[-1]
    greedy = temps == 0
    scaled = logits / torch.where(greedy, torch.ones_like(temps), temps).unsqueeze(1)
    ks = torch.where((top_k > 0) & (top_k < vocab), top_k, torch.full_like(top_k, vocab))
    ks = torch.where(greedy, torch.ones_like(ks), ks)
    width = int(ks.max())
    if width < vocab:  # only the top max(k) logits can carry mass: skip the full-vocabulary sort
        sorted_logits, sorted_idx = torch.topk(scaled, width, dim=-1, sorted=True)
    else:
        sorted_logits, sorted_idx = torch.sort(scaled, dim=-1, descending=True, stable=True)
    ranks = torch.arange(width, device=logits.device).unsqueeze(0)
    probs = torch.softmax(sorted_logits.masked_fill(ranks >= ks.unsqueeze(1), float("-inf")), dim=-1)
    before = probs.cumsum(-1) - probs
    probs = probs.masked_fill(before >= top_p.unsqueeze(1), 0.0)
    return probs / probs.sum(-1, keepdim=True), sorted_idx
