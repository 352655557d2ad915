"""vLLM engine arguments (issue 28) on the real vLLM (CPU build): the keys are checked against the installed
vLLM's ``EngineArgs`` fields and their types, and the engine is built with them (``max_model_len``)."""

from __future__ import annotations

import pytest

from srd_worker.engines.engine_args import check_engine_args
from srd_worker.errors import ConfigError


def test_vllm_keys_and_types_come_from_its_engine_args():
    args = {"max_model_len": "512", "kv_cache_dtype": "auto", "revision": "1234", "trust_remote_code": "false",
            "tensor_parallel_size": "2", "data_parallel_size": "1", "quantization": "null",
            "gpu_memory_utilization": "0.5"}  # fmt: skip
    assert check_engine_args("vllm", args, raw=True) == {
        "data_parallel_size": 1,
        "gpu_memory_utilization": 0.5,
        "kv_cache_dtype": "auto",
        "max_model_len": 512,
        "quantization": None,
        "revision": "1234",
        "tensor_parallel_size": 2,
        "trust_remote_code": False,
    }


@pytest.mark.parametrize(
    "args, message",
    [
        ({"max_model_lem": "512"}, "--engine-arg max_model_lem: not an argument of the vllm engine; did you mean max_model_len"),
        ({"max_model_len": "long"}, "--engine-arg max_model_len='long': expects an integer"),
        ({"kv_cache_dtype": "fp9"}, "kv_cache_dtype='fp9': expects one of 'auto'"),
        ({"tensor_parallel_size": "1.5"}, "expects an integer"),
        ({"compilation_config": "3"}, "takes a structured value"),
        ({"tokenizer": "/elsewhere"}, "srdq sets vLLM's tokenizer from --model"),
    ],
)  # fmt: skip
def test_vllm_refuses_unknown_keys_and_bad_values(args, message):
    with pytest.raises(ConfigError) as err:
        check_engine_args("vllm", args, raw=True)
    assert message in str(err.value)


def test_a_vllm_engine_honours_max_model_len(vllm_settings):
    """One more vLLM start-up (about a minute): the tiny model's 2048 positions cut to 512 by the engine
    argument, as vLLM itself reports it, and a prompt that no longer fits is refused."""
    from srd_worker.engines.base import GenerationRequest, SamplingParams
    from srd_worker.engines.registry import build_engine
    from srd_worker.errors import EngineError

    engine = build_engine("vllm", "tiny-random-llama", vllm_settings, {"max_model_len": 512})
    try:
        assert engine.max_context == 512  # read back from vLLM's model_config
        assert engine.llm.llm_engine.model_config.max_model_len == 512
        ok = engine.generate(
            [GenerationRequest(tuple(range(3, 103)), SamplingParams(temperature=0, max_new_tokens=4))]
        )
        assert len(ok[0].token_ids) == 4
        with pytest.raises(EngineError, match="does not fit the context of 512"):
            engine.generate([GenerationRequest(tuple([5] * 600), SamplingParams(max_new_tokens=4))])
    finally:
        engine.close()
