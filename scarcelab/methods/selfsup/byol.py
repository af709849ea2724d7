"""``byol`` (Grill et al., NeurIPS 2020): an online network (encoder, projector, predictor)
regresses the projection of the other view made by a target network, the target being a
momentum (EMA) copy of the online encoder and projector. No negatives.

Search space from SSL-vs-SSL App. F.1: lr 10^U(−4.5,−1.5), wd 10^U(−6.5,−3.5), base
momentum τ U(0.99, 0.9999), raised to 1 by BYOL's cosine schedule. The study's table also
lists a temperature for BYOL; BYOL's loss has none, so it is left out. Heads are scaled to
the backbone (hidden = 2·features, 256-d projection; the paper uses 4096/256 on ResNet-50).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from scarcelab.losses import negative_cosine
from scarcelab.methods import Batch, Losses, Progress, SelfSupMethod, register
from scarcelab.methods._parts import ProjectionHead
from scarcelab.methods._ssl import (
    embedding_std,
    momentum_copy,
    momentum_update,
    prediction_head,
)
from scarcelab.methods.space import SELFSUP_SPACE, Uniform
from scarcelab.models import num_features


@register("byol")
class BYOL(SelfSupMethod):
    paper = "Grill et al. 2020, BYOL, arXiv:2006.07733"
    search_space = {
        **SELFSUP_SPACE,
        "momentum": Uniform(0.99, 0.9999),
    }
    defaults = {"lr": 1e-3, "weight_decay": 1e-6, "momentum": 0.996, "proj_dim": 256}
    views = ("simclr", "simclr")

    def __init__(self, backbone: nn.Module, num_classes: int, hp: dict[str, Any]) -> None:
        super().__init__(backbone, num_classes, hp)
        d, p = num_features(backbone), int(self.hp["proj_dim"])
        self.projector = ProjectionHead(d, 2 * d, p)
        self.predictor = prediction_head(p, 2 * d)
        self.target_backbone = momentum_copy(self.backbone)
        self.target_projector = momentum_copy(self.projector)

    def step(self, batch: Batch, progress: Progress) -> Losses:
        v1, v2 = batch.u
        n = len(v1)
        z = self.projector(self.backbone(torch.cat([v1, v2])))
        p1, p2 = self.predictor(z).split([n, n])
        with torch.no_grad():
            t1, t2 = self.target_projector(self.target_backbone(torch.cat([v1, v2]))).split([n, n])
        # 2 - 2·cos per direction, averaged over the two directions
        loss = 2.0 + negative_cosine(p1, t2) + negative_cosine(p2, t1)
        return {"loss": loss, "loss_unlabeled": loss, "emb_std": embedding_std(z[:n])}

    def after_optimizer_step(self, progress: Progress) -> None:
        base = float(self.hp["momentum"])
        momentum_update(self.target_backbone, self.backbone, base, progress.fraction)
        momentum_update(self.target_projector, self.projector, base, progress.fraction)
