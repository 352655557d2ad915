"""Engine registry and the GPU-only adapters on a machine without vLLM or a GPU.

- static capabilities equal the engine classes' and refuse incompatible methods at prepare_run, before the
  dataset is read or anything stored (CLI too);
- importing the vLLM adapters (and the CLI) does not import vllm; srdq methods / submit --dry-run /
  status --help work with vllm unimportable; building a vLLM engine or reward without it names the fix;
- the vLLM engine's translation of requests and outputs (through tests/unit/engines/fake_vllm.py: what is sent to
  vLLM and how its outputs map to the Engine contract, including EOS on the last allowed token);
- the vLLM reward adapter's pooled-output handling and GPU share;
- benchmarks/gpu_check.py exits non-zero and writes nothing without CUDA.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

from srd_worker.engines.base import (
    CAP_FULL_LOGITS,
    CAP_GRADIENTS,
    CAP_LOGPROBS,
    CAP_SAMPLING,
    GenerationRequest,
    SamplingParams,
)
from srd_worker.engines.registry import ENGINES, build_engine, engine_capabilities
from srd_worker.errors import CapabilityError, ConfigError, EngineError, RewardError, StoreError
from srd_worker.settings import Settings
from tests.unit.engines import fake_vllm

ROOT = Path(__file__).resolve().parents[3]
GSM8K_ROWS = (
    '{"question": "Janet has 3 eggs and buys 2. How many?", "answer": "3 + 2 = 5\\n#### 5"}\n'
    '{"question": "What is 6 times 7?", "answer": "6 * 7 = 42\\n#### 42"}\n'
)


@pytest.fixture
def dataset(tmp_path) -> Path:
    path = tmp_path / "gsm8k_2.jsonl"
    path.write_text(GSM8K_ROWS, encoding="utf-8")
    return path


@pytest.fixture
def no_vllm(monkeypatch):
    """``import vllm`` raises ImportError, whether or not vLLM is installed."""
    monkeypatch.setitem(sys.modules, "vllm", None)
    monkeypatch.setitem(sys.modules, "vllm.inputs", None)


@pytest.fixture
def needy_methods(monkeypatch):
    """Two registered methods that need capabilities only some engines have."""
    from srd_worker.methods.registry import METHODS, MethodEntry
    from srd_worker.methods.sampling import Sampling

    logits = type(
        "NeedsLogits",
        (Sampling,),
        {"name": "needs_full_logits", "needs_capabilities": frozenset({CAP_SAMPLING, CAP_FULL_LOGITS})},
    )
    grads = type(
        "NeedsGrads",
        (Sampling,),
        {"name": "needs_gradients", "needs_capabilities": frozenset({CAP_SAMPLING, CAP_GRADIENTS})},
    )
    monkeypatch.setitem(METHODS, logits.name, MethodEntry.of(logits))
    monkeypatch.setitem(METHODS, grads.name, MethodEntry.of(grads))


# ------------------------------------------------------------------------------------- registry


def test_static_capabilities_equal_the_engine_classes():
    from srd_worker.engines.openai_engine import OpenAIEngine
    from srd_worker.engines.transformers_engine import TransformersEngine
    from srd_worker.engines.vllm_engine import VLLMEngine

    assert set(ENGINES) == {"transformers", "vllm", "openai"}
    assert engine_capabilities("transformers") == TransformersEngine.capabilities
    assert engine_capabilities("vllm") == VLLMEngine.capabilities == frozenset({CAP_SAMPLING, CAP_LOGPROBS})
    assert (
        engine_capabilities("openai") == OpenAIEngine.capabilities == frozenset({CAP_SAMPLING, CAP_LOGPROBS})
    )
    with pytest.raises(ConfigError, match="unknown engine 'tgi'; choose one of: openai, transformers, vllm"):
        engine_capabilities("tgi")


def test_prepare_run_refuses_missing_capability_before_reading_the_dataset(needy_methods, dataset, tmp_path):
    from srd_worker.spec import prepare_run

    missing = tmp_path / "not-there.jsonl"
    with pytest.raises(CapabilityError, match="needs engine capabilities full_logits.*'vllm' engine"):
        prepare_run(
            dataset=missing, method="needs_full_logits", params={}, model="m", reward=None, engine="vllm"
        )
    with pytest.raises(CapabilityError, match="gradients.*'vllm' engine"):
        prepare_run(
            dataset=missing, method="needs_gradients", params={}, model="m", reward=None, engine="vllm"
        )
    with pytest.raises(ConfigError, match="unknown engine"):
        prepare_run(dataset=dataset, method="sampling", params={}, model="m", reward=None, engine="tgi")
    ok = prepare_run(dataset=dataset, method="needs_full_logits", params={}, model="m", reward=None)
    assert ok.spec.engine == "transformers"
    on_vllm = prepare_run(
        dataset=dataset,
        method="best_of_n",
        params={},
        model="m",
        reward="hf-orm:nvidia/AceMath-7B-RM",
        engine="vllm",
    )
    assert on_vllm.spec.engine == "vllm" and on_vllm.spec.reward == "hf-orm:nvidia/AceMath-7B-RM"
    assert (
        on_vllm.spec.run_id()
        != prepare_run(
            dataset=dataset, method="best_of_n", params={}, model="m", reward="hf-orm:nvidia/AceMath-7B-RM"
        ).spec.run_id()
    )


def test_fleet_submit_refuses_what_the_local_run_refuses(needy_methods, dataset, tmp_path):
    """A spec whose engine lacks a capability the method needs (here a hand-edited one, as a client of
    ``service.submit`` other than ``prepare_run`` could send): ``service.submit`` refuses it before
    storing or enqueuing anything, with the same error ``run_local`` gives before writing anything."""
    import dataclasses

    from srd_worker.local import run_local
    from srd_worker.service import submit
    from srd_worker.settings import Settings
    from srd_worker.store import crud
    from srd_worker.store.db import make_engine, session_scope, sqlite_url, upgrade

    ok = prepare_run_for(dataset, "needs_full_logits")
    bad = dataclasses.replace(ok, spec=ok.spec.model_copy(update={"engine": "vllm"}))
    url = sqlite_url(tmp_path / "fleet.db")
    upgrade(url)
    db = make_engine(url)
    enqueued: list[tuple[str, int]] = []
    try:
        with pytest.raises(CapabilityError, match="full_logits.*'vllm' engine") as fleet_error:
            submit(bad, db=db, enqueue=lambda run_id, index: enqueued.append((run_id, index)))
        with session_scope(db) as session, pytest.raises(StoreError, match="no run"):
            crud.get_run(session=session, run_id=bad.spec.run_id())
        assert enqueued == []
        out = tmp_path / "local"
        with pytest.raises(CapabilityError) as local_error:
            run_local(bad, out_dir=out, settings=Settings(cache_dir=tmp_path))
        assert str(local_error.value) == str(fleet_error.value) and not out.exists()
        done = submit(ok, db=db, enqueue=lambda run_id, index: enqueued.append((run_id, index)))
        assert done.created and enqueued == [(done.run_id, 0)]
    finally:
        db.dispose()


def prepare_run_for(dataset: Path, method: str, **kw):
    from srd_worker.spec import prepare_run

    kw.setdefault("reward", None)
    return prepare_run(dataset=dataset, method=method, params={}, model="tiny-random-llama", **kw)


def test_wire_checks_the_engine_it_is_given(needy_methods, dataset, shim, tiny_engine, tmp_path):
    """``wire`` (both paths: ``run_local`` and a fleet worker's ``process_shard``) builds the method and
    task from the spec and refuses an engine instance that lacks what the method needs, even when the
    engine the spec names would have it (a worker's cached engine is what actually runs)."""
    from srd_worker.settings import Settings
    from srd_worker.wiring import wire

    settings = Settings(cache_dir=tmp_path)
    spec = prepare_run_for(dataset, "needs_full_logits").spec
    with pytest.raises(CapabilityError, match="full_logits.*'vllm' engine"):
        wire(spec, settings=settings, engine=shim)
    wired = wire(spec, settings=settings, engine=tiny_engine)
    assert (wired.method.name, wired.task.name, wired.engine, wired.reward) == (
        "needs_full_logits",
        "gsm8k",
        tiny_engine,
        None,
    )
    assert wired.method.params.to_dict() == spec.params
    no_reward = prepare_run_for(dataset, "best_of_n", reward="arithmetic").spec.model_copy(
        update={"reward": None}
    )
    with pytest.raises(ConfigError, match="needs a reward model"):
        wire(no_reward, settings=settings, engine=tiny_engine)


# ------------------------------------------------------------------------------------- without vLLM


def test_importing_the_vllm_adapters_and_cli_does_not_import_vllm():
    code = (
        "import sys\n"
        "import srd_worker.engines.vllm_engine, srd_worker.engines.registry, srd_worker.rewards.vllm_reward\n"
        "import srd_worker.rewards.registry, srd_worker.spec, srdq_cli.main\n"
        "assert 'vllm' not in sys.modules, 'vllm was imported'\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_cli_works_without_vllm(no_vllm, needy_methods, dataset, tmp_path):
    from srdq_cli.main import cli

    runner = CliRunner()
    res = runner.invoke(cli, ["methods"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(
        cli,
        [
            "submit",
            "dataset",
            str(dataset),
            "--method",
            "best_of_n",
            "--n",
            "2",
            "--engine",
            "vllm",
            "--reward",
            "hf-prm:Skywork/Skywork-o1-Open-PRM-Qwen-2.5-7B:skywork",
            "--dry-run",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "dry run, nothing stored" in res.output
    res = runner.invoke(cli, ["status", "--help"])
    assert res.exit_code == 0 and "RUN_ID" in res.output
    # a method needing what the engine lacks: one clear error, nothing written
    out = tmp_path / "out"
    res = runner.invoke(
        cli, ["run", str(dataset), "--method", "needs_full_logits", "--engine", "vllm", "--out", str(out)]
    )
    assert res.exit_code != 0 and "does not provide" in res.output and not out.exists()
    res = runner.invoke(
        cli,
        ["submit", "dataset", str(dataset), "--method", "needs_full_logits", "--engine", "vllm", "--dry-run"],
    )
    assert res.exit_code != 0 and "full_logits" in res.output
    res = runner.invoke(cli, ["run", str(dataset), "--method", "sampling", "--engine", "gpu-magic"])
    assert res.exit_code != 0 and "gpu-magic" in res.output


def test_building_vllm_things_without_vllm_names_the_fix(no_vllm, tmp_path):
    from srd_worker.rewards.vllm_reward import VLLMReward
    from srd_worker.settings import Settings

    with pytest.raises(EngineError, match=r"pip install 'srdq\[vllm\]'"):
        build_engine("vllm", "tiny-random-llama", Settings(cache_dir=tmp_path))
    with pytest.raises(RewardError, match=r"pip install 'srdq\[vllm\]'"):
        VLLMReward("nvidia/AceMath-7B-RM")


@pytest.mark.parametrize(
    ("kw", "judge_engine", "expected"),
    [
        ({"engine": "vllm"}, "transformers", r"the 'vllm' engine needs vLLM.*--engine transformers"),
        ({"reward": "vllm-rm:tiny-random-llama"}, "transformers", r"the 'vllm-rm' reward needs vLLM.*hf-orm"),
        (
            {"reward": "judge:tiny-random-llama"},
            "vllm",
            r"judge reward with SRDQ_JUDGE_ENGINE=vllm needs vLLM",
        ),
    ],
)
def test_srdq_run_on_vllm_without_vllm_is_refused_before_anything_is_written(
    no_vllm, dataset, tmp_path, kw, judge_engine, expected
):
    """``srdq run`` used to create OUT/srdq.db and the run before building the engine found vLLM missing."""
    from srd_worker.local import run_local

    prepared = prepare_run_for(dataset, "best_of_n" if "reward" in kw else "sampling", **kw)
    out = tmp_path / "out"
    settings = Settings(cache_dir=tmp_path, judge_engine=judge_engine)
    with pytest.raises(ConfigError, match=expected) as info:
        run_local(prepared, out_dir=out, settings=settings)
    assert "vllm-cpu" in str(info.value)  # the CPU build is named too
    assert not out.exists()


# ------------------------------------------------------------------------------------- vLLM engine adapter


@pytest.fixture
def shim(tiny_engine):
    from srd_worker.engines.vllm_engine import VLLMEngine

    with fake_vllm.installed(backend=tiny_engine) as vllm:
        yield VLLMEngine(vllm.LLM(model="tiny"), tiny_engine.tokenizer)


def test_vllm_requests_are_token_ids_with_translated_sampling_params(shim):
    prompt = tuple(shim.tokenizer.chat_prompt_ids([{"role": "user", "content": "hi"}]))
    sp = SamplingParams(
        temperature=0.5, top_p=0.8, top_k=0, max_new_tokens=7, stop=("zz",), seed=-1, logprobs=True
    )
    shim.generate(
        [GenerationRequest(prompt, sp), GenerationRequest(prompt, SamplingParams(top_k=12, seed=3))]
    )
    prompts, params = shim.llm.calls[-1]
    assert prompts[0] == {"prompt_token_ids": list(prompt)}
    a, b = params
    assert (a.temperature, a.top_p, a.top_k, a.max_tokens, a.seed) == (0.5, 0.8, -1, 7, 2**64 - 1)
    assert a.stop == ["zz"] and a.include_stop_str_in_output and a.logprobs == 1
    assert sorted(a.stop_token_ids) == sorted(shim.tokenizer.eos_token_ids)
    assert (b.top_k, b.seed, b.stop, b.logprobs) == (12, 3, None, None)
    # the budget is cut to the room left in the context; a zero budget never reaches vLLM
    near = tuple([65] * (shim.max_context - 3))
    shim.generate([GenerationRequest(near, SamplingParams(max_new_tokens=50))])
    assert shim.llm.calls[-1][1][0].max_tokens == 3
    n_calls = len(shim.llm.calls)
    assert (
        shim.generate([GenerationRequest(prompt, SamplingParams(max_new_tokens=0, logprobs=True))])[
            0
        ].logprobs
        == []
    )
    assert len(shim.llm.calls) == n_calls


def test_vllm_llm_built_with_prefix_caching_and_gpu_settings(tiny_engine, tmp_path):
    from srd_worker.engines.vllm_engine import VLLMEngine
    from srd_worker.settings import Settings

    settings = Settings(
        cache_dir=tmp_path, dtype="float16", tensor_parallel_size=2, gpu_memory_utilization=0.55
    )
    with fake_vllm.installed(backend=tiny_engine) as vllm:
        engine = build_engine("vllm", "tiny-random-llama", settings)
        (llm,) = vllm.LLM.instances
    assert isinstance(engine, VLLMEngine) and engine.max_context == tiny_engine.max_context
    kw = llm.kwargs
    assert kw["enable_prefix_caching"] is True and kw["tensor_parallel_size"] == 2
    assert kw["gpu_memory_utilization"] == 0.55 and kw["dtype"] == "float16"
    saved = Path(kw["model"])
    assert (saved / "config.json").exists() and '"hidden_size": 256' in (saved / "config.json").read_text()


def test_vllm_cpu_build_gets_a_fixed_kv_cache_not_a_memory_share(tiny_engine, tmp_path):
    settings = Settings(cache_dir=tmp_path, vllm_cpu_kv_cache_gb=1.5, vllm_enforce_eager=True)
    with fake_vllm.installed(backend=tiny_engine, cpu=True) as vllm:
        engine = build_engine("vllm", "tiny-random-llama", settings)
        (llm,) = vllm.LLM.instances
    kw = llm.kwargs
    assert kw["kv_cache_memory_bytes"] == int(1.5 * (1 << 30)) and "gpu_memory_utilization" not in kw
    assert kw["enforce_eager"] is True and kw["enable_prefix_caching"] is True
    # close() shuts vLLM's engine core down once and leaves the engine unusable
    engine.close()
    engine.close()
    assert llm.shutdowns == 1 and engine.llm is None


def _vllm_kwargs(tiny_engine, tmp_path, setting: str, cases, *keys: str) -> dict[str, tuple]:
    """Per case (label, on the CPU build?, the setting's value, the run's engine arguments): the values of
    ``keys`` among the keyword arguments srdq built ``vllm.LLM`` with (None: not passed)."""
    built = {}
    for label, cpu, value, args in cases:
        settings = Settings(cache_dir=tmp_path, **{setting: value})
        with fake_vllm.installed(backend=tiny_engine, cpu=cpu) as vllm:
            build_engine("vllm", "tiny-random-llama", settings, args)
            (llm,) = vllm.LLM.instances
        built[label] = tuple(llm.kwargs.get(k) for k in keys)
    return built


def test_vllm_cpu_block_size_from_settings_and_an_engine_arg_wins(tiny_engine, tmp_path):
    """SRDQ_VLLM_CPU_BLOCK_SIZE reaches vLLM's CPU build as block_size (default 32; 0: vLLM's own,
    nothing passed); a run's --engine-arg block_size wins; a GPU build never gets it from the setting."""
    assert Settings().vllm_cpu_block_size == 32
    cases = [
        ("vLLM's own", True, 0, {}),
        ("set", True, 32, {}),
        ("engine arg", True, 32, {"block_size": 64}),
        ("gpu", False, 32, {}),
    ]
    built = _vllm_kwargs(tiny_engine, tmp_path, "vllm_cpu_block_size", cases, "block_size")
    assert built == {"vLLM's own": (None,), "set": (32,), "engine arg": (64,), "gpu": (None,)}


def test_vllm_cpu_max_model_len_from_settings_sets_the_token_budget_and_an_engine_arg_wins(
    tiny_engine, tmp_path
):
    """SRDQ_VLLM_CPU_MAX_MODEL_LEN reaches vLLM's CPU build as max_model_len, and the step's token budget
    (no chunked prefill there) follows it instead of the model's context; 0 (default) passes nothing; an
    --engine-arg max_model_len wins; a GPU build never gets it from the setting."""
    assert Settings().vllm_cpu_max_model_len == 0
    cases = [
        ("model's own", True, 0, {}),
        ("set", True, 4096, {}),
        ("engine arg", True, 4096, {"max_model_len": 2048}),
        ("gpu", False, 4096, {}),
    ]
    built = _vllm_kwargs(
        tiny_engine, tmp_path, "vllm_cpu_max_model_len", cases, "max_model_len", "max_num_batched_tokens"
    )
    assert built["set"] == (4096, 8192)  # the budget is never below 8192
    assert built["engine arg"] == (2048, 8192)
    assert built["model's own"][0] is None and built["gpu"] == (None, None)


def test_vllm_cpu_kv_cache_larger_than_free_ram_names_srdq_setting(tiny_engine, tmp_path):
    pytest.importorskip("psutil")
    settings = Settings(cache_dir=tmp_path, vllm_cpu_kv_cache_gb=1e6)
    with fake_vllm.installed(backend=tiny_engine, cpu=True) as vllm:
        with pytest.raises(EngineError, match="SRDQ_VLLM_CPU_KV_CACHE_GB"):
            build_engine("vllm", "tiny-random-llama", settings)
        assert not vllm.LLM.instances


def test_vllm_start_failure_for_memory_names_srdq_setting(tiny_engine, tmp_path, monkeypatch):
    def refuse(self, **kwargs):
        raise ValueError("Available memory on node 0 is less than desired; decrease --gpu-memory-utilization")

    monkeypatch.setattr(fake_vllm.LLM, "__init__", refuse)
    with fake_vllm.installed(backend=tiny_engine):
        with pytest.raises(EngineError, match="SRDQ_GPU_MEMORY_UTILIZATION"):
            build_engine("vllm", "tiny-random-llama", Settings(cache_dir=tmp_path))


def test_transformers_engine_close_is_a_noop(tiny_engine):
    assert tiny_engine.close() is None
    assert tiny_engine.model is not None  # still usable: nothing was released


class _Canned:
    """A vLLM ``LLM`` that returns prepared outputs."""

    def __init__(self, outputs):
        self.outputs = outputs
        self.llm_engine = types.SimpleNamespace(model_config=types.SimpleNamespace(max_model_len=64))

    def generate(self, prompts, sampling_params=None, use_tqdm=True):
        return self.outputs[: len(prompts)]


def _canned_engine(tiny_engine, outputs):
    from srd_worker.engines.vllm_engine import VLLMEngine

    with fake_vllm.installed():
        return VLLMEngine(_Canned(outputs), tiny_engine.tokenizer)


def _out(ids, reason, logprobs=None, why=None):
    return fake_vllm.RequestOutput(
        [1], None, [fake_vllm.CompletionOutput(0, "ignored", ids, logprobs, reason, why)]
    )


def test_vllm_outputs_map_to_the_engine_contract(tiny_engine):
    tok = tiny_engine.tokenizer
    eos = next(iter(tok.eos_token_ids))
    (a_id,), (b_id,) = tok.encode("A"), tok.encode("B")
    lp = [{a_id: fake_vllm.Logprob(-1.5)}, {eos: fake_vllm.Logprob(-0.25)}]
    engine = _canned_engine(
        tiny_engine,
        [
            _out([a_id, eos], "length", lp),  # EOS sampled on the last allowed token: still "eos"
            _out([a_id, b_id], "stop", None, "B"),  # a stop string
            _out([a_id, b_id], "length"),
        ],
    )
    reqs = [
        GenerationRequest((1, 2), SamplingParams(max_new_tokens=2, logprobs=True)),
        GenerationRequest((1, 2), SamplingParams(max_new_tokens=5, stop=("B",))),
        GenerationRequest((1, 2), SamplingParams(max_new_tokens=2)),
    ]
    a, b, c = engine.generate(reqs)
    assert (a.finish_reason, a.token_ids, a.logprobs, a.finished) == ("eos", [a_id, eos], [-1.5, -0.25], True)
    assert a.text == "A"  # decoded by the adapter, EOS skipped; vLLM's own text is not used
    assert (b.finish_reason, b.text) == ("stop", "AB")
    assert (c.finish_reason, c.logprobs) == ("length", None)


def test_vllm_bad_outputs_raise_engine_errors(tiny_engine):
    req = [GenerationRequest((1, 2), SamplingParams(max_new_tokens=2, logprobs=True))]
    with pytest.raises(EngineError, match="finish_reason 'abort'"):
        _canned_engine(tiny_engine, [_out([65], "abort", [{65: fake_vllm.Logprob(-1.0)}])]).generate(req)
    with pytest.raises(EngineError, match="0 logprob entries for 1 tokens"):
        _canned_engine(tiny_engine, [_out([65], "length")]).generate(req)
    with pytest.raises(EngineError, match="no logprob for token 65"):
        _canned_engine(tiny_engine, [_out([65], "length", [{7: fake_vllm.Logprob(-1.0)}])]).generate(req)
    with pytest.raises(EngineError, match="1 outputs for 2 requests"):
        _canned_engine(tiny_engine, [_out([65], "length")]).generate(
            [GenerationRequest((1,), SamplingParams(max_new_tokens=1))] * 2
        )
    with pytest.raises(EngineError, match="no room"):
        _canned_engine(tiny_engine, []).logprobs([([1] * 60, [2] * 4)])


# ------------------------------------------------------------------------------------- vLLM reward adapter


def _vllm_reward(tiny_engine, pooler, **kw):
    from srd_worker.rewards.vllm_reward import VLLMReward

    with fake_vllm.installed(pooler=pooler, reject_runner=kw.pop("reject_runner", False)) as vllm:
        rm = VLLMReward("some/rm", tokenizer=tiny_engine.tokenizer.hf, **kw)
        return rm, vllm.LLM.instances


def test_vllm_reward_takes_the_last_scalar_in_input_order(tiny_engine):
    import torch

    rm, (llm,) = _vllm_reward(
        tiny_engine,
        lambda ids: torch.arange(len(ids), dtype=torch.float32),
        max_tokens_per_batch=100,
        stop=("\nQ:",),
    )
    assert llm.kwargs["runner"] == "pooling" and llm.kwargs["gpu_memory_utilization"] == 0.3
    qs, rs = ["a", "a much longer question here", "b"], ["x" * 40, "y", "z\nQ: dropped"]
    scores = rm.score(qs, rs)
    assert scores == [float(len(rm.input_ids(q, r)) - 1) for q, r in zip(qs, rs, strict=True)]
    assert len(llm.calls) > 1  # packed under the 100-token budget
    assert rm.input_ids("b", "z\nQ: dropped") == rm.input_ids("b", "z")
    rm2, (llm2,) = _vllm_reward(tiny_engine, lambda ids: torch.tensor([2.5]), reject_runner=True)
    assert llm2.kwargs["task"] == "reward" and rm2.score(["q"], ["r"]) == [2.5]
    rm3, _ = _vllm_reward(tiny_engine, lambda ids: torch.zeros(len(ids), 2))
    with pytest.raises(RewardError, match="hf-prm"):
        rm3.score(["q"], ["r"])


def test_vllm_reward_gpu_share_from_settings(monkeypatch, tmp_path):
    from srd_worker.rewards import registry
    from srd_worker.settings import Settings

    seen = {}

    class Recorder:
        def __init__(self, model, **kw):
            seen.update(kw, model=model)

    monkeypatch.setattr("srd_worker.rewards.vllm_reward.VLLMReward", Recorder)
    registry.build_reward(
        "vllm-rm:org/rm", None, settings=Settings(gpu_memory_utilization=0.55, cache_dir=tmp_path)
    )
    assert seen["model"] == "org/rm" and seen["gpu_memory_utilization"] == pytest.approx(0.35)
    with pytest.raises(ConfigError, match="SRDQ_GPU_MEMORY_UTILIZATION"):
        registry.build_reward("vllm-rm:org/rm2", None, settings=Settings(gpu_memory_utilization=0.88))


# ------------------------------------------------------------------------------------- GPU check script


def test_gpu_check_without_cuda_exits_nonzero_and_writes_nothing(monkeypatch, tmp_path, capsys):
    import torch

    sys.path.insert(0, str(ROOT))
    from benchmarks import gpu_check

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    doc = tmp_path / "PERFORMANCE.md"
    doc.write_text("## GPU\n\n<!-- gpu-check:start -->\nNot run on a GPU yet.\n<!-- gpu-check:end -->\n")
    before = doc.read_text()
    assert gpu_check.main(["--doc", str(doc)]) == 2
    assert doc.read_text() == before
    assert "no CUDA device" in capsys.readouterr().err


def test_gpu_check_cpu_smoke_measures_every_mode_and_writes_nothing(tmp_path, capsys):
    """The script itself on a tiny random Llama: a row per mode and batch size (the invariant mode at its
    own sizes), every requested token generated, the varied-shapes calls under both attention backends,
    cuDNN attention off when asked (and left so after the varied calls), the doc untouched; an unknown mode
    is refused."""
    import torch

    sys.path.insert(0, str(ROOT))
    from benchmarks import gpu_check

    doc = tmp_path / "PERFORMANCE.md"
    doc.write_text("<!-- gpu-check:start -->\nold\n<!-- gpu-check:end -->\n")
    small = "--prompt-tokens 12 --new-tokens 3 --reward-batch-sizes 2 --reward-tokens 8".split()
    argv = [
        "--cpu-smoke",
        "--no-cudnn-attention",
        "--doc",
        str(doc),
        "--batch-sizes",
        "1,3",
        "--invariant-batch-sizes",
        "2",
        "--varied-calls",
        "2",
        "--varied-new-tokens",
        "2",
        *small,
    ]
    try:
        assert gpu_check.main(argv) == 0
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    gen = [[c.strip() for c in r] for r in rows if len(r) == 8 and r[0].strip() != "mode"]
    assert [(r[0], int(r[1]), int(r[2])) for r in gen] == [
        ("padded", 1, 3),
        ("padded", 3, 9),
        ("invariant", 2, 6),
        ("library", 1, 3),
        ("library", 3, 9),
    ]
    varied = [[c.strip() for c in r] for r in rows if len(r) == 5 and r[0].strip() in ("on", "off")]
    assert [(r[0], int(r[1])) for r in varied] == [("on", 2), ("off", 2)]
    assert varied[0][2] == varied[1][2] and int(varied[0][2]) >= 2 * 2  # the same calls, both backends
    assert doc.read_text() == "<!-- gpu-check:start -->\nold\n<!-- gpu-check:end -->\n"
    with pytest.raises(SystemExit) as bad:
        gpu_check.main(["--cpu-smoke", "--modes", "padded,fast", *small])
    assert bad.value.code == 2
    assert "unknown fast" in capsys.readouterr().err


def test_vllm_in_a_daemonic_worker_runs_in_process(monkeypatch):
    import multiprocessing
    import os

    from srd_worker.engines.vllm_engine import prepare_process

    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    prepare_process({"tensor_parallel_size": 2})  # not daemonic: nothing to do
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ
    monkeypatch.setattr(multiprocessing, "current_process", lambda: types.SimpleNamespace(daemon=True))
    prepare_process({"tensor_parallel_size": 1})
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    with pytest.raises(EngineError, match="--gpus-per-worker 2"):
        prepare_process({"tensor_parallel_size": 2})


@pytest.mark.parametrize(
    "setting, cores, expected",
    [
        ("auto", [0, 1], "0,1"),  # a 2-core machine: both cores compute (vLLM's auto keeps one idle)
        ("auto", [0, 1, 2, 3], "0,1,2,3"),
        ("auto", list(range(8)), None),  # larger machines: vLLM's own binding
        ("vllm", [0, 1], None),
        ("0-3", [0, 1], "0-3"),
        ("auto", [], None),
    ],
)
def test_vllm_cpu_thread_binding(setting, cores, expected):
    """Importing the module needs no vLLM; the binding is a pure function of the setting and the cores."""
    from srd_worker.engines.vllm_engine import cpu_threads

    assert cpu_threads(setting, cores) == expected


def test_vllm_cpu_step_timeout_is_an_hour_unless_set(monkeypatch):
    from srd_worker.engines.vllm_engine import CPU_STEP_TIMEOUT_S, allow_slow_steps

    monkeypatch.delenv("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", raising=False)
    allow_slow_steps()
    assert os.environ["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"] == str(CPU_STEP_TIMEOUT_S) == "3600"
    monkeypatch.setenv("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "42")
    allow_slow_steps()
    assert os.environ["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"] == "42"  # the user's own value wins


def test_vllm_cpu_thread_binding_refuses_an_empty_list():
    from srd_worker.engines.vllm_engine import cpu_threads

    with pytest.raises(ConfigError, match="SRDQ_VLLM_CPU_THREADS"):
        cpu_threads("0,,1", [0, 1])
