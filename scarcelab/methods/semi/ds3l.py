"""``ds3l`` (Guo et al., ICML 2020): safe semi-supervised learning when the unlabeled pool
may contain unseen classes — each unlabeled sample's consistency loss is weighted by a
small meta-network, trained so that the weighted step does not hurt the labeled loss.

Per step (the paper's bi-level problem, one-step approximation as in its code):

1. weights ``w = WNet(softmax f(u₂))`` (an MLP C→100→1 with a sigmoid, as the paper's
   code) for a Π-model consistency loss ``ℓ_i = mean_c (softmax f(u₁) − softmax f(u₂))²``
   whose target ``softmax f(u₂)`` is detached; WNet sees the target pass, as in the code
   (``wnet(out.softmax(1))`` with ``out`` the pass whose detached output is the target);
2. a virtual SGD step ``θ̂ = θ − η ∇θ (ℓL + λU Σ w_i ℓ_i / Σ w_i)`` kept differentiable in
   the WNet parameters (``torch.func.functional_call``, second-order);
3. one Adam step on WNet to lower the labeled cross-entropy at ``θ̂``;
4. the real loss with the updated weights (no gradient into WNet), which the shared loop
   back-propagates into the classifier.

Why Π-model style: the authors' ``MSE_Loss`` (train.py) compares ``model(x)`` with the
detached output of an earlier ``model(x)`` on the *same* batch; their WideResNet applies a
random flip / crop / Gaussian noise inside ``forward`` in training mode
(``transform_fn``, wideresnet.py; dropout plays that role in their MNIST CNN), so the two
passes see two random perturbations of each image — Laine & Aila's Π-model. Here the two
perturbations are two weak views drawn by the shared loop, which is the same thing with
scarcelab's augmentation pipeline.

Labeled consistency: the authors' loss is written ``cls_loss + coef * (Σ w ℓ / Σ w +
ssl_loss[:n_labeled].mean())`` (train.py at f19f3d0, in both the virtual and the real
step), but their ``MSE_Loss`` multiplies every row by ``unlabeled_mask``, which is 0 for
labeled rows, so that labeled term is identically zero — and the paper's bi-level
objective weights a regulariser on unlabeled data only. The default therefore leaves it out;
``labeled_consistency=True`` adds the Π-model term on a second weak view of the labeled
images (target: the detached prediction of the first), inside the virtual step too.

Defaults from the authors' code (train.py at f19f3d0, the last change to it): virtual step
η = ``--meta_lr`` 1e-3, WNet Adam lr ``--lr_wnet`` 6e-5 (an earlier version hard-coded
3e-4), λU = 10 with the ``exp(−5(1−t)²)`` ramp-up over the whole run. Search space:
SSL-vs-SSL's shared fixmatch ranges; the meta step sizes are kept fixed (the authors note
they "need to be carefully tuned for different settings" and give no range). Batch 64/64:
SSL-vs-SSL did not run DS3L, whose code uses equal labeled and unlabeled batches (50/50);
with a second-order meta step (about three forward/backward passes) a 448-image unlabeled
batch would also make it the slowest method by far.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from scarcelab.methods import Batch, Losses, Progress, PseudoTargets, SemiMethod, register
from scarcelab.methods._parts import joint_forward, sigmoid_rampup
from scarcelab.methods.space import CLASSIFIER_DEFAULTS, CLASSIFIER_SPACE, pow10


def weighted_mean(losses: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``Σ w ℓ / Σ w`` (the normalisation of DS3L's code); zero when all weights are 0."""
    norm = weights.sum()
    return (losses * weights).sum() / norm.clamp(min=1e-12)


