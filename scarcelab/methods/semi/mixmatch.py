"""``mixmatch`` (Berthelot et al., NeurIPS 2019).

Per step: guess a label for each unlabeled image by averaging the model's predictions on
K = 2 weak augmentations and sharpening with T = 0.5 (Eq. 7); then mix up the whole
labeled + unlabeled batch with a random partner from the same pool, ``lam' = max(lam,
1 - lam)`` with ``lam ~ Beta(alpha, alpha)``; labeled loss is cross-entropy on the mixed
labeled part, unlabeled loss the MSE between predicted and mixed guessed distributions
(Eq. 4: mean over samples and classes). λU is ramped up linearly over the first 40 % of
the planned training (SSL-vs-SSL's setting for MixMatch: ``unlabeledloss_warmup_schedule_type
='Linear'``, ``unlabeledloss_warmup_pos=0.4`` of ``train_epoch=200`` in
tufts-ml/SSL-vs-SSL-benchmark runs/*/MixMatch/launch_experiment.sh, as for Mean Teacher and
Pseudo-Label). The MixMatch paper's own ramp (16k of 1M steps, 1.6 %) reached λU ≤ 750
within three epochs of a 200-epoch plan: on PneumoniaMNIST every 2-minute study collapsed
to the majority class (validation balanced accuracy 0.500 from epoch 1, test AUROC 0.89 and
0.94).

Defaults: the paper's CIFAR-10 values α = 0.75, λU = 75, T = 0.5. Search space:
SSL-vs-SSL App. F.1 (α ~ U(0.1, 1), λU = 7.5·10^U(0, 2)); batch 64/64.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from scarcelab.methods import Batch, Losses, Progress, PseudoTargets, SemiMethod, register
from scarcelab.methods._parts import linear_rampup, mixup, mixup_draw, sharpen
from scarcelab.methods.space import CLASSIFIER_DEFAULTS, CLASSIFIER_SPACE, Uniform, pow10


@register("mixmatch")
class MixMatch(SemiMethod):
    paper = "Berthelot et al. 2019, MixMatch, arXiv:1905.02249"
    has_pseudo_labels = True
    search_space = {
        **CLASSIFIER_SPACE,
        "alpha": Uniform(0.1, 1.0),
        "lambda_u": pow10(7.5, 0, 2),
    }
    defaults = {**CLASSIFIER_DEFAULTS, "alpha": 0.75, "lambda_u": 75.0,
                "temperature": 0.5, "warmup": 0.4}
    batch_sizes = {"labeled": 64, "unlabeled": 64}
    views = ("weak", "weak")  # K = 2 augmentations for label guessing

    def guess_labels(self, views: list[torch.Tensor]) -> torch.Tensor:
        """Sharpened mean prediction over the K augmentations; no gradient (a target)."""
        with torch.no_grad():
            n = len(views[0])
            probs = torch.softmax(self.logits(torch.cat(views)), dim=-1)
            mean = probs.view(len(views), n, -1).mean(dim=0)
            return sharpen(mean, float(self.hp["temperature"]))

    def _pseudo_targets(self, x: torch.Tensor, index: torch.Tensor | None) -> PseudoTargets:
        """The guessed label of the one given view; MixMatch keeps every guess (no
        confidence filter), so every weight is 1."""
        logits = self.logits(x)
        q = sharpen(torch.softmax(logits, dim=-1), float(self.hp["temperature"]))
        return PseudoTargets(logits, q.argmax(dim=-1), torch.ones(len(x), device=x.device))

    def host_draws(self, n_labeled: int, n_unlabeled: int) -> dict[str, Any] | None:
        n = n_labeled + len(self.views) * n_unlabeled  # the whole batch is mixed
        return {"mixup": mixup_draw(float(self.hp["alpha"]), n, keep_larger=True)}

    def unlabeled_ramp(self, fraction: float) -> float | None:
        return linear_rampup(fraction, float(self.hp["warmup"]))

    def step(self, batch: Batch, progress: Progress) -> Losses:
        x, us = batch.x[0], batch.u
        n_x = len(x)
        q = self.guess_labels(us)
        inputs = torch.cat([x, *us])
        targets = torch.cat([F.one_hot(batch.y, self.num_classes).float(), *([q] * len(us))])
        mixed_x, mixed_t, lam = mixup(inputs, targets, float(self.hp["alpha"]),
                                      keep_larger=True,
                                      drawn=batch.draws["mixup"] if batch.draws else None)
        logits = self.logits(mixed_x)
        loss_l = self.labeled_soft_loss(logits[:n_x], mixed_t[:n_x])
        loss_u = F.mse_loss(torch.softmax(logits[n_x:], dim=-1), mixed_t[n_x:])
        ramp = linear_rampup(progress.fraction, float(self.hp["warmup"]))
        return {
            "loss": loss_l + float(self.hp["lambda_u"]) * ramp * loss_u,
            "loss_labeled": loss_l,
            "loss_unlabeled": loss_u,
            "mixup_lambda": loss_l.new_full((), lam),  # fills: no host-to-device copy
            "rampup": loss_l.new_full((), ramp),
        }
