"""``imagenet50``: ImageNet (ILSVRC 2012) with 50 training images per class in the DEIC split
(1,000 classes, 50,000 trainval, 50,000 test images taken from the official training
set), stored at 224 px for evaluation. Training crops come from the whole image stored at
320², not at 708² (224/√0.1, the minimum crop area of its RandomResizedCrop), which would
take 75 GB for the 50,000 trainval images: at 320² they take 15 GB, and a 10 % crop spans
~100 stored pixels (upsampled ~2.2×, about what gem does to a 10 % crop of a typical
~400×350 ImageNet original). ImageNet has no public download: extract the ILSVRC 2012
training images (``n01440764/n01440764_141.JPEG`` …) into
``<data root>/deic/imagenet50/images``."""

from __future__ import annotations

from scarcelab.data import DATASETS
from scarcelab.data.sources._deic import DEICSource, deic_loader

SOURCE = DEICSource(
    name="imagenet50", folder="imagenet", num_classes=1000, channels=3, size=224,
    train_side=320,
    manual="ImageNet needs an account at image-net.org: extract the ILSVRC 2012 training "
           "images (<wnid>/<wnid>_<n>.JPEG) into that folder.")


load_imagenet50 = DATASETS.register("imagenet50")(deic_loader(SOURCE))
