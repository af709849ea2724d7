"""``consep``: the original CoNSeP release (Graham et al. 2019, HoVer-Net) in its own
layout — ``Train|Test/Images/<name>.png`` (1000x1000 RGBA) beside
``Train|Test/Labels/<name>.mat`` holding ``inst_map`` (H x W, 0 = background, 1..N),
``type_map`` (H x W, type per pixel) and ``inst_type`` (N x 1, type of nucleus i at row
i-1). Point ``data_dir`` at the folder that holds ``Train`` and ``Test``.

The release labels seven types; as in the HoVer-Net paper (§4.1) they are merged into
four: 1 other (miscellaneous), 2 inflammatory, 3 epithelial (3 normal + 4
malignant/dysplastic), 4 spindle-shaped (5 fibroblast + 6 muscle + 7 endothelial) — the
same four as ``consep_patches``. ``merge_types=False`` keeps the seven.

Nothing is unpickled: ``scipy.io.loadmat`` reads MATLAB arrays only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from scarcelab.data import provenance as _provenance
from scarcelab.data.nuclei import SEG_DATASETS, NucleiDataset, NucleiTile, read_rgb
from scarcelab.errors import DataError

FOUR_TYPES = {1: "other", 2: "inflammatory", 3: "epithelial", 4: "spindle-shaped"}
SEVEN_TYPES = {1: "other", 2: "inflammatory", 3: "healthy epithelial",
               4: "dysplastic/malignant epithelial", 5: "fibroblast", 6: "muscle",
               7: "endothelial"}
MERGE = {1: 1, 2: 2, 3: 3, 4: 3, 5: 4, 6: 4, 7: 4}


def read_consep_mat(path: Path, merge_types: bool = True) -> tuple[np.ndarray, dict[int, int]]:
    """(instance map, instance id -> type) of one CoNSeP label file."""
    from scipy.io import loadmat

    try:
        _provenance.record(path)  # the run logs which bytes it read
        m = loadmat(path)
    except Exception as e:  # noqa: BLE001 - any failure of the parser means a bad file
        # a truncated file fails in scipy's reader (IndexError, ValueError, MatReadError)
        # or in zlib; a v7.3 (HDF5) file is NotImplementedError
        raise DataError(f"{path}: not a readable MATLAB .mat file ({type(e).__name__}: {e}); "
                        "restore it from the CoNSeP release") from None
    if "inst_map" not in m:
        keys = sorted(k for k in m if not k.startswith("__"))
        raise DataError(f"{path}: no 'inst_map' array (keys: {keys}); is this a CoNSeP "
                        "label file?")
    inst = np.asarray(m["inst_map"]).astype(np.int32)
    ids = [int(i) for i in np.unique(inst) if i != 0]
    if "inst_type" in m:
        raw = np.asarray(m["inst_type"]).reshape(-1).astype(np.int64)
        if ids and max(ids) > len(raw):
            raise DataError(f"{path}: inst_map has id {max(ids)} but inst_type only "
                            f"{len(raw)} rows")
        types = {i: int(raw[i - 1]) for i in ids}
    elif "type_map" in m:  # derive: the most frequent non-zero type under each nucleus
        tmap = np.asarray(m["type_map"]).astype(np.int64)
        types = {}
        for i in ids:
            v = tmap[inst == i]
            v = v[v > 0]
            types[i] = int(np.bincount(v).argmax()) if len(v) else 1
    else:
        raise DataError(f"{path}: neither 'inst_type' nor 'type_map' present")
    bad = {t for t in types.values() if t not in MERGE}
    if bad:
        raise DataError(f"{path}: nucleus types {sorted(bad)} outside CoNSeP's 1..7")
    if merge_types:
        types = {i: MERGE[t] for i, t in types.items()}
    return inst, types


def _split(root: Path, split: str, merge_types: bool) -> list[NucleiTile]:
    tiles = []
    for img in sorted((root / split / "Images").glob("*.png")):
        lab = root / split / "Labels" / f"{img.stem}.mat"
        if not lab.exists():
            raise DataError(f"{img}: label file {lab} missing")
        inst, types = read_consep_mat(lab, merge_types)
        tiles.append(NucleiTile(f"{split.lower()}/{img.stem}", read_rgb(img), inst, types,
                                group=img.stem))
    if not tiles:
        raise DataError(f"{root / split / 'Images'}: no .png images (expected the CoNSeP "
                        "release layout Train|Test/Images + Labels)")
    return tiles


def load_consep_release(root: str | Path, merge_types: bool = True) -> NucleiDataset:
    root = Path(root).expanduser()
    return NucleiDataset("consep", _split(root, "Train", merge_types),
                         _split(root, "Test", merge_types),
                         FOUR_TYPES if merge_types else SEVEN_TYPES, str(root))


@SEG_DATASETS.register("consep")
def load_consep(data_dir: str | Path | None = None) -> NucleiDataset:
    if not data_dir:
        raise DataError("consep (the original .mat release) is not in ../shared/data: pass "
                        "data_dir=<folder with Train/ and Test/> (or use consep_patches)")
    return load_consep_release(data_dir)
