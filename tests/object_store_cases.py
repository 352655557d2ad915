"""Object store checks shared by the local-folder (unit) and S3 server (integration) test modules.

``ObjectStoreCases`` holds the tests; each backend's module subclasses it and provides a ``store``
fixture that yields a fresh, empty store. The class name does not start with ``Test``, so pytest
collects the tests only through the subclasses. ``check_large_upload`` is a hook for backend-specific
checks on a large object (the S3 module checks that it went up in parts).
"""

from __future__ import annotations

import io
import json
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from srd_worker.errors import ObjectStoreError
from srd_worker.results.artifacts import (
    read_run,
    read_shard,
    records_from_table,
    run_manifest_key,
    shard_key,
    verify_shard,
    write_run_manifest,
    write_shard,
)
from srd_worker.results.objects import ObjectStore

RUN = "run-abc"
SPEC = {"method": "srd", "params": {"k": 4}, "seed": 0}
VERSIONS = {"srdq": "0.1.0", "python": "3.11"}
LARGE = 9 * 1024 * 1024  # above the 8 MiB multipart threshold of S3ObjectStore

BAD_KEYS = ["", "/etc/passwd", "../x", "a/../../b", "a/./b", "a//b", "a/", ".", "a\\b", "x.srdq-tmp"]


def make_records(shard_index: int, n: int = 3) -> list[dict[str, Any]]:
    """Result-like records: scalars, a nested ledger whose keys vary, a list, unicode, an error."""
    return [
        {
            "item_id": f"s{shard_index}-q{i}",
            "position": shard_index * 100 + i,
            "answer": f"{i} ≈ √{i * i}",
            "correct": i % 2 == 0,
            "error": None if i % 2 == 0 else "too long",
            "reward": 0.25 * i,
            "ledger": {"gen_tokens": 10 * i, **({"draft": {"calls": i}} if i else {})},
            "steps": list(range(i)),
        }
        for i in range(n)
    ]


class RecordingStore:
    """Wraps a real store and, before each put, records the key and what the run folder held then.

    It only observes: every call goes to the wrapped store.
    """

    def __init__(self, inner: ObjectStore, watch: str) -> None:
        self.inner = inner
        self.watch = watch
        self.puts: list[tuple[str, list[str]]] = []

    def put_bytes(self, key: str, data: bytes, content_type: str | None = None) -> None:
        self.puts.append((key, self.inner.list(self.watch)))
        self.inner.put_bytes(key, data, content_type)

    def get_bytes(self, key: str) -> bytes:
        return self.inner.get_bytes(key)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def list(self, prefix: str = "") -> list[str]:
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def url(self, key: str) -> str:
        return self.inner.url(key)


