"""``cifar10_5k``: the CIFAR-10 JPEG subset of the shared data — 5,000 training images (500
per class, ``cifar10_train_500perclass_jpg.zip``) and the full 10,000-image test set
(``cifar10_test_10000_jpg.zip``), both ``<split>/<class>/NNNN.jpg``.

The JPEG re-encodings differ slightly from the official pixel arrays (MANIFEST.md), so
numbers on this set are comparable with each other, not with published CIFAR-10 figures.
Decoding 15,000 JPEGs takes seconds; the result is kept per process.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from scarcelab.data import DATASETS
from scarcelab.data import provenance as _provenance
from scarcelab.data.bundle import RawDataset
from scarcelab.data.ood import find_shared_file
from scarcelab.data.safe_read import pil_image, zip_archive, zip_member
from scarcelab.errors import DataError

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
           "truck")
ZIPS = {"train": "cifar10_jpg/cifar10_train_500perclass_jpg.zip",
        "test": "cifar10_jpg/cifar10_test_10000_jpg.zip"}
_CACHE: dict[str, tuple[np.ndarray, np.ndarray]] = {}


def _read_zip(path: Path) -> tuple[np.ndarray, np.ndarray]:
    if str(path) in _CACHE:
        return _CACHE[str(path)]
    xs, ys = [], []
    _provenance.record(path)  # the run logs which bytes it read
    fix = "restore it from ../shared/data (sha256sum -c SHA256SUMS)"
    with zip_archive(path, fix=fix) as z:
        for m in sorted(z.namelist()):
            if not m.lower().endswith(".jpg"):
                continue
            cls = Path(m).parent.name
            if cls not in CLASSES:
                raise DataError(f"{path}: member {m!r} is not under a CIFAR-10 class folder "
                                f"({', '.join(CLASSES)})")
            with pil_image(zip_member(z, m, fix=fix), name=f"{path}:{m}", fix=fix) as pim:
                im = pim.convert("RGB")
            if im.size != (32, 32):
                im = im.resize((32, 32))
            xs.append(np.asarray(im).transpose(2, 0, 1))
            ys.append(CLASSES.index(cls))
    if not xs:
        raise DataError(f"{path}: no .jpg members found")
    _CACHE[str(path)] = (np.stack(xs).astype(np.uint8), np.asarray(ys, dtype=np.int64))
    return _CACHE[str(path)]


@DATASETS.register("cifar10_5k")
def load_cifar10_5k(data_dir: str | Path | None = None) -> RawDataset:
    tr_p, te_p = (find_shared_file(ZIPS[s], data_dir) for s in ("train", "test"))
    (xtr, ytr), (xte, yte) = _read_zip(tr_p), _read_zip(te_p)
    return RawDataset(name="cifar10_5k", train_x=xtr, train_y=ytr, test_x=xte, test_y=yte,
                      num_classes=10, class_names=list(CLASSES), source=str(tr_p))
