"""The built-in dataset registry (``srd_worker.datasets``): name and path resolution (an existing file wins,
a directory does not shadow a name), the unknown-name error, the packaged files against the recorded
sha256 / size / record count, the run spec (name recorded, same run id as the file path), and the CLI:
``srdq datasets`` and ``srdq run NAME`` / ``srdq submit dataset NAME``."""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner
from srdq_cli.main import cli

from srd_worker.datasets import DATA_DIR, DATASETS, builtin_dataset, resolve_dataset
from srd_worker.errors import ConfigError, DatasetError
from srd_worker.spec import prepare_run

NAMES = ["math500", "gsm8k", "hotpotqa", "alpaca_eval", "prm800k_sample"]
TINY = ["--model", "tiny-random-llama", "--max-new-tokens", "8"]


def _sampling(dataset: str | Path, params: dict | None = None, **kwargs):
    return prepare_run(
        dataset=dataset,
        method="sampling",
        params=params or {},
        model="tiny-random-llama",
        reward=None,
        **kwargs,
    )


# --- registry and resolution --------------------------------------------------------------------------------


def test_registry_names_and_tasks() -> None:
    from srd_worker.tasks.registry import TASKS

    assert list(DATASETS) == NAMES
    assert all(d.task is None or d.task in TASKS for d in DATASETS.values())
    assert DATASETS["prm800k_sample"].task is None
    assert {d.name: d.licence for d in DATASETS.values()}["alpaca_eval"] == "CC BY-NC 4.0"
    assert DATASETS["hotpotqa"].licence == "CC BY-SA 4.0"


@pytest.mark.parametrize("name", NAMES)
def test_packaged_file_matches_the_registry(name: str) -> None:
    entry = DATASETS[name]
    data = entry.path.read_bytes()
    assert entry.path.parent == DATA_DIR
    assert hashlib.sha256(data).hexdigest() == entry.sha256
    assert len(data) == entry.bytes
    assert sum(1 for line in data.splitlines() if line.strip()) == entry.records


def test_provenance_readme_names_every_file_and_checksum() -> None:
    readme = (DATA_DIR / "README.md").read_text(encoding="utf-8")
    for d in DATASETS.values():
        assert f"| `{d.name}` | `{d.filename}` | {d.records:,} | {d.bytes:,} | `{d.sha256}` |" in readme
    assert "CC BY-NC 4.0" in readme and "CC BY-SA 4.0" in readme


@pytest.mark.parametrize("name", NAMES)
def test_resolve_by_name(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no local file of that name
    assert resolve_dataset(name) == DATA_DIR / DATASETS[name].filename
    assert builtin_dataset(name) is DATASETS[name]


def test_resolve_by_path_returns_it_unchanged(tmp_path: Path) -> None:
    mine = tmp_path / "mine.jsonl"
    mine.write_text('{"question": "1+1?", "answer": "#### 2"}\n', encoding="utf-8")
    assert resolve_dataset(mine) == mine
    assert resolve_dataset(str(mine)) == mine
    packaged = DATASETS["gsm8k"].path
    assert resolve_dataset(str(packaged)) == packaged  # the packaged file by path, too
    assert builtin_dataset(str(packaged)) is None


def test_a_local_file_shadows_a_builtin_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("gsm8k").write_text('{"question": "1+1?", "answer": "#### 2"}\n', encoding="utf-8")
    assert resolve_dataset("gsm8k") == Path("gsm8k")
    assert builtin_dataset("gsm8k") is None
    assert len(_sampling("gsm8k").items) == 1  # the local file, not the 1319 built-in rows


def test_a_directory_does_not_shadow_a_builtin_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("gsm8k").mkdir()  # e.g. an earlier `--out gsm8k`
    assert resolve_dataset("gsm8k") == DATASETS["gsm8k"].path
    Path("other").mkdir()  # not a name: returned for the reader to refuse
    assert resolve_dataset("other") == Path("other")
    with pytest.raises(DatasetError, match=r"^other: is a directory, not a JSON Lines file$"):
        _sampling("other")


def test_unknown_name_lists_the_builtin_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DatasetError) as info:
        resolve_dataset("gsm8kk")
    assert str(info.value) == (
        "gsm8kk: not a built-in dataset name, and no such file (built-in datasets: math500, gsm8k, "
        "hotpotqa, alpaca_eval, prm800k_sample; see `srdq datasets`)"
    )
    with pytest.raises(DatasetError) as info:
        resolve_dataset("data/missing.jsonl")
    assert str(info.value) == "data/missing.jsonl: file not found"  # a path: the reader's message, as before


