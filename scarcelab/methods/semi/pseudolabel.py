"""``pseudolabel`` (Lee, ICML-W 2013): the network's own hard predictions on unlabeled
images become targets, kept only above a confidence threshold τ.

As in USB's and SSL-vs-SSL's version: one weakly augmented view (prediction and target
come from the same forward pass, the target detached), τ = 0.95, and λU ramped up
linearly over the first 40% of training (Lee's α(t) schedule also starts at 0, since
early pseudo-labels are mostly wrong). Search space: App. F.1 (λU = 10^U(−1, 1)).
"""

from __future__ import annotations

import torch

from scarcelab.methods import Batch, Losses, Progress, PseudoTargets, SemiMethod, register
from scarcelab.methods._parts import (
    confidence_mask,
    joint_forward,
    linear_rampup,
    masked_cross_entropy,
)
from scarcelab.methods.space import CLASSIFIER_DEFAULTS, CLASSIFIER_SPACE, pow10


@register("pseudolabel")
class PseudoLabel(SemiMethod):
    paper = ("Lee 2013, Pseudo-Label: The Simple and Efficient Semi-Supervised Learning "
             "Method for Deep Neural Networks, ICML Workshop")
    has_pseudo_labels = True
    search_space = {
        **CLASSIFIER_SPACE,
        "lambda_u": pow10(1, -1, 1),
    }
    defaults = {**CLASSIFIER_DEFAULTS, "lambda_u": 1.0, "threshold": 0.95,
                "warmup": 0.4}
    batch_sizes = {"labeled": 64, "unlabeled": 64}
    views = ("weak",)

    def _pseudo_targets(self, x: torch.Tensor, index: torch.Tensor | None) -> PseudoTargets:
        logits = self.logits(x)
        mask, pseudo, _ = confidence_mask(logits, float(self.hp["threshold"]))
        return PseudoTargets(logits, pseudo, mask)

    def unlabeled_ramp(self, fraction: float) -> float | None:
        return linear_rampup(fraction, float(self.hp["warmup"]))

    def step(self, batch: Batch, progress: Progress) -> Losses:
        x, u = batch.x[0], batch.u[0]
        l_x, l_u = joint_forward(self.logits, x, u)
        loss_l = self.labeled_loss(l_x, batch.y)
        mask, pseudo, _ = confidence_mask(l_u, float(self.hp["threshold"]))
        loss_u = masked_cross_entropy(l_u, pseudo, mask)
        ramp = linear_rampup(progress.fraction, float(self.hp["warmup"]))
        return {
            "loss": loss_l + float(self.hp["lambda_u"]) * ramp * loss_u,
            "loss_labeled": loss_l,
            "loss_unlabeled": loss_u,
            "mask_rate": mask.mean(),
            "rampup": loss_l.new_full((), ramp),  # a fill: no host-to-device copy
        }
