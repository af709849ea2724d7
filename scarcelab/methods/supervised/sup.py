"""``sup``: cross-entropy on the labeled set only — the baseline every method must beat."""

from __future__ import annotations

from scarcelab.methods import Batch, Losses, Progress, SupervisedMethod, register
from scarcelab.methods.space import pow10


@register("sup")
class Supervised(SupervisedMethod):
    paper = "cross-entropy baseline (SSL-vs-SSL, Huang et al. 2024, App. F.1)"
    search_space = {"lr": pow10(3, -5, -2), "weight_decay": pow10(4, -6, -3)}
    defaults = {"lr": 3e-3, "weight_decay": 5e-4}
    batch_sizes = {"labeled": 64, "unlabeled": 0}

    def step(self, batch: Batch, progress: Progress) -> Losses:
        loss = self.labeled_loss(self.logits(batch.x[0]), batch.y)
        return {"loss": loss, "loss_labeled": loss}
