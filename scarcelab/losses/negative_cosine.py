"""Negative cosine similarity with a stop-gradient target (SimSiam's D, BYOL's regression).

SimSiam (Chen & He 2021, Eq. 1-2) and BYOL (Grill et al. 2020, Eq. 2) both regress a
*prediction* of one view onto a *target* of the other view and must not back-propagate
through the target: that stop-gradient is what keeps them from collapsing (SimSiam §4.1),
so it is applied here rather than trusted to every caller. BYOL's ``2 - 2·cos`` is
``2 + 2·negative_cosine``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def negative_cosine(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """``-mean_i cos(p[i], stopgrad(z[i]))``, in [-1, 1]; -1 when aligned."""
    if p.shape != z.shape or p.ndim != 2:
        raise ValueError(f"negative_cosine expects two (N, D) tensors, got {tuple(p.shape)}, "
                         f"{tuple(z.shape)}")
    return -F.cosine_similarity(p, z.detach(), dim=1).mean()
