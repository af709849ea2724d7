"""PQ / DQ / SQ / mPQ / AJI / Dice against a brute-force reference written independently
(one boolean mask per instance, an explicit IoU matrix, explicit one-to-one matching), on
hand-built masks with hand-computed values and on perturbed real CoNSeP masks."""

from __future__ import annotations

import itertools
import math
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
    pair_centroids,
    panoptic_quality,
    pq_counts,
)

REPO = Path(__file__).resolve().parents[3]
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


def test_issue_example_per_image_pq_is_the_headline_and_pooled_is_kept_apart():
    """Issue 23 item 1: tile 1 has two nuclei predicted exactly, tile 2 one nucleus and an
    empty prediction. Per image (HoVer-Net): mean(1, 0) = 0.5; pooled: TP 2, FN 1 ->
    2 / (2 + 0.5) = 0.8."""
    t1 = np.zeros((10, 10), np.int32)
    _square(t1, 0, 0, 3, 3, 1)
    _square(t1, 5, 5, 3, 3, 2)
    t2 = np.zeros_like(t1)
    _square(t2, 2, 2, 3, 3, 1)
    r = evaluate([t1, t2], [t1.copy(), np.zeros_like(t2)])
    assert r["pq"] == pytest.approx(0.5)
    assert r["pq_pooled"] == pytest.approx(0.8)
    assert r["dq"] == pytest.approx(0.5) and r["dq_pooled"] == pytest.approx(0.8)
    assert r["sq"] == pytest.approx(0.5) and r["sq_pooled"] == 1.0
    # AJI: tile 1 = 1, tile 2 = 0 / 9; pooled 18 / 27. Dice: 1 and 0; pooled 36 / 45
    assert r["aji"] == pytest.approx(0.5) and r["aji_pooled"] == pytest.approx(18 / 27)
    assert r["dice"] == pytest.approx(0.5) and r["dice_pooled"] == pytest.approx(36 / 45)


def test_empty_truth_tiles_are_skipped_per_image_but_counted_pooled():
    """PanNuke run.py: a tile whose truth is empty is NaN for binary PQ (skipped by
    nanmean), false positives and all; the pooled sums still see them."""
    a = np.zeros((6, 6), np.int32)
    _square(a, 0, 0, 3, 3, 1)
    empty = np.zeros_like(a)
    fp = np.zeros_like(a)
    _square(fp, 3, 3, 2, 2, 4)
    r = evaluate([a, empty, empty], [a.copy(), fp, empty.copy()])
    assert r["pq"] == 1.0 and r["aji"] == 1.0 and r["dice"] == 1.0
    assert r["pq_pooled"] == pytest.approx(1 / 1.5)  # TP 1, FP 1
    assert r["aji_pooled"] == pytest.approx(9 / 13) and r["dice_pooled"] == pytest.approx(
        18 / 22)


def _typed_issue_example() -> tuple[list, list, list, list]:
    """Issue 23 item 2: tile 1 holds one type-a and one type-b nucleus, both segmented
    exactly but both typed a; tile 2 holds one type-a nucleus, exact."""
    t1 = np.zeros((12, 12), np.int32)
    _square(t1, 0, 0, 4, 4, 1)
    _square(t1, 6, 6, 4, 4, 2)
    t2 = np.zeros_like(t1)
    _square(t2, 3, 3, 4, 4, 1)
    return [t1, t2], [t1.copy(), t2.copy()], [{1: 1, 2: 2}, {1: 1}], [{1: 1, 2: 1}, {1: 1}]


