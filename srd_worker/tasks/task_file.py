"""Task files: a benchmark defined in YAML instead of Python, so researchers bring their own tasks.

A task file (``*.yaml``/``*.yml``) holds one task::

    name: capitals                       # required; letters, digits, '_', '-', '.'; not a built-in name
    description: one line for `srdq tasks`
    prompt: "What is the capital of {{ country }}?"   # required; {{ NAME }} is filled from the row
    fields: {country: Country}           # optional: NAME -> dataset column (default: the column NAME)
    answer: capital                      # optional: the gold-answer column (without it: ungraded)
    id: qid                              # optional: the id column (default: line-N / row-N)
    system: "You are a geography expert."   # optional system prompt
    few_shot:                            # optional examples, shown before the question
      - values: {country: France}        #   filled into the prompt template (or: user: "literal text")
        assistant: "Paris"
    chat_template: model                 # model (the model's own), none (a plain prompt) or a Jinja template
    # chat_template_file: chat.jinja     # or read the Jinja template from a file (relative to this one)
    target_delimiter: " "                # plain prompts only: between a shot's prompt and its answer
    fewshot_delimiter: "\\n\\n"            # plain prompts only: between the system prompt and the shots
    stop: ["\\n\\n"]                       # optional stop strings (generation ends at the first)
    extractor: last_line                 # boxed | boxed_or_last_number | last_number | last_line | full |
                                         # choice | {regex: PATTERN} | module:function
    grader: normalized                   # math | exact | normalized | numeric | choice | none | module:function
    grader_version: my-grader-2          # optional: recorded with each result (default: derived)

``load_task_file`` validates a file and returns its *definition*: a plain JSON-able dict (the chat
template file inlined, few-shot prompts rendered) that a run spec records, so a fleet worker rebuilds the
same task from the spec alone (``tasks.defined.DefinedTask``). Errors name the file, the line and the key
(``FILE, line N, key 'few_shot[1].assistant': ...``). ``task_files(DIR)`` finds the task files of an
``--include-path`` folder (not its subfolders) and refuses two files with one task name.

Left out: Jinja logic in prompt templates (only ``{{ NAME }}`` substitution), several tasks per file,
task groups, per-task generation parameters other than stop strings (use ``--set``), and shipping a
``module:function`` grader's code to workers (the module must be importable there).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from srd_worker.errors import ConfigError

#: Bump when the definition's meaning changes (recorded in every definition, so the run id follows it).
FORMAT_VERSION: int = 1

#: Keys a task file may have (in the order documented above).
KEYS: tuple[str, ...] = (
    "name",
    "description",
    "prompt",
    "fields",
    "answer",
    "id",
    "system",
    "few_shot",
    "chat_template",
    "chat_template_file",
    "target_delimiter",
    "fewshot_delimiter",
    "stop",
    "extractor",
    "grader",
    "grader_version",
)

EXTRACTORS: dict[str, str] = {
    "boxed": "the last \\boxed{} in the response",
    "boxed_or_last_number": "the last \\boxed{}, else the last number (GSM8K style)",
    "last_number": "the last number in the response (thousands commas removed; a fraction such as 3/4 whole)",
    "last_line": "the last non-blank line",
    "full": "the whole response, stripped",
    "choice": "a multiple-choice letter A-D (\\boxed{B}, (B), 'answer is B')",
}
GRADERS: dict[str, str] = {
    "math": "math-verify equivalence (numbers compared without thousands commas)",
    "exact": "the extracted answer equals the gold, both stripped",
    "normalized": "exact match after lower-casing, removing punctuation and a/an/the (F1 in the metrics)",
    "numeric": "both parse as numbers and are equal (relative tolerance 1e-6)",
    "choice": "the same letter, case-insensitive",
    "none": "ungraded: correct is null",
}
#: The extractor a grader uses when the file names none.
DEFAULT_EXTRACTOR: dict[str, str] = {
    "math": "boxed_or_last_number",
    "numeric": "boxed_or_last_number",
    "choice": "choice",
    "exact": "full",
    "normalized": "full",
    "none": "full",
}
CHAT_MODES: tuple[str, ...] = ("model", "none")

PLACEHOLDER_RE = re.compile(r"\{\{\s*([^{}]+?)\s*\}\}")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_DOTTED_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_FILTER_RE = re.compile(r"\|\s*[A-Za-z_]\w*\s*(?:\(.*\))?$")  # "country | upper", "x | default('y')"
#: Names a task file may not take: the built-in tasks and the --task keywords.
RESERVED: frozenset[str] = frozenset(
    {"auto", "generic", "gsm8k", "math500", "gpqa", "hotpotqa", "alpaca_eval", "openai_batch"}
)
SUFFIXES: tuple[str, ...] = (".yaml", ".yml")


class TaskFileError(ConfigError):
    """A task file that cannot be used: ``FILE, line N, key 'K': reason``."""

    def __init__(self, message: str, *, path: str, line: int | None = None, key: str | None = None) -> None:
        self.path, self.line, self.key, self.reason = path, line, key, message
        where = [path] + ([f"line {line}"] if line else []) + ([f"key '{key}'"] if key else [])
        super().__init__(f"{', '.join(where)}: {message}")


class _Map(dict[str, Any]):
    """A YAML mapping that remembers the line of each key (1-based) and its own."""

    line: int = 0
    lines: dict[str, int]


class _Seq(list[Any]):
    """A YAML sequence that remembers the line of each item (1-based) and its own."""

    line: int = 0
    lines: list[int]


def strict_yaml_loader(path: str) -> type:
    """A ``yaml.SafeLoader`` that refuses a key written twice in one mapping and a key that is not text
    (``TaskFileError`` naming ``path``, the line and the key), and keeps every key's and item's line."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def mapping(loader: Any, node: Any) -> _Map:
        loader.flatten_mapping(node)
        out = _Map()
        out.line, out.lines = node.start_mark.line + 1, {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if not isinstance(key, str):
                raise TaskFileError(f"keys must be text, got {key!r}", path=path, line=line)
            if key in out:
                raise TaskFileError(
                    f"duplicate key (first on line {out.lines[key]})", path=path, line=line, key=key
                )
            out[key] = loader.construct_object(value_node, deep=True)
            out.lines[key] = line
        return out

    def sequence(loader: Any, node: Any) -> _Seq:
        out = _Seq(loader.construct_object(child, deep=True) for child in node.value)
        out.line, out.lines = node.start_mark.line + 1, [child.start_mark.line + 1 for child in node.value]
        return out

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, sequence)
    return Loader


