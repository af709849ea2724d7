"""Mechanics shared by the self-supervised methods; each exists once, here.

Complements ``_parts.py`` (``ProjectionHead``, ``ema_update``, ``FeatureQueue``, which
semi-supervised methods use too) with what only the self-supervised zoo needs: the
predictor of BYOL/SimSiam, the momentum encoder and its schedule (MoCo, BYOL, DINO),
cosine-similarity prototypes (SwAV, DINO), Sinkhorn-Knopp (SwAV) and a collapse monitor.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from scarcelab.methods._parts import ProjectionHead, ema_update


def prediction_head(dim: int, hidden_dim: int) -> ProjectionHead:
    """The predictor q of BYOL / SimSiam: ``dim -> hidden -> dim`` (Linear-BN-ReLU-Linear).

    It is structurally a two-layer projection head mapping back to its input size; the
    asymmetry it adds between the two branches is what BYOL and SimSiam rely on to avoid
    collapse. SimSiam uses a bottleneck (``hidden_dim = dim / 4``), BYOL an expansion.
    """
    return ProjectionHead(dim, hidden_dim, dim, layers=2)


def momentum_copy(module: nn.Module) -> nn.Module:
    """A frozen deep copy to serve as a momentum (EMA) encoder: same initial weights,
    no gradients; updated only through :func:`ema_update`. Kept in the method's
    ``state_dict`` so a checkpoint restores it."""
    target = copy.deepcopy(module)
    for p in target.parameters():
        p.requires_grad_(False)
    return target


def momentum_at(base: float, fraction: float, schedule: str = "cosine") -> float:
    """EMA momentum at a point of training (``fraction`` in [0, 1]).

    ``cosine``: BYOL's schedule (Grill et al. 2020, §3.2), also used by DINO,
    ``1 - (1 - base)·(cos(π·fraction) + 1)/2``: rises from ``base`` to 1 so the target
    settles as training ends. ``constant``: MoCo's fixed momentum.
    """
    if schedule == "constant":
        return base
    if schedule != "cosine":
        raise ValueError(f"unknown momentum schedule {schedule!r}: cosine | constant")
    f = min(max(fraction, 0.0), 1.0)
    return 1.0 - (1.0 - base) * (math.cos(math.pi * f) + 1.0) / 2.0


@torch.no_grad()
def momentum_update(target: nn.Module, online: nn.Module, base: float, fraction: float,
                    schedule: str = "cosine") -> float:
    """Move ``target`` towards ``online`` with the scheduled momentum; returns it."""
    m = momentum_at(base, fraction, schedule)
    ema_update(target, online, m)
    return m


class CosinePrototypes(nn.Module):
    """Linear layer on L2-normalised inputs with L2-normalised weight rows.

    Outputs are cosine similarities in [-1, 1] to ``n`` learnable prototypes: SwAV's
    prototype layer (weights re-normalised every step, paper §4 / App. A) and DINO's
    weight-normalised last layer with its norm frozen at 1 (``norm_last_layer``), which
    the DINO authors found stabilises training. Normalising in the forward pass instead
    of in place after each step gives the same outputs and keeps the gradient projected
    onto the sphere.
    """

    def __init__(self, in_dim: int, n: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, in_dim))
        nn.init.normal_(self.weight, std=1.0 / math.sqrt(in_dim))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return F.normalize(z, dim=1) @ F.normalize(self.weight, dim=1).t()


@torch.no_grad()
def sinkhorn_knopp(scores: torch.Tensor, epsilon: float = 0.05,
                   iterations: int = 3) -> torch.Tensor:
    """Balanced soft assignments of N samples to K prototypes (SwAV, Caron et al. 2020, Eq. 3).

    Solves the entropy-regularised transport problem ``max Tr(Qᵀ CᵀZ) + ε H(Q)`` subject to
    every prototype receiving N/K of the mass, by alternately normalising rows and columns
    of ``exp(scores / ε)``. The equipartition constraint is what prevents SwAV's trivial
    solution (all samples on one prototype). Returns (N, K) codes whose rows sum to 1.
    Computed in the log domain: with sharp scores (``scores / ε`` spanning thousands) the
    plain ``exp`` form underflows to whole rows of zeros and returns NaN.
    """
    if scores.ndim != 2:
        raise ValueError(f"sinkhorn_knopp expects (N, K) scores, got {tuple(scores.shape)}")
    log_q = (scores.detach().float() / epsilon).t()  # (K, N), up to a constant
    k, n = log_q.shape
    for _ in range(iterations):
        # each prototype: total mass 1/K; then each sample: total mass 1/N
        log_q = log_q - torch.logsumexp(log_q, dim=1, keepdim=True) - math.log(k)
        log_q = log_q - torch.logsumexp(log_q, dim=0, keepdim=True) - math.log(n)
    return torch.exp(log_q + math.log(n)).t().to(scores.dtype)


@torch.no_grad()
def embedding_std(z: torch.Tensor) -> torch.Tensor:
    """Collapse monitor (SimSiam §4.1): mean per-dimension std of L2-normalised embeddings,
    times √D. About 1 for embeddings spread over the sphere, 0 when they collapse to a
    point; logged per step as ``train/emb_std``."""
    zn = F.normalize(z.detach().float(), dim=1)
    return zn.std(0).mean() * math.sqrt(zn.shape[1])
