"""Offline calibration for EASD and CSD (docs/ALGORITHMS.md §5.3, §6.3): ``srdq calibrate``.

One pass of speculative decoding (the lossless rule; greedy by default, the setting CSD's memory is built
in) over the prompts of a calibration split, with a recording rule that sees every verified position (the
accepted draft tokens and the first rejected one):

- EASD: the per-token entropies of the draft's and the target's distributions at those positions, raw
  (softmax at temperature 1) and processed, reported as percentiles → ``tau_q`` / ``tau_p``; a greedy pass
  (temperature 0) gives no processed percentiles (``null``: its processed distributions are one-hot, so
  every entropy is 0 and such thresholds would let the entropy test always pass);
- CSD: every rejection pair (draft token, target token = argmax of the target's logits) with its count,
  the offline correction memory ``OCM_CALIBRATE`` builds → the ``memory`` file.

The output is one JSON file holding both; ``csd --set memory=FILE`` reads its ``pairs``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from srd_worker.engines.base import GenerationRequest, SamplingParams, SpecStep, Verdict
from srd_worker.methods.base import derive_seed
from srd_worker.methods.speculative_rules import LosslessRule, Stateless, entropy, memory_key, prob_entropy


class RecordingRule(Stateless):
    """The lossless rule, recording entropies and rejection pairs at every verified position."""

    def __init__(self, temperature: float = 0.0) -> None:
        self.inner, self.temperature = LosslessRule(), temperature
        self.entropies: dict[str, dict[str, list[float]]] = {
            source: {"draft": [], "target": []} for source in ("raw", "tempered", "processed")
        }
        self.pairs: Counter[str] = Counter()

    def verify(self, row: int, step: SpecStep, rng: Any) -> Verdict:
        verdict = self.inner.verify(row, step, rng)
        for i in range(min(verdict.accepted + 1, len(step.draft_tokens))):
            self.entropies["raw"]["draft"].append(entropy(step.q_logits[i]))
            self.entropies["raw"]["target"].append(entropy(step.p_logits[i]))
            if self.temperature > 0:  # softmax at the sampling temperature, before top-k/top-p
                self.entropies["tempered"]["draft"].append(entropy(step.q_logits[i] / self.temperature))
                self.entropies["tempered"]["target"].append(entropy(step.p_logits[i] / self.temperature))
            self.entropies["processed"]["draft"].append(prob_entropy(step.q[i]))
            self.entropies["processed"]["target"].append(prob_entropy(step.p[i]))
        if verdict.accepted < len(step.draft_tokens):
            x = step.draft_tokens[verdict.accepted]
            t = int(np.argmax(step.p_logits[verdict.accepted]))
            if x != t:
                self.pairs[memory_key(x, t)] += 1
        return verdict


def calibrate(
    engine: Any,
    prompts: Sequence[Sequence[int]],
    *,
    draft_model: str,
    gamma: int = 5,
    temperature: float = 0.0,
    top_p: float = 0.9,
    top_k: int = 50,
    max_new_tokens: int = 256,
    percentiles: Sequence[float] = (70, 80, 90),
    seed: int = 0,
    batch: int = 32,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Run the calibration pass over ``prompts`` (token ids) and return the calibration record."""
    rule = RecordingRule(temperature)
    tokens = 0
    for start in range(0, len(prompts), batch):
        chunk = prompts[start : start + batch]
        reqs = [
            GenerationRequest(
                tuple(p),
                SamplingParams(
                    temperature=temperature,
                    top_p=top_p,
                    top_k=top_k,
                    max_new_tokens=max_new_tokens,
                    seed=derive_seed(seed, str(start + j), 0, 0, "calibrate"),
                ),
            )
            for j, p in enumerate(chunk)
        ]
        gens = engine.speculate(reqs, rule, draft_model=draft_model, gamma=gamma)
        tokens += sum(len(g.token_ids) for g in gens)
        if progress is not None:
            progress(min(start + batch, len(prompts)), len(prompts))
    thresholds: dict[str, Any] = {
        source: {
            model: {f"{p:g}": float(np.percentile(vals, p)) if vals else None for p in percentiles}
            for model, vals in by_model.items()
        }
        for source, by_model in rule.entropies.items()
    }
    notes = {}
    if temperature == 0:  # greedy: the processed distributions are one-hot, every entropy 0
        thresholds["processed"] = thresholds["tempered"] = None
        notes["processed_note"] = (
            "greedy calibration: the processed distributions are one-hot (entropy 0); calibrate with "
            "--temperature > 0 for entropy_source=processed or tempered thresholds"
        )
    return {
        "kind": "speculative_calibration",
        "draft_model": draft_model,
        "settings": {
            "gamma": gamma,
            "temperature": temperature,
            "top_p": top_p,
            "top_k": top_k,
            "max_new_tokens": max_new_tokens,
            "seed": seed,
        },
        "prompts": len(prompts),
        "generated_tokens": tokens,
        "positions": len(rule.entropies["raw"]["target"]),
        "entropy_percentiles": thresholds,
        **notes,
        "mismatches": int(sum(rule.pairs.values())),
        "pairs": dict(sorted(rule.pairs.items(), key=lambda kv: (-kv[1], kv[0]))),
    }
