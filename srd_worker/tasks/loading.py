"""Reading and validating dataset files (JSON Lines, JSON arrays, CSV, Parquet), with errors that name the
file, the line (or row) and the field.

- JSON Lines (https://jsonlines.org): UTF-8 text, one JSON value per line; every non-blank line must be a
  JSON object. Blank lines are skipped but still counted, so line numbers match what an editor shows. An
  object that repeats a key, and a string with a lone surrogate escape (``\\ud800`` without its pair: not
  Unicode text, so no store, file or encoder downstream could write it), are refused.
- CSV (RFC 4180 as Python's ``csv`` module reads it, strict mode): UTF-8, a header line naming the
  columns, then one record per row; every value is a string. Errors name the line where the record
  starts (a quoted value may span several lines). Blank lines are skipped.
- Parquet (read with pyarrow, imported only when needed): errors name the 1-based data row.
- JSON: a file whose one top-level value is an array of objects (``[{...}, {...}]``, as many datasets
  ship their ``.json`` files), read one element at a time; errors name the 1-based row (element) and,
  for a syntax error, the line and column. Recognised by its first character: a ``.json``, ``.jsonl`` or
  ``.ndjson`` file (or one with no known suffix) that starts with ``[`` is such an array, any other is JSON
  Lines. Trailing commas and anything after the closing ``]`` are refused (RFC 8259).
- gzip: a JSON Lines, JSON or CSV file compressed with gzip (``.jsonl.gz``, ``.json.gz``, ``.csv.gz``;
  recognised by its magic bytes, the format by the suffix under ``.gz``) is read as it decompresses;
  line numbers are the decompressed file's.
- A Hugging Face ``datasets`` folder written by ``Dataset.save_to_disk`` (``state.json`` + Arrow stream
  files, read with pyarrow; the ``datasets`` package is not needed): errors name the folder and the
  1-based data row. A ``DatasetDict`` folder (``dataset_dict.json``) is refused naming its splits.

A leading UTF-8 byte-order mark is tolerated in the text formats. Every row is checked against a size
limit (JSONL/CSV/JSON arrays: its bytes in the file; Parquet: the size of its values as JSON). ``read_rows`` picks the
reader from the file suffix (``.csv``; ``.parquet``/``.pq``; anything else is JSON Lines or a JSON array by
its first character, unless it starts with the Parquet magic bytes) and returns a ``Rows`` whose helpers
raise errors in that file's terms.

Every reader streams: ``iter_jsonl``/``iter_json_array``/``iter_csv``/``iter_parquet`` hold one row (one
Parquet batch; a JSON array's element and a read-ahead chunk) at a time, so ``read_rows(...,
stream=True)`` and ``Rows.iter_items`` validate a file of any length in bounded memory (``srdq submit
dataset`` spools the items to disk, ``srd_worker.tasks.spool``); the
``read_*`` functions and ``Rows.items`` build lists for the embedded path. Errors come in file order
(the first bad line is the one named).

Left out: TSV and other delimiters (a CSV header that is one column holding ``;``, a tab or ``|`` is
refused naming the delimiter), compressions other than gzip, gzipped Parquet, a JSON object whose rows
sit under a key (``{"data": [...]}``), and schema checks beyond "these fields are non-empty strings",
which belong to each task.
"""

from __future__ import annotations

import codecs
import csv
import gzip
import json
import re
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property, partial
from pathlib import Path
from typing import Any

from srd_worker.errors import DatasetError
from srd_worker.tasks.base import Item

#: Default upper bound on one row's size in bytes (without the line break).
DEFAULT_MAX_ROW_BYTES: int = 1_000_000

_PARQUET_MAGIC = b"PAR1"
_GZIP_MAGIC = b"\x1f\x8b"
#: Errors a gzip stream raises on bad or truncated data (BadGzipFile is an OSError).
_GZIP_ERRORS = (OSError, EOFError, zlib.error)
_BOM = b"\xef\xbb\xbf"
#: A ``\\uD800``-``\\uDFFF`` escape: JSON's only way to put a lone surrogate (not Unicode text) in a string
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _long_number(exc: ValueError) -> str:
    """The message for the one ValueError ``json`` raises besides a syntax error: an integer literal longer
    than Python converts (``sys.get_int_max_str_digits``, 4300 digits by default)."""
    return f"a number too long to read ({str(exc).split(';')[0]}): write it as a string"


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' ``object_pairs_hook``: an object whose key repeats is refused (JSON leaves its meaning
    open; Python's json would keep the last value silently)."""
    row = dict(pairs)
    if len(row) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return row


