"""The object store and result artifacts on a local folder (the embedded default), plus what only a
folder has: lazy creation of the root, atomic writes, keys that would escape the root; and the parsing
of store URLs by ``open_store``. The shared checks live in tests/object_store_cases.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from srd_worker.errors import ConfigError, ObjectStoreError
from srd_worker.results.objects import LocalObjectStore, S3ObjectStore, open_store
from srd_worker.settings import Settings
from tests.object_store_cases import ObjectStoreCases


class TestLocalObjectStore(ObjectStoreCases):
    @pytest.fixture
    def store(self, tmp_path: Path) -> LocalObjectStore:
        return LocalObjectStore(tmp_path / "results")


def test_constructing_does_no_io_and_the_root_comes_on_first_put(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "a" / "b")
    assert not (tmp_path / "a").exists()
    assert store.list() == [] and not store.exists("k")
    with pytest.raises(ObjectStoreError, match="no object at"):
        store.get_bytes("k")
    assert not (tmp_path / "a").exists()
    store.put_bytes("x/k", b"1")
    assert (tmp_path / "a" / "b" / "x" / "k").read_bytes() == b"1"


def test_writes_leave_no_temp_files_and_leftovers_are_not_listed(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    store.put_bytes("d/k", b"1")
    store.put_bytes("d/k", b"2")
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["k"]
    (tmp_path / "d" / ".k.abc.srdq-tmp").write_bytes(b"half")  # what a crash mid-write leaves
    assert store.list() == ["d/k"]
    assert store.get_bytes("d/k") == b"2"


def test_a_failed_write_raises_and_leaves_no_temp_file(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    store.put_bytes("d/k", b"old")
    with pytest.raises(ObjectStoreError, match=f"cannot write {tmp_path / 'd'}"):
        store.put_bytes("d", b"new")  # a folder is in the way: os.replace fails after the temp write
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    assert store.list() == ["d/k"] and store.get_bytes("d/k") == b"old"


@pytest.mark.parametrize("key", ["../outside", "a/../../outside", "/etc/passwd", "..", "a/.."])
def test_path_traversal_is_refused(tmp_path: Path, key: str) -> None:
    store = LocalObjectStore(tmp_path / "root")
    with pytest.raises(ObjectStoreError, match="invalid object key"):
        store.put_bytes(key, b"x")
    with pytest.raises(ObjectStoreError, match="invalid object key"):
        store.get_bytes(key)
    assert not (tmp_path / "outside").exists()


def test_a_symlink_out_of_the_root_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"s")
    root = tmp_path / "root"
    root.mkdir()
    (root / "link").symlink_to(outside)
    store = LocalObjectStore(root)
    with pytest.raises(ObjectStoreError, match="resolves outside"):
        store.get_bytes("link/secret")
    with pytest.raises(ObjectStoreError, match="resolves outside"):
        store.put_bytes("link/new", b"x")
    assert not (outside / "new").exists()


def test_url_is_a_file_uri(tmp_path: Path) -> None:
    assert LocalObjectStore(tmp_path).url("runs/r/x.json") == (tmp_path / "runs" / "r" / "x.json").as_uri()


# --- open_store --------------------------------------------------------------------------------------


def test_open_store_on_a_path_or_file_url(tmp_path: Path) -> None:
    for spec in (str(tmp_path / "out"), tmp_path / "out", (tmp_path / "out").as_uri()):
        store = open_store(spec)
        assert isinstance(store, LocalObjectStore) and store.root == tmp_path / "out"
    assert not (tmp_path / "out").exists()


def test_open_store_on_an_s3_url_builds_a_client_lazily() -> None:
    settings = Settings(
        s3_endpoint_url="http://127.0.0.1:9",
        s3_region="eu-west-1",
        aws_access_key_id="k",
        aws_secret_access_key="s",
    )
    store = open_store("s3://my-bucket/some/prefix/", settings)
    assert isinstance(store, S3ObjectStore)
    assert (store.bucket, store.prefix, store.endpoint_url, store.region) == (
        "my-bucket",
        "some/prefix",
        "http://127.0.0.1:9",
        "eu-west-1",
    )
    assert store._client is None  # nothing built, nothing contacted
    assert store.url("runs/r/manifest.json") == "s3://my-bucket/some/prefix/runs/r/manifest.json"
    bare = open_store("s3://my-bucket", settings)
    assert isinstance(bare, S3ObjectStore) and bare.prefix == ""
    assert bare.url("k") == "s3://my-bucket/k"


@pytest.mark.parametrize("url", ["s3://", "s3:///prefix", "gs://bucket/x", "", "s3://Bad_Bucket/x"])
def test_open_store_refuses_bad_urls(url: str) -> None:
    with pytest.raises(ConfigError):
        open_store(url, Settings(aws_access_key_id="k", aws_secret_access_key="s"))


def test_s3_store_refuses_half_a_credential_pair() -> None:
    with pytest.raises(ConfigError, match="both"):
        S3ObjectStore("bucket", access_key="k", secret_key=None)


@pytest.mark.parametrize(
    "url",
    [
        "s3://bucket/../../escape",
        "s3://bucket/runs/../x",
        "s3://bucket/./x",
        "s3://bucket/a//b",
        "s3://bucket/a\\b",
        "s3://bucket/a\x00b",
        "s3://bucket/tab\there",
    ],
)
def test_store_prefix_with_bad_segments_is_refused_where_the_store_opens(url):
    """`srdq sync RUN --store s3://bucket/../../escape` used to write keys with literal '..' segments."""
    with pytest.raises(ConfigError, match="invalid object-store location"):
        open_store(url, Settings())


@pytest.mark.parametrize("url", ["s3://a..b/x", "s3://../x"])
def test_bucket_with_dot_segments_is_refused(url):
    with pytest.raises(ConfigError, match="invalid S3 bucket name"):
        open_store(url, Settings())


def test_good_prefixes_open():
    for url in ("s3://bucket", "s3://bucket/", "s3://bucket/runs/2026-12", "s3://my.bucket/a.b/c..d/"):
        assert open_store(url, Settings()).bucket in ("bucket", "my.bucket")
