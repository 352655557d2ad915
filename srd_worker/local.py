"""The embedded default (``srdq run``): the service's code path on one machine with no services.

A SQLite file under the output folder plays PostgreSQL, the shards run in this process one after the
other, and results go to the output folder as JSONL. Running the same command again resumes from the
last checkpointed round (the run id comes from the spec), or just re-reports a finished run.

Output folder layout::

    OUT/srdq.db                    SQLite store (runs, shards, items, checkpoints, results)
    OUT/<run_id>/results.jsonl     one deterministic record per item, in dataset order
    OUT/<run_id>/timings.jsonl     per-item wall time per component (not deterministic, kept apart)
    OUT/<run_id>/summary.json      the summary table as JSON (written when the run ends)

Shards run one after the other; each finished shard's records are appended to ``results.jsonl`` and
``timings.jsonl`` at once (one write each, flushed to disk), so partial results can be read while the
run goes on. A resumed call first rewrites both files from the store (so a write cut short by a kill
is repaired), and the finished run writes them once more, atomically, in dataset order: the same
lines, since the shards are contiguous ranges of the dataset run in order.

``srdq run --num-shards K --shard-index I`` runs one slice of the run (``srd_worker.slicing``): the store
holds the whole run, the files only the slice's items, and ``OUT/<run_id>/slice.json`` names the slice;
``srdq merge`` (``srd_worker.merge``) combines the K folders.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srd_worker import __version__
from srd_worker.encoding import sorted_json
from srd_worker.errors import SrdqError
from srd_worker.fileutil import write_atomic
from srd_worker.runner import RoundReport, ShardOutcome, ShardWork, fresh_width, run_shards
from srd_worker.slicing import (
    SliceOf,
    check_slice_fits,
    refuse_other_slice,
    slice_marker,
    slice_shards,
    write_marker,
)
from srd_worker.spec import PreparedRun
from srd_worker.wiring import check_spec, probe_sources, wire

if TYPE_CHECKING:
    from srd_worker.settings import Settings
    from srd_worker.tracking import Tracker

log = logging.getLogger("srdq.local")


@dataclass
class Summary:
    run_id: str
    method: str
    items: int
    done: int
    failed: int
    correct: int
    accuracy: float | None
    mean_gen_tokens: float
    mean_reward: float | None
    wall_seconds: float
    results_path: str
    #: the failed items' errors (first line) with how many items each failed, most common first (at most 3)
    errors: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, run_id: str, method: str, records: list[dict[str, Any]], wall: float, path: Path) -> Summary:
        """The summary of a run's records (figures from ``reports.score_records``, as ``srdq report``)."""
        from srd_worker.reports.rows import score_records

        scores = score_records(records)
        return cls(
            run_id=run_id,
            method=method,
            items=len(records),
            done=scores.done,
            failed=scores.failed,
            correct=scores.correct,
            accuracy=scores.accuracy,
            mean_gen_tokens=scores.mean_gen_tokens or 0.0,
            mean_reward=scores.mean_reward,
            wall_seconds=wall,
            results_path=str(path),
            errors=error_groups([str(r["error"]) for r in records if r.get("error")]),
        )


_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w])")


def error_groups(errors: list[str], most: int = 3) -> dict[str, int]:
    """The ``most`` most common failures among the items' ``errors`` (each by its first line), counted by
    shape: lines that differ only in their numbers (the reward a rule refused, a token count) are one
    failure, named by its first line, with ``(and K more like it with other numbers)`` when K other
    lines joined it."""
    counts: Counter[str] = Counter()
    first: dict[str, str] = {}
    variants: dict[str, set[str]] = {}
    for error in errors:
        line = (error.strip().splitlines() or [""])[0]
        key = _NUMBER.sub("#", line)
        counts[key] += 1
        first.setdefault(key, line)
        variants.setdefault(key, set()).add(line)
    out = {}
    for key, n in counts.most_common(most):
        more = len(variants[key]) - 1
        out[first[key] + (f" (and {more} more like it with other numbers)" if more else "")] = n
    return out


