"""The encoders every result file shares: sorted JSON text, one Arrow column from Python values, and a
Parquet table from those columns.

``sorted_json`` is the one JSON writer behind everything srdq hashes or compares byte for byte (shard
parts and manifests, the spec hash, ``results.jsonl``); its options reproduce each of those formats
exactly, so they must not change.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import Any

#: Parquet schema metadata key naming the columns that hold JSON text.
JSON_COLUMNS_META = b"srdq.json_columns"


def sorted_json(
    value: Any,
    *,
    compact: bool = True,
    indent: int | None = None,
    ascii: bool = False,
    allow_nan: bool = False,
) -> str:
    """JSON with sorted keys. ``compact``: no spaces after ``,`` and ``:`` (the canonical form of
    shard parts); otherwise Python's default ``", "`` / ``": "``. ``indent`` pretty-prints (manifests).
    ``ascii`` escapes non-ASCII characters (the spec hash); ``allow_nan`` writes NaN/Infinity, which
    are not valid JSON, instead of raising ``ValueError``."""
    separators = (",", ":") if compact and indent is None else None
    return json.dumps(
        value, sort_keys=True, ensure_ascii=ascii, separators=separators, indent=indent, allow_nan=allow_nan
    )


def arrow_column(
    values: Sequence[Any], *, keep_strings: bool = False, allow_nan: bool = False
) -> tuple[Any, bool]:
    """One Arrow array for a column of Python values, and whether it fell back to JSON text.

    No value: type ``null``. All bool, all int (int64), all str: that type. Numbers with at least one
    float: float64. Anything else (dicts, lists, mixed kinds, an int beyond int64) is a string column of
    ``sorted_json`` text; ``keep_strings`` writes the str values of such a column as they are instead of
    as JSON strings (for flattened rows, whose dicts and lists are already JSON text).
    """
    import pyarrow as pa

    kinds = {type(v) for v in values if v is not None}
    if not kinds:
        return pa.nulls(len(values)), False
    if kinds <= {int, float} and float in kinds:
        return pa.array([None if v is None else float(v) for v in values], type=pa.float64()), False
    native = {bool: pa.bool_(), int: pa.int64(), float: pa.float64(), str: pa.string()}
    if len(kinds) == 1 and next(iter(kinds)) in native:
        try:
            return pa.array(values, type=native[next(iter(kinds))]), False
        except (OverflowError, pa.ArrowInvalid):  # an int beyond int64: keep it exact as JSON
            pass
    text = [
        None
        if v is None
        else v
        if keep_strings and isinstance(v, str)
        else sorted_json(v, allow_nan=allow_nan)
        for v in values
    ]
    return pa.array(text, type=pa.string()), True


def parquet_bytes(names: Sequence[str], arrays: Sequence[Any], json_columns: Sequence[str]) -> bytes:
    """One Parquet table (zstd) of the named columns; ``json_columns`` go to the schema metadata
    ``srdq.json_columns`` in the given order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [pa.field(n, a.type) for n, a in zip(names, arrays, strict=True)],
        metadata={JSON_COLUMNS_META: json.dumps(list(json_columns)).encode()},
    )
    table = pa.Table.from_arrays(list(arrays), schema=schema) if names else schema.empty_table()
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd")
    return buffer.getvalue()


def json_columns_of(table: Any) -> list[str]:
    """The columns a Parquet table written by ``parquet_bytes`` names as JSON text."""
    return list(json.loads((table.schema.metadata or {}).get(JSON_COLUMNS_META, b"[]")))
