"""Result artifacts in an object store: the layout, the JSONL and Parquet encoders, and the manifests.

Follows DESIGN.md, Storage: parts live at ``runs/<run_id>/shards/<index:05d>.jsonl`` and ``.parquet``
under the store's prefix; a manifest per shard (``<index:05d>.manifest.json``) and per run
(``runs/<run_id>/manifest.json``) is written LAST with each part's size and sha256, and readers trust
only manifests: a part that no manifest lists is ignored, and a part whose bytes do not match its entry
is an ``ObjectStoreError`` naming the key.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from typing import Any

from srd_worker.encoding import arrow_column, json_columns_of, parquet_bytes, sorted_json
from srd_worker.errors import ObjectStoreError
from srd_worker.results.objects import ObjectStore

MANIFEST_VERSION = 1


def _check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]*", run_id):
        raise ObjectStoreError(f"invalid run id {run_id!r} for an object key")
    return run_id


def shard_key(run_id: str, shard_index: int, suffix: str) -> str:
    """``runs/<run_id>/shards/<index:05d>.<suffix>`` (suffix: ``jsonl``, ``parquet``, ``manifest.json``)."""
    if not isinstance(shard_index, int) or isinstance(shard_index, bool) or shard_index < 0:
        raise ObjectStoreError(f"invalid shard index {shard_index!r}")
    return f"runs/{_check_run_id(run_id)}/shards/{shard_index:05d}.{suffix}"


def run_manifest_key(run_id: str) -> str:
    """``runs/<run_id>/manifest.json``."""
    return f"runs/{_check_run_id(run_id)}/manifest.json"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def encode_jsonl(records: list[dict[str, Any]]) -> bytes:
    """One canonical JSON object per line, in the given order; the same records give the same bytes."""
    lines = []
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            raise ObjectStoreError(f"record {i} is a {type(record).__name__}, not a dict")
        try:
            lines.append(sorted_json(record) + "\n")
        except (TypeError, ValueError) as exc:
            raise ObjectStoreError(f"record {i} is not JSON-serialisable: {exc}") from exc
    return "".join(lines).encode("utf-8")


def encode_parquet(records: list[dict[str, Any]]) -> bytes:
    """The records as one Parquet table (zstd), deterministic for the same records and pyarrow version.

    Columns: one per top-level key of any record, sorted by name; a record without the key has null.
    A column whose non-null values are all bool, all int (int64), all str, or numbers with at least one
    float (float64) keeps that type; every other column (dicts such as ``ledger``, lists, mixed kinds)
    holds canonical JSON text, so nested shapes never change a shard's schema. The JSON columns are named
    in the schema metadata ``srdq.json_columns`` (``records_from_table`` decodes them). A column that is
    null in every record of a shard has Arrow type ``null``, which ``pyarrow.unify_schemas`` merges with
    the type other shards give it.
    """
    encode_jsonl(records)  # the same validation (dicts, JSON-serialisable, no NaN) for both parts
    names = sorted({name for record in records for name in record})
    arrays, json_columns = [], []
    for name in names:
        array, is_json = arrow_column([record.get(name) for record in records])
        arrays.append(array)
        if is_json:
            json_columns.append(name)
    return parquet_bytes(names, arrays, json_columns)


def records_from_table(table: Any) -> list[dict[str, Any]]:
    """Rows of a shard's Parquet table as dicts, JSON columns decoded (missing keys come back as None)."""
    json_columns = set(json_columns_of(table))
    rows = table.to_pylist()
    for row in rows:
        for name in json_columns:
            if row.get(name) is not None:
                row[name] = json.loads(row[name])
    return rows


def _entry(key: str, data: bytes) -> dict[str, Any]:
    return {"key": key, "size": len(data), "sha256": _sha256(data)}


