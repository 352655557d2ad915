"""``srdq regrade``: re-grade a run's stored responses with the current graders (no generation).

A thin shell over ``srd_worker.tasks.regrade``; registered on the ``srdq`` group by ``cli/main.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from srd_worker.errors import SrdqError


@click.command("regrade")
@click.argument("run_id")
@click.option("--db", "db_url", default=None, metavar="URL",
              help="SQLAlchemy URL of the store holding the run (default: SRDQ_DATABASE_URL).")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Output folder of `srdq run`: regrade OUT/srdq.db and rewrite OUT/RUN_ID/results.jsonl "
              "and summary.json.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def regrade_command(run_id: str, db_url: str | None, out_dir: str | None, as_json: bool) -> None:
    """Re-grade RUN_ID's stored responses with the current grader; nothing is generated again.

    Updates each result's answer, correct, metrics and grader_version. Example (a local run):
    srdq regrade run-0123456789ab --out srdq-out
    """
    from sqlalchemy.engine import make_url

    from srd_worker.store.db import make_engine, sqlite_url
    from srd_worker.tasks.regrade import regrade

    if db_url and out_dir:
        raise click.UsageError("give --db or --out, not both")
    if out_dir is not None:
        db_file = Path(out_dir) / "srdq.db"
        if not db_file.is_file():
            raise click.ClickException(f"{db_file}: no srdq.db in {out_dir} (the --out folder of `srdq run`)")
        db_url = sqlite_url(db_file)
    if db_url is None:
        from srd_worker.settings import get_settings

        db_url = get_settings().database_url
    url = make_url(db_url)
    if url.get_backend_name() == "sqlite" and url.database and not Path(url.database).is_file():
        raise click.ClickException(f"{url.database}: no such SQLite database file")
    engine = make_engine(db_url)
    try:
        report = regrade(engine, run_id)
        if out_dir is not None:
            _rewrite_local_results(engine, Path(out_dir), run_id)
    except SrdqError as exc:
        raise click.ClickException(str(exc)) from exc
    except Exception as exc:  # noqa: BLE001 - an unreachable or uninitialised database is the user's setup
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise click.ClickException(f"database {engine.url.render_as_string(hide_password=True)}: {first}") from None
    finally:
        engine.dispose()
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else report.summary_line())


def _rewrite_local_results(engine, out: Path, run_id: str) -> None:  # noqa: ANN001
    """Bring OUT/RUN_ID/results.jsonl and summary.json in line with the regraded store."""
    from srd_worker.local import summarise, write_results
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
    summary = summarise(run_id, method, records, wall, path)
    summary_path.write_text(json.dumps(summary.to_dict(), indent=2) + "\n")


def register(cli: click.Group) -> None:
    """Add ``regrade`` to the ``srdq`` command group."""
    cli.add_command(regrade_command)
