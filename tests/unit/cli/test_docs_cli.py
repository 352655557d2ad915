"""The CLI and its documentation stay in step (after sqlite-utils' ``tests/test_docs.py``): every command
and option has help text, and README.md names every command (``srdq <command>``) and every long option.

A new command or option therefore fails this test until the README says how to use it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from srdq_cli.main import cli

README = Path(__file__).resolve().parents[3] / "README.md"


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, click.Command]]:
    for name, command in sorted(group.commands.items()):
        path = (*prefix, name)
        if isinstance(command, click.Group):
            yield " ".join(path), command
            yield from _commands(command, path)
        else:
            yield " ".join(path), command


COMMANDS = list(_commands(cli))
OPTIONS = sorted(
    {
        (name, opt)
        for name, command in COMMANDS
        for param in command.params
        if isinstance(param, click.Option)
        for opt in param.opts
        if opt.startswith("--")
    }
)


@pytest.fixture(scope="module")
def readme() -> str:
    return README.read_text(encoding="utf-8")


def test_the_cli_has_commands() -> None:
    # guards the parametrised tests below against passing vacuously on an empty walk
    assert {"run", "submit dataset", "worker", "status", "export", "report", "methods"} <= {
        n for n, _ in COMMANDS
    }


@pytest.mark.parametrize("name,command", COMMANDS, ids=[n for n, _ in COMMANDS])
def test_command_has_help(name: str, command: click.Command) -> None:
    assert (command.help or "").strip(), f"`srdq {name}` has no help text"


@pytest.mark.parametrize("name,command", COMMANDS, ids=[n for n, _ in COMMANDS])
def test_command_is_in_readme(name: str, command: click.Command, readme: str) -> None:
    assert re.search(rf"srdq {re.escape(name)}\b", readme), f"README.md never mentions `srdq {name}`"


@pytest.mark.parametrize("name,command", COMMANDS, ids=[n for n, _ in COMMANDS])
def test_every_option_has_help(name: str, command: click.Command) -> None:
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden:
            assert (param.help or "").strip(), f"`srdq {name} {param.opts[0]}` has no help text"


@pytest.mark.parametrize("name,option", OPTIONS, ids=[f"{n} {o}" for n, o in OPTIONS])
def test_option_is_in_readme(name: str, option: str, readme: str) -> None:
    assert re.search(rf"{re.escape(option)}(?![\w-])", readme), (
        f"README.md never mentions `{option}` (an option of `srdq {name}`)"
    )
