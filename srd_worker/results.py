"""Results out of the database: shard uploads to the object store, ``srdq sync``, ``srdq export``, and the
run data ``srdq report`` draws from.

The database is the truth (PostgreSQL in service mode, the SQLite file of an embedded run). Uploads copy
it to the object store in the layout of ``objects.py``:

- After a shard's results are committed, the worker that finished it uploads the shard's parts and
  manifest (``objects.write_shard``, records read back from the database, so a re-upload writes the
  same bytes) and sets ``shard.uploaded_at``. Once every shard of the run is done and uploaded, the run
  manifest is written LAST (after every shard's parts were checked against their manifest; a missing
  or corrupt part is uploaded again from the database first) and ``run.manifest_at`` is set.
- An upload failure never fails a shard: it is logged, and the shard stays ``done`` with
  ``uploaded_at`` NULL. ``srdq sync RUN`` uploads what is missing; each worker's reaper does the same for
  every run in the background (``PendingUploads``), backing off while the store stays unreachable.
- Two processes never upload the same shard at once on PostgreSQL: the upload holds the shard's row
  (``FOR UPDATE SKIP LOCKED``; the other skips it), and the run manifest holds the run's row. Uploads
  are idempotent anyway (same records, same bytes).
- Setting ``uploaded_at`` / ``manifest_at`` leaves ``updated_at`` as it was: a run's wall time
  (``updated_at - created_at``) does not grow because its results were synced a day later.

``uploaded_at`` is per database, not per store: after pointing ``SRDQ_OBJECT_STORE_URL`` somewhere new,
``srdq sync RUN --force`` uploads everything again, and ``--verify`` re-checks what is there.

Exports are one row per item in dataset order: the stored record plus ``run_id``, ``shard_index``,
``status`` (``done``, ``failed`` or ``pending``: no result yet) and ``failed``. JSONL keeps records nested;
CSV and Parquet flatten them (``flatten_row``).

Reads for export and report select only the columns they need, so a database at an older schema
(an old ``srdq-out/srdq.db``) can still be exported and reported.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, update
from sqlmodel import Session, col, select

from srd_worker.errors import ConfigError, ObjectStoreError, SrdqError, StoreError
from srd_worker.objects import (
    ObjectStore,
    encode_jsonl,
    open_store,
    run_manifest_key,
    verify_shard,
    write_run_manifest,
    write_shard,
)
from srd_worker.reports import RunRecords
from srd_worker.store.db import session_scope
from srd_worker.store.models import ItemRow, Result, Run, Shard, Status, utcnow

log = logging.getLogger("srdq.results")

EXPORT_FORMATS = ("parquet", "jsonl", "csv")
CONTENT_TYPES = {
    "parquet": "application/vnd.apache.parquet",
    "jsonl": "application/x-ndjson",
    "csv": "text/csv",
}
JSON_COLUMNS_META = b"srdq.json_columns"


# ------------------------------------------------------------------------------------------- uploads
@dataclass
class SyncReport:
    """What ``sync_run`` did for one run."""

    run_id: str
    uploaded: list[int] = field(default_factory=list)  # shards uploaded by this call
    repaired: list[int] = field(default_factory=list)  # shards whose stored parts were missing or corrupt
    already: list[int] = field(default_factory=list)  # done shards uploaded before (left alone)
    unfinished: list[int] = field(default_factory=list)  # shards not done yet: nothing to upload
    busy: list[int] = field(default_factory=list)  # shards another process is uploading right now
    manifest: str = "waiting"  # written | present | waiting (shards unfinished or not uploaded) | busy
    manifest_url: str | None = None


def _locked(session: Session, stmt: Any, wait: bool) -> Any:
    """``stmt`` with ``FOR UPDATE`` (``SKIP LOCKED`` unless ``wait``) on PostgreSQL; SQLite serialises
    writers itself."""
    if session.get_bind().dialect.name == "postgresql":
        return stmt.with_for_update(skip_locked=not wait)
    return stmt


def _run_meta(session: Session, run_id: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    row = session.exec(select(Run.spec, Run.versions, Run.config_hash).where(Run.id == run_id)).first()
    if row is None:
        raise StoreError(f"no run {run_id!r} in the database")
    return dict(row[0] or {}), dict(row[1] or {}), row[2]


def shard_records(session: Session, run_id: str, shard_index: int) -> list[dict[str, Any]]:
    """The shard's result records as stored, in dataset order."""
    return list(
        session.exec(
            select(Result.record)
            .where(Result.run_id == run_id, Result.shard_index == shard_index)
            .order_by(col(Result.position))
        )
    )


