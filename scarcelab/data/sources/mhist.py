"""``mhist``: MHIST (Wei et al. 2021), 3,152 colorectal polyp H&E images, 224x224 PNGs in
``images/``, with ``annotations.csv`` — columns ``Image Name``, ``Majority Vote Label``
(``HP`` hyperplastic polyp / ``SSA`` sessile serrated adenoma), ``Number of Annotators who
Selected SSA (Out of 7)``, ``Partition`` (``train`` / ``test``: the official split,
2,175 / 977 images). The loader follows that partition column.

MHIST is released through a data-use form (https://bmirds.github.io/MHIST/): the
download links are e-mailed and no checksum is published, so nothing is verified and
there is no default URL. With the links, set ``SCARCELAB_MHIST_URL`` to a format string
with ``{filename}`` (``images.zip``, ``annotations.csv``) and the files are fetched like
the other sets; otherwise place them under ``<data root>/mhist/``.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np

from scarcelab.data import DATASETS
from scarcelab.data.bundle import RawDataset
from scarcelab.data.download import data_root
from scarcelab.data.sources._tiles import Resource, fetch, read_images
from scarcelab.errors import DataError

HOMEPAGE = "https://bmirds.github.io/MHIST/"
CLASSES = ("HP", "SSA")
RESOURCES = (Resource("annotations.csv", "", None), Resource("images.zip", "", None, "zip"))
COLUMNS = ("Image Name", "Majority Vote Label", "Partition")
DEFAULT_SIZE = 224


def load_mhist(data_dir: str | Path | None = None, size: int = DEFAULT_SIZE,
               download: bool = True, md5: dict[str, str] | None = None) -> RawDataset:
    root = data_root(data_dir) / "mhist"
    for res in RESOURCES:
        target = root / ("images" if res.unpack == "zip" else res.filename)
        if target.exists():
            continue
        if not (download and os.environ.get("SCARCELAB_MHIST_URL")):
            raise DataError(f"{target} does not exist. MHIST is distributed through a "
                            f"data-use form at {HOMEPAGE}; put annotations.csv and images/ "
                            f"under {root}, or set SCARCELAB_MHIST_URL to the e-mailed links "
                            "(a format string with {filename})")
        fetch("mhist", res, root, HOMEPAGE, md5=(md5 or {}).get(res.filename))
    ann = root / "annotations.csv"
    try:
        with open(ann, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except (UnicodeDecodeError, csv.Error) as e:
        raise DataError(f"{ann}: not a UTF-8 CSV file ({e}); restore the annotations.csv "
                        "that came with MHIST") from None
    missing = [c for c in COLUMNS if rows and c not in rows[0]]
    if not rows or missing:
        raise DataError(f"{ann}: expected columns {list(COLUMNS)}; missing {missing or 'rows'}")
    parts: dict[str, tuple[list[Path], list[int]]] = {"train": ([], []), "test": ([], [])}
    for i, r in enumerate(rows, start=2):
        if any(r.get(c) is None for c in COLUMNS):  # DictReader: a row cut short
            raise DataError(f"{ann} line {i}: {sum(v is not None for v in r.values())} "
                            f"column(s), expected {', '.join(COLUMNS)}; restore the "
                            "annotations.csv that came with MHIST")
        label, part = r["Majority Vote Label"].strip(), r["Partition"].strip().lower()
        if label not in CLASSES or part not in parts:
            raise DataError(f"{ann} line {i}: label {label!r} / partition {part!r}; expected "
                            f"one of {CLASSES} / train, test")
        p = root / "images" / r["Image Name"].strip()
        try:
            found = p.is_file()
        except (OSError, ValueError):  # a NUL byte, a name too long for the OS
            found = False
        if not found:
            raise DataError(f"{ann} line {i}: {str(p)[:200]!r} does not exist")
        parts[part][0].append(p)
        parts[part][1].append(CLASSES.index(label))
    if not parts["train"][0] or not parts["test"][0]:
        raise DataError(f"{ann}: the Partition column must hold both train and test rows")
    (ftr, ytr), (fte, yte) = parts["train"], parts["test"]
    return RawDataset(name="mhist", train_x=read_images(ftr, size),
                      train_y=np.asarray(ytr, dtype=np.int64), test_x=read_images(fte, size),
                      test_y=np.asarray(yte, dtype=np.int64), num_classes=2,
                      class_names=list(CLASSES), source=str(root),
                      positive_class=CLASSES.index("SSA"))  # precancerous; HP is benign


@DATASETS.register("mhist")
def _load(data_dir: str | Path | None = None) -> RawDataset:
    return load_mhist(data_dir)


__all__ = ["CLASSES", "load_mhist"]
