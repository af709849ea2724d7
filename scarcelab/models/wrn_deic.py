"""Wide ResNet 16-8 as in "Tune It or Don't Use It" (ciFAIR-10's backbone; Zagoruyko &
Komodakis 2016, gem ``architectures/wrn_cifar.py``): pre-activation basic blocks, ReLU and
PyTorch's default BatchNorm momentum — unlike ``wrn28_2``, which follows the FixMatch
setting (leaky ReLU, momentum 0.001) for semi-supervised training. Every projecting
shortcut sees the activated input. The trunk itself is :mod:`scarcelab.models.wrn_trunk`.

Blocks support *full convolution* (F-Conv, Kayhan & van Gemert, CVPR 2020): every 3×3
convolution pads by 2 instead of 1 so each output sees the image border the same way, and
the identity path is zero-padded to match (by 2, or by 3 before a strided 1×1 shortcut),
as gem's ``BasicBlockFConvWRN``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from scarcelab.models import register_model
from scarcelab.models.wrn_trunk import PreActBlock, WideResNetTrunk

BN_MOMENTUM = 0.1  # PyTorch's default, which gem's WRN keeps


class WideBlock(PreActBlock):
    supports_full_conv = True

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__(cin, cout, stride, True, bn_momentum=BN_MOMENTUM, act=nn.ReLU())
        self.full_conv = False

    def set_full_conv(self) -> None:
        self.full_conv = True
        self.conv1.padding = (2, 2)
        self.conv2.padding = (2, 2)

    def residual(self, x: torch.Tensor, activated: torch.Tensor) -> torch.Tensor:
        if not self.full_conv:
            return super().residual(x, activated)
        if self.shortcut is None:
            return F.pad(x, (2, 2, 2, 2))
        return self.shortcut(F.pad(activated, (3 if self.stride > 1 else 2,) * 4))


class WideResNetDEIC(WideResNetTrunk):
    def __init__(self, in_channels: int, depth: int = 16, widen: int = 8) -> None:
        super().__init__(in_channels, depth, widen,
                         block=lambda cin, cout, stride, _first: WideBlock(cin, cout, stride),
                         bn_momentum=BN_MOMENTUM, act=nn.ReLU, init_nonlinearity="relu")


@register_model("wrn16_8")
def wrn16_8(in_channels: int = 3) -> nn.Module:
    return WideResNetDEIC(in_channels, 16, 8)


@register_model("wrn16_2")
def wrn16_2(in_channels: int = 3) -> nn.Module:
    """A narrow WRN-16 (width 2) for CPU-scale runs of the same architecture family."""
    return WideResNetDEIC(in_channels, 16, 2)
