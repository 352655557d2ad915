"""`srdq run` as a user runs it: separate processes, a real SQLite file, a real (tiny) model.

- a run killed (os._exit, no cleanup) right after round k and then resumed writes byte-identical
  results to a run that was never interrupted;
- bad input gives one clear line naming the file/line/field or the valid choices, exit code != 0, and
  nothing written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.signals import default_sigint

pytestmark = pytest.mark.integration

SRDQ = [sys.executable, "-m", "srdq_cli.main"]


def srdq(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    # the deterministic mode (no prefix KV reuse): these tests compare resumed runs byte for byte
    full_env = {
        **os.environ,
        "SRDQ_DTYPE": "float32",
        "SRDQ_DEVICE": "cpu",
        "SRDQ_KV_REUSE": "false",
        **(env or {}),
    }
    return subprocess.run([*SRDQ, *args], capture_output=True, text=True, env=full_env, cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def gsm8k_small(tmp_path_factory, datasets_dir) -> Path:
    path = tmp_path_factory.mktemp("data") / "gsm8k_5.jsonl"
    lines = (datasets_dir / "gsm8k_test.jsonl").read_text(encoding="utf-8").splitlines()[:5]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _args(method: str, max_new_tokens: int, *extra: str) -> list[str]:
    return [
        "--method", method, "--n", "3", "--reward", "arithmetic", "--model", "tiny-random-llama",
        "--max-new-tokens", str(max_new_tokens), "--set", "chunk_tokens=8", "--seed", "7", *extra,
    ]  # fmt: skip


RUN_ARGS = _args("best_of_n", 40)
SRD_ARGS = _args("srd", 24, "--shard-size", "2")  # 5 problems: shards of 2, 2 and 1
#: the window on in the re-fed mode (srdq()'s), where it is off unless set: batches that change tokens
WINDOW = {"SRDQ_SHARD_WINDOW": "true"}


def _clean_run(tmp_path_factory, dataset: Path, args: list[str], env: dict[str, str] | None = None) -> Path:
    """results.jsonl of a run of ``args`` that was never interrupted."""
    out = tmp_path_factory.mktemp("clean")
    proc = srdq("run", str(dataset), *args, "--out", str(out), env=env)
    assert proc.returncode == 0, proc.stderr
    (results,) = out.glob("run-*/results.jsonl")
    return results


def _crash_after(
    round_: int, dataset: Path, args: list[str], out: Path, env: dict[str, str] | None = None
) -> None:
    """``srdq run`` of ``args`` into OUT, dying (os._exit) right after committing round ``round_``."""
    crashed = srdq(
        "run",
        str(dataset),
        *args,
        "--out",
        str(out),
        env={**(env or {}), "SRDQ_CRASH_AFTER_ROUND": str(round_)},
    )
    assert crashed.returncode == 86, crashed.stderr


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, gsm8k_small) -> Path:
    return _clean_run(tmp_path_factory, gsm8k_small, RUN_ARGS)


def test_uninterrupted_run_writes_one_record_per_item(uninterrupted):
    rows = [json.loads(line) for line in uninterrupted.read_text().splitlines()]
    assert [r["position"] for r in rows] == list(range(5))
    for r in rows:
        assert r["method"] == "best_of_n" and r["error"] is None
        assert isinstance(r["correct"], bool)
        assert 0 < r["ledger"]["gen_tokens"] <= 3 * 40
        assert len(r["extra"]["rewards"]) == 3


@pytest.mark.parametrize("crash_round", [1, 3])
def test_killed_after_round_k_then_resumed_is_byte_identical(
    tmp_path, gsm8k_small, uninterrupted, crash_round
):
    out = tmp_path / "out"
    _crash_after(crash_round, gsm8k_small, RUN_ARGS, out)
    assert not list(out.glob("run-*/results.jsonl"))
    resumed = srdq("run", str(gsm8k_small), *RUN_ARGS, "--out", str(out))
    assert resumed.returncode == 0, resumed.stderr
    assert "to go" in resumed.stderr
    (results,) = out.glob("run-*/results.jsonl")
    assert results.read_bytes() == uninterrupted.read_bytes()


@pytest.fixture(scope="module")
def srd_uninterrupted(tmp_path_factory, gsm8k_small) -> Path:
    return _clean_run(tmp_path_factory, gsm8k_small, SRD_ARGS, WINDOW)


def _open_shards(out: Path) -> list[int]:
    """Shards of the run in OUT with checkpoints and no results yet."""
    import sqlite3

    with sqlite3.connect(out / "srdq.db") as db:
        rows = db.execute("SELECT \"index\" FROM shard WHERE round > 0 AND status != 'done'").fetchall()
    return sorted(r[0] for r in rows)


@pytest.mark.parametrize("crash_round", [3, 5])
def test_killed_with_two_shards_in_its_window_then_resumed_is_byte_identical(
    tmp_path, gsm8k_small, srd_uninterrupted, crash_round
):
    """The window runs the next shard's items in the rows SRD's items free (shards of 2 items, 6 rows;
    set here: the re-fed mode leaves it off unless asked); in the padded mode a request's tokens depend
    on its batch-mates, so a resumed run is byte-identical only if it steps the same items together as
    the uninterrupted one."""
    out = tmp_path / "out"
    _crash_after(crash_round, gsm8k_small, SRD_ARGS, out, WINDOW)
    assert len(_open_shards(out)) >= 2  # died with two shards part-way
    resumed = srdq("run", str(gsm8k_small), *SRD_ARGS, "--out", str(out), env=WINDOW)
    assert resumed.returncode == 0, resumed.stderr
    (results,) = out.glob("run-*/results.jsonl")
    assert results.read_bytes() == srd_uninterrupted.read_bytes()


def test_rerun_with_settings_that_change_results_is_a_new_run(tmp_path, gsm8k_small):
    """The run id names dtype, device and the engine's batching mode and KV reuse: a rerun with other ones
    into the same folder is a run of its own (it used to re-report the old run as if it were this one),
    and the first run's records are untouched."""
    out = tmp_path / "out"
    assert srdq("run", str(gsm8k_small), *RUN_ARGS, "--out", str(out)).returncode == 0
    (results,) = out.glob("run-*/results.jsonl")
    first = results.read_bytes()
    ids = {results.parent.name}
    # each differs from srdq()'s environment (float32, the padded default, KV reuse off)
    for env in ({"SRDQ_DTYPE": "bfloat16"}, {"SRDQ_BATCH_INVARIANT": "true"}, {"SRDQ_KV_REUSE": "true"}):
        again = srdq("run", str(gsm8k_small), *RUN_ARGS, "--out", str(out), env=env)
        assert again.returncode == 0, again.stderr
        assert "to go" in again.stderr  # generated, not re-reported
        ids |= {p.parent.name for p in out.glob("run-*/results.jsonl")}
        assert results.read_bytes() == first
    assert len(ids) == 4


