"""``scarcelab leaderboard``: the query layer from the command line."""

from __future__ import annotations

import click

from entrypoints.cli import main


@main.command(name="leaderboard")
@click.option("--experiment", required=True, help="experiment name(s), comma-separated")
@click.option("--tracking-uri", default="")
@click.option("--format", "fmt", type=click.Choice(["csv", "markdown"]), default="csv")
def leaderboard_cmd(experiment: str, tracking_uri: str, fmt: str) -> None:
    """Dataset × method: best-on-validation checkpoint's validation and test scores."""
    from tracking.leaderboard import leaderboard

    df = leaderboard([e for e in experiment.split(",") if e], tracking_uri or None)
    click.echo(df.to_csv(index=False) if fmt == "csv" else df.to_markdown(index=False))
