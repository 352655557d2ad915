"""Slices of a run: ``srdq run ... --num-shards K --shard-index I`` runs one of K slices of a run on its own
(a Slurm array task, a Kubernetes Indexed Job pod), with no server; ``srdq merge`` (``srd_worker.merge``)
puts the K slices' output folders back together into the run's output.

A slice is a contiguous group of the run's own shards (``--shard-size`` items each, ``store.crud``'s
layout): slice ``I`` of ``K`` holds shards ``[I*S//K, (I+1)*S//K)`` of the run's ``S`` shards. The
partition is a function of ``S`` and ``K`` only (never of which slice asks), so the K slices cover every
shard, and every item, exactly once; and since a slice runs whole shards, each shard's engine batches are
the ones an unsliced run of the same command runs, so a slice's records are those of the unsliced run
wherever that run's records do not depend on the process (the re-fed and deterministic engine modes; see
the README's *Engine modes*).

A slice's output folder is an ordinary ``srdq run`` folder (``srdq.db`` holds the whole run: all its
items and shards, of which only the slice's are run) plus ``<run_id>/slice.json``, written before the
first round: the run id, its config hash and spec, K, I, and the slice's shards and item positions. A
slice killed midway resumes from its checkpoints when its command is run again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from srd_worker.errors import ConfigError
from srd_worker.fileutil import write_atomic

#: The marker file of a slice's output, in the run's folder (``OUT/<run_id>/slice.json``).
SLICE_FILE = "slice.json"


@dataclass(frozen=True)
class SliceOf:
    """Slice ``index`` of ``count`` (``--shard-index`` / ``--num-shards``)."""

    count: int
    index: int

    def __str__(self) -> str:
        return f"slice {self.index} of {self.count}"


def check_slice(count: int | None, index: int | None) -> SliceOf | None:
    """``--num-shards`` and ``--shard-index`` as a ``SliceOf`` (None when neither is given); ``ConfigError``
    when only one is given or ``index`` is not in ``[0, count)``."""
    if count is None and index is None:
        return None
    if count is None or index is None:
        given, lacking = (
            ("--num-shards", "--shard-index") if index is None else ("--shard-index", "--num-shards")
        )
        raise ConfigError(f"{given} needs {lacking} too (run slice I of K: --num-shards K --shard-index I)")
    if count < 1:
        raise ConfigError(f"--num-shards must be >= 1, got {count}")
    if not 0 <= index < count:
        raise ConfigError(f"--shard-index must be in 0..{count - 1} for --num-shards {count}, got {index}")
    return SliceOf(count=count, index=index)


def slice_shards(n_shards: int, part: SliceOf) -> range:
    """The run's shard indexes in ``part``: ``[I*S//K, (I+1)*S//K)`` of ``S = n_shards`` shards."""
    return range(part.index * n_shards // part.count, (part.index + 1) * n_shards // part.count)


def check_slice_fits(n_items: int, shard_size: int, part: SliceOf) -> None:
    """``ConfigError`` when the run has fewer shards than slices (some slice would be empty)."""
    n_shards = -(-n_items // shard_size)
    if part.count > n_shards:
        raise ConfigError(
            f"--num-shards {part.count} is more than the run's {n_shards} shards ({n_items} items, "
            f"--shard-size {shard_size}): use --num-shards {n_shards} or less, or a smaller --shard-size"
        )


def slice_marker(
    *,
    run_id: str,
    config_hash: str,
    spec: dict[str, Any],
    part: SliceOf,
    shards: range,
    positions: range,
    n_items: int,
    n_shards: int,
) -> dict[str, Any]:
    """The content of a slice's ``slice.json``."""
    return {
        "run_id": run_id,
        "config_hash": config_hash,
        "num_shards": part.count,
        "shard_index": part.index,
        "shards": [shards.start, shards.stop],
        "positions": [positions.start, positions.stop],
        "items": len(positions),
        "run_items": n_items,
        "run_shards": n_shards,
        "spec": spec,
    }


def write_marker(run_dir: Path, marker: dict[str, Any]) -> None:
    """``run_dir/slice.json`` (atomically)."""
    write_atomic(run_dir / SLICE_FILE, (json.dumps(marker, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def read_marker(run_dir: Path) -> dict[str, Any] | None:
    """``run_dir/slice.json``, or None when there is none; ``ConfigError`` when it cannot be read."""
    path = run_dir / SLICE_FILE
    if not path.is_file():
        return None
    try:
        marker = json.loads(path.read_text(encoding="utf-8"))
        SliceOf(count=int(marker["num_shards"]), index=int(marker["shard_index"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a slice marker srdq can read ({exc})") from None
    if not isinstance(marker, dict):
        raise ConfigError(f"{path}: not a slice marker srdq can read")
    return marker


def refuse_other_slice(run_dir: Path, run_id: str, part: SliceOf | None) -> None:
    """``ConfigError`` when ``run_dir`` holds another slice of the run than ``part`` (None: the whole run),
    or the whole run (its folder without ``slice.json``) and ``part`` is a slice: the folder's files would
    report each other's records."""
    marker = read_marker(run_dir)
    if marker is None:
        if part is not None and run_dir.is_dir():  # results of the whole run (or of a merge) are there
            raise ConfigError(
                f"{run_dir.parent} holds the whole run {run_id} ({run_dir}), not a slice: give each slice "
                "its own --out"
            )
        return
    held = SliceOf(count=int(marker["num_shards"]), index=int(marker["shard_index"]))
    if held == part:
        return
    asked = "the whole run" if part is None else str(part)
    raise ConfigError(
        f"{run_dir.parent} holds {held} of {run_id} ({run_dir / SLICE_FILE}), not {asked}: give each "
        f"slice its own --out (resume this one with --num-shards {held.count} --shard-index {held.index}; "
        "`srdq merge` combines slices)"
    )
