"""The one registry shape (srd_worker/plugins.py) and the four registries built on it."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from srd_worker.engines.registry import ENGINES
from srd_worker.errors import ConfigError
from srd_worker.methods.registry import METHODS
from srd_worker.plugins import Entry, Registry
from srd_worker.rewards.registry import MODEL_REWARDS, REWARDS, reward_differentiable
from srd_worker.tasks.registry import TASKS

ALL = {"method": METHODS, "engine": ENGINES, "reward": REWARDS, "reward kind": MODEL_REWARDS, "task": TASKS}


def test_a_registry_refuses_a_name_twice_and_names_the_choices():
    with pytest.raises(ValueError, match="'a' is registered twice"):
        Registry("thing", [Entry("a", "x"), Entry("a", "y")])
    reg = Registry("thing", [Entry("b", "x"), Entry("a", "y")])
    assert reg.names() == ["a", "b"] and reg.choices() == "a, b"
    with pytest.raises(ConfigError, match=r"unknown thing 'c'; choose one of: a, b$"):
        reg.entry("c")
    with pytest.raises(ConfigError, match="unknown thing"):
        reg.entry(None)  # type: ignore[arg-type]  # a spec read from JSON may hold anything
    ordered = Registry("thing", [Entry("b", "x"), Entry("a", "y")], sort=False)
    assert ordered.choices() == "b, a" and ordered.summaries() == [("b", "x"), ("a", "y")]


@pytest.mark.parametrize("kind", sorted(ALL))
def test_every_entry_has_the_shape(kind):
    registry = ALL[kind]
    assert registry.kind == kind and registry
    for name, entry in registry.items():
        fields = {f.name for f in dataclasses.fields(entry)}
        assert {"name", "summary", "factory"} <= fields
        assert entry.name == name and callable(entry.factory)
        assert entry.summary and "\n" not in entry.summary and len(entry.summary) < 200


def test_method_entries_say_what_their_classes_say():
    for name, entry in METHODS.items():
        cls = entry.factory
        assert cls.name == name and entry.params is cls.Params
        assert entry.needs_reward == cls.needs_reward
        assert entry.needs_capabilities == cls.needs_capabilities
        params = (
            {"draft_model": "testbed-draft"} if "draft_model" in entry.params.__dataclass_fields__ else {}
        )
        if name == "easd":
            params |= {"tau_q": 1.0, "tau_p": 1.0}
        if name == "draw_until_accept":
            params |= {"threshold": 0.5}
        assert type(entry.build(params)) is cls


def test_differentiable_rewards_follow_their_entries():
    assert (
        reward_differentiable("lm_judge")
        and reward_differentiable("hf-orm:m")
        and reward_differentiable("hf-prm:m")
    )
    assert not reward_differentiable("arithmetic") and not reward_differentiable("vllm-rm:m")
    assert not reward_differentiable("judge:m") and not reward_differentiable("nope:m")
    assert not reward_differentiable("hf-orm")  # a kind with no model is not a reward name


def test_importing_the_registries_imports_no_heavy_library():
    code = (
        "import sys; import srd_worker.engines.registry, srd_worker.rewards.registry, "
        "srd_worker.methods.registry, srd_worker.tasks.registry; "
        "print([m for m in ('torch', 'transformers', 'vllm', 'openai') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_srdq_plugins_lists_every_registry():
    from click.testing import CliRunner
    from srdq_cli.main import cli

    result = CliRunner().invoke(cli, ["plugins", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [e["name"] for e in data["engine"]] == list(ENGINES)
    assert [e["name"] for e in data["task"]] == list(TASKS)
    assert [e["name"] for e in data["method"]] == list(METHODS)
    assert {e["name"] for e in data["reward"]} == set(REWARDS) | {f"{k}:MODEL" for k in MODEL_REWARDS}
    table = CliRunner().invoke(cli, ["plugins"])
    assert table.exit_code == 0 and "srdq[vllm]" in table.output  # rich markup escaped, not swallowed
