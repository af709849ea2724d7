"""``clamm``: CLaMM 2016 (medieval script types, 12 classes, grayscale) in the DEIC split:
50 trainval images per class, 2,000 test images, stored at 224 px, one channel, for
evaluation; training crops come from the whole image stored at 512² (≈ 224/√0.2)."""

from __future__ import annotations

from scarcelab.data import DATASETS
from scarcelab.data.sources._deic import Archive, DEICSource, deic_loader

_BASE = "https://clamm.irht.cnrs.fr/wp-content/uploads/"
SOURCE = DEICSource(
    name="clamm", folder="clamm", num_classes=12, channels=1, size=224,
    archives=(Archive(_BASE + "ICFHR2016_CLaMM_Training.zip", "ICFHR2016_CLaMM_Training.zip"),
              Archive(_BASE + "ICFHR2016_CLaMM_task1.zip", "ICFHR2016_CLaMM_task1.zip")),
    train_side=512)


load_clamm = DATASETS.register("clamm")(deic_loader(SOURCE))