def test_rerun_of_finished_run_reports_without_regenerating(tmp_path, gsm8k_small):
    out = tmp_path / "out"
    assert srdq("run", str(gsm8k_small), *RUN_ARGS, "--out", str(out)).returncode == 0
    (results,) = out.glob("run-*/results.jsonl")
    first = results.read_bytes()
    again = srdq("run", str(gsm8k_small), *RUN_ARGS, "--out", str(out))
    assert again.returncode == 0 and results.read_bytes() == first
    assert "to go" not in again.stderr  # nothing left to run: the model is not even loaded


def _bad(tmp_path: Path, name: str, content: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(content)
    return p


GOOD_ROW = b'{"question": "What is 1+1?", "answer": "1+1=2\\n#### 2"}\n'


@pytest.mark.parametrize(
    "case, expected",
    [
        ("missing", r"missing\.jsonl.*(not found|does not exist|no such file)"),
        ("malformed", r"malformed\.jsonl.*line 2"),
        ("no_question", r"no_question\.jsonl.*line 1.*question"),
        ("unknown_method", r"unknown method 'magic'; choose one of: .*best_of_n"),
        ("unknown_param", r"unknown parameter 'warp' for method 'sampling'; valid: .*temperature"),
        ("unknown_reward", r"unknown reward 'oracle'; choose one of: .*arithmetic"),
        ("bon_without_reward", r"method 'best_of_n' needs a reward model"),
        ("shard_size_zero", r"--shard-size must be >= 1, got 0"),
        ("negative_seed", r"--seed must be >= 0, got -1"),
        ("missing_model", r"model folder '.*no-such-model' does not exist"),
        ("empty_model", r"--model is empty"),
        ("nan_temperature", r"parameter 'temperature' expects a finite number, got 'nan'"),
        ("fractional_n", r"parameter 'n' expects an integer, got '3\.7'"),
        ("repeated_key", r"repeated_key\.jsonl, line 2: key 'question' appears twice"),
        ("lone_surrogate", r"lone_surrogate\.jsonl, line 1, field 'question': holds a lone surrogate"),
    ],
)
def test_bad_input_one_clear_line_nothing_written(tmp_path, case, expected):
    import re

    data = {
        "missing": tmp_path / "missing.jsonl",
        "malformed": _bad(tmp_path, "malformed.jsonl", GOOD_ROW + b'{"question": "x", "answer": \n'),
        "no_question": _bad(tmp_path, "no_question.jsonl", b'{"answer": "#### 2"}\n'),
        "repeated_key": _bad(
            tmp_path,
            "repeated_key.jsonl",
            GOOD_ROW + b'{"question": "a", "answer": "#### 1", "question": "b"}\n',
        ),
        # a lone surrogate crashed the store's insert with a traceback, after srdq.db was created
        "lone_surrogate": _bad(
            tmp_path, "lone_surrogate.jsonl", b'{"question": "1+1\\ud800?", "answer": "#### 2"}\n'
        ),
    }.get(case, _bad(tmp_path, "good.jsonl", GOOD_ROW))
    extra = {
        "unknown_method": ["--method", "magic"],
        "unknown_param": ["--method", "sampling", "--set", "warp=9"],
        "unknown_reward": ["--method", "sampling", "--reward", "oracle"],
        "bon_without_reward": ["--method", "best_of_n"],
        "shard_size_zero": ["--method", "sampling", "--shard-size", "0"],
        "negative_seed": ["--method", "sampling", "--seed", "-1"],
        "missing_model": ["--method", "sampling", "--model", str(tmp_path / "no-such-model")],
        "empty_model": ["--method", "sampling", "--model", ""],
        "nan_temperature": ["--method", "sampling", "--set", "temperature=nan"],
        "fractional_n": ["--method", "best_of_n", "--reward", "arithmetic", "--set", "n=3.7"],
    }.get(case, ["--method", "sampling", "--task", "gsm8k"])
    out = tmp_path / "out"
    model = [] if "--model" in extra else ["--model", "tiny-random-llama"]
    proc = srdq("run", str(data), *extra, *model, "--out", str(out))
    assert proc.returncode != 0
    lines = proc.stderr.rstrip("\n").splitlines()  # blank lines count: the error is the only line
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("Error: ")
    assert re.search(expected, lines[0], re.IGNORECASE), lines[0]
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_methods_lists_every_method_with_defaults():
    proc = srdq("methods", "--json")
    assert proc.returncode == 0
    data = json.loads(proc.stdout)
    from srd_worker.methods.registry import METHODS

    assert set(data) == set(METHODS)
    bon = {p["name"]: p["default"] for p in data["best_of_n"]["params"]}
    assert bon["temperature"] == 0.8 and bon["top_p"] == 0.9 and bon["top_k"] == 50
    assert data["best_of_n"]["needs_reward"] is True


# ------------------------------------------------------------------ shard by shard: kill or Ctrl-C, resume
SHARDED_ARGS = [*RUN_ARGS[:-2], "--max-new-tokens", "64", "--shard-size", "2", "--seed", "7"]
SHARDED_ITEMS = 16  # 8 shards: the signal lands long before the last one finishes


@pytest.fixture(scope="module")
def gsm8k_ten(tmp_path_factory, datasets_dir) -> Path:
    path = tmp_path_factory.mktemp("data") / "gsm8k_16.jsonl"
    lines = (datasets_dir / "gsm8k_test.jsonl").read_text(encoding="utf-8").splitlines()[:SHARDED_ITEMS]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def sharded_reference(tmp_path_factory, gsm8k_ten) -> bytes:
    out = tmp_path_factory.mktemp("sharded-clean")
    proc = srdq("run", str(gsm8k_ten), *SHARDED_ARGS, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert f"{SHARDED_ITEMS} items in 8 shards, {SHARDED_ITEMS} to go" in " ".join(proc.stderr.split())
    (results,) = out.glob("run-*/results.jsonl")
    return results.read_bytes()


def _start_and_stop_after_first_shard(dataset: Path, out: Path, sig: int) -> subprocess.Popen:
    """Start `srdq run`, wait until the first shard's records are appended to results.jsonl, then send
    ``sig``. Fails if the run ended before the signal could interrupt it."""
    import signal
    import time

    env = {**os.environ, "SRDQ_DTYPE": "float32", "SRDQ_DEVICE": "cpu", "SRDQ_KV_REUSE": "false"}
    proc = subprocess.Popen(
        [*SRDQ, "run", str(dataset), *SHARDED_ARGS, "--out", str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,  # Ctrl-C lands even when the suite runs as a script's background job
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        found = list(out.glob("run-*/results.jsonl"))
        if found and len(found[0].read_bytes().splitlines()) >= 2:  # one whole shard (2 items)
            break
        assert proc.poll() is None, proc.communicate()[1]
        time.sleep(0.01)
    else:
        proc.kill()
        pytest.fail("no shard finished within 240 s")
    assert proc.poll() is None, "the run finished before it could be interrupted"
    proc.send_signal(sig)
    proc.wait(timeout=120)
    assert sig != signal.SIGKILL or proc.returncode == -signal.SIGKILL
    return proc


@pytest.mark.parametrize("signame", ["SIGKILL", "SIGINT", "SIGTERM"])
def test_interrupted_run_keeps_finished_shards_and_resumes_to_the_same_records(
    tmp_path, gsm8k_ten, sharded_reference, signame
):
    import signal

    out = tmp_path / "out"
    proc = _start_and_stop_after_first_shard(gsm8k_ten, out, getattr(signal, signame))
    stderr = " ".join((proc.stderr.read() if proc.stderr else "").split())  # rich wraps long lines
    if signame != "SIGKILL":  # Ctrl-C and SIGTERM: one line on how to resume, the run not left running
        assert proc.returncode == 128 + getattr(signal, signame), stderr
        assert "interrupted: every finished round is checkpointed" in stderr
        assert "run the same command again to resume" in stderr
        assert "Traceback" not in stderr
        import sqlite3

        with sqlite3.connect(out / "srdq.db") as con:
            assert [r[0] for r in con.execute("select status from run")] == ["pending"]
            # the shards it had open are pending again (srdq status showed them running)
            assert not con.execute("select 1 from shard where status = 'running'").fetchall()
    (partial,) = out.glob("run-*/results.jsonl")
    reference = sharded_reference.splitlines(keepends=True)
    done = partial.read_bytes().splitlines(keepends=True)
    # the partial file holds whole finished shards, each record as the finished run writes it
    assert 2 <= len(done) < SHARDED_ITEMS and len(done) % 2 == 0
    assert done == reference[: len(done)]
    assert not (partial.parent / "summary.json").exists()

    resumed = srdq("run", str(gsm8k_ten), *SHARDED_ARGS, "--out", str(out))
    assert resumed.returncode == 0, resumed.stderr
    import re

    match = re.search(r"(\d+) to go", resumed.stderr)
    assert match and int(match.group(1)) <= SHARDED_ITEMS - len(done), (
        resumed.stderr
    )  # finished shards skipped
    assert partial.read_bytes() == sharded_reference
    assert json.loads((partial.parent / "summary.json").read_text())["items"] == SHARDED_ITEMS