@register("ds3l")
class DS3L(SemiMethod):
    paper = ("Guo et al. 2020, Safe Deep Semi-Supervised Learning for Unseen-Class Unlabeled "
             "Data, ICML (PMLR 119)")
    has_pseudo_labels = True
    search_space = {
        **CLASSIFIER_SPACE,
        "lambda_u": pow10(1, -1, 1),
    }
    defaults = {**CLASSIFIER_DEFAULTS, "lambda_u": 10.0, "warmup": 1.0,
                "meta_lr": 1e-3, "wnet_lr": 6e-5, "wnet_hidden": 100,
                "labeled_consistency": False}
    batch_sizes = {"labeled": 64, "unlabeled": 64}  # authors' code: 50/50; see docstring
    views = ("weak", "weak")

    def __init__(self, backbone: nn.Module, num_classes: int, hp: dict[str, Any]) -> None:
        super().__init__(backbone, num_classes, hp)
        if self.hp["labeled_consistency"]:  # a second labeled view for the Π-model term
            self.labeled_views = ("weak", "weak")
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

    @staticmethod
    def _consistency(logits: torch.Tensor, logits_target: torch.Tensor) -> torch.Tensor:
        """Per-sample Π-model term ``mean_c (softmax(logits) − softmax(target))²``; the
        target is detached (the authors' ``y.softmax(1).detach()``)."""
        target = torch.softmax(logits_target.detach(), dim=-1)
        return ((torch.softmax(logits, dim=-1) - target) ** 2).mean(dim=-1)

    def _weights(self, logits_target: torch.Tensor) -> torch.Tensor:
        return self.wnet(torch.softmax(logits_target.detach(), dim=-1)).squeeze(-1)

    @torch.no_grad()
    def _pseudo_targets(self, x: torch.Tensor, index: torch.Tensor | None) -> PseudoTargets:
        """DS3L has no pseudo-labels of its own; its filter is the learned weight, and the
        class a sample's consistency pulls it toward is its predicted class."""
        logits = self.logits(x)
        return PseudoTargets(logits, logits.argmax(dim=-1), self._weights(logits))

    def unlabeled_ramp(self, fraction: float) -> float | None:
        return sigmoid_rampup(fraction, float(self.hp["warmup"]))

    def step(self, batch: Batch, progress: Progress) -> Losses:
        x, (u1, u2) = batch.x[0], batch.u
        with_lc = bool(self.hp["labeled_consistency"])
        parts = [x, u1, u2] + ([batch.x[1]] if with_lc else [])
        outs = joint_forward(self.logits, *parts)
        l_x, l_u1, l_u2 = outs[:3]
        loss_l = self.labeled_loss(l_x, batch.y)
        per_sample = self._consistency(l_u1, l_u2)
        # Π-model term on labeled images (off by default: zero in the authors' code)
        loss_lc = self._consistency(outs[3], l_x).mean() if with_lc else loss_l.new_zeros(())
        coef = float(self.hp["lambda_u"]) * sigmoid_rampup(progress.fraction,
                                                           float(self.hp["warmup"]))

        if torch.is_grad_enabled():
            # virtual step, differentiable in the WNet parameters
            params = self._classifier_params()
            w = self._weights(l_u2)
            inner = loss_l + coef * (weighted_mean(per_sample, w) + loss_lc)
            grads = torch.autograd.grad(inner, list(params.values()), create_graph=True,
                                        allow_unused=True)
            lr = float(self.hp["meta_lr"])
            fast = {k: (p - lr * g if g is not None else p)
                    for (k, p), g in zip(params.items(), grads, strict=True)}
            meta_loss = self.labeled_loss(self._forward_with(fast, x), batch.y)
            wgrads = torch.autograd.grad(meta_loss, list(self.wnet.parameters()))
            for p, g in zip(self.wnet.parameters(), wgrads, strict=True):
                p.grad = g
            self.wnet_opt.step()
            for p in self.wnet.parameters():  # the shared optimiser must not step WNet
                p.grad = None
        with torch.no_grad():
            w = self._weights(l_u2)
        loss_u = weighted_mean(per_sample, w)
        out = {
            "loss": loss_l + coef * (loss_u + loss_lc),
            "loss_labeled": loss_l,
            "loss_unlabeled": loss_u,
            "weight_mean": w.mean(),
            "rampup": loss_l.new_full((), coef),  # a fill: no host-to-device copy
        }
        if with_lc:
            out["loss_consistency_labeled"] = loss_lc
        return out
