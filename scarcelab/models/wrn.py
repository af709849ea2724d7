"""Wide ResNet 28-2 (Zagoruyko & Komodakis 2016), the standard SSL backbone since FixMatch.

Pre-activation basic blocks, BatchNorm momentum 0.001 and leaky-ReLU 0.1 as in the
FixMatch/USB reference setting, which keeps BN statistics stable when labeled and
unlabeled batches of very different sizes pass through the same network.
"""

from __future__ import annotations

import torch
from torch import nn

from scarcelab.models import register_model


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, activate_before_residual: bool) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(cin, momentum=0.001)
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout, momentum=0.001)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.act = nn.LeakyReLU(0.1, inplace=False)
        self.shortcut = (
            None if cin == cout and stride == 1 else nn.Conv2d(cin, cout, 1, stride, 0, bias=False)
        )
        self.activate_before_residual = activate_before_residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        o = self.act(self.bn1(x))
        if self.shortcut is None:
            residual = x
        else:
            residual = self.shortcut(o if self.activate_before_residual else x)
        out = self.conv1(o)
        out = self.conv2(self.act(self.bn2(out)))
        return out + residual


class WideResNet(nn.Module):
    def __init__(self, in_channels: int, depth: int = 28, widen: int = 2) -> None:
        super().__init__()
        if (depth - 4) % 6:
            raise ValueError(f"WideResNet depth must be 6n+4, got {depth}")
        n = (depth - 4) // 6
        widths = [16, 16 * widen, 32 * widen, 64 * widen]
        self.conv = nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False)
        layers: list[nn.Module] = []
        cin = widths[0]
        for stage, (cout, stride) in enumerate(zip(widths[1:], (1, 2, 2), strict=True)):
            for i in range(n):
                layers.append(_Block(cin, cout, stride if i == 0 else 1, stage == 0 and i == 0))
                cin = cout
        self.blocks = nn.Sequential(*layers)
        self.bn = nn.BatchNorm2d(cin, momentum=0.001)
        self.act = nn.LeakyReLU(0.1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.num_features = cin
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="leaky_relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.bn(self.blocks(self.conv(x))))
        return self.pool(x).flatten(1)


@register_model("wrn28_2")
def wrn28_2(in_channels: int = 3) -> nn.Module:
    return WideResNet(in_channels, 28, 2)
