"""``consep_patches``: CoNSeP (Graham et al. 2019) as 256x256 patches with instance maps and
four nucleus types, in CoNSeP's own train (27 images, 432 patches) / test (14 images, 224
patches) split — ``../shared/data/consep_patches`` (see its MANIFEST.md entry).

The patches overlap, so some nuclei appear in two patches: patch-level PQ/mPQ is not the
official whole-image CoNSeP evaluation and must not be compared with published figures.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from scarcelab.data.nuclei import (
    SEG_DATASETS,
    NucleiDataset,
    NucleiTile,
    dataset_dir,
    read_label_image,
    read_rgb,
)
from scarcelab.data.safe_read import read_json
from scarcelab.errors import DataError

_CACHE: dict[str, NucleiDataset] = {}


def _split(root: Path, split: str, inst_type: dict[str, list[int]]) -> list[NucleiTile]:
    tiles = []
    for img in sorted((root / split / "images").glob("*.jpg")):
        key = f"{split}/{img.stem}"
        png = root / split / "inst_png" / f"{img.stem}.png"
        if not png.exists() or key not in inst_type:
            raise DataError(f"{img}: no instance map {png.name} or no inst_type[{key!r}] in "
                            f"{root / 'inst_types.json'}")
        inst = read_label_image(png).astype(np.int32)
        types = {i + 1: int(t) for i, t in enumerate(inst_type[key])}
        tiles.append(NucleiTile(key, read_rgb(img), inst, types,
                                group=img.stem.rsplit("_", 1)[0]))
    if not tiles:
        raise DataError(f"{root / split / 'images'}: no .jpg patches")
    return tiles


@SEG_DATASETS.register("consep_patches")
def load_consep_patches(data_dir: str | Path | None = None) -> NucleiDataset:
    root = dataset_dir("consep_patches", data_dir, "inst_types.json")
    if str(root) not in _CACHE:
        meta_path = root / "inst_types.json"
        meta = read_json(meta_path, fix="restore it from the dataset's source")
        try:
            names = {int(k): v for k, v in meta["type_names"].items() if int(k) != 0}
            if not isinstance(meta["inst_type"], dict):
                raise TypeError
        except (KeyError, TypeError, ValueError, AttributeError):
            raise DataError(f"{meta_path}: expected an object with 'type_names' "
                            "{id: name} and 'inst_type' entries; restore it from the "
                            "dataset's source") from None
        _CACHE[str(root)] = NucleiDataset(
            "consep_patches", _split(root, "train", meta["inst_type"]),
            _split(root, "test", meta["inst_type"]), names, str(root))
    return _CACHE[str(root)]
