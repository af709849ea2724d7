"""``dsk``: dual selective kernel networks (Sun et al., ECCV 2020 VIPriors workshop,
"Visual Inductive Priors for Data-Efficient Image Classification" challenge entry;
gem ``pipelines/dsk``), trained with plain cross-entropy as in "Tune It or Don't Use It"
(which drops DSK's composite positive-class/cosine/centre loss).

A selective-kernel (SK) convolution (Li et al., CVPR 2019) runs M = 2 grouped 3×3
branches with dilation 1 and 2 (each conv → BN → ReLU), sums them, squeezes the sum by
global pooling into ``z = ReLU(BN(FC(s)))`` of size ``max(C/r, L)`` (r = 16, L = 32) and
mixes the branches with per-channel softmax attention over M. The *dual* block holds two
independent SK units: in training each forward pass uses one of them at random (a
Bernoulli(½) draw from the global RNG, seeded per trial), at inference their average —
gem's ``DSKWideBlock`` / ``DSKBottleneck``.

Deviations, stated: the dual selection is applied per 3×3 convolution of the base
architecture (so one file serves WRN, ResNet and ``small_cnn``) instead of per residual
block, and strided SK convolutions subsample directly instead of via BlurPool.
Groups: ``gcd(8, C_in, C_out)`` (gem uses 8 for WRN, 32 for ResNet).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from scarcelab.methods import Batch, Losses, Progress, register
from scarcelab.methods.supervised._deic import DEICMethod
from scarcelab.methods.supervised.harmonic import _replace

GROUPS, R, L, M = 8, 16, 32, 2


class SKConv(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, groups: int) -> None:
        super().__init__()
        self.branches = nn.ModuleList([
            nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1 + i, dilation=1 + i, groups=groups,
                                    bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=False))
            for i in range(M)])
        d = max(cout // R, L)
        self.squeeze = nn.Sequential(nn.Conv2d(cout, d, 1, bias=False), nn.BatchNorm2d(d),
                                     nn.ReLU(inplace=False))
        self.attend = nn.Conv2d(d, cout * M, 1)
        self.cout = cout

    def attention(self, feats: torch.Tensor) -> torch.Tensor:
        """Softmax over the M branches, per channel: (N, M, C, 1, 1)."""
        z = self.squeeze(F.adaptive_avg_pool2d(feats.sum(1), 1))
        return torch.softmax(self.attend(z).view(-1, M, self.cout, 1, 1), dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = torch.stack([b(x) for b in self.branches], dim=1)  # (N, M, C, H, W)
        return (feats * self.attention(feats)).sum(1)


class DualSK(nn.Module):
    def __init__(self, conv: nn.Conv2d) -> None:
        super().__init__()
        g = math.gcd(math.gcd(GROUPS, conv.in_channels), conv.out_channels)
        s = conv.stride[0]
        self.a = SKConv(conv.in_channels, conv.out_channels, s, g)
        self.b = SKConv(conv.in_channels, conv.out_channels, s, g)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            return self.a(x) if bool(torch.randint(0, 2, ()).item()) else self.b(x)
        return 0.5 * (self.a(x) + self.b(x))


def dual_selective_kernels(backbone: nn.Module) -> int:
    convs = [(n, m) for n, m in backbone.named_modules()
             if isinstance(m, nn.Conv2d) and m.kernel_size == (3, 3)]
    for name, conv in convs:
        _replace(backbone, name, DualSK(conv))
    return len(convs)


@register("dsk")
class DSK(DEICMethod):
    paper = ("Sun et al. 2020, Visual Inductive Priors for Data-Efficient Image "
             "Classification (DSK networks), ECCV Workshops")

    def __init__(self, backbone: nn.Module, num_classes: int, hp: dict[str, Any]) -> None:
        if dual_selective_kernels(backbone) == 0:
            raise ValueError("dsk: the backbone has no 3×3 convolution to convert")
        super().__init__(backbone, num_classes, hp)

    def step(self, batch: Batch, progress: Progress) -> Losses:
        loss = F.cross_entropy(self.logits(batch.x[0]), batch.y)
        return {"loss": loss, "loss_labeled": loss}
