"""Classification metrics for scarce-label benchmarks, in plain numpy.

Why these metrics. The benchmark's datasets (medical imaging above all) are imbalanced, and
with few labels a model can reach a high *accuracy* by predicting the majority class. So:

* ``balanced_accuracy`` (mean per-class recall) is the model-selection metric: a constant
  predictor scores ``1 / n_classes`` on it whatever the class frequencies, so early stopping
  and hyper-parameter search cannot be won by ignoring the rare classes.
* ``auroc`` measures ranking quality independently of any decision threshold, which matters
  because a model trained on scarce labels is often badly calibrated.
* ``partial_auroc`` and ``sensitivity_at_specificity`` look only at the high-specificity
  end of the ROC curve, the region used when false positives are expensive (screening).

Multi-class scores are one-vs-rest macro averages over the classes present in ``y_true``,
so every class weighs the same however rare it is. A class with no positives (or no
negatives) has no ROC curve and is skipped; if no class has one the metric is NaN.

Binary scores are about one class, the *positive* one: the class the task detects — in a
medical task the disease (BreastMNIST: malignant, label 0; PneumoniaMNIST: pneumonia,
label 1; the dataset says which, ``RawDataset.positive_class``). AUROC is the same for
either choice (swapping the classes reverses the ranking and the roles), but sensitivity at
95 % specificity and the partial AUROC are not: they read the high-specificity end of the
*positive* class's curve, so ``positive_class`` decides what they measure. Default: 1.

Implementation notes. Everything is vectorised numpy (these are computed every epoch on
test sets of up to ~50k samples): one sort per scored column, after which the ROC curve is
read off cumulative counts at the *distinct* score values, so tied scores are handled
exactly (a tie between a positive and a negative counts one half, as with midranks). scikit-
learn is deliberately not used here; the tests use it as an independent reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "accuracy",
    "auroc",
    "balanced_accuracy",
    "classification_metrics",
    "partial_auroc",
    "sensitivity_at_specificity",
]


# --------------------------------------------------------------------------- validation


def _labels(y: ArrayLike, name: str) -> NDArray[np.int64]:
    """Return ``y`` as a 1-D int64 vector of class indices, or raise a clear ValueError.

    Integer-valued floats (e.g. labels that went through a float tensor) are accepted;
    anything else non-integer is rejected, because it is almost always a probability or
    score vector passed where hard labels were expected.
    """
    arr = np.asarray(y)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one class index per sample), got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty: metrics need at least one sample")
    if arr.dtype.kind == "b":
        return arr.astype(np.int64)
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64, copy=False)
    if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
        return arr.astype(np.int64)
    raise ValueError(
        f"{name} must hold integer class indices, got dtype {arr.dtype} with non-integer "
        "values (pass predicted labels, e.g. proba.argmax(axis=1), not scores)"
    )


def _label_pair(
    y_true: ArrayLike, y_pred: ArrayLike
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    yt = _labels(y_true, "y_true")
    yp = _labels(y_pred, "y_pred")
    if yt.shape[0] != yp.shape[0]:
        raise ValueError(
            f"y_true and y_pred have different lengths: {yt.shape[0]} != {yp.shape[0]}"
        )
    return yt, yp


def _labels_and_scores(
    y_true: ArrayLike, proba: ArrayLike
) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Validate ``(y_true, proba)``: (N,) labels in [0, C) and finite (N, C) scores."""
    y = _labels(y_true, "y_true")
    p = np.asarray(proba)
    if p.ndim != 2:
        raise ValueError(
            f"proba must be 2-D (n_samples, n_classes), got shape {p.shape}; for a single "
            "binary score vector s pass np.column_stack([1 - s, s])"
        )
    if p.shape[0] != y.shape[0]:
        raise ValueError(
            f"y_true and proba have different lengths: y_true has {y.shape[0]} samples, "
            f"proba has {p.shape[0]} rows"
        )
    n_classes = p.shape[1]
    if n_classes < 2:
        raise ValueError(f"proba must have at least 2 columns (one per class), got {n_classes}")
    if p.dtype.kind not in "biuf":
        raise ValueError(f"proba must be a real-valued array, got dtype {p.dtype}")
    p = p.astype(np.float64, copy=False)  # exact for float16/32: ties are preserved
    if not np.all(np.isfinite(p)):
        raise ValueError("proba contains NaN or infinite values; scores must be finite")
    lo, hi = int(y.min()), int(y.max())
    if lo < 0 or hi >= n_classes:
        raise ValueError(
            f"y_true labels must lie in [0, {n_classes}) to index the {n_classes} columns of "
            f"proba, found labels in [{lo}, {hi}]"
        )
    return y, p


