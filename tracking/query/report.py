"""Assemble the views into a report, write it, and log it as a ``report`` run.

The report run (tag ``scarcelab.role=report``) carries the HTML page, the CSV/markdown
tables and the PNG plots as artifacts, so the leaderboard is browsable from the MLflow UI
next to the studies it summarises; the query layer itself ignores ``report`` runs.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scarcelab.tracking.query import render, views
from scarcelab.tracking.query.frame import Tracked

ALL_VIEWS = ("leaderboard", "gains", "profile", "significance", "ranks")
NOTES = {
    "leaderboard": "Per study, the checkpoint best on validation balanced accuracy; its "
                   "metrics averaged over seeds (std: sample std; n: distinct seeds). "
                   "Studies run with different settings are different rows (setting: "
                   "what else differs); a repeated seed counts once, the latest study "
                   "(repeats: which was kept; n_runs: studies found).",
    "gains": "Mean test balanced accuracy minus that of the best labeled-only method "
             "(sup, mixup, supcon) on each dataset; median and worst across datasets.",
    "profile": "Score of the checkpoint best on validation by time t since the study "
               "started; mean and min/max over seeds (rows: every t on the grid).",
    "significance": "Welch's two-sided t-test of each method against the best mean per "
                    "dataset; significantly_worse = p < 0.05.",
    "ranks": "Average rank (1 = best) over datasets (study) and over dataset x query size "
             "(al), with Friedman's test; CD diagrams use Wilcoxon-Holm cliques.",
}


def compute(t: Tracked, view: str, **filters: Any) -> Any:
    if view not in views.VIEWS:
        raise ValueError(f"unknown view {view!r}; choose from {', '.join(views.VIEWS)}")
    return views.VIEWS[view](t, **filters)


def sections(t: Tracked, which: Sequence[str] = ALL_VIEWS, **filters: Any
             ) -> list[render.Section]:
    """One section per view, with its plots; a view that cannot be computed on these runs
    (e.g. gains with no labeled-only baseline) becomes an empty table with a warning."""
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # said once per section, below
        for v in which:
            df = compute(t, v, **filters)
            figs: dict[str, Any] = {}
            if v == "leaderboard":
                figs["leaderboard"] = render.plot_leaderboard(df)
            elif v == "gains":
                figs["gains"] = render.plot_gains(df)
            elif v == "profile":
                figs["profile"] = render.plot_profile(df)
            elif v == "ranks":
                figs["cd_study"] = render.cd_figure(views.study_scores(t, **filters),
                                                    "methods over datasets")
                if len(t.role("al")):
                    al_filters = {k: v for k, v in filters.items() if k != "source"}
                    figs["cd_al"] = render.cd_figure(views.al_scores(t, **al_filters),
                                                     "AL strategies")
            sec = render.Section(v, df, figs, NOTES.get(v, ""))
            if v == "profile":
                sec.display = render.condense_profile(df)
                sec.note += f" The page shows a few time points; {v}.csv has all."
            out.append(sec)
    return out


def log_report(paths: dict[str, Path], experiment: str | None, run_name: str = "report",
               tags: dict[str, str] | None = None) -> str:
    """Log the written files as artifacts of a ``report`` run and return its id. Under
    ``mlflow run`` the run MLflow Projects opened is used (``MLFLOW_RUN_ID``)."""
    import mlflow

    active = mlflow.active_run()
    own = active is None
    if own:
        if experiment and not os.environ.get("MLFLOW_RUN_ID"):
            mlflow.set_experiment(experiment)
        active = mlflow.start_run(run_name=None if os.environ.get("MLFLOW_RUN_ID") else run_name)
    try:
        mlflow.set_tags({"scarcelab.role": "report", **(tags or {})})
        folder = Path(next(iter(paths.values()))).parent
        mlflow.log_artifacts(str(folder), artifact_path="report")
        run_id = active.info.run_id
    except BaseException:
        if own:
            mlflow.end_run(status="FAILED")
        raise
    if own:
        mlflow.end_run()
    return run_id
