"""``crc``: NCT-CRC-HE-100K (train) and CRC-VAL-HE-7K (test), Kather et al. 2018/2019 —
colorectal H&E tiles, 224x224 px at 0.5 µm/px, 9 tissue classes, one folder per class of
TIF files (the published layout: ``NCT-CRC-HE-100K/<CLASS>/*.tif``,
``CRC-VAL-HE-7K/<CLASS>/*.tif``). The test set comes from 50 patients not in the training
set (the record's description), so this is Kang et al.'s CRC split.

Published at https://zenodo.org/records/1214456 (CC BY 4.0). md5 of the two archives as
listed on that record (also in kaiko-ai/eva's ``crc.py``): NCT-CRC-HE-100K.zip
``035777cf327776a71a05c95da6d6325f`` (11.7 GB), CRC-VAL-HE-7K.zip
``2fd1651b4f94ebd818ebf90ad2b6ce06`` (800 MB). PathMNIST is this data at 28x28.

Tiles are read at ``size`` px (default 64, area-averaged: the 100,000 training tiles take
1.2 GB in memory at 64 px and 15 GB at the native 224); :func:`load_crc` takes any size.
"""

from __future__ import annotations

from pathlib import Path

from scarcelab.data import DATASETS
from scarcelab.data.bundle import RawDataset
from scarcelab.data.download import data_root
from scarcelab.data.sources._tiles import Resource, class_folder_files, fetch, read_images

CLASSES = ("ADI", "BACK", "DEB", "LYM", "MUC", "MUS", "NORM", "STR", "TUM")
CLASS_NAMES = ("adipose", "background", "debris", "lymphocytes", "mucus", "smooth muscle",
               "normal colon mucosa", "cancer-associated stroma",
               "colorectal adenocarcinoma epithelium")
HOMEPAGE = "https://zenodo.org/records/1214456"
RESOURCES = {
    "train": Resource("NCT-CRC-HE-100K.zip",
                      "https://zenodo.org/records/1214456/files/NCT-CRC-HE-100K.zip?download=1",
                      "035777cf327776a71a05c95da6d6325f", "zip", "11.7 GB"),
    "test": Resource("CRC-VAL-HE-7K.zip",
                     "https://zenodo.org/records/1214456/files/CRC-VAL-HE-7K.zip?download=1",
                     "2fd1651b4f94ebd818ebf90ad2b6ce06", "zip", "800 MB"),
}
DEFAULT_SIZE = 64


def load_crc(data_dir: str | Path | None = None, size: int = DEFAULT_SIZE,
             download: bool = True, md5: dict[str, str] | None = None) -> RawDataset:
    """Read ``<root>/crc/{NCT-CRC-HE-100K,CRC-VAL-HE-7K}``, downloading what is absent.
    ``md5`` maps a resource file name to a checksum replacing the published one."""
    root = data_root(data_dir) / "crc"
    arrays = {}
    for split, res in RESOURCES.items():
        folder = root / res.filename.removesuffix(".zip")
        if not folder.is_dir() and download:
            fetch("crc", res, root, HOMEPAGE, md5=(md5 or {}).get(res.filename))
        files, y = class_folder_files(folder, CLASSES)
        arrays[split] = (read_images(files, size), y)
    return RawDataset(name="crc", train_x=arrays["train"][0], train_y=arrays["train"][1],
                      test_x=arrays["test"][0], test_y=arrays["test"][1],
                      num_classes=len(CLASSES), class_names=list(CLASS_NAMES),
                      source=str(root))


@DATASETS.register("crc")
def _load(data_dir: str | Path | None = None) -> RawDataset:
    return load_crc(data_dir)


__all__ = ["CLASSES", "RESOURCES", "load_crc"]