def _check_fraction(value: float, name: str, *, allow_one: bool) -> float:
    value = float(value)
    upper_ok = value <= 1.0 if allow_one else value < 1.0
    if not (value >= 0.0 and upper_ok):
        interval = "[0, 1]" if allow_one else "[0, 1)"
        raise ValueError(f"{name} must lie in {interval}, got {value}")
    return value


# ------------------------------------------------------------------------------ labels


def accuracy(y_true: ArrayLike, y_pred: ArrayLike) -> float:
    """Fraction of samples whose predicted class equals the true class.

    Reported for comparability with the literature, but *not* used for model selection:
    under class imbalance it rewards predicting the majority class (see
    :func:`balanced_accuracy`).
    """
    yt, yp = _label_pair(y_true, y_pred)
    return float(np.mean(yt == yp))


def balanced_accuracy(y_true: ArrayLike, y_pred: ArrayLike) -> float:
    """Mean recall over the classes present in ``y_true``; in [0, 1].

    This is the model-selection metric of the benchmark. Every class counts the same,
    however rare, so a constant predictor scores ``1 / n_present_classes`` regardless of the
    class frequencies, whereas its plain accuracy equals the majority-class frequency (e.g.
    0.95 on a 95/5 split). Classes that occur only in ``y_pred`` have no recall and do not
    enter the mean (their false positives still lower the recall of the true classes).
    Matches ``sklearn.metrics.balanced_accuracy_score(adjusted=False)``.
    """
    yt, yp = _label_pair(y_true, y_pred)
    return _balanced_accuracy(yt, yp)


def _balanced_accuracy(yt: NDArray[np.int64], yp: NDArray[np.int64]) -> float:
    _, inverse = np.unique(yt, return_inverse=True)
    support = np.bincount(inverse)
    hits = np.bincount(inverse, weights=(yt == yp))
    return float(np.mean(hits / support))


# ------------------------------------------------------------------------------ scores


class _Curve(NamedTuple):
    """ROC curve in counts, one point per distinct threshold, from (0, 0) to (n_neg, n_pos).

    ``fps[i]``, ``tps[i]``: negatives / positives scored >= the i-th largest distinct score
    (i = 0 is the threshold above every score). Both are non-decreasing.
    """

    fps: NDArray[np.int64]
    tps: NDArray[np.int64]
    n_pos: int
    n_neg: int


def _roc_counts(positive: NDArray[np.bool_], score: NDArray[np.float64]) -> _Curve:
    order = np.argsort(-score)  # descending; order within ties is irrelevant (see below)
    s = score[order]
    # Last index of every group of equal scores: the curve is only read there, so a tied
    # group moves it diagonally (the trapezoid gives a positive-negative tie half credit).
    ends = np.append(np.flatnonzero(s[1:] != s[:-1]), s.size - 1)
    tps = np.cumsum(positive[order], dtype=np.int64)[ends]
    fps = ends + 1 - tps
    zero = np.zeros(1, dtype=np.int64)
    n_pos = int(tps[-1])
    return _Curve(
        np.concatenate((zero, fps)), np.concatenate((zero, tps)), n_pos, score.size - n_pos
    )


def _positive(positive_class: int | None, n_classes: int) -> int:
    """The scored class of a binary task (1 unless told), validated."""
    if positive_class is None:
        return 1
    if n_classes != 2:
        raise ValueError(f"positive_class={positive_class} applies to binary tasks; proba has "
                         f"{n_classes} columns (multi-class scores are one-vs-rest over "
                         "every class)")
    k = int(positive_class)
    if k not in (0, 1):
        raise ValueError(f"positive_class must be 0 or 1 for a binary task, got "
                         f"{positive_class}")
    return k


def _ovr_curves(y: NDArray[np.int64], p: NDArray[np.float64],
                positive_class: int | None = None) -> list[_Curve]:
    """One ROC curve per scored class: the positive class's column if binary (class
    ``positive_class``, default 1, against the other), else every column (one-vs-rest).

    Classes without positives or without negatives are skipped (their ROC is undefined).
    """
    n_classes = p.shape[1]
    counts = np.bincount(y, minlength=n_classes)
    pos = _positive(positive_class, n_classes)
    classes = range(pos, pos + 1) if n_classes == 2 else range(n_classes)
    curves = []
    for k in classes:
        if counts[k] == 0 or counts[k] == y.size:
            continue
        curves.append(_roc_counts(y == k, p[:, k]))
    return curves


