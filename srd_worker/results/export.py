"""Results out of the database as files: ``srdq export`` (JSONL, CSV, Parquet) and the run data
``srdq report`` draws from.

Exports are one row per item in dataset order: the stored record plus ``run_id``, ``shard_index``,
``status`` (``done``, ``failed`` or ``pending``: no result yet) and ``failed``. JSONL keeps records nested;
CSV and Parquet flatten them (``flatten_row``).
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine

from srd_worker.encoding import arrow_column, parquet_bytes, sorted_json
from srd_worker.errors import ConfigError
from srd_worker.fileutil import write_atomic
from srd_worker.results.artifacts import encode_jsonl
from srd_worker.results.objects import open_store
from srd_worker.store import queries
from srd_worker.store.db import session_scope

if TYPE_CHECKING:
    from srd_worker.settings import Settings

EXPORT_FORMATS = ("parquet", "jsonl", "csv")
CONTENT_TYPES = {
    "parquet": "application/vnd.apache.parquet",
    "jsonl": "application/x-ndjson",
    "csv": "text/csv",
}


def export_rows(db: Engine, run_id: str) -> list[dict[str, Any]]:
    """One row per item of the run in dataset order: the stored record (an item without a result yet
    gets its id, position, question and gold) plus ``run_id``, ``shard_index``, ``status`` and
    ``failed``."""
    with session_scope(db) as session:
        queries.require_run(session=session, run_id=run_id)
        rows = queries.items_with_records(session=session, run_id=run_id)
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
    return sorted_json(value, allow_nan=True)


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


def encode_flat_parquet(rows: list[dict[str, Any]]) -> bytes:
    """Flattened rows as one Parquet table (zstd): typed columns (bool, int64, float64, string); the
    columns that hold JSON text are named in the schema metadata ``srdq.json_columns``."""
    columns, flat, json_columns = flatten_rows(rows)
    arrays = [arrow_column([r.get(c) for r in flat], keep_strings=True, allow_nan=True)[0] for c in columns]
    return parquet_bytes(columns, arrays, sorted(json_columns))


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
    data: bytes,
    out: str,
    *,
    default_name: str,
    content_type: str | None = None,
    settings: Settings | None = None,
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
        write_atomic(path, data)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc}") from exc
    return str(path)


#: File suffixes that name an export format (``export_format``).
FORMAT_SUFFIXES = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".csv": "csv",
}


def export_format(fmt: str | None, out: str) -> str:
    """The format to export to ``out``: ``fmt`` when given, else the one its file suffix names, else
    Parquet. A ``fmt`` that contradicts the suffix (``--format parquet --out results.csv``) is a
    ``ConfigError``: the file would hold one format under another's name. A folder (a path ending in
    ``/`` or an existing directory) names none."""
    target = out[len("file://") :] if out.startswith("file://") else out
    is_folder = target.endswith(("/", os.sep)) or ("://" not in target and Path(target).is_dir())
    suffix = "" if is_folder else Path(target.rstrip("/")).suffix.lower()
    implied = FORMAT_SUFFIXES.get(suffix)
    if fmt is not None and implied is not None and fmt != implied:
        raise ConfigError(
            f"--format {fmt} does not match the destination {out!r}, a {suffix} file ({implied}): "
            f"drop --format, or name the file *.{fmt}"
        )
    return fmt or implied or "parquet"


def export_run(
    db: Engine, run_id: str, fmt: str, out: str, *, settings: Settings | None = None
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
