"""``mixup`` (Zhang et al., ICLR 2018): train on convex combinations of labeled images and
of their one-hot labels, ``lam ~ Beta(alpha, alpha)``; labeled data only.

The paper's default ``alpha = 1`` (lam uniform on [0, 1]) is the no-search default; the
search space is SSL-vs-SSL App. F.1 (alpha ~ U(0.1, 10)). ``loss_labeled`` is the loss
on the mixed batch, i.e. what is optimised, not the clean-batch cross-entropy.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F

from scarcelab.methods import Batch, Losses, Progress, SupervisedMethod, register
from scarcelab.methods._parts import mixup, mixup_draw
from scarcelab.methods.space import CLASSIFIER_DEFAULTS, CLASSIFIER_SPACE, Uniform


@register("mixup")
class Mixup(SupervisedMethod):
    paper = "Zhang et al. 2018, mixup: Beyond Empirical Risk Minimization, arXiv:1710.09412"
    search_space = {
        **CLASSIFIER_SPACE,
        "alpha": Uniform(0.1, 10.0),
    }
    defaults = {**CLASSIFIER_DEFAULTS, "alpha": 1.0}
    batch_sizes = {"labeled": 64, "unlabeled": 0}

    def host_draws(self, n_labeled: int, n_unlabeled: int) -> dict[str, Any] | None:
        return {"mixup": mixup_draw(float(self.hp["alpha"]), n_labeled)}

    def step(self, batch: Batch, progress: Progress) -> Losses:
        x, y = batch.x[0], batch.y
        onehot = F.one_hot(y, self.num_classes).float()
        drawn = batch.draws["mixup"] if batch.draws else None
        mixed_x, mixed_y, lam = mixup(x, onehot, float(self.hp["alpha"]), drawn=drawn)
        loss = self.labeled_soft_loss(self.logits(mixed_x), mixed_y)
        # new_full: a fill on the device; new_tensor would copy a host scalar there
        return {"loss": loss, "loss_labeled": loss, "mixup_lambda": loss.new_full((), lam)}
