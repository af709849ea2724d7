"""``softmatch`` (Chen et al., ICLR 2023): FixMatch's hard threshold replaced by a soft
weight per unlabeled sample, ``λ(p) = exp(−(max(p) − μ)² / (2σ²/n²))`` for confidences
below μ and 1 above, a Gaussian truncated at the mean, where μ and σ² are EMAs (m = 0.999)
of the batch mean and unbiased variance of the confidence — so almost every sample
contributes (high quantity) while unsure ones are down-weighted (high quality).

Uniform alignment (UA): the predictions are aligned toward the uniform class
distribution with an EMA (0.999) of the model's mean prediction before the confidences
that set the *weights* are taken, which keeps the weights from favouring the classes the
model already prefers. The *pseudo-labels* come from the unaligned prediction, as in the
reference code (USB semilearn/algorithms/softmatch/softmatch.py, ``gen_ulb_targets`` is
called on ``logits_x_ulb_w`` with the comment "uniform alignment in softmatch do not use
aligned probs for generating pseudo labels").

Initial values, as in the reference code: the alignment's running model marginal starts
from the *first batch's* mean prediction (USB ``DistAlignEMAHook``: ``p_model`` is
``None`` until the first update, which sets it to the batch mean; see
``DistributionAlignment``), while the Gaussian's running statistics start at μ₀ = 1/C,
σ²₀ = 1 (USB ``SoftMatchWeightingHook.__init__``: ``prob_max_mu_t = 1/num_classes``,
``prob_max_var_t = 1.0``) and are EMA-updated from there, the first batch included. A
large σ²₀ keeps early weights near 1 (quantity first while the statistics are still
uninformative); unlike the alignment marginal, the reference code does not re-initialise
them from the first batch, so neither does this one.

Defaults are the paper's / USB's, identical across its benchmarks: n = 2 (``n_sigma``),
m = 0.999, μ₀ = 1/C, σ²₀ = 1, hard pseudo-labels, λU = 1. Search space: SSL-vs-SSL's
shared fixmatch ranges; SoftMatch's own parameters stay at those fixed values because the
paper uses them unchanged on every dataset and gives no range to draw from.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from scarcelab.methods import Batch, Losses, Progress, PseudoTargets, SemiMethod, register
from scarcelab.methods._parts import DistributionAlignment, joint_forward, masked_cross_entropy
from scarcelab.methods.space import CLASSIFIER_DEFAULTS, CLASSIFIER_SPACE, pow10


class TruncatedGaussianWeight(nn.Module):
    """SoftMatch's sample weight from running confidence statistics (paper Eq. 7-8)."""

    mu: torch.Tensor  # a registered buffer
    var: torch.Tensor  # a registered buffer

    def __init__(self, num_classes: int, momentum: float, n_sigma: float) -> None:
        super().__init__()
        self.momentum = momentum
        self.n_sigma = n_sigma
        self.register_buffer("mu", torch.tensor(1.0 / num_classes))
        self.register_buffer("var", torch.tensor(1.0))

    @torch.no_grad()
    def forward(self, conf: torch.Tensor, update: bool = True) -> torch.Tensor:
        """Weights of ``conf``; with ``update`` the running statistics first take in this
        batch (the reference order), without it they are only read."""
        m = self.momentum
        if update:
            self.mu.mul_(m).add_(conf.mean(), alpha=1.0 - m)
            if conf.numel() > 1:
                self.var.mul_(m).add_(conf.var(unbiased=True), alpha=1.0 - m)
        below = (conf - self.mu).clamp(max=0.0)
        return torch.exp(-(below**2) / (2.0 * self.var / self.n_sigma**2))


@register("softmatch")
class SoftMatch(SemiMethod):
    paper = "Chen et al. 2023, SoftMatch, arXiv:2301.10921"
    has_pseudo_labels = True
    search_space = {
        **CLASSIFIER_SPACE,
        "lambda_u": pow10(1, -1, 1),
    }
    defaults = {**CLASSIFIER_DEFAULTS, "lambda_u": 1.0, "n_sigma": 2.0,
                "ema": 0.999, "uniform_alignment": True}
    views = ("weak", "strong")

    def __init__(self, backbone: nn.Module, num_classes: int, hp: dict[str, Any]) -> None:
        super().__init__(backbone, num_classes, hp)
        m = float(self.hp["ema"])
        self.align = DistributionAlignment(num_classes, momentum=m)
        self.weighting = TruncatedGaussianWeight(num_classes, m, float(self.hp["n_sigma"]))

    @torch.no_grad()
    def _targets(self, logits_weak: torch.Tensor, update: bool
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """(hard pseudo-labels of the unaligned prediction, truncated-Gaussian weights of
        the aligned confidence). ``update=False`` reads the running statistics only."""
        probs = torch.softmax(logits_weak.detach(), dim=-1)
        pseudo = probs.argmax(dim=-1)
        if self.hp["uniform_alignment"]:
            probs = self.align(probs, update=update)
        return pseudo, self.weighting(probs.max(dim=-1).values, update=update)

    def _pseudo_targets(self, x: torch.Tensor, index: torch.Tensor | None) -> PseudoTargets:
        logits = self.logits(x)
        pseudo, weight = self._targets(logits, update=False)
        return PseudoTargets(logits, pseudo, weight)

    def step(self, batch: Batch, progress: Progress) -> Losses:
        x, (u_weak, u_strong) = batch.x[0], batch.u
        l_x, l_w, l_s = joint_forward(self.logits, x, u_weak, u_strong)
        loss_l = self.labeled_loss(l_x, batch.y)
        pseudo, weight = self._targets(l_w, update=True)
        loss_u = masked_cross_entropy(l_s, pseudo, weight)
        return {
            "loss": loss_l + float(self.hp["lambda_u"]) * loss_u,
            "loss_labeled": loss_l,
            "loss_unlabeled": loss_u,
            "weight_mean": weight.mean(),
            "confidence_mu": self.weighting.mu.detach().clone(),
        }
