"""Dataset inputs beyond plain JSONL / CSV / Parquet files: gzip, Hugging Face ``save_to_disk`` folders,
hub datasets already in the local cache (a cache folder built here, HF_HUB_CACHE pointing at it), and
OpenAI batch files whose ``custom_id`` reaches the result records and the export."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from srd_worker.datasets import resolve_dataset
from srd_worker.errors import DatasetError
from srd_worker.spec import dataset_sha256, file_sha256, prepare_run
from srd_worker.tasks.registry import detect_task, load_items
from tests.cli import run_srdq, srdq_env

GSM = [
    {"id": "g1", "question": "Tom has 3 apples and buys 4. How many?", "answer": "3+4=7\n#### 7"},
    {"id": "g2", "question": "A box holds 12 pens; 5 are taken. How many left?", "answer": "#### 7"},
    {"id": "g3", "question": "What is 6 times 7?", "answer": "#### 42"},
]


def _jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode("utf-8")


def test_jsonl_gz_and_csv_gz_read_as_their_plain_files(tmp_path: Path) -> None:
    plain = tmp_path / "gsm.jsonl"
    plain.write_bytes(_jsonl(GSM))
    packed = tmp_path / "gsm.jsonl.gz"
    packed.write_bytes(gzip.compress(_jsonl(GSM)))
    task, items = load_items(packed)
    assert task.name == "gsm8k" and items == load_items(plain)[1]
    assert [i.gold for i in items] == ["7", "7", "42"]
    csv_gz = tmp_path / "p.csv.gz"
    csv_gz.write_bytes(gzip.compress(b"text,gold\nhello,1\nworld,2\n"))
    _, rows = load_items(csv_gz, fields={"prompt": "text", "answer": "gold"})
    assert [(i.question, i.gold) for i in rows] == [("hello", "1"), ("world", "2")]


def test_bad_rows_and_broken_gzip_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(gzip.compress(_jsonl(GSM[:1]) + b"{not json\n"))
    with pytest.raises(DatasetError, match=r"bad\.jsonl\.gz, line 2: malformed JSON"):
        load_items(bad, "gsm8k")
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(_jsonl(GSM * 50))[:200])
    with pytest.raises(DatasetError, match=r"cut\.jsonl\.gz, line \d+: not a readable gzip file"):
        load_items(cut, "gsm8k")


def _save_to_disk(folder: Path, rows: list[dict], *, files: int = 1) -> Path:
    """The layout ``datasets.Dataset.save_to_disk`` writes: Arrow stream files named in state.json."""
    folder.mkdir(parents=True)
    names = []
    per = -(-len(rows) // files)
    for k in range(files):
        name = f"data-{k:05d}-of-{files:05d}.arrow"
        table = pa.Table.from_pylist(rows[k * per : (k + 1) * per])
        with pa.OSFile(str(folder / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=1)
        names.append({"filename": name})
    state = {"_data_files": names, "_fingerprint": "0123", "_format_type": None, "_split": "test"}
    (folder / "state.json").write_text(json.dumps(state), encoding="utf-8")
    (folder / "dataset_info.json").write_text("{}", encoding="utf-8")
    return folder


def test_save_to_disk_folder(tmp_path: Path) -> None:
    folder = _save_to_disk(tmp_path / "gsm_test", GSM, files=2)
    task, items = load_items(folder)  # auto-detected as GSM8K from the first row
    assert task.name == "gsm8k" and [i.id for i in items] == ["g1", "g2", "g3"]
    assert items[2].meta == {"row": 3}  # rows counted over both Arrow files
    spec = prepare_run(dataset=str(folder), method="sampling", params={}, model="m", reward=None).spec
    assert spec.dataset_sha256 == dataset_sha256(folder)
    (folder / "dataset_info.json").write_text('{"changed": 1}', encoding="utf-8")
    assert dataset_sha256(folder) != spec.dataset_sha256


def test_save_to_disk_errors_name_folder_and_row(tmp_path: Path) -> None:
    rows = [dict(GSM[0]), {"id": "g2", "question": "  ", "answer": "#### 1"}]
    folder = _save_to_disk(tmp_path / "bad", rows)
    with pytest.raises(DatasetError, match=rf"^{folder}, row 2, field 'question': is empty$"):
        load_items(folder, "gsm8k")
    dd = tmp_path / "dd"
    _save_to_disk(dd / "test", GSM)
    _save_to_disk(dd / "train", GSM)
    (dd / "dataset_dict.json").write_text('{"splits": ["test", "train"]}', encoding="utf-8")
    with pytest.raises(DatasetError, match=r"DatasetDict folder: give one split's folder \(test, train\)"):
        load_items(dd, "gsm8k")
    (folder / "data-00000-of-00001.arrow").write_bytes(b"garbage")
    with pytest.raises(DatasetError, match=r"unreadable Arrow file data-00000-of-00001\.arrow"):
        load_items(folder, "gsm8k")
    (folder / "state.json").write_text("{}", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"state.json of a save_to_disk folder lacks '_data_files'"):
        load_items(folder, "gsm8k")


def _hub_cache(root: Path, repo: str, files: dict[str, bytes]) -> Path:
    """A hub cache holding one dataset snapshot, laid out as huggingface_hub writes it."""
    commit = "0" * 39 + "1"
    repo_dir = root / f"datasets--{repo.replace('/', '--')}"
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(commit, encoding="utf-8")
    for rel, data in files.items():
        target = repo_dir / "snapshots" / commit / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return root


def _parquet(rows: list[dict]) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows), sink)
    return sink.getvalue().to_pybytes()


def test_hub_dataset_from_the_local_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = _hub_cache(
        tmp_path / "hub",
        "someone/tiny-math",
        {
            "data/test-00000-of-00001.parquet": _parquet(GSM),
            "data/train-00000-of-00001.parquet": _parquet(GSM[:1]),
            "README.md": b"# card",
        },
    )
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    test_file = resolve_dataset("hf:someone/tiny-math")  # the test split by default
    assert test_file.name == "test-00000-of-00001.parquet"
    assert resolve_dataset("someone/tiny-math:train").name == "train-00000-of-00001.parquet"
    task, items = load_items(test_file)
    assert task.name == "gsm8k" and len(items) == 3
    spec = prepare_run(
        dataset="hf:someone/tiny-math", method="sampling", params={}, model="m", reward=None
    ).spec
    assert spec.dataset == "hf:someone/tiny-math" and spec.dataset_sha256 == file_sha256(test_file)
    with pytest.raises(DatasetError, match=r"no split 'dev' \(splits: test, train\)"):
        resolve_dataset("hf:someone/tiny-math:dev")
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # HF_HOME/hub is the same cache
    assert resolve_dataset("hf:someone/tiny-math") == test_file


def test_hub_dataset_whose_split_is_a_json_array(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many hub datasets ship a split as one JSON array (``test.json``): found by name, read as rows."""
    cache = _hub_cache(
        tmp_path / "hub", "someone/array-math", {"test.json": json.dumps(GSM, indent=2).encode()}
    )
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    test_file = resolve_dataset("hf:someone/array-math")
    assert test_file.name == "test.json"
    task, items = load_items(test_file)
    assert task.name == "gsm8k" and [i.id for i in items] == ["g1", "g2", "g3"]
    assert [i.gold for i in items] == ["7", "7", "42"]