def _fetch_verified(store: ObjectStore, entry: Any, manifest_key: str) -> bytes:
    """The bytes of a part a manifest lists, after checking its size and sha256."""
    try:
        key, size, digest = entry["key"], entry["size"], entry["sha256"]
    except (TypeError, KeyError) as exc:
        raise ObjectStoreError(f"malformed file entry {entry!r} in {store.url(manifest_key)}") from exc
    data = store.get_bytes(key)
    if len(data) != size:
        raise ObjectStoreError(
            f"{store.url(key)} is {len(data)} bytes but {manifest_key} says {size}: "
            "the part is corrupt or was rewritten after its manifest"
        )
    if _sha256(data) != digest:
        raise ObjectStoreError(
            f"{store.url(key)} has sha256 {_sha256(data)} but {manifest_key} says "
            f"{digest}: the part is corrupt or was rewritten after its manifest"
        )
    return data


def _decode_jsonl(data: bytes, key: str, expected: Any) -> list[dict[str, Any]]:
    try:
        records = [json.loads(line) for line in data.decode("utf-8").splitlines() if line]
    except ValueError as exc:
        raise ObjectStoreError(f"{key} is not valid JSONL: {exc}") from exc
    if len(records) != expected:
        raise ObjectStoreError(f"{key} holds {len(records)} records; its manifest says {expected}")
    return records


def _read_manifest(store: ObjectStore, key: str, missing: str) -> dict[str, Any]:
    if not store.exists(key):
        raise ObjectStoreError(f"{missing}: no manifest at {store.url(key)}")
    try:
        manifest = json.loads(store.get_bytes(key))
    except ValueError as exc:
        raise ObjectStoreError(f"{store.url(key)} is not valid JSON: {exc}") from exc
    if not isinstance(manifest, dict):
        raise ObjectStoreError(f"{store.url(key)} is not a manifest object")
    return manifest


def _finish_manifest(
    manifest: dict[str, Any],
    spec: dict[str, Any],
    versions: dict[str, Any],
    config_hash: str | None,
    what: str,
) -> str:
    """Add what every manifest carries (spec, versions, ``written_at``, ``config_hash`` when known) to
    ``manifest`` and return its JSON text."""
    manifest.update(spec=spec, versions=versions, written_at=_now())
    if config_hash is not None:
        manifest["config_hash"] = config_hash
    try:
        return sorted_json(manifest, indent=2)
    except (TypeError, ValueError) as exc:
        raise ObjectStoreError(f"{what}: spec or versions are not JSON-serialisable: {exc}") from exc


def write_shard(
    store: ObjectStore,
    run_id: str,
    shard_index: int,
    records: list[dict[str, Any]],
    *,
    spec: dict[str, Any],
    versions: dict[str, Any],
    config_hash: str | None = None,
) -> dict[str, Any]:
    """Write a shard's JSONL and Parquet parts, then its manifest (last); return the manifest.

    Records keep their order. Writing the same records again writes the same part bytes (so the same
    sha256s and keys) and a new manifest (``written_at`` changes). While a shard is rewritten with
    different records, readers see a size/sha256 mismatch, never a silent mix of old and new.
    """
    jsonl = encode_jsonl(records)
    parquet = encode_parquet(records)
    manifest: dict[str, Any] = {
        "manifest_version": MANIFEST_VERSION,
        "run_id": run_id,
        "shard_index": shard_index,
        "files": {
            "jsonl": _entry(shard_key(run_id, shard_index, "jsonl"), jsonl),
            "parquet": _entry(shard_key(run_id, shard_index, "parquet"), parquet),
        },
        "n_records": len(records),
    }
    body = _finish_manifest(
        manifest, spec, versions, config_hash, f"shard {shard_index} manifest of run {run_id!r}"
    )
    store.put_bytes(manifest["files"]["jsonl"]["key"], jsonl, "application/x-ndjson")
    store.put_bytes(manifest["files"]["parquet"]["key"], parquet, "application/vnd.apache.parquet")
    store.put_bytes(shard_key(run_id, shard_index, "manifest.json"), body.encode("utf-8"), "application/json")
    return manifest