def _has_lone_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(v) for v in value)
    return False


class DatasetRowError(DatasetError):
    """A ``DatasetError`` located by data row (Parquet) instead of line: ``FILE, row N, field 'F': ...``."""

    def __init__(self, message: str, *, path: str, row: int, field: str | None = None) -> None:
        super().__init__(message, path=path, field=field)
        self.row = row
        where = [path, f"row {row}"] + ([f"field '{field}'"] if field is not None else [])
        Exception.__init__(self, f"{', '.join(where)}: {message}")


def dataset_error(
    message: str, *, path: str | Path, at: int | None = None, field: str | None = None, unit: str = "line"
) -> DatasetError:
    """A ``DatasetError`` for ``path`` at line ``at`` (``unit="line"``) or data row ``at`` (``unit="row"``)."""
    if unit == "row" and at is not None:
        return DatasetRowError(message, path=str(path), row=at, field=field)
    return DatasetError(message, path=str(path), line=at, field=field)


def _check_file(path: str | Path, kind: str) -> str:
    p = Path(path)
    where = str(p)
    if not p.exists():
        raise DatasetError("file not found", path=where)
    if p.is_dir():
        raise DatasetError(f"is a directory, not a {kind} file", path=where)
    return where


def is_gzip(path: str | Path) -> bool:
    """True when the file at ``path`` starts with the gzip magic bytes."""
    try:
        with open(path, "rb") as fh:
            return fh.read(2) == _GZIP_MAGIC
    except OSError:
        return False


def _open_file(path: str | Path, kind: str) -> tuple[str, Any]:
    """The file opened for binary reading; a gzip file (by its magic bytes) decompressed as it is read."""
    where = _check_file(path, kind)
    try:
        if is_gzip(where):
            return where, gzip.open(where, "rb")
        return where, open(where, "rb")  # noqa: SIM115 - closed by the generator that reads it
    except OSError as exc:
        raise DatasetError(f"cannot read file: {exc.strerror or exc}", path=where) from exc


def _lines(fh: Any, where: str, max_row_bytes: int, *, keep_cr: bool = False) -> Iterator[tuple[int, bytes]]:
    """(line number, raw line without its line break) for every line of ``fh``, one line in memory at a
    time; a line longer than ``max_row_bytes`` (not counting a final "\r") is refused without reading it
    whole. ``keep_cr`` leaves a "\r" before the "\n" on the line (CSV: a quoted value spanning CRLF lines
    keeps its "\r\n"). A leading UTF-8 byte-order mark is dropped."""
    lineno = 0
    cap = max_row_bytes + 2  # the line, a possible "\r" and the "\n"
    while True:
        try:
            raw = fh.readline(cap + (len(_BOM) if lineno == 0 else 0))
        except _GZIP_ERRORS as exc:
            raise _read_error(exc, fh, where, lineno + 1) from exc
        if not raw:
            return
        lineno += 1
        if lineno == 1:
            raw = raw.removeprefix(_BOM)
        ended = raw.endswith(b"\n")
        raw = raw.removesuffix(b"\n")
        cr = raw.endswith(b"\r")
        raw = raw.removesuffix(b"\r")
        if not ended and len(raw) > max_row_bytes:
            size = len(raw)
            for more in iter(partial(_readline, fh, where, lineno), b""):  # measure the rest of the line
                size += len(more.removesuffix(b"\n").removesuffix(b"\r"))
                if more.endswith(b"\n"):
                    break
            _check_size(size, max_row_bytes, where, lineno)
        _check_size(len(raw), max_row_bytes, where, lineno)
        yield lineno, raw + b"\r" if keep_cr and cr else raw


def _read_error(exc: BaseException, fh: Any, where: str, lineno: int) -> DatasetError:
    if isinstance(fh, gzip.GzipFile):
        return DatasetError(f"not a readable gzip file: {exc}", path=where, line=lineno)
    return DatasetError(f"cannot read file: {getattr(exc, 'strerror', None) or exc}", path=where)


def _readline(fh: Any, where: str, lineno: int) -> bytes:
    try:
        return bytes(fh.readline(1 << 20))
    except _GZIP_ERRORS as exc:
        raise _read_error(exc, fh, where, lineno) from exc


def _decode_line(raw: bytes, where: str, lineno: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(
            f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})",
            path=where,
            line=lineno,
        ) from exc


def _check_size(size: int, max_row_bytes: int, where: str, at: int, unit: str = "line") -> None:
    if size > max_row_bytes:
        raise dataset_error(
            f"row is {size:,} bytes, more than the limit of {max_row_bytes:,} bytes",
            path=where,
            at=at,
            unit=unit,
        )


