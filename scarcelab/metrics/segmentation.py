"""Instance-segmentation metrics for nuclei: PQ = DQ x SQ, multi-class mPQ, AJI, Dice.

Definitions (numpy only; maps are integer instance maps, 0 = background, ids need not be
contiguous):

* **PQ** (Kirillov et al. 2019, "Panoptic Segmentation", eq. 1): a predicted and a true
  segment match when their IoU is *strictly* above 0.5; no segment can then match two
  (their Theorem 1), so matching needs no assignment step.
  ``DQ = TP / (TP + FP/2 + FN/2)``, ``SQ = sum of matched IoUs / TP``, ``PQ = DQ * SQ``.
  With no match, SQ is reported as 0 (so PQ = DQ * SQ still holds).
* **mPQ** (Graham et al. 2019 HoVer-Net; PanNuke, Gamper et al. 2020; CoNIC / Lizard,
  Graham et al. 2021): PQ of each nucleus type computed on the maps restricted to the
  instances of that type (true type / predicted type), then averaged over types.
* **AJI** (Kumar et al. 2017, IEEE TMI, Algorithm 1): every true nucleus G_i is paired
  with the predicted segment S_j of highest IoU (a segment may be chosen more than once);
  C += |G_i ∩ S_j|, U += |G_i ∪ S_j|; finally every predicted segment never chosen adds
  its area to U. AJI = C / U. A true nucleus overlapping no prediction adds |G_i| to U.
* **Dice**: 2|A ∩ B| / (|A| + |B|) of the binary foregrounds (HoVer-Net's "DICE1").

Aggregation over a test set, two conventions (both supported, ``aggregation=``):

* ``"pooled"`` (**the default**): TP, FP, FN and the IoU sum are summed over all tiles
  (per type for mPQ) before DQ/SQ/PQ are formed — CoNIC's multi-class PQ (Graham et al.
  2021, "CoNIC challenge" / Lizard). It is the right choice for small patches, where many
  tiles hold few or no nuclei of a type and a per-tile ratio is noisy or undefined. AJI is
  pooled the same way (sum of C over sum of U), Dice as the sum of intersections over the
  sum of areas.
* ``"image"``: the metric per tile, then the mean over tiles — HoVer-Net's reported binary
  PQ/AJI/Dice (mean over test images) and PanNuke's mPQ, which for a type skips the tiles
  with no true nucleus of that type. Tiles where the metric is 0/0 (no true and no
  predicted nucleus) are skipped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from scarcelab.errors import ConfigError

AGGREGATIONS = ("pooled", "image")
IOU_THRESHOLD = 0.5


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


@dataclass
class SegmentationEvaluator:
    """Accumulates tiles; :meth:`result` aggregates them either way.

    ``type_ids`` (e.g. ``{1: "other", 2: "inflammatory", ...}``) turns on mPQ; a tile then
    needs ``true_types`` and ``pred_types`` (instance id -> type id).
    """

    type_ids: Mapping[int, str] | None = None
    counts: list[PQCounts] = field(default_factory=list)
    aji: list[tuple[int, int]] = field(default_factory=list)
    dice: list[tuple[int, int]] = field(default_factory=list)
    type_counts: list[dict[int, PQCounts]] = field(default_factory=list)
    type_present: list[dict[int, bool]] = field(default_factory=list)

    def add(self, true: np.ndarray, pred: np.ndarray,
            true_types: Mapping[int, int] | None = None,
            pred_types: Mapping[int, int] | None = None) -> None:
        self.counts.append(pq_counts(true, pred))
        self.aji.append(aji_counts(true, pred))
        self.dice.append(dice_counts(true, pred))
        if self.type_ids:
            if true_types is None or pred_types is None:
                raise ValueError("mPQ needs true_types and pred_types for every tile")
            per, present = {}, {}
            for t in self.type_ids:
                rt = restrict(true, true_types, t)
                per[t] = pq_counts(rt, restrict(pred, pred_types, t))
                present[t] = bool(rt.any())
            self.type_counts.append(per)
            self.type_present.append(present)

    def __len__(self) -> int:
        return len(self.counts)

    def result(self, aggregation: str = "pooled") -> dict[str, float]:
        """``pq, dq, sq, aji, dice`` (+ ``mpq`` and ``pq_type/<name>`` with types)."""
        if aggregation not in AGGREGATIONS:
            raise ConfigError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
        out: dict[str, float] = {}
        if aggregation == "pooled":
            tot = sum(self.counts, PQCounts())
            out.update(pq=tot.pq, dq=tot.dq, sq=tot.sq)
            c, u = (sum(v) for v in zip(*self.aji, strict=True)) if self.aji else (0, 0)
            out["aji"] = c / u if u else float("nan")
            i, s = (sum(v) for v in zip(*self.dice, strict=True)) if self.dice else (0, 0)
            out["dice"] = 2 * i / s if s else float("nan")
        else:
            for key in ("pq", "dq", "sq"):
                out[key] = _mean([getattr(c, key) for c in self.counts if c.defined])
            out["aji"] = _mean([c / u for c, u in self.aji if u])
            out["dice"] = _mean([2 * i / s for i, s in self.dice if s])
        if self.type_ids:
            per_type = {}
            for t, name in self.type_ids.items():
                if aggregation == "pooled":
                    tot = sum((tc[t] for tc in self.type_counts), PQCounts())
                    per_type[name] = tot.pq
                else:  # PanNuke: a tile counts for type t only if it has a true t nucleus
                    per_type[name] = _mean([tc[t].pq for tc, pr in
                                            zip(self.type_counts, self.type_present,
                                                strict=True) if pr[t]])
                out[f"pq_type/{name}"] = per_type[name]
            out["mpq"] = _mean(list(per_type.values()))
        return out


def _mean(values: Sequence[float]) -> float:
    vals = [v for v in values if not np.isnan(v)]
    return float(np.mean(vals)) if vals else float("nan")


def evaluate(trues: Sequence[np.ndarray], preds: Sequence[np.ndarray],
             aggregation: str = "pooled", type_ids: Mapping[int, str] | None = None,
             true_types: Sequence[Mapping[int, int]] | None = None,
             pred_types: Sequence[Mapping[int, int]] | None = None) -> dict[str, float]:
    """All metrics over a test set in one call (see :class:`SegmentationEvaluator`)."""
    ev = SegmentationEvaluator(type_ids)
    for k, (t, p) in enumerate(zip(trues, preds, strict=True)):
        ev.add(t, p, true_types[k] if true_types is not None else None,
               pred_types[k] if pred_types is not None else None)
    return ev.result(aggregation)
