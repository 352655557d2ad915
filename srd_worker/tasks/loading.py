"""Reading and validating JSON Lines dataset files, with errors that name the file, line and field.

Follows JSON Lines (https://jsonlines.org): UTF-8 text, one JSON value per line; here every non-blank
line must be a JSON object. Blank (whitespace-only) lines are skipped but still counted, so line numbers
in errors match what an editor shows. A leading UTF-8 byte-order mark is tolerated.

Left out: other formats (JSON arrays, CSV, Parquet, Hugging Face datasets), compressed files, streaming
(the whole file is read into memory, which is fine for benchmark-sized files) and schema checks beyond
"these fields are non-empty strings", which belong to each task.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from srd_worker.errors import DatasetError
from srd_worker.tasks.base import Item

#: Default upper bound on one row's size in bytes (without the line break).
DEFAULT_MAX_ROW_BYTES: int = 1_000_000


def read_jsonl(path: str | Path, *, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES) -> list[tuple[int, dict[str, Any]]]:
    """Read a JSON Lines file into ``(line_number, row)`` pairs; line numbers are 1-based.

    Raises ``DatasetError`` (naming the file, and the line where there is one) if the file is missing, is
    a directory, cannot be read, has no rows, or a line is not UTF-8, is longer than ``max_row_bytes``,
    is not valid JSON or is not a JSON object.
    """
    p = Path(path)
    where = str(p)
    if not p.exists():
        raise DatasetError("file not found", path=where)
    if p.is_dir():
        raise DatasetError("is a directory, not a JSON Lines file", path=where)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise DatasetError(f"cannot read file: {exc.strerror or exc}", path=where) from exc

    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    rows: list[tuple[int, dict[str, Any]]] = []
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        raw = raw.removesuffix(b"\r")
        if len(raw) > max_row_bytes:
            raise DatasetError(f"row is {len(raw):,} bytes, more than the limit of {max_row_bytes:,} bytes",
                               path=where, line=lineno)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DatasetError(f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})",
                               path=where, line=lineno) from exc
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"malformed JSON: {exc.msg} (column {exc.colno})",
                               path=where, line=lineno) from exc
        if not isinstance(row, dict):
            raise DatasetError(f"row is a JSON {_json_type(row)}, expected a JSON object",
                               path=where, line=lineno)
        rows.append((lineno, row))
    if not rows:
        raise DatasetError("file is empty (no rows)", path=where)
    return rows


def require_fields(path: str | Path, line: int, row: dict[str, Any], fields: Iterable[str]) -> None:
    """Raise ``DatasetError`` naming the field if one of ``fields`` is missing, not a string, or blank."""
    for name in fields:
        if name not in row:
            raise DatasetError("missing required field", path=str(path), line=line, field=name)
        value = row[name]
        if not isinstance(value, str):
            raise DatasetError(f"must be a string, got JSON {_json_type(value)}",
                               path=str(path), line=line, field=name)
        if not value.strip():
            raise DatasetError("is empty", path=str(path), line=line, field=name)


def check_unique_ids(path: str | Path, items_with_lines: Sequence[tuple[int, str | Item]]) -> None:
    """Raise ``DatasetError`` naming both lines if two rows share an id.

    ``items_with_lines`` holds ``(line_number, id)`` pairs in file order. Objects with an ``id`` attribute
    (such as ``Item``) are accepted in place of the id string.
    """
    first_seen: dict[str, int] = {}
    for line, item in items_with_lines:
        item_id = item if isinstance(item, str) else str(item.id)
        if item_id in first_seen:
            raise DatasetError(f"duplicate id {item_id!r} (first used on line {first_seen[item_id]})",
                               path=str(path), line=line)
        first_seen[item_id] = line


def row_id(path: str | Path, line: int, row: dict[str, Any], field: str) -> str:
    """The row's id from ``field`` if present (a non-blank string or an integer), else ``line-<N>``."""
    if field not in row or row[field] is None:
        return f"line-{line}"
    value = row[field]
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise DatasetError(f"must be a string or integer id, got JSON {_json_type(value)}",
                           path=str(path), line=line, field=field)
    text = str(value).strip()
    if not text:
        raise DatasetError("is empty", path=str(path), line=line, field=field)
    return text


def _json_type(value: object) -> str:
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if value is None:
        return "null"
    return "string"
