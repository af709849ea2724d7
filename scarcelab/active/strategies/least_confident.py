"""Least-confidence sampling: the lowest probability of the predicted class."""

from __future__ import annotations

import numpy as np

from scarcelab.active import register_strategy
from scarcelab.active.base import QueryState, Strategy, top_q
from scarcelab.active.strategies.margin import _COLUMN_PASSES_UP_TO


def row_max(p: np.ndarray) -> np.ndarray:
    """``p.max(1)``, one vectorised ``maximum`` per column: numpy's reduction along a short
    row axis runs a tiny loop per row (2.5 ms on 50,000 x 10, against 0.7 ms here); the
    maximum is exact, so the values are the same. Long rows (many classes) reduce well
    already, and column passes would be strided there."""
    p = np.asarray(p)
    if p.ndim != 2 or not 1 <= p.shape[1] <= _COLUMN_PASSES_UP_TO:
        return p.max(1)
    out = p[:, 0].copy()
    for j in range(1, p.shape[1]):
        np.maximum(out, p[:, j], out=out)
    return out


@register_strategy("least_confident")
class LeastConfident(Strategy):
    def select(self, state: QueryState, q: int, rng: np.random.Generator) -> np.ndarray:
        p = state.model.predict_proba(state.x[state.candidates])
        return top_q(1.0 - row_max(p), q, state.candidates)