def _put_shard(session: Session, store: ObjectStore, run_id: str, shard: Shard) -> dict[str, Any]:
    """Write the shard's parts and manifest from the database, inside the caller's transaction."""
    records = shard_records(session, run_id, shard.index)
    if len(records) != shard.stop - shard.start:
        raise StoreError(
            f"shard {shard.index} of run {run_id!r} is done but holds {len(records)} results "
            f"for {shard.stop - shard.start} items: not uploaded"
        )
    spec, versions, config_hash = _run_meta(session, run_id)
    manifest = write_shard(
        store, run_id, shard.index, records, spec=spec, versions=versions, config_hash=config_hash
    )
    # updated_at is set to itself so its onupdate does not fire: uploading does not change the shard.
    session.exec(
        update(Shard)
        .where(col(Shard.id) == shard.id)
        .values(uploaded_at=utcnow(), updated_at=col(Shard.updated_at))
    )
    return manifest


def _upload_shard(
    db: Engine, store: ObjectStore, run_id: str, shard_index: int, *, force: bool, wait: bool
) -> tuple[str, dict[str, Any] | None]:
    """(outcome, manifest): ``uploaded``, ``already``, ``unfinished`` or ``busy``."""
    with session_scope(db) as session:
        shard = session.exec(
            _locked(session, select(Shard).where(Shard.run_id == run_id, Shard.index == shard_index), wait)
        ).first()
        if shard is None:
            exists = session.exec(
                select(Shard.id).where(Shard.run_id == run_id, Shard.index == shard_index)
            ).first()
            if exists is None:
                raise StoreError(f"no shard {shard_index} in run {run_id!r}")
            return "busy", None
        if shard.status != Status.DONE.value:
            return "unfinished", None
        if shard.uploaded_at is not None and not force:
            return "already", None
        return "uploaded", _put_shard(session, store, run_id, shard)


def _write_manifest(
    db: Engine, store: ObjectStore, run_id: str, fresh: dict[int, dict[str, Any]], *, force: bool, wait: bool
) -> str:
    """Write the run manifest if every shard is done and uploaded: ``written``, ``present``,
    ``waiting`` or ``busy``. Shards not in ``fresh`` are checked first and re-uploaded if broken."""
    with session_scope(db) as session:
        run = session.exec(_locked(session, select(Run).where(Run.id == run_id), wait)).first()
        if run is None:
            _run_meta(session, run_id)  # raises when the run does not exist
            return "busy"
        if run.manifest_at is not None and not force:
            return "present"
        shards = list(session.exec(select(Shard).where(Shard.run_id == run_id).order_by(col(Shard.index))))
        if not shards or any(s.status != Status.DONE.value or s.uploaded_at is None for s in shards):
            return "waiting"
        manifests = []
        for shard in shards:
            manifest = fresh.get(shard.index)
            if manifest is None:
                try:
                    manifest = verify_shard(store, run_id, shard.index)
                except ObjectStoreError as exc:
                    log.warning(
                        "run %s shard %d: %s; uploading it again from the database", run_id, shard.index, exc
                    )
                    manifest = _put_shard(session, store, run_id, shard)
            manifests.append(manifest)
        spec, versions, config_hash = _run_meta(session, run_id)
        write_run_manifest(store, run_id, manifests, spec, versions, config_hash=config_hash)
        session.exec(
            update(Run)
            .where(col(Run.id) == run_id)
            .values(manifest_at=utcnow(), updated_at=col(Run.updated_at))
        )
        return "written"


