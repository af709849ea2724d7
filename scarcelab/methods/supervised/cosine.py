"""``cosine``: the one-hot cosine loss of Barz & Denzler (WACV 2020, "Deep Learning on
Small Datasets using Cosine Loss"; gem ``pipelines/cosineloss.py`` with ``xent_weight=0``):

    L = 1 − ⟨f(x)/‖f(x)‖, e_y⟩ = 1 − f(x)_y / ‖f(x)‖,

on the network output ``f(x) ∈ R^C`` (the classifier layer's output, no softmax); the
prediction is its arg-max, which is the class of largest cosine similarity. No method
hyperparameter beyond the common ones.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from scarcelab.methods import Batch, Losses, Progress, register
from scarcelab.methods.supervised._deic import DEICMethod


def one_hot_cosine_loss(output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean of ``1 − output[y] / ‖output‖`` (``eps`` guards an all-zero output)."""
    normed = F.normalize(output, dim=1, eps=1e-12)
    return (1.0 - normed.gather(1, labels[:, None]).squeeze(1)).mean()


@register("cosine")
class CosineLoss(DEICMethod):
    paper = ("Barz & Denzler 2020, Deep Learning on Small Datasets using Cosine Loss, "
             "arXiv:1901.09054")

    def step(self, batch: Batch, progress: Progress) -> Losses:
        loss = one_hot_cosine_loss(self.logits(batch.x[0]), batch.y)
        return {"loss": loss, "loss_labeled": loss}
