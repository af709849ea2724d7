"""``nuclei_cpm15``: the 15 H&E tiles of the MICCAI 2015 nucleus segmentation challenge
(CPM-15) with instance masks and no nucleus types — PQ, not mPQ.

The challenge released no test labels, so the split is ours and fixed: five test tiles,
two of the seven 20x tiles and three of the eight 40x ones (magnifications from the
challenge's README_training.txt), so both scales are tested.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from scarcelab.data import provenance as _provenance
from scarcelab.data.nuclei import SEG_DATASETS, NucleiDataset, NucleiTile, dataset_dir, read_rgb
from scarcelab.data.safe_read import load_npz
from scarcelab.errors import DataError

TEST_TILES = ("image06", "image07", "image13", "image14", "image15")
ALL_TILES = tuple(f"image{i:02d}" for i in range(1, 16))


_CACHE: dict[str, NucleiDataset] = {}


def _masks(path: Path) -> dict[str, np.ndarray]:
    """The instance masks, or a :class:`DataError` naming the file (a truncated or foreign
    .npz otherwise ends in a zipfile / zlib traceback)."""
    _provenance.record(path)  # the run logs which bytes it read
    return load_npz(path, fix="an .npz of instance masks was expected: restore it from the "
                    "dataset's source")


@SEG_DATASETS.register("nuclei_cpm15")
def load_cpm15(data_dir: str | Path | None = None) -> NucleiDataset:
    """Loaded once per folder and process: a cross-test set is read before training, to
    refuse a bad file up front, and again where it is scored."""
    root = dataset_dir("nuclei_cpm15", data_dir, "instance_masks.npz")
    if str(root) not in _CACHE:
        _CACHE[str(root)] = _load(root)
    return _CACHE[str(root)]


def _load(root: Path) -> NucleiDataset:
    masks = _masks(root / "instance_masks.npz")
    train, test = [], []
    for name in ALL_TILES:
        if name not in masks or not (root / f"{name}.png").exists():
            raise DataError(f"{root}: {name}.png or key {name!r} of instance_masks.npz missing")
        tile = NucleiTile(name, read_rgb(root / f"{name}.png"), masks[name].astype(np.int32),
                          None, group=name)
        (test if name in TEST_TILES else train).append(tile)
    return NucleiDataset("nuclei_cpm15", train, test, None, str(root))