def sync_run(
    db: Engine,
    store: ObjectStore,
    run_id: str,
    *,
    verify: bool = False,
    force: bool = False,
    wait: bool = False,
) -> SyncReport:
    """Upload every done shard of ``run_id`` not uploaded yet, then the run manifest once all are.

    ``verify``: also check the parts of shards uploaded before (size and sha256 against their manifest)
    and upload again the ones that are missing or corrupt, then rewrite the run manifest.
    ``force``: upload every done shard and the run manifest again (e.g. to a new store).
    ``wait``: when another process is uploading a shard (or the manifest) of the run, wait for it and
    then go on (``srdq sync``), instead of leaving that shard to it (workers, reapers).
    Raises ``ObjectStoreError`` when the store fails (nothing is marked uploaded that was not).
    """
    report = SyncReport(run_id)
    with session_scope(db) as session:
        _run_meta(session, run_id)
        shards = session.exec(
            select(Shard.index, Shard.status, Shard.uploaded_at)
            .where(Shard.run_id == run_id)
            .order_by(col(Shard.index))
        ).all()
    fresh: dict[int, dict[str, Any]] = {}
    for index, status, uploaded_at in shards:
        if status != Status.DONE.value:
            report.unfinished.append(index)
            continue
        repair = False
        if verify and uploaded_at is not None and not force:
            try:
                fresh[index] = verify_shard(store, run_id, index)
                report.already.append(index)
                continue
            except ObjectStoreError as exc:
                log.warning("run %s shard %d: %s; uploading it again", run_id, index, exc)
                repair = True
        outcome, manifest = _upload_shard(db, store, run_id, index, force=force or repair, wait=wait)
        if manifest is not None:
            fresh[index] = manifest
            (report.repaired if repair else report.uploaded).append(index)
        else:
            {"already": report.already, "busy": report.busy, "unfinished": report.unfinished}[outcome].append(
                index
            )
    rewrite = force or bool(report.repaired)
    if verify and not rewrite:
        rewrite = not store.exists(run_manifest_key(run_id))
    report.manifest = _write_manifest(db, store, run_id, fresh, force=rewrite, wait=wait)
    if report.manifest in ("written", "present"):
        report.manifest_url = store.url(run_manifest_key(run_id))
    return report


def upload_finished_shard(*, db: Engine, store: ObjectStore, run_id: str, shard_index: int) -> None:
    """Called by a worker after it committed a shard: upload it (and the run manifest if it was the
    last one). Never raises: a failure is logged and left to ``srdq sync`` and the reapers."""
    try:
        report = sync_run(db, store, run_id)
    except Exception as exc:  # the shard is done in the database whatever happens here
        log.warning("upload of shard %s/%s failed, will retry later: %s", run_id, shard_index, exc)
        return
    log.info(
        "run %s after shard %s: shards uploaded %s (busy elsewhere: %s), run manifest %s",
        run_id,
        shard_index,
        report.uploaded,
        report.busy,
        report.manifest,
    )


def pending_runs(db: Engine, *, limit: int = 50) -> list[str]:
    """Runs with a done shard not uploaded, or done with no run manifest yet (oldest first)."""
    with session_scope(db) as session:
        shard_runs = select(Shard.run_id).where(
            Shard.status == Status.DONE.value, col(Shard.uploaded_at).is_(None)
        )
        rows = session.exec(
            select(Run.id)
            .where(
                col(Run.id).in_(shard_runs)
                | ((col(Run.status) == Status.DONE.value) & col(Run.manifest_at).is_(None))
            )
            .order_by(col(Run.created_at))
            .limit(limit)
        ).all()
    return list(rows)


def sync_pending(db: Engine, store: ObjectStore, *, limit: int = 50) -> list[SyncReport]:
    """``sync_run`` for every run with something left to upload. A store error stops the pass (it is
    raised: the store is down); a run the database refuses to upload (logged) does not stop the others."""
    reports = []
    for run_id in pending_runs(db, limit=limit):
        try:
            reports.append(sync_run(db, store, run_id))
        except ObjectStoreError:
            raise
        except SrdqError as exc:
            log.error("run %s cannot be uploaded: %s", run_id, exc)
    return reports


