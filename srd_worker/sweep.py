"""Sweep files (pure parsing, validation and expansion; not wired into the CLI yet): one YAML file names
the dataset, model, reward and engine once, and a grid of methods × n × parameters × seeds.

    dataset: gsm8k              # a file path or a built-in dataset name
    task: auto                  # optional (default auto)
    model: tiny-random-llama
    reward: arithmetic          # optional (null: no reward model)
    engine: transformers        # optional
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
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from srd_worker.errors import ConfigError

TOP_FIELDS = ("dataset", "task", "model", "reward", "engine", "limit", "shard_size", "seeds", "methods")
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
    )


def load_sweep(path: str | Path) -> Sweep:
    """Read and validate a sweep YAML file."""
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read sweep file {path}: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"sweep file {path} is not valid YAML: {exc}") from None
    return parse_sweep(data)


def prepare_sweep(sweep: Sweep, *, base_dir: str | Path | None = None) -> tuple[str, list[Any]]:
    """(sweep id, one ``spec.PreparedRun`` per point), every point validated before anything is written.
    A relative dataset path is taken from ``base_dir`` when it exists there. An invalid point raises one
    ``ConfigError`` naming its index, method and parameters."""
    from srd_worker.spec import prepare_run

    dataset: str | Path = sweep.dataset
    if base_dir is not None and not Path(dataset).is_absolute() and (Path(base_dir) / dataset).exists():
        dataset = Path(base_dir) / dataset
    prepared = []
    for i, run in enumerate(sweep.runs):
        try:
            prepared.append(
                prepare_run(
                    dataset=dataset,
                    task=sweep.task,
                    method=run.method,
                    params=dict(run.params),
                    model=sweep.model,
                    reward=sweep.reward,
                    seed=run.seed,
                    limit=sweep.limit,
                    shard_size=sweep.shard_size,
                    engine=sweep.engine,
                )
            )
        except ConfigError as exc:
            raise ConfigError(f"sweep run {i} ({run.method}, {run.params}, seed {run.seed}): {exc}") from None
    return sweep_id([p.spec.run_id() for p in prepared]), prepared


def sweep_id(run_ids: list[str]) -> str:
    """``sweep-`` + 12 hex digits of the sha256 of the expanded run ids, in order."""
    return "sweep-" + hashlib.sha256("\n".join(run_ids).encode()).hexdigest()[:12]
