"""A corpus of broken dataset files: each must fail with a DatasetError naming the file, line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from srd_worker.errors import DatasetError
from srd_worker.tasks.gsm8k import GSM8KTask
from srd_worker.tasks.loading import check_unique_ids, read_jsonl, require_fields
from srd_worker.tasks.math500 import Math500Task
from srd_worker.tasks.registry import detect_task, load_items

GOOD_MATH = {
    "problem": "What is $1+1$?",
    "answer": "2",
    "subject": "Algebra",
    "level": 1,
    "unique_id": "test/algebra/1.json",
}
GOOD_GSM = {"question": "Tom has 2 apples and buys 3. How many?", "answer": "2+3=<<2+3=5>>5\n#### 5"}


def _row(base: dict, **changes: object) -> str:
    row = {**base, **changes}
    for key, value in changes.items():
        if value is _DROP:
            del row[key]
    return json.dumps(row)


_DROP = object()


def _lines(*lines: str) -> bytes:
    return ("\n".join(lines) + "\n").encode("utf-8")


_BIG_ROW = _row(GOOD_GSM, question="x" * 1_000_001)

# name -> (file content as bytes, or None for "do not create", or "dir"), task, line, field, message tail
Case = tuple[bytes | str | None, str, int | None, str | None, str]

CASES: dict[str, Case] = {
    "missing": (None, "math500", None, None, "file not found"),
    "directory": ("dir", "math500", None, None, "is a directory, not a JSON Lines file"),
    "empty": (b"", "math500", None, None, "file is empty (no rows)"),
    "only_blank_lines": (b"\n   \n\t\n\r\n", "math500", None, None, "file is empty (no rows)"),
    "non_utf8_line3": (
        _lines(_row(GOOD_MATH, unique_id="a"), _row(GOOD_MATH, unique_id="b"))
        + b'{"problem": "caf\xe9", "answer": "1"}\n',
        "math500",
        3,
        None,
        "not valid UTF-8 (byte 0xe9 at column 17)",
    ),
    "malformed_json_line2": (
        _lines(_row(GOOD_MATH), '{"problem": "x", "answer": }'),
        "math500",
        2,
        None,
        "malformed JSON: Expecting value (column 28)",
    ),
    "malformed_after_blank": (
        _lines(_row(GOOD_GSM), "", "", '{"question": "x", '),
        "gsm8k",
        4,
        None,
        "malformed JSON: Expecting property name enclosed in double quotes (column 19)",
    ),
    "repeated_key": (
        _lines(_row(GOOD_GSM), '{"question": "a", "answer": "#### 1", "question": "b"}'),
        "gsm8k",
        2,
        None,
        "key 'question' appears twice in one JSON object",
    ),
    "repeated_key_nested": (
        _lines(_row(GOOD_MATH, meta={"a": 1}).replace('"a": 1', '"a": 1, "a": 2')),
        "math500",
        1,
        None,
        "key 'a' appears twice in one JSON object",
    ),
    "lone_surrogate_question": (  # json.dumps writes a lone surrogate as its escape, \ud800
        _lines(_row(GOOD_GSM), _row(GOOD_GSM, question="x\ud800y")),
        "gsm8k",
        2,
        "question",
        "holds a lone surrogate escape (\\uD800-\\uDFFF without its pair), which is not Unicode text",
    ),
    "lone_low_surrogate_in_meta_list": (
        _lines(_row(GOOD_MATH, tags=["ok", "\udc00"])),
        "math500",
        1,
        "tags",
        "holds a lone surrogate escape (\\uD800-\\uDFFF without its pair), which is not Unicode text",
    ),
    "lone_surrogate_key": (
        _lines(json.dumps({**GOOD_GSM, "\udbff": 1})),
        "gsm8k",
        1,
        None,
        "a key holds a lone surrogate escape (\\uD800-\\uDFFF without its pair), which is not Unicode text",
    ),
    "array_row": (
        _lines(_row(GOOD_MATH), '["problem", "answer"]'),
        "math500",
        2,
        None,
        "row is a JSON array, expected a JSON object",
    ),
    "scalar_row": (_lines("42"), "gsm8k", 1, None, "row is a JSON number, expected a JSON object"),
    "missing_field": (
        _lines(_row(GOOD_MATH, unique_id="a"), _row(GOOD_MATH, unique_id="b", answer=_DROP)),
        "math500",
        2,
        "answer",
        "missing required field",
    ),
    "empty_field": (
        _lines(_row(GOOD_GSM), _row(GOOD_GSM, question="   ")),
        "gsm8k",
        2,
        "question",
        "is empty",
    ),
    "non_string_field": (
        _lines(_row(GOOD_MATH, problem=2)),
        "math500",
        1,
        "problem",
        "must be a string, got JSON number",
    ),
    "answer_not_text_or_number": (
        _lines(_row(GOOD_MATH, answer=[2])),
        "math500",
        1,
        "answer",
        "must be a string, got JSON array",
    ),
    "null_field": (
        _lines(_row(GOOD_GSM, question=None)),
        "gsm8k",
        1,
        "question",
        "must be a string, got JSON null",
    ),
    "gsm8k_no_final_line": (
        _lines(_row(GOOD_GSM), _row(GOOD_GSM, answer="It is 5.")),
        "gsm8k",
        2,
        "answer",
        "has no final '#### <answer>' line",
    ),
    "gsm8k_gold_not_a_number": (
        _lines(_row(GOOD_GSM), _row(GOOD_GSM, answer="So the answer is\n#### 18 dollars")),
        "gsm8k",
        2,
        "answer",
        "its final answer after '####' is '18 dollars', not a number (GSM8K answers are numbers; for other "
        "answers use --task generic or a task file)",
    ),
    "math500_empty_boxed_gold": (
        _lines(_row(GOOD_MATH, unique_id="a"), _row(GOOD_MATH, unique_id="b", answer="\\boxed{ }")),
        "math500",
        2,
        "answer",
        "has an empty or unclosed \\boxed{} answer",
    ),
    "math500_unclosed_boxed_gold": (
        _lines(_row(GOOD_MATH, answer="\\boxed{\\frac{1}{2}")),
        "math500",
        1,
        "answer",
        "has an empty or unclosed \\boxed{} answer",
    ),
    "bad_id_type": (
        _lines(_row(GOOD_GSM, id=["x"])),
        "gsm8k",
        1,
        "id",
        "must be a string or integer id, got JSON array",
    ),
    "duplicate_id": (
        _lines(
            _row(GOOD_MATH, unique_id="test/a.json"),
            _row(GOOD_MATH, unique_id="test/b.json"),
            _row(GOOD_MATH, unique_id="test/a.json"),
        ),
        "math500",
        3,
        None,
        "duplicate id 'test/a.json' (first used on line 1)",
    ),
    "oversized_row": (
        _lines(_row(GOOD_GSM), _BIG_ROW),
        "gsm8k",
        2,
        None,
        f"row is {len(_BIG_ROW):,} bytes, more than the limit of 1,000,000 bytes",
    ),
}


def _materialise(tmp_path: Path, name: str, content: bytes | str | None) -> Path:
    path = tmp_path / f"{name}.jsonl"
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    return path


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 10


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_file_names_file_line_field(tmp_path: Path, name: str) -> None:
    content, task_name, line, field, tail = CASES[name]
    path = _materialise(tmp_path, name, content)
    task = GSM8KTask() if task_name == "gsm8k" else Math500Task()
    with pytest.raises(DatasetError) as info:
        task.load(path)
    err = info.value
    where = [str(path)]
    if line is not None:
        where.append(f"line {line}")
    if field is not None:
        where.append(f"field '{field}'")
    assert str(err) == f"{', '.join(where)}: {tail}"
    assert path.name in str(err)
    assert (err.path, err.line, err.field) == (str(path), line, field)


@pytest.mark.parametrize(
    "name", ["missing", "directory", "empty", "non_utf8_line3", "malformed_json_line2", "array_row"]
)
def test_detect_task_reports_unreadable_files_as_dataset_errors(tmp_path: Path, name: str) -> None:
    content, _task, line, _field, tail = CASES[name]
    path = _materialise(tmp_path, name, content)
    with pytest.raises(DatasetError) as info:
        load_items(path)  # auto-detection reads the file first
    # Detection reads only the first row; a later bad line is then reported by the full load.
    assert (info.value.line, info.value.reason) == (line, tail)


def test_first_row_broken_is_reported_by_detection(tmp_path: Path) -> None:
    path = tmp_path / "first_bad.jsonl"
    path.write_bytes(b"\n\xff\xfe\n")
    with pytest.raises(DatasetError, match=r"first_bad\.jsonl, line 2: not valid UTF-8"):
        detect_task(path)


def test_read_jsonl_line_numbers_skip_blank_lines_and_accept_crlf_and_bom(tmp_path: Path) -> None:
    path = tmp_path / "ok.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}\r\n\r\n  \n{"a": 2}')
    assert read_jsonl(path) == [(1, {"a": 1}), (4, {"a": 2})]


def test_read_jsonl_custom_row_limit(tmp_path: Path) -> None:
    path = tmp_path / "small_limit.jsonl"
    path.write_text('{"a": 1}\n{"a": "' + "y" * 50 + '"}\n', encoding="utf-8")
    with pytest.raises(DatasetError) as info:
        read_jsonl(path, max_row_bytes=40)
    assert str(info.value) == f"{path}, line 2: row is 59 bytes, more than the limit of 40 bytes"


def test_require_fields_names_the_field() -> None:
    require_fields("f.jsonl", 7, {"question": "q", "answer": "a"}, ("question", "answer"))
    with pytest.raises(DatasetError, match=r"^f\.jsonl, line 7, field 'answer': is empty$"):
        require_fields("f.jsonl", 7, {"question": "q", "answer": ""}, ("question", "answer"))
    with pytest.raises(
        DatasetError,
        match=r"^f\.jsonl, line 7, field 'answer': must be a string, got JSON "
        r"object$",
    ):
        require_fields("f.jsonl", 7, {"question": "q", "answer": {}}, ("question", "answer"))


def test_check_unique_ids_names_both_lines() -> None:
    check_unique_ids("f.jsonl", [(1, "a"), (2, "b")])
    with pytest.raises(DatasetError) as info:
        check_unique_ids("f.jsonl", [(1, "a"), (5, "b"), (9, "a")])
    assert str(info.value) == "f.jsonl, line 9: duplicate id 'a' (first used on line 1)"


def test_ids_default_to_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "noid.jsonl"
    path.write_text(
        _row(GOOD_GSM) + "\n\n" + _row(GOOD_GSM) + "\n" + _row(GOOD_GSM, id=17) + "\n", encoding="utf-8"
    )
    assert [item.id for item in GSM8KTask().load(path)] == ["line-1", "line-3", "17"]


def test_surrogate_pairs_and_escaped_backslashes_are_text(tmp_path: Path) -> None:
    """A surrogate pair escape is one character (an emoji), and ``\\\\ud800`` (an escaped backslash, then
    'ud800') is plain text: neither is refused."""
    path = tmp_path / "ok.jsonl"
    path.write_text(
        '{"question": "smile \\ud83d\\ude00 please", "answer": "#### 1"}\n'
        '{"question": "a path C:\\\\ud800", "answer": "#### 2"}\n',
        encoding="utf-8",
    )
    items = GSM8KTask().load(path)
    assert [it.question for it in items] == ["smile \U0001f600 please", "a path C:\\ud800"]


def test_math500_reads_a_numeric_answer_as_its_text(tmp_path: Path) -> None:
    """AIME-style sets store the answer as a JSON number (204, not "204"): it is the gold as text."""
    path = tmp_path / "aime.jsonl"
    path.write_text(
        _row(GOOD_MATH, answer=204, unique_id="a") + "\n" + _row(GOOD_MATH, answer=0.5, unique_id="b") + "\n",
        encoding="utf-8",
    )
    items = Math500Task().load(path)
    assert [i.gold for i in items] == ["204", "0.5"]
    assert Math500Task().grade("so \\boxed{204}", items[0]) is True
    with pytest.raises(DatasetError, match=r"line 1, field 'answer': must be a string, got JSON boolean"):
        path.write_text(_row(GOOD_MATH, answer=True) + "\n", encoding="utf-8")
        Math500Task().load(path)
