"""``meanteacher`` (Tarvainen & Valpola, NeurIPS 2017): the student's prediction on one
augmented view is pulled (MSE of class probabilities) toward the prediction of an
exponential-moving-average teacher on another view of the same image.

Defaults: EMA decay 0.999 (the paper's value after ramp-up; the teacher starts as the
running mean of the student, see ``EMATeacher``), λU = 8 (the centre of SSL-vs-SSL's
8·10^U(−1,1)), linear warm-up of λU over the first 40% of training (USB; the paper's
sigmoid ramp-up serves the same purpose: early teacher targets are noise). Both views
are weak (flip + crop) as in the paper. Predictions at evaluation come from the student,
as for every other method here, so results compare models trained the same way.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from scarcelab.methods import Batch, Losses, Progress, SemiMethod, register
from scarcelab.methods._parts import EMATeacher, joint_forward, linear_rampup
from scarcelab.methods.space import CLASSIFIER_DEFAULTS, CLASSIFIER_SPACE, pow10


@register("meanteacher")
class MeanTeacher(SemiMethod):
    paper = "Tarvainen & Valpola 2017, Mean teachers are better role models, arXiv:1703.01780"
    search_space = {
        **CLASSIFIER_SPACE,
        "lambda_u": pow10(8, -1, 1),
    }
    defaults = {**CLASSIFIER_DEFAULTS, "lambda_u": 8.0, "ema_decay": 0.999,
                "warmup": 0.4}
    batch_sizes = {"labeled": 64, "unlabeled": 64}
    views = ("weak", "weak")

    def __init__(self, backbone: nn.Module, num_classes: int, hp: dict[str, Any]) -> None:
        super().__init__(backbone, num_classes, hp)
        self.teacher = EMATeacher(self._student(), float(self.hp["ema_decay"]))

    def _student(self) -> nn.Module:
        # a view over the live modules (not registered, so nothing is counted twice)
        return nn.Sequential(self.backbone, self.head)

    def unlabeled_ramp(self, fraction: float) -> float | None:
        return linear_rampup(fraction, float(self.hp["warmup"]))

    def step(self, batch: Batch, progress: Progress) -> Losses:
        x, (u1, u2) = batch.x[0], batch.u
        l_x, l_u = joint_forward(self.logits, x, u1)
        loss_l = self.labeled_loss(l_x, batch.y)
        target = torch.softmax(self.teacher(u2), dim=-1)
        loss_u = F.mse_loss(torch.softmax(l_u, dim=-1), target)
        ramp = linear_rampup(progress.fraction, float(self.hp["warmup"]))
        return {
            "loss": loss_l + float(self.hp["lambda_u"]) * ramp * loss_u,
            "loss_labeled": loss_l,
            "loss_unlabeled": loss_u,
            "rampup": loss_l.new_full((), ramp),  # a fill: no host-to-device copy
        }

    def after_optimizer_step(self, progress: Progress) -> None:
        self.teacher.update(self._student(), progress.step)
