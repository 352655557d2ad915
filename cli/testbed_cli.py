"""``srdq testbed build``: train the CPU reasoning testbed (``srd_worker.testbed``).

A thin shell over ``srd_worker.testbed.train.build``; registered on the ``srdq`` group by ``cli/main.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from srdq_cli.common import require_extra


@click.group("testbed")
def testbed_group() -> None:
    """The CPU reasoning testbed: generated multi-step arithmetic word problems (GSM8K layout), a small
    Llama policy and draft trained on them, and an outcome reward model trained on the policy's samples.

    The committed build is used by `--model testbed`, `--model testbed-draft`, `--reward hf-orm:testbed-rm`
    and the `testbed` dataset.
    """


@testbed_group.command("build")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder to write the data splits, policy, draft, rm and manifest.json to (replacing what is "
    "there). Default: the package's srd_worker/testbed/artifacts.",
)
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Seed of the data and of all training.",
)
@click.option(
    "--init-from",
    "init_from",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="A finished build folder: train its policy and draft further instead of starting from random "
    "weights (the committed build was made this way from the first build; see its manifest's init).",
)
def build_command(out_dir: Path | None, seed: int, init_from: Path | None) -> None:
    """Generate the data and train the policy, draft and reward model on the CPU (one thread, about 20
    minutes on a shared 2-core machine); print the manifest's measured accuracies and reward-model AUROC."""
    import shutil
    import tempfile

    require_extra("worker", "srdq testbed build")  # it trains with torch
    from srd_worker.testbed.train import ARTIFACTS_DIR, BuildConfig, build

    config = None
    with tempfile.TemporaryDirectory() as tmp:
        if init_from is not None:
            # a copy: the build replaces what is in its output folder, which may be init_from itself
            source = Path(tmp) / "init"
            shutil.copytree(init_from, source)
            config = BuildConfig(init_from=str(source))
        manifest = build(
            out_dir or ARTIFACTS_DIR, seed=seed, config=config, log=lambda m: click.echo(m, err=True)
        )
    summary = {k: manifest[k] for k in ("parameters", "evaluation", "reward_model", "timings")}
    click.echo(json.dumps(summary, indent=2))


def register(cli: click.Group) -> None:
    """Add ``testbed`` to the ``srdq`` command group."""
    cli.add_command(testbed_group)
