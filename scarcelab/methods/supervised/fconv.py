"""``fconv``: full convolution (Kayhan & van Gemert, CVPR 2020, "On Translation Invariance
in CNNs: Convolutional Layers can Exploit Absolute Spatial Location"; reference code
github.com/oskyhn/CNNs-Without-Borders, gem ``pipelines/fconv.py``). Every k×k convolution
pads by k − 1 instead of (k − 1)/2, so every filter position covers the input the same
number of times and the network cannot read absolute position off the zero border;
feature maps grow by k − 1 per convolution. Residual paths are zero-padded to match
(WRN blocks: ``WideBlock.set_full_conv``; torchvision ResNet blocks: :class:`FConvResBlock`,
following gem's ``BasicBlockFConv`` / ``BottleneckFConv``), and the ImageNet stem's
max-pool becomes 2×2 stride 2 without padding (gem ``make_fconv_stem``).
"""

from __future__ import annotations

from typing import Any, Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck

from scarcelab.errors import ConfigError
from scarcelab.methods import Batch, Losses, Progress, register
from scarcelab.methods.supervised._deic import DEICMethod
from scarcelab.methods.supervised.harmonic import _replace
from scarcelab.models.wrn_trunk import PreActBlock


def _full(conv: nn.Conv2d) -> None:
    conv.padding = tuple(k - 1 for k in conv.kernel_size)


class FConvResBlock(nn.Module):
    """A torchvision BasicBlock / Bottleneck with full 3×3 convolutions and a padded
    identity: 2 px per side for two 3×3 convolutions (3 before a strided 1×1
    downsample), 1 px for the bottleneck's single 3×3."""

    def __init__(self, block: BasicBlock | Bottleneck) -> None:
        super().__init__()
        self.block = block
        bottleneck = isinstance(block, Bottleneck)
        for conv in (block.conv1, block.conv2):
            if conv.kernel_size == (3, 3):
                _full(conv)
        if bottleneck:
            self.pad = 1
        else:
            self.pad = 3 if block.downsample is not None and block.stride > 1 else 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self.block
        out = b.relu(b.bn1(b.conv1(x)))
        out = b.bn2(b.conv2(out))
        if isinstance(b, Bottleneck):
            out = b.bn3(b.conv3(b.relu(out)))
        xp = F.pad(x, (self.pad,) * 4)
        identity = b.downsample(xp) if b.downsample is not None else xp
        return b.relu(out + identity)


class _FullConvBlock(Protocol):
    """A block that converts itself (``supports_full_conv``; ``WideBlock``)."""

    def set_full_conv(self) -> None: ...


def full_convolution(backbone: nn.Module) -> int:
    """Convert ``backbone`` in place; returns the number of convolutions changed.

    A WRN block without a full-convolution form (``wrn28_2``'s: only the DEIC WRN's
    ``WideBlock`` pads its identity) is refused before anything changes: widening its
    convolutions alone leaves the identity path smaller than the grown maps, and every
    forward pass would die in a shape mismatch."""
    unpadded = sorted({type(m).__name__ for m in backbone.modules()
                       if isinstance(m, PreActBlock)
                       and not getattr(m, "supports_full_conv", False)})
    if unpadded:
        raise ConfigError(
            f"fconv: the backbone's residual blocks ({', '.join(unpadded)}) have no "
            "full-convolution form (their identity path is not padded); use --arch "
            "wrn16_2, wrn16_8, a ResNet (resnet18, resnet50, ..._imagenet) or small_cnn")
    n = 0
    handled: set[int] = set()
    for name, m in list(backbone.named_modules()):
        if getattr(m, "supports_full_conv", False):
            cast(_FullConvBlock, m).set_full_conv()
            handled.update(id(c) for c in m.modules())
            n += sum(1 for c in m.modules() if isinstance(c, nn.Conv2d) and c.kernel_size != (1, 1))
        elif isinstance(m, (BasicBlock, Bottleneck)):
            _replace(backbone, name, FConvResBlock(m))
            handled.update(id(c) for c in m.modules())
            n += 2 if isinstance(m, BasicBlock) else 1
    for m in backbone.modules():
        if id(m) in handled:
            continue
        if isinstance(m, nn.Conv2d) and m.kernel_size != (1, 1):
            _full(m)
            n += 1
        elif isinstance(m, nn.MaxPool2d) and m.padding:
            m.kernel_size, m.stride, m.padding = 2, 2, 0
    return n


@register("fconv")
class FullConv(DEICMethod):
    paper = ("Kayhan & van Gemert 2020, On Translation Invariance in CNNs: Convolutional "
             "Layers can Exploit Absolute Spatial Location, arXiv:2003.07064")

    def __init__(self, backbone: nn.Module, num_classes: int, hp: dict[str, Any]) -> None:
        if full_convolution(backbone) == 0:
            raise ValueError("fconv: the backbone has no k×k convolution to convert")
        super().__init__(backbone, num_classes, hp)

    def step(self, batch: Batch, progress: Progress) -> Losses:
        loss = F.cross_entropy(self.logits(batch.x[0]), batch.y)
        return {"loss": loss, "loss_labeled": loss}
