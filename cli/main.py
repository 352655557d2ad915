"""The `srdq` command (placeholder until the CLI lands)."""
import click


@click.group()
def cli() -> None:
    """srdq: offline evaluation of inference-time decoding methods."""
