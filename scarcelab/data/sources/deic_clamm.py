"""``clamm``: CLaMM 2016 (medieval script types, 12 classes, grayscale) in the DEIC split:
50 trainval images per class, 2,000 test images, stored at 224 px, one channel."""

from __future__ import annotations

import os

from scarcelab.data import DATASETS
from scarcelab.data.bundle import RawDataset
from scarcelab.data.sources._deic import Archive, DEICSource, load_deic

_BASE = "https://clamm.irht.cnrs.fr/wp-content/uploads/"
SOURCE = DEICSource(
    name="clamm", folder="clamm", num_classes=12, channels=1, size=224,
    archives=(Archive(_BASE + "ICFHR2016_CLaMM_Training.zip", "ICFHR2016_CLaMM_Training.zip"),
              Archive(_BASE + "ICFHR2016_CLaMM_task1.zip", "ICFHR2016_CLaMM_task1.zip")))


@DATASETS.register("clamm")
def load_clamm(data_dir: str | os.PathLike[str] | None = None) -> RawDataset:
    return load_deic(SOURCE, data_dir)
