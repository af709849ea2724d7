"""``dino`` (Caron et al., ICCV 2021): self-distillation with no labels. A student
(encoder + head) matches, by cross-entropy across views, the output of a momentum teacher
whose logits are centred (running mean subtracted) and sharpened (low temperature).

Search space from SSL-vs-SSL App. F.1: lr 10^U(−4.5,−1.5), wd 10^U(−6.5,−3.5), temperature
U(0.07, 0.12) — the *student* temperature (DINO's 0.1 lies in that range; the teacher's
0.04 does not), momentum U(0.99, 0.9999) as the teacher's base momentum, raised to 1 by a
cosine schedule. Fixed: teacher temperature 0.04, centre momentum 0.9; the centre starts
at the first batch's teacher mean (not 0, which would leave the first ~20 steps
uncentred). Two global views, no multi-crop; head MLP → 256-d bottleneck → cosine layer
with 1024 outputs (the paper's 65536 is sized for ImageNet).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from scarcelab.losses import dino_loss, update_center
from scarcelab.methods import Batch, Losses, Progress, SelfSupMethod, register
from scarcelab.methods._parts import ProjectionHead
from scarcelab.methods._ssl import (
    CosinePrototypes,
    embedding_std,
    momentum_copy,
    momentum_update,
)
from scarcelab.methods.space import SELFSUP_SPACE, Uniform
from scarcelab.models import num_features


@register("dino")
class DINO(SelfSupMethod):
    center: torch.Tensor  # a registered buffer
    center_ready: torch.Tensor  # a registered buffer
    paper = "Caron et al. 2021, DINO, arXiv:2104.14294"
    search_space = {
        **SELFSUP_SPACE,
        "temperature": Uniform(0.07, 0.12),
        "momentum": Uniform(0.99, 0.9999),
    }
    defaults = {"lr": 1e-3, "weight_decay": 1e-6, "temperature": 0.1, "momentum": 0.996,
                "teacher_temperature": 0.04, "center_momentum": 0.9, "out_dim": 1024,
                "bottleneck_dim": 256}
    views = ("simclr", "simclr")

    def __init__(self, backbone: nn.Module, num_classes: int, hp: dict[str, Any]) -> None:
        super().__init__(backbone, num_classes, hp)
        d, b, k = num_features(backbone), int(self.hp["bottleneck_dim"]), int(self.hp["out_dim"])
        self.head_mlp = ProjectionHead(d, 2 * d, b, layers=3)
        self.head_last = CosinePrototypes(b, k)
        self.teacher_backbone = momentum_copy(self.backbone)
        self.teacher_mlp = momentum_copy(self.head_mlp)
        self.teacher_last = momentum_copy(self.head_last)
        self.register_buffer("center", torch.zeros(1, k))
        self.register_buffer("center_ready", torch.zeros((), dtype=torch.bool))

    def step(self, batch: Batch, progress: Progress) -> Losses:
        v1, v2 = batch.u
        n = len(v1)
        x = torch.cat([v1, v2])
        h = self.head_mlp(self.backbone(x))
        student = self.head_last(h).split([n, n])
        with torch.no_grad():
            teacher = self.teacher_last(self.teacher_mlp(self.teacher_backbone(x))).split([n, n])
            # start the running centre at the first batch's mean instead of 0, so early
            # losses are not those of an uncentred teacher; chosen on the device (a
            # branch on center_ready would read it back every step)
            first = torch.cat([t.detach() for t in teacher]).mean(0, keepdim=True)
            self.center.copy_(torch.where(self.center_ready, self.center,
                                          first.reshape(self.center.shape)))
            self.center_ready.fill_(True)
        loss = dino_loss(list(student), list(teacher), self.center,
                         float(self.hp["temperature"]), float(self.hp["teacher_temperature"]))
        update_center(self.center, list(teacher), float(self.hp["center_momentum"]))
        return {"loss": loss, "loss_unlabeled": loss, "emb_std": embedding_std(h[:n])}

    def after_optimizer_step(self, progress: Progress) -> None:
        base = float(self.hp["momentum"])
        for t, s in ((self.teacher_backbone, self.backbone), (self.teacher_mlp, self.head_mlp),
                     (self.teacher_last, self.head_last)):
            momentum_update(t, s, base, progress.fraction)