def test_issue_example_mpq_pannuke_and_conic():
    trues, preds, tt, pt = _typed_issue_example()
    r = evaluate(trues, preds, {1: "a", 2: "b"}, tt, pt)
    # PanNuke: tile 1 -> mean(PQ_a = 1 / 1.5, PQ_b = 0) = 1/3; tile 2 -> PQ_a = 1 (b is
    # absent from its truth: not averaged); mean over images (1/3 + 1) / 2 = 2/3
    assert r["mpq"] == pytest.approx(2 / 3)
    # the old rule (each type over the tiles holding it, then over types) gave
    # mean(mean(2/3, 1), 0) = 5/12 = 0.417
    assert r["mpq"] != pytest.approx(5 / 12)
    assert r["pq_type/a"] == pytest.approx(5 / 6) and r["pq_type/b"] == 0.0
    # CoNIC, pooled per type: a has TP 2, FP 1 -> 2 / 2.5 = 0.8; b has FN 1 -> 0
    assert r["pq_type_conic/a"] == pytest.approx(0.8) and r["pq_type_conic/b"] == 0.0
    assert r["mpq_conic"] == pytest.approx(0.4)
    assert r["pq"] == 1.0 and r["pq_pooled"] == 1.0  # binary: all three nuclei exact


def test_conic_counts_a_type_absent_everywhere_as_zero_pannuke_ignores_it():
    t = np.zeros((8, 8), np.int32)
    _square(t, 0, 0, 4, 4, 1)
    r = evaluate([t], [t.copy()], {1: "a", 2: "b", 3: "c"}, [{1: 1}], [{1: 1}])
    assert r["mpq"] == 1.0  # only a is in the truth
    assert np.isnan(r["pq_type/b"]) and r["pq_type_conic/b"] == 0.0
    assert r["mpq_conic"] == pytest.approx(1 / 3)  # CoNIC's epsilon: 0/(0 + 1e-6) = 0


# -- independent references for the typed summaries -------------------------------------------
def _ref_pq_value(true: np.ndarray, pred: np.ndarray) -> float:
    tp, fp, fn, s = ref_pq(true, pred)
    return s / (tp + 0.5 * fp + 0.5 * fn)


def _only(inst: np.ndarray, types: dict[int, int], t: int) -> np.ndarray:
    out = np.zeros_like(inst)
    for i, ty in types.items():
        if ty == t:
            out[inst == i] = i
    return out


def ref_pannuke_mpq(trues, preds, tts, pts, n_types):  # type: ignore[no-untyped-def]
    """PanNuke-metrics run.py written out: per image a list over classes, NaN where the
    class is absent from the image's truth, nanmean per image, then over images."""
    per_image = []
    for true, pred, tt, pt in zip(trues, preds, tts, pts, strict=True):
        pq = []
        for t in range(1, n_types + 1):
            tr, pr = _only(true, tt, t), _only(pred, pt, t)
            pq.append(np.nan if not tr.any() else _ref_pq_value(tr, pr))
        if not all(np.isnan(pq)):
            per_image.append(np.nanmean(pq))
    return float(np.mean(per_image))


def ref_conic_mpq(trues, preds, tts, pts, n_types):  # type: ignore[no-untyped-def]
    """CoNIC compute_stats.py multi_pq+: per class, sums over images, then dq * sq with
    their epsilons, then the mean over classes."""
    stats = np.zeros((n_types, 4))
    for true, pred, tt, pt in zip(trues, preds, tts, pts, strict=True):
        for t in range(1, n_types + 1):
            stats[t - 1] += ref_pq(_only(true, tt, t), _only(pred, pt, t))
    dq = stats[:, 0] / (stats[:, 0] + 0.5 * stats[:, 1] + 0.5 * stats[:, 2] + 1e-6)
    sq = stats[:, 3] / (stats[:, 0] + 1e-6)
    return float(np.mean(dq * sq))


def test_mpq_pannuke_and_conic_match_references_on_perturbed_real_masks():
    rng = np.random.default_rng(3)
    trues, preds, tts, pts = [], [], [], []
    for m in _real_masks():
        for pert in (_erode(m), _merge(m), _miss(m, rng), _dilate(m)):
            ids = np.unique(m)[1:]
            tts.append({int(i): int(rng.integers(1, 4)) for i in ids})
            pids = np.unique(pert)[1:]
            pts.append({int(j): int(rng.integers(1, 4)) for j in pids})
            trues.append(m)
            preds.append(pert)
    names = {1: "a", 2: "b", 3: "c"}
    r = evaluate(trues, preds, names, tts, pts)
    assert r["mpq"] == pytest.approx(ref_pannuke_mpq(trues, preds, tts, pts, 3), abs=1e-9)
    assert r["mpq_conic"] == pytest.approx(ref_conic_mpq(trues, preds, tts, pts, 3), abs=1e-5)
    assert 0.05 < r["mpq_conic"] < 0.95 and r["mpq"] != pytest.approx(r["mpq_conic"])


