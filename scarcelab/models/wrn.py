"""Wide ResNet 28-2 (Zagoruyko & Komodakis 2016), the standard SSL backbone since FixMatch.

Pre-activation basic blocks, BatchNorm momentum 0.001 and leaky-ReLU 0.1 as in the
FixMatch/USB reference setting, which keeps BN statistics stable when labeled and
unlabeled batches of very different sizes pass through the same network. Only the first
block's shortcut projects the activated input. The trunk itself is
:mod:`scarcelab.models.wrn_trunk`, shared with ``wrn16_k``.
"""

from __future__ import annotations

from torch import nn

from scarcelab.models import register_model
from scarcelab.models.wrn_trunk import PreActBlock, WideResNetTrunk

BN_MOMENTUM = 0.001
LEAKY_SLOPE = 0.1


class _Block(PreActBlock):
    def __init__(self, cin: int, cout: int, stride: int, activate_before_residual: bool) -> None:
        super().__init__(cin, cout, stride, activate_before_residual, bn_momentum=BN_MOMENTUM,
                         act=nn.LeakyReLU(LEAKY_SLOPE, inplace=False))


class WideResNet(WideResNetTrunk):
    def __init__(self, in_channels: int, depth: int = 28, widen: int = 2) -> None:
        super().__init__(in_channels, depth, widen, block=_Block, bn_momentum=BN_MOMENTUM,
                         act=lambda: nn.LeakyReLU(LEAKY_SLOPE),
                         init_nonlinearity="leaky_relu")


@register_model("wrn28_2")
def wrn28_2(in_channels: int = 3) -> nn.Module:
    return WideResNet(in_channels, 28, 2)
