"""A corpus of malformed dataset files in every supported format (JSON Lines, JSON arrays, CSV, Parquet),
each made by the test: each must be refused before anything is stored, with one clear message naming the
file and the line (JSON arrays and Parquet: row) and field where there is one. Plus ``srdq run`` on a few of them, in a subprocess:
exit code != 0, one line of error output, and no output folder."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from srd_worker.errors import DatasetError
from srd_worker.spec import prepare_run
from tests.cli import run_srdq, srdq_env, tiny_run_args

GPQA_HEADER = [
    "Question",
    "Correct Answer",
    "Incorrect Answer 1",
    "Incorrect Answer 2",
    "Incorrect Answer 3",
    "Record ID",
]
GPQA_ROW = ["What is 1+1?", "2", "3", "4", "5"]
HOTPOT = {
    "id": "h1",
    "question": "Who?",
    "answer": "Ada",
    "context": [{"title": "Ada", "paragraph_text": "Ada wrote the first program."}],
}


def _csv(*records: list[str]) -> bytes:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(records)
    return buf.getvalue().encode("utf-8")


def _jsonl(*rows: dict[str, Any]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode("utf-8")


def _parquet(rows: list[dict[str, Any]], schema: Any = None) -> bytes:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    table = (
        pa.Table.from_pylist(rows, schema=schema) if rows else pa.table({"prompt": pa.array([], pa.string())})
    )
    pq.write_table(table, sink)
    return sink.getvalue()


def _parquet_table(names: list[str], columns: list[list[Any]]) -> bytes:
    """A Parquet file from columns by position (names may repeat, which from_pylist cannot write)."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.Table.from_arrays([pa.array(c) for c in columns], names=names), sink)
    return sink.getvalue()


def _binary_schema() -> Any:
    pa = pytest.importorskip("pyarrow")
    return pa.schema([("prompt", pa.binary())])


@dataclass
class Case:
    suffix: str
    content: Callable[[], bytes | None]  # None: the file is not created
    message: str  # expected str(error), with {path} for the file; ending in "...": the start of it
    task: str = "auto"
    fields: dict[str, str] = field(default_factory=dict)
    max_row_bytes: int | None = None