# --- run spec -----------------------------------------------------------------------------------------------


def test_spec_records_the_name_and_keeps_the_run_id_of_the_file() -> None:
    by_name = _sampling("gsm8k", limit=3)
    by_path = _sampling(str(DATASETS["gsm8k"].path), limit=3)
    assert by_name.spec.dataset == "gsm8k"
    assert by_name.spec.dataset_sha256 == DATASETS["gsm8k"].sha256 == by_path.spec.dataset_sha256
    assert by_name.spec.run_id() == by_path.spec.run_id()
    assert by_name.task.name == "gsm8k" and [i.id for i in by_name.items] == [i.id for i in by_path.items]


@pytest.mark.parametrize("task", ["auto", "math500"])
def test_prm800k_sample_is_refused_by_name(task: str) -> None:
    with pytest.raises(ConfigError) as info:
        _sampling("prm800k_sample", task=task)
    message = str(info.value)
    assert message.startswith(
        "built-in dataset 'prm800k_sample' cannot be run (PRM800K step labels, not a task"
    )
    assert "load_prm800k" in message and "\n" not in message


# --- CLI ----------------------------------------------------------------------------------------------------


def test_srdq_datasets_table() -> None:
    result = CliRunner().invoke(cli, ["datasets"])
    assert result.exit_code == 0, result.output
    rows = {
        cells[0]: cells[1:]
        for line in result.stdout.splitlines()
        if len(cells := [c.strip() for c in re.split("[│┃]", line.strip("│┃ "))]) == 5
    }
    assert rows["name"] == ["task", "records", "size", "licence"]
    assert rows["gsm8k"] == ["gsm8k", "1319", "749.7 kB", "MIT"]
    assert rows["hotpotqa"] == ["hotpotqa", "500", "3.2 MB", "CC BY-SA 4.0"]
    assert rows["alpaca_eval"] == ["alpaca_eval", "805", "2.2 MB", "CC BY-NC 4.0"]
    assert rows["prm800k_sample"] == ["not a task", "6", "18.6 kB", "MIT"]
    assert [name for name in rows if name != "name"] == NAMES


def test_srdq_datasets_json() -> None:
    result = CliRunner().invoke(cli, ["datasets", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [d["name"] for d in data] == NAMES
    assert data == [d.to_dict() for d in DATASETS.values()]
    assert all(Path(d["path"]).is_file() for d in data)


@pytest.mark.e2e
def test_srdq_run_a_builtin_name(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["run", "gsm8k", "--limit", "2", "--method", "sampling", *TINY, "--out", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    (results,) = out.glob("run-*/results.jsonl")
    records = [json.loads(line) for line in results.read_text(encoding="utf-8").splitlines()]
    gold = [json.loads(line) for line in DATASETS["gsm8k"].path.read_text(encoding="utf-8").splitlines()[:2]]
    assert len(records) == 2 and [r["gold"] for r in records] == [
        g["answer"].split("####")[-1].strip() for g in gold
    ]
    with sqlite3.connect(out / "srdq.db") as db:
        ((run_id, name, spec),) = db.execute("select id, name, spec from run").fetchall()
    spec = json.loads(spec)
    assert (spec["dataset"], spec["dataset_sha256"], spec["task"]) == (
        "gsm8k",
        DATASETS["gsm8k"].sha256,
        "gsm8k",
    )
    assert name == "sampling-gsm8k" and results.parent.name == run_id


@pytest.mark.parametrize(
    "dataset, expected",
    [
        (
            "gsm8kk",
            r"^Error: gsm8kk: not a built-in dataset name, and no such file \(built-in datasets: math500, ",
        ),
        ("prm800k_sample", r"^Error: built-in dataset 'prm800k_sample' cannot be run"),
    ],
)
def test_srdq_run_a_bad_name_writes_nothing(tmp_path: Path, dataset: str, expected: str) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["run", dataset, "--method", "sampling", *TINY, "--out", str(out)])
    assert result.exit_code == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and re.search(expected, lines[0]), result.stderr
    assert not out.exists()


def test_srdq_submit_dataset_dry_run_takes_a_name() -> None:
    args = ["submit", "dataset", "math500", "--method", "sampling", "--limit", "5", "--shard-size", "2"]
    result = CliRunner().invoke(cli, [*args, *TINY, "--dry-run"])
    assert result.exit_code == 0, result.output
    expected = _sampling("math500", {"max_new_tokens": 8}, limit=5, shard_size=2)
    assert result.stdout.strip() == (
        f"{expected.spec.run_id()}: 5 items in 3 shards (task math500, method sampling); "
        "dry run, nothing stored"
    )
