"""Task registry: names to task classes, dataset auto-detection, and one-call loading.

Follows the ``--task`` choices of the CLI: ``gsm8k``, ``math500`` or ``auto``. Auto-detection looks only at
the first non-blank row's fields: ``problem`` + ``answer`` means MATH-500; ``question`` + ``answer`` with a
``####`` final-answer line means GSM8K. Left out: plugin discovery (new tasks are added to ``TASKS`` by
hand) and detection of any other dataset layout (those need an explicit ``--task``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from srd_worker.errors import ConfigError
from srd_worker.tasks.base import Item, Task
from srd_worker.tasks.gsm8k import GSM8KTask
from srd_worker.tasks.loading import read_jsonl
from srd_worker.tasks.math500 import Math500Task

TASKS: dict[str, type[GSM8KTask] | type[Math500Task]] = {"gsm8k": GSM8KTask, "math500": Math500Task}

AUTO: str = "auto"


def _choices() -> str:
    return ", ".join(sorted(TASKS))


def get_task(name: str) -> Task:
    """A new task instance for ``name``; ``ConfigError`` listing the valid choices if it is unknown."""
    try:
        cls = TASKS[name]
    except (KeyError, TypeError):
        raise ConfigError(f"unknown task {name!r}; valid choices: {_choices()}") from None
    return cls()


def _first_row(path: str | Path) -> dict[str, Any]:
    """The first non-blank row, read without loading the whole file when the file is sound."""
    try:
        with open(path, "rb") as fh:
            for raw in fh:
                text = raw.decode("utf-8").removeprefix("\ufeff")
                if text.strip():
                    row = json.loads(text)
                    if isinstance(row, dict):
                        return row
                    break
    except (OSError, UnicodeDecodeError, ValueError):
        pass
    # Something is wrong (or the first row is not an object): let the full reader name file/line/reason.
    return read_jsonl(path)[0][1]


def detect_task(path: str | Path) -> str:
    """The task name that fits the dataset at ``path`` (from its first row's fields).

    Raises ``DatasetError`` if the file cannot be read, ``ConfigError`` (suggesting ``--task``) if the
    layout is not recognised.
    """
    row = _first_row(path)
    answer = row.get("answer")
    if "problem" in row and "answer" in row:
        return "math500"
    if "question" in row and isinstance(answer, str) and "####" in answer:
        return "gsm8k"
    fields = ", ".join(sorted(row)) or "none"
    raise ConfigError(
        f"cannot tell which task {path} is for from its first row (fields: {fields}); "
        f"pass --task with one of: {_choices()}"
    )


def load_items(path: str | Path, task_name: str = AUTO) -> tuple[Task, list[Item]]:
    """Resolve the task (``auto`` detects it) and load and validate all items of ``path``."""
    name = detect_task(path) if task_name == AUTO else task_name
    task = get_task(name)
    return task, task.load(path)
