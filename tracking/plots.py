"""Figures logged on runs, for the MLflow UI: what people would rather look at than read.

* ``confusion_figure`` / ``roc_figure``: the selected checkpoint on the test set (a study).
* ``trials_profile_figure``: validation and test balanced accuracy against time since the
  study started, one line per trial, plus the best-so-far-on-validation answer — the
  SSL-vs-SSL accuracy-over-time view of one study.
* ``search_figures``: Optuna's parallel-coordinate and hyperparameter-importance plots of
  the search (matplotlib backend; importance needs two or more completed trials).
* ``learning_curves_figure``: AL test accuracy against labeled-set size, per repetition.

All return matplotlib figures (or None when there is nothing to draw); ``png`` renders one.
Nothing here talks to MLflow: the tracker decides where the PNGs go.
"""

from __future__ import annotations

import io
import logging
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from scarcelab.tracking.run_views import counted  # noqa: E402

log = logging.getLogger("scarcelab.tracking")


def png(fig: Figure, dpi: int = 110) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def confusion_counts(y_true: Sequence[int], y_pred: Sequence[int], n_classes: int
                     ) -> np.ndarray:
    m = np.zeros((n_classes, n_classes), dtype=np.int64)
    np.add.at(m, (np.asarray(y_true, dtype=np.int64), np.asarray(y_pred, dtype=np.int64)), 1)
    return m


def confusion_figure(y_true: Sequence[int], proba: np.ndarray, class_names: Sequence[str],
                     title: str = "test confusion matrix") -> Figure:
    """Counts, with each row's recall (the per-class term of balanced accuracy) as colour."""
    proba = np.asarray(proba)
    n = proba.shape[1]
    m = confusion_counts(y_true, proba.argmax(1), n)
    recall = m / np.maximum(m.sum(1, keepdims=True), 1)
    size = max(3.5, 0.55 * n + 2)
    fig, ax = plt.subplots(figsize=(size + 1, size))
    im = ax.imshow(recall, vmin=0, vmax=1, cmap="Blues")
    names = [str(c)[:18] for c in class_names] if len(class_names) == n else [str(i) for i in
                                                                             range(n)]
    ax.set_xticks(range(n), names, rotation=45, ha="right")
    ax.set_yticks(range(n), names)
    for i in range(n):
        for j in range(n):
            ax.text(j, i, str(m[i, j]), ha="center", va="center",
                    color="white" if recall[i, j] > 0.5 else "black", fontsize=8)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    bacc = float(np.mean(np.diag(recall)[m.sum(1) > 0]))
    ax.set_title(f"{title}\nbalanced accuracy {bacc:.3f}")
    fig.colorbar(im, ax=ax, fraction=0.046, label="recall (row-normalised)")
    return fig


