"""The one in-memory data container every method, protocol and strategy consumes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scarcelab.errors import ConfigError


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
    # binary tasks: the class the task detects — in a medical task the disease, whatever
    # its label (BreastMNIST: malignant is label 0). Sensitivity at a specificity, the
    # partial AUROC and the ROC figure are about this class. None: not stated by the
    # source (class 1 is used). See :func:`resolve_positive_class`.
    positive_class: int | None = None
    notes: dict[str, str] = field(default_factory=dict)
    # -- a real unlabeled pool (a user's own images, scarcelab.data.own; plugins may set
    # these too). ``unlabeled_x``: the pool as given, uint8 (N, C, H, W), possibly empty;
    # None keeps the realistic split's rule for public datasets (everything of ``train``
    # neither labeled nor validation). With a pool given, ``train`` holds labeled images
    # only and none of them ever joins the pool. ``test_from`` says where ``test`` came
    # from: official | folder | holdout | fold i/k. ``digests`` are sha256 digests of each
    # part's file contents (train, val, test with their labels; unlabeled), recorded in the
    # split so that its hash changes when a file does. ``default_budget``: the source's
    # default (n_labeled, n_val), else scarcelab.data.splits.default_budget's.
    unlabeled_x: np.ndarray | None = None
    test_from: str = "official"
    digests: dict[str, str] = field(default_factory=dict)
    default_budget: tuple[int, int] | None = None
    # the decode transform a user's files went through (imagefiles.Transform.params(), its
    # channels resolved), which the logged model replays on raw images; None: the images
    # are used as stored (public datasets)
    transform: dict[str, str] | None = None

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
    A dataset with a real pool (``RawDataset.unlabeled_x``) gives ``unlabeled_x`` exactly
    that pool, ``unlabeled_y`` None (its labels are unknown, not hidden), and
    ``meta["unlabeled"] == "given"`` with ``meta["test_from"]``, and a user's images also
    ``meta["transform"]`` (``RawDataset.transform``); public datasets' bundles carry none
    of these keys.
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


def resolve_positive_class(raw: RawDataset, given: int | str | None = None) -> int | None:
    """The positive class index of ``raw``'s task: ``given`` (an index, or a class name,
    case-insensitive; None / ``default``: the dataset's own, else 1), or None for a task
    that is not binary (multi-class scores are one-vs-rest over every class). Why a
    per-dataset default: label order says nothing about meaning — MedMNIST's BreastMNIST
    stores malignant as 0 and calls "normal, benign" its positive class, so a silent
    "class 1" reports how well benign tissue is found."""
    default_words = (None, "", "default")
    if raw.num_classes != 2 or raw.task != "multi-class":
        if given not in default_words:
            raise ConfigError(f"positive_class={given!r}: {raw.name} is not a binary task "
                              f"({raw.num_classes} classes, {raw.task}); omit positive_class")
        return None
    if given in default_words:
        return 1 if raw.positive_class is None else int(raw.positive_class)
    names = [str(c).lower() for c in raw.class_names]
    text = str(given).strip()
    if text.isdigit() and int(text) in (0, 1):
        return int(text)
    if text.lower() in names:
        return names.index(text.lower())
    raise ConfigError(f"positive_class={given!r}: {raw.name}'s classes are 0 "
                      f"{raw.class_names[0]!r} and 1 {raw.class_names[1]!r}; give 0, 1 or "
                      "one of those names")
