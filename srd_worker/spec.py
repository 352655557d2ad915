"""The run spec (what to run): dataset, task, method and params, model, reward, seed.

Validated when built; the run id is derived from it (deterministic ids, STYLE.md #11), so the same
dataset content and spec always name the same run and a repeated command resumes instead of
starting over.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from srd_worker.encoding import sorted_json
from srd_worker.errors import ConfigError, DatasetError
from srd_worker.methods.base import Method
from srd_worker.methods.registry import build_method
from srd_worker.tasks.base import Item, Task
from srd_worker.tasks.spool import ItemSpool

if TYPE_CHECKING:
    from srd_worker.settings import Settings


class RunSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    dataset: str = Field(
        description="dataset as given by the user: a file path or a built-in name such as gsm8k "
        "(not part of the run id: the same bytes give the same run)"
    )
    dataset_sha256: str = Field(description="sha256 of the dataset file's bytes")
    task: str = Field(description="task adapter name (gsm8k, math500, ...)")
    fields: dict[str, str] = Field(
        default_factory=dict, description="generic task's --field KEY=COLUMN mapping"
    )
    task_def: dict[str, Any] = Field(
        default_factory=dict,
        description="a task file's definition (tasks.task_file), so every worker builds the same task "
        "without the file; empty for the built-in tasks",
    )
    method: str
    params: dict[str, Any] = Field(description="method parameters after validation, defaults filled in")
    model: str = Field(description="policy model name or path")
    engine: str = "transformers"
    reward: str | None = Field(None, description="reward model name, or None")
    seed: int = 0
    limit: int | None = Field(None, description="use only the first LIMIT rows")
    shard_size: int = Field(description="items per shard")
    engine_config: dict[str, Any] = Field(
        default_factory=dict,
        description="the engine settings that change results (dtype, device, batching mode, KV reuse; "
        "provenance.engine_config), taken from the submitting settings; workers build the engine with them",
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description="arguments passed through to the engine's constructor (--engine-arg KEY=VALUE, a sweep's "
        "engine_args), checked and typed (engines.engine_args); they win over the SRDQ_* settings of the "
        "same meaning, whose keys then leave engine_config",
    )

    forked_from: dict[str, Any] | None = Field(
        None,
        description="`srdq fork`: {run: the parent run id, round: R}; the run starts from the parent's "
        "states after round R (copied into its checkpoints) and goes on with this spec",
    )

    def config_hash(self) -> str:
        # fields, task_def, engine_config, engine_args and forked_from enter the hash only when set: the ids
        # of specs without them stay
        empty = {
            k
            for k in ("fields", "task_def", "engine_config", "engine_args", "forked_from")
            if not getattr(self, k)
        }
        body = self.model_dump(exclude={"dataset"} | empty)
        text = sorted_json(body, compact=False, ascii=True, allow_nan=True)  # the format old run ids hashed
        return hashlib.sha256(text.encode()).hexdigest()

    def run_id(self) -> str:
        return "run-" + self.config_hash()[:12]

    def stored(self) -> dict[str, Any]:
        """The spec as the ``run`` row keeps it: ``forked_from`` only on a fork (a plain run's stored spec
        is what it was before forks existed)."""
        return self.model_dump(exclude={"forked_from"} if self.forked_from is None else set())


def dataset_sha256(path: str | Path) -> str:
    """sha256 of a dataset: a file's bytes; for a folder (a ``save_to_disk`` dataset) the sha256 of its
    files' relative names and sha256s, in name order (the same bytes give the same digest anywhere)."""
    p = Path(path)
    if not p.is_dir():
        return file_sha256(p)
    h = hashlib.sha256()
    for file in sorted(f for f in p.rglob("*") if f.is_file()):
        h.update(f"{file.relative_to(p).as_posix()}\0{file_sha256(file)}\n".encode())
    return h.hexdigest()


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass
class PreparedRun:
    spec: RunSpec
    task: Task
    #: A list, or with ``prepare_run(stream=True)`` an ``ItemSpool`` on disk (``len`` and iteration).
    items: list[Item] | ItemSpool
    method: Method

    def close(self) -> None:
        """Delete the spooled items, if any (a no-op for a list)."""
        if isinstance(self.items, ItemSpool):
            self.items.close()


