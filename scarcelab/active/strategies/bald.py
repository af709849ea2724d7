"""BALD (Houlsby et al.; Gal et al. 2017) with MC dropout.

Score = mutual information between prediction and weights, estimated from ``passes``
dropout forward passes: H[mean_t p_t] - mean_t H[p_t]. Points where the passes agree on an
uncertain answer (aleatoric noise) score low; points where they disagree score high. The
dropout masks come from the strategy RNG. The MC passes use the rate ``dropout`` whatever
the classifier trained with: the Table 7 classifiers train without dropout, and a rate of 0
would make every pass identical and the score 0.
"""

from __future__ import annotations

import numpy as np
import torch

from scarcelab.active import register_strategy
from scarcelab.active.base import QueryState, Strategy, entropy, top_q


def bald_scores(mc_proba: np.ndarray) -> np.ndarray:
    """``mc_proba``: (passes, N, C)."""
    return entropy(mc_proba.mean(0)) - entropy(mc_proba).mean(0)


@register_strategy("bald")
class BALD(Strategy):
    passes: int = 5
    dropout: float = 0.2

    def select(self, state: QueryState, q: int, rng: np.random.Generator) -> np.ndarray:
        gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
        mc = state.model.mc_predict_proba(state.x[state.candidates], self.passes, gen,
                                          p=self.dropout)
        return top_q(bald_scores(mc), q, state.candidates)