def versions() -> dict[str, str]:
    """Package versions recorded with a run."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"srdq": __version__, "python": platform.python_version()}
    for pkg in ("torch", "transformers", "math-verify"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "absent"
    return out


def _write_lines(path: Path, lines: list[str]) -> None:
    write_atomic(path, "".join(line + "\n" for line in lines).encode("utf-8"))


def _append_lines(path: Path, lines: list[str]) -> None:
    """Append in one write and flush it to disk (a kill mid-write is repaired by the next call)."""
    with open(path, "ab") as fh:
        fh.write("".join(line + "\n" for line in lines).encode("utf-8"))
        fh.flush()
        os.fsync(fh.fileno())


def _record_lines(records: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """The results.jsonl lines (deterministic fields) and the timings.jsonl lines of ``records``."""
    results = [
        sorted_json({k: v for k, v in r.items() if k != "timing"}, compact=False, allow_nan=True)
        for r in records
    ]
    timings = [
        sorted_json(
            {"item_id": r["item_id"], "timing": r.get("timing")}, compact=False, ascii=True, allow_nan=True
        )
        for r in records
    ]
    return results, timings


def write_results(out_dir: Path, records: list[dict[str, Any]]) -> Path:
    """results.jsonl (deterministic fields) and timings.jsonl, written atomically."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results, timings = _record_lines(records)
    path = out_dir / "results.jsonl"
    _write_lines(path, results)
    _write_lines(out_dir / "timings.jsonl", timings)
    return path


def reset_partial_results(out_dir: Path, records: list[dict[str, Any]]) -> None:
    """Make results.jsonl and timings.jsonl hold exactly ``records`` (none: no files)."""
    if records:
        write_results(out_dir, records)
        return
    for name in ("results.jsonl", "timings.jsonl"):
        (out_dir / name).unlink(missing_ok=True)


def append_results(out_dir: Path, records: list[dict[str, Any]]) -> None:
    """Append one finished shard's records to results.jsonl and timings.jsonl (partial results)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results, timings = _record_lines(records)
    _append_lines(out_dir / "results.jsonl", results)
    _append_lines(out_dir / "timings.jsonl", timings)


def write_summary(path: Path, summary: Summary) -> None:
    """summary.json (atomically)."""
    write_atomic(path, (json.dumps(summary.to_dict(), indent=2) + "\n").encode("utf-8"))


def close_all(objs: list[Any]) -> None:
    """Call the optional ``close()`` of engines (engines/base.py): vLLM's processes go away with them, so
    ``srdq run`` exits when it is done, fails or is interrupted. When ``objs`` is not empty (the caller
    built its engine: ``srdq run``, a sweep), the rewards the registry cached in this process are closed
    too (``rewards.registry.close_rewards``): a judge on vLLM (``SRDQ_JUDGE_ENGINE=vllm``) or a ``vllm-rm``
    holds vLLM processes of its own, which must not be left for interpreter exit to reap. A caller that
    lends its engine (``engine=``) closes its rewards itself."""
    try:
        for obj in objs:
            close = getattr(obj, "close", None)
            if callable(close):
                close()
    finally:
        if objs:
            from srd_worker.rewards.registry import close_rewards

            close_rewards()


def refuse_other_config(
    run_id: str,
    out: Path,
    engine_name: str,
    versions: dict[str, Any],
    settings: Settings,
    engine_args: dict[str, Any] | None = None,
) -> None:
    """``SrdqError`` when ``run_id`` in ``out`` was made with engine settings that change results (dtype,
    device, batching mode, KV reuse: ``provenance.engine_config``) other than these: resuming would mix
    two configurations in one run, re-reporting would pass the old run off as this one."""
    from srd_worker.provenance import config_conflict, engine_config

    now = engine_config(engine_name, settings, engine_args=engine_args)
    then = config_conflict(versions, engine_name, now)
    if then is None:
        return
    diff = ", ".join(
        f"{k} {then.get(k)!r} then, {now.get(k)!r} now"
        for k in sorted({*then, *now})
        if then.get(k) != now.get(k)
    )
    raise SrdqError(
        f"run {run_id} in {out} was made with other {engine_name} engine settings ({diff}); the run id does "
        "not name them, so resuming would mix two configurations: use another --out, or the settings it was "
        "made with (SRDQ_DTYPE, SRDQ_DEVICE, SRDQ_BATCH_INVARIANT, SRDQ_INVARIANT_ROWS, SRDQ_KV_REUSE)"
    )


def _mark_interrupted(db: Any, run_id: str) -> None:
    """An unfinished run whose process stops goes back to ``pending`` (resumable: the same command resumes
    it from its checkpoints), and so do the shards it had open; best effort, on the way out."""
    from srd_worker.store import crud
    from srd_worker.store.db import session_scope

    try:
        with session_scope(db) as session:
            if crud.get_run(session=session, run_id=run_id).status == "running":
                crud.set_run_status(session=session, run_id=run_id, status="pending")
                crud.stop_clock(session=session, run_id=run_id)  # status: no rate until it resumes
            for shard in crud.list_shards(session=session, run_id=run_id):
                if shard.status == "running":
                    crud.set_shard_status(
                        session=session, run_id=run_id, shard_index=shard.index, status="pending"
                    )
    except Exception as exc:  # noqa: BLE001 - never hide the interruption itself
        log.warning("could not mark run %s pending: %s", run_id, exc)


def _run_records(db: Any, run_id: str) -> Any:
    """The run as the report (and a tracker) sees it: spec, versions, records so far."""
    from srd_worker.reports.loading import load_report_runs

    return load_report_runs(db, [run_id])[0]


def _in(positions: range, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records whose dataset position is in ``positions`` (a slice's; a whole run's: all)."""
    return [r for r in records if r["position"] in positions]