class ObjectStoreCases:
    def check_large_upload(self, store: ObjectStore, key: str) -> None:
        """Backend-specific checks on the object ``test_large_object_round_trips`` wrote."""

    # --- the interface ------------------------------------------------------------------------------

    def test_put_get_exists_delete(self, store: ObjectStore) -> None:
        assert isinstance(store, ObjectStore)
        assert not store.exists("a/b.txt")
        store.put_bytes("a/b.txt", b"hello", "text/plain")
        assert store.exists("a/b.txt")
        assert store.get_bytes("a/b.txt") == b"hello"
        store.put_bytes("a/b.txt", b"replaced")
        assert store.get_bytes("a/b.txt") == b"replaced"
        store.put_bytes("empty", b"")
        assert store.get_bytes("empty") == b""
        store.delete("a/b.txt")
        assert not store.exists("a/b.txt")
        store.delete("a/b.txt")  # deleting a missing key is not an error
        assert store.list() == ["empty"]

    def test_list_by_prefix_is_sorted_and_relative(self, store: ObjectStore) -> None:
        for key in [
            "runs/r2/x",
            "runs/r1/shards/00001.jsonl",
            "runs/r1/shards/00000.jsonl",
            "other",
            "runs/r10/y",
        ]:
            store.put_bytes(key, key.encode())
        assert store.list("runs/r1/") == ["runs/r1/shards/00000.jsonl", "runs/r1/shards/00001.jsonl"]
        assert store.list("runs/r1") == [
            "runs/r1/shards/00000.jsonl",
            "runs/r1/shards/00001.jsonl",
            "runs/r10/y",
        ]
        assert store.list("runs/r1/shards/00001") == ["runs/r1/shards/00001.jsonl"]
        assert store.list() == sorted(
            ["runs/r2/x", "runs/r1/shards/00001.jsonl", "runs/r1/shards/00000.jsonl", "other", "runs/r10/y"]
        )
        assert store.list("nothing/") == []

    def test_get_of_a_missing_key_names_it(self, store: ObjectStore) -> None:
        with pytest.raises(ObjectStoreError, match="no object at .*missing/key.bin"):
            store.get_bytes("missing/key.bin")

    @pytest.mark.parametrize("key", BAD_KEYS)
    def test_bad_keys_are_refused(self, store: ObjectStore, key: str) -> None:
        with pytest.raises(ObjectStoreError, match="invalid object key"):
            store.put_bytes(key, b"x")
        with pytest.raises(ObjectStoreError, match="invalid object key"):
            store.get_bytes(key)
        with pytest.raises(ObjectStoreError, match="invalid object key"):
            store.delete(key)
        assert store.list() == []

    def test_large_object_round_trips(self, store: ObjectStore) -> None:
        data = bytes(range(256)) * (LARGE // 256) + b"tail"
        store.put_bytes("big/blob.bin", data, "application/octet-stream")
        assert store.get_bytes("big/blob.bin") == data
        self.check_large_upload(store, "big/blob.bin")

    # --- shard artifacts ----------------------------------------------------------------------------

    def test_write_shard_writes_the_manifest_last(self, store: ObjectStore) -> None:
        recorder = RecordingStore(store, f"runs/{RUN}/")
        manifest = write_shard(recorder, RUN, 3, make_records(3), spec=SPEC, versions=VERSIONS)
        jsonl, parquet, man = (shard_key(RUN, 3, s) for s in ("jsonl", "parquet", "manifest.json"))
        assert [key for key, _ in recorder.puts] == [jsonl, parquet, man]
        # When each part went up no manifest existed; when the manifest went up both parts were there.
        assert recorder.puts[0][1] == []
        assert recorder.puts[1][1] == [jsonl]
        assert recorder.puts[2][1] == [jsonl, parquet]
        assert store.list(f"runs/{RUN}/") == sorted([jsonl, parquet, man])
        assert json.loads(store.get_bytes(man)) == manifest
        assert manifest["run_id"] == RUN and manifest["shard_index"] == 3 and manifest["n_records"] == 3
        assert manifest["spec"] == SPEC and manifest["versions"] == VERSIONS and "config_hash" not in manifest
        assert manifest["written_at"].endswith("+00:00")
        for name, key in (("jsonl", jsonl), ("parquet", parquet)):
            entry = manifest["files"][name]
            assert entry["key"] == key and entry["size"] == len(store.get_bytes(key))
            assert len(entry["sha256"]) == 64

    def test_read_shard_returns_the_records(self, store: ObjectStore) -> None:
        records = make_records(0, n=5)
        write_shard(store, RUN, 0, records, spec=SPEC, versions=VERSIONS, config_hash="h1")
        assert read_shard(store, RUN, 0) == records
        assert verify_shard(store, RUN, 0)["config_hash"] == "h1"
        lines = store.get_bytes(shard_key(RUN, 0, "jsonl")).decode().splitlines()
        assert [json.loads(line) for line in lines] == records
        assert all(list(json.loads(line)) == sorted(json.loads(line)) for line in lines)  # sort_keys

    def test_empty_shard_round_trips(self, store: ObjectStore) -> None:
        manifest = write_shard(store, RUN, 0, [], spec=SPEC, versions=VERSIONS)
        assert manifest["n_records"] == 0 and manifest["files"]["jsonl"]["size"] == 0
        assert read_shard(store, RUN, 0) == []
        assert pq.read_table(io.BytesIO(store.get_bytes(shard_key(RUN, 0, "parquet")))).num_rows == 0

    def test_rewriting_a_shard_is_idempotent(self, store: ObjectStore) -> None:
        first = write_shard(store, RUN, 0, make_records(0), spec=SPEC, versions=VERSIONS)
        keys = store.list()
        parts = {name: store.get_bytes(entry["key"]) for name, entry in first["files"].items()}
        second = write_shard(store, RUN, 0, make_records(0), spec=SPEC, versions=VERSIONS)
        assert second["files"] == first["files"]  # same keys, sizes and sha256s
        assert store.list() == keys  # no extra keys
        assert {name: store.get_bytes(e["key"]) for name, e in second["files"].items()} == parts
        assert json.loads(store.get_bytes(shard_key(RUN, 0, "manifest.json"))) == second
        assert read_shard(store, RUN, 0) == make_records(0)

    @pytest.mark.parametrize("how", ["other size", "same size"])
    def test_a_corrupted_part_is_detected(self, store: ObjectStore, how: str) -> None:
        write_shard(store, RUN, 0, make_records(0), spec=SPEC, versions=VERSIONS)
        key = shard_key(RUN, 0, "jsonl")
        good = store.get_bytes(key)
        bad = good + b"{}\n" if how == "other size" else good.replace(b"s0-q1", b"s0-q9")
        assert bad != good
        store.put_bytes(key, bad)
        what = "bytes but" if how == "other size" else "sha256"
        with pytest.raises(ObjectStoreError, match=rf"{key}.* {what}.*corrupt") as info:
            read_shard(store, RUN, 0)
        assert store.url(key) in str(info.value)

    def test_verify_shard_detects_a_corrupted_parquet_part(self, store: ObjectStore) -> None:
        write_shard(store, RUN, 0, make_records(0), spec=SPEC, versions=VERSIONS)
        key = shard_key(RUN, 0, "parquet")
        store.put_bytes(key, store.get_bytes(key)[:-1] + b"\x00")
        assert read_shard(store, RUN, 0) == make_records(0)  # the JSONL part is intact
        with pytest.raises(ObjectStoreError, match=rf"{key}.*corrupt"):
            verify_shard(store, RUN, 0)

    def test_reading_a_shard_without_a_manifest_fails(self, store: ObjectStore) -> None:
        store.put_bytes(shard_key(RUN, 0, "jsonl"), b'{"a":1}\n')
        with pytest.raises(ObjectStoreError, match="shard 0 of run 'run-abc' was not written.*manifest"):
            read_shard(store, RUN, 0)

    def test_parquet_part_has_the_same_rows(self, store: ObjectStore) -> None:
        records = make_records(0, n=4)
        manifest = write_shard(store, RUN, 0, records, spec=SPEC, versions=VERSIONS)
        table = pq.read_table(io.BytesIO(store.get_bytes(manifest["files"]["parquet"]["key"])))
        assert table.num_rows == 4
        assert records_from_table(table) == records
        types = {field.name: field.type for field in table.schema}
        assert types == {
            "item_id": pa.string(),
            "position": pa.int64(),
            "answer": pa.string(),
            "correct": pa.bool_(),
            "error": pa.string(),
            "reward": pa.float64(),
            "ledger": pa.string(),
            "steps": pa.string(),
        }

    def test_nested_shapes_do_not_change_the_parquet_schema(self, store: ObjectStore) -> None:
        a = [{"id": "a", "ledger": {"x": 1}, "steps": [], "error": None}]
        b = [{"id": "b", "ledger": {"y": [1.5, "z"]}, "steps": [{"k": 1}], "error": "boom"}]
        schemas = []
        for index, records in enumerate((a, b)):
            m = write_shard(store, RUN, index, records, spec=SPEC, versions=VERSIONS)
            schemas.append(pq.read_table(io.BytesIO(store.get_bytes(m["files"]["parquet"]["key"]))).schema)
        assert schemas[0].field("ledger").type == schemas[1].field("ledger").type == pa.string()
        assert schemas[0].field("steps").type == schemas[1].field("steps").type == pa.string()
        # A column null throughout one shard has type null, which merges with the other shard's type.
        assert pa.unify_schemas(schemas).field("error").type == pa.string()

    @pytest.mark.parametrize("bad", [{"r": float("nan")}, {"r": object()}, "not a dict"])
    def test_unserialisable_records_write_nothing(self, store: ObjectStore, bad: Any) -> None:
        with pytest.raises(ObjectStoreError, match="record 1"):
            write_shard(store, RUN, 0, [{"r": 1}, bad], spec=SPEC, versions=VERSIONS)
        assert store.list() == []

    # --- runs ---------------------------------------------------------------------------------------

    def test_read_run_trusts_only_the_run_manifest(self, store: ObjectStore) -> None:
        manifests = [
            write_shard(store, RUN, i, make_records(i), spec=SPEC, versions=VERSIONS) for i in (1, 0)
        ]
        run = write_run_manifest(store, RUN, manifests, SPEC, VERSIONS, config_hash="h1")
        assert [s["shard_index"] for s in run["shards"]] == [0, 1]
        assert (run["n_shards"], run["n_records"], run["config_hash"]) == (2, 6, "h1")
        assert json.loads(store.get_bytes(run_manifest_key(RUN))) == run
        # A shard written after the run manifest, and a stray part with no manifest at all.
        write_shard(store, RUN, 2, make_records(2), spec=SPEC, versions=VERSIONS)
        store.put_bytes(shard_key(RUN, 3, "jsonl"), b'{"item_id":"stray"}\n')
        assert read_run(store, RUN) == make_records(0) + make_records(1)

    def test_read_run_detects_a_corrupted_part(self, store: ObjectStore) -> None:
        manifests = [
            write_shard(store, RUN, i, make_records(i), spec=SPEC, versions=VERSIONS) for i in (0, 1)
        ]
        write_run_manifest(store, RUN, manifests, SPEC, VERSIONS)
        key = shard_key(RUN, 1, "jsonl")
        store.put_bytes(key, b'{"item_id":"forged"}\n')
        with pytest.raises(ObjectStoreError, match=rf"{key}.*corrupt"):
            read_run(store, RUN)

    def test_read_run_without_a_run_manifest_fails(self, store: ObjectStore) -> None:
        write_shard(store, RUN, 0, make_records(0), spec=SPEC, versions=VERSIONS)
        with pytest.raises(ObjectStoreError, match="not finished.*manifest.json"):
            read_run(store, RUN)

    def test_write_run_manifest_refuses_foreign_or_duplicate_shards(self, store: ObjectStore) -> None:
        mine = write_shard(store, RUN, 0, make_records(0), spec=SPEC, versions=VERSIONS)
        other = write_shard(store, "run-other", 1, make_records(1), spec=SPEC, versions=VERSIONS)
        with pytest.raises(ObjectStoreError, match="run 'run-other' given for run 'run-abc'"):
            write_run_manifest(store, RUN, [mine, other], SPEC, VERSIONS)
        with pytest.raises(ObjectStoreError, match="shard 0 listed twice"):
            write_run_manifest(store, RUN, [mine, mine], SPEC, VERSIONS)
        assert not store.exists(run_manifest_key(RUN))

    @pytest.mark.parametrize("run_id", ["", "a/b", "..", ".hidden", "a b"])
    def test_bad_run_ids_are_refused(self, store: ObjectStore, run_id: str) -> None:
        with pytest.raises(ObjectStoreError, match="invalid run id"):
            write_shard(store, run_id, 0, make_records(0), spec=SPEC, versions=VERSIONS)
        assert store.list() == []
