"""``cifair10``: the ciFAIR-10 split of the "Tune It or Don't Use It" benchmark (DEIC,
github.com/cvjena/deic ``datasets/cifair/README.md``): ``train`` = the first 30 training
images of each class, ``val`` = the following 20 (``trainval`` = 50 per class, 500
images), ``test`` = the full 10,000-image test set.

On these machines the images come from ``../shared/data/cifar10_jpg`` (CIFAR-10 JPEG
re-encodings, ``<split>/<class>/NNNN.jpg``; "first" = lowest file number within a class).
Two differences from the published benchmark, both affecting comparability with the
paper's numbers, not the protocol: (1) ciFAIR-10's *test* set replaces the CIFAR-10 test
images that have near-duplicates in the training set (Barz & Denzler 2020, "Do we train
on test data?"; about 3 % of the test set) — this loader uses the original CIFAR-10 test
set, which still contains them; (2) JPEG re-encoding changes pixels slightly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from scarcelab.data import DATASETS
from scarcelab.data.bundle import RawDataset
from scarcelab.data.ood import find_shared_file
from scarcelab.data.sources.cifar10_5k import CLASSES, ZIPS, _read_zip

PER_CLASS = {"train": 30, "val": 20}


def first_per_class(y: np.ndarray, start: int, count: int) -> np.ndarray:
    """Indices of the images ``start .. start+count-1`` of every class, in input order."""
    out = []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        if len(idx) < start + count:
            raise ValueError(f"class {c} has {len(idx)} images, need {start + count}")
        out.append(idx[start:start + count])
    return np.concatenate(out)


@DATASETS.register("cifair10")
def load_cifair10(data_dir: str | Path | None = None) -> RawDataset:
    tr_p, te_p = (find_shared_file(ZIPS[s], data_dir) for s in ("train", "test"))
    (x, y), (xte, yte) = _read_zip(tr_p), _read_zip(te_p)
    tr = first_per_class(y, 0, PER_CLASS["train"])
    va = first_per_class(y, PER_CLASS["train"], PER_CLASS["val"])
    return RawDataset(name="cifair10", train_x=x[tr], train_y=y[tr], val_x=x[va], val_y=y[va],
                      test_x=xte, test_y=yte, num_classes=10, class_names=list(CLASSES),
                      source=f"{tr_p} (CIFAR-10 JPEGs; DEIC ciFAIR-10 split)")
