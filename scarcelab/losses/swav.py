"""SwAV's swapped prediction loss (Caron et al. 2020, Eq. 1-2).

Each view's prototype scores are turned into balanced soft codes by Sinkhorn-Knopp
(computed without gradient, by the caller); the loss asks each view to *predict the other
view's code* from its own scores: ``ℓ(z_t, q_s) = -Σ_k q_s^k log softmax(z_t / τ)^k``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def swapped_prediction(
    scores: list[torch.Tensor], codes: list[torch.Tensor], temperature: float
) -> torch.Tensor:
    """Mean over ordered pairs (s ≠ t) of the cross-entropy of view t's scores vs code s.

    ``scores[v]`` are (N, K) prototype similarities of view v, ``codes[v]`` their
    Sinkhorn codes (rows sum to 1). With two views this is
    ``(ℓ(z_2, q_1) + ℓ(z_1, q_2)) / 2``.
    """
    if len(scores) != len(codes) or len(scores) < 2:
        raise ValueError("swapped_prediction needs at least two views, one code per view")
    total = scores[0].new_zeros(())
    pairs = 0
    for s, q in enumerate(codes):
        for t, z in enumerate(scores):
            if s == t:
                continue
            total = total - (q.detach() * F.log_softmax(z / temperature, dim=1)).sum(1).mean()
            pairs += 1
    return total / pairs
