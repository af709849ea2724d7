"""``scarcelab list methods|datasets|archs|strategies|al-datasets``."""

from __future__ import annotations

import click

from scarcelab.entrypoints.cli import main


@main.command(name="list", short_help="List registered methods, datasets, archs, strategies.")
@click.argument("what", type=click.Choice(["methods", "datasets", "archs", "strategies",
                                                  "al-datasets"]))
def list_cmd(what: str) -> None:
    """Print registered names, one per line, with their family/kind."""
    if what == "methods":
        from scarcelab.methods import METHODS
        for name, cls in METHODS.items():
            click.echo(f"{name}\t{cls.family}")
    elif what == "datasets":
        from scarcelab.data import DATASETS
        for name, _ in DATASETS.items():
            click.echo(f"{name}\tdataset")
    elif what == "archs":
        from scarcelab.models import MODELS
        for name, _ in MODELS.items():
            click.echo(f"{name}\tarch")
    elif what == "al-datasets":
        from scarcelab.active.datasets import list_al_datasets, spec
        for name in list_al_datasets():
            click.echo(f"{name}\t{spec(name).kind}")
    else:
        from scarcelab.active import STRATEGIES
        for name, _ in STRATEGIES.items():
            click.echo(f"{name}\tstrategy")
