"""``simclr`` (Chen et al., ICML 2020): two SimCLR views per image, NT-Xent on an MLP
projection; classification by the per-epoch linear probe on the backbone features.

Search space from SSL-vs-SSL App. F.1 (lr 10^U(−4.5,−1.5), wd 10^U(−6.5,−3.5),
temperature U(0.07, 0.12)); the 2-layer head with a 128-d output follows the paper.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from scarcelab.losses import nt_xent
from scarcelab.methods import Batch, Losses, Progress, SelfSupMethod, register
from scarcelab.methods._parts import ProjectionHead
from scarcelab.methods.space import SELFSUP_SPACE, Uniform
from scarcelab.models import num_features


@register("simclr")
class SimCLR(SelfSupMethod):
    paper = "Chen et al. 2020, SimCLR, arXiv:2002.05709"
    search_space = {
        **SELFSUP_SPACE,
        "temperature": Uniform(0.07, 0.12),
    }
    defaults = {"lr": 1e-3, "weight_decay": 1e-6, "temperature": 0.1, "proj_dim": 128}
    views = ("simclr", "simclr")

    def __init__(self, backbone: nn.Module, num_classes: int, hp: dict[str, Any]) -> None:
        super().__init__(backbone, num_classes, hp)
        d = num_features(backbone)
        self.projector = ProjectionHead(d, d, int(self.hp["proj_dim"]))

    def step(self, batch: Batch, progress: Progress) -> Losses:
        v1, v2 = batch.u
        z = self.projector(self.backbone(torch.cat([v1, v2])))
        z1, z2 = z.split([len(v1), len(v2)])
        loss = nt_xent(z1, z2, self.hp["temperature"])
        return {"loss": loss, "loss_unlabeled": loss}