def _macro(curves: list[_Curve], metric: Callable[[_Curve], float]) -> float:
    if not curves:
        return float("nan")
    return float(np.mean([metric(c) for c in curves]))


def _auc(c: _Curve) -> float:
    # Trapezoid rule in integer counts: twice the area is an exact integer, so the only
    # rounding is the final division. Equals the Mann-Whitney U statistic with midranks.
    twice_area = np.sum(np.diff(c.fps) * (c.tps[1:] + c.tps[:-1]))
    return float(twice_area) / (2.0 * c.n_pos * c.n_neg)


def _partial_auc(c: _Curve, max_fpr: float) -> float:
    """Raw area under the ROC for FPR in [0, max_fpr], divided by max_fpr."""
    if max_fpr >= 1.0:
        return _auc(c)
    fpr = c.fps / c.n_neg
    tpr = c.tps / c.n_pos
    stop = int(np.searchsorted(fpr, max_fpr, side="right"))  # fpr[stop-1] <= max_fpr < fpr[stop]
    x0, x1, y0, y1 = fpr[stop - 1], fpr[stop], tpr[stop - 1], tpr[stop]
    y_cut = y0 + (y1 - y0) * (max_fpr - x0) / (x1 - x0)
    x = np.append(fpr[:stop], max_fpr)
    y = np.append(tpr[:stop], y_cut)
    return float(np.sum(np.diff(x) * (y[1:] + y[:-1])) / 2.0 / max_fpr)


def _mcclish(normalised_pa: float, max_fpr: float) -> float:
    """McClish (1989) standardisation of a partial area, from ``pa / max_fpr`` (what
    :func:`_partial_auc` returns): ``0.5 * (1 + (pa - a_min) / (a_max - a_min))`` with the raw
    area ``pa``, ``a_min = max_fpr**2 / 2`` (the chance diagonal) and ``a_max = max_fpr``.
    sklearn's ``roc_auc_score(max_fpr=...)`` computes the same per curve (binary); for
    one-vs-rest the macro mean is taken over these per-class values, as for the others."""
    pa = normalised_pa * max_fpr
    a_min, a_max = 0.5 * max_fpr**2, max_fpr
    return 0.5 * (1.0 + (pa - a_min) / (a_max - a_min))


def _sensitivity_at(c: _Curve, specificity: float) -> float:
    # Specificity as TN / N computed by a single (correctly rounded) division, so that e.g.
    # 9 / 10 compares equal to the literal 0.9; (1 - 0.9) * 10 would be 0.9999... < 1.
    spec = (c.n_neg - c.fps) / c.n_neg
    ok = spec >= specificity  # never empty: the first point has specificity 1
    return float(c.tps[ok].max()) / c.n_pos


def auroc(y_true: ArrayLike, proba: ArrayLike, positive_class: int | None = None) -> float:
    """Area under the ROC curve; threshold-free, so insensitive to poor calibration.

    ``proba`` is (N, C); only the order of the scores within a column matters, so logits
    work as well as probabilities. With ``C == 2`` this is the binary AUROC of
    ``proba[:, k]``, class ``k = positive_class`` (default 1) positive — the same value for
    either k when the two columns are complementary probabilities. With ``C > 2`` it is the
    one-vs-rest macro average
    over the classes present in ``y_true`` (column k scores class k against all others),
    skipping classes with no positives or no negatives; NaN when undefined (a single class
    in ``y_true``). Ties are exact: a tied positive-negative pair counts 1/2 (midranks).
    Matches ``sklearn.metrics.roc_auc_score`` (``multi_class="ovr", average="macro"``).
    """
    y, p = _labels_and_scores(y_true, proba)
    return _macro(_ovr_curves(y, p, positive_class), _auc)


