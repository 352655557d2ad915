"""The speculative-decoding family (docs/ALGORITHMS.md §4–§6): ``speculative_sampling``, ``easd``, ``csd``.

One candidate per problem, decoded by the engine's draft-and-verify harness (``SpeculativeEngine.speculate``,
engines that declare ``full_logits``) in chunks of ``chunk_tokens`` tokens per round: each round is ONE
``speculate`` call over every unfinished item. The methods differ only in the verification rule they hand
the harness (``speculative_rules.py``). The state checkpoints the accepted tokens and the counters (and
CSD's per-item correction memory), never a KV cache: a resumed round prefills prompt + tokens again.
Randomness: one seed per item and round (``ctx.seed(state, 0, "spec")``), the request's own generator.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, NotRequired, TypeVar

from srd_worker.engines.base import (
    CAP_FULL_LOGITS,
    CAP_SAMPLING,
    GenerationRequest,
    SamplingParams,
    SpeculativeEngine,
    VerifyRule,
)
from srd_worker.errors import CapabilityError, ConfigError
from srd_worker.methods.base import Method, StepContext, new_state, param
from srd_worker.methods.pool import (
    DraftParams,
    PoolState,
    apply_generation,
    is_finished,
    new_candidate,
    pool_entries,
)

#: Harness counters summed per item (``SpeculativeGeneration.stats``) and rule counters.
COUNTERS = ("iterations", "drafted", "accepted", "verified", "draft_forward_passes", "target_forward_passes")


class SpecState(PoolState):
    spec: dict[str, int]  # COUNTERS + the rule's counters (easd_rejected, rescued, rejected)
    memory: NotRequired[dict[str, int]]  # CSD only: the online correction memory, "draft,target" -> count


@dataclasses.dataclass(frozen=True)
class SpeculativeParams(DraftParams):
    draft_model: str | None = param(
        None,
        "draft model: a local model folder or a name srdq knows (testbed-draft, tiny-random-llama, ...); "
        "must share the target's tokenizer; required",
    )
    gamma: int = param(5, "draft length γ: tokens the draft proposes per target forward pass")

    def validate(self) -> None:
        super().validate()
        if not self.draft_model:
            raise ConfigError(
                "this method needs a draft model: --set draft_model=PATH (a local model folder sharing the "
                "target's tokenizer) or --set draft_model=testbed-draft"
            )
        if self.gamma < 1:
            raise ConfigError(f"gamma must be >= 1, got {self.gamma}")


#: The params type of a speculative method (``SpeculativeParams`` or a subclass).
SpecParamsT = TypeVar("SpecParamsT", bound=SpeculativeParams)


class SpeculativeSampling(Method[SpecState, SpecParamsT]):
    """Lossless speculative sampling (Leviathan et al. 2023; Chen et al. 2023); greedy at temperature 0."""

    name = "speculative_sampling"
    honours_stop = False  # decodes token by token itself, not through StepContext.generate
    Params = SpeculativeParams
    summary = "draft model proposes γ tokens, the target verifies them (lossless accept–resample)"
    needs_capabilities: ClassVar[frozenset[str]] = frozenset({CAP_SAMPLING, CAP_FULL_LOGITS})
    rule_counters: ClassVar[tuple[str, ...]] = ()

    def init_state(self, item_id: str, question: str, prompt_ids: Sequence[int]) -> SpecState:
        state: SpecState = {
            **new_state(item_id, question, prompt_ids),
            "candidates": [new_candidate()],
            "spec": {k: 0 for k in COUNTERS + self.rule_counters},
        }
        return state

    def rule(self, states: Sequence[SpecState]) -> VerifyRule:
        # the rules are numpy math: imported when a run verifies, not by every `srdq` command that lists
        # the methods (numpy costs about 0.2 s of each command's start)
        from srd_worker.methods.speculative_rules import LosslessRule

        return LosslessRule()

    def step(self, states: list[SpecState], ctx: StepContext) -> list[SpecState]:
        p: SpeculativeParams = self.params
        engine = ctx.engine
        if not isinstance(engine, SpeculativeEngine):
            raise CapabilityError(
                f"method '{self.name}' needs an engine with speculative decoding (full_logits)"
            )
        todo = [s for s in states if not is_finished(s["candidates"][0])]
        requests, budgets = [], []
        for state in todo:
            cand = state["candidates"][0]
            budget = min(p.chunk_tokens, p.max_new_tokens - len(cand["tokens"]))
            sp = SamplingParams(
                temperature=p.temperature,
                top_p=p.top_p,
                top_k=p.top_k,
                max_new_tokens=budget,
                seed=ctx.seed(state, 0, "spec"),
            )
            requests.append(GenerationRequest(tuple(state["prompt_ids"] + cand["tokens"]), sp))
            budgets.append(budget)
        if todo:
            assert p.draft_model is not None  # validate() refuses a missing draft model
            t0 = time.perf_counter()
            gens = engine.speculate(requests, self.rule(todo), draft_model=p.draft_model, gamma=p.gamma)
            elapsed = time.perf_counter() - t0
            if len(gens) != len(requests):
                raise RuntimeError(f"engine returned {len(gens)} generations for {len(requests)} requests")
            total_out = sum(len(g.token_ids) for g in gens) or 1
            for state, req, budget, gen in zip(todo, requests, budgets, gens, strict=True):
                led = state["ledger"]
                comp = led["components"]["drafter"]
                led["gen_tokens"] += len(gen.token_ids)
                led["prefill_tokens"] += len(req.prompt_ids)
                led["lm_calls"] += 1
                comp["calls"] += 1
                comp["in_tokens"] += len(req.prompt_ids)
                comp["out_tokens"] += len(gen.token_ids)
                state["timing"]["drafter"] += elapsed * len(gen.token_ids) / total_out
                for k, v in gen.stats.items():
                    state["spec"][k] = state["spec"].get(k, 0) + int(v)
                apply_generation(ctx, state, state["candidates"][0], gen, budget, p.max_new_tokens)
        for state in states:
            state["round"] += 1
            state["done"] = is_finished(state["candidates"][0])
        return states

    def result(self, state: SpecState) -> dict[str, Any]:
        cand = state["candidates"][0]
        sp = state["spec"]
        gen = state["ledger"]["gen_tokens"]
        p: SpeculativeParams = self.params
        return {
            "response": cand["text"],
            "reward": None,
            "finish_reason": cand["finish"],
            "chosen": 0,
            "candidates": pool_entries(state["candidates"]),
            "draft_model": p.draft_model,
            "gamma": p.gamma,
            "acceptance_rate": sp["accepted"] / sp["drafted"] if sp["drafted"] else None,
            # a of §4.1 (per-token acceptance); a checkpoint from before the counter existed has none
            "acceptance_alpha": sp["accepted"] / sp["verified"] if sp.get("verified") else None,
            "mean_accepted_length": gen / sp["target_forward_passes"]
            if sp["target_forward_passes"]
            else None,
            **{k: sp.get(k, 0) for k in COUNTERS + self.rule_counters},
        }


# ---------------------------------------------------------------------------------------------------
# EASD


ENTROPY_SOURCES = ("raw", "tempered", "processed")
#: When EASD's entropy test runs (§5.2's ordering is PROPOSED, §10 item 10 open): ``accepted`` on a
#: drafted token that passed the standard test (the specification's proposal, the default); ``first`` on
#: every drafted token, before the standard test.
PENALTY_ORDERS = ("accepted", "first")


@dataclasses.dataclass(frozen=True)
class EASDParams(SpeculativeParams):
    tau_q: float | None = param(
        None,
        "draft entropy threshold τ_q in nats (a percentile of the draft's token entropies: srdq calibrate)",
    )
    tau_p: float | None = param(
        None,
        "target entropy threshold τ_p in nats (a percentile of the target's token entropies: srdq calibrate)",
    )
    top_n: int = param(10, "N of the top-N overlap test")
    overlap: float = param(0.5, "overlap threshold ρ_ov: |TopN(q) ∩ TopN(p)| / N at or above it")
    beta: float = param(
        1.0, "penalty β: the rejected token's target probability is scaled by 1 − β (1 = excluded)"
    )
    entropy_source: str = param(
        "raw",
        "entropies of the raw distributions (softmax at temperature 1), the tempered ones (softmax at the "
        "sampling temperature, full vocabulary: §5.2's reading) or the processed ones (after top-k/top-p)",
    )
    penalty_order: str = param(
        "accepted",
        "when the entropy test runs: accepted = on a drafted token that passed the standard test (§5.2's "
        "proposal); first = on every drafted token, before the standard test",
        in_id_at_default=False,
    )

    def validate(self) -> None:
        super().validate()
        if self.tau_q is None or self.tau_p is None:
            raise ConfigError(
                "easd needs entropy thresholds: --set tau_q=NATS --set tau_p=NATS "
                "(percentiles of each model's token entropies; `srdq calibrate` computes them)"
            )
        if self.top_n < 1:
            raise ConfigError(f"top_n must be >= 1, got {self.top_n}")
        if not 0 <= self.overlap <= 1:
            raise ConfigError(f"overlap must be in [0, 1], got {self.overlap}")
        if not 0 <= self.beta <= 1:
            raise ConfigError(f"beta must be in [0, 1], got {self.beta}")
        if self.entropy_source not in ENTROPY_SOURCES:
            raise ConfigError(
                f"entropy_source must be one of {', '.join(ENTROPY_SOURCES)}, got {self.entropy_source!r}"
            )
        if self.entropy_source == "tempered" and self.temperature == 0:
            raise ConfigError(
                "entropy_source=tempered needs temperature > 0 (greedy distributions are one-hot); "
                "use entropy_source=raw for greedy EASD"
            )
        if self.penalty_order not in PENALTY_ORDERS:
            raise ConfigError(
                f"penalty_order must be one of {', '.join(PENALTY_ORDERS)}, got {self.penalty_order!r}"
            )


class EASD(SpeculativeSampling[EASDParams]):
    """Entropy-aware speculative decoding (Su, Zhang, He, arXiv 2512.23765)."""

    name = "easd"
    Params = EASDParams
    summary = "speculative sampling that also rejects a draft token when both models are uncertain"
    rule_counters = ("easd_rejected",)

    def rule(self, states: Sequence[SpecState]) -> VerifyRule:
        p: EASDParams = self.params
        assert p.tau_q is not None and p.tau_p is not None  # validate() refuses missing thresholds
        from srd_worker.methods.speculative_rules import EASDRule

        return EASDRule(
            tau_q=float(p.tau_q),
            tau_p=float(p.tau_p),
            top_n=p.top_n,
            overlap=p.overlap,
            beta=p.beta,
            entropy_source=p.entropy_source,
            penalty_order=p.penalty_order,
            temperature=p.temperature,
        )


# ---------------------------------------------------------------------------------------------------
# CSD


def load_memory(path: str) -> dict[str, int]:
    """A correction memory file (``srdq calibrate``'s output): JSON ``{"pairs": {"d,t": count}}``."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        pairs = data["pairs"]
        return {str(k): int(v) for k, v in pairs.items()}
    except FileNotFoundError:
        raise ConfigError(f"memory file '{path}' does not exist") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(
            f"memory file '{path}' is not a correction memory (JSON with 'pairs'): {exc}"
        ) from None


@dataclasses.dataclass(frozen=True)
class CSDParams(SpeculativeParams):
    temperature: float = param(0.0, "sampling temperature; 0 = greedy, the paper's setting")
    gamma: int = param(6, "draft length γ (paper: 6)")
    lambda_count: int = param(6, "frequency threshold λ: a (draft, target) pair is rescued once seen λ times")
    tau: float = param(0.01, "gate ratio τ: rescue only if z(draft) − z(target) ≥ ln τ (target raw logits)")
    memory: str | None = param(
        None, "offline correction memory (the JSON file srdq calibrate writes); none = empty"
    )
    update_before_test: bool = param(True, "count the current mismatch before testing λ (false: after)")

    def validate(self) -> None:
        super().validate()
        if self.lambda_count < 0:
            raise ConfigError(f"lambda_count must be >= 0, got {self.lambda_count}")
        if self.tau < 0:
            raise ConfigError(f"tau must be >= 0, got {self.tau}")
        if self.memory:
            load_memory(self.memory)


class CSD(SpeculativeSampling[CSDParams]):
    """Calibrated speculative decoding (Zhou et al., arXiv 2604.13634), greedy."""

    name = "csd"
    Params = CSDParams
    summary = "greedy speculative decoding that rescues frequent, close draft/target mismatches"
    rule_counters = ("rescued", "rejected")

    def __init__(self, params: CSDParams) -> None:
        super().__init__(params)
        self._offline: dict[str, int] | None = None

    def init_state(self, item_id: str, question: str, prompt_ids: Sequence[int]) -> SpecState:
        state = super().init_state(item_id, question, prompt_ids)
        state["memory"] = {}
        return state

    def offline_memory(self) -> dict[str, int]:
        if self._offline is None:
            p: CSDParams = self.params
            self._offline = load_memory(p.memory) if p.memory else {}
        return self._offline

    def rule(self, states: Sequence[SpecState]) -> VerifyRule:
        p: CSDParams = self.params
        from srd_worker.methods.speculative_rules import CSDRule

        return CSDRule(
            offline=self.offline_memory(),
            online=[s["memory"] for s in states],
            lam=p.lambda_count,
            tau=p.tau,
            update_before_test=p.update_before_test,
        )

    def result(self, state: SpecState) -> dict[str, Any]:
        out = super().result(state)
        out["memory_pairs"] = len(state["memory"])
        return out
