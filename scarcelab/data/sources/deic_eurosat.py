"""``eurosat``: EuroSAT multispectral (Sentinel-2, all 13 bands, 64×64) in the DEIC split:
10 classes, 50 trainval images per class, 19,500 test images. ``in_channels`` = 13."""

from __future__ import annotations

import os

from scarcelab.data import DATASETS
from scarcelab.data.bundle import RawDataset
from scarcelab.data.sources._deic import Archive, DEICSource, load_deic

SOURCE = DEICSource(
    name="eurosat", folder="eurosat", num_classes=10, channels=13, size=64,
    archives=(Archive("http://madm.dfki.de/files/sentinel/EuroSATallBands.zip",
                      "EuroSATallBands.zip"),))


@DATASETS.register("eurosat")
def load_eurosat(data_dir: str | os.PathLike[str] | None = None) -> RawDataset:
    return load_deic(SOURCE, data_dir)
