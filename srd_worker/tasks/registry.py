"""Task registry: names to task classes, dataset auto-detection, and one-call loading.

Follows the ``--task`` choices of the CLI: ``gsm8k``, ``math500``, ``gpqa``, ``hotpotqa``, ``alpaca_eval``,
``openai_batch``, ``generic`` or ``auto``. Auto-detection looks only at the first row's fields (JSONL: first non-blank line;
CSV: header and first record; Parquet: first row):

- ``problem`` + ``answer``: MATH-500; ``question`` + ``answer`` with a ``####`` final-answer line: GSM8K;
- ``Question`` + ``Correct Answer`` + ``Incorrect Answer 1``: GPQA (the authors' CSV columns);
- ``question`` + ``context`` + ``answer`` (or ``supporting_facts`` / ``supporting_titles``): HotpotQA;
- ``instruction`` (with no ``input``, i.e. not an Alpaca *training* row): AlpacaEval;
- ``custom_id`` + ``body``: an OpenAI batch-API request file (``openai_batch``);
- PRM800K step labels: refused with a message saying what the file is (see ``prm800k.py``);
- any ``--field`` mapping: the generic task.

Besides the built-in names, ``--task`` takes a task file (a path ending in ``.yaml``/``.yml``) or the
``name`` of a task file found in an ``--include-path`` folder (``tasks.task_file``); such a task is a
``DefinedTask`` built from the file's definition, which the run spec records (``RunSpec.task_def``) so
workers rebuild it without the file (``get_task(..., definition=...)``). Task files are never
auto-detected.

Each entry (``plugins.Registry`` shape) names the task, says in one line what it reads and how it grades,
lists the fields it requires and builds it. Left out: Python plugin discovery (new Python tasks are added to ``TASKS``
by hand; task files need no code) and detection of other layouts
(those need ``--task`` or ``--field``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from srd_worker.errors import ConfigError
from srd_worker.plugins import Entry, Registry
from srd_worker.tasks.alpaca_eval import AlpacaEvalTask
from srd_worker.tasks.base import Item, Task
from srd_worker.tasks.defined import DefinedTask
from srd_worker.tasks.generic import GenericTask
from srd_worker.tasks.gpqa import CORRECT, INCORRECT, QUESTION, GPQATask
from srd_worker.tasks.gsm8k import GSM8KTask
from srd_worker.tasks.hotpotqa import HotpotQATask
from srd_worker.tasks.loading import DEFAULT_MAX_ROW_BYTES, file_format, is_gzip, read_jsonl, read_rows
from srd_worker.tasks.math500 import Math500Task
from srd_worker.tasks.openai_batch import OpenAIBatchTask, is_openai_batch_row
from srd_worker.tasks.prm800k import is_prm800k_row
from srd_worker.tasks.task_file import is_task_file, parse_task_file, task_files


@dataclass(frozen=True)
class TaskEntry(Entry):
    factory: Callable[[Mapping[str, str] | None, int], Task]  # (fields, max_row_bytes) -> Task
    required_fields: tuple[str, ...]  # empty for generic: its --field mapping says


def _builtin(cls: Any, summary: str) -> TaskEntry:
    """The entry of a built-in task class."""

    def factory(fields: Mapping[str, str] | None, max_row_bytes: int) -> Task:
        if fields:
            raise ConfigError(
                f"--field applies to --task generic (or auto) only; task {cls.name!r} reads its own "
                f"fields: {', '.join(cls.required_fields)}"
            )
        task: Task = cls(max_row_bytes=max_row_bytes)
        return task

    return TaskEntry(name=cls.name, summary=summary, factory=factory, required_fields=cls.required_fields)


def _generic(fields: Mapping[str, str] | None, max_row_bytes: int) -> Task:
    return GenericTask(fields, max_row_bytes=max_row_bytes)


#: In the order ``--help`` and error messages list them.
TASKS: Registry[TaskEntry] = Registry(
    "task",
    [
        _builtin(
            GSM8KTask, "grade-school word problems; the final number (\\boxed{} or last number) vs '#### n'"
        ),
        _builtin(Math500Task, "competition math; the \\boxed{} answer vs the gold, by math-verify"),
        _builtin(
            GPQATask, "graduate-level multiple choice (options shuffled per item); graded by the letter"
        ),
        _builtin(HotpotQATask, "multi-hop questions over given passages; exact match (F1 in the metrics)"),
        _builtin(
            AlpacaEvalTask, "open-ended instructions with no gold answer (ungraded; export for a judge)"
        ),
        _builtin(
            OpenAIBatchTask,
            "OpenAI batch-API requests (custom_id, body.messages or body.prompt); ungraded, custom_id kept",
        ),
        TaskEntry(
            name="generic",
            summary="prompt (and optionally answer and id) columns of any supported file, named by --field",
            factory=_generic,
            required_fields=(),
        ),
    ],
    sort=False,
)

AUTO: str = "auto"
GENERIC: str = "generic"


def _choices() -> str:
    return TASKS.choices()


def get_task(
    name: str,
    *,
    fields: Mapping[str, str] | None = None,
    max_row_bytes: int = DEFAULT_MAX_ROW_BYTES,
    definition: Mapping[str, Any] | None = None,
    include_paths: Iterable[str | Path] = (),
) -> Task:
    """A new task instance for ``name``; ``ConfigError`` listing the valid choices if it is unknown.

    ``fields`` (the ``--field`` mapping) is for the generic task only; the worker passes the run spec's
    mapping back in so it rebuilds the same task. ``definition`` (a spec's ``task_def``) builds the task
    a task file defined, without the file. Otherwise ``name`` may also be a task file's path or the name
    of a task file in one of ``include_paths``.
    """
    if definition:
        return _defined(dict(definition), fields, max_row_bytes)
    if is_task_file(name):
        return _defined(parse_task_file(name), fields, max_row_bytes)
    if name in TASKS:
        return TASKS.entry(name).factory(fields, max_row_bytes)
    included = task_files(include_paths)
    if name in included:
        return _defined(included[name][1], fields, max_row_bytes)
    extra = f", or a task file in --include-path: {', '.join(included)}" if included else ""
    raise ConfigError(
        f"unknown task {name!r}; choose one of: {_choices()}{extra}, or a task file path (*.yaml)"
    )


def task_of_spec(spec: Mapping[str, Any]) -> Task:
    """The task a stored run spec names, rebuilt as its workers rebuilt it (name, ``--field`` mapping,
    a task file's ``task_def``)."""
    return get_task(spec["task"], fields=spec.get("fields") or {}, definition=spec.get("task_def") or None)


def _defined(definition: dict[str, Any], fields: Mapping[str, str] | None, max_row_bytes: int) -> Task:
    if fields:
        raise ConfigError(
            f"--field applies to --task generic (or auto) only; task file {definition['name']!r} names its "
            "own columns (its prompt placeholders and fields)"
        )
    return DefinedTask(definition, max_row_bytes=max_row_bytes)


def _first_row(path: str | Path, max_row_bytes: int) -> dict[str, Any]:
    """The first row, read without loading the whole JSONL file when the file is sound."""
    fmt = file_format(path)
    if fmt != "jsonl" or is_gzip(
        path
    ):  # streamed: only the header and first record (Parquet: first batch) are read
        for _at, row in read_rows(path, max_row_bytes=max_row_bytes, fmt=fmt, stream=True):
            return row
    try:
        with open(path, "rb") as fh:
            for raw in fh:
                if len(raw) > max_row_bytes:
                    break
                text = raw.decode("utf-8").removeprefix("\ufeff")
                if text.strip():
                    row = json.loads(text)
                    if isinstance(row, dict):
                        return row
                    break
    except (OSError, UnicodeDecodeError, ValueError):
        pass
    # Something is wrong (or the first row is not an object): let the full reader name file/line/reason.
    return read_jsonl(path, max_row_bytes=max_row_bytes)[0][1]


def detect_task(path: str | Path, *, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES) -> str:
    """The task name that fits the dataset at ``path`` (from its first row's fields).

    Raises ``DatasetError`` if the file cannot be read, ``ConfigError`` (suggesting ``--task`` or
    ``--field``) if the layout is not recognised or is not a task at all (PRM800K labels).
    """
    row = _first_row(path, max_row_bytes)
    answer = row.get("answer")
    if is_prm800k_row(row):
        raise ConfigError(
            f"{path} holds PRM800K step labels (human ratings of solution steps), not evaluation prompts: "
            "it is not a task; use srd_worker.tasks.prm800k.load_prm800k to check reward models with it, "
            "or math500 for the MATH problems"
        )
    if is_openai_batch_row(row):
        return "openai_batch"
    if QUESTION in row and CORRECT in row and INCORRECT[0] in row:
        return "gpqa"
    if "problem" in row and "answer" in row:
        return "math500"
    if "question" in row and isinstance(answer, str) and "####" in answer:
        return "gsm8k"
    if (
        "question" in row
        and "context" in row
        and ("answer" in row or "supporting_facts" in row or "supporting_titles" in row)
    ):
        return "hotpotqa"
    if "instruction" in row and not row.get("input"):
        return "alpaca_eval"
    fields = ", ".join(sorted(row)) or "none"
    near = ""
    if "question" in row and "answer" in row:  # GSM8K's fields, without its answer format
        near = (
            f" (its 'answer' is {_json_kind(answer)} without GSM8K's final '#### N' line: --task gsm8k wants "
            "that; --field prompt=question --field answer=answer takes it as the gold answer as it is)"
        )
    raise ConfigError(
        f"cannot tell which task {path} is for from its first row (fields: {fields}){near}; "
        f"pass --task with one of: {_choices()}, or --field prompt=COLUMN [--field answer=COLUMN]"
    )


def _json_kind(value: Any) -> str:
    if isinstance(value, str):
        return "text"
    if isinstance(value, bool) or value is None:
        return f"JSON {json.dumps(value)}"
    if isinstance(value, int | float):
        return "a number"
    return f"a JSON {'array' if isinstance(value, list) else 'object'}"


def load_items(
    path: str | Path,
    task_name: str = AUTO,
    *,
    fields: Mapping[str, str] | None = None,
    max_row_bytes: int = DEFAULT_MAX_ROW_BYTES,
    include_paths: Iterable[str | Path] = (),
) -> tuple[Task, list[Item]]:
    """Resolve the task (``auto`` detects it; a ``fields`` mapping means generic), load and validate all
    items of ``path``."""
    task = resolve_task(
        path, task_name, fields=fields, max_row_bytes=max_row_bytes, include_paths=include_paths
    )
    return task, task.load(path)


def resolve_task(
    path: str | Path,
    task_name: str = AUTO,
    *,
    fields: Mapping[str, str] | None = None,
    max_row_bytes: int = DEFAULT_MAX_ROW_BYTES,
    include_paths: Iterable[str | Path] = (),
) -> Task:
    """The task for ``path`` (``auto`` detects it from the first row; a ``fields`` mapping means generic),
    without reading the rest of the file. ``task_name`` may be a task file or a task of ``include_paths``."""
    if task_name == AUTO:
        name = GENERIC if fields else detect_task(path, max_row_bytes=max_row_bytes)
    else:
        name = task_name
    return get_task(name, fields=fields, max_row_bytes=max_row_bytes, include_paths=include_paths)


def task_definition(task: Task) -> dict[str, Any] | None:
    """The definition a run spec records for ``task``: a task file's, or None for a built-in task."""
    return dict(task.definition) if isinstance(task, DefinedTask) else None


def list_tasks(include_paths: Iterable[str | Path] = ()) -> list[dict[str, Any]]:
    """Every task ``--task`` can name: the built-ins, then the task files of ``include_paths`` (name,
    summary, the fields it reads, and the file for a task file)."""
    out: list[dict[str, Any]] = [
        {"name": e.name, "summary": e.summary, "fields": list(e.required_fields), "file": None}
        for e in TASKS.values()
    ]
    for name, (file, definition) in task_files(include_paths).items():
        task = DefinedTask(definition)
        out.append(
            {"name": name, "summary": task.summary, "fields": list(task.required_fields), "file": str(file)}
        )
    return out
