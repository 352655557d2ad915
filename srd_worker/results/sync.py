"""Result uploads: a finished shard's parts to the object store, ``srdq sync``, and the workers'
background retries.

The database is the truth (PostgreSQL in service mode, the SQLite file of an embedded run). Uploads copy
it to the object store in the layout of ``artifacts.py``:

- After a shard's results are committed, the worker that finished it uploads the shard's parts and
  manifest (``artifacts.write_shard``, records read back from the database, so a re-upload writes the
  same bytes) and sets ``shard.uploaded_at``. Once every shard of the run is done and uploaded, the run
  manifest is written LAST (after every shard's parts were checked against their manifest; a missing
  or corrupt part is uploaded again from the database first) and ``run.manifest_at`` is set.
- An upload failure never fails a shard: it is logged, and the shard stays ``done`` with
  ``uploaded_at`` NULL. ``srdq sync RUN`` uploads what is missing; each worker's reaper does the same for
  every run in the background (``PendingUploads``), backing off while the store stays unreachable.
- Two processes never upload the same shard at once on PostgreSQL: the upload holds the shard's row
  (``store.uploads.lock_shard``; the other skips it), and the run manifest holds the run's row. Uploads
  are idempotent anyway (same records, same bytes).

``uploaded_at`` is per database, not per store: after pointing ``SRDQ_OBJECT_STORE_URL`` somewhere new,
``srdq sync RUN --force`` uploads everything again, and ``--verify`` re-checks what is there.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Engine
from sqlmodel import Session

from srd_worker.errors import ObjectStoreError, SrdqError, StoreError
from srd_worker.results.artifacts import run_manifest_key, verify_shard, write_run_manifest, write_shard
from srd_worker.results.objects import ObjectStore, S3ObjectStore, open_store
from srd_worker.store import crud, uploads
from srd_worker.store.db import session_scope
from srd_worker.store.models import Shard, Status

if TYPE_CHECKING:
    from srd_worker.settings import Settings

log = logging.getLogger("srdq.sync")


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


def _put_shard(session: Session, store: ObjectStore, run_id: str, shard: Shard) -> dict[str, Any]:
    """Write the shard's parts and manifest from the database, inside the caller's transaction."""
    records = uploads.shard_records(session=session, run_id=run_id, shard_index=shard.index)
    if len(records) != shard.stop - shard.start:
        raise StoreError(
            f"shard {shard.index} of run {run_id!r} is done but holds {len(records)} results "
            f"for {shard.stop - shard.start} items: not uploaded"
        )
    spec, versions, config_hash = uploads.run_meta(session=session, run_id=run_id)
    manifest = write_shard(
        store, run_id, shard.index, records, spec=spec, versions=versions, config_hash=config_hash
    )
    # shard.id is a primary key read back from the database: never None (None only before an insert).
    uploads.mark_shard_uploaded(session=session, shard_id=cast(int, shard.id))
    return manifest


def _upload_shard(
    db: Engine, store: ObjectStore, run_id: str, shard_index: int, *, force: bool, wait: bool
) -> tuple[str, dict[str, Any] | None]:
    """(outcome, manifest): ``uploaded``, ``already``, ``unfinished`` or ``busy``."""
    with session_scope(db) as session:
        shard = uploads.lock_shard(session=session, run_id=run_id, shard_index=shard_index, wait=wait)
        if shard is None:
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
        run = uploads.lock_run(session=session, run_id=run_id, wait=wait)
        if run is None:
            return "busy"
        if run.manifest_at is not None and not force:
            return "present"
        shards = crud.list_shards(session=session, run_id=run_id)
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
        spec, versions, config_hash = uploads.run_meta(session=session, run_id=run_id)
        write_run_manifest(store, run_id, manifests, spec, versions, config_hash=config_hash)
        uploads.mark_manifest_written(session=session, run_id=run_id)
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
        uploads.run_meta(session=session, run_id=run_id)
        shards = uploads.shard_upload_states(session=session, run_id=run_id)
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
        # the upload covers the run (every finished shard not yet up, and its manifest), not one shard
        log.warning(
            "upload of run %s's results (after shard %s) failed, will retry later: %s",
            run_id,
            shard_index,
            exc,
        )
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
        return uploads.pending_runs(session=session, limit=limit)


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


def store_from_settings(settings: Settings) -> ObjectStore | None:
    """The store workers upload to (``settings.object_store_url``; no I/O), or None, logged, when that
    is empty (uploads off) or invalid: a bad URL must not stop the worker from running shards."""
    url = (settings.object_store_url or "").strip()
    if not url:
        log.warning("SRDQ_OBJECT_STORE_URL is empty: results stay in the database, nothing is uploaded")
        return None
    try:
        store = open_store(url, settings)
    except SrdqError as exc:
        log.error("object store %r: %s; results stay in the database, nothing is uploaded", url, exc)
        return None
    if isinstance(store, S3ObjectStore) and not has_s3_credentials(store):
        # one line per worker process, instead of "Unable to locate credentials" after every shard
        log.warning(
            "no S3 credentials for %s (none in SRDQ_AWS_*/AWS_* variables, ~/.aws or the instance): "
            "results stay in the database, where srdq export/report/status read them, and nothing is "
            "uploaded; set credentials and run `srdq sync`, or set SRDQ_OBJECT_STORE_URL to a shared "
            "folder (a path) or to empty (uploads off) to silence this",
            url,
        )
        return None
    return store


def has_s3_credentials(store: S3ObjectStore) -> bool:
    """Whether boto3 finds credentials for ``store``: its own keys, or the standard AWS chain (variables,
    config files, an instance or container role; a metadata lookup off a cloud host fails fast). A store
    with an endpoint (MinIO, moto) counts as having them only by the same chain: anonymous access is not
    supported."""
    if store.has_keys:
        return True
    import boto3

    try:
        return boto3.session.Session().get_credentials() is not None
    except Exception as exc:  # noqa: BLE001 - a broken ~/.aws config: say so, do not stop the worker
        log.warning("looking up S3 credentials failed: %s", exc)
        return False


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
        self._thread = threading.Thread(
            target=self._run, args=(db, self.store), name="srdq-uploads", daemon=True
        )
        self._thread.start()

    def _run(self, db: Engine, store: ObjectStore) -> None:
        try:
            reports = sync_pending(db, store)
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
