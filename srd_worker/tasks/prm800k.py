"""PRM800K step labels (Lightman et al., 2023, "Let's Verify Step by Step"): a reader for reward-model checks.

This is not an evaluation task, and ``--task auto`` says so. A PRM800K record is one model-written
solution to a MATH problem whose *steps* carry human ratings (+1 good, 0 neutral, -1 bad); there is no
prompt to generate for that MATH-500 does not already cover (its problems are MATH problems), and six
sample records are no benchmark. What the file is good for is checking a process reward model: given the
same problem and the same accepted steps so far, a good PRM scores a step rated +1 above one rated -1.
``rated_steps`` yields exactly those (problem, prefix, step, rating) cases.

Follows the raw ``openai/prm800k`` schema (phase 1 and 2): ``question.problem``,
``question.ground_truth_answer``, ``label.finish_reason`` and ``label.steps``; each step has
``completions`` (list of ``{text, rating, flagged}``, or null), ``human_completion`` (or null) and
``chosen_completion`` (an index, or null when the labeller wrote a step or stopped). The accepted path
continues with the chosen completion, else the human completion; a step with neither ends it.

Left out: ``pre_generated_*`` fields of phase 2, quality-control flags, and the ``flagged`` marks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from srd_worker.tasks.loading import DEFAULT_MAX_ROW_BYTES, Rows, read_rows


@dataclass(frozen=True)
class LabelledStep:
    text: str
    rating: int | None
    source: str  # "model" or "human"


@dataclass(frozen=True)
class PrmStep:
    candidates: list[LabelledStep]
    chosen: LabelledStep | None


@dataclass(frozen=True)
class PrmRecord:
    id: str
    problem: str
    answer: str
    finish_reason: str
    steps: list[PrmStep] = field(default_factory=list)

    def path(self) -> list[str]:
        """The accepted solution steps, up to the first step with no chosen or human completion."""
        out: list[str] = []
        for step in self.steps:
            if step.chosen is None:
                break
            out.append(step.chosen.text)
        return out


@dataclass(frozen=True)
class RatedStep:
    """One reward-model check: ``step`` continues ``prefix`` (accepted steps) and was rated ``rating``."""

    record_id: str
    problem: str
    prefix: str
    step: str
    rating: int


def is_prm800k_row(row: dict[str, Any]) -> bool:
    """True if ``row`` has the PRM800K layout (``question.problem`` and ``label.steps``)."""
    question, label = row.get("question"), row.get("label")
    return (
        isinstance(question, dict) and "problem" in question and isinstance(label, dict) and "steps" in label
    )


def _step_text(rows: Rows, at: int, where: str, obj: Any, source: str) -> LabelledStep:
    if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
        raise rows.error("must be an object with a string 'text'", at, where)
    rating = obj.get("rating")
    if rating is not None and (isinstance(rating, bool) or rating not in (-1, 0, 1)):
        raise rows.error(f"rating must be -1, 0, 1 or null, got {rating!r}", at, where)
    return LabelledStep(text=obj["text"], rating=rating, source=source)


def _record(rows: Rows, at: int, row: dict[str, Any]) -> PrmRecord:
    if not is_prm800k_row(row):
        raise rows.error("not a PRM800K record (needs question.problem and label.steps)", at, "label")
    question, label = row["question"], row["label"]
    rows.require(at, question, ("problem",))
    steps_raw = label["steps"]
    if not isinstance(steps_raw, list):
        raise rows.error("must be a list", at, "label.steps")
    steps: list[PrmStep] = []
    for i, raw in enumerate(steps_raw):
        where = f"label.steps[{i}]"
        if not isinstance(raw, dict):
            raise rows.error("must be an object", at, where)
        candidates = [
            _step_text(rows, at, f"{where}.completions[{j}]", c, "model")
            for j, c in enumerate(raw.get("completions") or [])
        ]
        human = raw.get("human_completion")
        chosen_index = raw.get("chosen_completion")
        chosen: LabelledStep | None = None
        if chosen_index is not None:
            if (
                isinstance(chosen_index, bool)
                or not isinstance(chosen_index, int)
                or not 0 <= chosen_index < len(candidates)
            ):
                raise rows.error(
                    f"chosen_completion {chosen_index!r} is not an index into the "
                    f"{len(candidates)} completions",
                    at,
                    where,
                )
            chosen = candidates[chosen_index]
        elif human is not None:
            chosen = _step_text(rows, at, f"{where}.human_completion", human, "human")
        steps.append(PrmStep(candidates=candidates, chosen=chosen))
    return PrmRecord(
        id=f"{rows.unit}-{at}",
        problem=question["problem"],
        answer=str(question.get("ground_truth_answer") or ""),
        finish_reason=str(label.get("finish_reason") or ""),
        steps=steps,
    )


def load_prm800k(path: str | Path, *, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES) -> list[PrmRecord]:
    """Read and validate a PRM800K labels file (errors name the file, line and field path)."""
    rows = read_rows(path, max_row_bytes=max_row_bytes)
    return [_record(rows, at, row) for at, row in rows]


def rated_steps(record: PrmRecord) -> Iterator[RatedStep]:
    """Every rated candidate step, with the accepted steps before it as the prefix (one line per step)."""
    prefix: list[str] = []
    for step in record.steps:
        for cand in step.candidates:
            if cand.rating is not None:
                yield RatedStep(
                    record_id=record.id,
                    problem=record.problem,
                    prefix="\n".join(prefix),
                    step=cand.text,
                    rating=cand.rating,
                )
        if step.chosen is None:
            return
        prefix.append(step.chosen.text)