def window_rows(spec: Any, settings: Settings, wired: Any, works: list[ShardWork]) -> int:
    """Rows ``srdq run`` keeps in flight across its shards (``run_shards``' ``max_rows``): the row cap
    (``SRDQ_BATCH_ROWS``) when one is set, else the rows of a full shard's first step (``--shard-size`` ×
    a fresh item's width, e.g. SRD's n), so as a shard's candidates are kept, dropped or finish, the next
    shard's items take their rows; 0 (one shard at a time) when the window is off (``shard_window_on``)."""
    if settings.batch_rows:
        return int(settings.batch_rows)
    from srd_worker.provenance import shard_window_on

    if not shard_window_on(spec.engine, settings) or not works or not works[0].items:
        return 0
    return spec.shard_size * fresh_width(wired.method, wired.task, wired.engine, works[0].items[0])


@contextmanager
def run_lock(out: Path, run_id: str) -> Iterator[None]:
    """Hold ``OUT/.<run id>.lock`` while this process runs the run (``fileutil.exclusive_lock``): a second
    ``srdq run`` (or ``srdq fork``) of the same run in the same --out, which would run its pending shards
    twice and interleave their results, stops with one line naming the process that has it. The kernel
    lets the lock go when that process ends, however it ends."""
    from srd_worker.fileutil import Locked, exclusive_lock

    try:
        with exclusive_lock(out / f".{run_id}.lock"):
            yield
    except Locked as exc:
        raise SrdqError(
            f"run {run_id} is already being run in {out} ({exc.holder or 'another process'}); wait for it "
            "to finish, or stop it and run the same command again to resume"
        ) from None