def store_from_settings(settings: Any) -> ObjectStore | None:
    """The store workers upload to (``settings.object_store_url``; no I/O), or None, logged, when that
    is empty (uploads off) or invalid: a bad URL must not stop the worker from running shards."""
    url = (settings.object_store_url or "").strip()
    if not url:
        log.warning("SRDQ_OBJECT_STORE_URL is empty: results stay in the database, nothing is uploaded")
        return None
    try:
        return open_store(url, settings)
    except SrdqError as exc:
        log.error("object store %r: %s; results stay in the database, nothing is uploaded", url, exc)
        return None


class PendingUploads:
    """Background retries of the uploads workers could not do, poked from the reaper loop.

    ``poke`` never blocks: it starts one sync pass in a thread unless one is still running or the
    store failed recently (the wait doubles after each failure, from ``interval_s`` up to
    ``max_backoff_s``), so a slow or unreachable store never delays the reaper's own work.
    """

    def __init__(
        self, store: ObjectStore | None, *, interval_s: float = 15.0, max_backoff_s: float = 300.0
    ) -> None:
        self.store = store
        self.interval_s = interval_s
        self.max_backoff_s = max_backoff_s
        self.failures = 0
        self._not_before = 0.0
        self._thread: threading.Thread | None = None

    def poke(self, db: Engine) -> None:
        if self.store is None:  # uploads are off
            return
        if self._thread is not None and self._thread.is_alive():
            return
        if time.monotonic() < self._not_before:
            return
        self._thread = threading.Thread(target=self._run, args=(db,), name="srdq-uploads", daemon=True)
        self._thread.start()

    def _run(self, db: Engine) -> None:
        try:
            reports = sync_pending(db, self.store)
        except Exception as exc:  # store or database down: try again later
            self.failures += 1
            wait = min(self.max_backoff_s, self.interval_s * 2 ** (self.failures - 1))
            log.warning(
                "pending uploads failed (%d in a row), next try in %.0f s: %s", self.failures, wait, exc
            )
            self._not_before = time.monotonic() + wait
            return
        self.failures = 0
        self._not_before = time.monotonic() + self.interval_s
        for r in reports:
            if r.uploaded or r.repaired or r.manifest == "written":
                log.warning(
                    "pending uploads: run %s shards %s uploaded, run manifest %s",
                    r.run_id,
                    r.uploaded + r.repaired,
                    r.manifest,
                )


# -------------------------------------------------------------------------------------------- export
def _require_run(session: Session, run_id: str) -> None:
    if session.exec(select(Run.id).where(Run.id == run_id)).first() is None:
        raise StoreError(f"no run {run_id!r} in the database")


def export_rows(db: Engine, run_id: str) -> list[dict[str, Any]]:
    """One row per item of the run in dataset order: the stored record (an item without a result yet
    gets its id, position, question and gold) plus ``run_id``, ``shard_index``, ``status`` and
    ``failed``."""
    with session_scope(db) as session:
        _require_run(session, run_id)
        rows = session.exec(
            select(
                ItemRow.position,
                ItemRow.item_key,
                ItemRow.shard_index,
                ItemRow.question,
                ItemRow.gold,
                Result.record,
            )
            .select_from(ItemRow)
            .outerjoin(Result, col(Result.item_id) == col(ItemRow.id))
            .where(ItemRow.run_id == run_id)
            .order_by(col(ItemRow.position))
        ).all()
    out = []
    for position, key, shard_index, question, gold, record in rows:
        if record is None:
            row: dict[str, Any] = {
                "item_id": key,
                "position": position,
                "question": question,
                "gold": gold,
                "error": None,
            }
            status = "pending"
        else:
            row = dict(record)
            status = "failed" if row.get("error") else "done"
        row.update(run_id=run_id, shard_index=shard_index, status=status, failed=status == "failed")
        out.append(row)
    return out


