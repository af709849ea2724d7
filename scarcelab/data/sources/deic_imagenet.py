"""``imagenet50``: ImageNet (ILSVRC 2012) with 50 training images per class in the DEIC split
(1,000 classes, 50,000 trainval, 50,000 test images taken from the official training
set), stored at 224 px. ImageNet has no public download: extract the ILSVRC 2012
training images (``n01440764/n01440764_141.JPEG`` …) into ``<data root>/deic/imagenet50/images``."""

from __future__ import annotations

import os

from scarcelab.data import DATASETS
from scarcelab.data.bundle import RawDataset
from scarcelab.data.sources._deic import DEICSource, load_deic

SOURCE = DEICSource(
    name="imagenet50", folder="imagenet", num_classes=1000, channels=3, size=224,
    manual="ImageNet needs an account at image-net.org: extract the ILSVRC 2012 training "
           "images (<wnid>/<wnid>_<n>.JPEG) into that folder.")


@DATASETS.register("imagenet50")
def load_imagenet50(data_dir: str | os.PathLike[str] | None = None) -> RawDataset:
    return load_deic(SOURCE, data_dir)