def iter_jsonl(
    path: str | Path, *, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Stream a JSON Lines file as ``(line_number, row)`` pairs (1-based), one line in memory at a time.

    Raises ``DatasetError`` (naming the file, and the line where there is one) if the file is missing, is
    a directory, cannot be read, has no rows, or a line is not UTF-8, is longer than ``max_row_bytes``,
    is not valid JSON, is not a JSON object, repeats a key in one object, or holds a lone surrogate
    escape (``\\ud800`` without its pair: not Unicode text, which no store or encoder can write).
    """
    where, fh = _open_file(path, "JSON Lines")
    seen = False
    with fh:
        for lineno, raw in _lines(fh, where, max_row_bytes):
            text = _decode_line(raw, where, lineno)
            if not text.strip():
                continue
            try:
                row = json.loads(text, object_pairs_hook=_unique_keys)
            except json.JSONDecodeError as exc:
                raise DatasetError(
                    f"malformed JSON: {exc.msg} (column {exc.colno}){'' if seen else _read_as_jsonl(where)}",
                    path=where,
                    line=lineno,
                ) from exc
            except _DuplicateKey as exc:
                raise DatasetError(
                    f"key {exc.key!r} appears twice in one JSON object", path=where, line=lineno
                ) from None
            except ValueError as exc:  # after JSONDecodeError, its subclass: an integer too long to convert
                raise DatasetError(_long_number(exc), path=where, line=lineno) from None
            if not isinstance(row, dict):
                raise DatasetError(
                    f"row is a JSON {_json_type(row)}, expected a JSON object", path=where, line=lineno
                )
            if _SURROGATE_ESCAPE.search(text):  # a pair makes one character; a lone one is not text
                _check_surrogates(row, partial(dataset_error, path=where, at=lineno))
            seen = True
            yield lineno, row
    if not seen:
        raise DatasetError("file is empty (no rows)", path=where)


def _read_as_jsonl(where: str) -> str:
    """What to add to the first row's JSON error when the file's suffix is not a JSON one: it was read as
    JSON Lines only because srdq knows no other reader for it (``a.tsv``, ``data.txt``)."""
    suffix = _data_suffix(Path(where))
    if not suffix or suffix in _JSON_SUFFIXES:
        return ""
    return (
        f"; a {suffix} file is read as JSON Lines (srdq reads .jsonl, .json, .ndjson, .csv, .parquet and "
        ".pq files, .gz too)"
    )


def read_jsonl(
    path: str | Path, *, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES
) -> list[tuple[int, dict[str, Any]]]:
    """``iter_jsonl`` as a list."""
    return list(iter_jsonl(path, max_row_bytes=max_row_bytes))


def _check_surrogates(row: dict[str, Any], error: Callable[..., DatasetError]) -> None:
    """Raise ``error(message, field=...)`` when a key or value of ``row`` holds a lone surrogate."""
    for key, value in row.items():
        bad_key = _has_lone_surrogate(key)
        if bad_key or _has_lone_surrogate(value):
            raise error(
                f"{'a key ' if bad_key else ''}holds a lone surrogate escape (\\uD800-\\uDFFF without its "
                "pair), which is not Unicode text",
                field=None if bad_key else key,
            )


_JSON_SPACE = re.compile(r"[ \t\n\r]*")
#: A JSON decode error this close to the end of what has been read may only mean "read more".
_TRUNCATION_SLACK = 8


def iter_json_array(
    path: str | Path, *, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES, chunk_bytes: int = 1 << 16
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Stream a JSON file whose top-level value is an array of objects as ``(row_number, row)`` pairs
    (1-based elements), holding one element and a read-ahead of ``chunk_bytes`` at a time.

    Raises ``DatasetError`` naming the file (and the row, with line and column for a syntax error) if the
    file is missing, a directory, unreadable, not UTF-8, not a JSON array, an empty array, or an element
    is malformed JSON, not an object, over ``max_row_bytes``, repeats a key or holds a lone surrogate
    escape; also a trailing comma, a missing closing ``]``, or anything but whitespace after it. Lines
    and columns count characters from 1, as editors do.
    """
    where, fh = _open_file(path, "JSON")
    decoder = json.JSONDecoder(object_pairs_hook=_unique_keys)
    utf8 = codecs.getincrementaldecoder("utf-8")()
    buf = ""
    pos = 0
    eof = False
    started = False
    lines_before = 0  # line breaks in the text already dropped from buf
    column_before = 0  # characters of buf's first line that were dropped with it

    def place(i: int) -> str:
        line = lines_before + buf.count("\n", 0, i) + 1
        line_start = buf.rfind("\n", 0, i) + 1
        column = i - line_start + (column_before if line_start == 0 else 0) + 1
        return f"line {line}, column {column}"

    def more() -> bool:
        """Read on until some text is added to ``buf`` (dropping what was consumed); False at the end."""
        nonlocal eof, started
        while not eof:
            try:
                data = fh.read(chunk_bytes)
            except _GZIP_ERRORS as exc:
                raise _read_error(exc, fh, where, lines_before + buf.count("\n") + 1) from exc
            eof = not data
            try:
                piece = utf8.decode(data, final=eof)
            except UnicodeDecodeError as exc:
                keep(exc.object[: exc.start].decode("utf-8"))
                raise DatasetError(
                    f"not valid UTF-8 (byte 0x{exc.object[exc.start]:02x} at {place(len(buf))})", path=where
                ) from exc
            if piece and not started:
                piece = piece.removeprefix("\ufeff")
                started = True
            if piece:
                keep(piece)
                return True
        return False

    def keep(piece: str) -> None:
        """Drop the text before ``pos`` (counting its lines) and append ``piece``."""
        nonlocal buf, pos, lines_before, column_before
        dropped = buf[:pos]
        breaks = dropped.count("\n")
        lines_before += breaks
        column_before = (column_before if not breaks else 0) + len(dropped) - (dropped.rfind("\n") + 1)
        buf = buf[pos:] + piece
        pos = 0

    def next_char() -> str:
        """The next non-whitespace character, ``pos`` on it ("" at the end of the file)."""
        nonlocal pos
        while True:
            pos = _JSON_SPACE.match(buf, pos).end()  # type: ignore[union-attr]  # matches the empty string
            if pos < len(buf):
                return buf[pos]
            if not more():
                return ""

    def element(n: int) -> tuple[Any, int]:
        """Decode the value at ``pos`` (row ``n``), reading more as long as it may be incomplete."""
        while True:
            try:
                return decoder.raw_decode(buf, pos)
            except json.JSONDecodeError as exc:
                maybe_cut = exc.pos >= len(buf) - _TRUNCATION_SLACK or exc.msg.startswith("Unterminated")
                if maybe_cut and len(buf) - pos <= max_row_bytes and more():
                    continue
                if maybe_cut and not eof:
                    _check_size(len(buf[pos:].encode("utf-8")), max_row_bytes, where, n, unit="row")
                raise DatasetRowError(
                    f"malformed JSON: {exc.msg} ({place(exc.pos)})", path=where, row=n
                ) from exc
            except _DuplicateKey as exc:
                raise DatasetRowError(
                    f"key {exc.key!r} appears twice in one JSON object", path=where, row=n
                ) from None
            except ValueError as exc:  # after JSONDecodeError, its subclass: an integer too long to convert
                raise DatasetRowError(_long_number(exc), path=where, row=n) from None

    def syntax(message: str, n: int) -> DatasetError:
        return (
            DatasetRowError(f"{message} ({place(pos)})", path=where, row=n)
            if n
            else DatasetError(f"{message} ({place(pos)})", path=where)
        )

    with fh:
        first = next_char()
        if not first:
            raise DatasetError("file is empty (no rows)", path=where)
        if first != "[":
            raise syntax(f"expected a JSON array of objects, found {first!r}", 0)
        pos += 1
        n = 0
        if next_char() == "]":
            raise DatasetError("file is empty (a JSON array with no rows)", path=where)
        while True:
            if not next_char():
                raise DatasetRowError(
                    "the file ends inside the JSON array (no closing ']')", path=where, row=n + 1
                )
            n += 1
            start = pos
            row, pos = element(n)
            if not isinstance(row, dict):
                raise DatasetRowError(
                    f"row is a JSON {_json_type(row)}, expected a JSON object", path=where, row=n
                )
            raw = buf[start:pos]
            _check_size(len(raw.encode("utf-8")), max_row_bytes, where, n, unit="row")
            if _SURROGATE_ESCAPE.search(raw):
                _check_surrogates(row, partial(dataset_error, path=where, at=n, unit="row"))
            yield n, row
            after = next_char()
            if after == "]":
                break
            if not after:
                raise DatasetRowError(
                    "the file ends inside the JSON array (no closing ']')", path=where, row=n
                )
            if after != ",":
                raise syntax(f"expected ',' or ']' after the row, found {after!r}", n)
            pos += 1
            if next_char() == "]":
                raise syntax("a trailing comma after the last row (not JSON)", n)
        pos += 1
        if next_char():
            raise syntax("text after the JSON array's closing ']'", 0)


def iter_csv(
    path: str | Path, *, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES
) -> Iterator[tuple[int, dict[str, str]]]:
    """Stream a CSV file with a header line as ``(line_number, row)`` pairs (the line a record starts on),
    one record in memory at a time.

    Raises ``DatasetError`` naming the file and line if the file is missing, unreadable, empty, has a
    blank or repeated column name, a line that is not UTF-8, a record over ``max_row_bytes``, malformed
    quoting, or a record with more or fewer values than the header has columns.
    """
    where, fh = _open_file(path, "CSV")
    sizes: list[int] = []  # byte sizes of the lines read since the current record started

    def texts() -> Iterator[str]:
        for lineno, raw in _lines(fh, where, max_row_bytes, keep_cr=True):
            sizes.append(len(raw.removesuffix(b"\r")))
            yield _decode_line(raw, where, lineno) + "\n"

    # A record within the limit may still hold a long field: never let csv's own 128 KiB cap decide.
    csv.field_size_limit(max(csv.field_size_limit(), max_row_bytes + 1))
    header: list[str] | None = None
    seen = False
    consumed = 0  # lines read so far: the next record starts on line consumed + 1
    with fh:
        reader = csv.reader(texts(), strict=True)
        while True:
            start = consumed + 1
            try:
                record = next(reader)
            except StopIteration:
                break
            except csv.Error as exc:
                raise DatasetError(
                    f"malformed CSV: {exc} (in the record starting on this line)", path=where, line=start
                ) from exc
            consumed = reader.line_num
            record_bytes = sum(sizes) + (len(sizes) - 1)
            sizes.clear()
            if not record or (len(record) == 1 and not record[0].strip()):
                continue  # blank line
            _check_size(record_bytes, max_row_bytes, where, start)
            if header is None:
                header = _check_header(record, where, start)
                continue
            if len(record) != len(header):
                raise DatasetError(
                    f"malformed CSV: the row has {len(record)} values, the header has {len(header)} columns",
                    path=where,
                    line=start,
                )
            seen = True
            yield start, dict(zip(header, record, strict=True))
    if header is None:
        raise DatasetError("file is empty (no rows)", path=where)
    if not seen:
        raise DatasetError("file is empty (a header line but no data rows)", path=where)


def read_csv(
    path: str | Path, *, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES
) -> list[tuple[int, dict[str, str]]]:
    """``iter_csv`` as a list."""
    return list(iter_csv(path, max_row_bytes=max_row_bytes))


def _check_header(record: list[str], where: str, line: int) -> list[str]:
    header = [name.strip() for name in record]
    other = [d for d in ("\t", ";", "|") if len(header) == 1 and d in header[0]]
    if other:  # one column named "question;answer": another delimiter, which would fail on every row
        raise DatasetError(
            f"malformed CSV header: one column named {header[0]!r}; srdq reads comma-separated values, and "
            f"this file looks {other[0]!r}-separated (convert it, e.g. with pandas' sep=)",
            path=where,
            line=line,
        )
    seen: dict[str, int] = {}
    for i, name in enumerate(header, start=1):
        if not name:
            raise DatasetError(f"malformed CSV header: column {i} has no name", path=where, line=line)
        if name in seen:
            raise DatasetError(
                f"malformed CSV header: column name {name!r} is used twice (columns {seen[name]} and {i})",
                path=where,
                line=line,
            )
        seen[name] = i
    return header


def iter_parquet(
    path: str | Path, *, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES, batch_rows: int = 4096
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Stream a Parquet file as ``(row_number, row)`` pairs (1-based data rows), ``batch_rows`` rows in
    memory at a time.

    Raises ``DatasetError`` naming the file (and row) if the file is missing, not Parquet or damaged, has
    no rows, holds a binary value that is not UTF-8, or a row whose values exceed ``max_row_bytes`` as JSON.
    """
    where = _check_file(path, "Parquet")
    try:
        size = Path(where).stat().st_size
    except OSError as exc:
        raise DatasetError(f"cannot read file: {exc.strerror or exc}", path=where) from exc
    if not size:
        raise DatasetError("file is empty (no rows)", path=where)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise DatasetError(
            "reading Parquet needs the pyarrow package (pip install pyarrow)", path=where
        ) from exc

    def unreadable(exc: Exception) -> DatasetError:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        first = re.sub(r"^Could not open Parquet input source '[^']*': ", "", first)  # the file's own name
        return DatasetError(f"not a readable Parquet file: {first}", path=where)

    n = 0
    try:
        parquet = pq.ParquetFile(where)
        batches = parquet.iter_batches(batch_size=batch_rows)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise unreadable(exc) from exc
    names = parquet.schema_arrow.names
    for i, name in enumerate(names):  # a row dict would keep one of them silently (CSV refuses it too)
        if name in names[:i]:
            parquet.close()
            raise DatasetError(
                f"column name {name!r} is used twice (columns {names.index(name) + 1} and {i + 1})",
                path=where,
            )
    with parquet:
        while True:
            try:
                batch = next(batches, None)
                records = [] if batch is None else batch.to_pylist()
            except (pa.ArrowException, OSError, ValueError) as exc:
                raise unreadable(exc) from exc
            if batch is None:
                break
            for record in records:
                n += 1
                yield n, _parquet_record(record, where, n, max_row_bytes)
    if not n:
        raise DatasetError("file is empty (no rows)", path=where)


def _parquet_record(record: dict[str, Any], where: str, n: int, max_row_bytes: int) -> dict[str, Any]:
    for name, value in record.items():
        if isinstance(value, bytes | bytearray):
            try:
                record[name] = bytes(value).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DatasetRowError(
                    f"not valid UTF-8 (byte 0x{value[exc.start]:02x} at offset {exc.start})",
                    path=where,
                    row=n,
                    field=name,
                ) from exc
    size = len(json.dumps(record, default=str, ensure_ascii=False).encode("utf-8"))
    _check_size(size, max_row_bytes, where, n, unit="row")
    return record


def _arrow_files(where: str) -> list[Path]:
    """The Arrow data files of a ``save_to_disk`` folder, in order (from its ``state.json``)."""
    folder = Path(where)
    if (folder / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in folder.iterdir() if (p / "state.json").is_file())
        raise DatasetError(
            f"is a Hugging Face DatasetDict folder: give one split's folder ({', '.join(splits) or 'no splits'})",
            path=where,
        )
    try:
        state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
        names = [entry["filename"] for entry in state["_data_files"]]
    except FileNotFoundError as exc:
        raise DatasetError(
            "is a directory, not a dataset file or a Hugging Face save_to_disk folder (no state.json)",
            path=where,
        ) from exc
    except KeyError as exc:
        raise DatasetError(
            f"state.json of a save_to_disk folder lacks {exc.args[0]!r}: not written by datasets' save_to_disk",
            path=where,
        ) from exc
    except (OSError, ValueError, TypeError) as exc:
        raise DatasetError(f"unreadable state.json of a save_to_disk folder: {exc}", path=where) from exc
    for name in names:
        if not isinstance(name, str) or Path(name).name != name or not (folder / name).is_file():
            raise DatasetError(f"state.json names a data file that is not there: {name}", path=where)
    return [folder / name for name in names]


def iter_arrow_folder(
    path: str | Path, *, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Stream a Hugging Face ``save_to_disk`` folder as ``(row_number, row)`` pairs (1-based over all its
    Arrow files), one record batch in memory at a time, with pyarrow. ``DatasetError`` naming the folder
    (and row) if it is not such a folder, a file is damaged, it has no rows, or a row is too large."""
    where = str(path)
    if not Path(where).exists():
        raise DatasetError("folder not found", path=where)
    files = _arrow_files(where)
    import pyarrow as pa

    n = 0
    for file in files:
        try:
            with pa.memory_map(str(file)) as source:
                try:
                    reader: Any = pa.ipc.open_stream(source)
                except pa.ArrowInvalid:
                    reader = pa.ipc.open_file(source)
                    batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
                else:
                    batches = iter(reader)
                for batch in batches:
                    for record in batch.to_pylist():
                        n += 1
                        yield n, _parquet_record(record, where, n, max_row_bytes)
        except (pa.ArrowException, OSError, ValueError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise DatasetError(f"unreadable Arrow file {file.name}: {first}", path=where) from exc
    if not n:
        raise DatasetError("dataset is empty (no rows)", path=where)


def read_parquet(
    path: str | Path, *, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES
) -> list[tuple[int, dict[str, Any]]]:
    """``iter_parquet`` as a list."""
    return list(iter_parquet(path, max_row_bytes=max_row_bytes))


def file_format(path: str | Path) -> str:
    """``"csv"``, ``"parquet"``, ``"jsonl"``, ``"json"`` (an array of objects) or ``"arrow"`` (a
    ``save_to_disk`` folder) for ``path``: a folder with ``state.json`` (or ``dataset_dict.json``) is
    ``arrow``; otherwise the suffix decides (under a ``.gz``), else the Parquet magic bytes; a JSON family
    file (or one of no known kind) is ``json`` when its first character is ``[``, else ``jsonl``."""
    p = Path(path)
    if p.is_dir() and ((p / "state.json").is_file() or (p / "dataset_dict.json").is_file()):
        return "arrow"
    suffix = _data_suffix(p)
    if suffix == ".csv":
        return "csv"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    if suffix not in _JSON_SUFFIXES:
        try:
            with open(path, "rb") as fh:
                if fh.read(4) == _PARQUET_MAGIC:
                    return "parquet"
        except OSError:
            pass
    return "json" if _starts_with_array(p) else "jsonl"


#: Suffixes of the JSON family: JSON Lines, or a JSON array by the file's first character.
_JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")


def _data_suffix(path: Path) -> str:
    """The file's format suffix, lower case: the one under a ``.gz`` (``data.jsonl.gz`` → ``.jsonl``)."""
    suffix = path.suffix.lower()
    return Path(path.stem).suffix.lower() if suffix == ".gz" else suffix


def _starts_with_array(path: Path) -> bool:
    """True when the file's first character other than whitespace (and a byte-order mark) is ``[``."""
    try:
        with gzip.open(path, "rb") if is_gzip(path) else open(path, "rb") as fh:
            chunk = fh.read(1 << 16).removeprefix(_BOM)
            for _ in range(64):  # leading whitespace up to 4 MiB
                if not chunk:
                    return False
                head = chunk.lstrip(b" \t\r\n")
                if head:
                    return head.startswith(b"[")
                chunk = fh.read(1 << 16)
    except (OSError, EOFError, zlib.error):
        pass
    return False


#: Streaming reader per format (``file_format``'s names).
READERS: dict[str, Callable[..., Iterator[tuple[int, dict[str, Any]]]]] = {
    "jsonl": iter_jsonl,
    "json": iter_json_array,
    "csv": iter_csv,
    "parquet": iter_parquet,
    "arrow": iter_arrow_folder,
}
#: What each format is called in messages.
FORMAT_NAMES: dict[str, str] = {
    "jsonl": "JSON Lines",
    "json": "JSON",
    "csv": "CSV",
    "parquet": "Parquet",
    "arrow": "Hugging Face save_to_disk",
}


@dataclass(frozen=True)
class Rows:
    """The rows of one file, with helpers that raise errors in that file's terms (line or row).

    ``source()`` starts a fresh streaming pass over the file (validating as it goes); ``rows`` is the
    whole file as a list, read once on first use (``read_rows`` reads it at once unless ``stream=True``).
    """

    path: str
    format: str
    source: Callable[[], Iterator[tuple[int, dict[str, Any]]]]

    @cached_property
    def rows(self) -> list[tuple[int, dict[str, Any]]]:
        return list(self.source())

    @property
    def unit(self) -> str:
        """How positions are named in errors: ``"line"`` (JSONL, CSV) or ``"row"`` (JSON arrays, Parquet,
        Arrow)."""
        return "row" if self.format in ("json", "parquet", "arrow") else "line"

    @property
    def json_types(self) -> bool:
        """Whether values are named by their JSON types in errors (``JSON number``): the JSON formats."""
        return self.format in ("jsonl", "json")

    def __iter__(self) -> Iterator[tuple[int, dict[str, Any]]]:
        return iter(self.__dict__["rows"]) if "rows" in self.__dict__ else self.source()

    def __len__(self) -> int:
        return len(self.rows)

    def error(self, message: str, at: int | None = None, field: str | None = None) -> DatasetError:
        return dataset_error(message, path=self.path, at=at, field=field, unit=self.unit)

    def require(self, at: int, row: dict[str, Any], fields: Iterable[str]) -> None:
        """Raise naming the field if one of ``fields`` is missing, not a string, or blank."""
        require_fields(self.path, at, row, fields, unit=self.unit, json_types=self.json_types)

    def text(self, at: int, row: dict[str, Any], field: str, *, numbers: bool = False) -> str:
        """The required field as stripped text; ``numbers=True`` also accepts a number (made text)."""
        value = row.get(field)
        if numbers and isinstance(value, int | float) and not isinstance(value, bool):
            return _number_text(value)
        self.require(at, row, (field,))
        return str(value).strip()

    def row_id(self, at: int, row: dict[str, Any], field: str) -> str:
        return row_id(self.path, at, row, field, unit=self.unit, json_types=self.json_types)

    def check_unique_ids(self, items_with_lines: Sequence[tuple[int, str | Item]]) -> None:
        check_unique_ids(self.path, items_with_lines, unit=self.unit)

    def items(self, make_item: Callable[[Rows, int, dict[str, Any]], Item]) -> list[Item]:
        """One ``Item`` per row from ``make_item(rows, at, row)`` (which validates the row), then the
        check that no two rows share an id. Every task's ``load`` is this loop."""
        items = [make_item(self, at, row) for at, row in self.rows]
        self.check_unique_ids([(at, item.id) for (at, _row), item in zip(self.rows, items, strict=True)])
        return items

    def iter_items(
        self, make_item: Callable[[Rows, int, dict[str, Any]], Item]
    ) -> Iterator[tuple[int, Item]]:
        """``(at, item)`` per row, streamed: ``items`` without the list and without the duplicate-id
        check (the caller checks ids, e.g. ``srd_worker.tasks.spool``)."""
        for at, row in self:
            yield at, make_item(self, at, row)


def read_rows(
    path: str | Path,
    *,
    max_row_bytes: int = DEFAULT_MAX_ROW_BYTES,
    fmt: str | None = None,
    stream: bool = False,
) -> Rows:
    """Read and validate a dataset file in any supported format (see ``file_format``). With
    ``stream=True`` nothing is read yet (only the file's existence is checked): iterate the result."""
    fmt = fmt or file_format(path)
    reader = READERS[fmt]
    rows = Rows(path=str(path), format=fmt, source=partial(reader, path, max_row_bytes=max_row_bytes))
    if stream:
        if fmt == "arrow":
            _arrow_files(str(path))
        else:
            _check_file(path, FORMAT_NAMES[fmt])
    else:
        _ = rows.rows
    return rows


def require_fields(
    path: str | Path,
    line: int,
    row: dict[str, Any],
    fields: Iterable[str],
    *,
    unit: str = "line",
    json_types: bool = True,
) -> None:
    """Raise ``DatasetError`` naming the field if one of ``fields`` is missing, not a string, or blank."""
    for name in fields:
        if name not in row:
            raise dataset_error("missing required field", path=path, at=line, field=name, unit=unit)
        value = row[name]
        if not isinstance(value, str):
            kind = f"JSON {_json_type(value)}" if json_types else _json_type(value)
            raise dataset_error(f"must be a string, got {kind}", path=path, at=line, field=name, unit=unit)
        if not value.strip():
            raise dataset_error("is empty", path=path, at=line, field=name, unit=unit)


def check_unique_ids(
    path: str | Path, items_with_lines: Sequence[tuple[int, str | Item]], *, unit: str = "line"
) -> None:
    """Raise ``DatasetError`` naming both lines (or rows) if two rows share an id.

    ``items_with_lines`` holds ``(line_number, id)`` pairs in file order. Objects with an ``id`` attribute
    (such as ``Item``) are accepted in place of the id string.
    """
    first_seen: dict[str, int] = {}
    for line, item in items_with_lines:
        item_id = item if isinstance(item, str) else str(item.id)
        if item_id in first_seen:
            raise dataset_error(
                f"duplicate id {item_id!r} (first used on {unit} {first_seen[item_id]})",
                path=path,
                at=line,
                unit=unit,
            )
        first_seen[item_id] = line


def row_id(
    path: str | Path,
    line: int,
    row: dict[str, Any],
    field: str,
    *,
    unit: str = "line",
    json_types: bool = True,
) -> str:
    """The row's id from ``field`` if present (a non-blank string or an integer), else ``line-<N>``
    (``row-<N>`` for Parquet)."""
    if field not in row or row[field] is None:
        return f"{unit}-{line}"
    value = row[field]
    if isinstance(value, bool) or not isinstance(value, str | int):
        kind = f"JSON {_json_type(value)}" if json_types else _json_type(value)
        raise dataset_error(
            f"must be a string or integer id, got {kind}", path=path, at=line, field=field, unit=unit
        )
    text = str(value).strip()
    if not text:
        raise dataset_error("is empty", path=path, at=line, field=field, unit=unit)
    return text


def _number_text(value: int | float) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _json_type(value: object) -> str:
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if value is None:
        return "null"
    if isinstance(value, str):
        return "string"
    return type(value).__name__


class RowTask:
    """A task whose items are its dataset's rows, one ``_item`` each (read with ``read_rows``, capped at
    ``max_row_bytes`` per row): the shared ``__init__`` and ``load`` of the row-per-item tasks."""

    def __init__(self, *, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES) -> None:
        self.max_row_bytes = max_row_bytes

    def load(self, path: str | Path) -> list[Item]:
        return read_rows(path, max_row_bytes=self.max_row_bytes).items(self._item)

    def _item(self, rows: Rows, at: int, row: dict[str, Any]) -> Item:
        raise NotImplementedError