# -- HoVer-Net's detection / classification F1 ------------------------------------------------
def test_hovernet_type_f1_hand_case():
    true = np.zeros((30, 30), np.int32)
    _square(true, 1, 1, 3, 3, 1)  # A, type 1, centre (2, 2)
    _square(true, 1, 19, 3, 3, 2)  # B, type 2, centre (2, 20)
    _square(true, 19, 19, 3, 3, 3)  # C, type 1, centre (20, 20): missed
    pred = np.zeros_like(true)
    _square(pred, 1, 1, 3, 3, 7)  # on A, typed 1
    _square(pred, 2, 19, 3, 3, 8)  # on B (1 px off), typed 1: wrong type
    _square(pred, 19, 1, 3, 3, 9)  # centre (20, 2): 18 px from C, unpaired, typed 2
    r = evaluate([true], [pred], {1: "x", 2: "y"}, [{1: 1, 2: 2, 3: 1}],
                 [{7: 1, 8: 1, 9: 2}])
    assert r["f1_d"] == pytest.approx(4 / 6)  # TP 2, FP 1, FN 1
    assert r["type_acc"] == pytest.approx(0.5)
    # type 1: TP 1 (A), FP_t 1 (B typed 1), FN_d 1 (C) -> 2 / (2 + 2 + 1)
    assert r["f1_type/x"] == pytest.approx(0.4)
    # type 2: FN_t 1 (B), FP_d 1 (the far prediction) -> 0 / (2 + 1)
    assert r["f1_type/y"] == 0.0


def test_centroid_pairing_is_the_global_assignment_then_the_radius():
    """HoVer-Net pair_coordinates: a1-b1 and a2-b2 (12.5 px each) beat a2-b1 (11.5 px) plus
    a1-b2 in total distance, and then both exceed 12 px: no pair at all."""
    a = np.array([[0.0, 0.0], [0.0, 24.0]])
    b = np.array([[0.0, 12.5], [0.0, 36.5]])
    pairs, ua, ub = pair_centroids(a, b, 12.0)
    assert len(pairs) == 0 and ua.tolist() == [0, 1] and ub.tolist() == [0, 1]
    pairs, _, _ = pair_centroids(a, b, 13.0)
    assert pairs.tolist() == [[0, 0], [1, 1]]


def test_type_f1_matches_a_brute_force_pairing_on_small_random_sets():
    rng = np.random.default_rng(5)
    for _ in range(20):
        a = rng.uniform(0, 30, (int(rng.integers(0, 5)), 2))
        b = rng.uniform(0, 30, (int(rng.integers(0, 5)), 2))
        pairs, ua, ub = pair_centroids(a, b, 12.0)
        # brute force: every injective map of the smaller set, least total distance
        small, big, flip = (a, b, False) if len(a) <= len(b) else (b, a, True)
        best, best_cost = (), np.inf
        for perm in itertools.permutations(range(len(big)), len(small)):
            cost = sum(np.hypot(*(small[i] - big[j])) for i, j in enumerate(perm))
            if cost < best_cost - 1e-12:
                best, best_cost = perm, cost
        ref = sorted((j, i) if flip else (i, j) for i, j in enumerate(best)
                     if np.hypot(*(small[i] - big[j])) <= 12.0)
        assert sorted(map(tuple, pairs.tolist())) == ref
        assert len(ua) == len(a) - len(ref) and len(ub) == len(b) - len(ref)


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


# -- the evaluator's Dice, empty cases, typed path (mutation sample, docs/mutation.md) --
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
