"""Behaviours of scarcelab/metrics that the seeded mutation sample (docs/mutation.md) showed
no test checked: the evaluator's Dice key, the empty cases that must be NaN rather than a
number or a crash, the typed path of :func:`evaluate`, the NaN of a gradient with no path to
the weight, and the message of the dtype check. Every expected value is hand-computed."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from scarcelab.metrics.classification import auroc
from scarcelab.metrics.diagnostics import gradient_alignment
from scarcelab.metrics.segmentation import SegmentationEvaluator, aji, dice, evaluate


def _square(m: np.ndarray, r: int, c: int, h: int, w: int, v: int) -> None:
    m[r:r + h, c:c + w] = v


def _tiles() -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Tile A: true 4x4 (16 px), predicted shifted by a row (12 px overlap, 16 px); tile B:
    true 2x2 (4 px), predicted 2x3 covering it (6 px); tile C: nothing at all."""
    a_t = np.zeros((10, 10), np.int32)
    _square(a_t, 0, 0, 4, 4, 1)
    a_p = np.zeros_like(a_t)
    _square(a_p, 1, 0, 4, 4, 5)
    b_t = np.zeros((10, 10), np.int32)
    _square(b_t, 5, 5, 2, 2, 3)
    b_p = np.zeros_like(b_t)
    _square(b_p, 5, 5, 2, 3, 9)
    c = np.zeros((10, 10), np.int32)
    return [a_t, b_t, c], [a_p, b_p, c.copy()]


def test_evaluator_reports_dice_pooled_and_per_image():
    trues, preds = _tiles()
    r = evaluate(trues, preds)
    # pooled: (2 * (12 + 4)) / ((16 + 16) + (4 + 6)) = 32 / 42; tile C has |A|+|B| = 0
    assert r["dice_pooled"] == pytest.approx(32 / 42)
    # per image: mean(24/32, 8/10) over the two tiles whose truth holds a nucleus
    assert r["dice"] == pytest.approx((24 / 32 + 8 / 10) / 2)
    assert set(r) == {"pq", "dq", "sq", "aji", "dice", "pq_pooled", "dq_pooled",
                      "sq_pooled", "aji_pooled", "dice_pooled", "f1_d"}


def test_empty_tiles_give_nan_not_a_number_or_a_crash():
    e = np.zeros((6, 6), np.int32)
    assert math.isnan(dice(e, e)) and math.isnan(aji(e, e))
    r = evaluate([e, e], [e, e])
    assert all(math.isnan(v) for v in r.values()), r
    r = SegmentationEvaluator().result()  # no tile at all
    assert all(math.isnan(v) for v in r.values()), r


def test_evaluate_passes_the_predicted_types_through():
    true = np.zeros((12, 12), np.int32)
    _square(true, 0, 0, 4, 4, 1)
    _square(true, 6, 6, 4, 4, 2)
    r = evaluate([true], [true.copy()], type_ids={1: "a", 2: "b"},
                 true_types=[{1: 1, 2: 2}], pred_types=[{1: 1, 2: 1}])
    # nucleus 2 predicted as type a: a has TP 1 + FP 1 -> 1 / 1.5; b has FN 1 -> 0
    assert r["pq_type/a"] == pytest.approx(2 / 3) and r["pq_type/b"] == 0.0
    assert r["pq_type_conic/a"] == pytest.approx(2 / 3) and r["pq_type_conic/b"] == 0.0
    assert r["mpq"] == pytest.approx(1 / 3) and r["mpq_conic"] == pytest.approx(1 / 3)
    with pytest.raises(TypeError, match="drop the aggregation argument"):
        evaluate([true], [true.copy()], "pooled")  # type: ignore[arg-type]


def test_gradient_alignment_is_nan_when_a_loss_has_no_path_to_the_weight():
    w = torch.tensor([[1.0, 2.0]], requires_grad=True)
    other = torch.tensor([3.0], requires_grad=True)
    x = torch.tensor([1.0, -1.0])
    loss_l = (w @ x).sum() ** 2
    loss_u = (other * 2).sum()  # differentiable, but not through w
    assert math.isnan(gradient_alignment(loss_l, loss_u, w))
    # and a real pair: w.x = -1, so d/dw (w.x)^2 = 2 (w.x) x = (-2, 2) and d/dw (w.x) = x =
    # (1, -1): opposite directions, cosine -1
    loss_u2 = (w @ x).sum()
    assert gradient_alignment(loss_l, loss_u2, w) == pytest.approx(-1.0)


def test_non_numeric_scores_are_rejected_with_a_message_naming_the_dtype():
    with pytest.raises(ValueError, match="real-valued.*<U"):
        auroc(np.array([0, 1]), np.array([["a", "b"], ["b", "a"]]))