def test_absent_hub_id_is_refused_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(DatasetError) as info:
        resolve_dataset("hf:nobody/absent-set")
    message = str(info.value)
    assert message.startswith(
        "hf:nobody/absent-set: Hugging Face dataset 'nobody/absent-set' is not in the local cache"
    )
    assert "never downloads" in message
    with pytest.raises(DatasetError, match="'nobody/absent-set' is not in the local cache"):
        resolve_dataset("nobody/absent-set")
    with pytest.raises(DatasetError, match=r"^nobody/absent\.jsonl: file not found$"):
        resolve_dataset("nobody/absent.jsonl")  # a file name stays a file name


BATCH = [
    {
        "custom_id": "req-A",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "gpt-4o-mini",
            "max_tokens": 50,
            "messages": [
                {"role": "system", "content": "Be terse."},
                {"role": "user", "content": [{"type": "text", "text": "Say hi."}]},
            ],
        },
    },
    {
        "custom_id": "req-B",
        "method": "POST",
        "url": "/v1/completions",
        "body": {"prompt": "Once upon a time"},
    },
]


def test_openai_batch_rows(tmp_path: Path, tiny_engine) -> None:
    path = tmp_path / "batch.jsonl"
    path.write_bytes(_jsonl(BATCH))
    assert detect_task(path) == "openai_batch"
    task, items = load_items(path)
    assert [i.id for i in items] == ["req-A", "req-B"]
    assert items[0].question == "Say hi." and task.grade("x", items[0]) is None
    assert task.messages(items[0]) == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Say hi."},
    ]
    tok = tiny_engine.tokenizer
    assert task.prompt_ids(tok, items[1]) == tok.encode("Once upon a time")  # completions: plain text
    assert task.prompt_ids(tok, items[0]) == tok.chat_prompt_ids(task.messages(items[0]))
    assert task.record_fields(items[1]) == {"custom_id": "req-B"}


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        (
            {"custom_id": "x", "body": {"messages": []}},
            r"line 1, field 'body\.messages': must be a non-empty list",
        ),
        (
            {"custom_id": "x", "body": {"messages": [{"role": "tool", "content": "a"}]}},
            r"field 'body\.messages\[0\]'",
        ),
        (
            {"custom_id": "x", "url": "/v1/embeddings", "body": {"prompt": "a"}},
            r"field 'url': must be one of",
        ),
        ({"custom_id": "x", "body": {"prompt": "a", "messages": []}}, r"field 'body': needs exactly one"),
        ({"custom_id": "", "body": {"prompt": "a"}}, r"field 'custom_id': is empty"),
    ],
)
def test_openai_batch_bad_rows(tmp_path: Path, row: dict, reason: str) -> None:
    path = tmp_path / "batch.jsonl"
    path.write_bytes(_jsonl([row]))
    with pytest.raises(DatasetError, match=reason):
        load_items(path, "openai_batch")
    path.write_bytes(_jsonl([BATCH[1], BATCH[1]]))
    with pytest.raises(DatasetError, match=r"line 2: duplicate id 'req-B' \(first used on line 1\)"):
        load_items(path, "openai_batch")


