"""NT-Xent, the normalised temperature-scaled cross-entropy of SimCLR (Chen et al. 2020).

For 2N projections (two views of N samples) each view's positive is the other view of
the same sample and its negatives are the remaining 2N-2 projections. Written as one
cross-entropy over a (2N, 2N-1) similarity matrix so that it is a single fused kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def nt_xent(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """Mean NT-Xent over all 2N anchors; ``z1[i]`` and ``z2[i]`` are the positive pair."""
    if z1.shape != z2.shape or z1.ndim != 2:
        raise ValueError(f"nt_xent expects two (N, D) tensors, got {tuple(z1.shape)}, "
                         f"{tuple(z2.shape)}")
    n = z1.shape[0]
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    sim = z @ z.t() / temperature
    sim = sim.masked_fill(torch.eye(2 * n, dtype=torch.bool, device=z.device), float("-inf"))
    # n..2n-1, 0..n-1, made on the device (a host arange would be copied every step)
    targets = (torch.arange(2 * n, device=z.device) + n) % (2 * n)
    return F.cross_entropy(sim, targets)
