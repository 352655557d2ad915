"""``srdq export``, ``srdq report``, ``srdq sync`` and ``srdq compare``: thin shells over
``srd_worker.results.export``, ``srd_worker.reports``, ``srd_worker.results.sync`` and ``srd_worker.reports.coupled`` (parse, wire,
call, print). Registered on the main group by ``register(cli)``.

Every command reads the database named by ``--db`` (a SQLAlchemy URL, or the path of an embedded run's
SQLite file such as ``srdq-out/srdq.db``), by default ``SRDQ_DATABASE_URL``.
"""

from __future__ import annotations

import click
from srdq_cli.common import db_option, friendly_errors, open_db, track_option


def _store(url: str | None):
    from srd_worker.results.objects import open_store
    from srd_worker.settings import get_settings

    settings = get_settings()
    return open_store(url or settings.object_store_url, settings)


@click.command()
@click.argument("run_id", metavar="RUN_ID|SWEEP_ID")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["parquet", "jsonl", "csv"]),
    default=None,
    help="jsonl keeps records nested; csv and parquet flatten them. Default: the one --out's suffix "
    "names (.parquet/.pq, .jsonl/.ndjson, .csv), else parquet; one that contradicts the suffix is refused.",
)
@click.option(
    "--out",
    "out",
    required=True,
    metavar="PATH|s3://BUCKET/KEY",
    help="Destination file (a folder gets RUN_ID.FORMAT inside it), or an S3 object; for a sweep, a "
    "folder (or s3://BUCKET/PREFIX/) that gets one RUN_ID.FORMAT per run.",
)
@db_option
@friendly_errors
def export(run_id: str, fmt: str | None, out: str, db: str | None) -> None:
    """Export RUN_ID's results from the database: one row per item in dataset order, failed items
    included (failed=true, with their error). A SWEEP_ID exports each of its runs to its own file.

    Example: srdq export run-1a2b3c4d5e6f --format csv --out results.csv --db srdq-out/srdq.db

    Example: srdq export sweep-0123456789ab --format csv --out sweep-csv/ --db srdq-out
    """
    from pathlib import Path

    from srd_worker.results.export import export_format, export_run
    from srd_worker.settings import get_settings
    from srd_worker.sweep import expand_ids, is_sweep_id

    fmt = export_format(fmt, out)  # before the database is opened: nothing to undo
    engine = open_db(db)
    try:
        if is_sweep_id(run_id):
            ids = expand_ids(engine, [run_id])
            if "://" not in out:
                Path(out).mkdir(parents=True, exist_ok=True)
            folder = out if out.endswith("/") else out + "/"
            for rid in ids:
                where, rows = export_run(engine, rid, fmt, folder, settings=get_settings())
                click.echo(f"{rid}: {len(rows)} rows -> {where}")
            click.echo(f"{run_id}: {len(ids)} runs exported")
            return
        where, rows = export_run(engine, run_id, fmt, out, settings=get_settings())
    finally:
        engine.dispose()
    failed = sum(1 for r in rows if r["status"] == "failed")
    pending = sum(1 for r in rows if r["status"] == "pending")
    note = f" ({failed} failed" + (f", {pending} without a result yet" if pending else "") + ")"
    click.echo(f"{len(rows)} rows{note} -> {where}")


@click.command()
@click.argument("run_ids", nargs=-1, required=True, metavar="RUN_ID|SWEEP_ID...")
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Folder for report.md and the PNG plots (and report.html with --html).",
)
@click.option(
    "--html",
    "html",
    is_flag=True,
    help="Also write report.html: the whole report as one self-contained page (plots embedded, no "
    "external URL) with a per-item view of every problem's candidates, rewards and routing.",
)
@track_option
@db_option
@friendly_errors
def report(run_ids: tuple[str, ...], out_dir: str, html: bool, track: str | None, db: str | None) -> None:
    """Write report.md and PNG plots for RUN_IDS: accuracy (or reward) vs generated tokens per method
    and budget, per-component time/calls (Table 2 layout), routing statistics (Table 6 layout) and a
    per-run summary. A SWEEP_ID stands for all its runs (runs differing only in seed are pooled).

    Example: srdq report run-aaa run-bbb --out report/ --db srdq-out/srdq.db

    Example: srdq report sweep-0123456789ab --out report/ --db srdq-out --html

    Example: srdq report run-aaa --out report/ --db srdq-out --track mlflow
    """
    from srd_worker.reports.builder import build_report
    from srd_worker.reports.html import build_html_report
    from srd_worker.reports.loading import load_report_runs
    from srd_worker.settings import get_settings
    from srd_worker.sweep import expand_ids
    from srd_worker.tracking import open_tracker, track_runs

    open_tracker(track, get_settings(), out_dir=out_dir)  # a missing package or bad setting: before writing
    engine = open_db(db)
    try:
        runs = load_report_runs(engine, expand_ids(engine, list(run_ids)))
    finally:
        engine.dispose()
    page = None
    if html:
        done, page = build_html_report(runs, out_dir)
    else:
        done = build_report(runs, out_dir)
    click.echo(str(done.markdown))
    for path in done.plots:
        click.echo(str(path))
    if page is not None:
        click.echo(str(page))
    for line in track_runs(track, runs, get_settings(), out_dir=out_dir):
        click.echo(f"tracked: {line}")


