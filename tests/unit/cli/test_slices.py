"""Slices of a run without servers (issue 28): ``srdq run --num-shards K --shard-index I`` in separate
processes, ``srdq merge`` of their folders.

- the partition: every shard in exactly one slice, contiguous, balanced, independent of which slice asks;
- K = 3 slices run as 3 processes at once (one of them killed after a round, then resumed), merged, give
  the records of one unsliced ``srdq run`` of the same command byte for byte (``results.jsonl``: every
  field but the wall times, which go to ``timings.jsonl``), and ``srdq export`` / ``report`` read the
  merged folder. Both sides run in the re-fed engine mode (``SRDQ_KV_REUSE=false``, as the resume tests of
  ``tests/integration/test_cli_run.py``): a slice runs whole shards of the run, so each shard's padded
  batches are the unsliced run's, and nothing cached by one shard's calls (prefix KV) is reused by
  another's, which would make the default mode's records equal only in distribution;
- a missing, unfinished or duplicated slice and a slice of another spec are refused (one line naming the
  slice index or the spec field, exit 1, nothing written); ``--allow-partial`` merges what is there and a
  later merge completes it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from srdq_cli.main import cli

from srd_worker.slicing import SliceOf, refuse_other_slice, slice_shards
from tests.cli import srdq_env

SRDQ = [sys.executable, "-m", "srdq_cli.main"]
ITEMS = 7  # 4 shards of 2: slices 0, 1 and 2 of 3 hold shards [0], [1], [2, 3]
RUN_ARGS = [
    "--method",
    "best_of_n",
    "--n",
    "3",
    "--reward",
    "arithmetic",
    "--model",
    "tiny-random-llama",
    "--max-new-tokens",
    "24",
    "--set",
    "chunk_tokens=8",
    "--seed",
    "7",
    "--shard-size",
    "2",
]
ENV = {"SRDQ_DTYPE": "float32", "SRDQ_DEVICE": "cpu", "SRDQ_KV_REUSE": "false", "OMP_NUM_THREADS": "1"}


def srdq(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SRDQ, *args], capture_output=True, text=True, env=srdq_env(**ENV, **extra), timeout=300
    )


def srdq_here(*args: str) -> Result:
    """A command that loads no model (merge, export, report), run in this process."""
    return CliRunner().invoke(cli, list(args))


def one_error_line(res: Result) -> str:
    lines = res.output.strip().splitlines()
    assert res.exit_code == 1 and len(lines) == 1 and lines[0].startswith("Error: "), res.output
    return lines[0]


# ------------------------------------------------------------------------------------ the partition
def test_slices_partition_the_shards_contiguously_and_evenly() -> None:
    for n_shards in range(1, 40):
        for count in range(1, n_shards + 1):
            parts = [slice_shards(n_shards, SliceOf(count, i)) for i in range(count)]
            assert [s for part in parts for s in part] == list(range(n_shards)), (n_shards, count)
            sizes = {len(part) for part in parts}
            assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1, (n_shards, count, sizes)


def test_a_folder_holds_one_slice(tmp_path: Path) -> None:
    from srd_worker.errors import ConfigError
    from srd_worker.slicing import write_marker

    whole = tmp_path / "whole" / "run-0123456789ab"
    whole.mkdir(parents=True)  # results of the whole run (no slice.json): no slice goes there
    refuse_other_slice(whole, "run-0123456789ab", None)
    with pytest.raises(ConfigError, match="holds the whole run run-0123456789ab"):
        refuse_other_slice(whole, "run-0123456789ab", SliceOf(3, 1))
    run_dir = tmp_path / "run-0123456789ab"
    refuse_other_slice(run_dir, "run-0123456789ab", SliceOf(3, 1))  # nothing there yet: any slice
    write_marker(run_dir, {"run_id": "run-0123456789ab", "num_shards": 3, "shard_index": 1})
    refuse_other_slice(run_dir, "run-0123456789ab", SliceOf(3, 1))  # the same slice resumes
    for other in (SliceOf(3, 2), SliceOf(4, 1), None):
        with pytest.raises(ConfigError, match="holds slice 1 of 3 of run-0123456789ab"):
            refuse_other_slice(run_dir, "run-0123456789ab", other)


def test_merge_names_a_file_or_a_missing_folder_given_as_a_slice(tmp_path: Path) -> None:
    file = tmp_path / "gsm8k.jsonl"
    file.write_text("{}\n")
    for given, says in ((file, "a file, not a slice's --out folder"), (tmp_path / "nope", "no such folder")):
        res = CliRunner().invoke(cli, ["merge", str(given), "--out", str(tmp_path / "merged")])
        assert res.exit_code == 1 and says in res.output, res.output
    assert not (tmp_path / "merged").exists()


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["--num-shards", "3"], "--num-shards needs --shard-index too"),
        (["--shard-index", "0"], "--shard-index needs --num-shards too"),
        (["--num-shards", "3", "--shard-index", "3"], "--shard-index must be in 0..2 for --num-shards 3"),
        (["--num-shards", "0", "--shard-index", "0"], "--num-shards must be >= 1"),
        (["--num-shards", "5", "--shard-index", "0"], "--num-shards 5 is more than the run's 4 shards"),
    ],
)
def test_bad_slice_options_one_line_nothing_written(
    tmp_path: Path, gsm8k_seven: Path, options: list[str], expected: str
) -> None:
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["run", str(gsm8k_seven), *RUN_ARGS, "--out", str(out), *options])
    assert res.exit_code == 1, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], res.output
    assert not out.exists()


# ------------------------------------------------------------------------------------ end to end
@pytest.fixture(scope="module")
def gsm8k_seven(tmp_path_factory, datasets_dir) -> Path:
    path = tmp_path_factory.mktemp("data") / "gsm8k_7.jsonl"
    lines = (datasets_dir / "gsm8k_test.jsonl").read_text(encoding="utf-8").splitlines()[:ITEMS]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@dataclass
class Sliced:
    root: Path
    reference: Path  # the unsliced run's --out
    slices: list[Path]  # slice I's --out
    unfinished_merge: Result  # merge while slice 2 was killed midway
    run_id: str


@pytest.fixture(scope="module")
def sliced(tmp_path_factory, gsm8k_seven: Path) -> Sliced:
    root = tmp_path_factory.mktemp("sliced")
    reference = root / "whole"
    whole = srdq("run", str(gsm8k_seven), *RUN_ARGS, "--out", str(reference))
    assert whole.returncode == 0, whole.stderr
    slices = [root / "slices" / str(i) for i in range(3)]
    # three processes at once, as a Slurm array runs them; slice 2 dies right after its first round
    procs = [
        subprocess.Popen(
            [*SRDQ, "run", str(gsm8k_seven), *RUN_ARGS, "--num-shards", "3", "--shard-index", str(i)]
            + ["--out", str(slices[i])],
            env=srdq_env(**ENV, **({"SRDQ_CRASH_AFTER_ROUND": "1"} if i == 2 else {})),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    codes = []
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        codes.append((proc.returncode, err))
    assert [c for c, _ in codes] == [0, 0, 86], codes  # 86: the crash hook's exit
    unfinished = srdq_here("merge", *map(str, slices), "--out", str(root / "too-early"))
    resumed = srdq(
        "run", str(gsm8k_seven), *RUN_ARGS, "--num-shards", "3", "--shard-index", "2", "--out", str(slices[2])
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "slice 2 of 3 of run-" in " ".join(resumed.stderr.split())
    (run_dir,) = reference.glob("run-*")
    return Sliced(root, reference, slices, unfinished, run_dir.name)


def results_of(folder: Path) -> bytes:
    (path,) = folder.glob("run-*/results.jsonl")
    return path.read_bytes()


@pytest.mark.e2e
def test_three_slices_merge_into_the_records_of_one_run(sliced: Sliced) -> None:
    # each slice's folder says which slice of which run it holds, and holds only that slice's records
    markers = [json.loads(next(s.glob("run-*/slice.json")).read_text()) for s in sliced.slices]
    assert [(m["run_id"], m["num_shards"], m["shard_index"]) for m in markers] == [
        (sliced.run_id, 3, i) for i in range(3)
    ]
    assert [m["shards"] for m in markers] == [[0, 1], [1, 2], [2, 4]]
    reference = results_of(sliced.reference).splitlines(keepends=True)
    assert b"".join(results_of(s) for s in sliced.slices) == b"".join(reference)

    out = sliced.root / "merged"
    merged = srdq_here("merge", str(sliced.root / "slices" / "*"), "--out", str(out))  # a glob, as quoted
    assert merged.exit_code == 0, merged.output
    assert f"{ITEMS} of {ITEMS} items with results" in merged.output
    assert results_of(out) == b"".join(reference)  # answers, tokens, candidates, rewards: every byte
    run_dir = out / sliced.run_id
    timings = [json.loads(line) for line in (run_dir / "timings.jsonl").read_text().splitlines()]
    assert [t["item_id"] for t in timings] == [json.loads(r)["item_id"] for r in reference]
    summary = json.loads((run_dir / "summary.json").read_text())
    whole = json.loads((sliced.reference / sliced.run_id / "summary.json").read_text())
    for key in ("wall_seconds", "results_path"):
        summary.pop(key), whole.pop(key)
    assert summary == whole
    info = json.loads((run_dir / "merge.json").read_text())
    assert (
        info["complete"] and info["missing"] == [] and [s["shard_index"] for s in info["slices"]] == [0, 1, 2]
    )

    # export and report read the merged folder as they read an unsliced run's
    exports = []
    for db in (out, sliced.reference):
        target = sliced.root / f"{db.name}.jsonl"
        done = srdq_here("export", sliced.run_id, "--format", "jsonl", "--out", str(target), "--db", str(db))
        assert done.exit_code == 0, done.output
        exports.append(
            [{k: v for k, v in json.loads(line).items() if k != "timing"} for line in target.open()]
        )
    assert exports[0] == exports[1] and len(exports[0]) == ITEMS
    assert {r["status"] for r in exports[0]} == {"done"}
    report = srdq_here("report", sliced.run_id, "--out", str(sliced.root / "report"), "--db", str(out))
    assert report.exit_code == 0, report.output
    text = (sliced.root / "report" / "report.md").read_text()
    assert sliced.run_id in text and "best_of_n" in text


@pytest.mark.e2e
def test_an_unfinished_slice_is_named_and_nothing_written(sliced: Sliced) -> None:
    line = one_error_line(sliced.unfinished_merge)
    assert "slice 2 in " in line and "is unfinished (0 of 2 shards done" in line, line
    assert not (sliced.root / "too-early").exists()


@pytest.mark.e2e
def test_a_missing_slice_is_listed_then_partial_then_completed(sliced: Sliced) -> None:
    out = sliced.root / "partial"
    missing = srdq_here("merge", str(sliced.slices[0]), str(sliced.slices[2]), "--out", str(out))
    line = one_error_line(missing)
    assert f"missing slices 1 of 3 of {sliced.run_id} (given: 0, 2)" in line, line
    assert not out.exists()

    partial = srdq_here(
        "merge", str(sliced.slices[0]), str(sliced.slices[2]), "--out", str(out), "--allow-partial"
    )
    assert partial.exit_code == 0, partial.output
    assert "missing slices: 1" in partial.output
    run_dir = out / sliced.run_id
    info = json.loads((run_dir / "merge.json").read_text())
    assert info["missing"] == [1] and not info["complete"] and info["results"] == ITEMS - 2
    reference = results_of(sliced.reference).splitlines(keepends=True)
    assert results_of(out).splitlines(keepends=True) == reference[:2] + reference[4:]
    assert not (run_dir / "summary.json").exists()  # written when every item has its result
    export = srdq_here(
        "export", sliced.run_id, "--format", "jsonl", "--out", str(sliced.root / "p.jsonl"), "--db", str(out)
    )
    assert export.exit_code == 0 and "2 without a result yet" in export.output, export.output

    done = srdq_here("merge", *map(str, sliced.slices), "--out", str(out))  # the same folder, now complete
    assert done.exit_code == 0, done.output
    assert results_of(out) == b"".join(reference)
    assert json.loads((run_dir / "merge.json").read_text())["complete"]
    assert json.loads((run_dir / "summary.json").read_text())["items"] == ITEMS


@pytest.mark.e2e
def test_duplicated_slices_and_slices_of_another_spec_are_refused(sliced: Sliced, gsm8k_seven: Path) -> None:
    out = sliced.root / "refused"
    twice = srdq_here("merge", *map(str, sliced.slices), str(sliced.slices[1]), "--out", str(out))
    assert "slice 1 of 3 given twice" in one_error_line(twice)
    other = sliced.root / "other-seed"
    args = [a if a != "7" else "8" for a in RUN_ARGS]  # --seed 8
    made = srdq(
        "run", str(gsm8k_seven), *args, "--num-shards", "3", "--shard-index", "1", "--out", str(other)
    )
    assert made.returncode == 0, made.stderr
    mixed = srdq_here("merge", str(sliced.slices[0]), str(other), str(sliced.slices[2]), "--out", str(out))
    line = one_error_line(mixed)
    assert "slices of different runs" in line and "differ in seed (7 vs 8)" in line, line
    assert not out.exists()


# ------------------------------------------------------------------------------------ the examples
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.mark.e2e
def test_the_slurm_example_runs_an_array_then_merges(tmp_path: Path, gsm8k_seven: Path) -> None:
    # the two sbatch scripts under bash, as Slurm would start them (array tasks 0 and 1 of 2, then the merge)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srdq").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m srdq_cli.main "$@"\n')
    (bin_dir / "srdq").chmod(0o755)
    results = tmp_path / "results"
    env = srdq_env(**ENV, NUM_SLICES="2", RESULTS=str(results), SLURM_ARRAY_TASK_MAX="1")
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    args = [str(gsm8k_seven), "--method", "sampling", "--model", "tiny-random-llama", "--max-new-tokens", "8"]
    args += ["--limit", "3", "--shard-size", "1"]
    for task in ("0", "1"):
        done = subprocess.run(
            ["bash", str(EXAMPLES / "slurm" / "srdq-slices.sbatch"), *args],
            env={**env, "SLURM_ARRAY_TASK_ID": task},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
    merged = subprocess.run(
        ["bash", str(EXAMPLES / "slurm" / "srdq-merge.sbatch")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert merged.returncode == 0, merged.stderr
    assert "merged slices 0, 1 of 2: 3 of 3 items with results" in merged.stdout
    (info,) = (results / "merged").glob("run-*/merge.json")
    assert json.loads(info.read_text())["complete"]
    # K must match the array: a task id past NUM_SLICES stops before running anything
    bad = subprocess.run(
        ["bash", str(EXAMPLES / "slurm" / "srdq-slices.sbatch"), *args],
        env={**env, "SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_MAX": "2"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "NUM_SLICES is 2" in bad.stderr


def test_the_kubernetes_example_is_an_indexed_job_whose_command_parses() -> None:
    import shlex

    import yaml

    docs = list(yaml.safe_load_all((EXAMPLES / "k8s" / "srdq-indexed-job.yaml").read_text()))
    (job,) = [d for d in docs if d["kind"] == "Job"]
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    (container,) = spec["template"]["spec"]["containers"]
    (script,) = container["args"]
    argv = shlex.split(script.replace("$JOB_COMPLETION_INDEX", "1"))
    assert argv[:3] == ["exec", "srdq", "run"]
    ctx = cli.commands["run"].make_context("run", argv[3:])  # the options exist and parse
    assert ctx.params["num_shards"] == spec["completions"] and ctx.params["shard_index"] == 1
    assert ctx.params["out_dir"] == "/results/slices/1"
    (merge_job,) = yaml.safe_load_all((EXAMPLES / "k8s" / "srdq-merge-job.yaml").read_text())
    (merger,) = merge_job["spec"]["template"]["spec"]["containers"]
    ctx = cli.commands["merge"].make_context("merge", list(merger["args"][1:]))
    assert ctx.params["folders"] == ("/results/slices/*",) and ctx.params["out_dir"] == "/results/merged"
