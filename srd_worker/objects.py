"""Object store: one small interface, S3 (boto3) and a local folder behind it, and the shard/run result
artifacts with their manifests.

Follows DESIGN.md, Storage: parts live at ``runs/<run_id>/shards/<index:05d>.jsonl`` and ``.parquet``
under the store's prefix; a manifest per shard (``<index:05d>.manifest.json``) and per run
(``runs/<run_id>/manifest.json``) is written LAST with each part's size and sha256, and readers trust
only manifests: a part that no manifest lists is ignored, and a part whose bytes do not match its entry
is an ``ObjectStoreError`` naming the key.

Keys are relative, ``/``-separated, and checked the same way on both stores (no empty, ``.`` or ``..``
segments, no leading ``/``, no backslash), so code that works on a laptop folder works on S3.

Retries on S3 come in two layers. botocore retries each HTTP request (standard mode, ``max_attempts``).
Around each whole operation, tenacity retries (exponential backoff with jitter, ``retry_attempts`` tries)
only errors that a later try can fix: connection failures, timeouts, a response stream cut short, and
HTTP 5xx. That outer layer covers what botocore does not: reading a GET body that breaks midway, and a
multipart upload that s3transfer abandoned after a part failed. 4xx errors (missing key, denied access,
bad request) are never retried.

Left out: server-side encryption options, object versioning, presigned URLs, streaming APIs (shard parts
are a few MB and are handled as bytes), and cleanup of abandoned local temp files (they end in
``.srdq-tmp``, are never listed, and are safe to delete).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import tempfile
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable
from urllib.parse import unquote, urlparse

from srd_worker.errors import ConfigError, ObjectStoreError
from srd_worker.settings import Settings

log = logging.getLogger(__name__)

T = TypeVar("T")
MiB = 1024 * 1024
TMP_SUFFIX = ".srdq-tmp"
MANIFEST_VERSION = 1
JSON_COLUMNS_META = b"srdq.json_columns"


# --- the interface ----------------------------------------------------------------------------------


@runtime_checkable
class ObjectStore(Protocol):
    """Bytes under relative ``/``-separated keys. Every failure is an ``ObjectStoreError``."""

    def put_bytes(self, key: str, data: bytes, content_type: str | None = None) -> None:
        """Write ``data`` at ``key``, replacing what was there; readers see the old or the new bytes."""

    def get_bytes(self, key: str) -> bytes:
        """The bytes at ``key``; ``ObjectStoreError`` naming the key if there is no such object."""

    def exists(self, key: str) -> bool:
        """Whether an object is stored at ``key``."""

    def list(self, prefix: str = "") -> list[str]:
        """Keys that start with ``prefix`` (a plain string prefix, not only a folder), sorted."""

    def delete(self, key: str) -> None:
        """Remove ``key``; removing a missing key is not an error."""

    def url(self, key: str) -> str:
        """Where ``key`` lives, for messages and users (``s3://bucket/prefix/key``, ``file:///...``)."""


def check_key(key: str) -> str:
    """Return ``key`` if it is a valid relative object key, else raise ``ObjectStoreError``."""
    if not isinstance(key, str) or not key:
        raise ObjectStoreError(f"invalid object key {key!r}: empty")
    if key.startswith("/") or "\\" in key or "\x00" in key:
        raise ObjectStoreError(f"invalid object key {key!r}: absolute, or holds a backslash or NUL")
    if any(part in ("", ".", "..") for part in key.split("/")):
        raise ObjectStoreError(f"invalid object key {key!r}: empty, '.' or '..' path segment")
    if key.endswith(TMP_SUFFIX):
        raise ObjectStoreError(f"invalid object key {key!r}: the suffix {TMP_SUFFIX} is reserved")
    return key


def _check_prefix(prefix: str) -> str:
    # A listing prefix may end mid-segment ("runs/r1/shards/000") or be empty.
    if prefix.startswith("/") or "\\" in prefix or ".." in prefix.split("/"):
        raise ObjectStoreError(f"invalid listing prefix {prefix!r}")
    return prefix


# --- S3 ----------------------------------------------------------------------------------------------


def _is_transient(exc: BaseException) -> bool:
    """Connection errors, timeouts, broken response streams and HTTP 5xx (anywhere in the cause chain)."""
    from botocore.exceptions import ClientError, ConnectionError, HTTPClientError, SSLError

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, SSLError):  # a certificate problem does not go away by trying again
            return False
        if isinstance(seen, ConnectionError | HTTPClientError):
            return True
        if isinstance(seen, ClientError):
            status = seen.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            return status >= 500
        seen = seen.__cause__ or seen.__context__
    return False


def _status_and_code(exc: BaseException) -> tuple[int, str]:
    response = getattr(exc, "response", None) or {}
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
    return status, str(response.get("Error", {}).get("Code", ""))


