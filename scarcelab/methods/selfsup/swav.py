"""``swav`` (Caron et al., NeurIPS 2020): online clustering. Each view's projection is
scored against learnable prototypes; Sinkhorn-Knopp turns the scores into balanced soft
cluster codes, and each view predicts the *other* view's code (swapped prediction).

Two views only, no multi-crop and no feature queue, as in the SSL-vs-SSL study. Search
space from its App. F.1: lr 10^U(−4.5,−1.5), wd 10^U(−6.5,−3.5), temperature U(0.07, 0.12),
number of prototypes int 10^U(1, 3). ε = 0.05 and 3 Sinkhorn iterations follow the paper;
the default of 300 prototypes lies inside the study's range (the paper's 3000 does not).
Prototypes are frozen for the first ``freeze_prototypes_frac`` of training, as the paper
does for its first epoch, so that they are not pulled around by a random encoder.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from scarcelab.losses import swapped_prediction
from scarcelab.methods import Batch, Losses, Progress, SelfSupMethod, register
from scarcelab.methods._parts import ProjectionHead
from scarcelab.methods._ssl import CosinePrototypes, embedding_std, sinkhorn_knopp
from scarcelab.methods.space import SELFSUP_SPACE, Uniform, int_pow10
from scarcelab.models import num_features


@register("swav")
class SwAV(SelfSupMethod):
    paper = "Caron et al. 2020, SwAV, arXiv:2006.09882"
    search_space = {
        **SELFSUP_SPACE,
        "temperature": Uniform(0.07, 0.12),
        "n_prototypes": int_pow10(1, 3),
    }
    defaults = {"lr": 1e-3, "weight_decay": 1e-6, "temperature": 0.1, "n_prototypes": 300,
                "proj_dim": 128, "epsilon": 0.05, "sinkhorn_iterations": 3,
                "freeze_prototypes_frac": 0.01}
    views = ("simclr", "simclr")

    def __init__(self, backbone: nn.Module, num_classes: int, hp: dict[str, Any]) -> None:
        super().__init__(backbone, num_classes, hp)
        d, p = num_features(backbone), int(self.hp["proj_dim"])
        self.projector = ProjectionHead(d, d, p)
        self.prototypes = CosinePrototypes(p, int(self.hp["n_prototypes"]))

    def step(self, batch: Batch, progress: Progress) -> Losses:
        v1, v2 = batch.u
        n = len(v1)
        z = self.projector(self.backbone(torch.cat([v1, v2])))
        frozen = progress.fraction < float(self.hp["freeze_prototypes_frac"])
        self.prototypes.weight.requires_grad_(not frozen)
        scores = self.prototypes(z).split([n, n])
        eps, iters = float(self.hp["epsilon"]), int(self.hp["sinkhorn_iterations"])
        codes = [sinkhorn_knopp(s, eps, iters) for s in scores]
        loss = swapped_prediction(list(scores), codes, float(self.hp["temperature"]))
        return {"loss": loss, "loss_unlabeled": loss, "emb_std": embedding_std(z[:n])}