LEADING = (
    "run_id",
    "position",
    "item_id",
    "shard_index",
    "status",
    "failed",
    "error",
    "method",
    "question",
    "gold",
    "response",
    "answer",
    "correct",
    "reward",
    "finish_reason",
)


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def flatten_row(row: dict[str, Any], json_columns: set[str] | None = None) -> dict[str, Any]:
    """A row with scalar values only, for CSV and Parquet.

    ``ledger`` counts become top-level columns (``gen_tokens``, ``prefill_tokens``, ...; ``ledger.<key>``
    if a record field has that name) and its components ``components.<component>.<count>``; ``timing``
    and ``extra`` become ``timing.<component>`` and ``extra.<key>``. Every value that is still a dict or
    a list is canonical JSON text; its column is added to ``json_columns`` when given.
    """
    out: dict[str, Any] = {}

    def put(name: str, value: Any) -> None:
        if isinstance(value, dict | list):
            value = _json(value)
            if json_columns is not None:
                json_columns.add(name)
        out[name] = value

    for key, value in row.items():
        if key == "ledger" and isinstance(value, dict):
            for k, v in value.items():
                if k == "components" and isinstance(v, dict):
                    for comp, counts in v.items():
                        if isinstance(counts, dict):
                            for ck, cv in counts.items():
                                put(f"components.{comp}.{ck}", cv)
                        else:
                            put(f"components.{comp}", counts)
                else:
                    put(f"ledger.{k}" if k in row else k, v)
        elif key in ("timing", "extra") and isinstance(value, dict):
            for k, v in value.items():
                put(f"{key}.{k}", v)
        else:
            put(key, value)
    return out


def flatten_rows(rows: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]], set[str]]:
    """(columns, flat rows, JSON columns). Columns in a stable order: the leading record fields
    (``LEADING``), ledger counts, ``components.*``, ``timing.*`` (in first-seen order), ``extra.*``
    sorted, then any other field sorted."""
    json_columns: set[str] = set()
    flat = [flatten_row(r, json_columns) for r in rows]
    seen: dict[str, int] = {}
    for r in flat:
        for name in r:
            seen.setdefault(name, len(seen))
    ledger_counts = {
        ("ledger." + k if k in r else k)
        for r in rows
        if isinstance(r.get("ledger"), dict)
        for k in r["ledger"]
        if k != "components"
    }

    def rank(name: str) -> tuple[int, int, str]:
        if name in LEADING:
            return 0, LEADING.index(name), ""
        if name in ledger_counts:
            return 1, seen[name], ""
        for group, prefix in ((2, "components."), (3, "timing.")):
            if name.startswith(prefix):
                return group, seen[name], ""
        return (4 if name.startswith("extra.") else 5), 0, name

    return sorted(seen, key=rank), flat, json_columns


def csv_cell(value: Any) -> str:
    """How one value is written in a CSV export."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return json.dumps(value)
    return str(value)


def encode_csv(rows: list[dict[str, Any]]) -> bytes:
    """Flattened rows as CSV (RFC 4180: header row, CRLF line ends, so a field holding a bare CR is
    quoted too; null = empty cell, booleans ``true``/``false``)."""
    columns, flat, _ = flatten_rows(rows)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow(columns)
    for r in flat:
        writer.writerow([csv_cell(r.get(c)) for c in columns])
    return buffer.getvalue().encode("utf-8")


def _arrow_array(values: list[Any]) -> Any:
    import pyarrow as pa

    kinds = {type(v) for v in values if v is not None}
    if not kinds:
        return pa.array(values, type=pa.null())
    if kinds == {bool}:
        return pa.array(values, type=pa.bool_())
    if kinds == {str}:
        return pa.array(values, type=pa.string())
    if kinds == {int}:
        try:
            return pa.array(values, type=pa.int64())
        except (OverflowError, pa.ArrowInvalid):
            pass
    elif kinds <= {int, float}:
        return pa.array([None if v is None else float(v) for v in values], type=pa.float64())
    return pa.array(
        [None if v is None else (v if isinstance(v, str) else _json(v)) for v in values], type=pa.string()
    )


def encode_flat_parquet(rows: list[dict[str, Any]]) -> bytes:
    """Flattened rows as one Parquet table (zstd): typed columns (bool, int64, float64, string); the
    columns that hold JSON text are named in the schema metadata ``srdq.json_columns``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns, flat, json_columns = flatten_rows(rows)
    arrays = [_arrow_array([r.get(c) for r in flat]) for c in columns]
    schema = pa.schema(
        [pa.field(c, a.type) for c, a in zip(columns, arrays, strict=True)],
        metadata={JSON_COLUMNS_META: json.dumps(sorted(json_columns)).encode()},
    )
    table = pa.Table.from_arrays(arrays, schema=schema) if columns else schema.empty_table()
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd")
    return buffer.getvalue()


