"""Nuclei instance-segmentation data: tiles with instance maps (and nucleus types).

A loader is registered by name in ``SEG_DATASETS`` (one file per source in this package)
and returns a :class:`NucleiDataset` with the source's own train/test split. Validation is
carved out of *train* by :func:`split_validation`, by whole source image: CoNSeP's patches
overlap, so a patch-level split would leak the same nuclei into validation.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scarcelab.data import provenance as _provenance
from scarcelab.errors import ConfigError, DataError
from scarcelab.registry import PACKAGES, Registry

SEG_DATASETS: Registry = Registry("segmentation dataset",
                                       PACKAGES["segmentation dataset"])


@dataclass
class NucleiTile:
    """One image with its instance map. ``types`` maps instance id -> type id (1..T), or is
    None for a source without types; ``group`` is the source image a patch was cut from."""

    name: str
    image: np.ndarray  # (H, W, 3) uint8 RGB
    inst: np.ndarray  # (H, W) int32, 0 = background, 1..N nuclei
    types: dict[int, int] | None
    group: str

    def __post_init__(self) -> None:
        if self.image.ndim != 3 or self.image.shape[2] != 3 or self.image.dtype != np.uint8:
            raise DataError(f"tile {self.name}: image must be (H, W, 3) uint8, got "
                            f"{self.image.shape} {self.image.dtype}")
        if self.inst.shape != self.image.shape[:2]:
            raise DataError(f"tile {self.name}: instance map {self.inst.shape} does not match "
                            f"the image {self.image.shape[:2]}")
        if self.types is not None:
            missing = set(np.unique(self.inst).tolist()) - {0} - set(self.types)
            if missing:
                raise DataError(f"tile {self.name}: instances {sorted(missing)[:5]} have no "
                                "type")


@dataclass
class NucleiDataset:
    name: str
    train: list[NucleiTile]
    test: list[NucleiTile]
    type_names: dict[int, str] | None  # type id -> name (no background), None = untyped
    source: str

    def digest(self) -> str:
        """A content hash of the instance maps and images (cheap: strided pixels)."""
        h = hashlib.sha256()
        for t in (*self.train, *self.test):
            h.update(t.name.encode())
            h.update(np.ascontiguousarray(t.inst[::4, ::4]).tobytes())
            h.update(np.ascontiguousarray(t.image[::8, ::8]).tobytes())
        return h.hexdigest()[:16]


def dataset_dir(folder: str, data_dir: str | Path | None, marker: str) -> Path:
    """The folder of a shared-data source: ``data_dir`` itself or ``data_dir/folder``, else
    ``$SCARCELAB_DATA/folder`` or ``$SCARCELAB_SHARED_DATA/folder``, else
    ``../shared/data/folder`` (beside the checkout, or relative to the working directory).
    ``marker`` is a file the folder must contain."""
    cands: list[Path] = []
    if data_dir:
        d = Path(data_dir).expanduser()
        cands += [d, d / folder]
    else:
        for var in ("SCARCELAB_DATA", "SCARCELAB_SHARED_DATA"):
            if os.environ.get(var):
                cands.append(Path(os.environ[var]).expanduser() / folder)
        cands.append(Path(__file__).resolve().parents[4] / "shared" / "data" / folder)
        cands.append(Path.cwd().parent / "shared" / "data" / folder)
    for c in cands:
        if (c / marker).exists():
            return c
    raise DataError(f"{folder}: no folder with {marker} found (tried: "
                    f"{', '.join(str(c) for c in cands)}); pass data_dir=<the {folder} folder>")


def load_nuclei(name: str, data_dir: str | Path | None = None) -> NucleiDataset:
    return SEG_DATASETS.get(name)(data_dir=data_dir)


def split_validation(tiles: list[NucleiTile], fraction: float, seed: int
                     ) -> tuple[list[NucleiTile], list[NucleiTile]]:
    """(train, val): a seeded ``fraction`` of the source images (at least one, at most all
    but one) goes to validation with all of its patches."""
    if not 0 < fraction < 1:
        raise ConfigError(f"val_fraction must be in (0, 1), got {fraction}")
    groups = sorted({t.group for t in tiles})
    if len(groups) < 2:
        raise DataError("need at least two source images to hold one out for validation")
    n_val = min(len(groups) - 1, max(1, round(fraction * len(groups))))
    rng = np.random.default_rng(seed)
    val_groups = {groups[i] for i in rng.choice(len(groups), n_val, replace=False)}
    return ([t for t in tiles if t.group not in val_groups],
            [t for t in tiles if t.group in val_groups])


def _decode(path: Path, mode: str | None) -> np.ndarray:
    """The pixels of an image file, decoded in full (``load`` inside the ``try``: PIL reads
    lazily, and a truncated JPEG only fails once its pixels are read), or a
    :class:`DataError` naming the file: a truncated or corrupt tile must not end a run in
    a traceback from deep inside PIL."""
    from PIL import Image

    _provenance.record(path)  # the run logs which bytes it read
    try:
        with Image.open(path) as im:
            im.load()
            return np.asarray(im.convert(mode) if mode else im)
    except FileNotFoundError:
        raise DataError(f"{path}: file not found; restore it from the dataset's source"
                        ) from None
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        # UnidentifiedImageError and "image file is truncated" are OSErrors; PIL raises
        # SyntaxError / ValueError for some malformed headers
        raise DataError(f"{path}: not a readable image ({type(e).__name__}: {e}); the file "
                        "is truncated or corrupt — restore it from the dataset's source "
                        "(or remove it with its label file)") from None


def read_rgb(path: Path) -> np.ndarray:
    """An image file as (H, W, 3) uint8 RGB (an alpha channel is dropped)."""
    return _decode(path, "RGB").astype(np.uint8, copy=False)


def read_label_image(path: Path) -> np.ndarray:
    """A label image (an instance map saved as PNG) with its stored values, as decoded."""
    return _decode(path, None)


__all__ = ["SEG_DATASETS", "NucleiDataset", "NucleiTile", "dataset_dir", "load_nuclei",
           "read_label_image", "read_rgb", "split_validation"]
