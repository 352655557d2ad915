"""``srdq merge``: the K slices of a run (``srdq run --num-shards K --shard-index I``, ``srd_worker.slicing``),
each in its own output folder, combined into one ``srdq run`` output folder of the whole run.

The merged folder is what ``srdq run`` would have written for the whole run: ``srdq.db`` (the run with all
its items and shards, each slice's finished shards with their results; ``srdq export``, ``report``,
``status``, ``regrade`` and ``compare`` read it with ``--db``), ``<run_id>/results.jsonl`` and
``timings.jsonl`` in dataset order, ``summary.json`` (when every item has its result), and
``<run_id>/merge.json``: which slice came from which folder, and the missing ones.

Everything is checked before anything is written: every folder holds one slice of the same run (a slice
of another spec is refused, naming the field that differs), no slice index comes twice, and no slice is
missing or unfinished (listed by index) unless ``allow_partial``. A partial merge leaves the missing
shards pending in the merged store: merging again once they are there adds them (results are written
once per item), and so does ``srdq run`` of the whole run's command with ``--out`` the merged folder.
"""

from __future__ import annotations

import glob
import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from srd_worker.errors import ConfigError, SrdqError
from srd_worker.fileutil import write_atomic
from srd_worker.local import Summary, reset_partial_results, write_summary
from srd_worker.slicing import SLICE_FILE, SliceOf, read_marker

#: The merged folder's record of what it was merged from (``OUT/<run_id>/merge.json``).
MERGE_FILE = "merge.json"


@dataclass(frozen=True)
class _Item:
    """A stored item as ``crud.insert_run`` takes it."""

    id: str
    question: str
    gold: str
    meta: dict[str, Any]


@dataclass
class SliceFolder:
    """One slice's output folder, read (nothing of it is written)."""

    folder: Path
    marker: dict[str, Any]
    part: SliceOf
    run_id: str
    config_hash: str
    spec: dict[str, Any]
    name: str
    versions: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    #: the slice's shards: index -> (status, results of the shard if it is done)
    shards: dict[int, tuple[str, list[dict[str, Any]]]]

    @property
    def done(self) -> list[int]:
        return [i for i, (status, _) in self.shards.items() if status == "done"]

    @property
    def finished(self) -> bool:
        return len(self.done) == len(self.shards)


