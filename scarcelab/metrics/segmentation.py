"""Instance-segmentation metrics for nuclei: PQ = DQ x SQ, AJI, Dice, multi-class PQ, and
HoVer-Net's detection / type-classification F1.

Definitions (numpy only; maps are integer instance maps, 0 = background, ids need not be
contiguous):

* **PQ** (Kirillov et al. 2019, "Panoptic Segmentation", eq. 1): a predicted and a true
  segment match when their IoU is *strictly* above 0.5; no segment can then match two
  (their Theorem 1), so matching needs no assignment step.
  ``DQ = TP / (TP + FP/2 + FN/2)``, ``SQ = sum of matched IoUs / TP``, ``PQ = DQ * SQ``.
  With no match, SQ is reported as 0 (so PQ = DQ * SQ still holds).
* **AJI** (Kumar et al. 2017, IEEE TMI, Algorithm 1): every true nucleus G_i is paired
  with the predicted segment S_j of highest IoU (a segment may be chosen more than once);
  C += |G_i ∩ S_j|, U += |G_i ∪ S_j|; finally every predicted segment never chosen adds
  its area to U. AJI = C / U. A true nucleus overlapping no prediction adds |G_i| to U.
* **Dice**: 2|A ∩ B| / (|A| + |B|) of the binary foregrounds (HoVer-Net's "DICE1").

How a test set is summarised (every key is always computed; see :meth:`result`):

* ``pq, dq, sq, aji, dice`` — **the per-image mean** over the tiles whose ground truth
  holds at least one nucleus. HoVer-Net reports binary PQ/AJI/Dice this way
  (``compute_stats.py::run_nuclei_inst_stat``: one value per image, ``np.mean`` over
  images), Kang et al. follow it, and CoNIC's binary PQ is per image too
  (``compute_stats.py``, "Binary panoptic quality is calculated per image"). Tiles with an
  empty ground truth are skipped as PanNuke skips them for binary PQ (``run.py``:
  ``pq_bin = np.nan`` when the truth is empty, then ``nanmean``).
* ``pq_pooled, dq_pooled, sq_pooled, aji_pooled, dice_pooled`` — TP, FP, FN and the IoU
  sum (AJI's C and U, Dice's intersections and areas) summed over all tiles before the
  ratio is formed.
* ``mpq`` — **PanNuke's multi-class PQ** (Gamper et al. 2020; ``PanNuke-metrics/run.py``
  ``main``): in each image, the PQ of every type present in that image's ground truth
  (maps restricted to the instances of the type; a type absent from the image's truth is
  NaN there), averaged over those types (``nanmean``); then the mean over images.
  ``pq_type/<name>`` is PanNuke's per-class value: the mean of that type's PQ over the
  images whose truth holds it.
* ``mpq_conic`` — **CoNIC's multi-class PQ** (``CoNIC/compute_stats.py``, ``multi_pq+``;
  ``metrics/stats_utils.py::get_multi_pq_info``): per type, TP/FP/FN/IoU sums pooled over
  all images, PQ formed once per type (their ``+ 1.0e-6`` makes a type absent everywhere
  score 0), then the mean over types; ``pq_type_conic/<name>`` per type.
* ``f1_d``, ``type_acc``, ``f1_type/<name>`` — **HoVer-Net's** detection and
  classification scores (Graham et al. 2019; ``compute_stats.py::run_nuclei_type_stat``):
  true and predicted nuclei are paired by centroid, optimal assignment on Euclidean
  distance, kept when at most ``radius`` (12 px) apart; pooled over all images,
  F_d = 2TP / (2TP + FP + FN), accuracy = share of pairs with the right type, and per type
  F_t = 2 TP_t / (2 TP_t + 2 FP_t + 2 FN_t + FP_d,t + FN_d,t) (TP_t, FP_t, FN_t among the
  pairs; FP_d,t / FN_d,t the unpaired predictions / truths of type t). HoVer-Net scores
  types this way, not by mPQ.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import ndimage
from scipy.optimize import linear_sum_assignment
from scipy.spatial.distance import cdist

AGGREGATIONS = ("image", "pooled")
IOU_THRESHOLD = 0.5
PAIR_RADIUS = 12.0  # px; HoVer-Net compute_stats.py: pair_coordinates(..., 12)
BINARY = ("pq", "dq", "sq", "aji", "dice")


@dataclass
class PQCounts:
    """Sufficient statistics of PQ: summable over tiles (the pooled aggregation)."""

    tp: int = 0
    fp: int = 0
    fn: int = 0
    iou_sum: float = 0.0

    def __add__(self, other: PQCounts) -> PQCounts:
        return PQCounts(self.tp + other.tp, self.fp + other.fp, self.fn + other.fn,
                        self.iou_sum + other.iou_sum)

    @property
    def defined(self) -> bool:
        return self.tp + self.fp + self.fn > 0

    @property
    def dq(self) -> float:
        d = self.tp + 0.5 * self.fp + 0.5 * self.fn
        return self.tp / d if d > 0 else float("nan")

    @property
    def sq(self) -> float:
        if not self.defined:
            return float("nan")
        return self.iou_sum / self.tp if self.tp else 0.0

    @property
    def pq(self) -> float:
        d = self.tp + 0.5 * self.fp + 0.5 * self.fn
        return self.iou_sum / d if d > 0 else float("nan")


def _check(true: np.ndarray, pred: np.ndarray) -> None:
    if true.shape != pred.shape or true.ndim != 2:
        raise ValueError(f"instance maps must be 2-D and of one shape, got {true.shape} "
                         f"and {pred.shape}")


def overlaps(true: np.ndarray, pred: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(true_ids, pred_ids, inter, true_area, pred_area)``: the pixel intersection of
    every true/predicted segment pair, from one ``bincount`` over the joint labels."""
    _check(true, pred)
    t_ids, t_inv = np.unique(true.ravel(), return_inverse=True)
    p_ids, p_inv = np.unique(pred.ravel(), return_inverse=True)
    joint = np.bincount(t_inv * len(p_ids) + p_inv, minlength=len(t_ids) * len(p_ids))
    joint = joint.reshape(len(t_ids), len(p_ids))
    t_keep = t_ids != 0
    p_keep = p_ids != 0
    t_area = joint.sum(1)[t_keep]
    p_area = joint.sum(0)[p_keep]
    return t_ids[t_keep], p_ids[p_keep], joint[np.ix_(t_keep, p_keep)], t_area, p_area


