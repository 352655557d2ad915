"""The run id names every engine setting that changes a record (issue: a rerun with SRDQ_DTYPE=float32 into
the folder of a bf16 run re-reported the bf16 run): each one gives a new id, and the engine a run is
resumed or leased with is built with the settings its spec records."""

from __future__ import annotations

import hashlib

import pytest

from srd_worker.encoding import sorted_json
from srd_worker.provenance import applied_settings, engine_config
from srd_worker.settings import Settings
from srd_worker.spec import RunSpec, prepare_run

BASE = dict(dtype="float32", device="cpu", batch_invariant=True, invariant_rows=4, kv_reuse=False)


def _run_id(datasets_dir, engine: str = "transformers", **overrides) -> str:
    settings = Settings(**{**BASE, **overrides})
    prepared = prepare_run(
        dataset=datasets_dir / "gsm8k_test.jsonl",
        method="sampling",
        params={},
        model="smollm2",
        reward=None,
        limit=2,
        engine=engine,
        settings=settings,
    )
    return prepared.spec.run_id()


@pytest.mark.parametrize(
    "change",
    [
        {"dtype": "bfloat16"},
        {"device": "cuda"},
        {"device": "auto"},
        {"batch_invariant": False},
        {"invariant_rows": 8},
        {"kv_reuse": True},
    ],
    ids=lambda c: next(iter(c)) + "=" + str(next(iter(c.values()))),
)
def test_each_transformers_setting_that_changes_results_changes_the_run_id(datasets_dir, change) -> None:
    assert _run_id(datasets_dir, **change) != _run_id(datasets_dir)


@pytest.mark.parametrize("change", [{"dtype": "bfloat16"}, {"tensor_parallel_size": 2}])
def test_each_vllm_setting_that_changes_results_changes_the_run_id(datasets_dir, change) -> None:
    assert _run_id(datasets_dir, engine="vllm", **change) != _run_id(datasets_dir, engine="vllm")


def test_settings_that_do_not_change_results_keep_the_run_id(datasets_dir) -> None:
    # the KV-reuse-free batching knobs of the service side and the cache folder change no record
    assert _run_id(datasets_dir, lease_ttl_s=5, slice_rounds=2) == _run_id(datasets_dir)
    # vLLM reads neither the transformers batching mode nor its rows
    assert _run_id(datasets_dir, engine="vllm", batch_invariant=False) == _run_id(datasets_dir, engine="vllm")


def test_a_spec_without_engine_config_keeps_its_old_run_id() -> None:
    body = dict(
        dataset="x.jsonl",
        dataset_sha256="0" * 64,
        task="gsm8k",
        method="sampling",
        params={"n": 1},
        model="m",
        shard_size=4,
    )
    old = RunSpec(**body)
    assert old.engine_config == {}
    assert old.run_id() != RunSpec(**body, engine_config={"dtype": "float32"}).run_id()
    # the id of a spec without the field is what the formula before the field gave (stored runs keep theirs);
    # engine_args, task_def (issue 28) and forked_from (srdq fork), empty, are left out the same way
    assert old.engine_args == {} and not old.task_def and not old.forked_from
    dropped = ("dataset", "fields", "engine_config", "engine_args", "task_def", "forked_from")
    hashed = {k: v for k, v in old.model_dump().items() if k not in dropped}
    text = sorted_json(hashed, compact=False, ascii=True, allow_nan=True)
    assert old.run_id() == "run-" + hashlib.sha256(text.encode()).hexdigest()[:12]


def test_the_engine_is_built_with_the_settings_the_spec_records() -> None:
    worker = Settings(dtype="bfloat16", device="auto", batch_invariant=False, kv_reuse=True)
    spec_config = engine_config("transformers", Settings(**BASE), resolve_device=False)
    applied = applied_settings(worker, spec_config)
    assert engine_config("transformers", applied, resolve_device=False) == spec_config
    assert applied.lease_ttl_s == worker.lease_ttl_s  # everything else stays the worker's
    assert applied_settings(worker, {}) is worker  # an old spec: the worker's settings as they are
