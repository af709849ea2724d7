"""``moco`` (MoCo v2; He et al. CVPR 2020, Chen et al. 2020 arXiv:2003.04297): a query
encoder trained with InfoNCE against keys from a momentum key encoder, with a queue of
keys from earlier batches as negatives; MLP projection head (the v2 change).

Search space from SSL-vs-SSL App. F.1: lr 10^U(−4.5,−1.5), wd 10^U(−6.5,−3.5), temperature
U(0.07, 0.12), momentum U(0.99, 0.9999) (constant, as in MoCo). Two choices for small data
and one device: the loss is symmetrised (each view is once query, once key), which uses
both forward passes of a step; the queue holds at most half the unlabeled pool (default
4096 in the paper for CIFAR), since on a small pool a longer queue mostly holds stale keys
of the very images in the batch (false negatives); the current batch's other keys are
negatives too, so the first step (empty queue) already has a signal. MoCo's shuffled
BatchNorm targets multi-GPU leakage and is not reproduced on one device.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from scarcelab.losses import info_nce
from scarcelab.methods import Batch, DataInfo, Losses, Progress, SelfSupMethod, register
from scarcelab.methods._parts import FeatureQueue, ProjectionHead
from scarcelab.methods._ssl import embedding_std, momentum_copy, momentum_update
from scarcelab.methods.space import SELFSUP_SPACE, Uniform
from scarcelab.models import num_features


@register("moco")
class MoCo(SelfSupMethod):
    paper = "He et al. 2020, MoCo, arXiv:1911.05722; Chen et al. 2020, MoCo v2, arXiv:2003.04297"
    search_space = {
        **SELFSUP_SPACE,
        "temperature": Uniform(0.07, 0.12),
        "momentum": Uniform(0.99, 0.9999),
    }
    defaults = {"lr": 1e-3, "weight_decay": 1e-6, "temperature": 0.1, "momentum": 0.999,
                "proj_dim": 128, "queue_size": 4096}
    views = ("simclr", "simclr")

    def __init__(self, backbone: nn.Module, num_classes: int, hp: dict[str, Any]) -> None:
        super().__init__(backbone, num_classes, hp)
        d, p = num_features(backbone), int(self.hp["proj_dim"])
        self.projector = ProjectionHead(d, d, p)
        self.key_backbone = momentum_copy(self.backbone)
        self.key_projector = momentum_copy(self.projector)
        self.queue = FeatureQueue(int(self.hp["queue_size"]), p)
        self._pending: torch.Tensor | None = None

    def on_train_start(self, info: DataInfo) -> None:
        size = max(1, min(int(self.hp["queue_size"]), info.n_unlabeled // 2))
        if size != self.queue.size:
            self.queue = FeatureQueue(size, self.queue.feats.shape[1]).to(self.queue.feats.device)

    def step(self, batch: Batch, progress: Progress) -> Losses:
        v1, v2 = batch.u
        n = len(v1)
        q1, q2 = self.projector(self.backbone(torch.cat([v1, v2]))).split([n, n])
        with torch.no_grad():
            k1, k2 = self.key_projector(self.key_backbone(torch.cat([v1, v2]))).split([n, n])
        negatives, _ = self.queue.get()
        t = float(self.hp["temperature"])
        loss = 0.5 * (info_nce(q1, k2, negatives, t) + info_nce(q2, k1, negatives, t))
        self._pending = torch.cat([k1, k2]).detach()  # enqueued after the optimiser step:
        # the loss graph still reads the queue buffer, so it must not change before backward
        return {"loss": loss, "loss_unlabeled": loss, "emb_std": embedding_std(q1)}

    def after_optimizer_step(self, progress: Progress) -> None:
        momentum_update(self.key_backbone, self.backbone, float(self.hp["momentum"]),
                        progress.fraction, schedule="constant")
        momentum_update(self.key_projector, self.projector, float(self.hp["momentum"]),
                        progress.fraction, schedule="constant")
        if self._pending is not None:
            self.queue.push(torch.nn.functional.normalize(self._pending, dim=1))
            self._pending = None
