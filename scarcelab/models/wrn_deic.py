"""Wide ResNet 16-8 as in "Tune It or Don't Use It" (ciFAIR-10's backbone; Zagoruyko &
Komodakis 2016, gem ``architectures/wrn_cifar.py``): pre-activation basic blocks, ReLU and
PyTorch's default BatchNorm momentum — unlike ``wrn28_2``, which follows the FixMatch
setting (leaky ReLU, momentum 0.001) for semi-supervised training.

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


class WideBlock(nn.Module):
    supports_full_conv = True

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.equal = cin == cout and stride == 1
        self.shortcut = None if self.equal else nn.Conv2d(cin, cout, 1, stride, 0, bias=False)
        self.stride = stride
        self.full_conv = False

    def set_full_conv(self) -> None:
        self.full_conv = True
        self.conv1.padding = (2, 2)
        self.conv2.padding = (2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        o = F.relu(self.bn1(x))
        out = self.conv2(F.relu(self.bn2(self.conv1(o))))
        if self.shortcut is None:
            res = F.pad(x, (2, 2, 2, 2)) if self.full_conv else x
        else:
            pad = (3 if self.stride > 1 else 2) if self.full_conv else 0
            res = self.shortcut(F.pad(o, (pad,) * 4) if pad else o)
        return out + res


class WideResNetDEIC(nn.Module):
    def __init__(self, in_channels: int, depth: int = 16, widen: int = 8) -> None:
        super().__init__()
        if (depth - 4) % 6:
            raise ValueError(f"WideResNet depth must be 6n+4, got {depth}")
        n = (depth - 4) // 6
        self.n_per_stage = n  # blocks per stage: methods that rebuild stages (scattering)
        widths = [16, 16 * widen, 32 * widen, 64 * widen]
        self.conv = nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False)
        layers: list[nn.Module] = []
        cin = widths[0]
        for cout, stride in zip(widths[1:], (1, 2, 2), strict=True):
            for i in range(n):
                layers.append(WideBlock(cin, cout, stride if i == 0 else 1))
                cin = cout
        self.blocks = nn.Sequential(*layers)
        self.bn = nn.BatchNorm2d(cin)
        self.num_features = cin
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn(self.blocks(self.conv(x))))
        return F.adaptive_avg_pool2d(x, 1).flatten(1)


@register_model("wrn16_8")
def wrn16_8(in_channels: int = 3) -> nn.Module:
    return WideResNetDEIC(in_channels, 16, 8)


@register_model("wrn16_2")
def wrn16_2(in_channels: int = 3) -> nn.Module:
    """A narrow WRN-16 (width 2) for CPU-scale runs of the same architecture family."""
    return WideResNetDEIC(in_channels, 16, 2)
