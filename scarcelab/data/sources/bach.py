"""``bach``: ICIAR 2018 BACH (Aresta et al. 2019), breast H&E microscopy photographs,
2048x1536 px TIFs in four class folders (the published layout:
``ICIAR2018_BACH_Challenge/Photos/{Benign,InSitu,Invasive,Normal}/*.tif``; 100 per class).

Published at https://zenodo.org/records/3632035 (CC BY-NC-ND 4.0) as
``ICIAR2018_BACH_Challenge.zip``; md5 ``8ae1801334aa943c44627c1eef3631b2`` as given in
kaiko-ai/eva's BACH dataset class (Zenodo lists md5 values per file; not checked against
the record from here). The challenge's test photographs are unlabeled, so the labeled
photographs are split here: a seeded 20 % per class (seed 0, fixed — every run scores on
the same photographs) is the test split. The photographs carry no patient ids, so one
patient may appear on both sides; Kang et al. report BACH the same way (their split is
also by image), but say so with any number.

Photographs are read as the centred 1536x1536 square, area-resized to ``size`` (default
128).
"""

from __future__ import annotations

from pathlib import Path

from scarcelab.data import DATASETS
from scarcelab.data.bundle import RawDataset
from scarcelab.data.download import data_root
from scarcelab.data.sources._tiles import (
    Resource,
    class_folder_files,
    fetch,
    read_images,
    stratified_holdout,
)

CLASSES = ("Benign", "InSitu", "Invasive", "Normal")
HOMEPAGE = "https://zenodo.org/records/3632035"
RESOURCE = Resource("ICIAR2018_BACH_Challenge.zip",
                    "https://zenodo.org/records/3632035/files/ICIAR2018_BACH_Challenge.zip"
                    "?download=1", "8ae1801334aa943c44627c1eef3631b2", "zip", "10.4 GB")
PHOTOS = Path("ICIAR2018_BACH_Challenge") / "Photos"
TEST_FRACTION = 0.2
DEFAULT_SIZE = 128


def load_bach(data_dir: str | Path | None = None, size: int = DEFAULT_SIZE,
              download: bool = True, md5: str | None = None) -> RawDataset:
    root = data_root(data_dir) / "bach"
    folder = root / PHOTOS
    if not folder.is_dir() and download:
        fetch("bach", RESOURCE, root, HOMEPAGE, md5=md5)
    files, y = class_folder_files(folder, CLASSES)
    x = read_images(files, size)
    test = stratified_holdout(y, TEST_FRACTION, seed=0)
    train = sorted(set(range(len(y))) - set(test.tolist()))
    return RawDataset(name="bach", train_x=x[train], train_y=y[train], test_x=x[test],
                      test_y=y[test], num_classes=len(CLASSES), class_names=list(CLASSES),
                      source=str(folder))


@DATASETS.register("bach")
def _load(data_dir: str | Path | None = None) -> RawDataset:
    return load_bach(data_dir)


__all__ = ["CLASSES", "RESOURCE", "load_bach"]