class _Reader:
    """Typed access to one task file's keys, with errors in its terms (file, line, key)."""

    def __init__(self, path: str, data: _Map) -> None:
        self.path, self.data = path, data

    def error(self, message: str, key: str | None = None, line: int | None = None) -> TaskFileError:
        if line is None:
            line = self.data.lines.get(key.split(".")[0].split("[")[0], self.data.line) if key else None
        return TaskFileError(message, path=self.path, line=line, key=key)

    def text(self, key: str, *, required: bool = False, blank: bool = False) -> str | None:
        value = self.data.get(key)
        if value is None:
            if required:
                raise self.error("missing required key", key, line=self.data.line or 1)
            return None
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise self.error(f"must be text, got {_kind(value)}", key)
        text = str(value)
        if not blank and not text.strip():
            raise self.error("is empty", key)
        return text


def _kind(value: object) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing (null)"
    return f"{type(value).__name__} {value!r}"


def placeholders(template: str) -> list[str]:
    """The ``{{ NAME }}`` names of a prompt template, in first-use order, each once."""
    return list(dict.fromkeys(m.group(1) for m in PLACEHOLDER_RE.finditer(template)))


def render(template: str, values: Mapping[str, str]) -> str:
    """``template`` with every ``{{ NAME }}`` replaced by ``values[NAME]`` (single braces stay literal)."""
    return PLACEHOLDER_RE.sub(lambda m: values[m.group(1)], template)