def _shard_manifest(store: ObjectStore, run_id: str, shard_index: int) -> tuple[str, dict[str, Any]]:
    key = shard_key(run_id, shard_index, "manifest.json")
    manifest = _read_manifest(store, key, f"shard {shard_index} of run {run_id!r} was not written")
    if manifest.get("run_id") != run_id or manifest.get("shard_index") != shard_index:
        raise ObjectStoreError(
            f"{store.url(key)} describes run {manifest.get('run_id')!r} shard "
            f"{manifest.get('shard_index')!r}, not run {run_id!r} shard {shard_index}"
        )
    return key, manifest


def verify_shard(store: ObjectStore, run_id: str, shard_index: int) -> dict[str, Any]:
    """Check every part the shard manifest lists (size and sha256); return the manifest."""
    key, manifest = _shard_manifest(store, run_id, shard_index)
    for entry in (manifest.get("files") or {}).values():
        _fetch_verified(store, entry, key)
    return manifest


def read_shard(store: ObjectStore, run_id: str, shard_index: int) -> list[dict[str, Any]]:
    """The shard's records, from the JSONL part its manifest lists, after checking size and sha256."""
    key, manifest = _shard_manifest(store, run_id, shard_index)
    entry: Any = (manifest.get("files") or {}).get("jsonl")  # JSON, checked by _fetch_verified
    data = _fetch_verified(store, entry, key)
    return _decode_jsonl(data, store.url(entry["key"]), manifest.get("n_records"))


def write_run_manifest(
    store: ObjectStore,
    run_id: str,
    shard_manifests: list[dict[str, Any]],
    spec: dict[str, Any],
    versions: dict[str, Any],
    *,
    config_hash: str | None = None,
) -> dict[str, Any]:
    """Write ``runs/<run_id>/manifest.json`` listing the given shards (call it after every shard is
    written); return it. Each shard entry copies the shard manifest's file entries, so ``read_run``
    checks parts against the run manifest alone, and a shard rewritten later with the same records
    (a new ``written_at``) still reads."""
    shards: list[dict[str, Any]] = []
    for manifest in sorted(shard_manifests, key=lambda m: m.get("shard_index", -1)):
        if manifest.get("run_id") != run_id:
            raise ObjectStoreError(
                f"shard manifest of run {manifest.get('run_id')!r} given for run {run_id!r}"
            )
        index: Any = manifest.get("shard_index")  # JSON, checked by shard_key
        if shards and shards[-1]["shard_index"] == index:
            raise ObjectStoreError(f"shard {index} listed twice in the manifest of run {run_id!r}")
        shards.append(
            {
                "shard_index": index,
                "manifest_key": shard_key(run_id, index, "manifest.json"),
                "n_records": manifest["n_records"],
                "files": manifest["files"],
            }
        )
    run_manifest: dict[str, Any] = {
        "manifest_version": MANIFEST_VERSION,
        "run_id": run_id,
        "shards": shards,
        "n_shards": len(shards),
        "n_records": sum(s["n_records"] for s in shards),
    }
    body = _finish_manifest(run_manifest, spec, versions, config_hash, f"run manifest of {run_id!r}")
    store.put_bytes(run_manifest_key(run_id), body.encode("utf-8"), "application/json")
    return run_manifest


def read_run(store: ObjectStore, run_id: str) -> list[dict[str, Any]]:
    """Every record of the run, shard by shard in index order, from exactly the shards the run manifest
    lists (each part checked against its size and sha256); other files under the run are ignored."""
    key = run_manifest_key(run_id)
    manifest = _read_manifest(store, key, f"run {run_id!r} is not finished (or its manifest was lost)")
    if manifest.get("run_id") != run_id:
        raise ObjectStoreError(f"{store.url(key)} describes run {manifest.get('run_id')!r}, not {run_id!r}")
    records: list[dict[str, Any]] = []
    for shard in manifest.get("shards") or []:
        entry: Any = (shard.get("files") or {}).get("jsonl")  # JSON, checked by _fetch_verified
        data = _fetch_verified(store, entry, key)
        records.extend(_decode_jsonl(data, store.url(entry["key"]), shard.get("n_records")))
    return records
