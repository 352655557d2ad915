"""Task files (``srd_worker.tasks.task_file``, ``tasks.defined``): YAML in, a task that builds prompts,
extracts and grades; bad files refused with the file, line and key; the definition carried by the spec."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from srd_worker.errors import ConfigError
from srd_worker.methods.registry import build_method
from srd_worker.runner import run_shard
from srd_worker.spec import prepare_run
from srd_worker.tasks.base import Item
from srd_worker.tasks.defined import DefinedTask
from srd_worker.tasks.registry import get_task, list_tasks
from srd_worker.tasks.task_file import TaskFileError, parse_task_file, task_files
from srd_worker.wiring import check_task
from tests.doubles import MemoryStore

CAPITALS = """\
name: capitals
description: capital cities
prompt: "Capital of {{ country }} ({{ continent }})?"
fields: {continent: region}
answer: capital
id: qid
system: Be brief.
few_shot:
  - values: {country: France, continent: Europe}
    assistant: Paris
  - user: "Capital of Peru?"
    assistant: Lima
grader: normalized
"""

ROWS = [
    {"qid": "a", "country": "Italy", "region": "Europe", "capital": "Rome"},
    {"qid": "b", "country": "Japan", "region": "Asia", "capital": "Tokyo"},
]


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def _data(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_task_file_builds_items_messages_and_grades(tmp_path: Path) -> None:
    task = get_task(str(_write(tmp_path, "capitals.yaml", CAPITALS)))
    items = task.load(_data(tmp_path, ROWS))
    assert [i.id for i in items] == ["a", "b"]
    assert items[0].question == "Capital of Italy (Europe)?"
    assert items[0].gold == "Rome"
    assert task.messages(items[0]) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Capital of France (Europe)?"},
        {"role": "assistant", "content": "Paris"},
        {"role": "user", "content": "Capital of Peru?"},
        {"role": "assistant", "content": "Lima"},
        {"role": "user", "content": "Capital of Italy (Europe)?"},
    ]
    assert task.grade("The Rome.", items[0]) is True  # normalized: case, punctuation, articles
    assert task.grade("Milan", items[0]) is False
    assert task.metrics("rome", items[0]) == {"em": 1.0, "f1": 1.0}
    assert task.required_fields == ("country", "region", "capital")


def test_plain_prompt_and_jinja_chat_template(tmp_path: Path) -> None:
    base = 'name: t\nprompt: "Q: {{ q }}\\nA:"\nanswer: a\ngrader: exact\nsystem: S\nfew_shot:\n  - values: {q: one}\n    assistant: "1"\n'
    plain = DefinedTask(parse_task_file(_write(tmp_path, "p.yaml", base + "chat_template: none\n")))
    item = Item("x", "Q: two\nA:", "2")
    assert plain.prompt_text(item) == "S\n\nQ: one\nA: 1\n\nQ: two\nA:"
    _write(
        tmp_path,
        "tpl.jinja",
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
    )
    jinja = DefinedTask(parse_task_file(_write(tmp_path, "j.yaml", base + "chat_template_file: tpl.jinja\n")))
    assert jinja.prompt_text(item) == "<system>S<user>Q: one\nA:<assistant>1<user>Q: two\nA:<assistant>"
    # the template's text is in the definition: a worker needs no file
    assert "{% for m in messages %}" in jinja.definition["chat_template"]
    model = DefinedTask(parse_task_file(_write(tmp_path, "m.yaml", base)))
    assert model.prompt_text(item) is None  # the model's own chat template (engine side)


def test_extractors_and_graders(tmp_path: Path) -> None:
    def task(extra: str) -> DefinedTask:
        return DefinedTask(
            parse_task_file(_write(tmp_path, "t.yaml", 'name: t\nprompt: "{{ q }}"\nanswer: a\n' + extra))
        )

    gold = Item("x", "q", "1,250")
    assert task("").grade("so \\boxed{1250}", gold) is True  # default: math, boxed or last number
    assert task("").grade("it is 1250 apples", gold) is True
    assert task("grader: numeric\n").grade("1250.0000001", gold) is True
    assert task("grader: exact\nextractor: last_line\n").grade("think\n1,250", gold) is True
    regex = task("grader: exact\nextractor: {regex: 'ANSWER=(\\d+)'}\n")
    assert regex.extract_answer("ANSWER=3 ... ANSWER=1250") == "1250"
    choice = task("grader: choice\n")
    assert choice.grade("so the answer is \\boxed{B}", Item("x", "q", "(B)")) is True
    assert choice.grade("so the answer is \\boxed{C}", Item("x", "q", "B")) is False
    # the last-number extractors read a fraction whole, and their grader version says so
    last = task("grader: exact\nextractor: last_number\n")
    assert last.extract_answer("each gets 3/4") == "3/4"
    assert last.grader_version == "task-file-2:last_number/exact"
    assert task("grader: exact\nextractor: last_line\n").grader_version == "task-file-1:last_line/exact"


def test_dotted_path_grader_and_extractor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = tmp_path / "mygrading_t1.py"
    module.write_text(
        "def pick(text):\n    return text.split('=')[-1].strip()\n"
        "def same_length(answer, gold, response):\n    return answer is not None and len(answer) == len(gold)\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    path = _write(
        tmp_path / "tasks",
        "t.yaml",
        'name: t\nprompt: "{{ q }}"\nanswer: a\nextractor: mygrading_t1:pick\ngrader: mygrading_t1:same_length\n',
    )
    task = get_task(str(path))
    assert task.grade("x = abc", Item("x", "q", "xyz")) is True
    assert task.grade("x = abcd", Item("x", "q", "xyz")) is False
    assert task.grader_version == "task-file-1:mygrading_t1:pick/mygrading_t1:same_length"
    sys.modules.pop("mygrading_t1", None)


@pytest.mark.parametrize(
    ("text", "line", "key", "reason"),
    [
        ('name: t\nprompt: "{{ q }}"\ngrader: fuzzy\nanswer: a\n', 3, "grader", "unknown grader 'fuzzy'"),
        (
            'name: t\nprompt: "{{ q }}"\nanswer: a\nfew_shot:\n  - values: {q: 1}\n  - values: {q: 2}\n    assistant: x\n',
            5,
            "few_shot[0].assistant",
            "missing or empty",
        ),
        ('name: t\nprompt: "no placeholders"\n', 2, "prompt", "has no {{ NAME }} placeholder"),
        ('name: t\nprompt: "Q: {{ question }"\n', 2, "prompt", "'{{' opens no placeholder"),
        ('name: t\nprompt: "{{ a }} and {{ b"\n', 2, "prompt", "'{{' opens no placeholder"),
        (
            'name: t\nprompt: "{{ q | upper }}"\n',
            2,
            "prompt",
            "placeholder '{{ q | upper }}' applies a Jinja filter",
        ),
        ("name: t\nprompt: \"{{ q | default('x') }}\"\n", 2, "prompt", "applies a Jinja filter"),
        ('name: t\nprompt: "{% if q %}{{ q }}{% endif %}"\n', 2, "prompt", "'{%' starts a Jinja statement"),
        ('name: t\nprompt: "{{ q }}"\nfields: {r: col}\n', 3, "fields.r", "is not a placeholder"),
        ('name: t\nprompt: "{{ q }}"\ngrader: exact\n', 3, "grader", "needs a gold answer"),
        ('name: gsm8k\nprompt: "{{ q }}"\n', 1, "name", "is a built-in task name"),
        ('name: t\nprompt: "{{ q }}"\ntemperature: 0\n', 3, "temperature", "unknown key"),
        ('name: t\nprompt: "{{ q }}"\nprompt: "{{ r }}"\n', 3, "prompt", "duplicate key (first on line 2)"),
        (
            'name: t\nprompt: "{{ q }}"\nchat_template: "{% for m in messages %}"\n',
            3,
            "chat_template",
            "not a valid Jinja template",
        ),
        (
            'name: t\nprompt: "{{ q }}"\nextractor: {regex: "(["}\n',
            3,
            "extractor.regex",
            "bad regular expression",
        ),
        (
            'name: t\nprompt: "{{ q }}"\nanswer: a\ngrader: no_such_module_xyz:grade\n',
            4,
            "grader",
            "cannot import",
        ),
        ('name: t\nprompt: "{{ q }}"\nstop: [1, ""]\n', 3, "stop", "non-empty strings"),
        (
            'name: t\nprompt: "{{ q }}"\nextractor: os:getcwd\n',
            3,
            "extractor",
            "'os:getcwd' cannot be called as fn(response): too many positional arguments",
        ),
        (
            'name: t\nprompt: "{{ q }}"\nanswer: a\ngrader: os.path:basename\n',
            4,
            "grader",
            "'os.path:basename' cannot be called as fn(answer, gold, response)",
        ),
        ("prompt: '{{ q }}'\n", 1, "name", "missing required key"),
    ],
)
def test_malformed_task_file_names_file_line_and_key(tmp_path: Path, text, line, key, reason) -> None:
    path = _write(tmp_path, "bad.yaml", text)
    with pytest.raises(TaskFileError) as info:
        parse_task_file(path)
    assert (info.value.line, info.value.key) == (line, key), str(info.value)
    assert reason in str(info.value)
    assert str(info.value).startswith(f"{path}, line {line}, key '{key}': ")


def test_malformed_yaml_and_not_a_mapping(tmp_path: Path) -> None:
    with pytest.raises(TaskFileError, match=r"bad\.yaml, line 2: malformed YAML"):
        parse_task_file(_write(tmp_path, "bad.yaml", "name: t\n  bad: indent\n"))
    with pytest.raises(TaskFileError, match="must be a YAML mapping"):
        parse_task_file(_write(tmp_path, "list.yaml", "- a\n- b\n"))
    with pytest.raises(TaskFileError, match="task file not found"):
        parse_task_file(tmp_path / "absent.yaml")


def test_include_path_registers_tasks_by_name(tmp_path: Path) -> None:
    folder = tmp_path / "tasks"
    _write(folder, "capitals.yaml", CAPITALS)
    _write(folder, "notes.txt", "not a task file")
    names = [t["name"] for t in list_tasks([folder])]
    assert names[-1] == "capitals" and "gsm8k" in names
    assert get_task("capitals", include_paths=[folder]).name == "capitals"
    with pytest.raises(ConfigError, match="unknown task 'nope'.*task file in --include-path: capitals"):
        get_task("nope", include_paths=[folder])
    _write(folder, "again.yml", CAPITALS)
    with pytest.raises(TaskFileError, match="task 'capitals' is already defined in"):
        task_files([folder])
    with pytest.raises(ConfigError, match="not a folder"):
        task_files([tmp_path / "missing"])


def test_spec_carries_the_definition_and_it_names_the_run(tmp_path: Path) -> None:
    path = _write(tmp_path / "tasks", "capitals.yaml", CAPITALS)
    data = _data(tmp_path, ROWS)

    def spec(task: str, **kw):
        return prepare_run(
            dataset=data, task=task, method="sampling", params={}, model="m", reward=None, **kw
        ).spec

    by_path = spec(str(path))
    by_name = spec("capitals", include_paths=[str(tmp_path / "tasks")])
    assert by_path.run_id() == by_name.run_id()
    assert (
        by_path.task == "capitals"
        and by_path.task_def["prompt"] == "Capital of {{ country }} ({{ continent }})?"
    )
    # a worker rebuilds the task from the spec alone, the file gone
    path.unlink()
    rebuilt = get_task(by_path.task, fields=by_path.fields, definition=by_path.task_def)
    assert rebuilt.load(data)[0].question == "Capital of Italy (Europe)?"
    path.write_text(CAPITALS.replace("Be brief.", "Be very brief."), encoding="utf-8")
    assert spec(str(path)).run_id() != by_path.run_id()  # the content is hashed into the run id
    with pytest.raises(ConfigError, match="--field applies to --task generic"):
        spec(str(path), fields={"prompt": "country"})


def test_row_missing_a_template_column_names_line_and_field(tmp_path: Path) -> None:
    from srd_worker.errors import DatasetError

    task = get_task(str(_write(tmp_path, "capitals.yaml", CAPITALS)))
    data = _data(tmp_path, [ROWS[0], {"qid": "c", "country": "Chad", "capital": "N'Djamena"}])
    with pytest.raises(DatasetError, match=r"data\.jsonl, line 2, field 'region': missing required field"):
        task.load(data)


def test_stop_strings_end_generation_and_are_refused_by_token_level_methods(
    tmp_path: Path, tiny_engine
) -> None:
    """A task's stop strings reach every request: a text drawn without them is cut at its first one."""
    text = 'name: t\nprompt: "{{ q }}"\nchat_template: none\n'
    free = DefinedTask(parse_task_file(_write(tmp_path, "free.yaml", text)))
    items = [Item("x", "hello there", "")]
    method = build_method("sampling", {"max_new_tokens": 24})

    def run(task):
        return run_shard(items=items, positions=[0], method=method, task=task, engine=tiny_engine,
                         reward=None, run_seed=3, store=MemoryStore()).records[0]  # fmt: skip

    drawn = run(free)["response"]
    stop = drawn[5:7]
    assert len(stop) == 2 and drawn.find(stop) >= 5
    stopped = run(
        DefinedTask(parse_task_file(_write(tmp_path, "stop.yaml", text + f"stop: [{json.dumps(stop)}]\n")))
    )
    assert stopped["finish_reason"] == "stop"
    assert stopped["response"] in (drawn[: drawn.find(stop)], drawn[: drawn.find(stop) + len(stop)])
    with pytest.raises(ConfigError, match="does not apply"):
        check_task(
            build_method("speculative_sampling", {"draft_model": "tiny-random-llama"}),
            DefinedTask(parse_task_file(tmp_path / "stop.yaml")),
        )


def test_a_sweep_names_a_task_file_beside_it(tmp_path: Path) -> None:
    from srd_worker.sweep import plan_sweep

    _write(tmp_path, "capitals.yaml", CAPITALS)
    _data(tmp_path, ROWS)
    sweep = _write(
        tmp_path,
        "sweep.yaml",
        "dataset: data.jsonl\ntask: capitals.yaml\nmodel: m\nmethods:\n  - method: sampling\n",
    )
    points = plan_sweep(sweep).prepared
    assert [p.spec.task for p in points] == ["capitals"]
    assert points[0].spec.task_def["answer"] == "capital"
