"""The object store and result artifacts on a real S3-compatible HTTP server: a ``moto_server`` process
started on a free loopback port for this module (no mocks, no in-process patching). Each test gets a
fresh bucket. The shared checks live in tests/object_store_cases.py; here are what only S3 has: the
multipart upload of a large object, bucket creation, and an unreachable endpoint.

Skips only when the ``moto_server`` command is not installed.
"""

from __future__ import annotations

import time
import uuid

import pytest

from srd_worker.errors import ObjectStoreError
from srd_worker.results.artifacts import read_shard, write_shard
from srd_worker.results.objects import S3ObjectStore, open_store
from srd_worker.settings import Settings
from tests.integration.fleet import free_port
from tests.object_store_cases import SPEC, VERSIONS, ObjectStoreCases, make_records

pytestmark = pytest.mark.integration

CREDENTIALS = {"access_key": "testing", "secret_key": "testing"}


def new_store(endpoint: str, prefix: str = "results/test", **kwargs) -> S3ObjectStore:
    store = S3ObjectStore(
        f"srdq-test-{uuid.uuid4().hex[:12]}", prefix, endpoint_url=endpoint, **CREDENTIALS, **kwargs
    )
    store.ensure_bucket()
    return store


class TestS3ObjectStore(ObjectStoreCases):
    @pytest.fixture
    def store(self, endpoint: str) -> S3ObjectStore:
        return new_store(endpoint)

    def check_large_upload(self, store: S3ObjectStore, key: str) -> None:  # type: ignore[override]
        full = f"{store.prefix}/{key}"
        head = store.client.head_object(Bucket=store.bucket, Key=full)
        # A multipart upload's ETag is md5-of-part-md5s followed by "-<number of parts>".
        assert head["ETag"].strip('"').endswith("-2"), head["ETag"]
        assert head["ContentType"] == "application/octet-stream"
        parts = store.client.head_object(Bucket=store.bucket, Key=full, PartNumber=1)
        assert parts["PartsCount"] == 2 and parts["ContentLength"] == store.multipart_chunksize


def test_a_small_object_goes_up_in_one_part(endpoint: str) -> None:
    store = new_store(endpoint)
    store.put_bytes("small.json", b"{}", "application/json")
    head = store.client.head_object(Bucket=store.bucket, Key="results/test/small.json")
    assert "-" not in head["ETag"] and head["ContentType"] == "application/json"


def test_keys_sit_under_the_prefix_and_other_prefixes_are_not_listed(endpoint: str) -> None:
    store = new_store(endpoint, prefix="a/b")
    sibling = S3ObjectStore(store.bucket, "a/bc", endpoint_url=endpoint, **CREDENTIALS)
    store.put_bytes("k", b"1")
    sibling.put_bytes("k", b"2")
    raw = store.client.list_objects_v2(Bucket=store.bucket)["Contents"]
    assert sorted(obj["Key"] for obj in raw) == ["a/b/k", "a/bc/k"]
    assert store.list() == ["k"] and sibling.list() == ["k"]
    assert store.get_bytes("k") == b"1"


def test_ensure_bucket_creates_once(endpoint: str) -> None:
    store = S3ObjectStore(f"srdq-test-{uuid.uuid4().hex[:12]}", "", endpoint_url=endpoint, **CREDENTIALS)
    with pytest.raises(ObjectStoreError, match=f"s3://{store.bucket}/k"):
        store.put_bytes("k", b"x")  # no such bucket yet (a 4xx: not retried)
    store.ensure_bucket()
    store.ensure_bucket()
    store.put_bytes("k", b"x")
    assert store.list() == ["k"]


def test_open_store_uses_the_settings(endpoint: str) -> None:
    bucket = f"srdq-test-{uuid.uuid4().hex[:12]}"
    settings = Settings(
        s3_endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing"
    )
    store = open_store(f"s3://{bucket}/exp1", settings)
    assert isinstance(store, S3ObjectStore)
    store.ensure_bucket()
    write_shard(store, "r1", 0, make_records(0), spec=SPEC, versions=VERSIONS)
    assert read_shard(store, "r1", 0) == make_records(0)
    assert store.list("runs/r1/shards/00000.") == [
        "runs/r1/shards/00000.jsonl",
        "runs/r1/shards/00000.manifest.json",
        "runs/r1/shards/00000.parquet",
    ]


def test_an_unreachable_endpoint_fails_fast_with_the_key(
    endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    store = S3ObjectStore(
        "srdq-test-nowhere",
        "p",
        endpoint_url=closed,
        **CREDENTIALS,
        max_attempts=2,
        retry_attempts=2,
        retry_wait=0.05,
        connect_timeout=1.0,
    )
    started = time.monotonic()
    with pytest.raises(
        ObjectStoreError, match=r"s3://srdq-test-nowhere/p/runs/x\.jsonl failed after 2 tries"
    ):
        store.put_bytes("runs/x.jsonl", b"{}")
    with pytest.raises(ObjectStoreError, match=r"get s3://srdq-test-nowhere/p/k failed after 2 tries"):
        store.get_bytes("k")
    with pytest.raises(ObjectStoreError, match="s3://srdq-test-nowhere/p/runs/"):
        store.list("runs/")
    assert time.monotonic() - started < 30
    # The outer (tenacity) layer retried each operation once: one warning per retry.
    retries = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retries) == 3 and "try 1 of 2" in retries[0], retries
