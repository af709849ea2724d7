"""``simsiam`` (Chen & He, CVPR 2021): two views through one encoder and projector; a
predictor on one branch regresses the other branch's projection under a stop-gradient.
No negatives, no momentum encoder: the stop-gradient alone prevents collapse (paper §4.1).

Search space from SSL-vs-SSL App. F.1: lr 10^U(−4.5,−1.5), wd 10^U(−6.5,−3.5); SimSiam has
neither temperature nor momentum. Projector output ends in BatchNorm as in the paper; the
predictor has the paper's 4x bottleneck; widths are scaled to the backbone (projection =
features; the paper uses 2048 on ResNet-50).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from scarcelab.losses import negative_cosine
from scarcelab.methods import Batch, Losses, Progress, SelfSupMethod, register
from scarcelab.methods._parts import ProjectionHead
from scarcelab.methods._ssl import embedding_std, prediction_head
from scarcelab.methods.space import SELFSUP_SPACE
from scarcelab.models import num_features


@register("simsiam")
class SimSiam(SelfSupMethod):
    paper = "Chen & He 2021, SimSiam, arXiv:2011.10566"
    search_space = dict(SELFSUP_SPACE)
    defaults = {"lr": 1e-3, "weight_decay": 1e-5}
    views = ("simclr", "simclr")

    def __init__(self, backbone: nn.Module, num_classes: int, hp: dict[str, Any]) -> None:
        super().__init__(backbone, num_classes, hp)
        d = num_features(backbone)
        self.projector = nn.Sequential(ProjectionHead(d, d, d), nn.BatchNorm1d(d))
        self.predictor = prediction_head(d, max(1, d // 4))

    def step(self, batch: Batch, progress: Progress) -> Losses:
        v1, v2 = batch.u
        n = len(v1)
        z = self.projector(self.backbone(torch.cat([v1, v2])))
        p1, p2 = self.predictor(z).split([n, n])
        z1, z2 = z.split([n, n])
        loss = 0.5 * (negative_cosine(p1, z2) + negative_cosine(p2, z1))
        return {"loss": loss, "loss_unlabeled": loss, "emb_std": embedding_std(z1)}
