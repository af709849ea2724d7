"""Entropy sampling: the highest Shannon entropy of the predicted class distribution."""

from __future__ import annotations

import numpy as np

from scarcelab.active import register_strategy
from scarcelab.active.base import QueryState, Strategy, entropy, top_q


@register_strategy("entropy")
class EntropySampling(Strategy):
    def select(self, state: QueryState, q: int, rng: np.random.Generator) -> np.ndarray:
        p = state.model.predict_proba(state.x[state.candidates])
        return top_q(entropy(p), q, state.candidates)
