"""``fixmatch`` (Sohn et al., NeurIPS 2020): pseudo-labels from a weak view, trained on a
strong view of the same image, kept only above a confidence threshold τ.

Defaults follow the paper (τ = 0.95, λU = 1, hard labels, T = 1); the search space is
SSL-vs-SSL App. F.1 (λU = 10^U(−1, 1), no warm-up). Labeled and both unlabeled views go
through the network in one concatenated pass so BatchNorm sees one joint batch.

``weak_no_grad`` (off by default; a speed lever): the weak view, which only yields
detached pseudo-labels, is forwarded separately under ``torch.no_grad()`` and only
labeled + strong go through the graph. That saves the weak third of the backward pass but
changes the mathematics: BatchNorm normalises the weak and the labeled+strong images with
separate batch statistics and updates its running statistics twice per step (as USB's
``use_cat=False`` path does). See docs/performance.md for the measured effect.
"""

from __future__ import annotations

import torch

from scarcelab.methods import Batch, Losses, Progress, PseudoTargets, SemiMethod, register
from scarcelab.methods._parts import confidence_mask, joint_forward, masked_cross_entropy
from scarcelab.methods.space import CLASSIFIER_DEFAULTS, CLASSIFIER_SPACE, pow10


@register("fixmatch")
class FixMatch(SemiMethod):
    paper = "Sohn et al. 2020, FixMatch, arXiv:2001.07685"
    has_pseudo_labels = True
    search_space = {
        **CLASSIFIER_SPACE,
        "lambda_u": pow10(1, -1, 1),
    }
    defaults = {**CLASSIFIER_DEFAULTS, "lambda_u": 1.0, "threshold": 0.95,
                "temperature": 1.0, "weak_no_grad": False}
    views = ("weak", "strong")

    def _targets(self, logits_weak: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mask, hard pseudo-labels) from the *weak* view's logits."""
        mask, pseudo, _ = confidence_mask(logits_weak, float(self.hp["threshold"]),
                                          float(self.hp["temperature"]))
        return mask, pseudo

    def _pseudo_targets(self, x: torch.Tensor, index: torch.Tensor | None) -> PseudoTargets:
        logits = self.logits(x)
        mask, pseudo = self._targets(logits)
        return PseudoTargets(logits, pseudo, mask)

    def step(self, batch: Batch, progress: Progress) -> Losses:
        x, (u_weak, u_strong) = batch.x[0], batch.u
        if self.hp["weak_no_grad"]:
            with torch.no_grad():
                l_w = self.logits(u_weak)
            l_x, l_s = joint_forward(self.logits, x, u_strong)
        else:
            l_x, l_w, l_s = joint_forward(self.logits, x, u_weak, u_strong)
        loss_l = self.labeled_loss(l_x, batch.y)
        mask, pseudo = self._targets(l_w)
        loss_u = masked_cross_entropy(l_s, pseudo, mask)
        return {
            "loss": loss_l + self.hp["lambda_u"] * loss_u,
            "loss_labeled": loss_l,
            "loss_unlabeled": loss_u,
            "mask_rate": mask.mean(),
        }
