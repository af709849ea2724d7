"""``cub``: CUB-200-2011 in the DEIC split (200 classes, 30 trainval images per class =
the official training set, 5,794 test images), stored at 224 px."""

from __future__ import annotations

import os

from scarcelab.data import DATASETS
from scarcelab.data.bundle import RawDataset
from scarcelab.data.sources._deic import Archive, DEICSource, load_deic

SOURCE = DEICSource(
    name="cub", folder="cub", num_classes=200, channels=3, size=224,
    archives=(Archive("https://data.caltech.edu/records/65de6-vp158/files/CUB_200_2011.tgz",
                      "CUB_200_2011.tgz"),))


@DATASETS.register("cub")
def load_cub(data_dir: str | os.PathLike[str] | None = None) -> RawDataset:
    return load_deic(SOURCE, data_dir)