@dataclass
class MergeOutcome:
    run_id: str
    out: Path
    count: int
    merged: list[int]
    missing: list[int]
    unfinished: list[int]
    items: int
    results: int
    results_path: Path
    summary: Summary | None
    slices: list[dict[str, Any]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.results == self.items


def expand_folders(args: list[str] | tuple[str, ...]) -> list[Path]:
    """The slice folders: each argument a folder, or a glob pattern (``'slices/*'``, quoted so the shell
    leaves it) matching some; ``ConfigError`` for one that names nothing."""
    out: list[Path] = []
    for arg in args:
        if Path(arg).exists() or not glob.has_magic(arg):
            out.append(Path(arg))
            continue
        matched = sorted(Path(p) for p in glob.glob(arg) if Path(p).is_dir())
        if not matched:
            raise ConfigError(f"{arg}: no folder matches this pattern")
        out.extend(matched)
    if not out:
        raise ConfigError("no slice folders given")
    return out


def _markers(folder: Path, run_id: str | None) -> dict[str, Any]:
    """The one slice marker in ``folder`` (of ``run_id`` when given); ``ConfigError`` otherwise."""
    if not folder.is_dir():
        what = "a file, not" if folder.exists() else "no such folder:"
        raise ConfigError(
            f"{folder}: {what} a slice's --out folder (srdq run --num-shards K --shard-index I)"
        )
    if not (folder / "srdq.db").is_file():
        raise ConfigError(f"{folder}: not a `srdq run` output folder (no srdq.db)")
    markers = {}
    for path in sorted(folder.glob(f"run-*/{SLICE_FILE}")):
        marker = read_marker(path.parent)
        if marker is not None:
            markers[path.parent.name] = marker
    if run_id is not None:
        if run_id not in markers:
            raise ConfigError(f"{folder}: holds no slice of {run_id}")
        return markers[run_id]
    if not markers:
        raise ConfigError(
            f"{folder}: holds no slice of a run (no run-*/{SLICE_FILE}: was it written by "
            "`srdq run --num-shards K --shard-index I`?)"
        )
    if len(markers) > 1:
        raise ConfigError(
            f"{folder}: holds slices of {len(markers)} runs ({', '.join(markers)}); pick one with --run"
        )
    return next(iter(markers.values()))


def read_slice(folder: Path, run_id: str | None = None) -> SliceFolder:
    """The slice in ``folder``: its marker, its run row and its shards' statuses and results."""
    from srd_worker.store import crud
    from srd_worker.store.db import open_sqlite, session_scope

    marker = _markers(folder, run_id)
    part = SliceOf(count=int(marker["num_shards"]), index=int(marker["shard_index"]))
    rid = str(marker.get("run_id"))
    first, stop = (int(x) for x in marker["shards"])
    db = open_sqlite(folder / "srdq.db")  # a slice written by an older srdq is brought up to date
    try:
        with session_scope(db) as session:
            run = crud.get_run(session=session, run_id=rid)
            shards = {
                s.index: (s.status, crud.load_results(session=session, run_id=rid, shard_index=s.index))
                for s in crud.list_shards(session=session, run_id=rid)
                if first <= s.index < stop
            }
    except SrdqError as exc:
        raise ConfigError(f"{folder}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - a store srdq cannot read: one line naming it
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"{folder}/srdq.db: cannot be read ({first_line})") from None
    finally:
        db.dispose()
    if run.config_hash != marker.get("config_hash") or run.n_shards != marker.get("run_shards"):
        raise ConfigError(f"{folder}: {SLICE_FILE} does not match the run in srdq.db")
    if sorted(shards) != list(range(first, stop)):
        raise ConfigError(f"{folder}: srdq.db lacks shards of {part} ({first}..{stop - 1})")
    return SliceFolder(
        folder=folder,
        marker=marker,
        part=part,
        run_id=rid,
        config_hash=run.config_hash,
        spec=dict(run.spec or {}),
        name=run.name,
        versions=dict(run.versions or {}),
        created_at=run.created_at,
        updated_at=run.updated_at,
        shards=shards,
    )


def spec_differences(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[str]:
    """The fields (``params.n``, ``seed``, ...) in which two run specs differ, sorted; the dataset as given
    (a path, which is not part of the run id) is left out."""
    out = []
    for key in sorted({*a, *b}):
        if not prefix and key == "dataset":
            continue
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            out.extend(spec_differences(va, vb, f"{prefix}{key}."))
        elif va != vb:
            out.append(f"{prefix}{key}")
    return out


def _value(spec: dict[str, Any], name: str) -> Any:
    value: Any = spec
    for part in name.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def check_slices(slices: list[SliceFolder], *, allow_partial: bool) -> tuple[list[int], list[int]]:
    """Refuse slices of different runs (naming the differing spec field), a slice index given twice, and
    (unless ``allow_partial``) missing or unfinished slices (listed by index). Returns (missing,
    unfinished)."""
    ref = slices[0]
    for s in slices[1:]:
        if s.part.count != ref.part.count:
            raise ConfigError(
                f"slices cut the run differently: --num-shards {ref.part.count} in {ref.folder}, "
                f"{s.part.count} in {s.folder}"
            )
        if s.config_hash != ref.config_hash:
            fields = spec_differences(ref.spec, s.spec) or ["the run id"]
            shown = ", ".join(f"{f} ({_value(ref.spec, f)!r} vs {_value(s.spec, f)!r})" for f in fields[:3])
            raise ConfigError(
                f"slices of different runs: {ref.folder} is {ref.run_id}, {s.folder} is {s.run_id}; their "
                f"specs differ in {shown}"
            )
    by_index: dict[int, list[SliceFolder]] = {}
    for s in slices:
        by_index.setdefault(s.part.index, []).append(s)
    for index, group in sorted(by_index.items()):
        if len(group) > 1:
            raise ConfigError(
                f"slice {index} of {ref.part.count} given twice: " + ", ".join(str(s.folder) for s in group)
            )
    missing = sorted(set(range(ref.part.count)) - set(by_index))
    unfinished = sorted(s.part.index for s in slices if not s.finished)
    if (missing or unfinished) and not allow_partial:
        raise ConfigError(
            _gaps(ref, missing, [s for s in slices if not s.finished]) + "; nothing written "
            "(--allow-partial merges what is there)"
        )
    return missing, unfinished


def _gaps(ref: SliceFolder, missing: list[int], unfinished: list[SliceFolder]) -> str:
    notes = []
    if missing:
        have = sorted(set(range(ref.part.count)) - set(missing))
        notes.append(
            f"missing slices {', '.join(map(str, missing))} of {ref.part.count} of {ref.run_id} "
            f"(given: {', '.join(map(str, have)) or 'none'})"
        )
    for s in unfinished:
        notes.append(
            f"slice {s.part.index} in {s.folder} is unfinished ({len(s.done)} of {len(s.shards)} shards done; "
            "its command resumes it)"
        )
    return "; ".join(notes)


def _merged_versions(slices: list[SliceFolder]) -> dict[str, Any]:
    """The first slice's versions, with every slice's runtime records (engine, model, reward revisions)."""
    versions = dict(slices[0].versions)
    runtime: list[Any] = []
    for s in slices:
        for rec in s.versions.get("runtime") or []:
            if rec not in runtime:
                runtime.append(rec)
    if runtime:
        versions["runtime"] = runtime
    return versions


def merge_slices(
    folders: list[Path], out_dir: str | Path, *, allow_partial: bool = False, run_id: str | None = None
) -> MergeOutcome:
    """Check every slice folder (``check_slices``), then write the merged run into ``out_dir``."""
    out = Path(out_dir)
    slices = [read_slice(f, run_id) for f in folders]
    missing, unfinished = check_slices(slices, allow_partial=allow_partial)
    for s in slices:
        if s.folder.resolve() == out.resolve():
            raise ConfigError(f"--out {out} is one of the slice folders: merge into another folder")
    ref = slices[0]
    rid = ref.run_id
    if read_marker(out / rid) is not None:
        raise ConfigError(
            f"--out {out} holds a slice of {rid} ({rid}/{SLICE_FILE}): merge into another folder"
        )
    _check_out(out, ref)
    items = _items(ref)
    records = _write_store(out, slices, items)
    run_dir = out / rid
    n_items = int(ref.marker["run_items"])
    reset_partial_results(run_dir, records)  # results.jsonl and timings.jsonl, in dataset order
    results_path = run_dir / "results.jsonl"
    summary = None
    if len(records) == n_items:
        start = min(s.created_at for s in slices)
        end = max(s.updated_at for s in slices)
        summary = Summary.of(
            rid, str(ref.spec.get("method")), records, (end - start).total_seconds(), results_path
        )
        write_summary(run_dir / "summary.json", summary)
    else:
        (run_dir / "summary.json").unlink(missing_ok=True)
    described = [
        {
            "shard_index": s.part.index,
            "folder": str(s.folder.resolve()),
            "shards": s.marker["shards"],
            "positions": s.marker["positions"],
            "shards_done": len(s.done),
            "results": sum(len(r) for _, r in s.shards.values()),
        }
        for s in sorted(slices, key=lambda s: s.part.index)
    ]
    merge_info = {
        "run_id": rid,
        "config_hash": ref.config_hash,
        "num_shards": ref.part.count,
        "slices": described,
        "missing": missing,
        "unfinished": unfinished,
        "items": n_items,
        "results": len(records),
        "complete": len(records) == n_items,
    }
    write_atomic(
        run_dir / MERGE_FILE, (json.dumps(merge_info, indent=2, sort_keys=True) + "\n").encode("utf-8")
    )
    return MergeOutcome(
        run_id=rid,
        out=out,
        count=ref.part.count,
        merged=sorted(s.part.index for s in slices),
        missing=missing,
        unfinished=unfinished,
        items=n_items,
        results=len(records),
        results_path=results_path,
        summary=summary,
        slices=described,
    )


def _check_out(out: Path, ref: SliceFolder) -> None:
    """``ConfigError`` when ``out`` cannot take the merged run: a file, or a store holding another run
    under the same id (a merge into a folder an earlier partial merge made completes it)."""
    from srd_worker.store import crud
    from srd_worker.store.db import open_sqlite, session_scope

    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a folder")
    if not (out / "srdq.db").is_file():
        return
    db = open_sqlite(out / "srdq.db")
    try:
        with session_scope(db) as session:
            run = crud.get_run(session=session, run_id=ref.run_id)
    except SrdqError:
        return  # not there yet: the merge adds it
    except Exception as exc:  # noqa: BLE001 - a store srdq cannot read: one line naming it
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"--out {out}: its srdq.db cannot be read ({first_line})") from None
    finally:
        db.dispose()
    if run.config_hash != ref.config_hash:
        raise ConfigError(f"--out {out}: its {ref.run_id} was made from another spec than the slices")


def _write_store(out: Path, slices: list[SliceFolder], items: list[_Item]) -> list[dict[str, Any]]:
    """The merged run in ``out/srdq.db`` (created, or completed when a partial merge made it); returns
    its records in dataset order."""
    from sqlalchemy import update
    from sqlmodel import col

    from srd_worker.store import crud
    from srd_worker.store.db import make_engine, session_scope, sqlite_url, upgrade
    from srd_worker.store.models import Run

    ref = slices[0]
    rid = ref.run_id
    out.mkdir(parents=True, exist_ok=True)
    url = sqlite_url(out / "srdq.db")
    upgrade(url)
    db = make_engine(url)
    try:
        versions = _merged_versions(slices)
        with session_scope(db) as session:
            crud.create_run(
                session=session,
                run_id=rid,
                name=ref.name,
                spec=ref.spec,
                config_hash=ref.config_hash,
                versions=versions,
                items=items,
                shard_size=int(ref.spec["shard_size"]),
            )
            for rec in versions.get("runtime") or []:
                crud.record_runtime(session=session, run_id=rid, record=rec)
        for s in slices:
            with session_scope(db) as session:  # one transaction per slice
                status = {sh.index: sh.status for sh in crud.list_shards(session=session, run_id=rid)}
                for index, (state, records) in sorted(s.shards.items()):
                    if state != "done" or status.get(index) == "done":
                        continue
                    crud.save_results(session=session, run_id=rid, shard_index=index, records=records)
                    crud.set_shard_status(session=session, run_id=rid, shard_index=index, status="done")
        with session_scope(db) as session:
            left = [sh for sh in crud.list_shards(session=session, run_id=rid) if sh.status != "done"]
            crud.set_run_status(session=session, run_id=rid, status="pending" if left else "done")
            # the run's span: from the first slice's start to the last one's end (`srdq report`'s wall time)
            session.exec(
                update(Run)
                .where(col(Run.id) == rid)
                .values(
                    created_at=min(s.created_at for s in slices), updated_at=max(s.updated_at for s in slices)
                )
            )
            return crud.load_results(session=session, run_id=rid)
    finally:
        db.dispose()


def _items(ref: SliceFolder) -> list[_Item]:
    """The run's items, in dataset order, from one slice's store (every slice's store holds them all)."""
    from srd_worker.store import crud
    from srd_worker.store.db import open_sqlite, session_scope

    db = open_sqlite(ref.folder / "srdq.db")
    try:
        with session_scope(db) as session:
            rows = crud.list_items(session=session, run_id=ref.run_id)
    finally:
        db.dispose()
    if len(rows) != int(ref.marker["run_items"]):
        raise ConfigError(
            f"{ref.folder}/srdq.db holds {len(rows)} items of {ref.run_id}, not {ref.marker['run_items']}"
        )
    return [_Item(id=r.item_key, question=r.question, gold=r.gold, meta=dict(r.meta or {})) for r in rows]
