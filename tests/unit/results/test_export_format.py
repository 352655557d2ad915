"""Which format `srdq export` writes: the one --format names, else the one the destination's suffix names,
else Parquet; a --format that contradicts the suffix is refused before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from srd_worker.errors import ConfigError
from srd_worker.results.export import export_format


@pytest.mark.parametrize(
    ("fmt", "out", "expected"),
    [
        (None, "results.csv", "csv"),
        (None, "results.CSV", "csv"),
        (None, "run.jsonl", "jsonl"),
        (None, "run.ndjson", "jsonl"),
        (None, "run.pq", "parquet"),
        (None, "s3://bucket/exports/run.csv", "csv"),
        (None, "file:///tmp/run.jsonl", "jsonl"),
        (None, "results.txt", "parquet"),  # a suffix that names no format: the default
        (None, "exports/", "parquet"),
        (None, "s3://bucket/exports/", "parquet"),
        ("csv", "results.txt", "csv"),
        ("csv", "results.csv", "csv"),
        ("jsonl", "exports/", "jsonl"),
    ],
)
def test_format_from_option_then_suffix(fmt: str | None, out: str, expected: str) -> None:
    assert export_format(fmt, out) == expected


def test_a_folder_named_like_a_file_names_no_format(tmp_path: Path) -> None:
    folder = tmp_path / "looks.csv"
    folder.mkdir()
    assert export_format(None, str(folder)) == "parquet"
    assert export_format("jsonl", str(folder)) == "jsonl"


@pytest.mark.parametrize(
    ("fmt", "out"), [("parquet", "results.csv"), ("csv", "run.jsonl"), ("jsonl", "s3://b/k/run.parquet")]
)
def test_a_format_against_the_suffix_is_refused(fmt: str, out: str) -> None:
    with pytest.raises(ConfigError) as info:
        export_format(fmt, out)
    assert f"--format {fmt} does not match the destination {out!r}" in str(info.value)
