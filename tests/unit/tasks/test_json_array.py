"""Dataset files holding one JSON array of objects (``[{...}, {...}]``): recognised by their first character,\nread one element at a time whatever the read-ahead chunk (multi-byte characters split across chunks\nincluded), and refused with the row, line and column."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from srd_worker.errors import DatasetError
from srd_worker.tasks.loading import file_format, iter_json_array, read_jsonl, read_rows
from srd_worker.tasks.registry import load_items

ROWS = [
    {"question": "Tom has 2 apples and buys 3. How many?", "answer": "#### 5"},
    {"question": "café ☕ costs 4, tea 3: total?", "answer": "#### 7", "id": 12},
    {"question": 'a "quoted" [bracket], {brace} and \\ backslash', "answer": "#### 1"},
    # literals a chunk may cut (tr|ue, nu|ll, -1.|5e3): "read more", not malformed
    {"question": "x", "answer": "#### 2", "flag": True, "off": False, "none": None, "w": -1.5e3},
]


def _write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return path


@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("chunk", [1, 2, 5, 64, 1 << 16])
def test_rows_are_the_same_whatever_the_chunk(tmp_path: Path, indent: int | None, chunk: int) -> None:
    path = _write(tmp_path / "d.json", "\ufeff" + json.dumps(ROWS, indent=indent, ensure_ascii=False))
    assert list(iter_json_array(path, chunk_bytes=chunk)) == list(enumerate(ROWS, start=1))


@pytest.mark.parametrize("chunk", [1, 3, 7, 1 << 16])
def test_error_line_and_column_hold_across_chunks(tmp_path: Path, chunk: int) -> None:
    text = '[\n  {"a": 1},\n  {"a": 2}, {"a": tru}\n]\n'  # the bad value starts on line 3, column 19
    path = _write(tmp_path / "bad.json", text)
    with pytest.raises(DatasetError) as info:
        list(iter_json_array(path, chunk_bytes=chunk))
    assert str(info.value) == f"{path}, row 3: malformed JSON: Expecting value (line 3, column 19)"


def test_a_long_minified_line_counts_columns_across_chunks(tmp_path: Path) -> None:
    body = ", ".join(json.dumps({"k": i}) for i in range(200))  # one line, about 2,000 characters
    path = _write(tmp_path / "one_line.json", f"[{body}, x]")
    with pytest.raises(DatasetError) as info:
        list(iter_json_array(path, chunk_bytes=16))
    column = len(f"[{body}, ") + 1
    assert str(info.value) == f"{path}, row 201: malformed JSON: Expecting value (line 1, column {column})"


def test_detected_by_first_character_not_suffix(tmp_path: Path) -> None:
    array = json.dumps(ROWS)
    lines = "".join(json.dumps(r) + "\n" for r in ROWS)
    cases = {
        "a.json": (array, "json"),
        "b.json": (lines, "jsonl"),  # a .json file of JSON Lines stays JSON Lines
        "c.jsonl": ("\ufeff \n\t" + array, "json"),  # byte-order mark and whitespace before the bracket
        "d.ndjson": (lines, "jsonl"),
        "noext": (array, "json"),
        "e.csv": ("[a,b]\n", "csv"),
    }
    for name, (text, fmt) in cases.items():
        assert file_format(_write(tmp_path / name, text)) == fmt, name
    gz = tmp_path / "f.json.gz"
    gz.write_bytes(gzip.compress(array.encode()))
    assert file_format(gz) == "json"
    assert [row for _, row in read_rows(gz)] == ROWS


def test_tasks_read_it_with_row_ids_and_errors(tmp_path: Path) -> None:
    path = _write(tmp_path / "gsm.json", json.dumps(ROWS, indent=1))
    task, items = load_items(path)
    assert task.name == "gsm8k"
    assert [(i.id, i.gold) for i in items] == [("row-1", "5"), ("12", "7"), ("row-3", "1"), ("row-4", "2")]
    # the same rows as JSON Lines give the same items but line ids: only the numbering differs
    lines = _write(tmp_path / "gsm.jsonl", "".join(json.dumps(r) + "\n" for r in ROWS))
    assert [i.question for i in load_items(lines)[1]] == [i.question for i in items]
    bad = _write(tmp_path / "bad.json", json.dumps([ROWS[0], {"question": "q", "answer": 5.5}]))
    with pytest.raises(
        DatasetError, match=r"bad\.json, row 2, field 'answer': must be a string, got JSON number"
    ):
        load_items(bad, "gsm8k")


def test_streamed_read_checks_only_the_file_until_iterated(tmp_path: Path) -> None:
    path = _write(tmp_path / "late.json", json.dumps(ROWS)[:-1] + ", 7]")
    rows = read_rows(path, stream=True)
    seen = []
    with pytest.raises(
        DatasetError, match=rf"row {len(ROWS) + 1}: row is a JSON number, expected a JSON object"
    ):
        for at, row in rows:
            seen.append((at, row))
    assert seen == list(enumerate(ROWS, start=1))  # errors come in file order, after the good rows


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "file is empty (no rows)"),
        ("  \n", "file is empty (no rows)"),
        ("[", "row 1: the file ends inside the JSON array (no closing ']')"),
        ('[{"a": 1},', "row 2: the file ends inside the JSON array (no closing ']')"),
        ('[{"a": "open', "row 1: malformed JSON: Unterminated string starting at (line 1, column 8)"),
        ('[{"a": 1} , , {"a": 2}]', "row 2: malformed JSON: Expecting value (line 1, column 13)"),
        ('[{"a": 1}; {"a": 2}]', "row 1: expected ',' or ']' after the row, found ';' (line 1, column 10)"),
        ('[{"a": 1, "a": 2}]', "row 1: key 'a' appears twice in one JSON object"),
        (
            '[{"a": "\\udc00"}]',
            "row 1, field 'a': holds a lone surrogate escape (\\uD800-\\uDFFF without its "
            "pair), which is not Unicode text",
        ),
        ('[[{"a": 1}]]', "row 1: row is a JSON array, expected a JSON object"),
        ('[{"a": 1}]]', "text after the JSON array's closing ']' (line 1, column 11)"),
    ],
)
def test_broken_arrays_name_row_and_place(tmp_path: Path, text: str, message: str) -> None:
    # "" and "  " are no array at all: named JSON Lines by detection, read by the JSON reader directly
    path = _write(tmp_path / "x.json", text)
    with pytest.raises(DatasetError) as info:
        list(iter_json_array(path, chunk_bytes=4))
    assert str(info.value) == (f"{path}, {message}" if message.startswith("row") else f"{path}: {message}")


def test_not_utf8_and_not_an_array(tmp_path: Path) -> None:
    path = _write(tmp_path / "latin1.json", b'[{"a": "ok"},\n {"a": "caf\xe9"}]')
    for chunk in (1, 5, 1 << 16):
        with pytest.raises(DatasetError) as info:
            list(iter_json_array(path, chunk_bytes=chunk))
        assert str(info.value) == f"{path}: not valid UTF-8 (byte 0xe9 at line 2, column 12)"
    obj = _write(tmp_path / "obj.json", '{"data": []}')
    with pytest.raises(
        DatasetError, match=r"obj\.json: expected a JSON array of objects, found '\{' \(line 1"
    ):
        list(iter_json_array(obj))
    # detection keeps a top-level object JSON Lines, whose reader names it a one-row file
    assert read_jsonl(obj) == [(1, {"data": []})]


def test_row_limit_counts_the_element_bytes(tmp_path: Path) -> None:
    # 40 two-byte characters: 89 bytes, 49 characters
    element = json.dumps({"q": "é" * 40}, ensure_ascii=False)
    path = _write(tmp_path / "limit.json", f"[{element}]")
    assert list(iter_json_array(path, max_row_bytes=89)) == [(1, {"q": "é" * 40})]
    with pytest.raises(DatasetError, match=r"row 1: row is 89 bytes, more than the limit of 88 bytes"):
        list(iter_json_array(path, max_row_bytes=88))
    # an element that never closes is refused as too large once it passes the limit, without reading on
    endless = _write(tmp_path / "endless.json", '[{"q": "' + "z" * 10_000)
    with pytest.raises(DatasetError, match=r"row 1: row is \d[\d,]* bytes, more than the limit of 500 bytes"):
        list(iter_json_array(endless, max_row_bytes=500, chunk_bytes=64))


_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.dictionaries(st.text(max_size=6), _values, max_size=4), min_size=1, max_size=6),
    indent=st.sampled_from([None, 0, 1, 4]),
    ascii_only=st.booleans(),
    chunk=st.integers(min_value=1, max_value=40),
)
def test_any_array_of_objects_reads_as_json_loads_does(
    tmp_path_factory: pytest.TempPathFactory, rows: list, indent: int | None, ascii_only: bool, chunk: int
) -> None:
    """Whatever the objects, the layout, the escapes and the chunk: the rows are what ``json.loads`` reads."""
    path = tmp_path_factory.mktemp("fuzz") / "rows.json"
    path.write_text(json.dumps(rows, indent=indent, ensure_ascii=ascii_only), encoding="utf-8")
    assert [row for _, row in iter_json_array(path, chunk_bytes=chunk)] == json.loads(path.read_text("utf-8"))
