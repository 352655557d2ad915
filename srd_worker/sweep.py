"""Sweep files: one YAML file names the dataset, model, reward and engine once, and a grid of methods × n
× parameters × seeds (``srdq run --sweep FILE``, ``srdq submit dataset --sweep FILE``).

    dataset: gsm8k              # a file path or a built-in dataset name
    task: auto                  # optional (default auto); a task file: path relative to this file
    model: tiny-random-llama
    reward: arithmetic          # optional (null: no reward model)
    engine: transformers        # optional
    engine_args: {max_batch_size: 32}   # optional: passed to the engine's constructor (--engine-arg)
    limit: 50                   # optional: the first LIMIT rows
    shard_size: 16              # optional
    seeds: [0, 1, 2]            # optional (default [0]); an int is one seed
    methods:
      - method: best_of_n
        n: [1, 4, 16]           # optional; a list is a grid axis
        params: {max_new_tokens: 256, temperature: [0.6, 0.8]}   # lists are grid axes too
      - method: self_consistency
        n: 8

Expansion order (deterministic): methods in file order, then the grid of ``n`` and the parameters (keys
sorted, values in file order), then seeds. ``expand`` returns one ``SweepRun`` per point;
``prepare_sweep`` validates every point with ``spec.prepare_run`` (dataset rows, method, parameters,
reward, engine capabilities) before anything is written, and ``sweep_id`` is ``sweep-`` + the first 12
hex digits of the sha256 of the expanded run ids in order, so the same file (and dataset bytes) give the
same id. A bad file raises one ``ConfigError`` naming the field (``methods[1].params.n``, ``seeds``, ...).

Recording: ``run_sweep_local`` (embedded) and ``service.submit_sweep`` (fleet) store the sweep (its
canonical content: the parsed file as sorted JSON, and the expanded run ids) and every run with its
sweep id in one transaction, before any run starts; running or submitting the same sweep again finds
the same ids and resumes. ``expand_ids`` and ``select_runs`` turn sweep ids into run ids for ``srdq
report``, ``export`` and ``compare``.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srd_worker.errors import ConfigError

if TYPE_CHECKING:
    from srd_worker.settings import Settings

TOP_FIELDS = (
    "dataset",
    "task",
    "model",
    "reward",
    "engine",
    "engine_args",
    "limit",
    "shard_size",
    "seeds",
    "methods",
)
METHOD_FIELDS = ("method", "n", "params")


@dataclass(frozen=True)
class SweepRun:
    """One point of a sweep: a method, its parameters and a seed (the rest is the sweep's)."""

    method: str
    params: dict[str, Any]
    seed: int


@dataclass(frozen=True)
class Sweep:
    dataset: str
    task: str
    model: str
    reward: str | None
    engine: str
    limit: int | None
    shard_size: int | None
    runs: tuple[SweepRun, ...]
    content: str = field(default="", compare=False)  # the parsed file as sorted JSON (what is stored)
    #: the engine's constructor arguments for every point (checked by ``prepare_sweep``)
    engine_args: dict[str, Any] = field(default_factory=dict)


def _int(value: Any, where: str, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"sweep field '{where}' must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"sweep field '{where}' must be >= {minimum}, got {value}")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"sweep field '{where}' must be a non-empty string, got {value!r}")
    return value


def _axis(value: Any, where: str) -> list[Any]:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise ConfigError(f"sweep field '{where}' is an empty list")
    return values


def parse_sweep(data: Any) -> Sweep:
    """A validated ``Sweep`` from the parsed YAML (method names and parameters are checked later, by
    ``prepare_sweep``)."""
    if not isinstance(data, dict):
        raise ConfigError("a sweep file must be a YAML mapping with at least dataset, model and methods")
    unknown = sorted(set(data) - set(TOP_FIELDS))
    if unknown:
        raise ConfigError(f"unknown sweep field '{unknown[0]}'; valid: {', '.join(TOP_FIELDS)}")
    for required in ("dataset", "model", "methods"):
        if required not in data:
            raise ConfigError(f"sweep field '{required}' is missing")
    seeds = [_int(s, "seeds", minimum=0) for s in _axis(data.get("seeds", 0), "seeds")]
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"sweep field 'seeds' repeats a seed: {seeds}")
    methods = data["methods"]
    if not isinstance(methods, list) or not methods:
        raise ConfigError("sweep field 'methods' must be a non-empty list of {method, n, params}")
    runs: list[SweepRun] = []
    for i, entry in enumerate(methods):
        where = f"methods[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"sweep field '{where}' must be a mapping with 'method'")
        bad = sorted(set(entry) - set(METHOD_FIELDS))
        if bad:
            raise ConfigError(f"unknown sweep field '{where}.{bad[0]}'; valid: {', '.join(METHOD_FIELDS)}")
        method = _str(entry.get("method"), f"{where}.method")
        params = entry.get("params") or {}
        if not isinstance(params, dict):
            raise ConfigError(f"sweep field '{where}.params' must be a mapping of parameter: value(s)")
        if "n" in params:
            raise ConfigError(f"sweep field '{where}.params.n': give n at '{where}.n'")
        axes: dict[str, list[Any]] = {}
        if "n" in entry:
            axes["n"] = [_int(n, f"{where}.n", minimum=1) for n in _axis(entry["n"], f"{where}.n")]
        for key in sorted(params):
            axes[str(key)] = _axis(params[key], f"{where}.params.{key}")
        names = list(axes)
        for combo in itertools.product(*(axes[k] for k in names)):
            for seed in seeds:
                runs.append(SweepRun(method, dict(zip(names, combo, strict=True)), seed))
    reward = data.get("reward")
    engine_args = data.get("engine_args") or {}
    if not isinstance(engine_args, dict):
        raise ConfigError("sweep field 'engine_args' must be a mapping of argument: value")
    return Sweep(
        dataset=_str(str(data["dataset"]) if data["dataset"] is not None else None, "dataset"),
        task=_str(data.get("task", "auto"), "task"),
        model=_str(data["model"], "model"),
        reward=None if reward is None else _str(reward, "reward"),
        engine=_str(data.get("engine", "transformers"), "engine"),
        limit=None if data.get("limit") is None else _int(data["limit"], "limit", minimum=1),
        shard_size=None
        if data.get("shard_size") is None
        else _int(data["shard_size"], "shard_size", minimum=1),
        runs=tuple(runs),
        content=canonical(data),
        engine_args=dict(engine_args),
    )


def canonical(data: Any) -> str:
    """The sweep file's canonical content: the parsed YAML as sorted, indented JSON."""
    import json

    return json.dumps(data, sort_keys=True, indent=1, ensure_ascii=False, default=str)


def load_sweep(path: str | Path) -> Sweep:
    """Read and validate a sweep YAML file."""
    import yaml

    from srd_worker.tasks.task_file import strict_yaml_loader, yaml_problem

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read sweep file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        bad_line = exc.object[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"sweep file {path}, line {bad_line}: not valid UTF-8 (byte 0x{exc.object[exc.start]:02x})"
        ) from None
    try:
        # a key written twice is refused (safe_load would keep the last one silently)
        data = yaml.load(text, Loader=strict_yaml_loader(f"sweep file {path}"))  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        line, problem = yaml_problem(exc)
        where = f"sweep file {path}" + ("" if line is None else f", line {line}")
        raise ConfigError(f"{where}: not valid YAML: {problem}") from None
    return parse_sweep(data)


def prepare_sweep(
    sweep: Sweep,
    *,
    base_dir: str | Path | None = None,
    default_shard_size: int | None = None,
    stream: bool = False,
    settings: Settings | None = None,
) -> tuple[str, list[Any]]:
    """(sweep id, one ``spec.PreparedRun`` per point), every point validated before anything is written.
    A relative dataset path (or task file path) is taken from ``base_dir`` when it exists there. An invalid point raises one
    ``ConfigError`` naming its index, method and parameters. ``default_shard_size`` applies when the file
    gives no ``shard_size`` (both ``srdq submit`` and ``srdq run``: 16; none: one shard). With ``stream`` (``srdq submit``)
    the dataset is spooled to disk once and every point shares that spool (``spec.prepare_run``);
    close the points with ``close_prepared``. ``settings`` (default: the SRDQ_* environment) give the engine
    configuration each point's run id names (``RunSpec.engine_config``)."""
    from srd_worker.spec import prepare_run
    from srd_worker.tasks.task_file import is_task_file

    dataset: str | Path = sweep.dataset
    if base_dir is not None and not Path(dataset).is_absolute() and (Path(base_dir) / dataset).exists():
        dataset = Path(base_dir) / dataset
    task = sweep.task  # a task file (*.yaml) is found the way the dataset is: beside the sweep file first
    if base_dir is not None and is_task_file(task) and not Path(task).is_absolute():
        if (Path(base_dir) / task).is_file():
            task = str(Path(base_dir) / task)
    prepared: list[Any] = []
    seen: dict[str, int] = {}  # run id → the first point that is it
    try:
        for i, run in enumerate(sweep.runs):
            try:
                prepared.append(
                    prepare_run(
                        dataset=dataset,
                        task=task,
                        method=run.method,
                        params=dict(run.params),
                        model=sweep.model,
                        reward=sweep.reward,
                        seed=run.seed,
                        limit=sweep.limit,
                        shard_size=sweep.shard_size or default_shard_size,
                        engine=sweep.engine,
                        stream=stream,
                        spool=prepared[0].items if stream and prepared else None,
                        settings=settings,
                        engine_args=sweep.engine_args,
                    )
                )
            except ConfigError as exc:
                raise ConfigError(
                    f"sweep run {i} ({run.method}, {run.params}, seed {run.seed}): {exc}"
                ) from None
            rid = prepared[-1].spec.run_id()
            if rid in seen:  # one run twice would be counted, enqueued and reported twice
                raise ConfigError(
                    f"sweep runs {seen[rid]} and {i} are the same run ({run.method}, {run.params}, seed "
                    f"{run.seed}: {rid}): list each configuration once"
                )
            seen[rid] = i
    except BaseException:
        close_prepared(prepared)
        raise
    return sweep_id([p.spec.run_id() for p in prepared]), prepared


def close_prepared(prepared: list[Any]) -> None:
    """Delete the spooled items of prepared runs (``prepare_sweep(stream=True)``); a no-op for lists."""
    for p in prepared:
        p.close()


def sweep_id(run_ids: list[str]) -> str:
    """``sweep-`` + 12 hex digits of the sha256 of the expanded run ids, in order."""
    return "sweep-" + hashlib.sha256("\n".join(run_ids).encode()).hexdigest()[:12]


# --------------------------------------------------------------------------------------------- running
@dataclass
class SweepPlan:
    """A validated sweep, ready to record: its id, name, canonical content and one prepared run per
    point (in expansion order)."""

    sweep_id: str
    name: str
    sweep: Sweep
    prepared: list[Any]

    @property
    def run_ids(self) -> list[str]:
        return [p.spec.run_id() for p in self.prepared]


def plan_sweep(
    path: str | Path, *, name: str | None = None, default_shard_size: int | None = None, stream: bool = False
) -> SweepPlan:
    """Load, validate and expand the sweep file at ``path`` (nothing written); relative dataset paths are
    taken from the file's folder when they exist there. ``stream``: see ``prepare_sweep``."""
    sweep = load_sweep(path)
    sid, prepared = prepare_sweep(
        sweep, base_dir=Path(path).parent, default_shard_size=default_shard_size, stream=stream
    )
    return SweepPlan(sid, name or Path(path).stem, sweep, prepared)


def run_name(prepared: Any) -> str:
    """A run's name, as ``srdq run`` and ``srdq submit`` name runs outside sweeps."""
    return f"{prepared.spec.method}-{Path(prepared.spec.dataset).stem}"


def record_sweep(
    session: Any, plan: SweepPlan, *, versions: dict[str, Any], queue: str | None = None
) -> list[str]:
    """Store the sweep and every run (with shards and items) tagged with its id, in the caller's
    transaction; returns the ids of the runs created now (decided by each run's insert; the others
    existed)."""
    from srd_worker.store import crud

    crud.create_sweep(
        session=session,
        sweep_id=plan.sweep_id,
        name=plan.name,
        content=plan.sweep.content,
        run_ids=plan.run_ids,
    )
    created = []
    for prepared in plan.prepared:
        spec = prepared.spec
        _run, new = crud.insert_run(
            session=session,
            run_id=spec.run_id(),
            name=run_name(prepared),
            spec=spec.stored(),
            config_hash=spec.config_hash(),
            versions=versions,
            items=prepared.items,
            shard_size=spec.shard_size,
            sweep_id=plan.sweep_id,
            queue=queue,
        )
        if new:
            created.append(spec.run_id())
    return created


@dataclass
class PointResult:
    index: int
    point: SweepRun
    summary: Any  # local.Summary


def run_sweep_local(
    plan: SweepPlan,
    *,
    out_dir: str | Path,
    settings: Settings,
    on_point: Callable[[int, SweepRun, str, str], None] | None = None,
    on_done: Callable[[PointResult], None] | None = None,
    on_start: Callable[[str, int, int], None] | None = None,
    on_round: Callable[[Any], None] | None = None,
) -> list[PointResult]:
    """Run every point of the sweep in order with ``local.run_local`` into one output folder (one SQLite
    store). The sweep and all its runs are recorded first; finished points are only re-reported and an
    interrupted one resumes from its last checkpoint. The model is loaded once, and only if a point still
    has work. ``on_point(index, point, run_id, state)`` is called before each point (state: ``done`` or
    ``todo``), ``on_done`` after it."""
    from srd_worker.local import close_all, run_local, versions
    from srd_worker.store import crud
    from srd_worker.store.db import make_engine, session_scope, sqlite_url, upgrade
    from srd_worker.wiring import check_spec, probe_sources

    for prepared in plan.prepared:  # every point checked before anything is written
        spec = prepared.spec
        check_spec(prepared.method, engine=spec.engine, reward=spec.reward, engine_args=spec.engine_args)
        probe_sources(prepared.spec, settings=settings)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    url = sqlite_url(out / "srdq.db")
    upgrade(url)
    db = make_engine(url)
    try:
        with session_scope(db) as session:
            record_sweep(session, plan, versions=versions())
        with session_scope(db) as session:
            finished = {
                r.id for r in crud.sweep_runs(session=session, sweep_id=plan.sweep_id) if r.status == "done"
            }
    finally:
        db.dispose()
    built: list[Any] = []
    results = []
    try:
        for i, (point, prepared) in enumerate(zip(plan.sweep.runs, plan.prepared, strict=True)):
            run_id = prepared.spec.run_id()
            if on_point is not None:
                on_point(i, point, run_id, "done" if run_id in finished else "todo")
            if run_id not in finished and not built:
                from srd_worker.engines.registry import build_engine
                from srd_worker.provenance import applied_settings

                point_settings = applied_settings(settings, prepared.spec.engine_config)
                spec = prepared.spec
                built.append(build_engine(spec.engine, spec.model, point_settings, spec.engine_args))
            summary = run_local(
                prepared,
                out_dir=out,
                settings=settings,
                engine=built[0] if built else None,
                on_start=on_start,
                on_round=on_round,
            )
            results.append(PointResult(i, point, summary))
            if on_done is not None:
                on_done(results[-1])
    finally:
        close_all(built)
    return results


# ------------------------------------------------------------------------------------------ reading
def is_sweep_id(text: str) -> bool:
    return text.startswith("sweep-")


def sweep_run_ids(session: Any, sweep_id: str) -> list[str]:
    """The stored runs of ``sweep_id`` in expansion order; ``StoreError`` if there is no such sweep."""
    from srd_worker.store import crud

    return [r.id for r in crud.sweep_runs(session=session, sweep_id=sweep_id)]


def expand_ids(db: Any, ids: list[str]) -> list[str]:
    """Run ids with every sweep id replaced by its runs (order kept, duplicates dropped)."""
    from srd_worker.store.db import session_scope

    out: list[str] = []
    with session_scope(db) as session:
        for given in ids:
            out += sweep_run_ids(session, given) if is_sweep_id(given) else [given]
    return list(dict.fromkeys(out))


def parse_selector(text: str) -> tuple[str, str | None, dict[str, str]]:
    """``SWEEP[:METHOD[:KEY=VALUE]...]`` → (sweep id, method, parameter filters)."""
    sid, *rest = text.split(":")
    method = rest[0] if rest and rest[0] else None
    filters: dict[str, str] = {}
    for part in rest[1:]:
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise ConfigError(f"{text!r}: expected SWEEP:METHOD[:KEY=VALUE]..., got {part!r}")
        filters[key] = value
    return sid, method, filters


def select_runs(db: Any, text: str) -> list[str]:
    """A run id (itself), or ``SWEEP[:METHOD[:KEY=VALUE]...]``: the sweep's runs of that method whose
    parameters match every filter (compared as text). ``ConfigError`` when nothing matches."""
    from srd_worker.store import crud
    from srd_worker.store.db import session_scope

    if not is_sweep_id(text):
        return [text]
    sid, method, filters = parse_selector(text)
    with session_scope(db) as session:
        runs = crud.sweep_runs(session=session, sweep_id=sid)
    chosen = [
        r.id
        for r in runs
        if (method is None or r.spec.get("method") == method)
        and all(str((r.spec.get("params") or {}).get(k)) == v for k, v in filters.items())
    ]
    if not chosen:
        methods = sorted({str(r.spec.get("method")) for r in runs})
        raise ConfigError(f"{text!r} selects no run of sweep {sid} (its methods: {', '.join(methods)})")
    return chosen
