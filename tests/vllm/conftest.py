"""The real-vLLM tier (marker ``vllm``; ``make test-vllm`` builds .venv-vllm with vLLM's CPU build).

Every test here carries the ``vllm`` marker. Where vLLM is not importable (the main .venv of ``make test``)
nothing in this folder is collected, so the main suite never imports vLLM.

vLLM start-ups are slow (about 40 s each on two cores, eager mode), so they are counted and kept few:
one in-process engine over the tiny random Llama for the whole session (contract suite, every method,
the crash/resume reference), one pooling reward model, and the ``srdq`` subprocesses of the lifecycle,
crash/resume and fleet tests. Memory is kept small: a 1 GiB CPU KV cache per engine
(``SRDQ_VLLM_CPU_KV_CACHE_GB``), eager mode (``SRDQ_VLLM_ENFORCE_EAGER``), float32.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["test_*.py"]

#: settings for every vLLM engine of the tier, in this process and in the `srdq` subprocesses
VLLM_ENV = {
    "SRDQ_VLLM_CPU_KV_CACHE_GB": "1",
    "SRDQ_VLLM_ENFORCE_EAGER": "true",
    "SRDQ_DTYPE": "float32",
    "SRDQ_DEVICE": "cpu",
    "VLLM_LOGGING_LEVEL": "WARNING",
    "TOKENIZERS_PARALLELISM": "false",
}
for _k, _v in VLLM_ENV.items():
    os.environ.setdefault(_k, _v)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.vllm)


@pytest.fixture(scope="session")
def vllm_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("srdq-vllm-cache")


@pytest.fixture(scope="session")
def vllm_settings(vllm_cache):
    from srd_worker.settings import Settings

    return Settings(cache_dir=vllm_cache)


@pytest.fixture(scope="session")
def vllm_engine(vllm_settings):
    """The one in-process vLLM engine of the tier: the tiny random Llama (tiny_model_dir), closed at the end
    of the session with a check that none of vLLM's processes survives."""
    import psutil

    from srd_worker.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine.from_name("tiny-random-llama", settings=vllm_settings, max_model_len=2048)
    assert engine._procs.children, "vLLM's CPU build should run its engine core in child processes"
    yield engine
    started = set(engine._procs.children)
    engine.close()
    alive = [
        p for p in started if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]
    assert not alive, f"vLLM processes survived close(): {alive}"
    assert engine._procs.guard is None


class Borrowed:
    """The session engine lent to code that closes what it builds (run_local): close() is a no-op."""

    def __init__(self, engine) -> None:
        self._engine = engine

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def close(self) -> None:
        pass
