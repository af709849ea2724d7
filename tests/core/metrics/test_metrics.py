"""Tests for scarcelab.metrics: sklearn as the independent reference, plus brute force.

The brute-force references below loop over every threshold in plain Python and share no
code with the implementation (which sorts once and reads cumulative counts).
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
from sklearn import metrics as skm

from scarcelab.metrics import (
    accuracy,
    auroc,
    balanced_accuracy,
    classification_metrics,
    partial_auroc,
    sensitivity_at_specificity,
)

# ------------------------------------------------------------------------------ helpers


def _proba(rng: np.random.Generator, y: np.ndarray, n_classes: int, signal: float = 1.0):
    """Softmax scores that are informative about ``y`` (rows sum to 1, as sklearn wants)."""
    logits = rng.normal(size=(y.size, n_classes))
    logits[np.arange(y.size), y] += signal
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _imbalanced_labels(rng: np.random.Generator, n: int, freqs: list[float]) -> np.ndarray:
    return rng.choice(len(freqs), size=n, p=np.asarray(freqs) / np.sum(freqs))


def _brute_roc(pos: np.ndarray, score: np.ndarray) -> list[tuple[float, float]]:
    """ROC points (fpr, tpr), one per threshold, from the one above every score down."""
    n_pos = int(np.sum(pos))
    n_neg = pos.size - n_pos
    thresholds = [np.inf, *sorted(set(score.tolist()), reverse=True)]
    points = []
    for t in thresholds:
        tp = fp = 0
        for p, s in zip(pos.tolist(), score.tolist(), strict=True):
            if s >= t:
                if p:
                    tp += 1
                else:
                    fp += 1
        points.append((fp / n_neg, tp / n_pos))
    return points


def _brute_partial_area(pos: np.ndarray, score: np.ndarray, max_fpr: float) -> float:
    """Raw area under the ROC for FPR in [0, max_fpr], trapezoids, explicit interpolation."""
    pts = _brute_roc(pos, score)
    area = 0.0
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if x0 >= max_fpr:
            break
        if x1 <= max_fpr:
            area += (x1 - x0) * (y0 + y1) / 2
        else:  # the segment crosses FPR = max_fpr: cut it there
            y_cut = y0 + (y1 - y0) * (max_fpr - x0) / (x1 - x0)
            area += (max_fpr - x0) * (y0 + y_cut) / 2
    return area


def _brute_sensitivity(pos: np.ndarray, score: np.ndarray, min_spec: float) -> float:
    best = 0.0
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    for t in [np.inf, *np.unique(score).tolist()]:
        flagged = score >= t
        tn = int(np.sum(~flagged & ~pos))
        tp = int(np.sum(flagged & pos))
        if tn / n_neg >= min_spec:
            best = max(best, tp / n_pos)
    return best


def _ovr_macro(y: np.ndarray, proba: np.ndarray, binary_metric) -> float:
    """One-vs-rest macro of ``binary_metric(pos, score)`` over classes with both outcomes."""
    if proba.shape[1] == 2:
        return binary_metric(y == 1, proba[:, 1])
    vals = [
        binary_metric(y == k, proba[:, k])
        for k in range(proba.shape[1])
        if 0 < np.sum(y == k) < y.size
    ]
    return float(np.mean(vals))


def _mcclish(pa: float, m: float) -> float:
    a_min, a_max = 0.5 * m**2, m
    return 0.5 * (1 + (pa - a_min) / (a_max - a_min))


# ------------------------------------------------------------------ accuracy / balanced


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("freqs", [[1, 1, 1, 1], [0.9, 0.07, 0.03], [0.5, 0.5]])
def test_accuracy_and_balanced_accuracy_match_sklearn(seed, freqs):
    rng = np.random.default_rng(seed)
    y = _imbalanced_labels(rng, 500, freqs)
    y_pred = np.where(rng.random(500) < 0.6, y, rng.integers(0, len(freqs), 500))
    assert accuracy(y, y_pred) == pytest.approx(skm.accuracy_score(y, y_pred), abs=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = skm.balanced_accuracy_score(y, y_pred)
    assert balanced_accuracy(y, y_pred) == pytest.approx(ref, abs=1e-12)


def test_balanced_accuracy_ignores_classes_only_in_prediction():
    y = np.array([0, 0, 0, 1])
    y_pred = np.array([0, 2, 2, 1])  # class 2 never occurs in y_true
    # recall(0) = 1/3, recall(1) = 1 -> 2/3; class 2 has no recall and is not averaged.
    assert balanced_accuracy(y, y_pred) == pytest.approx(2 / 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert balanced_accuracy(y, y_pred) == pytest.approx(skm.balanced_accuracy_score(y, y_pred))


def test_majority_predictor_high_accuracy_chance_balanced_accuracy():
    y = np.array([0] * 95 + [1] * 5)
    y_pred = np.zeros(100, dtype=int)
    assert accuracy(y, y_pred) == pytest.approx(0.95)
    assert balanced_accuracy(y, y_pred) == pytest.approx(0.5)


# ------------------------------------------------------------------------------- auroc


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auroc_binary_matches_sklearn(seed):
    rng = np.random.default_rng(seed)
    y = _imbalanced_labels(rng, 400, [0.8, 0.2])
    proba = _proba(rng, y, 2)
    assert auroc(y, proba) == pytest.approx(skm.roc_auc_score(y, proba[:, 1]), abs=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n_classes", [3, 7])
def test_auroc_multiclass_matches_sklearn_ovr_macro(seed, n_classes):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, n_classes, 600)
    y[:n_classes] = np.arange(n_classes)  # every class present
    proba = _proba(rng, y, n_classes)
    ref = skm.roc_auc_score(y, proba, multi_class="ovr", average="macro")
    assert auroc(y, proba) == pytest.approx(ref, abs=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_auroc_with_ties_matches_sklearn(seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, 500)
    proba = np.round(_proba(rng, y, 4, signal=0.7), 1)  # heavy ties within every column
    proba[:, -1] = 1 - proba[:, :-1].sum(axis=1)  # sklearn requires rows summing to 1
    assert np.unique(proba[:, 0]).size < 12
    ref = skm.roc_auc_score(y, proba, multi_class="ovr", average="macro")
    assert auroc(y, proba) == pytest.approx(ref, abs=1e-12)
    yb = (y == 1).astype(int)
    sb = np.round(rng.random(500) + 0.3 * yb, 1)
    pb = np.column_stack([1 - sb, sb])
    assert auroc(yb, pb) == pytest.approx(skm.roc_auc_score(yb, sb), abs=1e-12)


def test_auroc_skips_absent_class():
    rng = np.random.default_rng(3)
    y = rng.choice([0, 1, 3], size=300)  # class 2 of 4 never occurs
    proba = _proba(rng, y, 4)
    ref = np.mean([skm.roc_auc_score(y == k, proba[:, k]) for k in (0, 1, 3)])
    assert auroc(y, proba) == pytest.approx(ref, abs=1e-12)
    # Including class 2 would change the value: its column is not part of the average.
    assert not np.isnan(auroc(y, proba))


def test_auroc_undefined_is_nan():
    proba = np.array([[0.2, 0.8], [0.6, 0.4], [0.5, 0.5]])
    assert np.isnan(auroc(np.array([1, 1, 1]), proba))
    assert np.isnan(partial_auroc(np.array([0, 0, 0]), proba))
    assert np.isnan(sensitivity_at_specificity(np.array([0, 0, 0]), proba))
    p3 = np.full((3, 3), 1 / 3)
    assert np.isnan(auroc(np.array([2, 2, 2]), p3))


def test_perfect_and_inverted_classifiers():
    y = np.array([0, 0, 0, 1, 1])
    s = np.array([0.1, 0.2, 0.3, 0.8, 0.9])
    good = np.column_stack([1 - s, s])
    bad = np.column_stack([s, 1 - s])
    assert auroc(y, good) == 1.0
    assert partial_auroc(y, good) == 1.0
    assert sensitivity_at_specificity(y, good) == 1.0
    assert auroc(y, bad) == 0.0
    assert partial_auroc(y, bad) == 0.0
    assert sensitivity_at_specificity(y, bad) == 0.0
    y3 = np.array([0, 1, 2, 2, 1, 0])
    assert auroc(y3, np.eye(3)[y3]) == 1.0
    assert auroc(y3, 1 - np.eye(3)[y3]) == 0.0


def test_four_sample_case_by_hand():
    # y = [0, 0, 1, 1], s = [0.1, 0.4, 0.35, 0.8].
    # AUROC, pairs (pos, neg): (0.35, 0.1) win, (0.35, 0.4) loss, (0.8, 0.1) win,
    # (0.8, 0.4) win -> 3/4.
    # ROC points by descending threshold: (0, 0), t=0.8 -> (0, 0.5), t=0.4 -> (0.5, 0.5),
    # t=0.35 -> (0.5, 1), t=0.1 -> (1, 1).
    # pAUROC (min spec 0.9, m = 0.1): TPR is 0.5 on FPR in [0, 0.1] (interpolated on the
    # flat segment (0, .5)-(.5, .5)) -> raw area 0.05, normalised 0.05 / 0.1 = 0.5;
    # McClish: 0.5 * (1 + (0.05 - 0.005) / (0.1 - 0.005)) = 0.5 * (1 + 9/19) = 14/19.
    # Sensitivity at spec >= 0.95: only thresholds with FP = 0 -> best TPR 0.5;
    # at spec >= 0.5 one FP is allowed -> t = 0.35 gives TPR 1.
    y = np.array([0, 0, 1, 1])
    s = np.array([0.1, 0.4, 0.35, 0.8])
    p = np.column_stack([1 - s, s])
    assert auroc(y, p) == pytest.approx(0.75)
    assert partial_auroc(y, p, 0.9) == pytest.approx(0.5)
    assert skm.roc_auc_score(y, s, max_fpr=0.1) == pytest.approx(14 / 19)
    assert sensitivity_at_specificity(y, p, 0.95) == pytest.approx(0.5)
    assert sensitivity_at_specificity(y, p, 0.5) == pytest.approx(1.0)


def test_tied_pair_counts_half_by_hand():
    # y = [1, 0, 0, 1], s = [0.9, 0.9, 0.2, 0.1]. Pairs: (0.9, 0.9) tie 1/2, (0.9, 0.2) win,
    # (0.1, 0.9) loss, (0.1, 0.2) loss -> AUROC 1.5/4 = 0.375.
    # ROC: (0, 0) -> tied group at 0.9 -> (0.5, 0.5) diagonally, so on FPR in [0, 0.1]
    # TPR = FPR: raw area 0.1**2 / 2 = 0.005, normalised 0.05 (chance level).
    y = np.array([1, 0, 0, 1])
    s = np.array([0.9, 0.9, 0.2, 0.1])
    p = np.column_stack([1 - s, s])
    assert auroc(y, p) == pytest.approx(0.375)
    assert partial_auroc(y, p, 0.9) == pytest.approx(0.05)
    assert sensitivity_at_specificity(y, p, 0.95) == 0.0


def test_auroc_float32_and_logits():
    rng = np.random.default_rng(5)
    y = rng.integers(0, 3, 300)
    logits = rng.normal(size=(300, 3)).astype(np.float32)
    logits[np.arange(300), y] += 1
    ref = np.mean([skm.roc_auc_score(y == k, logits[:, k]) for k in range(3)])
    assert auroc(y, logits) == pytest.approx(ref, abs=1e-12)
    assert auroc(y.astype(np.float64), logits) == auroc(y, logits)


# ----------------------------------------------------------------------- partial auroc


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("ties", [False, True])
def test_partial_auroc_binary_brute_force_and_sklearn(seed, ties):
    rng = np.random.default_rng(seed)
    n = 150
    y = _imbalanced_labels(rng, n, [0.7, 0.3])
    s = rng.random(n) + 0.6 * y
    if ties:
        s = np.round(s, 1)
    p = np.column_stack([1 - s, s])
    m = 0.1
    pa = _brute_partial_area(y == 1, s, m)
    got = partial_auroc(y, p, min_specificity=0.9)
    assert got == pytest.approx(pa / m, abs=1e-12)
    assert _mcclish(m * got, m) == pytest.approx(skm.roc_auc_score(y, s, max_fpr=m), abs=1e-12)


@pytest.mark.parametrize("min_spec", [0.5, 0.8, 0.95, 0.99])
def test_partial_auroc_other_specificities_brute_force(min_spec):
    rng = np.random.default_rng(11)
    y = rng.integers(0, 2, 200)
    s = np.round(rng.random(200) + 0.5 * y, 2)
    p = np.column_stack([1 - s, s])
    m = 1 - min_spec
    got = partial_auroc(y, p, min_specificity=min_spec)
    assert got == pytest.approx(_brute_partial_area(y == 1, s, m) / m, abs=1e-12)
    assert _mcclish(m * got, m) == pytest.approx(skm.roc_auc_score(y, s, max_fpr=m), abs=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_partial_auroc_multiclass_ovr_macro(seed):
    rng = np.random.default_rng(seed)
    y = rng.choice([0, 1, 2, 4], size=250)  # class 3 absent
    proba = np.round(_proba(rng, y, 5), 2)
    m = 0.1
    got = partial_auroc(y, proba)
    brute = _ovr_macro(y, proba, lambda pos, s: _brute_partial_area(pos, s, m) / m)
    assert got == pytest.approx(brute, abs=1e-12)
    # McClish is affine in the raw area with the same m for every class, so it commutes
    # with the macro average.
    sk = np.mean([skm.roc_auc_score(y == k, proba[:, k], max_fpr=m) for k in (0, 1, 2, 4)])
    assert _mcclish(m * got, m) == pytest.approx(sk, abs=1e-12)


def test_partial_auroc_random_is_about_m_over_2_and_full_range_is_auroc():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 40_000)
    s = rng.random(40_000)
    p = np.column_stack([1 - s, s])
    assert partial_auroc(y, p, 0.9) == pytest.approx(0.05, abs=0.01)
    assert partial_auroc(y, p, 0.8) == pytest.approx(0.10, abs=0.015)
    assert partial_auroc(y, p, 0.0) == pytest.approx(auroc(y, p), abs=1e-12)


def test_partial_auroc_interpolates_at_cut():
    # Positives at 0.9 and 0.3; 10 negatives at 0.5, 0.3, 0.29, ..., 0.22.
    # ROC: (0, 0) -> t=0.9 -> (0, .5) -> t=0.5 -> (.1, .5) -> tied group t=0.3 (one positive,
    # one negative) -> (.2, 1) diagonally -> ... -> (1, 1).
    # Cut at FPR 0.15 (min spec 0.85) lies on the sloped segment (.1, .5)-(.2, 1), where
    # TPR = .75: area 0.1 * 0.5 + 0.05 * (0.5 + 0.75) / 2 = 0.08125 -> / 0.15 = 13/24.
    neg = np.array([0.5, 0.3, 0.29, 0.28, 0.27, 0.26, 0.25, 0.24, 0.23, 0.22])
    s = np.concatenate([[0.9, 0.3], neg])
    y = np.array([1, 1] + [0] * 10)
    p = np.column_stack([1 - s, s])
    assert partial_auroc(y, p, 0.85) == pytest.approx(13 / 24)
    # At min spec 0.95 (FPR 0.05) the cut falls on (0, .5)-(.1, .5): area 0.025 -> 0.5.
    assert partial_auroc(y, p, 0.95) == pytest.approx(0.5)


# --------------------------------------------------------- sensitivity at specificity


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("spec", [0.95, 0.9, 0.8, 0.0, 1.0])
def test_sensitivity_at_specificity_binary_brute_force(seed, spec):
    rng = np.random.default_rng(seed)
    y = _imbalanced_labels(rng, 120, [0.75, 0.25])
    y[:40] = 0  # 40 + ~20 negatives: a multiple-of-ten count makes exact hits likely
    s = np.round(rng.random(120) + 0.7 * y, 1)
    p = np.column_stack([1 - s, s])
    ref = _brute_sensitivity(y == 1, s, spec)
    assert sensitivity_at_specificity(y, p, spec) == pytest.approx(ref, abs=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_sensitivity_at_specificity_multiclass_brute_force(seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, 200)
    proba = np.round(_proba(rng, y, 4), 2)
    ref = _ovr_macro(y, proba, lambda pos, s: _brute_sensitivity(pos, s, 0.95))
    assert sensitivity_at_specificity(y, proba) == pytest.approx(ref, abs=1e-12)


def test_sensitivity_at_exact_specificity_boundary():
    # 10 negatives (highest 0.6), 10 positives. Threshold 0.75 flags 3 positives and no
    # negative; threshold 0.54 flags 8 positives and 1 negative -> specificity 9/10, which
    # must count as >= 0.9 (naive FP <= (1 - 0.9) * 10 = 0.999... would reject it, giving
    # 0.3). At 0.95 no false positive is allowed -> 0.3.
    pos = np.array([0.9, 0.8, 0.75, 0.58, 0.57, 0.56, 0.55, 0.54, 0.1, 0.05])
    neg = np.array([0.6, 0.5, 0.45, 0.4, 0.35, 0.3, 0.25, 0.2, 0.15, 0.12])
    s = np.concatenate([pos, neg])
    y = np.array([1] * 10 + [0] * 10)
    p = np.column_stack([1 - s, s])
    assert sensitivity_at_specificity(y, p, 0.9) == pytest.approx(0.8)
    assert sensitivity_at_specificity(y, p, 0.95) == pytest.approx(0.3)


# ----------------------------------------------------------------- combined and errors


def test_classification_metrics_keys_and_values():
    rng = np.random.default_rng(7)
    y = _imbalanced_labels(rng, 400, [0.6, 0.3, 0.1])
    proba = _proba(rng, y, 3)
    out = classification_metrics(y, proba)
    assert list(out) == [
        "balanced_accuracy",
        "accuracy",
        "auroc",
        "pauroc_spec90",
        "pauroc_spec90_mcclish",
        "sensitivity_at_spec95",
    ]
    assert all(type(v) is float for v in out.values())
    y_pred = proba.argmax(axis=1)
    assert out["balanced_accuracy"] == pytest.approx(skm.balanced_accuracy_score(y, y_pred))
    assert out["accuracy"] == pytest.approx(skm.accuracy_score(y, y_pred))
    assert out["auroc"] == pytest.approx(skm.roc_auc_score(y, proba, multi_class="ovr"))
    assert out["pauroc_spec90"] == pytest.approx(partial_auroc(y, proba, 0.90))
    assert out["sensitivity_at_spec95"] == pytest.approx(sensitivity_at_specificity(y, proba, 0.95))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: accuracy([0, 1, 1], [0, 1]), "different lengths: 3 != 2"),
        (lambda: balanced_accuracy([0, 1], [[0, 1]]), "y_pred must be 1-D"),
        (lambda: accuracy([0, 1], [0.2, 0.9]), "y_pred must hold integer class indices"),
        (lambda: accuracy([], []), "y_true is empty"),
        (lambda: auroc([0, 1], [0.2, 0.9]), "proba must be 2-D"),
        (lambda: auroc([0, 1, 1], np.full((2, 2), 0.5)), "y_true has 3 samples, proba has 2"),
        (lambda: auroc([0, 3], np.full((2, 3), 0.3)), r"must lie in \[0, 3\).*\[0, 3\]"),
        (lambda: auroc([-1, 0], np.full((2, 2), 0.5)), r"must lie in \[0, 2\)"),
        (lambda: auroc([0, 1], [[0.1, np.nan], [0.5, 0.5]]), "NaN or infinite"),
        (lambda: auroc([0, 0], [[1.0], [1.0]]), "at least 2 columns"),
        (lambda: classification_metrics([0, 1], np.ones((3, 2))), "different lengths"),
        (lambda: partial_auroc([0, 1], np.eye(2), min_specificity=1.0), "min_specificity"),
        (lambda: partial_auroc([0, 1], np.eye(2), min_specificity=-0.1), "min_specificity"),
        (lambda: sensitivity_at_specificity([0, 1], np.eye(2), 1.5), r"specificity must lie"),
    ],
)
def test_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_large_input_is_consistent():
    # The size metrics see every epoch; also checks int64 counting on a big curve.
    rng = np.random.default_rng(0)
    y = _imbalanced_labels(rng, 50_000, [0.5, 0.2, 0.2, 0.1])
    proba = np.round(_proba(rng, y, 4, signal=0.5), 3).astype(np.float32)
    out = classification_metrics(y, proba)
    ref = np.mean([skm.roc_auc_score(y == k, proba[:, k]) for k in range(4)])
    assert out["auroc"] == pytest.approx(ref, abs=1e-12)
    sk_pa = np.mean([skm.roc_auc_score(y == k, proba[:, k], max_fpr=0.1) for k in range(4)])
    assert _mcclish(0.1 * out["pauroc_spec90"], 0.1) == pytest.approx(sk_pa, abs=1e-10)


# -- the dtype check's message (found by the mutation sample, docs/mutation.md) --------
def test_non_numeric_scores_are_rejected_with_a_message_naming_the_dtype():
    with pytest.raises(ValueError, match="real-valued.*<U"):
        auroc(np.array([0, 1]), np.array([["a", "b"], ["b", "a"]]))


# -- found by the mutation sample (docs/mutation.md) ----------------------------------------
@pytest.mark.parametrize("seed", [0, 1])
def test_roc_counts_are_sklearns_roc_curve_one_point_per_distinct_threshold(seed):
    """The private curve is what every ROC metric reads; its docstring promises one point per
    distinct threshold from (0, 0). sklearn's unthinned ``roc_curve`` is the reference (its
    first point is the threshold above every score, as ours)."""
    from scarcelab.metrics.classification import _roc_counts

    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 40)
    score = rng.integers(0, 12, 40) / 11.0  # ties on purpose
    c = _roc_counts(y == 1, score)
    fpr, tpr, _ = skm.roc_curve(y, score, drop_intermediate=False)
    assert c.n_pos == int(y.sum()) and c.n_neg == int((y == 0).sum())
    np.testing.assert_array_equal(c.fps, np.rint(fpr * c.n_neg).astype(np.int64))
    np.testing.assert_array_equal(c.tps, np.rint(tpr * c.n_pos).astype(np.int64))


def test_why_undefined_gives_the_roc_reason_only_to_roc_metrics():
    """The one-time warning must fit the metric: "a single class, no ROC curve" is the
    reason for AUROC / sensitivity-at-specificity only, never for e.g. accuracy."""
    from scarcelab.metrics.undefined import why_undefined

    roc = "the evaluated set holds a single class, so there is no ROC curve"
    assert why_undefined("test/auroc") == roc
    assert why_undefined("val/sensitivity_at_spec90") == roc
    generic = "it cannot be computed from this run's data"
    assert why_undefined("test/accuracy") == generic
    assert why_undefined("test/balanced_accuracy") == generic
    assert why_undefined("diag/sem_drift").startswith("no class had both")
