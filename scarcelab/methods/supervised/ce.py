"""``ce``: the tuned cross-entropy baseline of "Tune It or Don't Use It" (Brigato et al.
2021; gem ``pipelines/xent.py``) — plain softmax cross-entropy, trained with SGD +
momentum 0.9 + cosine annealing like every method of the benchmark. Its point is that,
tuned with the same budget, it beats most specialised data-efficient methods."""

from __future__ import annotations

import torch.nn.functional as F

from scarcelab.methods import Batch, Losses, Progress, register
from scarcelab.methods.supervised._deic import DEICMethod


@register("ce")
class CrossEntropy(DEICMethod):
    paper = ("Brigato et al. 2021, Tune It or Don't Use It: Benchmarking Data-Efficient "
             "Image Classification, arXiv:2108.13122")

    def step(self, batch: Batch, progress: Progress) -> Losses:
        loss = F.cross_entropy(self.logits(batch.x[0]), batch.y)
        return {"loss": loss, "loss_labeled": loss}
