"""Typed settings (where things are): URLs, bucket, credentials, caches. Read from the environment.

Every field can be set with an ``SRDQ_``-prefixed environment variable (``SRDQ_DATABASE_URL`` ...) or a
``.env`` file. Building a ``Settings`` object does no I/O.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from srd_worker.errors import ConfigError

Dtype = Literal["auto", "bfloat16", "float16", "float32"]


def _default_cache_dir() -> Path:
    return Path.home() / ".cache" / "srdq"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SRDQ_", env_file=".env", extra="ignore")

    database_url: str = Field(
        "postgresql+psycopg2://postgres@127.0.0.1:5432/srdq",
        description="SQLAlchemy URL of the PostgreSQL database (service mode). `srdq run` uses a SQLite "
        "file under --out instead.",
    )
    broker_url: str = Field("redis://127.0.0.1:6379/0", description="Celery broker (Redis) URL.")
    object_store_url: str = Field(
        "s3://srdq-results", description="Where results go: s3://BUCKET/PREFIX or a local folder path."
    )
    s3_endpoint_url: str | None = Field(None, description="S3-compatible endpoint (MinIO, moto); None = AWS.")
    s3_region: str = Field("us-east-1", description="S3 region name.")
    aws_access_key_id: str | None = Field(None, description="S3 access key; None = standard AWS chain.")
    aws_secret_access_key: str | None = Field(None, description="S3 secret key; None = standard AWS chain.")
    cache_dir: Path = Field(
        default_factory=_default_cache_dir,
        description="Local cache: converted model weights (safetensors export of GGUF models).",
    )
    device: str = Field(
        "auto", description="torch device for the transformers engine: auto, cpu, cuda, cuda:N."
    )
    dtype: Dtype = Field(
        "auto",
        description="Model dtype (transformers engine, HF reward models, vLLM): auto, bfloat16, float16, "
        "float32. auto: bfloat16 on a GPU and on a CPU with native bf16 arithmetic (AVX512-BF16, AMX, ARM "
        "BF16), float32 on other CPUs, which emulate bf16 slower than float32 (see resolve_dtype).",
    )
    batch_invariant: bool = Field(
        False,
        description="Transformers engine: true: a seeded request's tokens do not depend on the rest of the "
        "batch: requests of equal prompt length run as their own unpadded batch, in forward passes of "
        "exactly invariant_rows rows (about 0.35x the padded mode's tokens/s on a CPU, docs/PERFORMANCE.md); "
        "false (default): one padded batch per call, so a request's float rounding, and with it a sampled "
        "token now and then, depends on what it is batched with (the shard's other items).",
    )
    invariant_rows: int = Field(
        4,
        ge=0,
        description="Transformers engine with batch_invariant: rows of every forward pass (groups are cut "
        "into chunks of this many, dummy rows fill the rest, finished rows stay in place); 0 = the row "
        "count follows the group (padding-invariant only: CPU kernels switch with the row count).",
    )
    batch_rows: int = Field(
        0,
        ge=0,
        description="Rows the runner keeps in flight (srdq run: across its shards; a worker: in its "
        "shard): R > 0 starts the items in order while their live candidates (the rows of their next "
        "round) fit in R, and starts the next ones (in srdq run, from the next shard) as rows free up, so "
        "SRD's rounds stay near R rows (docs/PERFORMANCE.md, *SRD's thin batches*). 0 (default): srdq run "
        "keeps a full shard's first-round rows in flight (shard_window), a worker steps every unfinished "
        "item of its shard. The run id names it when set: in the padded mode a request's tokens depend on "
        "its batch-mates.",
    )
    shard_window: bool | None = Field(
        None,
        description="srdq run without a row cap: keep the rows of a full shard's first round (--shard-size "
        "x a fresh item's width, e.g. SRD's n) in flight across shards, so as a shard's items keep, drop "
        "or finish candidates the next shard's items start in the rows they free, instead of the batch "
        "thinning to the shard's last item. Unset (default): on, except in the transformers engine's "
        "re-fed mode (kv_reuse false without batch invariance), whose records depend on their batch and "
        "equal a fleet run's of the same run id (a worker steps one shard at a time). true / false: on / "
        "off, named by the run id.",
    )
    kv_reuse: bool = Field(
        True,
        description="Transformers engine: keep each sequence's KV cache after a generate call (a "
        "content-addressed prefix store) and feed only the new tokens when a later request extends or "
        "shares a prefix of it (SRD's rounds and edits, chunked rounds). Next-token distributions agree "
        "with a full re-feed up to float rounding, so a resumed run equals an uninterrupted one in "
        "distribution; false: every prompt re-fed, and a resumed run is byte-identical to an "
        "uninterrupted one of the same shards (see deterministic for one independent of them).",
    )
    deterministic: bool = Field(
        False,
        description="Transformers engine: the deterministic mode (`srdq run --deterministic`): sets "
        "batch_invariant on and kv_reuse off, whatever they say, so a seeded request's tokens depend "
        "neither on its batch nor on a KV cache: a resumed run is byte-identical to an uninterrupted one, "
        "results do not depend on --shard-size or --limit, and coupled methods (SRD and its rejection-"
        "sampling ablation) share their drafts exactly. Slower: see docs/PERFORMANCE.md (engine limit).",
    )
    kv_reuse_mb: float = Field(
        1024.0,
        gt=0,
        description="Transformers engine with kv_reuse: memory budget of the prefix KV store in MiB (on "
        "the model's device), least recently used sequences evicted first.",
    )
    cudnn_attention: bool = Field(
        True,
        description="Transformers engine and HF reward models on a GPU: let PyTorch's scaled-dot-product "
        "attention use cuDNN (PyTorch's default). false turns the cuDNN backend off for the whole process "
        "when either loads, so attention takes the flash or memory-efficient kernels: on an H200 "
        "cuDNN made the first call of each new set of shapes 2.2-2.7x as long as the second, which it "
        "spends compiling attention kernels, and without it the first call took what the second did "
        "(docs/PERFORMANCE.md, *GPU*). No effect on a CPU.",
    )
    score_cache: bool = Field(
        True,
        description="Reuse reward scores stored in the run store (the score_cache table, shared by every "
        "run of the store) for an input scored before with the same reward model, revision and parameters; "
        "a hit is counted apart from reward calls (ledger rm_cache_hits). false: every score is computed "
        "and nothing is read from or written to the cache.",
    )
    rm_max_batch_tokens: int | None = Field(
        None,
        ge=1,
        description="HF and vLLM reward models: padded tokens per scoring batch (count x longest); unset "
        "keeps each reward's default (16384 for hf-orm/hf-prm, 65536 for vllm-rm). 1 scores every sequence "
        "alone: slower, but a score then never depends on which other sequences shared its batch (float "
        "rounding), so cached and recomputed scores agree bit for bit.",
    )
    tensor_parallel_size: int = Field(
        1, ge=1, description="vLLM engine: GPUs one model is split over (tensor parallel)."
    )
    gpu_memory_utilization: float = Field(
        0.6,
        gt=0,
        le=1,
        description="vLLM engine: share of each GPU's memory vLLM takes (weights + KV cache); "
        "the rest is left to a reward model on the same GPU. Not used by vLLM's CPU build "
        "(see vllm_cpu_kv_cache_gb).",
    )
    vllm_cpu_kv_cache_gb: float = Field(
        2.0,
        gt=0,
        description="vLLM engine on vLLM's CPU build (no GPU): GiB of RAM for the KV cache, passed as "
        "vLLM's kv_cache_memory_bytes instead of a share of the machine's memory.",
    )
    vllm_cpu_threads: str = Field(
        "auto",
        description="vLLM's CPU build: the cores its model worker computes on. auto: every usable core on a "
        "machine of at most 4 (vLLM itself keeps one core for its scheduler, half of a 2-core machine; "
        "measured 1.29x faster there), vLLM's own binding on larger ones; vllm: always vLLM's own; or a "
        "core list such as 0-3 (VLLM_CPU_OMP_THREADS_BIND, which wins when set).",
    )
    vllm_cpu_block_size: int = Field(
        32,
        ge=0,
        description="vLLM's CPU build: tokens per KV-cache block (vLLM's block_size); 0 = vLLM's own "
        "(128 on the CPU). Prefix caching reuses whole blocks only, so a chunked round (chunk_tokens) "
        "re-feeds up to a block less one of every continued sequence; 32 (the CPU backend wants a "
        "multiple of 32) ran raw calls 1.10x, chunked Best-of-N 1.16x and SRD 1.13x as fast as 128 "
        "(docs/PERFORMANCE.md, SRD's thin batches). An --engine-arg block_size wins.",
    )
    vllm_cpu_max_model_len: int = Field(
        0,
        ge=0,
        description="vLLM's CPU build: the context length it is built with (vLLM's max_model_len); 0 = "
        "the model's own. Without chunked prefill (which the CPU build cannot seed) the engine's token "
        "budget per step is the context length, and vLLM warms up with a dummy batch that long: for a "
        "model of 32k context (Qwen2.5-Coder-0.5B, bf16) that warm-up had not finished after 20 minutes "
        "on a 2-core CPU without native bf16. "
        "Prompts longer than it become error rows, so it does not change other items' results and is "
        "not part of the run id. An --engine-arg max_model_len wins.",
    )
    vllm_enforce_eager: bool = Field(
        False,
        description="vLLM engine: run the model eagerly (no torch.compile / CUDA graphs): much faster "
        "start-up, slower decoding. Tests and short runs on vLLM's CPU build use it.",
    )
    openai_base_url: str | None = Field(
        None,
        description="openai engine: the model server's API root (OpenAI-compatible), e.g. "
        "http://127.0.0.1:8000/v1. Required for --engine openai.",
    )
    openai_api_key: SecretStr | None = Field(
        None, description="openai engine: bearer token for the server; unset = OPENAI_API_KEY, else none."
    )
    openai_tokenizer: str | None = Field(
        None,
        description="openai engine: where the tokenizer is loaded from locally (model folder, cached HF id, "
        "smollm2, testbed, tiny-random-llama); unset = the run's --model.",
    )
    openai_concurrency: int = Field(16, ge=1, description="openai engine: requests in flight per engine.")
    openai_timeout_s: float = Field(600.0, gt=0, description="openai engine: per-request read timeout.")
    openai_retry_s: float = Field(
        300.0,
        gt=0,
        description="openai engine: how long a request is retried on connection errors, timeouts, 429 and "
        "5xx before the slice ends (the shard resumes later).",
    )
    openai_max_context: int | None = Field(
        None, ge=2, description="openai engine: the model's context, when the server does not report it."
    )
    judge_engine: str = Field(
        "transformers",
        description="judge:MODEL / judge-step:MODEL rewards: the judge model's engine (transformers, vllm, or "
        "openai: an OpenAI-compatible server at SRDQ_JUDGE_BASE_URL, e.g. the judge on its own machine).",
    )
    judge_base_url: str | None = Field(
        None, description="judge rewards with SRDQ_JUDGE_ENGINE=openai: the judge server's API root."
    )
    rm_base_url: str | None = Field(
        None,
        description="openai-rm:MODEL reward: the reward server's address (e.g. http://127.0.0.1:8002/v1; a "
        "trailing /v1 is dropped, as vLLM serves /pooling at its root), a server that serves the reward "
        "model for pooling (vLLM: --runner pooling).",
    )
    rm_tokenizer: str | None = Field(
        None,
        description="openai-rm:MODEL reward: where the reward model's tokenizer is loaded from (a local "
        "folder or a cached Hugging Face id; only tokenizer files are read); unset: MODEL.",
    )
    queue: str = Field("srdq", description="Celery queue shards are sent to and workers listen on.")
    lease_ttl_s: float = Field(
        60.0, gt=0, description="Shard lease lifetime; heartbeats renew it every ttl/3."
    )
    slice_rounds: int = Field(
        8, ge=1, description="Rounds one task runs before re-enqueueing its continuation."
    )
    slice_seconds: float = Field(
        600.0, gt=0, description="A task slice also ends after this many seconds (checked between rounds)."
    )
    max_attempts: int = Field(3, ge=1, description="Crashed attempts on a shard before it is marked failed.")
    reap_interval_s: float = Field(
        15.0, gt=0, description="How often each worker looks for lost or expired shards."
    )
    pending_grace_s: float = Field(
        120.0, gt=0, description="A shard pending this long is re-enqueued by the reaper."
    )
    max_row_bytes: int = Field(1_000_000, ge=1, description="Largest dataset row accepted, in bytes.")
    snapshot_rounds: int = Field(
        64,
        ge=0,
        description="Rounds whose per-item states are kept (table checkpoint_round, zlib-compressed) besides "
        "the latest checkpoint, so `srdq fork RUN --at-round R` can start from round R <= this; 0 keeps "
        "none (such runs can be forked only at a round by which every item had finished).",
    )
    tracking: Literal["none", "mlflow", "wandb"] = Field(
        "none",
        description="Experiment tracking of `srdq run` and `srdq report` (their --track): none, mlflow or "
        "wandb (the optional extra srdq[tracking]; srd_worker/tracking.py).",
    )
    mlflow_tracking_uri: str | None = Field(
        None,
        description="MLflow tracking URI: a server (http://...), a database, or a file: store; default "
        "MLFLOW_TRACKING_URI, else a file store in the command's output folder (OUT/mlruns).",
    )
    mlflow_experiment: str = Field("srdq", min_length=1, description="MLflow experiment runs are logged to.")
    wandb_project: str = Field("srdq", min_length=1, description="W&B project runs are logged to.")
    wandb_mode: Literal["offline", "online"] = Field(
        "offline",
        description="W&B mode: offline (run files on disk, no network; `wandb sync` uploads them later) or "
        "online (needs `wandb login`).",
    )
    wandb_dir: Path | None = Field(
        None, description="Folder for W&B's run files (default: the command's output folder)."
    )
    metrics_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="srdq worker: serve Prometheus metrics on this port (pool process i on port + i); 0 = off.",
    )
    visibility_timeout_s: int = Field(
        3600, description="Redis visibility timeout; a task slice must end far below it (see slice_rounds)."
    )

    @model_validator(mode="after")
    def _deterministic_mode(self) -> Settings:
        # one switch for the two knobs the run id names (engine_config records batch_invariant and
        # kv_reuse, so a run made with the switch and one made with the two knobs share their id)
        if self.deterministic:
            self.batch_invariant = True
            self.kv_reuse = False
        return self


#: /proc/cpuinfo flags of a CPU that computes bf16 natively: x86 AVX512-BF16 or AMX, ARM's BF16 extension
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


@functools.cache
def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """True when the CPU's flags (x86 ``flags``, ARM ``Features`` in /proc/cpuinfo) name native bf16
    arithmetic; False where they do not or cannot be read (another OS): float32 is the safe choice there."""
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features") and NATIVE_BF16_FLAGS & set(value.split()):
            return True
    return False


def resolve_dtype(dtype: str, device: str, *, native_bf16: bool | None = None) -> str:
    """The dtype ``auto`` stands for on ``device`` (already resolved: cpu, cuda, cuda:N, mps, ...): bfloat16
    on a GPU and on a CPU that computes bf16 natively (AVX512-BF16 / AMX, ARM BF16), float32 on any other
    CPU, which emulates bf16 and runs it slower than float32 (both measured: docs/PERFORMANCE.md, *The
    transformers engine's CPU defaults*). ``native_bf16`` overrides the CPU probe (tests). Any other value
    is returned as it is."""
    if dtype != "auto":
        return dtype
    if not str(device).startswith("cpu"):
        return "bfloat16"
    native = cpu_has_native_bf16() if native_bf16 is None else native_bf16
    return "bfloat16" if native else "float32"


def get_settings() -> Settings:
    """Build settings from the environment (call at the edge, pass the object down). A value that does
    not validate is a ``ConfigError`` naming its ``SRDQ_`` variable, not a pydantic traceback."""
    try:
        return Settings()
    except ValidationError as exc:
        raise ConfigError(settings_error(exc)) from None


def settings_error(exc: ValidationError) -> str:
    """One line per invalid setting: its environment variable, the value given and what is wrong."""
    lines = []
    for err in exc.errors():
        name = "SRDQ_" + "_".join(str(part) for part in err["loc"]).upper()
        # a key, a secret or a URL (which may hold a password) is named, never echoed
        shown = "" if any(w in name for w in ("KEY", "SECRET", "URL")) else f"={err.get('input')!r}"
        lines.append(f"invalid setting {name}{shown}: {err['msg']}")
    return "; ".join(lines)
