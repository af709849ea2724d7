"""``barlowtwins`` (Zbontar et al., ICML 2021): the cross-correlation matrix of two views'
batch-standardised projections is driven towards the identity (invariance on the
diagonal, redundancy reduction off it). No negatives, no momentum encoder, no temperature.

Search space from SSL-vs-SSL App. F.1: lr 10^U(−4.5,−1.5), wd 10^U(−6.5,−3.5). The study's
table also lists a temperature and a momentum for Barlow Twins; it has neither, so both are
left out. λ = 5·10⁻³ (the paper's 5.1·10⁻³ rounded, as in common reimplementations); the
projector is 512-512-512 instead of the paper's 8192³, sized for CPU and 28x28 images.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from scarcelab.losses import barlow_twins
from scarcelab.methods import Batch, Losses, Progress, SelfSupMethod, register
from scarcelab.methods._parts import ProjectionHead
from scarcelab.methods._ssl import embedding_std
from scarcelab.methods.space import SELFSUP_SPACE
from scarcelab.models import num_features


@register("barlowtwins")
class BarlowTwins(SelfSupMethod):
    paper = "Zbontar et al. 2021, Barlow Twins, arXiv:2103.03230"
    search_space = dict(SELFSUP_SPACE)
    defaults = {"lr": 1e-3, "weight_decay": 1e-6, "lambd": 5e-3, "proj_dim": 512}
    views = ("simclr", "simclr")

    def __init__(self, backbone: nn.Module, num_classes: int, hp: dict[str, Any]) -> None:
        super().__init__(backbone, num_classes, hp)
        p = int(self.hp["proj_dim"])
        self.projector = ProjectionHead(num_features(backbone), p, p, layers=3)

    def step(self, batch: Batch, progress: Progress) -> Losses:
        v1, v2 = batch.u
        n = len(v1)
        z1, z2 = self.projector(self.backbone(torch.cat([v1, v2]))).split([n, n])
        loss = barlow_twins(z1, z2, float(self.hp["lambd"]))
        return {"loss": loss, "loss_unlabeled": loss, "emb_std": embedding_std(z1)}
