"""The contamination study's Table A1 as a query view.

Its rows are summaries of each child study's best trial *history* (the diagnostics'
final and peak values), which the tidy frame of :class:`~tracking.query.frame.Tracked`
does not hold, so the view reads them through :mod:`scarcelab.tracking.contamination`
from the same store and experiments; registering it here puts it with the other views
(CLI choice, sweep report part) instead of in a list of its own.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pandas as pd

from scarcelab.tracking.query.frame import Tracked
from scarcelab.tracking.query.registry import SweepContext, view


def _markdown(table: pd.DataFrame) -> str:
    from scarcelab.tracking.contamination import to_markdown

    return to_markdown(table)


def _for_sweep(t: Tracked, ctx: SweepContext) -> pd.DataFrame:
    """A sweep reads its own experiment from the tracking URI it runs under."""
    from scarcelab.tracking.contamination import contamination_table

    return contamination_table(experiments=[ctx.experiment])


@view("contamination", order=60, entries=["contamination"], section=False,
      markdown=_markdown, sweep_build=_for_sweep,
      note="Table A1 of the contamination study: per method, OOD source, kind and "
           "contamination ratio r, the best trial's test and validation balanced accuracy "
           "and its diagnostics (final and peak), with the change relative to r = 0.")
def contamination(t: Tracked, **filters: Any) -> pd.DataFrame:
    """Table A1 of every finished contamination child study in ``t``'s experiments; only
    the ``dataset`` filter applies."""
    from scarcelab.tracking.contamination import contamination_table

    uri = getattr(t.reader, "uri", None)
    # read from t's store without making it the process's tracking URI (a query must not
    # redirect the runs a caller logs next); contamination_table would set it globally
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    with _use_tracking_uri(uri) if uri else contextlib.nullcontext():
        table = contamination_table(experiments=list(t.experiments))
    if filters.get("dataset") is not None and "dataset" in table and len(table):
        from scarcelab.tracking.query.views import filter_frame

        table = filter_frame(table, dataset=filters["dataset"])
    return table
