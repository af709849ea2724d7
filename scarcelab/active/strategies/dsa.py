"""Distance-based surprise adequacy (Kim et al., 2019) as an AL score.

For a candidate with predicted class c: dist_a = distance (in embedding space) to the
nearest labeled point x_a of class c; dist_b = distance from x_a to the nearest labeled
point of another class. DSA = dist_a / dist_b is high for points far from their predicted
class relative to how close that class comes to others — the surprising ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import numpy as np
import torch

from scarcelab.active import register_strategy
from scarcelab.active.base import QueryState, Strategy, sq_dists, top_q


def dsa_scores(emb_c: np.ndarray, pred: np.ndarray, emb_l: np.ndarray,
               y_l: np.ndarray) -> np.ndarray:
    c = torch.from_numpy(np.ascontiguousarray(emb_c, dtype=np.float32))
    lab = torch.from_numpy(np.ascontiguousarray(emb_l, dtype=np.float32))
    d_cl = sq_dists(c, lab).sqrt_()  # (Nc, L)
    d_ll = sq_dists(lab, lab).sqrt_()  # (L, L)
    y_l_t = torch.from_numpy(np.asarray(y_l))
    pred_t = torch.from_numpy(np.asarray(pred))
    same = pred_t[:, None] == y_l_t[None, :]
    d_same = torch.where(same, d_cl, torch.inf)
    dist_a, a_idx = d_same.min(1)
    other = y_l_t[a_idx][:, None] != y_l_t[None, :]
    dist_b = torch.where(other, d_ll[a_idx], torch.inf).min(1).values
    # No labeled point of the predicted class: maximally surprising. No other class: the
    # ratio is undefined, rank by dist_a alone.
    score = torch.where(torch.isinf(dist_a), torch.inf,
                        dist_a / torch.where(torch.isinf(dist_b), 1.0, dist_b.clamp_min(1e-12)))
    return score.numpy()


class SurpriseAdequacy(Strategy):
    """Shared by DSA and LSA: score candidates' embeddings against the labeled embeddings
    given the predicted class, query the most surprising."""

    #: (candidate embeddings, their predicted classes, labeled embeddings, labels) ->
    #: surprise per candidate; each subclass names its own.
    scores: ClassVar[Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray]]

    def select(self, state: QueryState, q: int, rng: np.random.Generator) -> np.ndarray:
        xc = state.x[state.candidates]
        pred = state.model.predict_proba(xc).argmax(1)
        s = type(self).scores(state.model.embed(xc), pred,
                              state.model.embed(state.x[state.labeled]), state.y_labeled)
        return top_q(s, q, state.candidates)


@register_strategy("dsa")
class DSA(SurpriseAdequacy):
    scores = staticmethod(dsa_scores)
