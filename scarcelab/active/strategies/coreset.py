"""Core-set (Sener & Savarese, 2018): greedy k-center on the classifier's embeddings.

Each pick is the candidate farthest from every labeled point and every earlier pick, which
minimises the covering radius of the labeled set — a pure diversity criterion.
"""

from __future__ import annotations

import numpy as np

from scarcelab.active import register_strategy
from scarcelab.active.base import QueryState, Strategy, k_center_greedy


@register_strategy("coreset")
class CoreSet(Strategy):
    def select(self, state: QueryState, q: int, rng: np.random.Generator) -> np.ndarray:
        pos = k_center_greedy(state.model.embed(state.x[state.candidates]),
                              state.model.embed(state.x[state.labeled]), q)
        return state.candidates[pos]
