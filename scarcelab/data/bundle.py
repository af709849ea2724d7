"""The one in-memory data container every method, protocol and strategy consumes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class RawDataset:
    """A dataset as loaded from disk, before the realistic split.

    ``images`` are uint8 arrays (N, C, H, W); labels are int64 (N,) class indices
    (multi-label sets keep (N, K) and set ``task="multi-label"``). ``val`` is the
    official validation split when the source has one (scarcelab's own validation set
    is drawn from ``train`` by the split builder; see ``scarcelab.data.splits``).
    ``notes`` are facts about the copy that every run on it must carry as tags
    (``scarcelab.<key>``), e.g. that a stand-in test set replaced the official one.
    """

    name: str
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    class_names: list[str]
    val_x: np.ndarray | None = None
    val_y: np.ndarray | None = None
    task: str = "multi-class"
    source: str = ""
    md5: str | None = None
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def channels(self) -> int:
        return int(self.train_x.shape[1])

    @property
    def resolution(self) -> tuple[int, int]:
        return int(self.train_x.shape[2]), int(self.train_x.shape[3])


@dataclass
class DatasetBundle:
    """Labeled train / unlabeled pool / validation / test, ready for training.

    Images stay uint8 (N, C, H, W) so that a whole medical dataset fits in memory and
    augmentation can run on batches; conversion to float happens per batch.
    ``unlabeled_y`` keeps the hidden labels for diagnostics only: training code must
    never read it (the split builder keeps it so that e.g. pseudo-label accuracy can be
    reported). ``unlabeled_ood`` (bool, one per unlabeled image) marks images added by the
    contamination protocol (``scarcelab.protocols.contamination``); like ``unlabeled_y``
    it is an oracle for diagnostics (``diag/ood_ff``) and never reaches training.
    ``unlabeled_origin`` (int, one per unlabeled image), set by the contamination protocol,
    is each image's index in the uncontaminated pool followed by the OOD draw (``n_id + j``
    for the j-th OOD image), so diagnostics can pick the same ID images at every ratio.
    """

    labeled_x: np.ndarray
    labeled_y: np.ndarray
    unlabeled_x: np.ndarray
    val_x: np.ndarray
    val_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)
    unlabeled_y: np.ndarray | None = None
    unlabeled_ood: np.ndarray | None = None
    unlabeled_origin: np.ndarray | None = None

    @property
    def num_classes(self) -> int:
        return int(self.meta["num_classes"])

    @property
    def channels(self) -> int:
        return int(self.labeled_x.shape[1])

    def sizes(self) -> dict[str, int]:
        return {
            "labeled": len(self.labeled_y),
            "unlabeled": len(self.unlabeled_x),
            "val": len(self.val_y),
            "test": len(self.test_y),
        }