def encode_export(rows: list[dict[str, Any]], fmt: str) -> bytes:
    """The rows in ``fmt``: ``jsonl`` (nested records, canonical JSON), ``csv`` or ``parquet`` (flat)."""
    if fmt == "jsonl":
        return encode_jsonl(rows)
    if fmt == "csv":
        return encode_csv(rows)
    if fmt == "parquet":
        return encode_flat_parquet(rows)
    raise ConfigError(f"unknown export format {fmt!r} (expected one of: {', '.join(EXPORT_FORMATS)})")


def write_output(
    data: bytes, out: str, *, default_name: str, content_type: str | None = None, settings: Any = None
) -> str:
    """Write ``data`` to ``s3://BUCKET/KEY`` (through the object store) or a local path (atomically);
    a local path that is a folder gets ``default_name`` inside it. Returns where it went."""
    if out.startswith("s3://"):
        bucket, _, key = out[len("s3://") :].partition("/")
        if not bucket or not key.strip("/"):
            raise ConfigError(f"{out!r}: name the object, e.g. s3://BUCKET/exports/{default_name}")
        if key.endswith("/"):
            key += default_name
        store = open_store(f"s3://{bucket}", settings)
        store.put_bytes(key, data, content_type)
        return store.url(key)
    if out.startswith("file://"):
        out = out[len("file://") :]
    elif "://" in out:
        raise ConfigError(f"unsupported destination {out!r}: use a path or s3://BUCKET/KEY")
    path = Path(out)
    if path.is_dir() or out.endswith(("/", os.sep)):
        path = path / default_name
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc}") from exc
    return str(path)


def export_run(
    db: Engine, run_id: str, fmt: str, out: str, *, settings: Any = None
) -> tuple[str, list[dict]]:
    """Export ``run_id`` from the database to ``out``; returns (where, rows)."""
    if fmt not in EXPORT_FORMATS:
        raise ConfigError(f"unknown export format {fmt!r} (expected one of: {', '.join(EXPORT_FORMATS)})")
    rows = export_rows(db, run_id)
    where = write_output(
        encode_export(rows, fmt),
        out,
        default_name=f"{run_id}.{fmt}",
        content_type=CONTENT_TYPES[fmt],
        settings=settings,
    )
    return where, rows


# -------------------------------------------------------------------------------------------- report
def load_report_runs(db: Engine, run_ids: list[str]) -> list[Any]:
    """``reports.RunRecords`` for each run id, records in dataset order."""
    out = []
    with session_scope(db) as session:
        for run_id in run_ids:
            row = session.exec(
                select(
                    Run.id, Run.name, Run.spec, Run.status, Run.n_items, Run.created_at, Run.updated_at
                ).where(Run.id == run_id)
            ).first()
            if row is None:
                raise StoreError(f"no run {run_id!r} in the database")
            _, name, spec, status, n_items, created_at, updated_at = row
            records = list(
                session.exec(
                    select(Result.record).where(Result.run_id == run_id).order_by(col(Result.position))
                )
            )
            finished = status in (Status.DONE.value, Status.FAILED.value, Status.CANCELLED.value)
            out.append(
                RunRecords(
                    run_id=run_id,
                    name=name,
                    spec=dict(spec or {}),
                    status=status,
                    n_items=n_items,
                    wall_s=(updated_at - created_at).total_seconds() if finished else None,
                    records=records,
                )
            )
    return out