def run_local(
    prepared: PreparedRun,
    *,
    out_dir: str | Path,
    settings: Settings,
    engine: Any = None,
    on_start: Callable[[str, int, int], None] | None = None,
    on_round: Callable[[RoundReport], None] | None = None,
    tracker: Tracker | None = None,
    part: SliceOf | None = None,
) -> Summary:
    """Create (or reopen) the run in OUT/srdq.db, run every unfinished shard, write results. A
    ``tracker`` (``tracking.open_tracker``) gets the spec and provenance at the start, progress after each
    shard and the summary, report and item table at the end.

    With ``part`` (``srdq run --num-shards K --shard-index I``), only the run's shards in that slice
    (``srd_worker.slicing``): results.jsonl, timings.jsonl and summary.json hold the slice's items, and
    ``OUT/<run_id>/slice.json`` says which slice of which run the folder holds."""
    from srd_worker.provenance import applied_settings
    from srd_worker.store import crud
    from srd_worker.store.db import make_engine, session_scope, sqlite_url, upgrade
    from srd_worker.store.shard_store import SqlShardStore, SqlWindowStore

    t0 = time.perf_counter()
    spec = prepared.spec
    settings = applied_settings(settings, spec.engine_config)  # the engine the run id names
    # before anything is written
    check_spec(prepared.method, engine=spec.engine, reward=spec.reward, engine_args=spec.engine_args)
    if engine is None:
        from srd_worker.engines.registry import check_engine_settings

        check_engine_settings(spec.engine, settings)  # e.g. the openai engine's SRDQ_OPENAI_BASE_URL
        probe_sources(spec, settings=settings)  # a model that cannot load: one line, nothing written
    run_id = spec.run_id()
    out = Path(out_dir)
    if part is not None:
        check_slice_fits(len(prepared.items), spec.shard_size, part)
    refuse_other_slice(out / run_id, run_id, part)  # before anything is written
    out.mkdir(parents=True, exist_ok=True)
    with run_lock(out, run_id):  # one process per run: a second `srdq run` of it is refused, not doubled
        url = sqlite_url(out / "srdq.db")
        upgrade(url)
        db = make_engine(url)
        built: list[Any] = []  # the engine this call built: closed on the way out, also on Ctrl-C
        tracked = False  # the tracker got the whole run
        try:
            with session_scope(db) as session:
                run = crud.create_run(
                    session=session,
                    run_id=run_id,
                    name=f"{spec.method}-{Path(spec.dataset).stem}",
                    spec=spec.stored(),
                    config_hash=spec.config_hash(),
                    versions=versions(),
                    items=prepared.items,
                    shard_size=spec.shard_size,
                )
                all_shards = crud.list_shards(session=session, run_id=run_id)
                items = crud.list_items(session=session, run_id=run_id)
            if engine is None:  # settings that change results must match the ones the run was made with
                refuse_other_config(run_id, out, spec.engine, run.versions or {}, settings, spec.engine_args)
            shards, positions = all_shards, range(len(items))
            if part is not None:  # only the slice's shards, and their items
                mine = slice_shards(len(all_shards), part)
                shards = [s for s in all_shards if s.index in mine]
                positions = range(shards[0].start, shards[-1].stop)
                items = [r for r in items if r.position in positions]
                write_marker(
                    out / run_id,
                    slice_marker(
                        run_id=run_id,
                        config_hash=spec.config_hash(),
                        spec=spec.model_dump(),
                        part=part,
                        shards=mine,
                        positions=positions,
                        n_items=len(prepared.items),
                        n_shards=len(all_shards),
                    ),
                )
            pending = [s for s in shards if s.status != "done"]
            if pending:
                with session_scope(db) as session:  # a sitting killed outright left its clock running
                    crud.stop_clock(session=session, run_id=run_id)
                if engine is None:  # built here, so closed here (a caller's engine is the caller's to close)
                    from srd_worker.engines.registry import build_engine

                    engine = build_engine(spec.engine, spec.model, settings, spec.engine_args)
                    built.append(engine)
                wired = wire(spec, settings=settings, engine=engine)
                from srd_worker.provenance import record_runtime, score_cache

                # engine version, model and reward revisions, once per distinct record
                record_runtime(db, run_id, spec, wired.engine, settings=settings)
                # reward scores by content, shared by every run of this store (None: SRDQ_SCORE_CACHE=false)
                cache = score_cache(db, spec, wired.engine, wired.reward, settings=settings)
                if tracker is not None:
                    tracker.start(_run_records(db, run_id))
                by_key = {it.id: it for it in prepared.items}
                if on_start is not None:
                    on_start(run_id, len(items), sum(s.stop - s.start for s in pending))
                with session_scope(db) as session:
                    crud.set_run_status(session=session, run_id=run_id, status="running", started=True)
                    # the partial files hold exactly the shards finished so far (repairs a cut-short append)
                    reset_partial_results(
                        out / run_id, _in(positions, crud.load_results(session=session, run_id=run_id))
                    )
                finished = len(items) - sum(s.stop - s.start for s in pending)  # done by an earlier call
                totals = {"items": finished, "tokens": 0}  # the tokens: of the shards finished in this call

                def report(rep: RoundReport) -> None:
                    # progress of the whole run, not of this call alone
                    if on_round is not None:
                        on_round(replace(rep, items_done=finished + rep.items_done, items_total=len(items)))

                def shard_open(position: int) -> None:
                    # `srdq status` shows the shards this call is working on as running (no lease: one process)
                    with session_scope(db) as session:
                        crud.set_shard_status(
                            session=session,
                            run_id=run_id,
                            shard_index=pending[position].index,
                            status="running",
                        )

                def shard_done(position: int, outcome: ShardOutcome) -> None:
                    shard = pending[position]
                    totals["items"] += shard.stop - shard.start
                    counts = outcome.counts()
                    totals["tokens"] += counts["tokens"]
                    log.info(
                        "shard finished",
                        extra={
                            "event": "shard_finished",
                            "run_id": run_id,
                            "shard": shard.index,
                            "items": shard.stop - shard.start,
                            **counts,
                            "rounds": outcome.rounds,
                            "seconds": round(outcome.round_seconds, 3),
                        },
                    )
                    with session_scope(db) as session:  # the stored records, as the final write has them
                        shard_records = crud.load_results(
                            session=session, run_id=run_id, shard_index=shard.index
                        )
                        append_results(out / run_id, shard_records)
                    if tracker is not None:
                        tracker.shard(
                            shard.index + 1,
                            {
                                "items_done": float(totals["items"]),
                                "items_failed": float(sum(1 for r in shard_records if r.get("error"))),
                                "gen_tokens": float(totals["tokens"]),
                                "shard_items": float(shard.stop - shard.start),
                                "shard_seconds": float(outcome.round_seconds),
                                "shard_tokens_per_s": counts["tokens"] / outcome.round_seconds
                                if outcome.round_seconds > 0
                                else 0.0,
                            },
                        )

                stores: list[SqlShardStore] = []
                works: list[ShardWork] = []
                for shard in pending:
                    rows = [r for r in items if r.shard_index == shard.index]
                    stores.append(
                        SqlShardStore(db, run_id, shard.index, snapshot_rounds=settings.snapshot_rounds)
                    )
                    works.append(
                        ShardWork([by_key[r.item_key] for r in rows], [r.position for r in rows], stores[-1])
                    )
                run_shards(
                    works,
                    method=wired.method,
                    task=wired.task,
                    engine=wired.engine,
                    reward=wired.reward,
                    run_seed=spec.seed,
                    on_round=report,
                    on_shard_done=shard_done,
                    on_shard_open=shard_open,
                    score_cache=cache,
                    max_rows=window_rows(spec, settings, wired, works),
                    window_store=SqlWindowStore(stores),
                )
                with session_scope(db) as session:
                    # a slice's run is done when every shard is (another slice's may run in this store later)
                    left = [s for s in crud.list_shards(session=session, run_id=run_id) if s.status != "done"]
                    crud.set_run_status(session=session, run_id=run_id, status="pending" if left else "done")
            elif tracker is not None:  # a finished run re-reported: logged from its records
                from srd_worker.tracking import shard_progress

                done_run = _run_records(db, run_id)
                tracker.start(done_run)
                for step, metrics in shard_progress(done_run):
                    tracker.shard(step, metrics)
            with session_scope(db) as session:
                records = _in(positions, crud.load_results(session=session, run_id=run_id))
            if tracker is not None:
                tracker.finish(_run_records(db, run_id))
                tracked = True
        except BaseException:  # Ctrl-C, SIGTERM, an error: the run is not left `running` in `srdq status`
            _mark_interrupted(db, run_id)
            raise
        finally:
            if tracker is not None:
                try:
                    tracker.close(ok=tracked)
                except Exception as exc:  # noqa: BLE001 - never hide the run's own outcome
                    log.warning("could not close the %s tracking run: %s", tracker.kind, exc)
            db.dispose()
            close_all(built)
        if len(records) != len(positions):
            raise SrdqError(f"run {run_id} has {len(records)} results for {len(positions)} items")
        path = write_results(out / run_id, records)
        summary = Summary.of(run_id, spec.method, records, time.perf_counter() - t0, path)
        write_summary(out / run_id / "summary.json", summary)
        log.info(
            "run finished",
            extra={
                "event": "run_finished",
                "run_id": run_id,
                "items": summary.items,
                "done": summary.done,
                "failed": summary.failed,
                "seconds": round(summary.wall_seconds, 3),
            },
        )
        return summary


