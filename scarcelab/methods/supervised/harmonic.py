"""``harmonic``: harmonic networks (Ulicny, Krylov & Dahyot, BMVC 2019; reference code
github.com/matej-ulicny/harmonic-networks, gem ``pipelines/harmonic.py``). Every k×k
convolution (k > 1) of the base architecture becomes a learned combination of fixed 2D
DCT-II filters: the filter of output o and input i is ``Σ_m w[o, i, m] · D_m`` with the
k² DCT basis filters ``D_m(x, y) = cos(π(x+½)u/k) cos(π(y+½)v/k)`` (ℓ1-normalised, as
gem's ``dct_filters(l1_norm=True)``). The first convolution becomes the "harmonic block
with BN": each input channel is filtered by the DCT bank (depthwise), the k²·C responses
are batch-normalised (no affine) and mixed by a 1×1 convolution. 1×1 convolutions stay.
The architecture keeps its shapes, so the same method modifies WRN-16-8, ResNet-50 or
the CPU ``small_cnn``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from scarcelab.methods import Batch, Losses, Progress, register
from scarcelab.methods.supervised._deic import DEICMethod


def dct_filters(k: int, l1_norm: bool = True) -> torch.Tensor:
    """The k² DCT-II basis filters (k², k, k), frequency (u, v) in row-major order."""
    bank = torch.empty(k * k, k, k)
    pos = torch.arange(k, dtype=torch.float64) + 0.5
    for u in range(k):
        for v in range(k):
            f = torch.outer(torch.cos(math.pi * pos * u / k), torch.cos(math.pi * pos * v / k))
            if l1_norm:
                f = f / f.abs().sum()
            bank[u * k + v] = f.float()
    return bank


class Harm2d(nn.Module):
    """A convolution whose filters are combinations of the fixed DCT basis."""

    dct: torch.Tensor  # a registered buffer

    def __init__(self, conv: nn.Conv2d) -> None:
        super().__init__()
        k = conv.kernel_size[0]
        if conv.kernel_size[0] != conv.kernel_size[1]:
            raise ValueError(f"harmonic conversion needs square kernels, got {conv.kernel_size}")
        self.register_buffer("dct", dct_filters(k))
        self.stride, self.padding = conv.stride, conv.padding
        self.dilation, self.groups = conv.dilation, conv.groups
        w = torch.empty(conv.out_channels, conv.in_channels // conv.groups, k * k, 1, 1)
        nn.init.kaiming_normal_(w, mode="fan_out", nonlinearity="relu")  # gem's init
        self.weight = nn.Parameter(w.view(conv.out_channels, -1, k * k))
        self.bias = nn.Parameter(torch.zeros(conv.out_channels)) if conv.bias is not None \
            else None

    def filters(self) -> torch.Tensor:
        return torch.einsum("oim,mxy->oixy", self.weight, self.dct)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.filters(), self.bias, self.stride, self.padding,
                        self.dilation, self.groups)


class HarmBlockBN(nn.Module):
    """First layer: depthwise DCT filtering, BatchNorm (no affine), 1×1 mixing."""

    dct: torch.Tensor  # a registered buffer

    def __init__(self, conv: nn.Conv2d) -> None:
        super().__init__()
        k = conv.kernel_size[0]
        cin = conv.in_channels
        self.register_buffer("dct", dct_filters(k)[:, None].repeat(cin, 1, 1, 1))
        self.stride, self.padding, self.cin = conv.stride, conv.padding, cin
        self.bn = nn.BatchNorm2d(cin * k * k, affine=False)
        self.mix = nn.Conv2d(cin * k * k, conv.out_channels, 1, bias=conv.bias is not None)
        nn.init.kaiming_normal_(self.mix.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.conv2d(x, self.dct, None, self.stride, self.padding, groups=self.cin)
        return self.mix(self.bn(y))


def _replace(root: nn.Module, name: str, new: nn.Module) -> None:
    parent = root
    *path, last = name.split(".")
    for p in path:
        parent = getattr(parent, p)
    setattr(parent, last, new)


def harmonize(backbone: nn.Module) -> int:
    """Turn every k×k convolution (k > 1) of ``backbone`` harmonic, the first one into
    the harmonic block with BN; returns how many were converted."""
    convs = [(n, m) for n, m in backbone.named_modules()
             if isinstance(m, nn.Conv2d) and m.kernel_size != (1, 1)]
    for i, (name, conv) in enumerate(convs):
        _replace(backbone, name, HarmBlockBN(conv) if i == 0 else Harm2d(conv))
    return len(convs)


@register("harmonic")
class Harmonic(DEICMethod):
    paper = "Ulicny et al. 2019, Harmonic Networks with Limited Training Samples, arXiv:1905.00135"

    def __init__(self, backbone: nn.Module, num_classes: int, hp: dict[str, Any]) -> None:
        if harmonize(backbone) == 0:
            raise ValueError("harmonic: the backbone has no k×k convolution to convert")
        super().__init__(backbone, num_classes, hp)

    def step(self, batch: Batch, progress: Progress) -> Losses:
        loss = F.cross_entropy(self.logits(batch.x[0]), batch.y)
        return {"loss": loss, "loss_labeled": loss}
