"""``cosine_ce``: cosine loss + cross-entropy (Barz & Denzler, WACV 2020, §3.3; gem
``CosineXentModel`` / ``OneHotCosineXentLoss``). An extra layer sits on top of the cosine
embedding: ``e = f(x)/‖f(x)‖`` (C-dimensional), ``logits = W · BN(ReLU(e)) + b``, and

    L = (1 − e_y) + λ_xent · CE(logits, y)   (:mod:`scarcelab.losses.cosine_ce`).

Prediction uses the extra layer's logits (what gem's model returns first). ``λ_xent``
(gem ``xent_weight``; the paper uses 0.1) is searched in ``logU(0.01, 10)`` — our range.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from scarcelab.losses.cosine_ce import cosine_ce_loss
from scarcelab.methods import Batch, Losses, Progress, register
from scarcelab.methods.space import LogUniform
from scarcelab.methods.supervised._deic import COMMON_DEFAULTS, COMMON_SPACE, DEICMethod
from scarcelab.models import num_features


class CosineCEHead(nn.Module):
    """``embed`` (features -> C), then normalise -> ReLU -> BatchNorm1d -> Linear(C, C)."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.embed = nn.Linear(in_features, num_classes)
        self.bn = nn.BatchNorm1d(num_classes)
        self.fc = nn.Linear(num_classes, num_classes)

    def embedding(self, feats: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.embed(feats), dim=1, eps=1e-12)

    def classify(self, emb: torch.Tensor) -> torch.Tensor:
        return self.fc(self.bn(torch.relu(emb)))

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        return self.classify(self.embedding(feats))


@register("cosine_ce")
class CosineCE(DEICMethod):
    paper = ("Barz & Denzler 2020, Deep Learning on Small Datasets using Cosine Loss, "
             "arXiv:1901.09054")
    search_space = {**COMMON_SPACE, "xent_weight": LogUniform(0.01, 10.0)}
    defaults = {**COMMON_DEFAULTS, "xent_weight": 0.1}

    def __init__(self, backbone: nn.Module, num_classes: int, hp: dict[str, Any]) -> None:
        super().__init__(backbone, num_classes, hp)
        self.head = CosineCEHead(num_features(backbone), num_classes)

    def step(self, batch: Batch, progress: Progress) -> Losses:
        emb = self.head.embedding(self.backbone(batch.x[0]))
        loss, cos, ce = cosine_ce_loss(emb, self.head.classify(emb), batch.y,
                                       float(self.hp["xent_weight"]))
        return {"loss": loss, "loss_labeled": loss.detach(), "cosine": cos.detach(),
                "xent": ce.detach()}
