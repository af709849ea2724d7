"""``scarcelab leaderboard``: the query layer from the command line (and ``-e leaderboard``).

Without ``--output`` it is a read-only query: the chosen view goes to stdout and nothing is
written to the store. On a terminal that is an aligned table (mean ± std, rounded); piped or
redirected it stays CSV with every digit — what scripts written against the earlier CSV-only
output read — unless ``--format`` says otherwise. With ``--output DIR`` — or under ``mlflow
run``, where MLflow Projects already opened a run for it — it writes the whole report (HTML
page, CSV and markdown per view, PNG plots) and logs it as the artifacts of a run tagged
``scarcelab.role=report``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import warnings
from typing import Any

import click

from scarcelab import tags as T
from scarcelab.entrypoints.cli import main
from scarcelab.entrypoints.options import identity_options
from scarcelab.tracking.query.keys import RANKED


class ViewChoice(click.Choice):
    """The registered views (tracking/query/registry.py), read when the option is first
    parsed or shown: importing the query layer (pandas, scipy) at CLI start-up would slow
    every other command, and a list written here would drift from the registry."""

    def __init__(self) -> None:
        super().__init__(())

    @property
    def choices(self) -> tuple[str, ...]:
        from scarcelab.tracking.query.registry import static_view_names

        return tuple(static_view_names())

    # click declares ``choices`` a plain attribute; a property with a setter stands in for it
    @choices.setter
    def choices(self, value: object) -> None:  # pyright: ignore[reportIncompatibleVariableOverride]
        pass  # always the registry's


def _on_terminal() -> bool:
    return sys.stdout.isatty()


def _opt(s: str) -> str | None:
    s = s.strip()
    return s or None


#: the leaderboard's columns in a terminal table unless --columns says otherwise: the whole
#: frame is ~40 columns (~210 characters at one seed), which wraps every row at 80
DEFAULT_COLUMNS = (*RANKED, "method", "setting", "n",
                   "val_balanced_accuracy", "test_balanced_accuracy", "test_auroc")
#: dropped in this order while the default table is wider than the terminal
FIT_DROP = ("test_auroc", "val_balanced_accuracy", "setting", "n_labeled")


def _pick_columns(df: Any, names: list[str]) -> Any:
    """``df`` with the named columns, in that order: a name is a column or the base of a
    ``<name>_mean``/``<name>_std`` pair (shown as one "mean ± std" column)."""
    cols: list[str] = []
    unknown = []
    for n in names:
        hit = [n] if n in df.columns else [c for c in (f"{n}_mean", f"{n}_std")
                                           if c in df.columns]
        if not hit:
            unknown.append(n)
        cols += [c for c in hit if c not in cols]
    if unknown:
        have = sorted({c[:-5] if c.endswith("_mean") else c[:-4] if c.endswith("_std")
                       else c for c in df.columns})
        raise click.BadParameter(f"no column {', '.join(unknown)} in this view; it has: "
                                 f"{', '.join(have)} (or: all)", param_hint="'--columns'")
    return df[cols]


def _fit(df: Any, width: int) -> tuple[Any, str]:
    """The default leaderboard columns, less :data:`FIT_DROP` ones while the table is wider
    than ``width``; and the table text."""
    from scarcelab.tracking.query import render

    df = _pick_columns(df, [c for c in DEFAULT_COLUMNS
                            if c in df.columns or f"{c}_mean" in df.columns])
    text = render.to_table(df)
    for c in FIT_DROP:
        if max(map(len, text.splitlines()), default=0) <= width:
            break
        drop = [x for x in df.columns if x in (c, f"{c}_mean", f"{c}_std")]
        if drop:
            df = df.drop(columns=drop)
            text = render.to_table(df)
    return df, text


@main.command(name="leaderboard", short_help="Leaderboard and other views of tracked studies.")
@click.option("--experiment", default="", help="experiment name(s), comma-separated; "
              "default: every experiment holding scarcelab studies (Default, where studies "
              "go without --experiment, among them)")
@click.option("--tracking-uri", default="", help="default: MLFLOW_TRACKING_URI / MLflow's")
@click.option("--view", type=ViewChoice(), default="leaderboard",
              help="the view printed on stdout (any registered view)")
@click.option("--format", "fmt", default="auto", show_default=True,
              type=click.Choice(["auto", "table", "csv", "markdown", "json", "html"]),
              help="auto = an aligned table (mean ± std, rounded) on a terminal, CSV (every "
              "digit, one column per mean and std) when stdout is a pipe or file, so "
              "scripts reading the CSV keep working")
@click.option("--columns", default="", help="columns to print, comma-separated (a metric "
              "name such as test_auroc means its mean and std), or all; default: all, but "
              "a terminal table of the leaderboard shows dataset, n_labeled, "
              "budget_minutes, method, setting, n and the balanced accuracies, fitted to "
              "the terminal's width")
@click.option("--output", default="", help="folder for the full report; it is then also "
              "logged as a `report` run")
@click.option("--family", default="", help="filter: supervised,semi,self (comma-separated)")
@click.option("--dataset", default="", help="filter: dataset name(s)")
@click.option("--n-labeled", default="", help="filter: label budget(s)")
@click.option("--sort-by", default="test_balanced_accuracy_mean",
              help="leaderboard column to sort by (best first within each dataset)")
@click.option("--source", type=click.Choice(["auto", "study", "trials"]), default="auto",
              help="checkpoint record from the study series (auto prefers it) or trials")
@click.option("--include-failed", is_flag=True, help="also count unfinished studies")
@click.option("--log/--no-log", "do_log", default=True,
              help="log a written report as a `report` run")
@identity_options
def leaderboard_cmd(experiment: str, tracking_uri: str, view: str, fmt: str, columns: str,
                    output: str,
                    family: str, dataset: str, n_labeled: str, sort_by: str, source: str,
                    include_failed: bool, do_log: bool, run_name: str, tags: dict[str, str],
                    description: str) -> None:
    """Leaderboard, gains, accuracy-over-time profile, significance, ranks and the other
    registered views (transfer, Table 3, contamination, AL ranks) of the runs in
    EXPERIMENT(s); the full report (--output) has the report's sections."""
    import mlflow

    from scarcelab.tracking.query import load, log_report, render, report

    uri = _opt(tracking_uri)
    if uri:
        mlflow.set_tracking_uri(uri)
    from scarcelab.tracking.store_check import check_store

    # a query reads: a store path with no database yet is one line, and is not created
    check_store(uri or mlflow.get_tracking_uri(), read_only=True)
    filters = {k: v for k, v in (("family", _opt(family)), ("dataset", _opt(dataset)),
                                 ("n_labeled", _opt(n_labeled))) if v is not None}
    if not experiment.strip():
        from scarcelab.tracking.leaderboard import experiments_with_studies

        found = experiments_with_studies(uri)
        if not found:
            raise click.ClickException(
                f"no scarcelab studies in any experiment at {mlflow.get_tracking_uri()}; "
                "run one (scarcelab semi|self|supervised), or name experiments with "
                "--experiment, or the store with --tracking-uri")
        click.echo(f"experiments: {', '.join(found)} (every one holding scarcelab studies; "
                   "--experiment to choose)", err=True)
        experiment = ",".join(found)
    try:
        t = load(experiment, uri, include_failed=include_failed)
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    kw = {"source": source, **filters}
    out_dir = _opt(output)
    under_project = bool(os.environ.get("MLFLOW_RUN_ID"))
    if out_dir is None and not under_project:
        extra = {"sort_by": sort_by} if view == "leaderboard" else {}
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            df = report.compute(t, view, **kw, **extra)
        notes = [str(w.message) for w in said if issubclass(w.category, UserWarning)]
        from scarcelab.tracking.query import mixed_budgets

        mixed = mixed_budgets(df) if view in ("leaderboard", "significance") else []
        if mixed and not any("time budget" in n for n in notes):
            notes.append("ranked within each time budget, never across: " + "; ".join(mixed))
        if fmt == "auto":
            fmt = "table" if _on_terminal() else "csv"
        total = len(df.columns)
        table = None
        if _opt(columns) and columns.strip() != "all":
            df = _pick_columns(df, [c.strip() for c in columns.split(",") if c.strip()])
        elif fmt == "table" and view == "leaderboard" and not _opt(columns):
            df, table = _fit(df, shutil.get_terminal_size((100, 24)).columns)
            notes.append(f"{len(df.columns)} of {total} columns shown; --columns all (or "
                         "--format csv) for every one")
        for n in notes:
            click.echo(f"note: {n}", err=True)
        if fmt == "csv":
            click.echo(render.to_csv(df), nl=False)
        elif fmt == "table":
            click.echo(table if table is not None else render.to_table(df))
        elif fmt == "json":
            click.echo(render.to_json(df))
        elif fmt == "markdown":
            click.echo(render.to_markdown(df) if df.empty else render.people_frame(df)
                       .to_markdown(index=False, disable_numparse=True))
        else:
            sec = report.sections(t, [view], **kw)
            sec[0].table = df
            click.echo(render.html_report(sec, f"scarcelab {view}",
                                          render.report_meta([experiment], t.reader.uri),
                                          {n: render.png_bytes(f) for n, f in
                                           sec[0].figures.items() if f is not None}))
        return
    if out_dir is None:
        out_dir = tempfile.mkdtemp(prefix="scarcelab-report-")
    secs = report.sections(t, None, **kw)  # the report's views; the leaderboard first
    if sort_by != "test_balanced_accuracy_mean":
        from scarcelab.tracking.query import leaderboard

        secs[0].table = leaderboard(t, sort_by=sort_by, **kw)
    names = [n for n in experiment.split(",") if n]
    paths = render.write_report(secs, out_dir, f"scarcelab report: {', '.join(names)}",
                                render.report_meta(names, t.reader.uri))
    click.echo(f"report: {paths['report.html']}")
    if do_log:
        run_id = log_report(paths, names[0], run_name=run_name or "report",
                            tags={**tags, T.EXPERIMENTS: ",".join(names)},
                            description=description or None)
        click.echo(f"report run: {run_id}")
