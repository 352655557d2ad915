"""A task of one's own, end to end: a YAML task file outside the package, a custom grader module, run by
`srdq run` on the tiny random Llama in a separate process; listed by `srdq tasks`; a malformed file
refused with its file, line and key before anything is written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.cli import run_srdq, srdq_env

pytestmark = pytest.mark.e2e

TASK = """\
name: capitals
description: capital cities, one word
prompt: "What is the capital of {{ country }}?\\nAnswer:"
answer: capital
system: You are a geography expert.
few_shot:
  - values: {country: France}
    assistant: Paris
chat_template: none
extractor: full
grader: capgrader:is_rome
"""
GRADER = "def is_rome(answer, gold, response):\n    return gold == 'Rome'\n"
ROWS = [("Italy", "Rome"), ("Spain", "Madrid"), ("Japan", "Tokyo")]


@pytest.fixture
def workspace(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "capitals.yaml").write_text(TASK, encoding="utf-8")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "capgrader.py").write_text(GRADER, encoding="utf-8")
    rows = "".join(json.dumps({"country": c, "capital": k}) + "\n" for c, k in ROWS)
    (tmp_path / "caps.jsonl").write_text(rows, encoding="utf-8")
    env = srdq_env(SRDQ_DTYPE="float32", SRDQ_DEVICE="cpu")
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(tmp_path / "lib")])
    return tmp_path, env


def test_srdq_run_with_a_task_file_from_include_path(workspace) -> None:
    root, env = workspace
    args = ["--method", "sampling", "--model", "tiny-random-llama", "--max-new-tokens", "6", "--seed", "1"]
    proc = run_srdq(
        "run", str(root / "caps.jsonl"), "--task", "capitals", "--include-path", str(root / "tasks"),
        *args, "--out", str(root / "out"), env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (results,) = (root / "out").glob("run-*/results.jsonl")
    records = [json.loads(line) for line in results.read_text(encoding="utf-8").splitlines()]
    assert [r["question"] for r in records] == [f"What is the capital of {c}?\nAnswer:" for c, _ in ROWS]
    assert [r["gold"] for r in records] == [k for _, k in ROWS]
    assert [r["correct"] for r in records] == [True, False, False]  # the custom grader decided
    assert records[0]["grader_version"] == "task-file-1:full/capgrader:is_rome"
    # the plain prompt: system, the shot, the question (the tiny model's tokenizer is byte-level)
    prompt = (
        "You are a geography expert.\n\nWhat is the capital of France?\nAnswer: Paris\n\n"
        + records[0]["question"]
    )
    assert records[0]["ledger"]["prefill_tokens"] == len(prompt.encode("utf-8"))

    # the same task given by its file path is the same run (the run id hashes the definition, not the path)
    again = run_srdq(
        "run", str(root / "caps.jsonl"), "--task", str(root / "tasks" / "capitals.yaml"), *args,
        "--out", str(root / "out"), env=env, timeout=300,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert len(list((root / "out").glob("run-*"))) == 1

    listed = run_srdq("tasks", "--include-path", str(root / "tasks"), "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    entry = json.loads(listed.stdout)[-1]
    assert entry["name"] == "capitals" and entry["fields"] == ["country", "capital"]
    assert entry["file"] == str(root / "tasks" / "capitals.yaml")

    dry = run_srdq(
        "submit", "dataset", str(root / "caps.jsonl"), "--task", "capitals", "--include-path", str(root / "tasks"),
        "--method", "sampling", "--dry-run", env=env,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert "task capitals" in dry.stdout and "nothing stored" in dry.stdout


def test_malformed_task_file_is_refused_naming_file_line_and_key(workspace) -> None:
    root, env = workspace
    bad = root / "tasks" / "capitals.yaml"
    bad.write_text(TASK.replace("grader: capgrader:is_rome", "grader: fuzzy"), encoding="utf-8")
    out = root / "out"
    proc = run_srdq(
        "run", str(root / "caps.jsonl"), "--task", str(bad), "--method", "sampling", "--model", "tiny-random-llama",
        "--out", str(out), env=env,
    )  # fmt: skip
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"{bad}, line 11, key 'grader': unknown grader 'fuzzy'" in lines[0]
    assert not out.exists()
    listed = run_srdq("tasks", "--include-path", str(root / "tasks"), env=env)
    assert listed.returncode == 1 and f"{bad}, line 11, key 'grader'" in listed.stderr
