"""The query layer: tracked studies -> the tables and figures of the papers we implement.

    from scarcelab.tracking.query import load, leaderboard, gains, profile, significance, ranks
    t = load("my-benchmark", tracking_uri="sqlite:///mlflow.db")   # read once
    leaderboard(t, dataset="pathmnist", sort_by="test_auroc_mean")
    gains(t); profile(t); significance(t); ranks(t)

See docs/query.md for what every column means and how each view is computed; a new view
is one ``@view(name, note=...)`` function in a module of this package (registry.py).
"""

from scarcelab.tracking.query.frame import Tracked, load, tidy_runs
from scarcelab.tracking.query.registry import View, view, view_names
from scarcelab.tracking.query.report import log_report, sections
from scarcelab.tracking.query.store import ApiReader, SqlReader, open_reader
from scarcelab.tracking.query.views import (
    VIEWS,
    al_ranks,
    al_scores,
    filter_frame,
    gains,
    leaderboard,
    per_study,
    profile,
    ranks,
    significance,
    study_scores,
    transfer,
)

__all__ = ["VIEWS", "ApiReader", "SqlReader", "Tracked", "al_ranks", "al_scores",
           "filter_frame", "gains", "leaderboard", "load", "log_report", "open_reader",
           "per_study", "profile", "ranks", "sections", "significance", "study_scores",
           "tidy_runs", "transfer", "View", "view", "view_names"]
