"""The method registry: one entry per method file (adding a method touches only its file and this list)."""

from __future__ import annotations

from typing import Any

from srd_worker.errors import CapabilityError, ConfigError
from srd_worker.methods.base import Method
from srd_worker.methods.beam_search import BeamSearch
from srd_worker.methods.best_of_n import BestOfN
from srd_worker.methods.dvts import DVTS
from srd_worker.methods.nabla_reasoner import NablaReasoner
from srd_worker.methods.rejection_sampling import RejectionSampling
from srd_worker.methods.sampling import Sampling
from srd_worker.methods.self_consistency import SelfConsistency
from srd_worker.methods.speculative import CSD, EASD, SpeculativeSampling
from srd_worker.methods.speculative_rejection import SpeculativeRejection
from srd_worker.methods.srd import SRD

#: name → method class (its ``summary``, ``Params``, ``needs_reward`` and ``needs_capabilities`` describe it)
METHODS: dict[str, type[Method]] = {
    m.name: m
    for m in (
        Sampling,
        BestOfN,
        SelfConsistency,
        SRD,
        RejectionSampling,
        SpeculativeRejection,
        SpeculativeSampling,  # the speculative family (ALGORITHMS.md §5-§7)
        EASD,
        CSD,
        BeamSearch,  # step-level search (§8)
        DVTS,
        NablaReasoner,  # gradient-based decoding (∇-Reasoner)
    )
}


def get_method_class(name: str) -> type[Method]:
    try:
        return METHODS[name]
    except KeyError:
        raise ConfigError(f"unknown method '{name}'; choose one of: {', '.join(sorted(METHODS))}") from None


def build_method(name: str, params: dict[str, Any]) -> Method:
    cls = get_method_class(name)
    return cls(cls.Params.from_dict(params, method=name))


def check_compatible(
    method: Method,
    *,
    engine_name: str,
    capabilities: frozenset[str],
    has_reward: bool,
    reward_name: str | None = None,
    reward_differentiable: bool | None = None,
) -> None:
    """Refuse a method/engine/reward combination that cannot work, before anything runs. A method with
    ``needs_differentiable_reward`` is refused a reward known (``reward_differentiable`` False) to have no
    differentiable score."""
    missing = sorted(method.needs_capabilities - capabilities)
    if missing:
        raise CapabilityError(
            f"method '{method.name}' needs engine capabilities {', '.join(missing)}, "
            f"which the '{engine_name}' engine does not provide"
        )
    if method.needs_reward and not has_reward:
        raise ConfigError(
            f"method '{method.name}' needs a reward model: pass --reward (e.g. arithmetic, lm_judge)"
        )
    if method.needs_differentiable_reward and reward_differentiable is False:
        raise CapabilityError(
            f"method '{method.name}' needs a differentiable reward (hf-orm:MODEL, hf-prm:MODEL or lm_judge); "
            f"reward '{reward_name}' gives no gradient"
        )
