"""``pcam``: PatchCamelyon (Veeling et al. 2018), 96x96 lymph-node H&E patches, label 1 =
metastatic tissue in the centre 32x32 region; official train / valid / test splits of
262,144 / 32,768 / 32,768 patches, as HDF5 files (``camelyonpatch_level_2_split_<split>_x.h5``:
dataset ``x``, uint8 (N, 96, 96, 3); ``…_y.h5``: dataset ``y``, (N, 1, 1, 1)).

Published at https://zenodo.org/records/2546921 (CC0) as gzipped files. md5 of the
``.h5.gz`` files as listed in torchvision 0.29.1's ``PCAM._FILES`` (the values of the
PCam README, https://github.com/basveeling/pcam); note that a 2019 report
(tand826/PatchCamelyon_h5ToImage) says two of the files were replaced after their md5 was
first published — a mismatch on valid_x / test_x would be that, and is refused all the same.
The official ``valid`` split is kept as ``RawDataset.val`` (scarcelab draws its own
validation set from train, per the realistic protocol).

Memory: the full train split is 7.2 GB of pixels; ``max_train`` reads a seeded subset.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from scarcelab.data import DATASETS
from scarcelab.data import provenance as _provenance
from scarcelab.data.bundle import RawDataset
from scarcelab.data.download import data_root
from scarcelab.data.sources._tiles import Resource, fetch
from scarcelab.errors import DataError
from scarcelab.extras import need

HOMEPAGE = "https://zenodo.org/records/2546921"
_URL = "https://zenodo.org/records/2546921/files/{}?download=1"
_MD5 = {  # .h5.gz, torchvision 0.29.1 datasets/pcam.py
    "train_x": "1571f514728f59376b705fc836ff4b63", "train_y": "35c2d7259d906cfc8143347bb8e05be7",
    "valid_x": "d5b63470df7cfa627aeec8b9dc0c066e", "valid_y": "2b85f58b927af9964a4c15b8f7e8f179",
    "test_x": "d8c2d60d490dbd479f8199bdfa0cf6ec", "test_y": "60a7035772fbdb7f34eb86d4420cf66a",
}
RESOURCES = {k: Resource(f"camelyonpatch_level_2_split_{k}.h5.gz",
                         _URL.format(f"camelyonpatch_level_2_split_{k}.h5.gz"), v, "gz")
             for k, v in _MD5.items()}
CLASSES = ("no tumour", "metastatic tumour")


def _read(path: Path, key: str, idx: np.ndarray | None) -> np.ndarray:
    h5py = need("h5py", "the pcam dataset (PatchCamelyon's HDF5 files)")

    try:
        _provenance.record(path)  # the run logs which bytes it read
        with h5py.File(path, "r") as f:
            if key not in f:
                raise DataError(f"{path}: no dataset {key!r} (found {list(f)}); expected "
                                "PatchCamelyon's published HDF5 file")
            d = f[key]
            return np.asarray(d[np.sort(idx)] if idx is not None else d[:])
    except OSError as e:
        raise DataError(f"{path} is not a readable HDF5 file ({e}); delete it to have it "
                        "downloaded again") from e


def _split(root: Path, split: str, download: bool, md5: dict[str, str],
           max_n: int | None, seed: int) -> tuple[np.ndarray, np.ndarray]:
    paths = {}
    for kind in ("x", "y"):
        res = RESOURCES[f"{split}_{kind}"]
        p = root / res.filename.removesuffix(".gz")
        if not p.is_file() and download:
            fetch("pcam", res, root, HOMEPAGE, md5=md5.get(res.filename))
        if not p.is_file():
            raise DataError(f"{p} does not exist; PatchCamelyon is published at {HOMEPAGE}")
        paths[kind] = p
    y = _read(paths["y"], "y", None).reshape(-1).astype(np.int64)
    idx = None
    if max_n is not None and max_n < len(y):
        idx = np.sort(np.random.default_rng(seed).choice(len(y), max_n, replace=False))
        y = y[idx]
    x = _read(paths["x"], "x", idx)
    if x.ndim != 4 or x.shape[-1] != 3 or len(x) != len(y):
        raise DataError(f"{paths['x']}: images of shape {x.shape} for {len(y)} labels; expected "
                        "(N, 96, 96, 3)")
    if not np.isin(y, (0, 1)).all():
        raise DataError(f"{paths['y']}: labels outside {{0, 1}}")
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2)).astype(np.uint8), y


def load_pcam(data_dir: str | Path | None = None, download: bool = True,
              md5: dict[str, str] | None = None, max_train: int | None = None,
              seed: int = 0) -> RawDataset:
    root = data_root(data_dir) / "pcam"
    md5 = md5 or {}
    xtr, ytr = _split(root, "train", download, md5, max_train, seed)
    xva, yva = _split(root, "valid", download, md5, None, seed)
    xte, yte = _split(root, "test", download, md5, None, seed)
    return RawDataset(name="pcam", train_x=xtr, train_y=ytr, test_x=xte, test_y=yte,
                      num_classes=2, class_names=list(CLASSES), val_x=xva, val_y=yva,
                      source=str(root), positive_class=1)  # metastatic tumour


@DATASETS.register("pcam")
def _load(data_dir: str | Path | None = None) -> RawDataset:
    return load_pcam(data_dir)


__all__ = ["RESOURCES", "load_pcam"]
