"""The exported model: [0, 1] images in, logits out, normalisation inside.

Whatever a method trains (a head on a backbone, or a frozen encoder plus a linear probe),
the final artifact is this one module type, so users load every model the same way.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

M = TypeVar("M", bound=nn.Module)

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


def for_export(model: M) -> M:
    """``model`` on the CPU, in eval mode, with every weight in the default (contiguous)
    layout — in place, for the copy a protocol hands to ``Tracker.log_model``.

    Training runs in ``channels_last`` (``TrainConfig.channels_last``); torch's pt2 archive
    writer cannot place a non-contiguous weight in its storage and warns "No complete
    tensor found in the group!" for each such conv weight (twice per run
    with ``small_cnn``). The exported graph is the same either way; the contiguous copy is
    what the archive stores without guessing.
    """
    return model.to("cpu", memory_format=torch.contiguous_format).eval()

