"""``srdq calibrate``: the offline calibration pass of EASD and CSD (``srd_worker.methods.speculative_calibration``).

A thin shell; registered on the ``srdq`` group by ``cli/main.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from srdq_cli.common import friendly_errors, require_extra


@click.command("calibrate")
@click.argument("dataset")
@click.option("--model", default="smollm2", show_default=True, help="Target model (as for srdq run --model).")
@click.option(
    "--draft-model", "draft_model", required=True, help="Draft model: a local folder or a name srdq knows."
)
@click.option(
    "--out",
    "out_file",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="JSON file to write.",
)
@click.option(
    "--limit", type=int, default=None, help="Use the first N problems of the dataset (default: all)."
)
@click.option("--task", default="auto", show_default=True, help="Task adapter (as for srdq run --task).")
@click.option(
    "--gamma", type=int, default=5, show_default=True, help="Draft length γ of the calibration pass."
)
@click.option(
    "--temperature",
    type=float,
    default=0.0,
    show_default=True,
    help="Sampling temperature (0 = greedy, CSD's setting).",
)
@click.option(
    "--max-new-tokens", type=int, default=256, show_default=True, help="Tokens generated per problem at most."
)
@click.option(
    "--percentiles",
    default="70,80,90",
    show_default=True,
    help="Entropy percentiles to report (comma-separated).",
)
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Seed of the sampled draws (temperature > 0).",
)
@friendly_errors
def calibrate_command(
    dataset: str,
    model: str,
    draft_model: str,
    out_file: Path,
    limit: int | None,
    task: str,
    gamma: int,
    temperature: float,
    max_new_tokens: int,
    percentiles: str,
    seed: int,
) -> None:
    """Run speculative decoding (lossless rule) over the prompts of a calibration split and write the
    token-entropy percentiles of both models (EASD's tau_q / tau_p) and the draft/target rejection pairs
    (CSD's offline correction memory, read by `csd --set memory=FILE`) to one JSON file.

    Example: srdq calibrate srd_worker/testbed/artifacts/data/calibration.jsonl --model testbed
    --draft-model testbed-draft --limit 200 --out calib.json
    """
    require_extra("worker", "srdq calibrate")  # before anything is read or written: it runs two models
    from srd_worker.datasets import resolve_dataset
    from srd_worker.engines.registry import build_engine
    from srd_worker.engines.speculative import check_draft_model
    from srd_worker.errors import ConfigError
    from srd_worker.methods.speculative_calibration import calibrate
    from srd_worker.settings import get_settings
    from srd_worker.tasks.registry import load_items

    try:
        pcts = [float(p) for p in percentiles.split(",") if p.strip()]
    except ValueError:
        raise ConfigError(f"--percentiles expects numbers like 70,80,90, got {percentiles!r}") from None
    if not pcts or any(not 0 <= p <= 100 for p in pcts):
        raise ConfigError(f"--percentiles must be numbers in [0, 100], got {percentiles!r}")
    if gamma < 1 or max_new_tokens < 1 or temperature < 0 or (limit is not None and limit < 1):
        raise ConfigError("--gamma, --max-new-tokens and --limit must be >= 1, --temperature >= 0")
    check_draft_model(draft_model)
    task_obj, items = load_items(resolve_dataset(dataset), task)
    items = items[:limit] if limit else items
    engine = build_engine("transformers", model, get_settings())
    prompts = [engine.tokenizer.chat_prompt_ids(task_obj.messages(it)) for it in items]
    record = calibrate(
        engine,
        prompts,
        draft_model=draft_model,
        gamma=gamma,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        percentiles=pcts,
        seed=seed,
        progress=lambda done, total: click.echo(f"{done}/{total} problems", err=True),
    )
    record.update({"model": model, "dataset": str(dataset)})
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    raw = record["entropy_percentiles"]["raw"]
    for p in raw["draft"]:
        click.echo(f"P{p}: easd --set tau_q={raw['draft'][p]:.4f} --set tau_p={raw['target'][p]:.4f}")
    click.echo(
        f"{record['positions']} verified positions, {record['mismatches']} rejections in "
        f"{len(record['pairs'])} (draft, target) pairs: csd --set memory={out_file}"
    )


def register(cli: click.Group) -> None:
    """Add ``calibrate`` to the ``srdq`` command group."""
    cli.add_command(calibrate_command)
