"""Loading Hugging Face reward checkpoints (shared by the ORM and PRM adapters).

- ``resolve_device``: ``auto`` means CUDA when there is one, else CPU.
- ``load_tokenizer`` / ``load_head_model``: from a local folder or a Hugging Face id; a failure names the
  model. ``load_head_model`` refuses a checkpoint whose classification head was not in the file (transformers
  would silently initialise it at random and every score would be noise), unless ``remap`` can rebuild the
  head from the checkpoint's own tensors (a PRM saved with another head layout, see hf_prm.py).
- ``checkpoint_tensors``: named tensors read straight from a checkpoint's safetensors files.
- ``run_batches``: the token-budget batching loop (sort by length, pack, score, restore input order).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from srd_worker.errors import RewardError
from srd_worker.rewards.batching import pack_batches
from srd_worker.settings import resolve_dtype


def resolve_device(device: str) -> str:
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def torch_dtype(name: Any) -> Any:
    import torch

    if not isinstance(name, str):
        return name
    try:
        return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]
    except KeyError:
        raise RewardError(f"unknown dtype '{name}'; choose bfloat16, float16 or float32") from None


def load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise RewardError(f"cannot load the tokenizer of reward model '{path}': {exc}") from exc


def checkpoint_tensors(path: str, names: Sequence[str]) -> dict[str, Any]:
    """The tensors called ``names`` that the checkpoint at ``path`` holds (absent names are left out)."""
    from safetensors import safe_open
    from transformers.utils import cached_file

    quiet = dict(_raise_exceptions_for_missing_entries=False, _raise_exceptions_for_connection_errors=False)
    files: list[str] = []
    index = cached_file(path, "model.safetensors.index.json", **quiet)
    if index:
        with open(index, encoding="utf-8") as fh:
            weight_map = json.load(fh).get("weight_map", {})
        for shard in sorted({weight_map[n] for n in names if n in weight_map}):
            f = cached_file(path, shard, **quiet)
            if f:
                files.append(f)
    else:
        f = cached_file(path, "model.safetensors", **quiet)
        if f:
            files.append(f)
    out: dict[str, Any] = {}
    for f in files:
        with safe_open(f, framework="pt") as st:
            keys = set(st.keys())
            for n in names:
                if n in keys:
                    out[n] = st.get_tensor(n)
    return out


def load_head_model(
    auto_cls: Any,
    path: str,
    *,
    num_labels: int,
    dtype: Any,
    device: str,
    remap: Callable[[Any, str], set[str]] | None = None,
) -> Any:
    """``auto_cls.from_pretrained(path, num_labels=...)`` in eval mode on ``device``. RewardError when weights
    are missing from the checkpoint and ``remap(model, path)`` (which returns the parameter names it
    restored from the checkpoint's own tensors) does not restore all of them."""
    from srd_worker.engines.loading import quiet_transformers

    quiet_transformers()
    try:
        model, info = auto_cls.from_pretrained(
            path,
            num_labels=num_labels,
            dtype=torch_dtype(resolve_dtype(dtype, str(device)) if isinstance(dtype, str) else dtype),
            output_loading_info=True,
        )
    except (OSError, ValueError) as exc:
        raise RewardError(f"cannot load reward model '{path}': {exc}") from exc
    except RuntimeError as exc:  # a head of another shape (transformers refuses mismatched sizes)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RewardError(
            f"reward model '{path}' has no trained weights for a {num_labels}-label head (the "
            f"checkpoint's head has another shape: {first}). Check the reward kind (hf-orm / "
            "hf-prm and its style)"
        ) from exc
    missing = set(info.get("missing_keys", ())) | {
        k if isinstance(k, str) else k[0] for k in info.get("mismatched_keys", ())
    }
    if missing and remap is not None:
        missing -= remap(model, path)
    if missing:
        shown = ", ".join(sorted(missing)[:4]) + (" ..." if len(missing) > 4 else "")
        raise RewardError(
            f"reward model '{path}' has no trained weights for {shown} (the checkpoint is not a "
            f"{auto_cls.__name__.replace('AutoModelFor', '')} model with {num_labels} label(s) in a layout srdq "
            "reads); its scores would be random. Check the model id and the reward kind (hf-orm / hf-prm "
            "and its style)"
        )
    model.eval()
    return model.to(device)


def run_batches(
    lengths: Sequence[int], max_tokens: int, score_batch: Callable[[list[int]], list[float]]
) -> list[float]:
    """Score every sequence with ``score_batch(indices)`` over token-budget batches (``pack_batches``);
    the scores come back in input order."""
    out: list[float | None] = [None] * len(lengths)
    for batch in pack_batches(lengths, max_tokens):
        scores = score_batch(batch)
        if len(scores) != len(batch):
            raise RewardError(f"reward batch returned {len(scores)} scores for {len(batch)} sequences")
        for i, s in zip(batch, scores, strict=True):
            out[i] = float(s)
    scored = [s for s in out if s is not None]
    if len(scored) != len(out):
        raise RewardError("a sequence was left out of every reward batch")
    return scored


