"""``--sweep FILE`` on ``srdq run`` and ``srdq submit dataset``, and ``srdq status SWEEP``: thin shells over
``srd_worker.sweep`` and ``srd_worker.service`` (parse, check the option mix, call, print).

With ``--sweep`` the file names the dataset and every per-run setting, so the DATASET argument is left
out and a per-run option given on the command line (``--method``, ``--n``, ``--seed``, ...) is an error
naming the option; only the command's own options (``--out``; ``--name``, ``--dry-run``) apply.
"""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.table import Table
from srdq_cli.common import DEFAULT_SHARD_SIZE, console

sweep_option = click.option(
    "--sweep",
    "sweep_file",
    default=None,
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="A YAML sweep file (dataset, model, reward once; a grid of methods x n x params x seeds): "
    "every point is validated first, then each run is done in order. Replaces the dataset argument "
    "and the per-run options.",
)


def check_mix(ctx: click.Context, *, allowed: set[str]) -> None:
    """With ``--sweep``: no DATASET argument and no per-run option from the command line."""
    for param in ctx.command.params:
        if param.name in allowed or param.name == "sweep_file":
            continue
        if ctx.get_parameter_source(param.name) == click.core.ParameterSource.COMMANDLINE:
            if isinstance(param, click.Argument):
                raise click.UsageError(
                    f"--sweep takes the dataset from the sweep file: drop the {param.human_readable_name} "
                    "argument"
                )
            flag = max(param.opts, key=len)
            raise click.UsageError(f"{flag} cannot be combined with --sweep (the sweep file sets it)")


def check_single(dataset: str | None, method: str | None) -> tuple[str, str]:
    """Without ``--sweep``: the DATASET argument and ``--method`` are required; returns them."""
    if dataset is None:
        raise click.UsageError("Missing argument 'NAME|PATH' (or give --sweep FILE).")
    if method is None:
        raise click.UsageError("Missing option '--method' (or give --sweep FILE).")
    return dataset, method


def _fmt(v: float | None, pct: bool = False) -> str:
    if v is None:
        return "n/a"
    return f"{v:.1%}" if pct else f"{v:.1f}"


def run_sweep(sweep_file: str, out_dir: str) -> None:
    """``srdq run --sweep FILE``: every point in order, one output folder, a line per point, a table."""
    from srd_worker.settings import get_settings
    from srd_worker.sweep import PointResult, SweepRun, plan_sweep

    plan = plan_sweep(sweep_file, default_shard_size=DEFAULT_SHARD_SIZE)
    total = len(plan.prepared)
    click.echo(f"sweep {plan.sweep_id} ({plan.name}): {total} runs -> {out_dir}", err=True)

    def on_point(i: int, point: SweepRun, run_id: str, state: str) -> None:
        what = "finished, re-reporting" if state == "done" else "running"
        click.echo(
            f"[{i + 1}/{total}] {run_id} {point.method} {_params(point.params)} seed {point.seed}: {what}",
            err=True,
        )

    def on_done(res: PointResult) -> None:
        s = res.summary
        click.echo(
            f"[{res.index + 1}/{total}] {s.run_id} done: accuracy {_fmt(s.accuracy, True)}, "
            f"mean tokens {s.mean_gen_tokens:.1f}, {s.wall_seconds:.1f}s",
            err=True,
        )

    from srd_worker.sweep import run_sweep_local

    results = run_sweep_local(
        plan, out_dir=out_dir, settings=get_settings(), on_point=on_point, on_done=on_done
    )
    table = Table(title=f"{plan.sweep_id} · {plan.name}")
    table.add_column("run", no_wrap=True, min_width=16)
    table.add_column("method", no_wrap=True)
    for col in ("n", "seed", "accuracy", "mean tokens"):
        table.add_column(col, justify="right")
    for res in results:
        s = res.summary
        acc = "n/a" if s.accuracy is None else f"{s.accuracy:.1%} ({s.correct}/{s.done})"
        n = res.point.params.get("n", plan.prepared[res.index].spec.params.get("n", ""))
        table.add_row(
            s.run_id, res.point.method, str(n), str(res.point.seed), acc, f"{s.mean_gen_tokens:.1f}"
        )
    console().print(table)
    click.echo(f"sweep {plan.sweep_id}: {len(results)} runs in {out_dir}")


def _params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def submit_sweep(sweep_file: str, *, name: str | None, dry_run: bool) -> None:
    """``srdq submit dataset --sweep FILE``: validate every point, then store and enqueue each run."""
    from srd_worker.sweep import close_prepared, plan_sweep

    # the dataset is validated once into a spool on disk, shared by every point
    plan = plan_sweep(sweep_file, name=name, default_shard_size=DEFAULT_SHARD_SIZE, stream=True)
    try:
        _submit_plan(plan, dry_run=dry_run)
    finally:
        close_prepared(plan.prepared)


def _submit_plan(plan: Any, *, dry_run: bool) -> None:
    err = Console(stderr=True, highlight=False)
    if dry_run:
        for p in plan.prepared:
            shards = -(-len(p.items) // p.spec.shard_size)
            click.echo(f"{p.spec.run_id()}: {len(p.items)} items in {shards} shards (method {p.spec.method})")
        click.echo(f"{plan.sweep_id}: {len(plan.prepared)} runs; dry run, nothing stored")
        return
    from srdq_cli.common import open_db

    from srd_worker.local import versions
    from srd_worker.queue import enqueue, enqueue_many
    from srd_worker.service import submit_sweep as service_submit

    db = open_db()
    try:
        from srd_worker.settings import get_settings

        done = service_submit(
            plan,
            db=db,
            enqueue=enqueue,
            enqueue_many=enqueue_many,
            versions=versions(),
            queue=get_settings().queue,
        )
    finally:
        db.dispose()
    err.print(
        f"sweep {done.sweep_id}: {len(done.run_ids)} runs, {len(done.created)} stored now, "
        f"{done.enqueued} shards enqueued"
        + ("" if done.created else " (already submitted: same sweep file and dataset)")
    )
    click.echo(done.sweep_id)
    for run_id in done.run_ids:
        click.echo(run_id)


def sweep_status_view(st: Any) -> Any:
    """``srdq status SWEEP``: one row per run with its progress (run ids and methods never cut)."""
    table = Table(title=f"{st.sweep_id} · {st.name} · {st.status}")
    table.add_column("run", no_wrap=True, min_width=16)
    table.add_column("method", no_wrap=True)
    for col in ("n", "seed", "status", "items", "failed", "tokens"):
        table.add_column(col, justify="left" if col == "status" else "right")
    for r, params, seed in zip(st.runs, st.params, st.seeds, strict=True):
        table.add_row(
            r.run_id,
            r.method,
            str(params.get("n", "")),
            str(seed),
            r.status,
            f"{r.done + r.failed}/{r.items}",
            str(r.failed),
            str(r.gen_tokens),
        )
    return table