def pq_counts(true: np.ndarray, pred: np.ndarray) -> PQCounts:
    """TP/FP/FN and the matched-IoU sum of one tile (matching at IoU > 0.5)."""
    t_ids, p_ids, inter, t_area, p_area = overlaps(true, pred)
    if len(t_ids) == 0 or len(p_ids) == 0:
        return PQCounts(0, len(p_ids), len(t_ids), 0.0)
    union = t_area[:, None] + p_area[None, :] - inter
    iou = inter / np.maximum(union, 1)
    matched = iou > IOU_THRESHOLD  # at most one True per row and per column (Kirillov Thm 1)
    tp = int(matched.sum())
    return PQCounts(tp, len(p_ids) - tp, len(t_ids) - tp, float(iou[matched].sum()))


def panoptic_quality(true: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    """PQ, DQ and SQ of one tile (NaN when the tile has no true and no predicted nucleus)."""
    c = pq_counts(true, pred)
    return {"pq": c.pq, "dq": c.dq, "sq": c.sq}


def aji_counts(true: np.ndarray, pred: np.ndarray) -> tuple[int, int]:
    """Kumar et al.'s (C, U) for one tile; AJI = C / U."""
    t_ids, p_ids, inter, t_area, p_area = overlaps(true, pred)
    if len(t_ids) == 0:
        return 0, int(p_area.sum())
    if len(p_ids) == 0:
        return 0, int(t_area.sum())
    union = t_area[:, None] + p_area[None, :] - inter
    iou = inter / np.maximum(union, 1)
    best = iou.argmax(1)
    has = iou[np.arange(len(t_ids)), best] > 0
    rows = np.arange(len(t_ids))[has]
    c = int(inter[rows, best[has]].sum())
    u = int(union[rows, best[has]].sum()) + int(t_area[~has].sum())
    used = np.zeros(len(p_ids), bool)
    used[best[has]] = True
    u += int(p_area[~used].sum())
    return c, u


def aji(true: np.ndarray, pred: np.ndarray) -> float:
    c, u = aji_counts(true, pred)
    return c / u if u else float("nan")


def dice_counts(true: np.ndarray, pred: np.ndarray) -> tuple[int, int]:
    """(|A ∩ B|, |A| + |B|) of the binary foregrounds."""
    _check(true, pred)
    a, b = true > 0, pred > 0
    return int((a & b).sum()), int(a.sum() + b.sum())


def dice(true: np.ndarray, pred: np.ndarray) -> float:
    i, s = dice_counts(true, pred)
    return 2 * i / s if s else float("nan")


def restrict(inst: np.ndarray, types: Mapping[int, int], t: int) -> np.ndarray:
    """The instance map keeping only the instances whose type is ``t``."""
    keep = np.array(sorted(i for i, ty in types.items() if ty == t and i != 0), dtype=np.int64)
    if len(keep) == 0:
        return np.zeros_like(inst)
    return np.where(np.isin(inst, keep), inst, 0)


def centroids(inst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, (n, 2) centres of mass as (row, col))`` of the instances of a map."""
    ids = np.unique(inst)
    ids = ids[ids != 0]
    if len(ids) == 0:
        return ids, np.zeros((0, 2))
    com = ndimage.center_of_mass(np.ones(inst.shape), inst, ids)
    return ids, np.asarray(com, float).reshape(-1, 2)


def pair_centroids(a: np.ndarray, b: np.ndarray, radius: float = PAIR_RADIUS
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(pairs (k, 2), unpaired_a, unpaired_b)`` as HoVer-Net's ``pair_coordinates``: the
    assignment of least total distance over *all* points, then pairs farther apart than
    ``radius`` are split again (so a near pair can be lost to the global optimum)."""
    if len(a) == 0 or len(b) == 0:
        return np.zeros((0, 2), int), np.arange(len(a)), np.arange(len(b))
    d = cdist(a, b)
    ia, ib = linear_sum_assignment(d)
    keep = d[ia, ib] <= radius
    pairs = np.stack([ia[keep], ib[keep]], 1)
    return (pairs, np.setdiff1d(np.arange(len(a)), ia[keep]),
            np.setdiff1d(np.arange(len(b)), ib[keep]))


@dataclass
class TypePairs:
    """Types of the centroid-paired and unpaired nuclei of one tile (type 0 = none)."""

    paired_true: np.ndarray
    paired_pred: np.ndarray
    unpaired_true: np.ndarray
    unpaired_pred: np.ndarray


def type_pairs(true: np.ndarray, pred: np.ndarray, true_types: Mapping[int, int] | None,
               pred_types: Mapping[int, int] | None, radius: float = PAIR_RADIUS
               ) -> TypePairs:
    t_ids, t_c = centroids(true)
    p_ids, p_c = centroids(pred)
    pairs, ut, up = pair_centroids(t_c, p_c, radius)
    tt = np.array([(true_types or {}).get(int(i), 0) for i in t_ids], np.int64)
    pt = np.array([(pred_types or {}).get(int(i), 0) for i in p_ids], np.int64)
    return TypePairs(tt[pairs[:, 0]], pt[pairs[:, 1]], tt[ut], pt[up])


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else float("nan")


def type_f1(pairs: Sequence[TypePairs], type_ids: Sequence[int]
            ) -> tuple[float, float, dict[int, float]]:
    """HoVer-Net's ``(F_d, type accuracy, {type: F_t})`` pooled over tiles."""
    def cat(name: str) -> np.ndarray:
        return (np.concatenate([getattr(p, name) for p in pairs]) if pairs
                else np.zeros(0, np.int64))

    pt, pp, ut, up = (cat(n) for n in ("paired_true", "paired_pred", "unpaired_true",
                                       "unpaired_pred"))
    f1_d = _ratio(2 * len(pt), 2 * len(pt) + len(up) + len(ut))
    acc = _ratio(float((pt == pp).sum()), len(pt))
    per = {}
    for t in type_ids:
        tp = int(((pt == t) & (pp == t)).sum())
        fp = int(((pt != t) & (pp == t)).sum())
        fn = int(((pt == t) & (pp != t)).sum())
        per[t] = _ratio(2 * tp, 2 * tp + 2 * fp + 2 * fn + int((up == t).sum())
                        + int((ut == t).sum()))
    return f1_d, acc, per


@dataclass
class SegmentationEvaluator:
    """Accumulates tiles; :meth:`result` summarises them every way at once.

    ``type_ids`` (e.g. ``{1: "other", 2: "inflammatory", ...}``) turns on the typed
    metrics; a tile then needs ``true_types`` and ``pred_types`` (instance id -> type id;
    a predicted instance missing from ``pred_types`` has no type).
    """

    type_ids: Mapping[int, str] | None = None
    radius: float = PAIR_RADIUS
    counts: list[PQCounts] = field(default_factory=list)
    aji: list[tuple[int, int]] = field(default_factory=list)
    dice: list[tuple[int, int]] = field(default_factory=list)
    type_counts: list[dict[int, PQCounts]] = field(default_factory=list)
    type_present: list[dict[int, bool]] = field(default_factory=list)
    pairs: list[TypePairs] = field(default_factory=list)

    def add(self, true: np.ndarray, pred: np.ndarray,
            true_types: Mapping[int, int] | None = None,
            pred_types: Mapping[int, int] | None = None) -> None:
        if self.type_ids and (true_types is None or pred_types is None):
            raise ValueError("typed metrics need true_types and pred_types for every tile")
        self.counts.append(pq_counts(true, pred))
        self.aji.append(aji_counts(true, pred))
        self.dice.append(dice_counts(true, pred))
        self.pairs.append(type_pairs(true, pred, true_types, pred_types, self.radius))
        if self.type_ids:
            assert true_types is not None and pred_types is not None
            per, present = {}, {}
            for t in self.type_ids:
                rt = restrict(true, true_types, t)
                per[t] = pq_counts(rt, restrict(pred, pred_types, t))
                present[t] = bool(rt.any())
            self.type_counts.append(per)
            self.type_present.append(present)

    def __len__(self) -> int:
        return len(self.counts)

    def result(self) -> dict[str, float]:
        """Every summary named in the module docstring (NaN where undefined)."""
        scored = [k for k, c in enumerate(self.counts) if c.tp + c.fn > 0]  # truth not empty
        out: dict[str, float] = {}
        for key in ("pq", "dq", "sq"):
            out[key] = _mean([getattr(self.counts[k], key) for k in scored])
        out["aji"] = _mean([_ratio(*self.aji[k]) for k in scored])
        out["dice"] = _mean([_ratio(2 * self.dice[k][0], self.dice[k][1]) for k in scored])
        tot = sum(self.counts, PQCounts())
        out.update(pq_pooled=tot.pq, dq_pooled=tot.dq, sq_pooled=tot.sq)
        c, u = (sum(v) for v in zip(*self.aji, strict=True)) if self.aji else (0, 0)
        out["aji_pooled"] = _ratio(c, u)
        i, s = (sum(v) for v in zip(*self.dice, strict=True)) if self.dice else (0, 0)
        out["dice_pooled"] = _ratio(2 * i, s)
        f1_d, acc, f1_t = type_f1(self.pairs, list(self.type_ids or ()))
        out["f1_d"] = f1_d
        if self.type_ids:
            out["type_acc"] = acc
            per_image = []  # PanNuke: per image, the types its truth holds
            for tc, pr in zip(self.type_counts, self.type_present, strict=True):
                vals = [tc[t].pq for t in self.type_ids if pr[t]]
                if vals:
                    per_image.append(float(np.mean(vals)))
            out["mpq"] = _mean(per_image)
            conic = []
            for t, name in self.type_ids.items():
                out[f"pq_type/{name}"] = _mean([tc[t].pq for tc, pr in
                                                zip(self.type_counts, self.type_present,
                                                    strict=True) if pr[t]])
                pooled = sum((tc[t] for tc in self.type_counts), PQCounts())
                conic.append(pooled.pq if pooled.defined else 0.0)  # CoNIC: absent -> 0
                out[f"pq_type_conic/{name}"] = conic[-1]
                out[f"f1_type/{name}"] = f1_t[t]
            out["mpq_conic"] = float(np.mean(conic)) if self.type_counts else float("nan")
        return out


def _mean(values: Sequence[float]) -> float:
    vals = [v for v in values if not np.isnan(v)]
    return float(np.mean(vals)) if vals else float("nan")


def evaluate(trues: Sequence[np.ndarray], preds: Sequence[np.ndarray],
             type_ids: Mapping[int, str] | None = None,
             true_types: Sequence[Mapping[int, int]] | None = None,
             pred_types: Sequence[Mapping[int, int]] | None = None,
             radius: float = PAIR_RADIUS) -> dict[str, float]:
    """All metrics over a test set in one call (see :class:`SegmentationEvaluator`);
    ``pq`` is the per-image mean, ``pq_pooled`` the pooled value."""
    if isinstance(type_ids, str):
        raise TypeError(f"evaluate(trues, preds, type_ids=...) got {type_ids!r}: every "
                        "aggregation is now returned at once ('pq' per image, "
                        "'pq_pooled' pooled); drop the aggregation argument")
    ev = SegmentationEvaluator(type_ids, radius)
    for k, (t, p) in enumerate(zip(trues, preds, strict=True)):
        ev.add(t, p, true_types[k] if true_types is not None else None,
               pred_types[k] if pred_types is not None else None)
    return ev.result()
