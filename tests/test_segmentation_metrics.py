"""PQ / DQ / SQ / mPQ / AJI / Dice against a brute-force reference written independently
(one boolean mask per instance, an explicit IoU matrix, explicit one-to-one matching), on
hand-built masks with hand-computed values and on perturbed real CoNSeP masks."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from scipy import ndimage

from scarcelab.metrics.segmentation import (
    SegmentationEvaluator,
    aji,
    dice,
    evaluate,
    panoptic_quality,
    pq_counts,
)

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SCARCELAB_SHARED_DATA", REPO.parent / "shared" / "data")
              ) / "consep_patches"


# -- brute-force reference ------------------------------------------------------------------
def ref_pq(true: np.ndarray, pred: np.ndarray) -> tuple[int, int, int, float]:
    t_ids = [i for i in np.unique(true) if i]
    p_ids = [j for j in np.unique(pred) if j]
    iou = np.zeros((len(t_ids), len(p_ids)))
    for a, i in enumerate(t_ids):
        gm = true == i
        for b, j in enumerate(p_ids):
            pm = pred == j
            iou[a, b] = (gm & pm).sum() / (gm | pm).sum()
    # explicit matching: repeatedly take the best remaining pair while it beats 0.5
    tp, s, used_t, used_p = 0, 0.0, set(), set()
    order = sorted(((iou[a, b], a, b) for a in range(len(t_ids)) for b in range(len(p_ids))),
                   reverse=True)
    for v, a, b in order:
        if v <= 0.5:
            break
        if a in used_t or b in used_p:
            continue
        used_t.add(a)
        used_p.add(b)
        tp += 1
        s += v
    return tp, len(p_ids) - tp, len(t_ids) - tp, s


def ref_aji(true: np.ndarray, pred: np.ndarray) -> float:
    """Kumar et al. 2017, Algorithm 1, literally."""
    t_ids = [i for i in np.unique(true) if i]
    p_ids = [j for j in np.unique(pred) if j]
    c = u = 0
    used: set[int] = set()
    for i in t_ids:
        gm = true == i
        best, best_iou = None, 0.0
        for j in p_ids:
            pm = pred == j
            v = (gm & pm).sum() / (gm | pm).sum()
            if v > best_iou:
                best, best_iou = j, v
        if best is None:
            u += gm.sum()
            continue
        pm = pred == best
        c += (gm & pm).sum()
        u += (gm | pm).sum()
        used.add(best)
    for j in p_ids:
        if j not in used:
            u += (pred == j).sum()
    return c / u if u else float("nan")


def ref_dice(true: np.ndarray, pred: np.ndarray) -> float:
    a, b = true > 0, pred > 0
    return 2 * (a & b).sum() / (a.sum() + b.sum())


def assert_same(true: np.ndarray, pred: np.ndarray) -> None:
    c = pq_counts(true, pred)
    tp, fp, fn, s = ref_pq(true, pred)
    assert (c.tp, c.fp, c.fn) == (tp, fp, fn)
    assert c.iou_sum == pytest.approx(s, abs=1e-9)
    assert aji(true, pred) == pytest.approx(ref_aji(true, pred), abs=1e-12)
    assert dice(true, pred) == pytest.approx(ref_dice(true, pred), abs=1e-12)


# -- hand-built cases --------------------------------------------------------------------------
def _square(m: np.ndarray, r: int, c: int, h: int, w: int, v: int) -> None:
    m[r:r + h, c:c + w] = v


def test_hand_computed_pq_dq_sq_aji_dice():
    true = np.zeros((20, 20), np.int32)
    _square(true, 0, 0, 4, 4, 1)  # 16 px
    _square(true, 10, 10, 3, 3, 2)  # 9 px, missed
    pred = np.zeros_like(true)
    _square(pred, 1, 0, 4, 4, 7)  # overlaps nucleus 1 on 12 px: IoU 12 / 20 = 0.6
    _square(pred, 16, 16, 2, 2, 3)  # 4 px false positive
    r = panoptic_quality(true, pred)
    assert r["dq"] == pytest.approx(1 / (1 + 0.5 + 0.5))
    assert r["sq"] == pytest.approx(0.6)
    assert r["pq"] == pytest.approx(0.3)
    # AJI: C = 12; U = 20 (pair) + 9 (missed nucleus) + 4 (unused prediction)
    assert aji(true, pred) == pytest.approx(12 / 33)
    # Dice: |A∩B| = 12, |A| + |B| = 25 + 20
    assert dice(true, pred) == pytest.approx(24 / 45)
    assert_same(true, pred)


def test_iou_of_exactly_one_half_is_not_a_match():
    true = np.zeros((8, 8), np.int32)
    _square(true, 0, 0, 4, 4, 1)
    pred = np.zeros_like(true)
    _square(pred, 0, 0, 4, 2, 1)  # IoU 8 / 16 = 0.5
    c = pq_counts(true, pred)
    assert (c.tp, c.fp, c.fn) == (0, 1, 1)
    assert panoptic_quality(true, pred)["pq"] == 0.0


def test_perfect_and_empty_predictions():
    rng = np.random.default_rng(0)
    true = np.zeros((32, 32), np.int32)
    for k in range(1, 6):
        r, c = rng.integers(0, 28, 2)
        true[r:r + 4, c:c + 4] = k
    relabelled = np.where(true > 0, true * 10 + 3, 0)  # ids need not agree
    r = panoptic_quality(true, relabelled)
    assert r == {"pq": 1.0, "dq": 1.0, "sq": 1.0}
    assert aji(true, relabelled) == 1.0 and dice(true, relabelled) == 1.0
    r = panoptic_quality(true, np.zeros_like(true))
    assert r["pq"] == 0.0 and r["dq"] == 0.0
    assert aji(true, np.zeros_like(true)) == 0.0 and dice(true, np.zeros_like(true)) == 0.0
    assert np.isnan(panoptic_quality(np.zeros_like(true), np.zeros_like(true))["pq"])


def test_pooled_and_per_image_aggregation_differ_as_defined():
    # tile A: one perfect match; tile B: one missed nucleus
    a = np.zeros((6, 6), np.int32)
    _square(a, 0, 0, 3, 3, 1)
    b = a.copy()
    pooled = evaluate([a, b], [a, np.zeros_like(b)], "pooled")
    image = evaluate([a, b], [a, np.zeros_like(b)], "image")
    assert pooled["pq"] == pytest.approx(1 / 1.5)  # TP 1, FN 1 summed over tiles
    assert image["pq"] == pytest.approx(0.5)  # mean of 1 and 0
    assert pooled["aji"] == pytest.approx(9 / 18) and image["aji"] == pytest.approx(0.5)
    # a tile with nothing true and nothing predicted does not count per image
    empty = np.zeros_like(a)
    assert evaluate([a, empty], [a, empty], "image")["pq"] == 1.0


def test_mpq_per_type_hand_case():
    true = np.zeros((12, 12), np.int32)
    _square(true, 0, 0, 4, 4, 1)  # type 1
    _square(true, 6, 6, 4, 4, 2)  # type 2
    pred = true.copy()
    ev = SegmentationEvaluator({1: "a", 2: "b"})
    ev.add(true, pred, {1: 1, 2: 2}, {1: 1, 2: 1})  # nucleus 2 predicted as type 1
    r = ev.result("pooled")
    # type a: TP 1 (IoU 1) + FP 1 -> PQ 1 / 1.5; type b: FN 1 -> 0; binary PQ is 1
    assert r["pq_type/a"] == pytest.approx(2 / 3)
    assert r["pq_type/b"] == 0.0
    assert r["mpq"] == pytest.approx(1 / 3)
    assert r["pq"] == 1.0


def test_mpq_pannuke_rule_skips_tiles_without_the_type():
    t1 = np.zeros((8, 8), np.int32)
    _square(t1, 0, 0, 4, 4, 1)
    ev = SegmentationEvaluator({1: "a", 2: "b"})
    ev.add(t1, t1, {1: 1}, {1: 1})  # type a perfect, no b anywhere
    ev.add(t1, t1, {1: 1}, {1: 2})  # type a missed, a false b
    img = ev.result("image")
    # a: tiles 1 and 2 hold a true "a" -> mean(1, 0); b: no tile holds a true "b" -> NaN,
    # so its false positive is ignored (PanNuke's convention) and mPQ averages a only
    assert img["pq_type/a"] == pytest.approx(0.5)
    assert np.isnan(img["pq_type/b"]) and img["mpq"] == pytest.approx(0.5)
    pooled = ev.result("pooled")
    assert pooled["pq_type/a"] == pytest.approx(1 / 1.5)
    assert pooled["pq_type/b"] == 0.0  # pooled counts the false "b"
    assert pooled["mpq"] == pytest.approx(1 / 3)


def test_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="one shape"):
        pq_counts(np.zeros((4, 4), int), np.zeros((4, 5), int))


# -- perturbed real masks ---------------------------------------------------------------------
def _real_masks() -> list[np.ndarray]:
    if not SHARED.exists():
        pytest.skip("../shared/data/consep_patches absent (a fresh clone): real-mask tests need it")
    from PIL import Image

    names = ["train/inst_png/train_1_005.png", "train/inst_png/train_12_009.png",
             "test/inst_png/test_3_002.png"]
    return [np.asarray(Image.open(SHARED / n)).astype(np.int32)[:128, :128] for n in names]


def _erode(m: np.ndarray) -> np.ndarray:
    out = np.zeros_like(m)
    for i in np.unique(m)[1:]:
        out[ndimage.binary_erosion(m == i, iterations=1)] = i
    return out


def _dilate(m: np.ndarray) -> np.ndarray:
    from skimage.segmentation import expand_labels

    return expand_labels(m, distance=2)


def _merge(m: np.ndarray) -> np.ndarray:
    """Merge every nucleus with a touching neighbour of higher id into that neighbour."""
    out = m.copy()
    grown = ndimage.grey_dilation(m, size=3)
    for i in np.unique(m)[1:]:
        nb = np.unique(grown[(m == i)])
        nb = nb[(nb != 0) & (nb != i)]
        if len(nb):
            out[out == i] = nb.max()
    return out


def _split(m: np.ndarray) -> np.ndarray:
    """Cut every nucleus into a left and a right half (new ids)."""
    out = m.copy()
    nxt = m.max() + 1
    for i in np.unique(m)[1:]:
        rr, cc = np.nonzero(m == i)
        right = cc > np.median(cc)
        out[rr[right], cc[right]] = nxt
        nxt += 1
    return out


def _miss(m: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    ids = np.unique(m)[1:]
    drop = rng.choice(ids, len(ids) // 3, replace=False)
    return np.where(np.isin(m, drop), 0, m)


def _shuffle_ids(m: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    ids = np.unique(m)[1:]
    perm = dict(zip(ids.tolist(), (rng.permutation(len(ids)) + 100).tolist(), strict=True))
    return np.vectorize(lambda v: perm.get(v, 0))(m)


def test_perturbed_real_masks_match_the_brute_force_reference():
    rng = np.random.default_rng(0)
    for m in _real_masks():
        assert m.max() > 5
        # perfect (with other ids) scores 1, empty scores 0
        perf = _shuffle_ids(m, rng)
        assert panoptic_quality(m, perf)["pq"] == 1.0 and aji(m, perf) == 1.0
        assert panoptic_quality(m, np.zeros_like(m))["pq"] == 0.0
        for pert in (_erode(m), _dilate(m), _merge(m), _split(m), _miss(m, rng),
                     _split(_miss(_dilate(m), rng)), _shuffle_ids(_merge(_erode(m)), rng)):
            assert_same(m, pert)
            assert_same(pert, m)  # the roles are not symmetric for AJI


def test_perturbations_move_the_metrics_the_expected_way():
    for m in _real_masks():
        missed = panoptic_quality(m, _miss(m, np.random.default_rng(1)))
        n = len(np.unique(m)) - 1
        k = n // 3  # missed nuclei: TP = n - k, FN = k
        assert missed["sq"] == 1.0
        assert missed["dq"] == pytest.approx((n - k) / (n - k + k / 2))
        split = panoptic_quality(m, _split(m))
        assert split["pq"] < 0.5  # a half keeps IoU > 0.5 only when it holds most pixels
        eroded = panoptic_quality(m, _erode(m))
        assert eroded["sq"] < 1.0 and eroded["dq"] > 0.5
