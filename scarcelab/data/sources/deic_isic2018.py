"""``isic2018``: ISIC 2018 task 3 (skin lesions, 7 classes) in the DEIC split: 80 trainval
images per class, 1,944 test images (unbalanced), stored at 224 px for
evaluation; training crops come from the whole image stored at 352² (≈ 224/√0.4)."""

from __future__ import annotations

from scarcelab.data import DATASETS
from scarcelab.data.sources._deic import Archive, DEICSource, deic_loader

SOURCE = DEICSource(
    name="isic2018", folder="isic2018", num_classes=7, channels=3, size=224,
    archives=(Archive("https://isic-challenge-data.s3.amazonaws.com/2018/"
                      "ISIC2018_Task3_Training_Input.zip", "ISIC2018_Task3_Training_Input.zip"),),
    train_side=352)


load_isic2018 = DATASETS.register("isic2018")(deic_loader(SOURCE))
