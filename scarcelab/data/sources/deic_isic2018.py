"""``isic2018``: ISIC 2018 task 3 (skin lesions, 7 classes) in the DEIC split: 80 trainval
images per class, 1,944 test images (unbalanced), stored at 224 px."""

from __future__ import annotations

import os

from scarcelab.data import DATASETS
from scarcelab.data.bundle import RawDataset
from scarcelab.data.sources._deic import Archive, DEICSource, load_deic

SOURCE = DEICSource(
    name="isic2018", folder="isic2018", num_classes=7, channels=3, size=224,
    archives=(Archive("https://isic-challenge-data.s3.amazonaws.com/2018/"
                      "ISIC2018_Task3_Training_Input.zip", "ISIC2018_Task3_Training_Input.zip"),))


@DATASETS.register("isic2018")
def load_isic2018(data_dir: str | os.PathLike[str] | None = None) -> RawDataset:
    return load_deic(SOURCE, data_dir)