def partial_auroc(y_true: ArrayLike, proba: ArrayLike, min_specificity: float = 0.90,
                  positive_class: int | None = None) -> float:
    """Normalised area under the ROC curve over the high-specificity region.

    The raw partial area ``pa`` is the area under the ROC for FPR in ``[0, m]`` with
    ``m = 1 - min_specificity``, the curve being linearly interpolated at ``FPR = m``. We
    report ``pa / m``, the *mean sensitivity over that specificity range*: a perfect
    classifier scores 1.0 and a random one ``m / 2`` (0.05 at the default 0.90). Why not
    the raw area: it is at most ``m``, an unreadable 0.1-scale number. Why not McClish's
    standardisation (below): it is affine, not proportional, so it maps random to 0.5 but
    squeezes every worse-than-random curve into ``[(1 - m) / (2 - m), 0.5]`` (~[0.47, 0.5]),
    and its value has no direct reading, whereas ``pa / m`` is simply the average
    sensitivity over the allowed false-positive range.

    Relation to sklearn: ``roc_auc_score(y, s, max_fpr=m)`` returns McClish's standardised
    value ``0.5 * (1 + (pa - a_min) / (a_max - a_min))`` with ``a_min = 0.5 * m**2`` and
    ``a_max = m``, where ``pa = m * partial_auroc(...)`` is the raw area; both are increasing
    affine maps of ``pa``, so they rank models identically.

    Binary (``C == 2``): the curve of class ``positive_class`` (default 1) on its column —
    specificity is then that of the *other* class, so the choice changes the value;
    multi-class: one-vs-rest macro average over the classes present, as in :func:`auroc`
    (NaN if undefined). ``min_specificity`` is in [0, 1); 0 gives the full AUROC.
    """
    m = 1.0 - _check_fraction(min_specificity, "min_specificity", allow_one=False)
    y, p = _labels_and_scores(y_true, proba)
    return _macro(_ovr_curves(y, p, positive_class), lambda c: _partial_auc(c, m))


def sensitivity_at_specificity(
    y_true: ArrayLike, proba: ArrayLike, specificity: float = 0.95,
    positive_class: int | None = None,
) -> float:
    """Highest sensitivity (TPR) over all score thresholds with specificity >= ``specificity``.

    A clinically read operating point: how many positives are caught when at most
    ``1 - specificity`` of the negatives may be flagged. Thresholds are the observed
    distinct scores (predict positive when ``score >= t``) plus one above every score
    (sensitivity 0, specificity 1), so the value always exists; there is no interpolation
    between ROC points, since only real thresholds can be deployed. Binary: the
    sensitivity for class ``positive_class`` (default 1; the disease of a medical task) at
    the specificity of the other; multi-class one-vs-rest macro as in :func:`auroc` (NaN if
    undefined).
    """
    spec = _check_fraction(specificity, "specificity", allow_one=True)
    y, p = _labels_and_scores(y_true, proba)
    return _macro(_ovr_curves(y, p, positive_class), lambda c: _sensitivity_at(c, spec))


def classification_metrics(y_true: ArrayLike, proba: ArrayLike,
                           positive_class: int | None = None) -> dict[str, float]:
    """All metrics of the benchmark from labels and (N, C) class scores, in one pass.
    ``positive_class``: the class a binary task detects (default 1), whose curve the
    ranking metrics read; must be None for more than two classes.

    Predicted labels are ``proba.argmax(axis=1)`` (first column wins ties). The ROC curves
    are built once and shared by the three ranking metrics. Keys: ``balanced_accuracy``
    (model selection), ``accuracy``, ``auroc``, ``pauroc_spec90``
    (:func:`partial_auroc` with ``min_specificity=0.90``: mean sensitivity over FPR <= 0.1,
    random = 0.05), ``pauroc_spec90_mcclish`` (the same area McClish-standardised, random =
    0.5: what ``sklearn.metrics.roc_auc_score(max_fpr=0.1)`` and the AIROGS challenge report)
    and ``sensitivity_at_spec95`` (:func:`sensitivity_at_specificity` with
    ``specificity=0.95``).
    """
    y, p = _labels_and_scores(y_true, proba)
    y_pred = p.argmax(axis=1)
    curves = _ovr_curves(y, p, positive_class)
    max_fpr = 1.0 - 0.90
    return {
        "balanced_accuracy": _balanced_accuracy(y, y_pred),
        "accuracy": float(np.mean(y == y_pred)),
        "auroc": _macro(curves, _auc),
        "pauroc_spec90": _macro(curves, lambda c: _partial_auc(c, max_fpr)),
        "pauroc_spec90_mcclish": _macro(curves, lambda c: _mcclish(_partial_auc(c, max_fpr),
                                                                  max_fpr)),
        "sensitivity_at_spec95": _macro(curves, lambda c: _sensitivity_at(c, 0.95)),
    }
