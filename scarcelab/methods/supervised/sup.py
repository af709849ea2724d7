"""``sup``: cross-entropy on the labeled set only — the baseline every method must beat."""

from __future__ import annotations

from scarcelab.methods import Batch, Losses, Progress, SupervisedMethod, register
from scarcelab.methods.space import CLASSIFIER_DEFAULTS, CLASSIFIER_SPACE


@register("sup")
class Supervised(SupervisedMethod):
    paper = "cross-entropy baseline (SSL-vs-SSL, Huang et al. 2024, App. F.1)"
    search_space = dict(CLASSIFIER_SPACE)
    defaults = dict(CLASSIFIER_DEFAULTS)
    batch_sizes = {"labeled": 64, "unlabeled": 0}

    def step(self, batch: Batch, progress: Progress) -> Losses:
        loss = self.labeled_loss(self.logits(batch.x[0]), batch.y)
        return {"loss": loss, "loss_labeled": loss}
