"""The Wide ResNet trunk (Zagoruyko & Komodakis 2016), written once for both WRN families.

``wrn28_2`` (FixMatch/USB's semi-supervised setting) and ``wrn16_k`` ("Tune It or Don't
Use It", gem ``architectures/wrn_cifar.py``) are the same network: a 3×3 stem, three
stages of pre-activation basic blocks at widths 16k, 32k, 64k (the first block of stages
2 and 3 strided), a final BN-activation and global average pooling. They differ only in
settings — BatchNorm momentum, the activation, and whether the first block's 1×1
shortcut sees the activated input — so those are parameters here, and each family file
keeps only its settings and registrations.

Construction order is part of the contract: convolutions are created stem first, then per
block ``conv1``, ``conv2``, ``shortcut``, and re-initialised in that order, so a seeded
network has the same weights it had before the two trunks were merged
(``tests/core/models/test_wrn_trunk.py`` holds values recorded from the separate trunks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import nn


class PreActBlock(nn.Module):
    """BN-act-conv3×3(stride)-BN-act-conv3×3 plus an identity or 1×1 shortcut.

    ``activate_before_residual``: the 1×1 shortcut projects the activated input
    ``act(bn1(x))`` (True) or the raw ``x`` (False); FixMatch's WRN-28-2 activates only for
    the first block, gem's WRN for every projecting block.
    """

    def __init__(self, cin: int, cout: int, stride: int, activate_before_residual: bool, *,
                 bn_momentum: float, act: nn.Module) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(cin, momentum=bn_momentum)
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout, momentum=bn_momentum)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.act = act
        self.equal = cin == cout and stride == 1
        self.shortcut = None if self.equal else nn.Conv2d(cin, cout, 1, stride, 0, bias=False)
        self.stride = stride
        self.activate_before_residual = activate_before_residual

    def residual(self, x: torch.Tensor, activated: torch.Tensor) -> torch.Tensor:
        """The identity path; a subclass may pad it (full convolution)."""
        if self.shortcut is None:
            return x
        return self.shortcut(activated if self.activate_before_residual else x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        o = self.act(self.bn1(x))
        out = self.conv2(self.act(self.bn2(self.conv1(o))))
        return out + self.residual(x, o)


#: (cin, cout, stride, first block of the network) -> block
BlockFactory = Callable[[int, int, int, bool], nn.Module]
#: the activation the convolutions' Kaiming initialisation is computed for
InitNonlinearity = Literal["relu", "leaky_relu"]


class WideResNetTrunk(nn.Module):
    """Stem, ``3·n`` blocks (``depth = 6n + 4``), final BN-activation, global pooling.

    Attributes the methods rely on: ``conv`` (stem), ``blocks`` (one ``nn.Sequential``),
    ``bn``, ``act``, ``n_per_stage`` (scattering and the U-Net cut stages by it) and
    ``num_features``.
    """

    def __init__(self, in_channels: int, depth: int, widen: int, *, block: BlockFactory,
                 bn_momentum: float, act: Callable[[], nn.Module],
                 init_nonlinearity: InitNonlinearity) -> None:
        super().__init__()
        if (depth - 4) % 6:
            raise ValueError(f"WideResNet depth must be 6n+4, got {depth}")
        n = (depth - 4) // 6
        self.n_per_stage = n
        widths = [16, 16 * widen, 32 * widen, 64 * widen]
        self.conv = nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False)
        layers: list[nn.Module] = []
        cin = widths[0]
        for stage, (cout, stride) in enumerate(zip(widths[1:], (1, 2, 2), strict=True)):
            for i in range(n):
                layers.append(block(cin, cout, stride if i == 0 else 1, stage == 0 and i == 0))
                cin = cout
        self.blocks = nn.Sequential(*layers)
        self.bn = nn.BatchNorm2d(cin, momentum=bn_momentum)
        self.act = act()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.num_features = cin
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity=init_nonlinearity)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.bn(self.blocks(self.conv(x))))
        return self.pool(x).flatten(1)
