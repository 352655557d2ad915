"""``srdq merge``: a thin shell over ``srd_worker.merge`` (parse, call, print). Registered on the main group
by ``register(cli)``."""

from __future__ import annotations

import click
from srdq_cli.common import friendly_errors


@click.command()
@click.argument("folders", nargs=-1, required=True, metavar="DIR|'GLOB'...")
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Folder for the merged run (srdq.db, RUN_ID/results.jsonl, summary.json, merge.json); read it with "
    "`srdq export` / `srdq report` --db OUT.",
)
@click.option(
    "--allow-partial",
    is_flag=True,
    help="Merge the slices that are there even when some are missing or unfinished (their shards stay "
    "pending; merging again later adds them).",
)
@click.option(
    "--run",
    "run_id",
    default=None,
    metavar="RUN_ID",
    help="The run whose slices to merge, when the folders hold slices of several runs.",
)
@friendly_errors
def merge(folders: tuple[str, ...], out_dir: str, allow_partial: bool, run_id: str | None) -> None:
    """Merge the slices of one run (`srdq run --num-shards K --shard-index I`, each in its own --out
    folder) into one run's output folder. Refuses slices of different runs (naming the spec field that
    differs), a slice given twice, and missing or unfinished slices (listed; unless --allow-partial):
    exit code 1 and nothing written.

    Example: srdq merge slices/0 slices/1 slices/2 --out merged/

    Example: srdq merge 'slices/*' --out merged/ && srdq report RUN_ID --out report/ --db merged/
    """
    from srd_worker.merge import expand_folders, merge_slices

    done = merge_slices(expand_folders(folders), out_dir, allow_partial=allow_partial, run_id=run_id)
    merged = ", ".join(map(str, done.merged))
    click.echo(
        f"{done.run_id}: merged slices {merged} of {done.count}: {done.results} of {done.items} items "
        f"with results -> {done.results_path}"
    )
    if done.missing:
        click.echo(f"missing slices: {', '.join(map(str, done.missing))}")
    if done.unfinished:
        click.echo(
            f"unfinished slices (their finished shards merged): {', '.join(map(str, done.unfinished))}"
        )
    if done.summary is not None:
        s = done.summary
        acc = "n/a" if s.accuracy is None else f"{s.accuracy:.1%} ({s.correct}/{s.done})"
        click.echo(f"accuracy {acc}, failed {s.failed}, mean gen tokens {s.mean_gen_tokens:.1f}")
    click.echo(
        f"read it with: srdq export {done.run_id} --db {done.out} / srdq report {done.run_id} --db {done.out}"
    )


def register(cli: click.Group) -> None:
    """Add ``merge`` to the ``srdq`` group."""
    cli.add_command(merge)
