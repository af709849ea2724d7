"""``supcon`` (Khosla et al., NeurIPS 2020): supervised contrastive learning on two views
of each labeled image; every other view of the same class is a positive. Like the
self-supervised methods it has no classifier head: the per-epoch linear probe on the
frozen backbone features is the classifier.

Loss: SupCon "L_out" (the paper's Eq. 2, the variant it found best), temperature 0.1 (the
paper's value and the centre of SSL-vs-SSL's U(0.05, 0.15)); the 2-layer projection head
with a 128-d normalised output follows the paper. Batch 256 labeled images (App. F.1).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from scarcelab.methods import Batch, Losses, Progress, SupervisedMethod, register
from scarcelab.methods._parts import ProjectionHead
from scarcelab.methods.space import Uniform, pow10
from scarcelab.models import num_features


def supcon_loss(z: torch.Tensor, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    """Mean over anchors of ``-1/|P(i)| sum_p log softmax_{a != i}(z_i . z_a / T)_p``.

    ``z`` holds all views (rows need not be normalised); ``labels`` one label per row.
    Anchors without any positive (a class seen once, one view) are skipped rather than
    divided by zero.
    """
    z = F.normalize(z, dim=1)
    n = z.shape[0]
    self_mask = torch.eye(n, dtype=torch.bool, device=z.device)
    logits = (z @ z.t() / temperature).masked_fill(self_mask, float("-inf"))
    log_prob = logits - torch.logsumexp(logits, dim=1, keepdim=True)
    pos = (labels[:, None] == labels[None, :]) & ~self_mask
    n_pos = pos.sum(dim=1)
    per_anchor = -(log_prob.masked_fill(~pos, 0.0)).sum(dim=1) / n_pos.clamp(min=1)
    # the mean over anchors that have a positive, as a weighted sum (a boolean selection
    # and a branch on "any" would read the device back): 0, with a graph, when none has
    has_pos = (n_pos > 0).to(per_anchor.dtype)
    return (per_anchor * has_pos).sum() / has_pos.sum().clamp(min=1.0)


@register("supcon")
class SupCon(SupervisedMethod):
    paper = "Khosla et al. 2020, Supervised Contrastive Learning, arXiv:2004.11362"
    search_space = {
        "lr": pow10(3, -5.5, -1.5),
        "weight_decay": pow10(4, -7.5, -3.5),
        "temperature": Uniform(0.05, 0.15),
    }
    defaults = {"lr": 3e-3, "weight_decay": 1e-4, "temperature": 0.1, "proj_dim": 128}
    batch_sizes = {"labeled": 256, "unlabeled": 0}
    labeled_views = ("simclr", "simclr")
    linear_probe = True

    def __init__(self, backbone: nn.Module, num_classes: int, hp: dict[str, Any]) -> None:
        super().__init__(backbone, num_classes, hp)
        d = num_features(backbone)
        self.projector = ProjectionHead(d, d, int(self.hp["proj_dim"]))

    def step(self, batch: Batch, progress: Progress) -> Losses:
        v1, v2 = batch.x
        z = self.projector(self.backbone(torch.cat([v1, v2])))
        loss = supcon_loss(z, torch.cat([batch.y, batch.y]), float(self.hp["temperature"]))
        return {"loss": loss, "loss_labeled": loss}
