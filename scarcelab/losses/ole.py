"""Orthogonal Low-rank Embedding loss (Lezama et al., CVPR 2018, Eq. 3; reference code
``OrthogonalLowrankEmbedding``; gem ``pipelines/ole.py``):

    L_ole = ( Σ_c max(Δ, ‖F_c‖_*) − ‖F‖_* ) / N,   Δ = 1,

with ``F_c`` the rows of the batch's features of class ``c`` and ``‖·‖_*`` the nuclear
norm. It shrinks every class to a low-rank subspace while keeping the union high-rank,
i.e. pushes classes onto orthogonal subspaces. The reference code back-propagates the
subgradient ``U Vᵀ`` of each nuclear norm (singular values below 1e-6 discarded);
autograd through ``torch.linalg.svdvals`` gives ``U Vᵀ`` too, and a class whose norm is at
or below Δ contributes the constant Δ and no gradient, as in the reference.
"""

from __future__ import annotations

import torch

DELTA = 1.0


def ole_loss(features: torch.Tensor, labels: torch.Tensor, delta: float = DELTA) -> torch.Tensor:
    """``(Σ_c max(Δ, ‖F_c‖_*) − ‖F‖_*) / N`` for features (N, D) and int labels (N,)."""
    n = features.shape[0]
    per_class = features.new_zeros(())
    for c in torch.unique(labels):
        nuc = torch.linalg.svdvals(features[labels == c]).sum()
        per_class = per_class + torch.clamp(nuc, min=delta)
    total = torch.linalg.svdvals(features).sum()
    return (per_class - total) / n
