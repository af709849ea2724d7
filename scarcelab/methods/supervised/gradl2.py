"""``gradl2``: cross-entropy plus the grad-ℓ2 penalty of Bietti et al. (ICML 2019, "A
Kernel Perspective for Regularizing Deep Neural Networks"; gem ``pipelines/kernelregular.py``):

    L = CE + λ_grad · (1/n) Σ_i ‖∇_{x_i} ℓ(f(x_i), y_i)‖²,

the squared norm of the gradient of the per-sample cross-entropy with respect to the
(normalised) input, differentiated through (``create_graph``) so the penalty itself is
minimised. As in the benchmark, weight decay is disabled for this method (the penalty
replaces it: its search space pins ``weight_decay`` to 0) and batch normalisation is kept
(gem default ``bn = True``). Range ``logU(1e-4, 1)`` around gem's default 0.01 is ours.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from scarcelab.methods import Batch, Losses, Progress, register
from scarcelab.methods.space import Choice, LogUniform
from scarcelab.methods.supervised._deic import LR, DEICMethod


def grad_l2_penalty(logits_fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                    y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean cross-entropy, ``Σ‖∇_x CE_sum‖² / n``), both differentiable in the weights."""
    xv = x.detach().requires_grad_(True)
    logits = logits_fn(xv)
    ce_sum = F.cross_entropy(logits, y, reduction="sum")
    (g,) = torch.autograd.grad(ce_sum, xv, create_graph=True)
    n = x.shape[0]
    return ce_sum / n, g.pow(2).sum() / n


@register("gradl2")
class GradL2(DEICMethod):
    paper = "Bietti et al. 2019, A Kernel Perspective for Regularizing DNNs, arXiv:1810.00363"
    search_space = {"lr": LR, "weight_decay": Choice((0.0,)),
                    "lambda_grad": LogUniform(1e-4, 1.0)}
    defaults = {"lr": 0.01, "weight_decay": 0.0, "lambda_grad": 0.01}

    def step(self, batch: Batch, progress: Progress) -> Losses:
        ce, pen = grad_l2_penalty(self.logits, batch.x[0], batch.y)
        loss = ce + float(self.hp["lambda_grad"]) * pen
        return {"loss": loss, "loss_labeled": ce.detach(), "grad_l2": pen.detach()}