def fork_local(
    parent_id: str,
    at_round: int,
    overrides: dict[str, str],
    *,
    out_dir: str | Path,
    settings: Settings,
    name: str | None = None,
    engine: Any = None,
    on_start: Callable[[str, int, int], None] | None = None,
    on_round: Callable[[RoundReport], None] | None = None,
) -> Summary:
    """``srdq fork RUN --db OUT``: create the fork of ``parent_id`` at round ``at_round`` in OUT/srdq.db
    (``fork.fork_run``: refused with nothing written when a change or the round is not allowed), then run
    it here as ``srdq run`` runs a run (``run_local``: results in OUT/<fork id>/). Forking again with the
    same changes resumes or re-reports the same fork."""
    from srd_worker.fork import fork_run
    from srd_worker.store import crud
    from srd_worker.store.db import make_engine, session_scope, sqlite_url, upgrade
    from srd_worker.tasks.base import Item
    from srd_worker.tasks.registry import get_task

    out = Path(out_dir)
    if not (out / "srdq.db").is_file():
        raise SrdqError(
            f"--db {out}: no srdq.db there (give the --out folder of the `srdq run` that made {parent_id})"
        )
    url = sqlite_url(out / "srdq.db")
    upgrade(url)
    db = make_engine(url)
    try:
        forked = fork_run(db, parent_id, at_round, overrides, versions=versions(), name=name)
        with session_scope(db) as session:
            rows = crud.list_items(session=session, run_id=forked.run_id)
    finally:
        db.dispose()
    spec = forked.plan.spec
    items = [Item(id=r.item_key, question=r.question, gold=r.gold, meta=dict(r.meta or {})) for r in rows]
    task = get_task(spec.task, fields=spec.fields, definition=spec.task_def)
    prepared = PreparedRun(spec=spec, task=task, items=items, method=forked.plan.method)
    return run_local(
        prepared, out_dir=out, settings=settings, engine=engine, on_start=on_start, on_round=on_round
    )
