"""``tvmf``: t-vMF similarity (Kobayashi, CVPR 2021, "T-vMF Similarity for Regularizing
Intra-Class Feature Distribution"; reference code github.com/tk1980/tvMF, gem
``pipelines/tvmf.py``). The classifier is a bias-free linear layer whose weights and inputs
are L2-normalised; the cosine ``c`` between feature and class weight becomes

    φ_κ(c) = (1 + c) / (1 + κ(1 − c)) − 1,

which for κ = 0 is the cosine itself and for larger κ is sharper around ``c = 1``, so
samples are pulled more compactly to their class direction. The loss is cross-entropy on
``s · φ_κ`` with a learned scale ``s = 1 + softplus(ŝ)`` (ŝ initialised at 0), as in the
reference code. κ is searched in U(0, 64) (κ ∈ {0, 4, 16, 64} in the paper's experiments,
16 the default) — our range.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from scarcelab.methods import Batch, Losses, Progress, register
from scarcelab.methods.space import Uniform
from scarcelab.methods.supervised._deic import COMMON_DEFAULTS, COMMON_SPACE, DEICMethod
from scarcelab.models import num_features


def tvmf_similarity(cosine: torch.Tensor, kappa: float) -> torch.Tensor:
    return (1.0 + cosine) / (1.0 + kappa * (1.0 - cosine)) - 1.0


class TvMFHead(nn.Module):
    """Normalised linear layer + t-vMF similarity; ``forward`` returns φ_κ (no scale, the
    arg-max is the same), ``scale`` the learned ``s`` used in the loss."""

    def __init__(self, in_features: int, num_classes: int, kappa: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_classes, in_features))
        nn.init.kaiming_uniform_(self.weight, a=5 ** 0.5)  # nn.Linear's initialisation
        self.s_raw = nn.Parameter(torch.zeros(()))
        self.kappa = float(kappa)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        cos = F.linear(F.normalize(feats, dim=1, eps=1e-12),
                       F.normalize(self.weight, dim=1, eps=1e-12))
        return tvmf_similarity(cos, self.kappa)

    @property
    def scale(self) -> torch.Tensor:
        return 1.0 + F.softplus(self.s_raw)


@register("tvmf")
class TvMF(DEICMethod):
    paper = ("Kobayashi 2021, T-vMF Similarity for Regularizing Intra-Class Feature "
             "Distribution, CVPR")
    search_space = {**COMMON_SPACE, "kappa": Uniform(0.0, 64.0)}
    defaults = {**COMMON_DEFAULTS, "kappa": 16.0}

    def __init__(self, backbone: nn.Module, num_classes: int, hp: dict[str, Any]) -> None:
        super().__init__(backbone, num_classes, hp)
        self.head = TvMFHead(num_features(backbone), num_classes, float(self.hp["kappa"]))

    def step(self, batch: Batch, progress: Progress) -> Losses:
        sim = self.logits(batch.x[0])
        loss = F.cross_entropy(sim * self.head.scale, batch.y)
        return {"loss": loss, "loss_labeled": loss, "scale": self.head.scale.detach()}
