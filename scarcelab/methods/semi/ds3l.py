"""``ds3l`` (Guo et al., ICML 2020): safe semi-supervised learning when the unlabeled pool
may contain unseen classes — each unlabeled sample's consistency loss is weighted by a
small meta-network, trained so that the weighted step does not hurt the labeled loss.

Per step (the paper's bi-level problem, one-step approximation as in its code):

1. weights ``w = WNet(softmax(f(u₁)))`` (an MLP C→100→1 with a sigmoid, as the paper's
   code) for a Π-model consistency loss ``ℓ_i = mean_c (softmax f(u₂) − softmax f(u₁)ᵀ)²``
   between two weak views (the second's prediction is the detached target);
2. a virtual SGD step ``θ̂ = θ − η ∇θ (ℓL + λU Σ w_i ℓ_i / Σ w_i)`` kept differentiable in
   the WNet parameters (``torch.func.functional_call``, second-order);
3. one Adam step on WNet to lower the labeled cross-entropy at ``θ̂``;
4. the real loss with the updated weights (no gradient into WNet), which the shared loop
   back-propagates into the classifier.

Defaults from the authors' code: virtual step η = 1e-3, WNet Adam lr 3e-4, λU = 10 with
the ``exp(−5(1−t)²)`` ramp-up over the whole run. Search space: SSL-vs-SSL's shared
fixmatch ranges; the meta step sizes are kept fixed (the authors note they need care and
give no range). Batch 64/64: SSL-vs-SSL did not run DS3L, whose code uses equal labeled
and unlabeled batches (50/50); with a second-order meta step (about three
forward/backward passes) a 448-image unlabeled batch would also make it the slowest
method by far.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from scarcelab.methods import Batch, Losses, Progress, SemiMethod, register
from scarcelab.methods._parts import sigmoid_rampup
from scarcelab.methods.space import pow10


def weighted_mean(losses: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``Σ w ℓ / Σ w`` (the normalisation of DS3L's code); zero when all weights are 0."""
    norm = weights.sum()
    return (losses * weights).sum() / norm.clamp(min=1e-12)


@register("ds3l")
class DS3L(SemiMethod):
    paper = ("Guo et al. 2020, Safe Deep Semi-Supervised Learning for Unseen-Class Unlabeled "
             "Data, ICML (PMLR 119)")
    search_space = {
        "lr": pow10(3, -5, -2),
        "weight_decay": pow10(4, -6, -3),
        "lambda_u": pow10(1, -1, 1),
    }
    defaults = {"lr": 3e-3, "weight_decay": 5e-4, "lambda_u": 10.0, "warmup": 1.0,
                "meta_lr": 1e-3, "wnet_lr": 3e-4, "wnet_hidden": 100}
    batch_sizes = {"labeled": 64, "unlabeled": 64}  # authors' code: 50/50; see docstring
    views = ("weak", "weak")

    def __init__(self, backbone: nn.Module, num_classes: int, hp: dict[str, Any]) -> None:
        super().__init__(backbone, num_classes, hp)
        hidden = int(self.hp["wnet_hidden"])
        self.wnet = nn.Sequential(nn.Linear(num_classes, hidden), nn.ReLU(inplace=True),
                                  nn.Linear(hidden, 1), nn.Sigmoid())
        self.wnet_opt = torch.optim.Adam(self.wnet.parameters(), lr=float(self.hp["wnet_lr"]))

    def _classifier_params(self) -> dict[str, torch.Tensor]:
        return {**{f"backbone.{k}": v for k, v in self.backbone.named_parameters()},
                **{f"head.{k}": v for k, v in self.head.named_parameters()}}

    def _forward_with(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """Logits under substituted parameters; BatchNorm statistics go to throw-away copies
        so the virtual step leaves the real running statistics untouched."""
        def sub(prefix: str, module: nn.Module) -> dict[str, torch.Tensor]:
            p = {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}
            b = {k: v.clone() for k, v in module.named_buffers()}
            return {**p, **b}

        feats = functional_call(self.backbone, sub("backbone.", self.backbone), (x,))
        return functional_call(self.head, sub("head.", self.head), (feats,))

    def _unlabeled_terms(self, logits_u1: torch.Tensor, logits_u2: torch.Tensor
                         ) -> torch.Tensor:
        target = torch.softmax(logits_u2.detach(), dim=-1)
        return ((torch.softmax(logits_u1, dim=-1) - target) ** 2).mean(dim=-1)

    def step(self, batch: Batch, progress: Progress) -> Losses:
        x, (u1, u2) = batch.x[0], batch.u
        sizes = [len(x), len(u1), len(u2)]
        l_x, l_u1, l_u2 = self.logits(torch.cat([x, u1, u2])).split(sizes)
        loss_l = F.cross_entropy(l_x, batch.y)
        per_sample = self._unlabeled_terms(l_u1, l_u2)
        coef = float(self.hp["lambda_u"]) * sigmoid_rampup(progress.fraction,
                                                           float(self.hp["warmup"]))
        probs_u = torch.softmax(l_u1.detach(), dim=-1)

        if torch.is_grad_enabled():
            # virtual step, differentiable in the WNet parameters
            params = self._classifier_params()
            w = self.wnet(probs_u).squeeze(-1)
            inner = loss_l + coef * weighted_mean(per_sample, w)
            grads = torch.autograd.grad(inner, list(params.values()), create_graph=True,
                                        allow_unused=True)
            lr = float(self.hp["meta_lr"])
            fast = {k: (p - lr * g if g is not None else p)
                    for (k, p), g in zip(params.items(), grads, strict=True)}
            meta_loss = F.cross_entropy(self._forward_with(fast, x), batch.y)
            wgrads = torch.autograd.grad(meta_loss, list(self.wnet.parameters()))
            for p, g in zip(self.wnet.parameters(), wgrads, strict=True):
                p.grad = g
            self.wnet_opt.step()
            for p in self.wnet.parameters():  # the shared optimiser must not step WNet
                p.grad = None
        with torch.no_grad():
            w = self.wnet(probs_u).squeeze(-1)
        loss_u = weighted_mean(per_sample, w)
        return {
            "loss": loss_l + coef * loss_u,
            "loss_labeled": loss_l,
            "loss_unlabeled": loss_u,
            "weight_mean": w.mean(),
            "rampup": loss_l.new_tensor(coef),
        }
