"""ResNet-18 with the small-image stem used for 28x28/32x32 inputs.

The ImageNet stem (7x7 stride-2 conv + max-pool) shrinks a 28x28 image to 7x7 before the
first residual stage, which wastes most of the network; CIFAR-style work (and the
SSL-vs-SSL study on MedMNIST) uses a 3x3 stride-1 conv and no max-pool instead.
"""

from __future__ import annotations

import torch
from torch import nn
from torchvision.models import resnet18 as tv_resnet18
from torchvision.models import resnet50 as tv_resnet50

from scarcelab.models import register_model


class _TorchvisionBackbone(nn.Module):
    def __init__(self, net: nn.Module, in_channels: int, width: int) -> None:
        super().__init__()
        net.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
        net.fc = nn.Identity()
        self.net = net
        self.num_features = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@register_model("resnet18")
def resnet18(in_channels: int = 3) -> nn.Module:
    return _TorchvisionBackbone(tv_resnet18(weights=None), in_channels, 512)


@register_model("resnet50")
def resnet50(in_channels: int = 3) -> nn.Module:
    return _TorchvisionBackbone(tv_resnet50(weights=None), in_channels, 2048)


class _ImageNetStemBackbone(nn.Module):
    """torchvision ResNet with its ImageNet stem (7×7 stride-2 conv + max-pool) kept, for
    the non-CIFAR sets of "Tune It or Don't Use It" (gem ``architectures/rn.py`` ``rn50``)."""

    def __init__(self, net: nn.Module, in_channels: int, width: int) -> None:
        super().__init__()
        if in_channels != 3:
            net.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3,
                                  bias=False)
        net.fc = nn.Identity()
        self.net = net
        self.num_features = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@register_model("resnet50_imagenet")
def resnet50_imagenet(in_channels: int = 3) -> nn.Module:
    return _ImageNetStemBackbone(tv_resnet50(weights=None), in_channels, 2048)


@register_model("resnet18_imagenet")
def resnet18_imagenet(in_channels: int = 3) -> nn.Module:
    """ResNet-18 as torchvision builds it for ImageNet: the arch an ImageNet ResNet-18
    state dict loads into without leaving its 7x7 stem behind (scarcelab.models.encoder)."""
    return _ImageNetStemBackbone(tv_resnet18(weights=None), in_channels, 512)
