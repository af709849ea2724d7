"""``cub``: CUB-200-2011 in the DEIC split (200 classes, 30 trainval images per class =
the official training set, 5,794 test images), stored at 224 px for evaluation;
training crops come from the whole image stored at 352² (≈ 224/√0.4, the minimum crop area
of its RandomResizedCrop)."""

from __future__ import annotations

from scarcelab.data import DATASETS
from scarcelab.data.sources._deic import Archive, DEICSource, deic_loader

SOURCE = DEICSource(
    name="cub", folder="cub", num_classes=200, channels=3, size=224,
    archives=(Archive("https://data.caltech.edu/records/65de6-vp158/files/CUB_200_2011.tgz",
                      "CUB_200_2011.tgz"),),
    train_side=352)


load_cub = DATASETS.register("cub")(deic_loader(SOURCE))
