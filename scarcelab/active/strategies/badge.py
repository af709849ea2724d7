"""BADGE (Ash et al., 2020): k-means++ seeding on hypothetical last-layer gradients.

The gradient of the cross-entropy w.r.t. the last layer's weights, at the predicted label,
is the outer product g = (p - e_ŷ) ⊗ h of the probability residual and the penultimate
activation h. BADGE picks diverse points with large gradients via k-means++ seeding (first
point: the largest gradient norm). The C·E-dimensional embeddings are never built: since
<g_i, g_j> = <a_i, a_j>·<h_i, h_j>, every distance needed comes from the small factors, so a
50,000 x 512 pool with 10 classes costs O(q·N·(C+E)) instead of a 1 GB embedding matrix.
"""

from __future__ import annotations

import numpy as np
import torch

from scarcelab.active import register_strategy
from scarcelab.active.base import QueryState, Strategy, sq_norms


def gradient_factors(proba: np.ndarray, emb: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, h) with g_i = a_i ⊗ h_i, a = p - onehot(argmax p)."""
    a = proba.astype(np.float32).copy()
    a[np.arange(len(a)), a.argmax(1)] -= 1.0
    return torch.from_numpy(a), torch.from_numpy(np.ascontiguousarray(emb, dtype=np.float32))


def kmeanspp_gradients(a: torch.Tensor, h: torch.Tensor, q: int,
                       rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeding over the implicit embeddings g_i = a_i ⊗ h_i; returns positions."""
    sq = sq_norms(a) * sq_norms(h)  # ||g_i||^2
    first = int(torch.argmax(sq))
    chosen = [first]
    d2 = (sq + sq[first] - 2.0 * (a @ a[first]) * (h @ h[first])).clamp_min_(0.0)
    d2[first] = 0.0
    taken = np.zeros(len(sq), dtype=bool)
    taken[first] = True
    for _ in range(q - 1):
        w = d2.double().numpy()
        w[taken] = 0.0
        total = w.sum()
        if total > 0 and np.isfinite(total):
            nxt = int(rng.choice(len(w), p=w / total))
        else:  # every remaining point duplicates a chosen one: any of them will do
            nxt = int(rng.choice(np.flatnonzero(~taken)))
        chosen.append(nxt)
        taken[nxt] = True
        dn = (sq + sq[nxt] - 2.0 * (a @ a[nxt]) * (h @ h[nxt])).clamp_min_(0.0)
        d2 = torch.minimum(d2, dn)
    return np.asarray(chosen, dtype=np.int64)


@register_strategy("badge")
class Badge(Strategy):
    def select(self, state: QueryState, q: int, rng: np.random.Generator) -> np.ndarray:
        xc = state.x[state.candidates]
        a, h = gradient_factors(state.model.predict_proba(xc), state.model.embed(xc))
        return state.candidates[kmeanspp_gradients(a, h, q, rng)]