def yaml_problem(exc: Exception) -> tuple[int | None, str]:
    """(1-based line, one-line problem) of a PyYAML error, whose own text spans several lines."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None)
    if problem is None:
        problem = " ".join(str(exc).split()) or "malformed YAML"
    return (None if mark is None else mark.line + 1), problem


def parse_task_file(path: str | Path) -> dict[str, Any]:
    """Read and validate the task file at ``path``; its definition (see the module docstring)."""
    where = str(path)
    p = Path(path)
    if not p.is_file():
        raise TaskFileError("task file not found" if not p.exists() else "is not a file", path=where)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskFileError(f"cannot read the task file: {exc}", path=where) from exc
    import yaml

    try:
        data = yaml.load(text, Loader=strict_yaml_loader(where))  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        line, problem = yaml_problem(exc)
        raise TaskFileError(f"malformed YAML: {problem}", path=where, line=line) from exc
    if not isinstance(data, _Map):
        raise TaskFileError(
            f"must be a YAML mapping of keys (name, prompt, ...), got {_kind(data)}", path=where
        )
    return definition_from(data, where, base=p.parent)


def definition_from(data: Mapping[str, Any], where: str, *, base: Path | None = None) -> dict[str, Any]:
    """Validate a task's keys (from a file: a ``_Map`` with lines) into its definition."""
    if not isinstance(data, _Map):
        mapped = _Map(data)
        mapped.lines = {}
        data = mapped
    r = _Reader(where, data)
    unknown = [k for k in data if k not in KEYS and k != "format"]
    if unknown:
        raise r.error(f"unknown key; valid keys: {', '.join(KEYS)}", unknown[0])
    name = r.text("name", required=True) or ""
    if not _NAME_RE.match(name):
        raise r.error(f"{name!r} is not a task name (letters, digits, '_', '-', '.')", "name")
    if name in RESERVED:
        raise r.error(f"{name!r} is a built-in task name; choose another", "name")
    prompt = r.text("prompt", required=True) or ""
    names = placeholders(prompt)
    # "{{ q }": meant as a placeholder, it would reach the model as text
    if "{{" in PLACEHOLDER_RE.sub("", prompt):
        raise r.error("'{{' opens no placeholder (write {{ NAME }}, NAME a column of the dataset)", "prompt")
    if "{%" in prompt:
        raise r.error(
            "'{%' starts a Jinja statement, which srdq does not run: a prompt fills {{ NAME }} placeholders "
            "only (the model's chat template, or chat_template here, is where Jinja goes)",
            "prompt",
        )
    for name_ in names:
        if _FILTER_RE.search(name_):
            raise r.error(
                f"placeholder '{{{{ {name_} }}}}' applies a Jinja filter, which srdq does not run: write "
                "{{ NAME }}, NAME a column of the dataset",
                "prompt",
            )
    if not names:
        raise r.error(
            "has no {{ NAME }} placeholder: nothing from the dataset would reach the model", "prompt"
        )
    fields = _fields(r, names)
    answer = r.text("answer")
    grader = _grader(r, answer)
    extractor = _extractor(r, grader)
    definition: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "name": name,
        "description": r.text("description") or "",
        "prompt": prompt,
        "fields": fields,
        "answer": answer,
        "id": r.text("id"),
        "system": r.text("system"),
        "few_shot": _few_shot(r, prompt, names),
        "chat_template": _chat_template(r, base),
        "target_delimiter": r.text("target_delimiter", blank=True),
        "fewshot_delimiter": r.text("fewshot_delimiter", blank=True),
        "stop": _stop(r),
        "extractor": extractor,
        "grader": grader,
        "grader_version": r.text("grader_version"),
    }
    if definition["chat_template"] != "none":
        for key in ("target_delimiter", "fewshot_delimiter"):
            if definition[key] is not None:
                raise r.error("applies to plain prompts only (chat_template: none)", key)
    if definition["target_delimiter"] is None:
        definition["target_delimiter"] = " "
    if definition["fewshot_delimiter"] is None:
        definition["fewshot_delimiter"] = "\n\n"
    return definition


