"""Margin sampling: the smallest gap between the two most probable classes.

CDALBench found this simple uncertainty score among the strongest strategies across
domains; it is also the fallback of the greedy oracle.
"""

from __future__ import annotations

import numpy as np

from scarcelab.active import register_strategy
from scarcelab.active.base import QueryState, Strategy, top_q

#: Class counts up to which a pass per column beats sorting the rows (measured on 50,000
#: rows: 10 classes 1.5 ms against 4 ms).
_COLUMN_PASSES_UP_TO = 16


def margin_scores(proba: np.ndarray) -> np.ndarray:
    """Top-1 minus top-2 probability (small = uncertain).

    The two largest values of each row come from one pass over the C columns, each a
    vectorised max / min over all N rows, instead of sorting every row: max and min are
    exact, so the values equal a full sort's (``np.sort(p)[:, -1] - np.sort(p)[:, -2]``,
    ties included) at a third of the cost on a 50,000 x 10 pool. Many classes make the
    column passes strided and slow; there a partial sort (exact as well) does it."""
    p = np.asarray(proba)
    if p.ndim != 2 or not 2 <= p.shape[1] <= _COLUMN_PASSES_UP_TO:
        part = np.sort(p, axis=1) if p.ndim != 2 or p.shape[1] < 2 else np.partition(
            p, p.shape[1] - 2, axis=1)  # odd shapes keep the old behaviour (and error)
        return part[:, -1] - part[:, -2]
    top1 = p[:, 0].copy()
    top2 = np.full(p.shape[0], -np.inf, dtype=p.dtype)
    for j in range(1, p.shape[1]):
        col = p[:, j]
        np.maximum(top2, np.minimum(top1, col), out=top2)
        np.maximum(top1, col, out=top1)
    return top1 - top2


@register_strategy("margin")
class MarginSampling(Strategy):
    def select(self, state: QueryState, q: int, rng: np.random.Generator) -> np.ndarray:
        p = state.model.predict_proba(state.x[state.candidates])
        return top_q(-margin_scores(p), q, state.candidates)
