"""A first leaderboard: dataset × method -> best validation balanced accuracy and the test
balanced accuracy of *that* checkpoint (never the best test score, which would be
selection on the test set). The full query layer builds on ``load_studies``.
"""

from __future__ import annotations

from collections.abc import Iterable

import mlflow
import pandas as pd
from mlflow.tracking import MlflowClient

STUDY_COLUMNS = {
    "tags.scarcelab.dataset": "dataset",
    "tags.scarcelab.method": "method",
    "tags.scarcelab.family": "family",
    "tags.scarcelab.seed": "seed",
    "tags.scarcelab.arch": "arch",
    "metrics.best/val_balanced_accuracy": "val_balanced_accuracy",
    "metrics.best/test_balanced_accuracy": "test_balanced_accuracy",
    "metrics.best/test_auroc": "test_auroc",
}


def load_studies(experiments: str | Iterable[str], tracking_uri: str | None = None,
                 include_failed: bool = False) -> pd.DataFrame:
    """One row per study run in the named experiments (tags and ``best/*`` metrics)."""
    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    names = [experiments] if isinstance(experiments, str) else list(experiments)
    client = MlflowClient()
    ids = []
    for n in names:
        exp = client.get_experiment_by_name(n)
        if exp is None:
            raise ValueError(f"no MLflow experiment named {n!r} at {mlflow.get_tracking_uri()}")
        ids.append(exp.experiment_id)
    flt = "tags.`scarcelab.role` = 'study'"
    if not include_failed:
        flt += " and attributes.status = 'FINISHED'"
    df = mlflow.search_runs(experiment_ids=ids, filter_string=flt, max_results=50_000)
    if df.empty:
        return pd.DataFrame(columns=["run_id", *STUDY_COLUMNS.values()])
    for col in STUDY_COLUMNS:
        if col not in df:
            df[col] = None
    out = df[["run_id", *STUDY_COLUMNS]].rename(columns=STUDY_COLUMNS)
    return out.reset_index(drop=True)


def leaderboard(experiments: str | Iterable[str], tracking_uri: str | None = None,
                sort_by: str = "test_balanced_accuracy_mean") -> pd.DataFrame:
    """Per (dataset, method): mean/std/n over studies (seeds) of the selected checkpoint's
    validation and test balanced accuracy, best first within each dataset."""
    studies = load_studies(experiments, tracking_uri)
    cols = ["dataset", "method", "val_balanced_accuracy_mean", "val_balanced_accuracy_std",
            "test_balanced_accuracy_mean", "test_balanced_accuracy_std", "n"]
    if studies.empty:
        return pd.DataFrame(columns=cols)
    g = studies.groupby(["dataset", "method"], as_index=False)
    out = g.agg(
        val_balanced_accuracy_mean=("val_balanced_accuracy", "mean"),
        val_balanced_accuracy_std=("val_balanced_accuracy", "std"),
        test_balanced_accuracy_mean=("test_balanced_accuracy", "mean"),
        test_balanced_accuracy_std=("test_balanced_accuracy", "std"),
        n=("run_id", "count"),
    )
    out = out.sort_values(["dataset", sort_by], ascending=[True, False])
    return out.reset_index(drop=True)[cols]
