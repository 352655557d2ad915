"""``srdq fork RUN --at-round R --set KEY=VALUE``: a new run from RUN's states after round R with changed
parameters (``srd_worker.fork``). Embedded (``--db OUT``: run here into the same store and folder) or on
the fleet (``--submit``: stored and enqueued like ``srdq submit dataset``).

A thin shell; registered on the ``srdq`` group by ``cli/main.py``.
"""

from __future__ import annotations

from pathlib import Path

import click
from srdq_cli.common import configure_logging, friendly_errors, log_options, open_db, require_extra


def _out_dir(db: str | None, run_id: str) -> Path:
    """The embedded fork's output folder: ``--db`` as an ``srdq run --out`` folder or its srdq.db file."""
    if not db or "://" in db:
        raise click.ClickException(
            f"--db: an embedded fork runs into the --out folder of the `srdq run` that made {run_id} "
            "(srdq fork RUN --db OUT ...); to fork a fleet run, add --submit"
        )
    path = Path(db)
    out = path if path.is_dir() else path.parent
    if not (out / "srdq.db").is_file():
        raise click.ClickException(f"--db {db}: no srdq.db there (give the --out folder of `srdq run`)")
    return out


@click.command("fork")
@click.argument("run_id")
@click.option(
    "--at-round", "at_round", type=int, required=True, help="Start from RUN's states after round R."
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="A parameter of the fork: a method parameter (theta_high, theta_low, policy, chunk_tokens, ...) or "
    "reward; repeatable. Parameters that made the drafts up to round R (model, seed, temperature, n, ...) "
    "are refused.",
)
@click.option(
    "--db",
    default=None,
    metavar="URL|PATH",
    help="Embedded: the --out folder (or its srdq.db) of the `srdq run` that made RUN; the fork runs here "
    "into it. With --submit: a SQLAlchemy URL (default SRDQ_DATABASE_URL).",
)
@click.option("--submit", is_flag=True, help="Store the fork in the fleet database and enqueue its shards.")
@click.option("--name", default=None, help="Run name (default: PARENT-NAME-fork-rR).")
@log_options()
@friendly_errors
def fork_command(
    run_id: str,
    at_round: int,
    overrides: tuple[str, ...],
    db: str | None,
    submit: bool,
    name: str | None,
    log_level: str = "WARNING",
    log_format: str = "text",
) -> None:
    """Fork RUN at round R: a new run that starts from RUN's item states after round R (its drafts up to R
    shared, copied into the fork's checkpoints) and goes on with the changed parameters. The fork keeps
    RUN's seed, so `srdq compare RUN FORK --paired` compares two coupled runs. Prints the fork's run id.

    Example: srdq fork run-aaaaaaaaaaaa --db srdq-out --at-round 2 --set theta_high=0.8

    Example: srdq fork run-aaaaaaaaaaaa --at-round 2 --set policy=self_compare --submit
    """
    from srd_worker.spec import parse_overrides

    configure_logging(log_level, log_format)
    changes = parse_overrides(overrides)
    if submit:
        from srd_worker.local import versions
        from srd_worker.queue import enqueue, enqueue_many
        from srd_worker.service import submit_fork
        from srd_worker.settings import get_settings

        engine = open_db(db)
        try:
            forked, enqueued = submit_fork(
                run_id,
                at_round,
                changes,
                db=engine,
                enqueue=enqueue,
                enqueue_many=enqueue_many,
                name=name,
                versions=versions(),
                queue=get_settings().queue,
            )
        finally:
            engine.dispose()
        if forked.created:
            click.echo(
                f"forked {run_id} at round {at_round}: {forked.n_items} items in {forked.n_shards} shards, "
                f"{enqueued} enqueued",
                err=True,
            )
        else:
            click.echo("already forked (same parent, round and changes); `srdq resume` restarts it", err=True)
        click.echo(forked.run_id)
        return
    out = _out_dir(db, run_id)
    require_extra("worker", "srdq fork")
    from srd_worker.local import fork_local
    from srd_worker.settings import get_settings

    def on_start(fork_id: str, total: int, pending: int) -> None:
        click.echo(
            f"fork {fork_id} of {run_id} at round {at_round}: {total} items, {pending} to go", err=True
        )

    summary = fork_local(
        run_id, at_round, changes, out_dir=out, settings=get_settings(), name=name, on_start=on_start
    )
    acc = "n/a" if summary.accuracy is None else f"{summary.accuracy:.1%} ({summary.correct}/{summary.done})"
    click.echo(
        f"{summary.items} items, {summary.failed} failed, accuracy {acc}, mean gen tokens "
        f"{summary.mean_gen_tokens:.1f}, {summary.wall_seconds:.1f}s; results: {summary.results_path}",
        err=True,
    )
    click.echo(summary.run_id)


def register(cli: click.Group) -> None:
    cli.add_command(fork_command)
