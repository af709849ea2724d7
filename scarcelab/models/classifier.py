"""The exported model: [0, 1] images in, logits out, normalisation inside.

Whatever a method trains (a head on a backbone, or a frozen encoder plus a linear probe),
the final artifact is this one module type, so users load every model the same way. The
transform its training images went through (decode, channels, resize) travels with it
(``transform``), so that the logged model can apply it to raw images
(``scarcelab.models.image_input``).
"""

from __future__ import annotations

from collections.abc import Mapping
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
    def __init__(self, backbone: nn.Module, head: nn.Module, class_names: list[str],
                 transform: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.class_names = list(class_names)
        #: ``Transform.params()`` of the training images; None: a dataset used at its
        #: native size (``scarcelab.models.image_input.training_transform``)
        self.transform = dict(transform) if transform else None

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
    return model.to("cpu").to(memory_format=torch.contiguous_format).eval()