CASES: dict[str, Case] = {
    # --- JSON Lines
    "jsonl_missing_file": Case(".jsonl", lambda: None, "{path}: file not found"),
    "jsonl_empty": Case(".jsonl", lambda: b"", "{path}: file is empty (no rows)"),
    "jsonl_non_utf8": Case(
        ".jsonl",
        lambda: _jsonl(HOTPOT) + b'{"question": "caf\xe9"}\n',
        "{path}, line 2: not valid UTF-8 (byte 0xe9 at column 18)",
        task="hotpotqa",
    ),
    "jsonl_malformed_json": Case(
        ".jsonl",
        lambda: _jsonl(HOTPOT, {**HOTPOT, "id": "h2"}) + b'{"id": "h3",\n',
        "{path}, line 3: malformed JSON: Expecting property name enclosed in double quotes (column 13)",
        task="hotpotqa",
    ),
    "jsonl_hotpot_missing_context": Case(
        ".jsonl",
        lambda: _jsonl(HOTPOT, {k: v for k, v in HOTPOT.items() if k != "context"} | {"id": "h2"}),
        "{path}, line 2, field 'context': missing required field",
        task="hotpotqa",
    ),
    "jsonl_hotpot_duplicate_id": Case(
        ".jsonl", lambda: _jsonl(HOTPOT, HOTPOT), "{path}, line 2: duplicate id 'h1' (first used on line 1)"
    ),
    "jsonl_alpaca_empty_instruction": Case(
        ".jsonl",
        lambda: _jsonl({"instruction": "Hi"}, {"instruction": " "}),
        "{path}, line 2, field 'instruction': is empty",
    ),
    "jsonl_number_too_long": Case(
        ".jsonl",
        lambda: _jsonl({"instruction": "Hi"}) + b'{"instruction": "Hi", "n": ' + b"9" * 5000 + b"}\n",
        "{path}, line 2: a number too long to read (Exceeds the limit (4300 digits) for integer string "
        "conversion: value has 5000 digits): write it as a string",
    ),
    "json_number_too_long": Case(
        ".json",
        lambda: b'[{"instruction": "Hi", "n": ' + b"9" * 5000 + b"}]",
        "{path}, row 1: a number too long to read (Exceeds the limit (4300 digits) for integer string "
        "conversion: value has 5000 digits): write it as a string",
    ),
    "jsonl_over_size_limit": Case(
        ".jsonl",
        lambda: _jsonl({"instruction": "short"}, {"instruction": "x" * 200}),
        "{path}, line 2: row is 219 bytes, more than the limit of 100 bytes",
        max_row_bytes=100,
    ),
    "jsonl_generic_answer_not_text": Case(
        ".jsonl",
        lambda: _jsonl({"q": "1+1?", "a": [2]}),
        "{path}, line 1, field 'a': must be a string, got JSON array",
        fields={"prompt": "q", "answer": "a"},
    ),
    # --- CSV
    "csv_empty": Case(".csv", lambda: b"", "{path}: file is empty (no rows)", task="gpqa"),
    "csv_header_only": Case(
        ".csv", lambda: _csv(GPQA_HEADER), "{path}: file is empty (a header line but no data rows)"
    ),
    "csv_non_utf8": Case(
        ".csv",
        lambda: _csv(GPQA_HEADER, [*GPQA_ROW, "r1"]) + b"Caf\xc3,2,3,4,5,r2\n",
        "{path}, line 3: not valid UTF-8 (byte 0xc3 at column 4)",
        task="gpqa",
    ),
    "csv_unclosed_quote": Case(
        ".csv",
        lambda: _csv(GPQA_HEADER) + b'"What is\n1+1?,2,3,4,5,r1\n',
        "{path}, line 2: malformed CSV: unexpected end of data (in the record starting on this line)",
        task="gpqa",
    ),
    "csv_stray_quote": Case(
        ".csv",
        lambda: _csv(GPQA_HEADER) + b'"What" is 1+1?,2,3,4,5,r1\n',
        "{path}, line 2: malformed CSV: ',' expected after '\"' (in the record starting on this line)",
        task="gpqa",
    ),
    "csv_too_many_values": Case(
        ".csv",
        lambda: _csv(GPQA_HEADER, [*GPQA_ROW, "r1"], [*GPQA_ROW, "r2", "extra"]),
        "{path}, line 3: malformed CSV: the row has 7 values, the header has 6 columns",
    ),
    "csv_duplicate_column": Case(
        ".csv",
        lambda: _csv(["prompt", "answer", "prompt"], ["a", "b", "c"]),
        "{path}, line 1: malformed CSV header: column name 'prompt' is used twice (columns 1 and 3)",
        task="generic",
    ),
    "csv_blank_column_name": Case(
        ".csv",
        lambda: _csv(["prompt", " "], ["a", "b"]),
        "{path}, line 1: malformed CSV header: column 2 has no name",
        task="generic",
    ),
    "csv_gpqa_missing_column": Case(
        ".csv",
        lambda: _csv(GPQA_HEADER[:4] + ["Record ID"], [*GPQA_ROW[:4], "r1"]),
        "{path}, line 2, field 'Incorrect Answer 3': missing required field",
        task="gpqa",
    ),
    "csv_gpqa_empty_answer": Case(
        ".csv",
        lambda: _csv(GPQA_HEADER, [*GPQA_ROW, "r1"], ["Q2", "", "3", "4", "5", "r2"]),
        "{path}, line 3, field 'Correct Answer': is empty",
    ),
    "csv_gpqa_duplicate_id": Case(
        ".csv",
        lambda: _csv(GPQA_HEADER, [*GPQA_ROW, "r1"], [*GPQA_ROW, "r2"], [*GPQA_ROW, "r1"]),
        "{path}, line 4: duplicate id 'r1' (first used on line 2)",
    ),
    "csv_over_size_limit": Case(
        ".csv",
        lambda: _csv(["prompt"], ["ok"], ["y" * 300]),
        "{path}, line 3: row is 300 bytes, more than the limit of 200 bytes",
        fields={"prompt": "prompt"},
        max_row_bytes=200,
    ),
    # --- Parquet
    "parquet_not_parquet": Case(
        ".parquet",
        lambda: b"prompt,answer\n1,2\n",
        "{path}: not a readable Parquet file: Parquet magic bytes not found...",
        fields={"prompt": "prompt"},
    ),
    "parquet_truncated": Case(
        ".parquet",
        lambda: _parquet([{"prompt": "a"}] * 50)[:-20],
        "{path}: not a readable Parquet file: Parquet magic bytes not found...",
        fields={"prompt": "prompt"},
    ),
    "parquet_zero_rows": Case(
        ".parquet", lambda: _parquet([]), "{path}: file is empty (no rows)", fields={"prompt": "prompt"}
    ),
    "parquet_missing_column": Case(
        ".parquet",
        lambda: _parquet([{"text": "a"}, {"text": "b"}]),
        "{path}, row 1, field 'question': missing required field",
        fields={"prompt": "question"},
    ),
    "parquet_duplicate_column": Case(
        ".parquet",
        lambda: _parquet_table(["prompt", "answer", "prompt"], [["a"], ["b"], ["c"]]),
        "{path}: column name 'prompt' is used twice (columns 1 and 3)",
        task="generic",
    ),
    "parquet_null_value": Case(
        ".parquet",
        lambda: _parquet([{"prompt": "a"}, {"prompt": None}]),
        "{path}, row 2, field 'prompt': must be a string, got null",
        task="generic",
    ),
    "parquet_duplicate_id": Case(
        ".parquet",
        lambda: _parquet([{"k": 1, "p": "a"}, {"k": 2, "p": "b"}, {"k": 1, "p": "c"}]),
        "{path}, row 3: duplicate id '1' (first used on row 1)",
        fields={"prompt": "p", "id": "k"},
    ),
    "parquet_non_utf8_binary": Case(
        ".parquet",
        lambda: _parquet([{"prompt": b"ok"}, {"prompt": b"caf\xe9"}], _binary_schema()),
        "{path}, row 2, field 'prompt': not valid UTF-8 (byte 0xe9 at offset 3)",
        task="generic",
    ),
    "parquet_over_size_limit": Case(
        ".parquet",
        lambda: _parquet([{"prompt": "a"}, {"prompt": "z" * 500}]),
        "{path}, row 2: row is 514 bytes, more than the limit of 400 bytes",
        task="generic",
        max_row_bytes=400,
    ),
    "csv_semicolon_separated": Case(
        ".csv",
        lambda: b"question;answer\n1+1?;#### 2\n",
        "{path}, line 1: malformed CSV header: one column named 'question;answer'; srdq reads "
        "comma-separated values, and this file looks ';'-separated (convert it, e.g. with pandas' sep=)",
    ),
    "csv_tab_separated": Case(
        ".csv",
        lambda: b"question\tanswer\n1+1?\t#### 2\n",
        "{path}, line 1: malformed CSV header: one column named 'question\\tanswer'; srdq reads "
        "comma-separated values, and this file looks '\\t'-separated (convert it, e.g. with pandas' sep=)",
    ),
    "tsv_read_as_jsonl": Case(
        ".tsv",
        lambda: b"question\tanswer\n1+1?\t#### 2\n",
        "{path}, line 1: malformed JSON: Expecting value (column 1); a .tsv file is read as JSON Lines "
        "(srdq reads .jsonl, .json, .ndjson, .csv, .parquet and .pq files, .gz too)",
    ),
    # --- JSON (one array of objects)
    "json_empty_array": Case(".json", lambda: b" [ ]\n", "{path}: file is empty (a JSON array with no rows)"),
    "json_row_not_object": Case(
        ".json",
        lambda: b'[{"instruction": "Hi"}, "Hello"]',
        "{path}, row 2: row is a JSON string, expected a JSON object",
    ),
    "json_malformed_row": Case(
        ".json",
        lambda: b'[\n  {"instruction": "Hi"},\n  {"instruction": "Yo",}\n]\n',
        "{path}, row 2: malformed JSON: Expecting property name enclosed in double quotes (line 3, column 24)",
    ),
    "json_trailing_comma": Case(
        ".json",
        lambda: b'[{"instruction": "Hi"},\n]',
        "{path}, row 1: a trailing comma after the last row (not JSON) (line 2, column 1)",
    ),
    "json_no_closing_bracket": Case(
        ".json",
        lambda: b'[{"instruction": "Hi"}, {"instruction": "Yo"}\n',
        "{path}, row 2: the file ends inside the JSON array (no closing ']')",
    ),
    "json_text_after_array": Case(
        ".json",
        lambda: b'[{"instruction": "Hi"}]\n[{"instruction": "Yo"}]\n',
        "{path}: text after the JSON array's closing ']' (line 2, column 1)",
    ),
    "json_missing_field": Case(
        ".json",
        lambda: json.dumps(
            [HOTPOT, {k: v for k, v in HOTPOT.items() if k != "answer"} | {"id": "h2"}]
        ).encode(),
        "{path}, row 2, field 'answer': missing required field",
        task="hotpotqa",
    ),
    "json_duplicate_id": Case(
        ".json",
        lambda: json.dumps([HOTPOT, HOTPOT]).encode(),
        "{path}, row 2: duplicate id 'h1' (first used on row 1)",
    ),
    "json_over_size_limit": Case(
        ".json",
        lambda: json.dumps([{"instruction": "short"}, {"instruction": "x" * 200}], indent=1).encode(),
        "{path}, row 2: row is 224 bytes, more than the limit of 100 bytes",
        max_row_bytes=100,
    ),
}