def parse_overrides(pairs: list[str] | tuple[str, ...]) -> dict[str, str]:
    """``key=value`` strings from ``--set`` into a dict (types are checked by the method's Params). A key
    given again overrides the earlier value, as Helm's ``--set`` does: a script's shared arguments can be
    followed by one run's own."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def prepare_run(
    *,
    dataset: str | Path,
    task: str = "auto",
    method: str,
    params: dict[str, Any],
    model: str,
    reward: str | None,
    seed: int = 0,
    limit: int | None = None,
    shard_size: int | None = None,
    fields: dict[str, str] | None = None,
    max_row_bytes: int | None = None,
    engine: str = "transformers",
    stream: bool = False,
    spool: ItemSpool | None = None,
    settings: Settings | None = None,
    include_paths: tuple[str, ...] | list[str] = (),
    engine_args: dict[str, Any] | None = None,
    engine_args_raw: bool = False,
) -> PreparedRun:
    """Validate everything (dataset rows, method, params, reward name, engine capabilities) before anything
    is written. The engine is checked by its static capabilities (``engines.registry``): no model is loaded.

    ``dataset`` is a file path or a built-in dataset name (``srd_worker.datasets``; an existing file wins).
    The spec records it as given, with the file's sha256 (read in blocks). With ``stream=True`` the items
    are validated row by row into an ``ItemSpool`` on disk (memory independent of the dataset's length;
    ``srdq submit dataset``); the caller closes it (``PreparedRun.close``). ``spool`` reuses one already
    made from the same dataset, task, fields and limit (the points of a sweep) instead of spooling again.
    The engine settings that change results are read from ``settings`` (default: the SRDQ_* environment)
    into ``RunSpec.engine_config``, so the run id names them. ``task`` may be a task file (``*.yaml``) or
    the name of one in ``include_paths``; its definition goes into ``RunSpec.task_def``. ``engine_args``
    are checked against the engine's accepted arguments (``engines.engine_args``; ``engine_args_raw``: the
    text values of ``--engine-arg``, parsed as YAML scalars) into ``RunSpec.engine_args``."""
    from srd_worker.datasets import builtin_dataset, resolve_dataset
    from srd_worker.engines.registry import check_engine_args
    from srd_worker.rewards.registry import check_reward_name
    from srd_worker.tasks.loading import DEFAULT_MAX_ROW_BYTES
    from srd_worker.tasks.registry import resolve_task
    from srd_worker.tasks.spool import spool_items
    from srd_worker.wiring import check_spec, check_task

    built = build_method(method, params)  # unknown method / parameter fails before the dataset is read
    if reward is not None:
        check_reward_name(reward)
    if reward == "none":
        reward = None
    where = "--engine-arg" if engine_args_raw else "engine_args"
    checked_args = check_engine_args(engine, engine_args, raw=engine_args_raw, where=where)
    check_spec(built, engine=engine, reward=reward, engine_args=checked_args)
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {limit}")
    if not model.strip():
        raise ConfigError(
            "--model is empty; name a model (`srdq models` lists the built-in names) or a folder"
        )
    if seed < 0:  # a sweep's seeds are refused below 0 too (``sweep.parse_sweep``)
        raise ConfigError(f"--seed must be >= 0, got {seed}")
    path = resolve_dataset(dataset)
    builtin = builtin_dataset(dataset)
    if builtin is not None and builtin.task is None:
        raise ConfigError(
            f"built-in dataset {builtin.name!r} cannot be run ({builtin.description}); "
            "srd_worker.tasks.prm800k.load_prm800k reads it, and math500 holds the MATH problems"
        )
    row_bytes = max_row_bytes or DEFAULT_MAX_ROW_BYTES
    items: list[Item] | ItemSpool
    if stream:
        task_obj = resolve_task(
            path, task, fields=fields, max_row_bytes=row_bytes, include_paths=include_paths
        )
        check_task(built, task_obj)
        items = spool or spool_items(task_obj, path, limit=limit, max_row_bytes=row_bytes)
    else:
        task_obj = resolve_task(
            path, task, fields=fields, max_row_bytes=row_bytes, include_paths=include_paths
        )
        check_task(built, task_obj)
        items = task_obj.load(path)
        if limit is not None:
            items = items[:limit]
    try:
        return _prepared(
            dataset,
            path,
            builtin,
            task_obj,
            items,
            built,
            method=method,
            model=model,
            engine=engine,
            reward=reward,
            seed=seed,
            limit=limit,
            shard_size=shard_size,
            fields=fields,
            settings=settings,
            engine_args=checked_args,
        )
    except BaseException:
        if isinstance(items, ItemSpool) and items is not spool:
            items.close()
        raise


def _engine_config(engine: str, settings: Settings | None, engine_args: dict[str, Any]) -> dict[str, Any]:
    from srd_worker.provenance import engine_config

    if settings is None:
        from srd_worker.settings import get_settings

        settings = get_settings()
    return engine_config(engine, settings, resolve_device=False, engine_args=engine_args)


def _prepared(
    dataset: str | Path,
    path: Path,
    builtin: Any,
    task_obj: Task,
    items: list[Item] | ItemSpool,
    built: Method,
    *,
    method: str,
    model: str,
    engine: str,
    reward: str | None,
    seed: int,
    limit: int | None,
    shard_size: int | None,
    fields: dict[str, str] | None,
    settings: Settings | None = None,
    engine_args: dict[str, Any] | None = None,
) -> PreparedRun:
    from srd_worker.tasks.registry import task_definition

    if not len(items):
        raise DatasetError("no rows to run", path=str(dataset))
    sha256 = dataset_sha256(path)
    if builtin is not None and sha256 != builtin.sha256:
        raise DatasetError(
            f"built-in dataset {builtin.name!r} does not match its recorded sha256 (reinstall srdq)",
            path=str(path),
        )
    size = len(items) if shard_size is None else shard_size  # 0 is refused, not "one shard"
    if size < 1:
        raise ConfigError(f"--shard-size must be >= 1, got {shard_size}")
    spec = RunSpec(
        dataset=str(dataset),
        dataset_sha256=sha256,
        task=task_obj.name,
        fields=dict(fields or {}),
        task_def=task_definition(task_obj) or {},
        method=method,
        params=built.params.to_dict(),
        model=model,
        engine=engine,
        reward=reward,
        seed=seed,
        limit=limit,
        shard_size=size,
        engine_config=_engine_config(engine, settings, dict(engine_args or {})),
        engine_args=dict(engine_args or {}),
    )
    return PreparedRun(spec=spec, task=task_obj, items=items, method=built)
