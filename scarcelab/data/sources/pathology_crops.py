"""``pathology_crops``: 32x32 H&E crops centred on CoNSeP nuclei, 4 nucleus types.

The one real pathology *classification* set on the project machines (``MANIFEST.md``,
``pathology_crops/``): crops cut from the CoNSeP patches (Graham et al. 2019, HoVer-Net),
train/test following CoNSeP's own image split, so no tissue is shared between them.
Labels are stored 1..4 (CoNSeP's merged types: other, inflammatory, epithelial,
spindle-shaped) and mapped to 0..3 here. Train holds 1,467 crops (267/400/400/400), test
1,600 (400 per type). Duplicates *within* a split are possible (the source patches
overlap); scarcelab's validation set is drawn from train by the split builder (seeded),
so validation can share a nucleus with labeled train — never with test.

It stands in for the tile sets of Kang et al. (2022) (BACH, CRC, PCam, MHIST: see
``tiles.py``), none of which can be obtained on these machines. Nothing is downloaded: the
file is the shared data's own.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from scarcelab.data import DATASETS
from scarcelab.data import provenance as _provenance
from scarcelab.data.bundle import RawDataset
from scarcelab.data.ood import find_shared_file
from scarcelab.data.safe_read import load_npz
from scarcelab.errors import DataError

REL = "pathology_crops/consep_nucleus_crops32.npz"
CLASSES = ("other", "inflammatory", "epithelial", "spindle-shaped")
_CACHE: dict[str, RawDataset] = {}


def _images(arr: np.ndarray, path: Path, key: str) -> np.ndarray:
    if arr.ndim != 4 or arr.shape[-1] != 3 or arr.dtype != np.uint8:
        raise DataError(f"{path}: {key} has shape {arr.shape} / dtype {arr.dtype}; expected "
                        "uint8 (N, H, W, 3) RGB crops")
    return np.ascontiguousarray(arr.transpose(0, 3, 1, 2))


def _labels(arr: np.ndarray, n: int, path: Path, key: str) -> np.ndarray:
    y = np.asarray(arr).reshape(-1)
    if len(y) != n:
        raise DataError(f"{path}: {key} has {len(y)} labels for {n} images")
    bad = ~np.isin(y, (1, 2, 3, 4))
    if bad.any():
        raise DataError(f"{path}: {key} holds values {np.unique(y[bad])[:10].tolist()} outside "
                        "CoNSeP's nucleus types 1..4")
    return (y - 1).astype(np.int64)


def read_crops(path: Path) -> RawDataset:
    """Read and validate the npz; the result is kept per process (it is read-only)."""
    if str(path) in _CACHE:
        return _CACHE[str(path)]
    keys = ("x_train", "y_train", "x_test", "y_test")
    _provenance.record(path)  # the run logs which bytes it read
    arrays = load_npz(path, keys, fix="restore it from ../shared/data (sha256sum -c "
                      "SHA256SUMS); expected x_train, y_train, x_test, y_test")
    xtr = _images(arrays["x_train"], path, "x_train")
    xte = _images(arrays["x_test"], path, "x_test")
    raw = RawDataset(
        name="pathology_crops", train_x=xtr,
        train_y=_labels(arrays["y_train"], len(xtr), path, "y_train"),
        test_x=xte, test_y=_labels(arrays["y_test"], len(xte), path, "y_test"),
        num_classes=len(CLASSES), class_names=list(CLASSES), source=str(path))
    _CACHE[str(path)] = raw
    return raw


@DATASETS.register("pathology_crops")
def load_pathology_crops(data_dir: str | Path | None = None) -> RawDataset:
    """CoNSeP nucleus-type crops (4 classes, 32x32 RGB), CoNSeP's train/test split."""
    return read_crops(find_shared_file(REL, data_dir))