def _assert_message(message: str, expected: str) -> None:
    # pyarrow words its own errors; for those only the start (ours + pyarrow's first words) is fixed.
    if expected.endswith("..."):
        assert message.startswith(expected[:-3]), message
    else:
        assert message == expected


def _materialise(tmp_path: Path, name: str) -> Path:
    case = CASES[name]
    path = tmp_path / f"{name}{case.suffix}"
    content = case.content()
    if content is not None:
        path.write_bytes(content)
    return path


def test_corpus_is_large_and_covers_every_format() -> None:
    assert len(CASES) >= 15
    assert {c.suffix for c in CASES.values()} == {".jsonl", ".json", ".csv", ".parquet", ".tsv"}
    assert len({c.message for c in CASES.values()}) >= 15  # distinct messages, not one catch-all


@pytest.mark.parametrize("name", sorted(CASES))
def test_malformed_file_gets_its_own_clear_message(tmp_path: Path, name: str) -> None:
    case = CASES[name]
    path = _materialise(tmp_path, name)
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(DatasetError) as info:
        prepare_run(
            dataset=path,
            task=case.task,
            fields=case.fields or None,
            method="sampling",
            params={},
            model="tiny-random-llama",
            reward=None,
            max_row_bytes=case.max_row_bytes,
        )
    message = str(info.value)
    _assert_message(message, case.message.format(path=path))
    assert "\n" not in message and path.name in message
    assert info.value.path == str(path)
    assert sorted(tmp_path.rglob("*")) == before  # nothing written next to the dataset either