@click.command()
@click.argument("run_id")
@click.option(
    "--store",
    "store_url",
    default=None,
    metavar="s3://BUCKET/PREFIX|PATH",
    help="Object store (default: SRDQ_OBJECT_STORE_URL).",
)
@click.option(
    "--verify", is_flag=True, help="Also check uploaded parts (sha256) and upload broken ones again."
)
@click.option(
    "--force", is_flag=True, help="Upload every done shard and the run manifest again (e.g. a new store)."
)
@db_option
@friendly_errors
def sync(run_id: str, store_url: str | None, verify: bool, force: bool, db: str | None) -> None:
    """Upload RUN_ID's finished shards that are not in the object store yet, then its manifest (last,
    once every shard is done). Workers do this themselves; this is for when the store was down.

    Example: srdq sync run-1a2b3c4d5e6f --verify
    """
    from srd_worker.results.sync import sync_run

    store = _store(store_url)
    engine = open_db(db)
    try:
        done = sync_run(engine, store, run_id, verify=verify, force=force, wait=True)
    finally:
        engine.dispose()

    def shards(indexes: list[int]) -> str:
        return ", ".join(map(str, indexes)) if indexes else "none"

    click.echo(f"uploaded shards: {shards(done.uploaded)}")
    if done.repaired:
        click.echo(f"re-uploaded (missing or corrupt in the store): {shards(done.repaired)}")
    click.echo(f"already uploaded: {shards(done.already)}")
    if done.busy:
        click.echo(f"being uploaded by another process: {shards(done.busy)}")
    if done.unfinished:
        click.echo(f"not finished yet: {shards(done.unfinished)}")
    if done.manifest == "written":
        click.echo(f"run manifest written: {done.manifest_url}")
    elif done.manifest == "present":
        click.echo(f"run manifest already there: {done.manifest_url}")
    elif done.manifest == "busy":
        click.echo("run manifest: another process is writing it")
    else:
        click.echo("run manifest: waiting for every shard to finish")


