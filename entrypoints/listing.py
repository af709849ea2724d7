"""``scarcelab list methods|datasets|archs|strategies|al-datasets``."""

from __future__ import annotations

import click

from scarcelab.entrypoints.cli import main
from scarcelab.entrypoints.options import Folder


@main.command(name="list", short_help="List registered methods, datasets, archs, strategies.")
@click.argument("what", type=click.Choice(["methods", "datasets", "archs", "strategies",
                                                  "al-datasets"]))
@click.option("--data-dir", default="default", show_default=True, type=Folder(),
              help="datasets: the data root to look in (default: $SCARCELAB_DATA or "
              "~/.cache/scarcelab)")
def list_cmd(what: str, data_dir: str | None) -> None:
    """Print registered names, one per line, with their family/kind; datasets with their
    classes, train/val/test sizes and whether their files are on disk."""
    if what == "datasets":
        _datasets(data_dir)
    elif what == "methods":
        from scarcelab.methods import METHODS
        for name, cls in METHODS.items():
            click.echo(f"{name}\t{cls.family}")
    elif what == "archs":
        from scarcelab.models import MODELS
        for name, _ in MODELS.items():
            click.echo(f"{name}\tarch")
    elif what == "al-datasets":
        from scarcelab.active.datasets import list_al_datasets, spec
        for name in list_al_datasets():
            click.echo(f"{name}\t{spec(name).kind}")
        click.echo("folder:PATH, csv:FILE\timage (your own images; encoded_folder:PATH "
                   "encodes them, the encoder learning from their unlabeled/ too)")
    else:
        from scarcelab.active import STRATEGIES
        for name, _ in STRATEGIES.items():
            click.echo(f"{name}\tstrategy")


def _datasets(data_dir: str | None) -> None:
    """An aligned table (name first, so ``cut -f1``-style scripts still see the names):
    sizes are the source's official train/val/test counts where it states them."""
    from scarcelab.data import DATASETS
    from scarcelab.data.catalog import OWN_IMAGES, describe
    from scarcelab.data.download import data_root

    rows = [("dataset", "classes", "train/val/test", "on disk", "where")]
    for name in DATASETS.names():
        e = describe(name, data_dir)
        rows.append((e.name, "-" if e.classes is None else str(e.classes), e.sizes,
                     e.on_disk, e.where))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True))
                   + "  " + r[4])
    click.echo(f"data root: {data_root(data_dir)} (--data-dir or $SCARCELAB_DATA to change)")
    click.echo(OWN_IMAGES)
