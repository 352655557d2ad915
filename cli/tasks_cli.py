"""``srdq tasks`` (the tasks ``--task`` can name: built-in and task files) and ``srdq regrade`` (re-grade
a run's stored responses with the current graders, no generation).

Thin shells over ``srd_worker.tasks.registry`` and ``srd_worker.regrade``; registered on the ``srdq``
group by ``cli/main.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from srdq_cli.common import db_option, friendly_errors, open_db


@click.command("tasks")
@click.option(
    "--include-path",
    "include_paths",
    multiple=True,
    type=click.Path(file_okay=False),
    metavar="DIR",
    help="Also list the task files (*.yaml) in DIR; repeatable.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@friendly_errors
def tasks_command(include_paths: tuple[str, ...], as_json: bool) -> None:
    """List the tasks --task can name: the built-in ones and the task files in each --include-path DIR
    (a bad task file is refused with its file, line and key).

    Example: srdq tasks --include-path my_tasks/
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from srd_worker.tasks.registry import list_tasks

    rows = list_tasks(include_paths)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="tasks", title_justify="left")
    for col in ("task", "fields", "what it is", "file"):
        table.add_column(col)
    for row in rows:
        fields = ", ".join(row["fields"]) or "--field prompt=COLUMN"
        table.add_row(
            escape(row["name"]), escape(fields), escape(row["summary"]), escape(row["file"] or "built-in")
        )
    Console(highlight=False).print(table)


@click.command("regrade")
@click.argument("run_id")
@db_option
@click.option(
    "--out",
    "out_dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Output folder of `srdq run`: regrade OUT/srdq.db and rewrite OUT/RUN_ID/results.jsonl "
    "and summary.json.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@friendly_errors
def regrade_command(run_id: str, db: str | None, out_dir: str | None, as_json: bool) -> None:
    """Re-grade RUN_ID's stored responses with the current grader; nothing is generated again.

    Updates each result's answer, correct, metrics and grader_version. Example (a local run):
    srdq regrade run-0123456789ab --out srdq-out
    """
    from srd_worker.regrade import regrade

    if db and out_dir:
        raise click.UsageError("give --db or --out, not both")
    if out_dir is not None and not (Path(out_dir) / "srdq.db").is_file():
        raise click.ClickException(
            f"{Path(out_dir) / 'srdq.db'}: no srdq.db in {out_dir} (the --out folder of `srdq run`)"
        )
    engine = open_db(out_dir or db)
    try:
        report = regrade(engine, run_id)
        if out_dir is not None:
            _rewrite_local_results(engine, Path(out_dir), run_id)
    finally:
        engine.dispose()
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else report.summary_line())


def _rewrite_local_results(engine, out: Path, run_id: str) -> None:  # noqa: ANN001
    """Bring OUT/RUN_ID/results.jsonl and summary.json in line with the regraded store."""
    from srd_worker.local import Summary, write_results, write_summary
    from srd_worker.store import crud
    from srd_worker.store.db import session_scope

    with session_scope(engine) as session:
        method = str(crud.get_run(session=session, run_id=run_id).spec.get("method", ""))
        records = crud.load_results(session=session, run_id=run_id)
    if not records:
        return
    summary_path = out / run_id / "summary.json"
    wall = 0.0
    if summary_path.is_file():
        try:
            wall = float(json.loads(summary_path.read_text(encoding="utf-8")).get("wall_seconds", 0.0))
        except (ValueError, TypeError, AttributeError):
            wall = 0.0
    path = write_results(out / run_id, records)
    summary = Summary.of(run_id, method, records, wall, path)
    write_summary(summary_path, summary)


def register(cli: click.Group) -> None:
    """Add ``tasks`` and ``regrade`` to the ``srdq`` command group."""
    cli.add_command(tasks_command)
    cli.add_command(regrade_command)
