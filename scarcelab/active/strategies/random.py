"""Uniform random sampling: the baseline every AL strategy has to beat."""

from __future__ import annotations

import numpy as np

from scarcelab.active import register_strategy
from scarcelab.active.base import QueryState, Strategy


@register_strategy("random")
class RandomSampling(Strategy):
    max_candidates = None  # subsampling first would only waste random numbers

    def select(self, state: QueryState, q: int, rng: np.random.Generator) -> np.ndarray:
        return rng.choice(state.candidates, q, replace=False)
