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
    try:
        model, info = auto_cls.from_pretrained(
            path, num_labels=num_labels, dtype=torch_dtype(dtype), output_loading_info=True
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
    if any(s is None for s in out):
        raise RewardError("a sequence was left out of every reward batch")
    return [float(s) for s in out]  # type: ignore[arg-type]


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