class S3ObjectStore:
    """Objects in ``s3://bucket/prefix/`` through boto3, for AWS or any S3-compatible server.

    Nothing is contacted and no credential is looked up until the first call; the client is built then
    (again after a fork, so Celery workers never share a connection pool). ``access_key``/``secret_key``
    of ``None`` use the standard AWS chain (environment, profile, instance metadata).

    Checksums are computed and validated only when an operation requires them: S3-compatible servers
    differ on the newer flexible checksums, and result parts carry their own sha256 in manifests.
    Objects of ``multipart_threshold`` bytes or more are uploaded in parts of ``multipart_chunksize``.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        access_key: str | None = None,
        secret_key: str | None = None,
        max_attempts: int = 5,
        retry_attempts: int = 3,
        retry_wait: float = 0.5,
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
        multipart_threshold: int = 8 * MiB,
        multipart_chunksize: int = 8 * MiB,
    ) -> None:
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", bucket or ""):
            raise ConfigError(f"invalid S3 bucket name {bucket!r}")
        if (access_key is None) != (secret_key is None):
            raise ConfigError("set both the S3 access key and secret key, or neither (standard AWS chain)")
        if max_attempts < 1 or retry_attempts < 1:
            raise ConfigError("max_attempts and retry_attempts must be at least 1")
        if multipart_chunksize < 5 * MiB:
            raise ConfigError("multipart_chunksize must be at least 5 MiB (the S3 minimum part size)")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url
        self.region = region
        self._access_key = access_key
        self._secret_key = secret_key
        self.max_attempts = max_attempts
        self.retry_attempts = retry_attempts
        self.retry_wait = retry_wait
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.multipart_threshold = multipart_threshold
        self.multipart_chunksize = multipart_chunksize
        self._client: Any = None
        self._client_pid: int | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"S3ObjectStore(s3://{self.bucket}/{self.prefix}, endpoint_url={self.endpoint_url!r})"

    # The client is built lazily: constructing a store does no I/O (STYLE.md, principle 5).
    @property
    def client(self) -> Any:
        with self._lock:
            if self._client is None or self._client_pid != os.getpid():
                import boto3
                from botocore.config import Config

                config = Config(
                    region_name=self.region,
                    request_checksum_calculation="when_required",
                    response_checksum_validation="when_required",
                    retries={"max_attempts": self.max_attempts, "mode": "standard"},
                    connect_timeout=self.connect_timeout,
                    read_timeout=self.read_timeout,
                    # Path-style addressing for MinIO/moto/Ceph endpoints, whose hostnames rarely resolve
                    # per bucket; AWS itself gets its default (virtual-hosted) style.
                    s3={"addressing_style": "path"} if self.endpoint_url else None,
                )
                session = boto3.session.Session(
                    aws_access_key_id=self._access_key,
                    aws_secret_access_key=self._secret_key,
                    region_name=self.region,
                )
                self._client = session.client("s3", endpoint_url=self.endpoint_url, config=config)
                self._client_pid = os.getpid()
            return self._client

    def _full(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._full(key)}"

    def _call(self, what: str, where: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` with the outer (tenacity) retries; raise ``ObjectStoreError`` naming ``where``."""
        from boto3.exceptions import Boto3Error
        from botocore.exceptions import BotoCoreError, ClientError
        from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential, wait_random

        def before_sleep(state: Any) -> None:
            log.warning(
                "S3 %s %s failed (try %d of %d), retrying: %s",
                what,
                where,
                state.attempt_number,
                self.retry_attempts,
                state.outcome.exception(),
            )

        retrying = Retrying(
            stop=stop_after_attempt(self.retry_attempts),
            wait=wait_exponential(multiplier=self.retry_wait, max=20.0) + wait_random(0, self.retry_wait),
            retry=retry_if_exception(_is_transient),
            before_sleep=before_sleep,
            reraise=True,
        )
        try:
            return retrying(fn)
        except (BotoCoreError, ClientError, Boto3Error) as exc:
            tries = f" after {self.retry_attempts} tries" if _is_transient(exc) else ""
            raise ObjectStoreError(f"S3 {what} {where} failed{tries}: {exc}") from exc

    def ensure_bucket(self) -> None:
        """Create the bucket if it does not exist (idempotent)."""
        where = f"s3://{self.bucket}"

        def run() -> None:
            from botocore.exceptions import ClientError

            try:
                self.client.head_bucket(Bucket=self.bucket)
                return
            except ClientError as exc:
                status, code = _status_and_code(exc)
                if status != 404 and code not in ("404", "NoSuchBucket", "NotFound"):
                    raise
            kwargs: dict[str, Any] = {"Bucket": self.bucket}
            if self.region != "us-east-1":  # us-east-1 refuses an explicit LocationConstraint
                kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
            try:
                self.client.create_bucket(**kwargs)
            except ClientError as exc:  # created concurrently by another worker
                if _status_and_code(exc)[1] not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise

        self._call("create bucket", where, run)

    def put_bytes(self, key: str, data: bytes, content_type: str | None = None) -> None:
        from boto3.s3.transfer import TransferConfig

        full = self._full(key)
        transfer = TransferConfig(
            multipart_threshold=self.multipart_threshold,
            multipart_chunksize=self.multipart_chunksize,
            max_concurrency=4,
        )
        extra = {"ContentType": content_type} if content_type else None
        # A fresh reader per try: a retried upload must start from the first byte.
        self._call(
            "put",
            f"s3://{self.bucket}/{full}",
            lambda: self.client.upload_fileobj(
                io.BytesIO(data), self.bucket, full, ExtraArgs=extra, Config=transfer
            ),
        )

    def get_bytes(self, key: str) -> bytes:
        from botocore.exceptions import ClientError

        full = self._full(key)
        try:
            # The body is read inside the retried call: a stream cut short is retried as a whole GET.
            return self._call(
                "get",
                f"s3://{self.bucket}/{full}",
                lambda: self.client.get_object(Bucket=self.bucket, Key=full)["Body"].read(),
            )
        except ObjectStoreError as exc:
            if isinstance(exc.__cause__, ClientError) and _status_and_code(exc.__cause__)[0] == 404:
                raise ObjectStoreError(f"no object at s3://{self.bucket}/{full}") from exc.__cause__
            raise

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        full = self._full(key)

        def run() -> bool:
            try:
                self.client.head_object(Bucket=self.bucket, Key=full)
                return True
            except ClientError as exc:
                # Without s3:ListBucket permission AWS answers 403 for a missing key: that stays an error.
                if _status_and_code(exc)[0] == 404:
                    return False
                raise

        return self._call("head", f"s3://{self.bucket}/{full}", run)

    def list(self, prefix: str = "") -> list[str]:
        _check_prefix(prefix)
        base = f"{self.prefix}/" if self.prefix else ""

        def run() -> list[str]:
            keys = []
            for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=base + prefix
            ):
                keys.extend(obj["Key"][len(base) :] for obj in page.get("Contents", []))
            return sorted(keys)

        return self._call("list", f"s3://{self.bucket}/{base}{prefix}", run)

    def delete(self, key: str) -> None:
        full = self._full(key)
        self._call(
            "delete",
            f"s3://{self.bucket}/{full}",
            lambda: self.client.delete_object(Bucket=self.bucket, Key=full),
        )


