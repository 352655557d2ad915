"""The method registry: one entry per method file (adding a method touches only its file and this list).

Each entry (``plugins.Registry`` shape) carries the method's one-line summary, what it needs (a reward,
a differentiable reward, engine capabilities), its parameter class and its factory (the method class;
methods are light, pure Python, so nothing heavy is imported here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from srd_worker.errors import CapabilityError, ConfigError
from srd_worker.methods.base import Method, MethodParams
from srd_worker.methods.beam_search import BeamSearch
from srd_worker.methods.best_of_n import BestOfN
from srd_worker.methods.draw_until_accept import DrawUntilAccept
from srd_worker.methods.dvts import DVTS
from srd_worker.methods.nabla_reasoner import NablaReasoner
from srd_worker.methods.rejection_sampling import RejectionSampling
from srd_worker.methods.sampling import Sampling
from srd_worker.methods.self_consistency import SelfConsistency
from srd_worker.methods.speculative import CSD, EASD, SpeculativeSampling
from srd_worker.methods.speculative_rejection import SpeculativeRejection
from srd_worker.methods.srd import SRD
from srd_worker.plugins import Entry, Registry


@dataclass(frozen=True)
class MethodEntry(Entry):
    factory: type[Method]  # called with the method's validated Params
    params: type[MethodParams]
    needs_reward: bool
    needs_differentiable_reward: bool
    needs_capabilities: frozenset[str]

    @classmethod
    def of(cls, method: type[Method]) -> MethodEntry:
        """The entry of a method class, read from its class attributes."""
        return cls(
            name=method.name,
            summary=method.summary,
            factory=method,
            params=method.Params,
            needs_reward=method.needs_reward,
            needs_differentiable_reward=method.needs_differentiable_reward,
            needs_capabilities=frozenset(method.needs_capabilities),
        )

    def build(self, params: dict[str, Any]) -> Method:
        """The method with ``params`` validated (ConfigError naming a bad or unknown parameter)."""
        return self.factory(self.params.from_dict(params, method=self.name))


METHODS: Registry[MethodEntry] = Registry(
    "method",
    map(
        MethodEntry.of,
        (
            Sampling,
            BestOfN,
            SelfConsistency,
            SRD,
            RejectionSampling,
            DrawUntilAccept,  # §3.2(b): absolute-threshold rejection sampling over full samples
            SpeculativeRejection,
            SpeculativeSampling,  # the speculative family (ALGORITHMS.md §5-§7)
            EASD,
            CSD,
            BeamSearch,  # step-level search (§8)
            DVTS,
            NablaReasoner,  # gradient-based decoding (∇-Reasoner)
        ),
    ),
)


def build_method(name: str, params: dict[str, Any]) -> Method:
    """Method ``name`` with ``params``; ConfigError for an unknown name or a bad parameter."""
    return METHODS.entry(name).build(params)


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