def right_padded(seqs: Sequence[Sequence[int]], pad_id: int, device: Any) -> tuple[Any, Any]:
    """(input_ids, attention_mask) for right-padded ``seqs`` (causal models: padding after the real tokens
    changes nothing before it)."""
    import torch

    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, s in enumerate(seqs):
        ids[row, : len(s)] = torch.tensor(list(s), dtype=torch.long)
        mask[row, : len(s)] = 1
    return ids.to(device), mask.to(device)


def pad_id_of(tokenizer: Any) -> int:
    for cand in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if cand is not None:
            return int(cand)
    return 0


# ---------------------------------------------------------------------------------------------------
# Differentiable scores (rewards/base.py DifferentiableReward; ALGORITHMS.md §9)

#: Stands in for the soft tokens while a template is rendered; the text is split around it.
SOFT_MARK = "<<srdq-soft-tokens>>"


class SoftEmbedder:
    """Maps soft one-hot rows over a POLICY vocabulary into a reward model's input embeddings.

    Alignment by token string (``utils.align_vocab`` in the ∇-Reasoner reference): the row of policy id
    ``v`` is the reward model's embedding of the token with the same string, or zero when the reward's
    tokenizer has no such token. When the two vocabularies are identical (the testbed's policy and reward
    model share one tokenizer) the reward's embedding matrix is used as it is. The alignment is built once
    per policy vocabulary (cached by the list's identity)."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.weight = model.get_input_embeddings().weight
        self._cache: dict[int, tuple[Any, Any, float]] = {}  # id(policy_vocab) -> (vocab, matrix, overlap)
        self.forward_passes = 0

    def _own_vocab(self) -> list[str | None]:
        inverse = {int(i): t for t, i in self.tokenizer.get_vocab().items()}
        return [inverse.get(i) for i in range(int(self.weight.shape[0]))]

    def aligned(self, policy_vocab: Sequence[str | None]) -> tuple[Any, float]:
        """(``[V_policy, d]`` embedding matrix, fraction of the policy's tokens with a counterpart)."""
        import torch

        hit = self._cache.get(id(policy_vocab))
        if hit is not None and hit[0] is policy_vocab:
            return hit[1], hit[2]
        own = self._own_vocab()
        if list(policy_vocab) == own:
            matrix, overlap = self.weight, 1.0
        else:
            index = {t: i for i, t in enumerate(own) if t is not None}
            rows = [index.get(t, -1) if t is not None else -1 for t in policy_vocab]
            idx = torch.tensor(rows, dtype=torch.long, device=self.weight.device)
            keep = (idx >= 0).to(self.weight.dtype).unsqueeze(1)
            matrix = (self.weight.detach()[idx.clamp(min=0)] * keep).detach()
            overlap = float((idx >= 0).float().mean()) if rows else 0.0
        self._cache = {id(policy_vocab): (policy_vocab, matrix, overlap)}
        return matrix, overlap

    def embed(
        self, before: Sequence[int], soft: Any, after: Sequence[int], policy_vocab: Sequence[str | None]
    ) -> Any:
        """``[1, T, d]`` input embeddings: ``before`` ids, the soft rows, ``after`` ids (reward ids)."""
        import torch

        matrix, _ = self.aligned(policy_vocab)
        if soft.dim() != 2 or soft.shape[1] != matrix.shape[0]:
            raise RewardError(f"soft tokens must be [L, {matrix.shape[0]}], got {list(soft.shape)}")
        dev = self.weight.device
        parts = []
        if before:
            parts.append(self.weight.detach()[torch.tensor(list(before), dtype=torch.long, device=dev)])
        parts.append(soft.to(device=dev, dtype=matrix.dtype) @ matrix)
        if after:
            parts.append(self.weight.detach()[torch.tensor(list(after), dtype=torch.long, device=dev)])
        return torch.cat(parts, 0).unsqueeze(0)


def split_at_mark(tokenizer: Any, text: str) -> tuple[list[int], list[int]]:
    """Token ids of the text before and after ``SOFT_MARK`` (each part encoded on its own, no extra
    special tokens). RewardError when the template lost the mark."""
    if text.count(SOFT_MARK) != 1:
        raise RewardError("the reward template did not keep the place of the soft tokens")
    before, after = text.split(SOFT_MARK)
    enc = lambda s: list(tokenizer.encode(s, add_special_tokens=False)) if s else []  # noqa: E731
    return enc(before), enc(after)


class SoftScoring:
    """What the HF ORM and PRM adapters share of the differentiable score: a lazily built ``SoftEmbedder``
    over the reward's ``model`` and ``tokenizer``, the vocabulary overlap and the forward-pass count."""

    model: Any
    tokenizer: Any
    can_differentiate = True

    def vocab_overlap(self, policy_vocab: Sequence[str | None]) -> float:
        return self._soft().aligned(policy_vocab)[1]

    def _soft(self) -> SoftEmbedder:
        if getattr(self, "_embedder", None) is None:
            self._embedder = SoftEmbedder(self.model, self.tokenizer)
        return self._embedder

    @property
    def soft_forward_passes(self) -> int:
        return self._soft().forward_passes