CLI_CASES = [
    "jsonl_malformed_json",
    "csv_too_many_values",
    "csv_unclosed_quote",
    "parquet_not_parquet",
    "jsonl_missing_file",
    "json_malformed_row",
]


@pytest.mark.parametrize("name", CLI_CASES)
def test_cli_run_refuses_bad_file_writes_nothing(tmp_path: Path, name: str) -> None:
    case = CASES[name]
    path = _materialise(tmp_path, name)
    out = tmp_path / "OUT"
    args = tiny_run_args(path, out)
    if case.task != "auto":
        args += ["--task", case.task]
    for key, column in case.fields.items():
        args += ["--field", f"{key}={column}"]
    proc = run_srdq(*args, env=srdq_env(SRDQ_DEVICE="cpu", COLUMNS="400"), cwd=tmp_path)
    assert proc.returncode != 0
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    _assert_message(lines[0], f"Error: {case.message.format(path=path)}")
    assert not out.exists()


def test_cli_size_limit_comes_from_settings(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    path.write_bytes(_jsonl({"instruction": "short"}, {"instruction": "x" * 200}))
    out = tmp_path / "OUT"
    proc = run_srdq(*tiny_run_args(path, out), env=srdq_env(SRDQ_MAX_ROW_BYTES="100"), cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"Error: {path}, line 2: row is 219 bytes, more than the limit of 100 bytes"
    assert not out.exists()


def test_other_delimiters_in_a_real_header_are_just_characters(tmp_path: Path) -> None:
    """Only a header that is ONE column holding ';', a tab or '|' reads as another delimiter's file: a
    comma-separated header may name a column with them, and a one-column file's values may hold them."""
    from srd_worker.tasks.loading import read_csv

    several = tmp_path / "several.csv"
    several.write_bytes(b"q;uestion,a|nswer\n1+1?,2\n")
    assert read_csv(several) == [(2, {"q;uestion": "1+1?", "a|nswer": "2"})]
    single = tmp_path / "single.csv"
    single.write_bytes(b"prompt\nhello; world | again\n")
    assert read_csv(single) == [(2, {"prompt": "hello; world | again"})]
