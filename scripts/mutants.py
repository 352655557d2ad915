"""Mutation testing as a habit: ``make mutants`` runs mutmut over the decision code and keeps docs/MUTANTS.md.

    .venv/bin/python scripts/mutants.py run       # mutmut on the scope below, then the report
    .venv/bin/python scripts/mutants.py report    # only the report, from mutmut's stored results
    .venv/bin/python scripts/mutants.py run --all # every mutant pyproject's [tool.mutmut] generates

The scope (``[tool.srdq-mutants] scope`` in pyproject.toml, fnmatch patterns over mutmut's mutant names)
is the code that decides: the routing and boundary rules, the speculative accept/reject rules, the
answer rules of the fixed pools, rejection sampling and Speculative Rejection, SRD's method class, the
k-curves, the statistics and the coupled comparison. ``--all`` adds the loops and pools (SRD's loop,
step search, the pool, the method base, ∇-Reasoner, the speculative driver): about 4,500 more mutants,
hours on two cores.

The report lists every surviving mutant of the scope (and every one no selected test reaches) and the
line of docs/MUTANTS.md's *Explained* table that covers it (a backticked fnmatch pattern in its first
column). It exits 1 when a survivor has no explanation: kill it with a test, or explain it there.
mutmut resumes where it stopped and re-tests only functions whose code or tests changed.
"""

from __future__ import annotations

import argparse
import fnmatch
import re
import subprocess
import sys
import time
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "MUTANTS.md"
MUTMUT = [sys.executable, "-m", "mutmut"]
KILLED = {"killed", "timeout"}  # a mutant that makes a test hang is caught too
NEEDS_WORD = {"survived", "no tests"}


def scope() -> list[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return list(data["tool"]["srdq-mutants"]["scope"])


def results() -> dict[str, str]:
    """mutant name -> status, from ``mutmut results --all true``."""
    out = subprocess.run([*MUTMUT, "results", "--all", "true"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"mutmut results failed:\n{out.stderr[-2000:]}")
    rows = {}
    for line in out.stdout.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and name:
            rows[name] = status.strip()
    return rows


def explanations() -> list[tuple[str, str]]:
    """(pattern, reason) rows of docs/MUTANTS.md's *Explained* table."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Explained", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        m = re.match(r"\|\s*`([^`]+)`\s*\|(.*)\|\s*$", line)
        if m:
            rows.append((m.group(1), m.group(2).strip()))
    return rows


def in_scope(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def report(patterns: list[str], seconds: float | None) -> int:
    rows = {n: s for n, s in results().items() if in_scope(n, patterns)}
    counts = Counter(rows.values())
    explained = explanations()
    lines = []
    missing = []
    for name, status in sorted(rows.items()):
        if status not in NEEDS_WORD:
            continue
        why = next((p for p, _ in explained if fnmatch.fnmatchcase(name, p)), None)
        if why is None:
            missing.append(name)
        lines.append(f"| `{name}` | {status} | {'`' + why + '`' if why else '**not explained**'} |")
    checked = sum(counts[s] for s in KILLED | NEEDS_WORD)
    killed = sum(counts[s] for s in KILLED)
    score = f"{100 * killed / checked:.1f}%" if checked else "n/a"
    summary = (
        f"Scope: {len(rows)} mutants; checked {checked}: killed {counts['killed']}, timed out "
        f"{counts['timeout']} (counted as killed), survived {counts['survived']}, reached by no selected "
        f"test {counts['no tests']}; not checked yet {counts['not checked']}. Score (killed ÷ checked): "
        f"**{score}**."
        + (f" This run: {seconds / 60:.0f} min." if seconds is not None else "")
        + f" Survivors without an explanation: {len(missing)}."
    )
    body = "\n".join(
        [summary, "", "| mutant | status | explained by |", "|---|---|---|", *lines]
        if lines
        else [summary, "", "No survivor."]
    )
    text = DOC.read_text(encoding="utf-8")
    start, end = "<!-- survivors:start -->", "<!-- survivors:end -->"
    head, _, rest = text.partition(start)
    _, _, tail = rest.partition(end)
    DOC.write_text(f"{head}{start}\n{body}\n{end}{tail}", encoding="utf-8")
    print(summary)
    if missing:
        print("not explained (kill each with a test, or explain it in docs/MUTANTS.md):", file=sys.stderr)
        for name in missing:
            print(f"  {name}", file=sys.stderr)
        return 1
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=("run", "report"))
    ap.add_argument("--all", action="store_true", help="every generated mutant, not only the scope")
    ap.add_argument("--max-children", type=int, default=2)
    args = ap.parse_args()
    patterns = ["*"] if args.all else scope()
    seconds = None
    if args.command == "run":
        t0 = time.monotonic()
        cmd = [*MUTMUT, "run", "--max-children", str(args.max_children)]
        subprocess.run(cmd + ([] if args.all else patterns), cwd=ROOT, check=False)
        seconds = time.monotonic() - t0
    raise SystemExit(report(patterns, seconds))


if __name__ == "__main__":
    main()
