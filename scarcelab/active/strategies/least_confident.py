"""Least-confidence sampling: the lowest probability of the predicted class."""

from __future__ import annotations

import numpy as np

from scarcelab.active import register_strategy
from scarcelab.active.base import QueryState, Strategy, top_q


@register_strategy("least_confident")
class LeastConfident(Strategy):
    def select(self, state: QueryState, q: int, rng: np.random.Generator) -> np.ndarray:
        p = state.model.predict_proba(state.x[state.candidates])
        return top_q(1.0 - p.max(1), q, state.candidates)