@pytest.mark.e2e
def test_openai_batch_custom_id_reaches_results_and_export(tmp_path: Path) -> None:
    path = tmp_path / "batch.jsonl"
    path.write_bytes(_jsonl(BATCH))
    env = srdq_env(SRDQ_DTYPE="float32", SRDQ_DEVICE="cpu")
    out = tmp_path / "out"
    proc = run_srdq(
        "run", str(path), "--method", "sampling", "--model", "tiny-random-llama", "--max-new-tokens", "4",
        "--out", str(out), env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (results,) = out.glob("run-*/results.jsonl")
    records = [json.loads(line) for line in results.read_text(encoding="utf-8").splitlines()]
    assert [(r["custom_id"], r["item_id"]) for r in records] == [("req-A", "req-A"), ("req-B", "req-B")]
    assert all(r["correct"] is None and r["response"] is not None for r in records)
    exported = tmp_path / "export.csv"
    proc = run_srdq(
        "export", results.parent.name, "--db", str(out), "--format", "csv", "--out", str(exported), env=env
    )
    assert proc.returncode == 0, proc.stderr
    import csv

    rows = list(csv.DictReader(exported.open(encoding="utf-8")))
    assert [r["custom_id"] for r in rows] == ["req-A", "req-B"]


@pytest.mark.e2e
def test_srdq_run_refuses_an_uncached_hub_id_in_one_line(tmp_path: Path) -> None:
    env = srdq_env(HF_HUB_CACHE=str(tmp_path / "empty-cache"))
    out = tmp_path / "out"
    proc = run_srdq("run", "hf:nobody/absent-set", "--method", "sampling", "--out", str(out), env=env)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert (
        len(lines) == 1 and "Hugging Face dataset 'nobody/absent-set' is not in the local cache" in lines[0]
    )
    assert not out.exists()