def _roc(pos: np.ndarray, score: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(-score, kind="mergesort")
    s, p = score[order], pos[order]
    distinct = np.r_[np.nonzero(np.diff(s))[0], len(s) - 1]
    tps = np.cumsum(p)[distinct]
    fps = (distinct + 1) - tps
    tpr = np.r_[0.0, tps / max(p.sum(), 1)]
    fpr = np.r_[0.0, fps / max((~p).sum(), 1)]
    return fpr, tpr


def roc_figure(y_true: Sequence[int], proba: np.ndarray, class_names: Sequence[str],
               title: str = "test ROC", positive_class: int | None = None) -> Figure | None:
    """Binary: the curve of the positive class — the disease a binary medical task detects
    (``positive_class``, e.g. 0 = malignant for BreastMNIST; None = class 1), scored by its
    own column, so the legend names what the sensitivity and pAUROC metrics measure.
    Multi-class: one-vs-rest per class (as the macro AUROC is computed). The shaded band
    is the specificity >= 0.9 region of pAUROC."""
    y = np.asarray(y_true, dtype=np.int64)
    proba = np.asarray(proba, dtype=np.float64)
    n = proba.shape[1]
    classes = [1 if positive_class is None else int(positive_class)] if n == 2 \
        else list(range(n))
    fig, ax = plt.subplots(figsize=(4.8, 4.4))
    drawn = 0
    for c in classes:
        pos = y == c
        if pos.all() or not pos.any():
            continue  # one class only: no curve (AUROC undefined)
        fpr, tpr = _roc(pos, proba[:, c])
        auc = float(np.trapezoid(tpr, fpr))
        name = class_names[c] if c < len(class_names) else str(c)
        ax.plot(fpr, tpr, lw=1.5, label=f"{name} (AUC {auc:.3f})")
        drawn += 1
    if not drawn:
        plt.close(fig)
        return None
    ax.axvspan(0, 0.1, color="0.9", zorder=0, label="specificity ≥ 0.9")
    ax.plot([0, 1], [0, 1], ":", color="0.5", lw=1)
    ax.set_xlabel("false positive rate (1 − specificity)")
    ax.set_ylabel("true positive rate (sensitivity)")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.01)
    ax.set_title(title)
    ax.legend(fontsize=7, loc="lower right")
    return fig


def trials_profile_figure(history: Mapping[int, Sequence[tuple[float, float, float]]],
                          title: str = "balanced accuracy over time") -> Figure | None:
    """``history``: trial number -> [(elapsed_s, val_bacc, test_bacc), …] per epoch.

    Thin lines: each trial's validation score; the thick line: the test score of the
    checkpoint best on validation so far (the study's answer at that time), i.e. what
    the leaderboard's profile view reports."""
    points = sorted((t, v, te, n) for n, rows in history.items() for t, v, te in rows)
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for n, rows in sorted(history.items()):
        if rows:
            r = np.asarray(rows, dtype=float)
            ax.plot(r[:, 0] / 60, r[:, 1], lw=0.8, alpha=0.5, color="tab:blue",
                    label="validation (per trial)" if n == min(history) else None)
    best_v, xs, ys = -np.inf, [], []
    for t, v, te, _ in points:
        if v > best_v:
            best_v = v
            xs.append(t / 60)
            ys.append(te)
    ax.step(xs + [points[-1][0] / 60], ys + [ys[-1]], where="post", lw=2.2, color="tab:red",
            label="test of the val-best checkpoint")
    ax.set_xlabel("minutes since the study started")
    ax.set_ylabel("balanced accuracy")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"{title} ({counted(len(history), 'trial')})")
    ax.legend(fontsize=8, loc="lower right")
    return fig


def search_figures(trials: Sequence[Any]) -> dict[str, Figure]:
    """Optuna's parallel-coordinate and importance plots of the finished trials
    (``optuna.trial.FrozenTrial``s); empty when fewer than two trials completed."""
    import optuna
    from optuna.visualization import matplotlib as ovm

    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE and t.params]
    if len(done) < 2:
        return {}
    study = optuna.create_study(direction="maximize")
    study.add_trials(done)
    out: dict[str, Figure] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ExperimentalWarning of the matplotlib backend
        for name, fn in (("parallel_coordinate", ovm.plot_parallel_coordinate),
                         ("param_importances", ovm.plot_param_importances)):
            try:
                ax = fn(study)
                fig = (ax if isinstance(ax, Figure) else
                       np.ravel(ax)[0].figure if isinstance(ax, np.ndarray) else ax.figure)
                assert isinstance(fig, Figure)  # optuna draws on a figure of its own
                fig.set_size_inches(8, 4.5)
                if name == "param_importances":
                    _importance_caveat(fig, len(done))
                out[name] = fig
            except Exception as e:  # noqa: BLE001 - e.g. one distinct value per param
                log.info("optuna %s plot skipped: %s", name, e)
    return out


