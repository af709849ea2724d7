"""``gradl2``: cross-entropy plus the grad-ℓ2 penalty of Bietti et al. (ICML 2019, "A
Kernel Perspective for Regularizing Deep Neural Networks"; gem ``pipelines/kernelregular.py``):

    L = CE + λ_grad · (1/n) Σ_i ‖∇_{x_i} ℓ(f(x_i), y_i)‖²,

the squared norm of the gradient of the per-sample cross-entropy with respect to the
*normalised* input — the tensor the network is fed after the dataset's channel
standardisation (gem ``XentAvgGradL2Loss.forward`` differentiates w.r.t. ``imgs``, the batch
after ``BasicAugmentation``'s ``tf.Normalize(channel_mean, channel_std)``). The shared loop
hands methods ``(x01 − 0.5) / 0.5`` and :class:`~scarcelab.models.standardize.Standardized`
maps that onto ``(x01 − mean) / std`` inside the backbone, so the gradient is taken after that
map: w.r.t. the loop input it would be scaled per channel by ``0.5 / std`` (the penalty by
``(0.5 / std)²``: ≈ 4× on ciFAIR-10's statistics, more on low-variance bands). Without a
``Standardized`` backbone the loop input is the network input. The gradient is
differentiated through (``create_graph``) so the penalty itself is minimised. As in the
benchmark, weight decay is disabled for this method (the penalty replaces it: its search
space pins ``weight_decay`` to 0) and batch normalisation is kept (gem default
``bn = True``). Range ``logU(1e-4, 1)`` around gem's default 0.01 is ours.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from scarcelab.methods import Batch, Losses, Progress, register
from scarcelab.methods.space import Choice, LogUniform
from scarcelab.methods.supervised._deic import LR, DEICMethod
from scarcelab.models.standardize import Standardized


def grad_l2_penalty(logits_fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                    y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean cross-entropy, ``Σ‖∇_x CE_sum‖² / n``), both differentiable in the weights."""
    xv = x.detach().requires_grad_(True)
    logits = logits_fn(xv)
    ce_sum = F.cross_entropy(logits, y, reduction="sum")
    (g,) = torch.autograd.grad(ce_sum, xv, create_graph=True)
    n = x.shape[0]
    return ce_sum / n, g.pow(2).sum() / n


def split_standardization(backbone: nn.Module
                          ) -> tuple[Callable[[torch.Tensor], torch.Tensor], nn.Module]:
    """(loop input -> normalised input, the network that takes the normalised input)."""
    if isinstance(backbone, Standardized):
        return backbone.standardize, backbone.net
    return (lambda x: x), backbone


@register("gradl2")
class GradL2(DEICMethod):
    paper = "Bietti et al. 2019, A Kernel Perspective for Regularizing DNNs, arXiv:1810.00363"
    search_space = {"lr": LR, "weight_decay": Choice((0.0,)),
                    "lambda_grad": LogUniform(1e-4, 1.0)}
    defaults = {"lr": 0.01, "weight_decay": 0.0, "lambda_grad": 0.01}

    def step(self, batch: Batch, progress: Progress) -> Losses:
        to_input, net = split_standardization(self.backbone)
        ce, pen = grad_l2_penalty(lambda z: self.head(net(z)), to_input(batch.x[0]), batch.y)
        loss = ce + float(self.hp["lambda_grad"]) * pen
        return {"loss": loss, "loss_labeled": ce.detach(), "grad_l2": pen.detach()}
