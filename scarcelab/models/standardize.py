"""Per-dataset channel standardisation inside the backbone.

The shared epoch loop feeds every network ``(x − 0.5) / 0.5`` (``models.classifier.normalize``,
dataset-independent). The "Tune It or Don't Use It" protocol normalises with the channel
mean and standard deviation of the training split instead (gem
``BasicAugmentation.compute_normalization_statistics``); this wrapper maps one onto the
other, ``(x01 − mean) / std`` with ``x01 = 0.5·x + 0.5``, so the loop, the augmentations
and the exported model (which normalises inside) all stay as they are, and the statistics
travel with the weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from scarcelab.models.classifier import NORM_MEAN, NORM_STD


def channel_stats(images: np.ndarray, chunk: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and (population) std of uint8 images (N, C, H, W) in [0, 1] units,
    accumulated in float64 chunks so large sets need no float copy."""
    if images.ndim != 4 or len(images) == 0:
        raise ValueError(f"channel_stats expects a non-empty (N, C, H, W) array, got "
                         f"{images.shape}")
    c = images.shape[1]
    s = np.zeros(c)
    s2 = np.zeros(c)
    count = 0
    for i in range(0, len(images), chunk):
        x = images[i:i + chunk].astype(np.float64) / 255.0
        s += x.sum(axis=(0, 2, 3))
        s2 += (x * x).sum(axis=(0, 2, 3))
        count += x.shape[0] * x.shape[2] * x.shape[3]
    mean = s / count
    std = np.sqrt(np.maximum(s2 / count - mean * mean, 0.0))
    return mean, np.maximum(std, 1e-3)  # a constant channel must not divide by zero


class Standardized(nn.Module):
    """``net`` fed with dataset-standardised inputs; exposes ``num_features`` like ``net``."""

    mean: torch.Tensor  # a registered buffer
    std: torch.Tensor  # a registered buffer

    def __init__(self, net: nn.Module, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.net = net
        self.num_features = int(net.num_features)  # type: ignore[arg-type]
        m = torch.as_tensor(np.asarray(mean, dtype=np.float32)).view(1, -1, 1, 1)
        s = torch.as_tensor(np.asarray(std, dtype=np.float32)).view(1, -1, 1, 1)
        self.register_buffer("mean", m)
        self.register_buffer("std", s)

    def standardize(self, x: torch.Tensor) -> torch.Tensor:
        """The loop's ``(x − 0.5) / 0.5`` input as the network sees it, ``(x01 − mean) / std``:
        exposed for methods that act on the normalised image itself (grad-ℓ2's input
        gradient, gem ``kernelregular.py``, is taken with respect to this tensor)."""
        x01 = x * NORM_STD + NORM_MEAN
        return (x01 - self.mean) / self.std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.standardize(x))
