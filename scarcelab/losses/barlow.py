"""Barlow Twins' redundancy-reduction loss (Zbontar et al. 2021, Eq. 1).

The cross-correlation between the batch-standardised embeddings of two views is pushed
towards the identity: the diagonal towards 1 (invariance to the augmentations), the
off-diagonal towards 0 (decorrelated, hence non-redundant, dimensions). Standardising over
the batch is what rules out the constant solution without negatives or a momentum encoder.
"""

from __future__ import annotations

import torch


def barlow_twins(z1: torch.Tensor, z2: torch.Tensor, lambd: float,
                 eps: float = 1e-5) -> torch.Tensor:
    """``Σ_i (1 - C_ii)² + λ Σ_{i≠j} C_ij²`` with ``C = z1ᵀ z2 / N`` of standardised z.

    Standardisation uses the biased batch variance (as BatchNorm without affine in the
    paper's reference code), so a perfectly correlated pair gives ``C_ii = 1`` exactly.
    """
    if z1.shape != z2.shape or z1.ndim != 2 or z1.shape[0] < 2:
        raise ValueError(f"barlow_twins expects two (N >= 2, D) tensors, got "
                         f"{tuple(z1.shape)}, {tuple(z2.shape)}")
    n = z1.shape[0]

    def standardise(z: torch.Tensor) -> torch.Tensor:
        return (z - z.mean(0)) / torch.sqrt(z.var(0, unbiased=False) + eps)

    c = standardise(z1).t() @ standardise(z2) / n
    diag = torch.diagonal(c)
    on = (1.0 - diag).pow(2).sum()
    off = c.pow(2).sum() - diag.pow(2).sum()
    return on + lambd * off