# --- local folder ------------------------------------------------------------------------------------


class LocalObjectStore:
    """Objects as files under ``root`` (the embedded default). The root is created on the first put.

    Writes are atomic: the bytes go to a temp file beside the target, are fsynced, and replace the
    target with ``os.replace``; the folder is fsynced after, so a manifest written last is on disk after
    its parts. Keys that would leave the root (``..``, absolute paths, a symlink pointing outside) are
    refused. ``content_type`` is accepted and ignored.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser().absolute()

    def __repr__(self) -> str:
        return f"LocalObjectStore({str(self.root)!r})"

    def _path(self, key: str) -> Path:
        path = self.root.joinpath(*check_key(key).split("/"))
        real_root = os.path.realpath(self.root)
        if os.path.commonpath([real_root, os.path.realpath(path)]) != real_root:
            raise ObjectStoreError(f"invalid object key {key!r}: resolves outside {self.root}")
        return path

    def url(self, key: str) -> str:
        return self._path(key).as_uri()

    def put_bytes(self, key: str, data: bytes, content_type: str | None = None) -> None:
        path = self._path(key)
        tmp: str | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
            tmp = None
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            raise ObjectStoreError(f"cannot write {path}: {exc}") from exc
        finally:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)

    def get_bytes(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except FileNotFoundError as exc:
            raise ObjectStoreError(f"no object at {path}") from exc
        except OSError as exc:
            raise ObjectStoreError(f"cannot read {path}: {exc}") from exc

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> list[str]:
        _check_prefix(prefix)
        # Walk only the deepest folder the prefix names, not the whole root.
        start = self.root.joinpath(*[p for p in prefix.rpartition("/")[0].split("/") if p])
        if not start.is_dir():
            return []
        keys = []
        for folder, _, files in os.walk(start):
            rel = Path(folder).relative_to(self.root).as_posix()
            for name in files:
                key = name if rel == "." else f"{rel}/{name}"
                if not name.endswith(TMP_SUFFIX) and key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise ObjectStoreError(f"cannot delete {path}: {exc}") from exc


def open_store(url_or_path: str | os.PathLike[str], settings: Settings | None = None) -> ObjectStore:
    """The store for ``s3://BUCKET/PREFIX`` (endpoint, region and credentials from ``settings``; read
    from the environment when ``None``), or for a local folder (a path or ``file://`` URL). No I/O."""
    text = os.fspath(url_or_path)
    if text.startswith("s3://"):
        bucket, _, prefix = text[len("s3://") :].partition("/")
        if not bucket:
            raise ConfigError(f"object store URL {text!r} names no bucket: use s3://BUCKET/PREFIX")
        if settings is None:
            settings = Settings()
        return S3ObjectStore(
            bucket,
            prefix.strip("/"),
            endpoint_url=settings.s3_endpoint_url,
            region=settings.s3_region,
            access_key=settings.aws_access_key_id,
            secret_key=settings.aws_secret_access_key,
        )
    if text.startswith("file://"):
        return LocalObjectStore(unquote(urlparse(text).path))
    if "://" in text:
        raise ConfigError(f"unsupported object store URL {text!r}: use s3://BUCKET/PREFIX or a folder path")
    if not text:
        raise ConfigError("empty object store URL")
    return LocalObjectStore(text)


# --- result artifacts --------------------------------------------------------------------------------


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


def _dumps(value: Any) -> str:
    """Canonical JSON: sorted keys, no spaces, UTF-8 text, and no NaN/Infinity (not valid JSON)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


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
            lines.append(_dumps(record) + "\n")
        except (TypeError, ValueError) as exc:
            raise ObjectStoreError(f"record {i} is not JSON-serialisable: {exc}") from exc
    return "".join(lines).encode("utf-8")


def _column(values: list[Any]) -> tuple[Any, bool]:
    """An Arrow array for one column and whether it holds JSON text."""
    import pyarrow as pa

    kinds = {type(v) for v in values if v is not None}
    if not kinds:
        return pa.nulls(len(values)), False
    native = {bool: pa.bool_(), int: pa.int64(), float: pa.float64(), str: pa.string()}
    if kinds <= {int, float} and float in kinds:
        return pa.array(values, type=pa.float64()), False
    if len(kinds) == 1 and next(iter(kinds)) in native:
        try:
            return pa.array(values, type=native[next(iter(kinds))]), False
        except (OverflowError, pa.ArrowInvalid):  # an int beyond int64: keep it exact as JSON
            pass
    return pa.array([None if v is None else _dumps(v) for v in values], type=pa.string()), True


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
    import pyarrow as pa
    import pyarrow.parquet as pq

    encode_jsonl(records)  # the same validation (dicts, JSON-serialisable, no NaN) for both parts
    names = sorted({name for record in records for name in record})
    arrays, json_columns = [], []
    for name in names:
        array, is_json = _column([record.get(name) for record in records])
        arrays.append(array)
        if is_json:
            json_columns.append(name)
    schema = pa.schema(
        [pa.field(n, a.type) for n, a in zip(names, arrays, strict=True)],
        metadata={JSON_COLUMNS_META: json.dumps(json_columns).encode()},
    )
    table = pa.Table.from_arrays(arrays, schema=schema) if names else schema.empty_table()
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd")
    return buffer.getvalue()


def records_from_table(table: Any) -> list[dict[str, Any]]:
    """Rows of a shard's Parquet table as dicts, JSON columns decoded (missing keys come back as None)."""
    meta = (table.schema.metadata or {}).get(JSON_COLUMNS_META, b"[]")
    json_columns = set(json.loads(meta))
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
        "spec": spec,
        "versions": versions,
        "written_at": _now(),
    }
    if config_hash is not None:
        manifest["config_hash"] = config_hash
    try:
        body = json.dumps(manifest, sort_keys=True, ensure_ascii=False, indent=2, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ObjectStoreError(
            f"shard {shard_index} manifest of run {run_id!r}: spec or versions are "
            f"not JSON-serialisable: {exc}"
        ) from exc
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
    entry = (manifest.get("files") or {}).get("jsonl")
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
    shards = []
    for manifest in sorted(shard_manifests, key=lambda m: m.get("shard_index", -1)):
        if manifest.get("run_id") != run_id:
            raise ObjectStoreError(
                f"shard manifest of run {manifest.get('run_id')!r} given for run {run_id!r}"
            )
        index = manifest.get("shard_index")
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
        "spec": spec,
        "versions": versions,
        "written_at": _now(),
    }
    if config_hash is not None:
        run_manifest["config_hash"] = config_hash
    try:
        body = json.dumps(run_manifest, sort_keys=True, ensure_ascii=False, indent=2, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ObjectStoreError(
            f"run manifest of {run_id!r}: spec or versions are not JSON-serialisable: {exc}"
        ) from exc
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
        entry = (shard.get("files") or {}).get("jsonl")
        data = _fetch_verified(store, entry, key)
        records.extend(_decode_jsonl(data, store.url(entry["key"]), shard.get("n_records")))
    return records