def _fields(r: _Reader, names: list[str]) -> dict[str, str]:
    given = r.data.get("fields")
    if given is None:
        return {n: n for n in names}
    if not isinstance(given, dict):
        raise r.error(f"must be a mapping NAME: COLUMN, got {_kind(given)}", "fields")
    lines = getattr(given, "lines", {})
    for key, column in given.items():
        if key not in names:
            raise r.error(
                f"is not a placeholder of the prompt (placeholders: {', '.join(names)})",
                f"fields.{key}",
                line=lines.get(key),
            )
        if not isinstance(column, str) or not column.strip():
            raise r.error("must name a dataset column", f"fields.{key}", line=lines.get(key))
    return {n: str(given.get(n, n)) for n in names}


def _grader(r: _Reader, answer: str | None) -> str:
    grader = r.text("grader")
    if grader is None:
        return "math" if answer else "none"
    if grader not in GRADERS and not _DOTTED_RE.match(grader):
        raise r.error(
            f"unknown grader {grader!r}; choose one of: {', '.join(GRADERS)}, or module:function", "grader"
        )
    if grader != "none" and not answer:
        raise r.error(
            f"grader {grader!r} needs a gold answer: add `answer: COLUMN` (or grader: none)", "grader"
        )
    if _DOTTED_RE.match(grader):
        _import_callable(grader, r, "grader", arity=3)
    return grader


def _extractor(r: _Reader, grader: str) -> str | dict[str, str]:
    value = r.data.get("extractor")
    if value is None:
        return DEFAULT_EXTRACTOR.get(grader, "full")
    if isinstance(value, dict):
        pattern = value.get("regex")
        if set(value) != {"regex"} or not isinstance(pattern, str) or not pattern:
            raise r.error("a mapping extractor is {regex: PATTERN}", "extractor")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise r.error(f"bad regular expression: {exc}", "extractor.regex") from exc
        return {"regex": pattern}
    name = r.text("extractor") or ""
    if name in EXTRACTORS:
        return name
    if _DOTTED_RE.match(name):
        _import_callable(name, r, "extractor", arity=1)
        return name
    raise r.error(
        f"unknown extractor {name!r}; choose one of: {', '.join(EXTRACTORS)}, {{regex: PATTERN}}, "
        "or module:function",
        "extractor",
    )


#: How srdq calls a task file's own functions: an extractor as fn(response), a grader as
#: fn(answer, gold, response).
_CALLS = {1: "fn(response)", 3: "fn(answer, gold, response)"}


def _import_callable(dotted: str, r: _Reader | None, key: str, *, arity: int | None = None) -> Any:
    """The function ``module:function`` names; an error naming the key when it cannot be imported, is not
    callable, or (``arity``) cannot take that many positional arguments (checked where Python can tell)."""
    import importlib
    import inspect

    module, _, attr = dotted.partition(":")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except Exception as exc:  # noqa: BLE001 - any import failure is the file's problem
        message = f"cannot import {dotted!r}: {type(exc).__name__}: {exc} (it must be importable: PYTHONPATH)"
        if r is None:
            raise ConfigError(f"task {key}: {message}") from exc
        raise r.error(message, key) from exc
    if not callable(fn):
        raise (
            r.error(f"{dotted!r} is not callable", key) if r else ConfigError(f"{dotted!r} is not callable")
        )
    if arity is not None:
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):  # a builtin without a signature: Python cannot tell
            signature = None
        if signature is not None:
            try:
                signature.bind(*range(arity))
            except TypeError as exc:
                message = (
                    f"{dotted!r} cannot be called as {_CALLS.get(arity, f'fn with {arity} arguments')}: {exc}"
                )
                raise r.error(message, key) if r else ConfigError(f"task {key}: {message}") from None
    return fn


