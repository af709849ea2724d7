"""Shared machinery of the pathology tile sets (BACH, CRC, PCam, MHIST; Kang et al. 2022):
published resources (URL + checksum), download-and-unpack into the data root, and reading
class-folder / listed images into uint8 (N, C, H, W) arrays at a fixed size.

Each resource is fetched with :func:`scarcelab.data.download.download` (temporary file,
md5 checked before the rename) and then unpacked (``zip``: members checked against path
traversal; ``gz``: streamed). A checksum that is not published is ``None`` and said so in
the dataset's file; the download is then accepted unverified with a warning.

Where the files come from can be redirected per dataset (a mirror, a local test server):
``SCARCELAB_<NAME>_URL`` is a format string with ``{filename}``.
"""

from __future__ import annotations

import gzip
import os
import shutil
import warnings
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scarcelab.data.download import download
from scarcelab.errors import DataError

IMAGE_EXTS = (".tif", ".tiff", ".png", ".jpg", ".jpeg")


@dataclass(frozen=True)
class Resource:
    """One published file: its name, where it is served, its md5 (``None``: not published,
    see the dataset's docstring) and how it unpacks (``zip``, ``gz`` or ``None``)."""

    filename: str
    url: str
    md5: str | None
    unpack: str | None = None
    size: str = ""  # as published, for messages (e.g. "11.7 GB")


def resource_url(name: str, res: Resource) -> str:
    template = os.environ.get(f"SCARCELAB_{name.upper()}_URL", "")
    return template.format(filename=res.filename) if template else res.url


def _safe_extract(zpath: Path, dest: Path) -> None:
    root = dest.resolve()
    with zipfile.ZipFile(zpath) as z:
        for m in z.infolist():
            target = (dest / m.filename).resolve()
            if root != target and root not in target.parents:
                raise DataError(f"{zpath}: member {m.filename!r} would be written outside "
                                f"{dest}; refusing to unpack this archive")
        z.extractall(dest)


def fetch(name: str, res: Resource, root: Path, homepage: str,
          md5: str | None = None, progress: bool = True) -> Path:
    """Download ``res`` into ``root`` (md5-checked) and unpack it; returns the file or, for
    archives, ``root``. ``md5`` overrides the published one (a different mirror)."""
    want = md5 or res.md5
    url = resource_url(name, res)
    hint = (f"{name} is published at {homepage}; set SCARCELAB_{name.upper()}_URL (with "
            "{filename}) to use a mirror, or place the unpacked files under " + str(root))
    if want is None:
        warnings.warn(f"{name}: no published checksum for {res.filename}; the download "
                      "cannot be verified", UserWarning, stacklevel=2)
    try:
        path = download(url, root / res.filename, md5=want, progress=progress, hint=hint)
    except OSError as e:
        raise DataError(f"{name}: cannot write to {root} ({e}). {hint}") from e
    if res.unpack == "zip":
        try:
            _safe_extract(path, root)
        except zipfile.BadZipFile as e:
            raise DataError(f"{path} is not a zip archive ({e}). {hint}") from e
        path.unlink()
        return root
    if res.unpack == "gz":
        out = root / res.filename.removesuffix(".gz")
        tmp = out.with_name(out.name + ".part")
        try:
            with gzip.open(path, "rb") as fin, open(tmp, "wb") as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
        except (OSError, EOFError) as e:
            tmp.unlink(missing_ok=True)
            raise DataError(f"{path} is not a gzip file ({e}). {hint}") from e
        tmp.replace(out)
        path.unlink()
        return out
    return path


def read_image(path: Path, size: int) -> np.ndarray:
    """RGB uint8 (3, size, size): the centred square crop of the image, resized (area
    averaging). Square tiles (CRC, PCam, MHIST) are only resized; BACH's 2048x1536
    photographs lose their left and right borders."""
    from PIL import Image

    from scarcelab.data.safe_read import pil_image

    with pil_image(path, fix="delete it or restore the original file") as im:
        rgb = im.convert("RGB")
    w, h = rgb.size
    s = min(w, h)
    left, top = (w - s) // 2, (h - s) // 2
    rgb = rgb.crop((left, top, left + s, top + s))
    if s != size:
        rgb = rgb.resize((size, size), Image.Resampling.BOX)
    return np.asarray(rgb, dtype=np.uint8).transpose(2, 0, 1)


def read_images(paths: Sequence[Path], size: int) -> np.ndarray:
    if not paths:
        return np.zeros((0, 3, size, size), dtype=np.uint8)
    return np.stack([read_image(p, size) for p in paths])


def class_folder_files(folder: Path, classes: Sequence[str],
                       exts: Sequence[str] = IMAGE_EXTS) -> tuple[list[Path], np.ndarray]:
    """Files of ``folder/<class>/*`` for the given classes, sorted; labels = class index."""
    if not folder.is_dir():
        raise DataError(f"{folder} does not exist")
    missing = [c for c in classes if not (folder / c).is_dir()]
    if missing:
        found = sorted(p.name for p in folder.iterdir() if p.is_dir())
        raise DataError(f"{folder}: class folder(s) {missing} missing (found {found}); "
                        f"expected one folder per class: {', '.join(classes)}")
    files: list[Path] = []
    labels: list[int] = []
    for i, c in enumerate(classes):
        got = sorted(p for p in (folder / c).iterdir()
                     if p.is_file() and p.suffix.lower() in exts)
        if not got:
            raise DataError(f"{folder / c} holds no images ({', '.join(exts)})")
        files += got
        labels += [i] * len(got)
    return files, np.asarray(labels, dtype=np.int64)


def stratified_holdout(y: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Indices of a seeded per-class hold-out (``fraction`` of each class, at least one)."""
    rng = np.random.default_rng(seed)
    out = [rng.choice(idx, max(1, round(fraction * len(idx))), replace=False)
           for c in np.unique(y) if len(idx := np.flatnonzero(y == c))]
    return np.sort(np.concatenate(out))


__all__ = ["IMAGE_EXTS", "Resource", "class_folder_files", "fetch", "read_image",
           "read_images", "resource_url", "stratified_holdout"]
