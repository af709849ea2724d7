"""Small networks: a fast CNN for CPU smoke runs, and an MLP/linear for feature vectors."""

from __future__ import annotations

import torch
from torch import nn

from scarcelab.models import register_model


class SmallCNN(nn.Module):
    """Three conv blocks (32-64-128) with BatchNorm and global pooling: ~100k parameters.

    Fast enough that a study of many trials fits a few CPU minutes, yet good enough to
    rank methods in smoke runs; it is not a substitute for resnet18 in real studies.
    """

    def __init__(self, in_channels: int = 3, width: int = 32) -> None:
        super().__init__()
        chans = [in_channels, width, 2 * width, 4 * width]
        layers: list[nn.Module] = []
        for i in range(3):
            layers += [
                nn.Conv2d(chans[i], chans[i + 1], 3, padding=1, bias=False),
                nn.BatchNorm2d(chans[i + 1]),
                nn.ReLU(inplace=True),
            ]
            if i < 2:
                layers.append(nn.MaxPool2d(2))
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.num_features = chans[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)


@register_model("small_cnn")
def small_cnn(in_channels: int = 3) -> nn.Module:
    return SmallCNN(in_channels)


class MLP(nn.Module):
    """Flattens its input, so it serves both feature vectors and tiny images."""

    def __init__(self, in_features: int, hidden: tuple[int, ...] = (256, 128)) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        dims = [in_features, *hidden]
        for a, b in zip(dims[:-1], dims[1:], strict=True):
            layers += [nn.Linear(a, b), nn.ReLU(inplace=True)]
        self.net = nn.Sequential(*layers)
        self.num_features = dims[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@register_model("mlp")
def mlp(in_channels: int, hidden: tuple[int, ...] = (256, 128)) -> nn.Module:
    """``in_channels`` is the flattened input size for feature vectors."""
    return MLP(in_channels, hidden)