def _few_shot(r: _Reader, prompt: str, names: list[str]) -> list[dict[str, str]]:
    shots = r.data.get("few_shot")
    if shots is None:
        return []
    if not isinstance(shots, list):
        raise r.error(f"must be a list of examples, got {_kind(shots)}", "few_shot")
    out = []
    lines = getattr(shots, "lines", [])
    for i, shot in enumerate(shots):
        key, line = f"few_shot[{i}]", lines[i] if i < len(lines) else None
        if not isinstance(shot, dict):
            raise r.error(
                f"must be a mapping with values (or user) and assistant, got {_kind(shot)}", key, line
            )
        slines = getattr(shot, "lines", {})
        extra = sorted(set(shot) - {"values", "user", "assistant"})
        if extra:
            raise r.error(
                "unknown key; an example has values (or user) and assistant",
                f"{key}.{extra[0]}",
                slines.get(extra[0], line),
            )
        assistant = shot.get("assistant")
        if (
            not isinstance(assistant, str | int | float)
            or isinstance(assistant, bool)
            or not str(assistant).strip()
        ):
            raise r.error(
                "missing or empty (the example's answer text)",
                f"{key}.assistant",
                slines.get("assistant", line),
            )
        if ("values" in shot) == ("user" in shot):
            raise r.error("give either values (filled into the prompt) or user (literal text)", key, line)
        if "user" in shot:
            user = shot["user"]
            if not isinstance(user, str) or not user.strip():
                raise r.error("must be non-empty text", f"{key}.user", slines.get("user", line))
        else:
            values = shot["values"]
            if not isinstance(values, dict):
                raise r.error(
                    f"must be a mapping NAME: VALUE, got {_kind(values)}",
                    f"{key}.values",
                    slines.get("values", line),
                )
            missing = [n for n in names if n not in values]
            if missing:
                raise r.error(
                    f"lacks the placeholder {missing[0]!r} of the prompt",
                    f"{key}.values",
                    slines.get("values", line),
                )
            user = render(prompt, {n: str(values[n]) for n in names})
        out.append({"user": user, "assistant": str(assistant)})
    return out


def _chat_template(r: _Reader, base: Path | None) -> str:
    inline, file = r.data.get("chat_template"), r.data.get("chat_template_file")
    if inline is not None and file is not None:
        raise r.error("give chat_template or chat_template_file, not both", "chat_template_file")
    if file is not None:
        name = r.text("chat_template_file") or ""
        target = (base or Path(".")) / name
        try:
            template = target.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise r.error(
                f"cannot read {target}: {getattr(exc, 'strerror', None) or exc}", "chat_template_file"
            ) from exc
        key = "chat_template_file"
    else:
        template = r.text("chat_template") or "model"
        key = "chat_template"
        if template in CHAT_MODES:
            return template
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        ImmutableSandboxedEnvironment().parse(template)
    except ImportError as exc:  # pragma: no cover - jinja2 is a dependency
        raise r.error("a Jinja chat template needs the jinja2 package", key) from exc
    except Exception as exc:  # noqa: BLE001 - jinja2's TemplateSyntaxError and friends
        raise r.error(f"not a valid Jinja template: {exc}", key) from exc
    if "messages" not in template:
        raise r.error("a chat template must use `messages` (or use model / none)", key)
    return template


def _stop(r: _Reader) -> list[str]:
    stop = r.data.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise r.error("must be a list of non-empty strings", "stop")
    return list(stop)


def is_task_file(value: str | Path) -> bool:
    """True when ``value`` names a task file (a .yaml/.yml suffix)."""
    return Path(str(value)).suffix.lower() in SUFFIXES


def task_files(folders: Iterable[str | Path]) -> dict[str, tuple[Path, dict[str, Any]]]:
    """``name -> (file, definition)`` for every task file directly inside ``folders`` (``--include-path``);
    ``ConfigError`` for a folder that does not exist, a bad file, or two files with one task name."""
    found: dict[str, tuple[Path, dict[str, Any]]] = {}
    for folder in folders:
        d = Path(folder)
        if not d.is_dir():
            raise ConfigError(f"--include-path {folder}: not a folder")
        for file in sorted(p for p in d.iterdir() if p.suffix.lower() in SUFFIXES and p.is_file()):
            definition = parse_task_file(file)
            name = definition["name"]
            if name in found:
                raise TaskFileError(
                    f"task {name!r} is already defined in {found[name][0]}", path=str(file), key="name"
                )
            found[name] = (file, definition)
    return found
