"""The exported model: [0, 1] images in, logits out, normalisation inside.

Whatever a method trains (a head on a backbone, or a frozen encoder plus a linear probe),
the final artifact is this one module type, so users load every model the same way.
"""

from __future__ import annotations

import torch
from torch import nn

NORM_MEAN = 0.5
NORM_STD = 0.5


def normalize(x: torch.Tensor) -> torch.Tensor:
    """Map [0, 1] images to roughly zero mean/unit scale (fixed, dataset-independent)."""
    return (x - NORM_MEAN) / NORM_STD


class ExportedClassifier(nn.Module):
    def __init__(self, backbone: nn.Module, head: nn.Module, class_names: list[str]) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.class_names = list(class_names)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(normalize(x)))
