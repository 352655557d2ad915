"""``srdq datasets``: list the built-in reference datasets (``srd_worker.datasets``).

A thin shell over the registry table; registered on the ``srdq`` group by ``cli/main.py``.
"""

from __future__ import annotations

import json

import click


def _size(n_bytes: int) -> str:
    """Bytes in the unit a reader expects: 18.2 kB, 3.2 MB (powers of 1000, like ``ls -h --si``)."""
    for unit, scale in (("MB", 1_000_000), ("kB", 1_000)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes} B"


@click.command("datasets")
@click.option(
    "--json", "as_json", is_flag=True, help="Machine-readable output, with description, source, sha256, path."
)
def datasets_command(as_json: bool) -> None:
    """List the datasets srdq ships with: pass a NAME to `srdq run` or `srdq submit dataset` instead of
    a file path (an existing file of the same name wins).

    Sources and licences: srd_worker/datasets/data/README.md in the installed package.
    """
    from rich.console import Console
    from rich.table import Table

    from srd_worker.datasets import DATASETS

    if as_json:
        click.echo(json.dumps([d.to_dict() for d in DATASETS.values()], indent=2))
        return
    table = Table(title="built-in datasets", title_justify="left")
    table.add_column("name", no_wrap=True)
    table.add_column("task", no_wrap=True)
    table.add_column("records", justify="right", no_wrap=True)
    table.add_column("size", justify="right", no_wrap=True)
    table.add_column("licence", no_wrap=True)
    for d in DATASETS.values():
        table.add_row(d.name, d.task or "not a task", str(d.records), _size(d.bytes), d.licence)
    Console(highlight=False).print(table)


def register(cli: click.Group) -> None:
    """Add ``datasets`` to the ``srdq`` command group."""
    cli.add_command(datasets_command)
