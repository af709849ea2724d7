"""The first leaderboard API, kept as a thin layer over :mod:`tracking.query`.

Dataset × method -> validation balanced accuracy of the checkpoint best on validation and
the test metrics of *that* checkpoint (never the best test score, which would be selection
on the test set). New code should use ``tracking.query`` directly: it loads once and offers
the other views (gains, profile, significance, ranks).
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from scarcelab.tracking.query import frame, views

STUDY_COLUMNS = ["run_id", "dataset", "method", "family", "seed", "arch",
                 "val_balanced_accuracy", "test_balanced_accuracy", "test_auroc"]


def load_studies(experiments: str | Iterable[str], tracking_uri: str | None = None,
                 include_failed: bool = False) -> pd.DataFrame:
    """One row per study run in the named experiments: tags and the reported checkpoint's
    validation / test scores (the study's last ``best/*`` values)."""
    t = frame.load(experiments, tracking_uri, include_failed=include_failed)
    s = t.studies()
    out = pd.DataFrame({"run_id": s["run_id"]})
    for col in ("dataset", "method", "family", "seed", "arch"):
        out[col] = s[col] if col in s else None
    for col, key in (("val_balanced_accuracy", "best/val_balanced_accuracy"),
                     ("test_balanced_accuracy", "best/test_balanced_accuracy"),
                     ("test_auroc", "best/test_auroc")):
        out[col] = s[f"metrics.{key}"] if f"metrics.{key}" in s else float("nan")
    return out[STUDY_COLUMNS].reset_index(drop=True)


def leaderboard(experiments: str | Iterable[str], tracking_uri: str | None = None,
                sort_by: str = "test_balanced_accuracy_mean", **filters: object
                ) -> pd.DataFrame:
    """Per (dataset, n_labeled, family, method): mean/std/n over studies (seeds) of the
    selected checkpoint's metrics, best first within each dataset (see
    :func:`tracking.query.views.leaderboard`)."""
    return views.leaderboard(frame.load(experiments, tracking_uri), sort_by=sort_by,
                             **filters)


def experiments_with_studies(tracking_uri: str | None = None) -> list[str]:
    """The names of the active experiments that hold at least one scarcelab study run, in
    the store's order (``Default`` first when it has any): what ``scarcelab leaderboard``
    reads when no ``--experiment`` is given — a newcomer's studies went to ``Default``
    unless they named one, and needing to know that should not stop the first query."""
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    from scarcelab import tags as T

    c = MlflowClient(tracking_uri=tracking_uri)
    out = []
    for e in sorted(c.search_experiments(view_type=ViewType.ACTIVE_ONLY),
                    key=lambda e: (e.experiment_id != "0", e.creation_time or 0)):
        if c.search_runs([e.experiment_id], f"tags.`{T.ROLE}` = 'study'", max_results=1):
            out.append(e.name)
    return out
