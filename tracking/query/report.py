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

from scarcelab.tracking.query import registry, render
from scarcelab.tracking.query.frame import Tracked


def __getattr__(name: str) -> Any:
    """``ALL_VIEWS`` (the report's sections) and ``NOTES`` (each view's note) are read
    from the view registry when asked for, so they cannot drift from it."""
    if name == "ALL_VIEWS":
        return tuple(registry.report_views())
    if name == "NOTES":
        return {v.name: v.note for v in registry.registered()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def compute(t: Tracked, view: str, **filters: Any) -> Any:
    if view not in registry.REGISTRY:
        raise ValueError(f"unknown view {view!r}; choose from "
                         f"{', '.join(registry.view_names())}")
    return registry.get(view).build(t, **filters)


def section(t: Tracked, view: str, **filters: Any) -> render.Section:
    """The section of one view: its table, its declared figures and its note (and, where
    the view says so, a shorter table for the page)."""
    spec = registry.get(view)
    df = spec.build(t, **filters)
    figs = {name: draw(t, df, filters) for name, draw in spec.figures.items()}
    sec = render.Section(spec.name, df, figs, spec.note)
    if spec.display is not None:
        sec.display = spec.display(df)
        sec.note += spec.display_note
    return sec


def sections(t: Tracked, which: Sequence[str] | None = None, **filters: Any
             ) -> list[render.Section]:
    """One section per view (default: the report's, :func:`registry.report_views`), with
    its plots; a view that cannot be computed on these runs (e.g. gains with no
    labeled-only baseline) becomes an empty table with a warning."""
    if which is None:
        which = registry.report_views()
    for v in which:
        if v not in registry.REGISTRY:
            raise ValueError(f"unknown view {v!r}; choose from "
                             f"{', '.join(registry.view_names())}")
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # said once per section, below
        for v in which:
            out.append(section(t, v, **filters))
    return out


def log_report(paths: dict[str, Path], experiment: str | None, run_name: str = "report",
               tags: dict[str, str] | None = None, description: str | None = None) -> str:
    """Log the written files as artifacts of a ``report`` run and return its id. Under
    ``mlflow run`` the run MLflow Projects opened is used (``MLFLOW_RUN_ID``), so its
    name is MLflow's. ``description`` is the MLflow UI's Description of the run."""
    import mlflow
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

    from scarcelab import tags as T

    active = mlflow.active_run()
    own = active is None
    if own:
        if experiment and not os.environ.get("MLFLOW_RUN_ID"):
            from scarcelab.tracking.experiment_kind import mark_classic

            mark_classic(mlflow.MlflowClient(), mlflow.set_experiment(experiment).experiment_id)
        active = mlflow.start_run(run_name=None if os.environ.get("MLFLOW_RUN_ID") else run_name)
    try:
        mlflow.set_tags({T.ROLE: "report", **(tags or {}),
                         **({MLFLOW_RUN_NOTE: description} if description else {})})
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
