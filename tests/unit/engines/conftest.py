"""Fixtures of the engine tests."""

from __future__ import annotations

import pytest

from tests.threads import TORCH_THREADS


@pytest.fixture(scope="module")
def model():
    """(model, tokenizer) of the tiny random Llama in float32 (cached and re-fed logprobs then differ by
    float rounding only), for tests that build their own ``TransformersEngine`` over it."""
    import torch

    from srd_worker.engines.loading import build_tiny_llama

    torch.set_num_threads(TORCH_THREADS)
    m, tok = build_tiny_llama(seed=0)
    return m.to(torch.float32), tok