def series_figure(series: Mapping[str, Mapping[int, float]], title: str, xlabel: str,
                  mark: int | None = None) -> Figure | None:
    """One line per named series against its step (one axis each: their scales differ);
    ``mark``: the selected step, drawn as a dashed line."""
    if not series:
        return None
    fig, axes = plt.subplots(len(series), 1, figsize=(6.5, 2.4 * len(series)), squeeze=False,
                             sharex=True)
    for ax, (name, pts) in zip(axes[:, 0], series.items(), strict=True):
        xs = sorted(pts)
        ax.plot(xs, [pts[x] for x in xs], marker="o", ms=3, lw=1.4)
        if mark is not None:
            ax.axvline(mark, color="firebrick", ls="--", lw=1, label=f"selected ({mark})")
            ax.legend(fontsize=8)
        ax.set_ylabel(name)
    axes[0, 0].set_title(title)
    axes[-1, 0].set_xlabel(xlabel)
    fig.tight_layout()
    return fig


def retrains_figure(scores: Mapping[int, float], title: str) -> Figure | None:
    """tune's final retrains: each retrain's test balanced accuracy, and their mean ± std
    (sample std, as the study's ``final/test_balanced_accuracy_std``)."""
    if not scores:
        return None
    xs = sorted(scores)
    ys = np.array([scores[x] for x in xs])
    fig, ax = plt.subplots(figsize=(6.5, 3))
    ax.plot(xs, ys, "o", color="tab:blue", label="retrain")
    m = float(ys.mean())
    sd = float(ys.std(ddof=1)) if len(ys) > 1 else float("nan")
    ax.axhline(m, color="black", lw=1.2,
               label=f"mean {m:.4f}" + ("" if sd != sd else f" ± {sd:.4f}"))
    if sd == sd:
        ax.axhspan(m - sd, m + sd, color="0.85", zorder=0)
    ax.set_xlabel("retrain")
    ax.set_ylabel("test balanced accuracy")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


#: below this many completed trials the importance plot says it is not to be trusted
FEW_TRIALS = 20


def _importance_caveat(fig: Figure, n: int) -> None:
    """State the sample behind the importances on the figure. Optuna's default evaluator
    (``optuna.importance.get_param_importances``: fANOVA, Hutter et al. 2014) fits a random
    forest to the (params, value) pairs; from a handful of trials that fit says little, yet
    the bars look as certain as from hundreds. The threshold of 20 is ours, not Optuna's."""
    text = f"from {n} completed trial{'s' if n != 1 else ''}"
    if n < FEW_TRIALS:
        text += (f": too few for reliable importances (fANOVA on < {FEW_TRIALS} trials); "
                 "read as a sketch, not a ranking")
    ax = fig.axes[0]
    title = ax.get_title(loc="left") or ax.get_title() or "Hyperparameter Importances"
    ax.set_title("")  # Optuna may set the centred one; one title, on the left, above the note
    ax.set_title(title, loc="left", pad=16)
    ax.text(0.0, 1.01, text, transform=ax.transAxes, fontsize=8, ha="left", va="bottom",
            color="firebrick" if n < FEW_TRIALS else "0.3")


def learning_curves_figure(curves: Mapping[int, Sequence[tuple[int, float]]],
                           title: str) -> Figure | None:
    """AL: test accuracy against labeled-set size, one line per repetition + the mean."""
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4))
    grid: dict[int, list[float]] = {}
    for k, rows in sorted(curves.items()):
        r = np.asarray(rows, dtype=float)
        ax.plot(r[:, 0], r[:, 1], lw=0.8, alpha=0.45, color="tab:blue",
                label="repetitions" if k == min(curves) else None)
        for n, a in rows:
            grid.setdefault(int(n), []).append(float(a))
    xs = sorted(grid)
    ax.plot(xs, [np.mean(grid[x]) for x in xs], lw=2.2, color="tab:red", label="mean")
    ax.set_xlabel("labeled samples")
    ax.set_ylabel("test accuracy")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
    return fig
