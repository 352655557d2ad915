"""Settings: what dtype ``auto`` stands for on each device, and one clear line (no pydantic traceback,
nothing written) for a ``SRDQ_*`` value that does not validate."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from srd_worker.engines.vllm_engine import vllm_dtype
from srd_worker.errors import ConfigError
from srd_worker.provenance import engine_config
from srd_worker.settings import Settings, cpu_has_native_bf16, get_settings, resolve_dtype, settings_error
from tests.cli import ROOT, run_srdq, srdq_env

pytestmark = pytest.mark.unit

#: the engine settings whose defaults these tests read (tests/vllm/conftest.py sets some for the suite)
ENGINE_VARS = ("SRDQ_DTYPE", "SRDQ_DEVICE", "SRDQ_BATCH_INVARIANT", "SRDQ_KV_REUSE", "SRDQ_DETERMINISTIC")


@pytest.fixture
def no_engine_env(monkeypatch):
    for var in ENGINE_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize(
    ("dtype", "device", "native", "expected"),
    [
        ("auto", "cpu", False, "float32"),  # bf16 emulated: slower than float32
        ("auto", "cpu", True, "bfloat16"),  # AVX512-BF16 / AMX / ARM BF16
        ("auto", "cuda", False, "bfloat16"),
        ("auto", "cuda:1", True, "bfloat16"),
        ("bfloat16", "cpu", False, "bfloat16"),  # an explicit dtype is never changed
        ("float16", "cuda", True, "float16"),
        ("float32", "cpu", True, "float32"),
    ],
)
def test_auto_dtype_follows_the_device_and_the_cpus_bf16(dtype, device, native, expected) -> None:
    assert resolve_dtype(dtype, device, native_bf16=native) == expected


@pytest.mark.parametrize(
    ("line", "native"),
    [
        ("flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_tile", True),  # Intel Sapphire Rapids
        ("flags\t\t: fpu sse2 avx2 amx_bf16", True),
        ("flags\t\t: fpu sse2 avx2 avx512f avx512_vnni", False),  # AVX-512 without BF16
        ("flags\t\t: fpu sse2 avx2 fma", False),  # AMD EPYC (Zen 2/3)
        ("Features\t: fp asimd sve bf16 i8mm", True),  # Graviton 3
        ("Features\t: fp asimd crc32", False),
        ("model name\t: bf16 in a name is not a flag", False),
    ],
)
def test_native_bf16_is_read_from_the_cpus_flags(tmp_path, line, native) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\n{line}\n", encoding="utf-8")
    assert cpu_has_native_bf16(str(cpuinfo)) is native
    assert cpu_has_native_bf16(str(tmp_path / "missing")) is False  # no /proc: float32, the safe choice


def test_vllm_auto_dtype_is_bfloat16() -> None:
    assert vllm_dtype("auto") == "bfloat16" and vllm_dtype("float32") == "float32"


def test_the_default_dtype_is_auto_and_the_run_id_keeps_it_unresolved(no_engine_env) -> None:
    settings = Settings(device="cpu")
    assert settings.dtype == "auto"
    # the spec (run id) names what was configured; the runtime record what the device computed in
    assert engine_config("transformers", settings, resolve_device=False)["dtype"] == "auto"
    assert engine_config("transformers", settings)["dtype"] == resolve_dtype("auto", "cpu")
    # device auto stays unresolved in the spec, and so does its dtype
    assert engine_config("transformers", Settings(device="auto"), resolve_device=False)["dtype"] == "auto"


def test_an_unknown_dtype_is_refused_when_settings_are_built(monkeypatch) -> None:
    monkeypatch.setenv("SRDQ_DTYPE", "float64")
    with pytest.raises(ConfigError, match=r"^invalid setting SRDQ_DTYPE='float64': Input should be 'auto'"):
        get_settings()


def test_every_invalid_setting_is_named_and_secrets_are_not_echoed(monkeypatch) -> None:
    monkeypatch.setenv("SRDQ_INVARIANT_ROWS", "-3")
    monkeypatch.setenv("SRDQ_LEASE_TTL_S", "soon")
    monkeypatch.setenv("SRDQ_S3_ENDPOINT_URL", "[1, 2]")
    with pytest.raises(ConfigError) as info:
        get_settings()
    message = str(info.value)
    assert "SRDQ_INVARIANT_ROWS='-3': Input should be greater than or equal to 0" in message
    assert "SRDQ_LEASE_TTL_S='soon'" in message
    assert "\n" not in message and "pydantic" not in message.lower()


def test_a_settings_error_names_a_url_or_key_without_its_value() -> None:
    class Fake(BaseModel):  # the same field names as Settings, of a type the values fail
        database_url: int
        aws_secret_access_key: int
        slice_rounds: int

    with pytest.raises(ValidationError) as info:
        Fake(database_url="postgresql://u:hunter2@h/db", aws_secret_access_key="hunter2", slice_rounds="x")
    message = settings_error(info.value)
    assert "SRDQ_DATABASE_URL: " in message and "SRDQ_AWS_SECRET_ACCESS_KEY: " in message
    assert "SRDQ_SLICE_ROUNDS='x': " in message
    assert "hunter2" not in message


@pytest.mark.parametrize(
    ("var", "value"), [("SRDQ_DTYPE", "float64"), ("SRDQ_INVARIANT_ROWS", "-3"), ("SRDQ_KV_REUSE", "maybe")]
)
def test_srdq_run_with_a_bad_setting_prints_one_line_and_writes_nothing(tmp_path, var, value) -> None:
    out = tmp_path / "out"
    proc = run_srdq(
        "run",
        str(ROOT / "examples" / "gsm8k_sample.jsonl"),
        "--model",
        "tiny-random-llama",
        "--limit",
        "1",
        "--out",
        str(out),
        env=srdq_env(**{var: value}),
    )
    assert proc.returncode == 1, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"Error: invalid setting {var}="), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_the_default_is_the_fast_padded_mode_and_deterministic_sets_both_knobs(no_engine_env) -> None:
    default = Settings()
    assert (default.batch_invariant, default.kv_reuse, default.dtype) == (False, True, "auto")
    det = Settings(deterministic=True, batch_invariant=False, kv_reuse=True)  # the switch wins
    assert (det.batch_invariant, det.kv_reuse) == (True, False)
    assert engine_config("transformers", det, resolve_device=False) == engine_config(
        "transformers", Settings(batch_invariant=True, kv_reuse=False), resolve_device=False
    )


def _dry_run_id(*extra: str, **env: str) -> str:
    proc = run_srdq(
        "submit",
        "dataset",
        str(ROOT / "examples" / "gsm8k_sample.jsonl"),
        "--method",
        "sampling",
        "--model",
        "tiny-random-llama",
        "--limit",
        "2",
        "--dry-run",
        *extra,
        env=srdq_env(**env),
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split(":", 1)[0]


def test_deterministic_flag_names_its_mode_in_the_run_id(no_engine_env) -> None:
    fast = _dry_run_id()
    det = _dry_run_id("--deterministic")
    assert fast.startswith("run-") and det.startswith("run-") and det != fast
    # the flag, its variable and the two knobs it sets are one mode, so one run id
    assert _dry_run_id(SRDQ_DETERMINISTIC="true") == det
    assert _dry_run_id(SRDQ_BATCH_INVARIANT="true", SRDQ_KV_REUSE="false") == det
