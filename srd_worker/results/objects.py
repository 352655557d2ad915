"""Object store: one small interface (``ObjectStore``), S3 (boto3) and a local folder behind it.

What is stored where (shard parts, manifests) is ``artifacts.py``'s business; this module only moves
bytes under keys.

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

import io
import logging
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable
from urllib.parse import unquote, urlparse

from srd_worker.errors import ConfigError, ObjectStoreError
from srd_worker.fileutil import write_atomic
from srd_worker.settings import Settings

log = logging.getLogger(__name__)

T = TypeVar("T")
MiB = 1024 * 1024
TMP_SUFFIX = ".srdq-tmp"


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


def check_store_prefix(prefix: str, *, where: str) -> str:
    """A store's own prefix (``s3://bucket/PREFIX``): ``/``-separated segments, none empty, ``.`` or ``..``,
    none holding a control character or a backslash; ``ConfigError`` naming the location otherwise (a
    ``..`` would otherwise become a literal key segment outside the prefix the user meant)."""
    body = prefix.strip("/")
    if not body:
        return body
    for part in body.split("/"):
        if part in ("", ".", "..") or "\\" in part or any(ord(c) < 32 or ord(c) == 127 for c in part):
            raise ConfigError(
                f"invalid object-store location {where!r}: prefix segment {part!r} (segments may not be "
                "empty, '.' or '..', nor hold a backslash or control character)"
            )
    return body


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
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", bucket or "") or ".." in bucket:
            raise ConfigError(f"invalid S3 bucket name {bucket!r}")
        check_store_prefix(prefix, where=f"s3://{bucket}/{prefix}")
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

    @property
    def has_keys(self) -> bool:
        """Whether the store was given its own access key pair (else boto3's standard chain applies)."""
        return self._access_key is not None

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
            keys: list[str] = []
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
        try:
            write_atomic(path, data, tmp_suffix=TMP_SUFFIX, mode=0o600)
        except OSError as exc:
            raise ObjectStoreError(f"cannot write {path}: {exc}") from exc

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
