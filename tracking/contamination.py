"""Contamination sweep view, shaped like C-Score's Table A1 (Chen et al., arXiv 2608.20667).

Rows: method × OOD source × ratio (× seed). Columns: best accuracy (test balanced accuracy of the
checkpoint best on validation, and that validation score), final and peak CCI, final PLE,
Sem-Drift, Grad-Align and OOD-FF, each with its relative change against r = 0 of the same
method (``(x − x₀) / |x₀|``). The diagnostics are those of the study's *best* trial (the
one whose checkpoint is the study's answer), read from its per-epoch ``diag/*`` history:
"final" is the last epoch, "peak" the maximum over epochs (NaN epochs ignored).

The r = 0 study of a sweep is shared by all its sources (same clean pool), so it is
repeated as the r = 0 row of each source. This module reads MLflow; the table and plot
builders are pure functions on DataFrames so they can be tested without a store.

:func:`killed_sweep` and :func:`finished_children` are what resuming a killed sweep reads
(``entrypoints/contamination.py``): the parent run of the same command whose process
died, and the child studies that had finished under it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from scarcelab import tags as T
from scarcelab.redaction import redact

DIAGNOSTICS = ("cci", "ple", "sem_drift", "grad_align", "ood_ff")
VALUE_COLUMNS = ["best_test_bacc", "best_val_bacc", "cci_final", "cci_peak", "ple_final",
                 "sem_drift_final", "grad_align_final", "ood_ff_final"]
KEY_COLUMNS = ["method", "dataset", "seed", "source", "kind", "ratio"]


def summarise_history(history: dict[str, list[float]]) -> dict[str, float]:
    """Final and peak values of each ``diag/*`` history (lists in epoch order)."""
    out: dict[str, float] = {}
    for d in DIAGNOSTICS:
        h = [v for v in history.get(d, [])]
        out[f"{d}_final"] = float(h[-1]) if h else math.nan
        finite = [v for v in h if not math.isnan(v)]
        out[f"{d}_peak"] = float(max(finite)) if finite else math.nan
    return out


def table_a1(points: pd.DataFrame) -> pd.DataFrame:
    """Table A1 from one row per child study (``KEY_COLUMNS`` + ``VALUE_COLUMNS``).

    The r = 0 row of each method and seed is copied to every source of that method and
    seed, then every value column gets a ``rel_<column>`` relative change against the
    r = 0 row of the *same seed*. Why per seed: a sweep cell is one seed's contamination
    parent, so a suite run over seeds holds one clean study per seed; each seed's dirty
    studies share its split and labeled set, and a rule pairs them on it. (Before, only the
    first clean row was kept, so the r = 0 arm had n = 1 whatever the seeds run.)
    ``points`` without a ``seed`` column count as one seed.
    """
    cols = KEY_COLUMNS + VALUE_COLUMNS
    rel_cols = [f"rel_{c}" for c in VALUE_COLUMNS]
    if points.empty:
        return pd.DataFrame(columns=cols + rel_cols)
    df = points.reindex(columns=cols)  # a missing seed column comes in as NaN: one seed
    df["seed"] = df["seed"].fillna("").astype(str)
    df["ratio"] = df["ratio"].astype(float)
    rows: list[dict[str, Any]] = []
    for (method, dataset, seed), g in df.groupby(["method", "dataset", "seed"], sort=True):
        clean = g[g["ratio"] == 0.0]
        base = clean.iloc[0].to_dict() if len(clean) else None
        dirty = g[g["ratio"] > 0.0]
        for source in sorted(dirty["source"].unique()) or sorted(g["source"].unique()):
            part = dirty[dirty["source"] == source].sort_values("ratio")
            kind = str(part["kind"].iloc[0]) if len(part) else "none"
            recs = [{**base, "source": source, "kind": kind}] if base is not None else []
            recs += [r.to_dict() for _, r in part.iterrows()]
            for rec in recs:
                for c in VALUE_COLUMNS:
                    rec[f"rel_{c}"] = _relative(rec[c], base[c] if base is not None else None)
                rec["method"], rec["dataset"], rec["seed"] = method, dataset, seed
                rows.append(rec)
    out = pd.DataFrame(rows, columns=cols + rel_cols)
    for c in VALUE_COLUMNS + rel_cols + ["ratio"]:
        out[c] = pd.to_numeric(out[c], errors="coerce")
    seed_order = pd.to_numeric(out["seed"], errors="coerce")
    out = out.assign(_s=seed_order).sort_values(
        ["method", "dataset", "source", "ratio", "_s", "seed"], kind="stable")
    return out.drop(columns="_s").reset_index(drop=True)


def _relative(x: Any, x0: Any) -> float:
    """``(x − x₀) / |x₀|``; NaN when either is missing or the baseline is 0."""
    try:
        xf, x0f = float(x), float(x0)
    except (TypeError, ValueError):
        return math.nan
    if math.isnan(xf) or math.isnan(x0f) or x0f == 0.0:
        return math.nan
    return (xf - x0f) / abs(x0f)


def plot_vs_ratio(table: pd.DataFrame, path: str | Path) -> Path:
    """One panel per diagnostic (and best accuracy) against r; a line per method × source
    (the mean over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("best_test_bacc", "best test balanced acc."), ("cci_final", "CCI (final)"),
              ("cci_peak", "CCI (peak)"), ("ple_final", "PLE (final)"),
              ("sem_drift_final", "Sem-Drift (final)"), ("grad_align_final", "Grad-Align"),
              ("ood_ff_final", "OOD-FF (final)")]
    fig, axes = plt.subplots(2, 4, figsize=(13.0, 6.0), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[len(panels):]:
        ax.axis("off")
    for ax, (col, title) in zip(flat, panels, strict=False):
        for (method, source), g in table.groupby(["method", "source"], sort=True):
            g = g.groupby("ratio", sort=True)[col].mean()  # the mean over seeds
            ax.plot(g.index, g.to_numpy(), marker="o", label=f"{method}/{source}")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("OOD ratio r")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------
# reading MLflow


def _history(client: MlflowClient, run_id: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for d in DIAGNOSTICS:
        hist = sorted(client.get_metric_history(run_id, f"diag/{d}"), key=lambda m: m.step)
        # stores keep ±inf as ±float max (e.g. OOD-FF when OOD passes and no ID does)
        out[d] = [math.copysign(math.inf, m.value) if abs(m.value) >= sys.float_info.max
                  else m.value for m in hist]
    return out


def _experiment_ids(client: MlflowClient, experiments: Iterable[str]) -> list[str]:
    ids = []
    for n in experiments:
        exp = client.get_experiment_by_name(n)
        if exp is None:
            raise ValueError(f"no MLflow experiment named {n!r} at "
                             f"{redact(mlflow.get_tracking_uri())}")
        ids.append(exp.experiment_id)
    return ids


def load_points(parent_run_id: str | None = None, experiments: str | Iterable[str] | None = None,
                tracking_uri: str | None = None, client: Any = None) -> pd.DataFrame:
    """One row per finished contamination child study (under ``parent_run_id``, or every
    one in ``experiments``), with the best trial's diagnostics summarised. ``client``: the
    MLflow client to read through (a results page's: its store's, or one answering from an
    export, tracking/results/export.py); default a new one of ``tracking_uri``."""
    if client is None:
        if tracking_uri:
            mlflow.set_tracking_uri(tracking_uri)
        client = MlflowClient()
    if parent_run_id:
        exp_ids = [client.get_run(parent_run_id).info.experiment_id]
    elif experiments is not None:
        names = [experiments] if isinstance(experiments, str) else list(experiments)
        exp_ids = _experiment_ids(client, names)
    else:
        raise ValueError("give parent_run_id or experiments")
    flt = (f"tags.`{T.ROLE}` = 'study' and tags.`{T.RATIO}` != '' "
           "and attributes.status = 'FINISHED'")
    if parent_run_id:
        flt += f" and tags.`{MLFLOW_PARENT_RUN_ID}` = '{parent_run_id}'"
    studies = client.search_runs(exp_ids, flt, max_results=5000)
    rows: list[dict[str, Any]] = []
    for s in studies:
        t, m = s.data.tags, s.data.metrics
        trials = client.search_runs(
            exp_ids, f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{s.info.run_id}' and "
            f"tags.`{T.TRIAL}` = '{t.get(T.BEST_TRIAL, '0')}'", max_results=1)
        hist = _history(client, trials[0].info.run_id) if trials else {}
        rows.append({
            "method": t.get(T.METHOD), "dataset": t.get(T.DATASET),
            "source": t.get(T.OOD), "kind": t.get(T.OOD_KIND, ""),
            "ratio": float(t[T.RATIO]), "seed": t.get(T.SEED, ""),
            "study_run_id": s.info.run_id,
            "best_test_bacc": m.get("best/test_balanced_accuracy", math.nan),
            "best_val_bacc": m.get("best/val_balanced_accuracy", math.nan),
            **summarise_history(hist),
        })
    return pd.DataFrame(rows, columns=[*KEY_COLUMNS, "study_run_id", *VALUE_COLUMNS]) if not \
        rows else pd.DataFrame(rows)


def contamination_table(parent_run_id: str | None = None,
                        experiments: str | Iterable[str] | None = None,
                        tracking_uri: str | None = None) -> pd.DataFrame:
    """Table A1 for a sweep (``parent_run_id``) or for all sweeps in ``experiments``."""
    return table_a1(load_points(parent_run_id, experiments, tracking_uri))


def to_markdown(table: pd.DataFrame) -> str:
    """A compact text rendering: values with their relative change in parentheses."""
    if table.empty:
        return "(no finished contamination studies)"
    lines = []
    seeds = "seed" in table and table["seed"].astype(str).nunique() > 1
    head = ["method", "source", "kind", "r"] + (["seed"] if seeds else []) + VALUE_COLUMNS
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for _, r in table.iterrows():
        cells = [str(r["method"]), str(r["source"]), str(r["kind"]), f"{r['ratio']:g}"]
        cells += [str(r["seed"])] if seeds else []
        for c in VALUE_COLUMNS:
            v, rel = r[c], r[f"rel_{c}"]
            cell = "—" if pd.isna(v) else f"{v:.4g}"
            if r["ratio"] > 0 and not pd.isna(rel):
                cell += f" ({rel:+.0%})"
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


__all__ = ["DIAGNOSTICS", "contamination_table", "load_points", "plot_vs_ratio",
           "summarise_history", "table_a1", "to_markdown"]


def _param(v: str) -> Any:
    """A logged param back as the JSON value it was rendered from (a string otherwise)."""
    import json

    try:
        return json.loads(v)
    except json.JSONDecodeError:
        return v


def killed_sweep(client: MlflowClient, experiment_id: str, sweep_key: str) -> str | None:
    """The newest RUNNING contamination parent run of ``sweep_key`` (tag
    ``scarcelab.sweep_key``) whose owner process is dead on this host, or None — the
    rule a study's resume uses (``MlflowTracker.resume_state``)."""
    from scarcelab.tracking.mlflow_tracker import MlflowTracker

    runs = client.search_runs(
        [experiment_id], f"tags.`{T.ROLE}` = 'contamination' and "
        f"tags.`{T.SWEEP_KEY}` = '{sweep_key}' and attributes.status = 'RUNNING'",
        max_results=100, order_by=["attributes.start_time DESC"])
    for r in runs:
        if MlflowTracker._owner_dead(r.data.tags.get(T.OWNER, "")):
            return str(r.info.run_id)
    return None


def finished_children(client: MlflowClient, parent_run_id: str) -> dict[str, Any]:
    """Sweep point (the ``sweep_point`` param) -> ``FinishedChild`` for every FINISHED
    child study of the sweep ``parent_run_id``. The tuning study's best checkpoint (its
    configuration) is downloaded and loaded only if its digest is the recorded one
    (``tracking.safe_io.load_checkpoint``, ``weights_only=True``); the other children need
    only their numbers."""
    import tempfile

    from mlflow.artifacts import download_artifacts
    from mlflow.exceptions import MlflowException

    from scarcelab.protocols.contamination import TUNING_POINT, FinishedChild
    from scarcelab.protocols.search import StudyResult
    from scarcelab.tracking.safe_io import UnsafeArtifact, load_checkpoint

    exp = client.get_run(parent_run_id).info.experiment_id
    runs = client.search_runs(
        [exp], f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{parent_run_id}' and "
        f"tags.`{T.ROLE}` = 'study' and attributes.status = 'FINISHED'",
        max_results=5000, order_by=["attributes.start_time ASC"])
    out: dict[str, Any] = {}
    for r in runs:
        t, m, p = r.data.tags, r.data.metrics, r.data.params
        point = p.get("resolved.sweep_point", p.get("sweep_point"))
        if not point:
            continue
        ckpt = None
        if point == TUNING_POINT:
            with tempfile.TemporaryDirectory() as tmp:
                try:
                    path = download_artifacts(
                        run_id=r.info.run_id, artifact_path="checkpoints/best.pt", dst_path=tmp)
                    ckpt = load_checkpoint(path, t.get(T.CHECKPOINT_SHA256))
                except (UnsafeArtifact, OSError, MlflowException):
                    ckpt = None  # run_contamination refuses to go on without it

        result = StudyResult(
            best_val=float(m.get("best/val_balanced_accuracy", math.nan)),
            best_test={k.removeprefix("best/test_"): float(v) for k, v in m.items()
                       if k.startswith("best/test_")},
            best_trial=int(t.get(T.BEST_TRIAL, -1)),
            n_trials=int(t.get(T.N_TRIALS, 0)),
            n_failed=int(t.get(T.N_FAILED, 0)),
            split_hash=t.get(T.SPLIT_HASH, ""), best_checkpoint=ckpt)
        counts = {k.removeprefix("contamination."): _param(v) for k, v in p.items()
                  if k.startswith("contamination.")}
        out[point] = FinishedChild(result, counts, r.info.run_id)  # the latest one wins
    return out
