"""``srdq methods`` (each decoding method's parameters and defaults) and ``srdq plugins`` (what srdq can
plug in: engines, rewards, tasks, methods). Registered on the ``srdq`` group by ``cli/main.py``.
"""

from __future__ import annotations

import json
from typing import Any

import click
from rich.table import Table
from srdq_cli.common import console, friendly_errors


@click.command()
@click.argument("names", nargs=-1, metavar="[METHOD]...")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@friendly_errors
def methods(names: tuple[str, ...], as_json: bool) -> None:
    """List every decoding method (or the METHODs named) with its parameters and defaults, and whether it
    needs a reward model (--reward).

    Example: srdq methods srd rejection_sampling
    """
    from srd_worker.methods.registry import METHODS

    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise click.UsageError(
            f"unknown method {', '.join(map(repr, unknown))}; known: {', '.join(sorted(METHODS))}"
        )
    chosen = {n: METHODS[n] for n in (names or sorted(METHODS))}
    if as_json:
        data = {
            name: {
                "summary": cls.summary,
                "needs_reward": cls.needs_reward,
                "params": [
                    {"name": p, "type": t, "default": d, "help": h} for p, t, d, h in cls.params.describe()
                ],
            }
            for name, cls in chosen.items()
        }
        click.echo(json.dumps(data, indent=2))
        return
    out = console()
    for name, cls in chosen.items():
        needs = "  [needs --reward]" if cls.needs_reward else "  [no reward model needed]"
        table = Table(
            title=f"{name}: {cls.summary}{needs}",
            title_justify="left",
        )
        table.add_column("parameter")
        table.add_column("type")
        table.add_column("default", justify="right")
        table.add_column("meaning")
        for pname, ptype, default, help_ in cls.params.describe():
            table.add_row(pname, ptype, repr(default), help_)
        out.print(table)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@friendly_errors
def plugins(as_json: bool) -> None:
    """List what srdq can plug in, a line each: engines (and their capabilities), rewards (and the KIND:MODEL
    checkpoint kinds), tasks (and the fields they read) and methods (details: srdq methods).

    Example: srdq plugins --json
    """
    from rich.markup import escape

    from srd_worker.engines.registry import ENGINES
    from srd_worker.methods.registry import METHODS
    from srd_worker.rewards.registry import MODEL_REWARDS, REWARDS
    from srd_worker.tasks.registry import TASKS

    rows: dict[str, list[dict[str, Any]]] = {
        "engine": [{"name": e.name, "summary": e.summary, "provides": sorted(e.capabilities)} for e in ENGINES.values()],
        "reward": [{"name": e.name, "summary": e.summary, "needs": ["engine"] if e.needs_engine else []}
                   for e in REWARDS.values()]
        + [{"name": f"{e.name}:MODEL", "summary": e.summary, "needs": ["checkpoint"]} for e in MODEL_REWARDS.values()],
        "task": [{"name": e.name, "summary": e.summary, "needs": list(e.required_fields) or ["--field prompt=COLUMN"]}
                 for e in TASKS.values()],
        "method": [{"name": e.name, "summary": e.summary,
                    "needs": (["reward"] if e.needs_reward else []) + sorted(e.needs_capabilities)}
                   for e in METHODS.values()],
    }  # fmt: skip
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    out = console()
    for kind, entries in rows.items():
        table = Table(title=f"{kind}s", title_justify="left")
        table.add_column(kind)
        table.add_column("needs / provides")
        table.add_column("what it is")
        for e in entries:
            needs = ", ".join(e.get("needs", e.get("provides", [])))
            table.add_row(escape(e["name"]), escape(needs), escape(e["summary"]))
        out.print(table)


def register(cli: click.Group) -> None:
    cli.add_command(methods)
    cli.add_command(plugins)
