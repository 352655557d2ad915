"""Re-grading stored responses with the current grader, without generating anything again (pure: the
database side is ``srd_worker.regrade``).

For every result of the run that has a response, the run's task (rebuilt from the stored spec, with its
``--field`` mapping) extracts the answer and grades it again from the stored item (question, gold, meta);
the result row's ``correct`` and ``error`` columns and its record's ``answer``, ``correct``, ``metrics``
and ``grader_version`` are updated in one transaction. A result that failed in grading before and grades
now loses its error (and traceback); one whose grading fails now gets the new error, as the runner would
record it. Results without a response (the item failed before grading: prompt too long, generation
error) are left as they are. A record's ``candidates`` are graded again too (``answer`` and ``correct``
from each candidate's text; candidates stored without text keep their old grade), and their ``vote``
classes are set again (a record from before srdq kept them gets them). Regrading twice with
the same grader changes nothing the second time.

The store's schema is not changed: grader versions live in the result records. Left out: regrading a run
whose items are still being generated (results written meanwhile are simply not included; run it again),
and switching a run to another task.
"""

from __future__ import annotations

import traceback
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from srd_worker.tasks.base import Item, Task, grade_candidate, grade_response, vote_candidates


@dataclass
class RegradeReport:
    run_id: str
    task: str
    grader_version: str
    results: int = 0
    regraded: int = 0
    skipped: int = 0
    changed: int = 0
    errors: int = 0
    candidates_changed: int = 0
    previous_versions: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary_line(self) -> str:
        before = ", ".join(f"{v} ({n})" for v, n in sorted(self.previous_versions.items())) or "none"
        return (
            f"regraded {self.run_id} (task {self.task}, grader {self.grader_version}; before: {before}): "
            f"{self.regraded} of {self.results} results regraded, {self.changed} changed, "
            f"{self.skipped} without a response skipped, {self.errors} grader errors"
            + (f", {self.candidates_changed} candidate grades changed" if self.candidates_changed else "")
        )


def regrade_candidates(
    task: Task, item: Item, candidates: list[dict[str, Any]] | None
) -> list[dict[str, Any]] | None:
    """The record's candidates with ``answer`` and ``correct`` graded again from their text, and every
    candidate's ``vote`` class set again from the answers (``vote_candidates``). Candidates stored without
    text (``keep_candidates=answers``) keep their old answer and grade: there is nothing to grade them
    from."""
    if candidates is None:
        return None
    out = []
    for cand in candidates:
        entry = dict(cand)
        if "text" in cand:
            entry["answer"], entry["correct"] = grade_candidate(task, item, cand.get("text") or "")
        out.append(entry)
    vote_candidates(task, out)
    return out


def regrade_record(task: Task, item: Item, record: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``record`` graded again by ``task`` (as ``runner.build_record`` grades); ``record`` must
    have a response."""
    new = dict(record)
    new["extra"] = dict(record.get("extra") or {})
    new["grader_version"] = task.grader_version
    response = record["response"]
    try:
        grade_response(task, item, response, new)
        if record.get("candidates") is not None:
            new["candidates"] = regrade_candidates(task, item, record["candidates"])
        new["error"] = None
        new["extra"].pop("traceback", None)
    except Exception as exc:  # one item's grading failure must not stop the regrade
        new["error"] = f"{type(exc).__name__}: {exc}"
        new["correct"] = None
        new["extra"]["traceback"] = traceback.format_exc(limit=3)
    return new


def regrade_results(
    task: Task, run_id: str, items: dict[int, Item], results: list[tuple[int, int, dict[str, Any]]]
) -> tuple[RegradeReport, dict[int, dict[str, Any]]]:
    """Grade ``results`` ((result id, item row id, record) in dataset order) again with ``task``;
    ``items`` maps item row ids to their items. Returns the report and the new record per result id
    (results without a response are skipped and not returned)."""
    report = RegradeReport(
        run_id=run_id, task=task.name, grader_version=task.grader_version, results=len(results)
    )
    before: Counter[str] = Counter()
    updates: dict[int, dict[str, Any]] = {}
    for result_id, item_row_id, record in results:
        before[str(record.get("grader_version") or "unrecorded")] += 1
        if record.get("response") is None:
            report.skipped += 1
            continue
        new = regrade_record(task, items[item_row_id], record)
        report.regraded += 1
        report.errors += new["error"] is not None
        if (new.get("answer"), new.get("correct"), new.get("error")) != (
            record.get("answer"),
            record.get("correct"),
            record.get("error"),
        ):
            report.changed += 1
        old_grades = [(c.get("answer"), c.get("correct")) for c in record.get("candidates") or []]
        new_grades = [(c.get("answer"), c.get("correct")) for c in new.get("candidates") or []]
        report.candidates_changed += sum(a != b for a, b in zip(old_grades, new_grades, strict=False))
        updates[result_id] = new
    report.previous_versions = dict(before)
    return report, updates
