"""``docs/report_example.md``: what ``srdq report`` writes, on runs whose numbers carry information.

Runs sampling, Best-of-4 and SRD (n = 4) on the first ``--items`` problems of the CPU testbed (its trained
policy and outcome RM, float32) with ``srdq run`` as a user would, then ``srdq report`` on the three runs,
and copies the report and its figures into docs/ (figure names prefixed ``report_example_``). Runs are
resumable (deterministic run ids in ``--work``); a few minutes on two cores.

    .venv/bin/python benchmarks/report_example.py [--items 100] [--work /tmp/srdq-report-example]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRDQ = [str(Path(sys.executable).parent / "srdq")]
RUNS: tuple[tuple[str, list[str]], ...] = (
    ("sampling", []),
    ("best_of_n", ["--n", "4"]),
    ("srd", ["--n", "4"]),
)


def srdq(*args: str, env: dict[str, str]) -> str:
    print("$ srdq " + shlex.join(args), file=sys.stderr, flush=True)
    proc = subprocess.run([*SRDQ, *args], capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"srdq {shlex.join(args)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return proc.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=100)
    ap.add_argument("--work", default="/tmp/srdq-report-example")
    ap.add_argument("--no-write", action="store_true", help="leave docs/ alone")
    args = ap.parse_args()
    work = Path(args.work)
    out = work / "runs"
    env = {**os.environ, "SRDQ_DTYPE": "float32", "SRDQ_DEVICE": "cpu"}
    common = [
        "--model",
        "testbed",
        "--reward",
        "hf-orm:testbed-rm",
        "--limit",
        str(args.items),
        "--seed",
        "0",
    ]
    commands, run_ids = [], []
    for method, extra in RUNS:
        cmd = ["run", "testbed", "--method", method, *extra, *common, "--out", str(out)]
        srdq(*cmd, env=env)
        commands.append(cmd)
        summaries = [json.loads(p.read_text()) for p in out.glob("run-*/summary.json")]
        (run_id,) = [s["run_id"] for s in summaries if s.get("method") == method]
        run_ids.append(run_id)
    report_dir = work / "report"
    shutil.rmtree(report_dir, ignore_errors=True)
    report = ["report", *run_ids, "--out", str(report_dir), "--db", str(out / "srdq.db")]
    srdq(*report, env=env)
    text = (report_dir / "report.md").read_text(encoding="utf-8")
    figures = sorted(p.name for p in report_dir.glob("*.png"))
    for name in figures:
        text = text.replace(f"]({name})", f"](report_example_{name})")
    header = (
        "<!-- Written by benchmarks/report_example.py (SRDQ_DTYPE=float32, 2-core CPU):\n"
        + "".join(f"  srdq {shlex.join(c).replace(str(out), 'OUT')}\n" for c in [*commands, report])
        + "Regenerate with: .venv/bin/python benchmarks/report_example.py -->\n\n"
    )
    print(header + text)
    if not args.no_write:
        for old in (ROOT / "docs").glob("report_example*.png"):
            old.unlink()
        for name in figures:
            shutil.copyfile(report_dir / name, ROOT / "docs" / f"report_example_{name}")
        (ROOT / "docs" / "report_example.md").write_text(header + text, encoding="utf-8")


if __name__ == "__main__":
    main()