@click.command()
@click.argument("srd_run", metavar="A")
@click.argument("rs_run", metavar="B")
@db_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--paired",
    is_flag=True,
    help="Compare any two runs on the same problems (not only SRD vs its rejection-sampling ablation): "
    "wins / ties / losses, exact McNemar p (over problems: with several seeds, each problem by the sign of "
    "its mean difference) and the paired 95% bootstrap CI of the difference.",
)
@click.option(
    "--metric",
    type=click.Choice(["auto", "accuracy", "reward"]),
    default="auto",
    show_default=True,
    help="With --paired: per-item correctness or reward (auto: accuracy when both runs are graded).",
)
@friendly_errors
def compare(srd_run: str, rs_run: str, db: str | None, as_json: bool, paired: bool, metric: str) -> None:
    """Coupled comparison of an SRD run with its rejection-sampling ablation run on the same items and
    seed (identical seeded drafts): mean R_max, wins / ties / losses, Δ_n with its paired 95% bootstrap
    CI (SRD paper Table 7 layout). With --paired, any two runs A and B on the same problems; A and B may
    also be SWEEP_ID:METHOD[:KEY=VALUE]... selecting one configuration of a sweep over its seeds (seeds
    paired by value, problems by item id).

    Example: srdq compare run-srd0123abcd run-rs0123abcd0 --db srdq-out

    Example: srdq compare run-aaaaaaaaaaaa run-bbbbbbbbbbbb --paired --db srdq-out

    Example: srdq compare sweep-0123456789ab:best_of_n sweep-0123456789ab:self_consistency --paired --db srdq-out
    """
    import json

    from srd_worker.reports.coupled import compare as coupled_compare
    from srd_worker.reports.coupled import coupling_mismatches, paired_records
    from srd_worker.store import crud
    from srd_worker.store.db import session_scope
    from srd_worker.sweep import is_sweep_id, select_runs

    if srd_run == rs_run:
        raise click.UsageError(f"A and B are both {srd_run}: name two different runs to compare")
    engine = open_db(db)
    try:
        if is_sweep_id(srd_run) or is_sweep_id(rs_run):
            if not paired:
                raise click.ClickException(
                    "sweep ids work with --paired (A and B as SWEEP_ID:METHOD[:KEY=VALUE])"
                )
            _paired_sweep(
                engine,
                srd_run,
                rs_run,
                select_runs(engine, srd_run),
                select_runs(engine, rs_run),
                metric=metric,
                as_json=as_json,
            )
            return
        with session_scope(engine) as session:
            runs = {rid: crud.get_run(session=session, run_id=rid) for rid in (srd_run, rs_run)}
            records = {rid: crud.load_results(session=session, run_id=rid) for rid in (srd_run, rs_run)}
    finally:
        engine.dispose()
    if paired:
        try:
            used, res = paired_records(records[srd_run], records[rs_run], metric=metric)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
        spec_a, spec_b = runs[srd_run].spec or {}, runs[rs_run].spec or {}
        notes = [
            f"{k} differs: {spec_a.get(k)!r} vs {spec_b.get(k)!r}"
            for k in ("dataset_sha256", "seed", "limit")
            if spec_a.get(k) != spec_b.get(k)
        ]
        if as_json:
            click.echo(json.dumps({"metric": used, **res.to_dict(), "notes": notes}, indent=2))
            return

        def g(v: float | None) -> str:
            return "n/a" if v is None else f"{v:.4f}"

        click.echo(f"A {srd_run} ({spec_a.get('method')}) vs B {rs_run} ({spec_b.get('method')}), {used}")
        click.echo(f"pairs (problems x seeds)  {res.pairs} ({res.problems} x {res.seeds})")
        click.echo(f"mean A / B               {g(res.mean_a)} / {g(res.mean_b)}")
        click.echo(f"A - B [95% CI]           {res.diff.text(4)}")
        click.echo(f"wins / ties / losses     {res.wins} / {res.ties} / {res.losses}")
        click.echo(f"McNemar exact p          {g(res.mcnemar_p)}")
        for note in notes:
            click.echo(f"note: {note}")
        return
    problems = coupling_mismatches(runs[srd_run].spec, runs[rs_run].spec)
    if problems:
        raise click.ClickException(
            f"{srd_run} and {rs_run} are not a coupled SRD / rejection-sampling pair: " + "; ".join(problems)
        )
    try:
        result = coupled_compare(records[srd_run], records[rs_run])
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return

    def f3(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.4f}"

    click.echo(f"items compared          {result.items}")
    click.echo(f"mean R_max  SRD / RS    {f3(result.mean_rmax_srd)} / {f3(result.mean_rmax_rs)}")
    lo, hi = result.delta_n_ci
    ci = "" if lo is None or hi is None else f" [95% CI {lo:.4f}, {hi:.4f}]"
    click.echo(f"Δ_n (mean R_max gain)   {f3(result.delta_n)}{ci}")
    click.echo(f"wins / ties / losses    {result.wins} / {result.ties} / {result.losses}")
    click.echo(f"refinements (improved)  {result.refinements} ({f3(result.refinements_improved)})")
    click.echo(
        f"reward before → after   {f3(result.reward_before_refine)} → {f3(result.reward_after_refine)}"
    )


def _paired_sweep(
    engine, name_a: str, name_b: str, ids_a: list[str], ids_b: list[str], *, metric: str, as_json: bool
) -> None:
    """``compare --paired`` between two configurations pooled over their seeds."""
    import json

    from srd_worker.reports.loading import load_report_runs
    from srd_worker.reports.rows import paired_seed_groups

    runs_a, runs_b = load_report_runs(engine, ids_a), load_report_runs(engine, ids_b)
    try:
        used, res, seeds = paired_seed_groups(runs_a, runs_b, metric=metric)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(
            json.dumps(
                {"metric": used, "seeds_paired": seeds, "a": ids_a, "b": ids_b, **res.to_dict()}, indent=2
            )
        )
        return

    def g(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.4f}"

    click.echo(f"A {name_a} ({len(ids_a)} runs) vs B {name_b} ({len(ids_b)} runs), {used}, seeds {seeds}")
    click.echo(f"pairs (problems x seeds)  {res.pairs} ({res.problems} x {res.seeds})")
    click.echo(f"mean A / B               {g(res.mean_a)} / {g(res.mean_b)}")
    click.echo(f"A - B [95% CI]           {res.diff.text(4)}")
    click.echo(f"wins / ties / losses     {res.wins} / {res.ties} / {res.losses}")
    click.echo(f"McNemar exact p          {g(res.mcnemar_p)}")


def register(cli: click.Group) -> None:
    """Add ``export``, ``report``, ``sync`` and ``compare`` to the ``srdq`` group."""
    for command in (export, report, sync, compare):
        cli.add_command(command)
