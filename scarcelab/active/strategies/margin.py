"""Margin sampling: the smallest gap between the two most probable classes.

CDALBench found this simple uncertainty score among the strongest strategies across
domains; it is also the fallback of the greedy oracle.
"""

from __future__ import annotations

import numpy as np

from scarcelab.active import register_strategy
from scarcelab.active.base import QueryState, Strategy, top_q


def margin_scores(proba: np.ndarray) -> np.ndarray:
    """Top-1 minus top-2 probability (small = uncertain)."""
    part = np.sort(proba, axis=1)
    return part[:, -1] - part[:, -2]


@register_strategy("margin")
class MarginSampling(Strategy):
    def select(self, state: QueryState, q: int, rng: np.random.Generator) -> np.ndarray:
        p = state.model.predict_proba(state.x[state.candidates])
        return top_q(-margin_scores(p), q, state.candidates)
