"""``DefinedTask``: the task a task file defines (``tasks.task_file``), built from its definition.

The definition is the plain dict a run spec records (``RunSpec.task_def``), so ``srdq run``, a fleet
worker and ``srdq regrade`` build the same task from it, on any machine, without the file.

- **Items**: each row's columns fill the prompt template (``{{ NAME }}`` -> ``fields[NAME]``); the rendered
  prompt is the item's ``question`` (what the policy, the judge and the reward models see). A column must
  hold non-blank text or a number. The gold answer (``answer`` column) is kept as text; for the ``math``
  and ``numeric`` graders a ``\\boxed{x}`` or ``#### x`` gold is reduced to ``x`` as for the generic task.
- **Prompt**: system prompt, then each few-shot example (a user turn and an assistant turn), then the
  question. ``chat_template: model`` lets the engine apply the model's chat template; ``none`` sends a
  plain prompt: the system prompt and the shots (``user + target_delimiter + assistant``) and the question,
  joined by ``fewshot_delimiter`` and then ``target_delimiter`` (so a template ending in ``A:`` continues
  there); any other value is a Jinja chat template rendered (sandboxed) with ``messages`` and
  ``add_generation_prompt`` and tokenised as text (special tokens written in it are the tokenizer's).
- **Stop strings** end every generation request of the run (``StepContext``), for the methods that sample
  through it (all but ``nabla_reasoner`` and the speculative family, which refuse a task with stop strings).
- **Answer**: the extractor, then the grader (``task_file.EXTRACTORS``, ``task_file.GRADERS``). A
  ``module:function`` extractor is called as ``fn(response) -> str | None``; a grader as
  ``fn(answer, gold, response) -> bool | None`` (``answer`` may be None).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from srd_worker.errors import ConfigError
from srd_worker.tasks.base import Item
from srd_worker.tasks.grading import (
    GRADER_VERSION as MATH_GRADER_VERSION,
)
from srd_worker.tasks.grading import (
    commas_dropped,
    extract_answer,
    extract_boxed,
    last_number,
    math_equal,
    same_answer,
    strip_number_commas,
)
from srd_worker.tasks.loading import DEFAULT_MAX_ROW_BYTES, Rows, read_rows
from srd_worker.tasks.task_file import FORMAT_VERSION, _import_callable, render
from srd_worker.votes import answer_key


def definition_digest(definition: dict[str, Any]) -> str:
    """A short sha256 of a definition's canonical JSON (names the task's content in versions)."""
    text = json.dumps(definition, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _extractor(spec: str | dict[str, str]) -> Callable[[str], str | None]:
    if isinstance(spec, dict):
        pattern = re.compile(spec["regex"])

        def by_regex(text: str) -> str | None:
            matches = list(pattern.finditer(text))
            if not matches:
                return None
            m = matches[-1]
            found = m.group(1) if m.groups() else m.group(0)
            return None if found is None else found.strip()

        return by_regex
    if spec == "boxed":
        return lambda text: extract_answer(text)
    if spec == "boxed_or_last_number":
        return lambda text: _no_commas(extract_answer(text, fallback_last_number=True))
    if spec == "last_number":
        return last_number
    if spec == "last_line":
        return lambda text: next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), None)
    if spec == "full":
        return lambda text: text.strip() or None
    if spec == "choice":
        from srd_worker.tasks.gpqa import extract_letter

        return extract_letter
    fn = _import_callable(spec, None, "extractor")
    return lambda text: _optional_text(fn(text))


def _no_commas(answer: str | None) -> str | None:
    return None if answer is None else strip_number_commas(answer)


def _optional_text(value: Any) -> str | None:
    return None if value is None else str(value)


def _numeric_equal(pred: str, gold: str) -> bool:
    try:
        a, b = float(strip_number_commas(pred)), float(strip_number_commas(gold))
    except ValueError:
        return False
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)


class DefinedTask:
    """A task from a task file's definition (see the module docstring)."""

    def __init__(self, definition: dict[str, Any], *, max_row_bytes: int = DEFAULT_MAX_ROW_BYTES) -> None:
        if definition.get("format") != FORMAT_VERSION:
            raise ConfigError(
                f"task definition format {definition.get('format')!r} is not one this srdq reads "
                f"({FORMAT_VERSION}): upgrade srdq on this machine"
            )
        self.definition = definition
        self.name: str = definition["name"]
        self.max_row_bytes = max_row_bytes
        self.fields: dict[str, str] = dict(definition["fields"])
        self.stop: tuple[str, ...] = tuple(definition.get("stop") or ())
        self._extract = _extractor(definition["extractor"])
        grader = definition["grader"]
        self._custom_grader = (
            _import_callable(grader, None, "grader") if grader not in _BUILTIN_GRADERS else None
        )

    # ------------------------------------------------------------------ Task protocol
    @property
    def required_fields(self) -> tuple[str, ...]:
        answer = self.definition.get("answer")
        return tuple(dict.fromkeys([*self.fields.values(), *([answer] if answer else [])]))

    @property
    def grader_version(self) -> str:
        d = self.definition
        if d.get("grader_version"):
            return str(d["grader_version"])
        extractor = "regex" if isinstance(d["extractor"], dict) else d["extractor"]
        # 2: the last-number extractors read a fraction whole (tasks/grading.py, grader 2)
        rev = 2 if extractor in ("last_number", "boxed_or_last_number") else 1
        version = f"task-file-{rev}:{extractor}/{d['grader']}"
        return version + (f"+{MATH_GRADER_VERSION}" if d["grader"] == "math" else "")

    @property
    def summary(self) -> str:
        return str(self.definition.get("description") or f"task file {self.name}")

    def load(self, path: str | Path) -> list[Item]:
        return read_rows(path, max_row_bytes=self.max_row_bytes).items(self._item)

    def _item(self, rows: Rows, at: int, row: dict[str, Any]) -> Item:
        values = {name: self._value(rows, at, row, column) for name, column in self.fields.items()}
        question = render(self.definition["prompt"], values)
        gold = ""
        answer = self.definition.get("answer")
        if answer:
            gold = rows.text(at, row, answer, numbers=True)
            if self.definition["grader"] in ("math", "numeric"):
                from srd_worker.tasks.generic import gold_answer

                gold = gold_answer(gold)
                if not gold:
                    raise rows.error("has an empty \\boxed{} or '####' answer", at, answer)
        id_col = self.definition.get("id")
        if id_col is not None and row.get(id_col) is None:
            raise rows.error("missing required field", at, id_col)
        item_id = rows.row_id(at, row, id_col) if id_col else f"{rows.unit}-{at}"
        return Item(id=item_id, question=question, gold=gold, meta={rows.unit: at})

    @staticmethod
    def _value(rows: Rows, at: int, row: dict[str, Any], column: str) -> str:
        value = row.get(column)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return rows.text(at, row, column, numbers=True)
        rows.require(at, row, (column,))
        return str(value)

    def messages(self, item: Item) -> list[dict[str, str]]:
        d = self.definition
        out: list[dict[str, str]] = []
        if d.get("system"):
            out.append({"role": "system", "content": d["system"]})
        for shot in d.get("few_shot") or ():
            out.append({"role": "user", "content": shot["user"]})
            out.append({"role": "assistant", "content": shot["assistant"]})
        out.append({"role": "user", "content": item.question})
        return out

    def prompt_text(self, item: Item) -> str | None:
        """The whole prompt as text for ``chat_template: none`` or a Jinja template; None for ``model``."""
        d = self.definition
        mode = d.get("chat_template") or "model"
        if mode == "model":
            return None
        if mode == "none":
            target, between = d["target_delimiter"], d["fewshot_delimiter"]
            blocks = [d["system"]] if d.get("system") else []
            blocks += [shot["user"] + target + shot["assistant"] for shot in d.get("few_shot") or ()]
            blocks.append(item.question)
            return between.join(blocks)
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise ConfigError(f"task {self.name}: chat template: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        return env.from_string(mode).render(messages=self.messages(item), add_generation_prompt=True)

    def prompt_ids(self, tokenizer: Any, item: Item) -> list[int]:
        """Token ids of the prompt (the runner's hook): the model's chat template, or ``prompt_text``."""
        text = self.prompt_text(item)
        if text is None:
            return list(tokenizer.chat_prompt_ids(self.messages(item)))
        return list(tokenizer.encode(text))

    def extract_answer(self, response: str) -> str | None:
        return self._extract(response)

    def grade(self, response: str, item: Item) -> bool | None:
        grader = self.definition["grader"]
        if grader == "none":
            return None
        pred = self.extract_answer(response)
        if self._custom_grader is not None:
            graded = self._custom_grader(pred, item.gold, response)
            return None if graded is None else bool(graded)
        if pred is None:
            return False
        return bool(_BUILTIN_GRADERS[grader](pred, item.gold))

    def same_answer(self, answer: str, other: str) -> bool:
        """Votes: a built-in grader compares the two answers as it compares an answer with the gold;
        a custom grader (which sees whole responses) and ``none`` compare strings only."""
        grader = self.definition["grader"]
        if self._custom_grader is not None or grader == "none":
            return answer_key(answer) == answer_key(other)
        if grader == "math":  # plain numbers by value, with no grader subprocess (grading.same_answer)
            return same_answer(*commas_dropped(answer, other))
        return bool(_BUILTIN_GRADERS[grader](answer, other))

    def metrics(self, response: str, item: Item) -> dict[str, float]:
        if self.definition["grader"] != "normalized":
            return {}
        from srd_worker.tasks.hotpotqa import exact_match, f1_score

        pred = self.extract_answer(response)
        if pred is None:
            return {"em": 0.0, "f1": 0.0}
        return {"em": float(exact_match(pred, item.gold)), "f1": f1_score(pred, item.gold)[0]}


def _math(pred: str, gold: str) -> bool:
    return math_equal(*commas_dropped(pred, gold))


def _normalized(pred: str, gold: str) -> bool:
    from srd_worker.tasks.hotpotqa import exact_match

    return exact_match(pred, gold)


def _choice(pred: str, gold: str) -> bool:
    boxed = extract_boxed(gold)
    gold = (boxed if boxed is not None else gold).strip().strip("()").strip()
    return pred.strip().upper() == gold.upper()


_BUILTIN_GRADERS: dict[str, Callable[[str, str], bool]] = {
    "math": _math,
    "exact": lambda pred, gold: pred.strip() == gold.strip(),
    "normalized": _normalized,
    "numeric": _numeric_equal,
    "choice": _choice,
    "none": lambda pred, gold: False,
}
