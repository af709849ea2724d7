"""Loading the "Tune It or Don't Use It" (DEIC) benchmark datasets from their published
split files.

The canonical splits are text files of the DEIC repository (github.com/cvjena/deic,
``datasets/<name>/{train,val,test}.txt``: ``<image path without extension> <label>`` per
line). They are fetched from a pinned commit and verified against md5 sums computed from
that commit, so a changed upstream file is refused instead of silently changing the
benchmark. Images come from the datasets' own archives (URLs from DEIC's
``download_data.sh``); none of them publishes a checksum, so an archive is verified by its
content instead: every image a split names must be found in it.

Images are stored as uint8 (C, S, S): RGB / grayscale ones resized so the short side is
``S`` and centre-cropped (gem's test transform ``Resize(S) + CenterCrop(S)``: what the
model is evaluated on), multispectral 16-bit TIFFs (EuroSAT, 13 bands) scaled by 1/16
(12-bit reflectance to 8 bits, clipped) — a quantisation the reference code does not have,
stated in docs/tune.md. A decoded split is cached as ``cache_<S>_<key>.npz`` next to the
images.

Training images of the RandomResizedCrop sets (gem crops the decoded *original*, so the
crop reaches the image edges and is not upsampled from a 224-px copy) come from
:func:`load_deic_whole`: every train / val image whole, resized to ``train_side`` ×
``train_side`` without keeping its aspect ratio, with its original (height, width) beside
it — the crop box is drawn in the original's pixels and mapped into the stored image
(``scarcelab.data.augment.crop_resize``), so nothing but resolution is lost, and the
memory is fixed per image whatever the originals' sizes (CUB, ISIC and CLaMM vary). The
side is about 224/√A_min, so a minimum-area crop still spans ~224 stored pixels; cached as
``whole_<side>_<key>.npz``.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, cast

import numpy as np

from scarcelab.data import provenance as _provenance
from scarcelab.data.bundle import RawDataset
from scarcelab.data.download import data_root, download, md5sum
from scarcelab.data.safe_read import load_npz, pil_image
from scarcelab.errors import DataError

DEIC_COMMIT = "f9b61daccbcad38bc5f5dc5f17ecd2fca0e2459e"
DEIC_RAW = f"https://raw.githubusercontent.com/cvjena/deic/{DEIC_COMMIT}/datasets"
SPLITS = ("train", "val", "test")
# md5 of each split file at DEIC_COMMIT (computed from that commit's blobs)
SPLIT_MD5: dict[tuple[str, str], str] = {
    ("cub", "train"): "1287ec62755f92c869daca80b374fea7",
    ("cub", "val"): "60aa5f0c868c79de88e62adec004746d",
    ("cub", "test"): "b05086e1a70cd5502f9e8b90dc2639c4",
    ("eurosat", "train"): "dffc55785d0f381e3178cff825b8a745",
    ("eurosat", "val"): "4a3b9ca7383479f41b5b451204322878",
    ("eurosat", "test"): "a498a1c218db063f5827b63b10aed6a3",
    ("isic2018", "train"): "01ddd550f1c08938ec262e1df7d856c6",
    ("isic2018", "val"): "f1ba0f30dcc8d1ef578fe7b608053fbf",
    ("isic2018", "test"): "89472035356083dd6f586b8846266c19",
    ("clamm", "train"): "477740b5a70889fc21869298e438cab2",
    ("clamm", "val"): "e155adec876612957eb8e2aaa0288dcd",
    ("clamm", "test"): "14f8d177e618c80e4e0a55fdc8f9fc6c",
    ("imagenet", "train"): "7d7f4b783bd4277aa3a8c3811764807a",
    ("imagenet", "val"): "3a3e7c221492a4ccd08e086083d2ddee",
    ("imagenet", "test"): "d7ef61481f516d9b69a43ef4980c3c03",
}
_EXTS = (".jpg", ".jpeg", ".JPEG", ".png", ".tif", ".tiff")


@dataclass(frozen=True)
class Archive:
    url: str
    filename: str
    md5: str | None = None  # none of the benchmark's image archives publishes one


@dataclass(frozen=True)
class DEICSource:
    """One benchmark dataset: where its splits and images come from and how to store it."""

    name: str  # registry name
    folder: str  # DEIC datasets/<folder>
    num_classes: int
    channels: int  # 3 RGB, 1 grayscale, 13 multispectral
    size: int  # stored side length
    archives: tuple[Archive, ...] = ()
    manual: str = ""  # how to get the images when there is no archive URL
    split_base_url: str = DEIC_RAW
    split_md5: dict[tuple[str, str], str] = field(default_factory=lambda: dict(SPLIT_MD5))
    train_side: int | None = None  # whole-image training store (RandomResizedCrop sets)


def read_split(path: Path) -> list[tuple[str, int]]:
    out = []
    _provenance.record(path)  # the run logs which bytes it read
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.rsplit(maxsplit=1)
        if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
            raise DataError(f"{path}:{i}: expected '<image> <label>', got {line!r}")
        out.append((parts[0], int(parts[1])))
    if not out:
        raise DataError(f"{path} lists no images")
    return out


def fetch_splits(src: DEICSource, root: Path) -> dict[str, Path]:
    """The three split files under ``root/deic/<name>/splits``, downloaded if missing and
    verified by md5 either way (a stale or edited copy is an error, not a new benchmark)."""
    out = {}
    for s in SPLITS:
        dest = root / "deic" / src.name / "splits" / f"{s}.txt"
        md5 = src.split_md5.get((src.folder, s))
        if not dest.exists():
            download(f"{src.split_base_url}/{src.folder}/{s}.txt", dest, md5, progress=False,
                     hint=f"(DEIC split file of {src.name}, commit {DEIC_COMMIT})")
        elif md5 is not None and md5sum(dest) != md5:
            raise DataError(f"{dest}: md5 {md5sum(dest)} differs from the published split "
                            f"({md5}); delete it to download the canonical file again")
        out[s] = dest
    return out


def _extract(archive: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            for m in z.namelist():
                target = (dest / m).resolve()
                if not str(target).startswith(str(dest.resolve())):
                    raise DataError(f"{archive}: member {m!r} escapes the target folder")
            z.extractall(dest)
    elif tarfile.is_tarfile(archive):
        with tarfile.open(archive) as t:
            t.extractall(dest, filter="data")
    else:
        raise DataError(f"{archive} is neither a zip nor a tar archive")


def fetch_images(src: DEICSource, root: Path) -> Path:
    """``root/deic/<name>/images``: downloaded and extracted when absent."""
    images = root / "deic" / src.name / "images"
    if images.is_dir() and any(images.iterdir()):
        return images
    if not src.archives:
        raise DataError(f"no images for {src.name} at {images}. {src.manual}")
    for a in src.archives:
        path = root / "deic" / src.name / "archives" / a.filename
        if not path.exists():
            download(a.url, path, a.md5, hint=f"({src.name} images; or extract them into "
                     f"{images})")
        _extract(path, images)
    return images


def _index(images: Path) -> dict[str, Path]:
    """Image path without extension -> file, by every suffix of the relative path (the
    archives nest the files under different top folders than the split files name)."""
    idx: dict[str, Path] = {}
    for dirpath, _, files in os.walk(images):
        for f in files:
            p = Path(dirpath) / f
            if p.suffix not in _EXTS:
                continue
            parts = p.relative_to(images).with_suffix("").parts
            for k in range(len(parts)):
                idx.setdefault("/".join(parts[k:]), p)
    return idx


_IMAGE_FIX = ("the download is damaged: delete the dataset's image folder to have it "
              "fetched again")


def _cache_fix(cache: Path) -> str:
    return f"delete {cache} (a cache of decoded images) to have it rebuilt"


def load_image(path: Path, channels: int, size: int) -> np.ndarray:
    """uint8 (channels, size, size); see the module docstring for the conversions."""
    if channels in (1, 3):
        from PIL import Image

        with pil_image(path, fix=_IMAGE_FIX) as im:
            im = im.convert("L" if channels == 1 else "RGB")
            w, h = im.size
            s = size / min(w, h)
            im = im.resize((max(size, round(w * s)), max(size, round(h * s))),
                           Image.Resampling.BILINEAR)
            w, h = im.size
            left, top = (w - size) // 2, (h - size) // 2
            arr = np.asarray(im.crop((left, top, left + size, top + size)))
        return arr[None] if channels == 1 else arr.transpose(2, 0, 1)
    try:
        import tifffile
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise DataError(f"reading the {channels}-band image {path} needs tifffile "
                        "(pip install tifffile)") from e
    try:
        a = np.asarray(tifffile.imread(path))
    except (OSError, ValueError, EOFError, MemoryError, KeyError, IndexError) as e:
        raise DataError(f"{path}: not a readable TIFF ({type(e).__name__}: {e}); "
                        f"{_IMAGE_FIX}") from None
    if a.ndim != 3:
        raise DataError(f"{path}: expected a multi-band image, got shape {a.shape}")
    if a.shape[-1] == channels and a.shape[0] != channels:
        a = a.transpose(2, 0, 1)
    if a.shape[0] != channels:
        raise DataError(f"{path}: {a.shape[0]} bands, expected {channels}")
    scaled = np.clip(a.astype(np.float32) / 16.0, 0, 255) if a.dtype != np.uint8 else a
    if scaled.shape[1:] != (size, size):
        import torch
        import torch.nn.functional as F

        t = F.interpolate(torch.as_tensor(np.ascontiguousarray(scaled), dtype=torch.float32)
                          [None], size=(size, size), mode="bilinear", align_corners=False)
        scaled = t[0].numpy()
    return np.round(scaled).astype(np.uint8)


def load_whole_image(path: Path, channels: int, side: int) -> tuple[np.ndarray, tuple[int, int]]:
    """(uint8 (channels, side, side): the whole image resized to side × side, aspect not
    kept; its original (height, width)). PIL's bilinear resize, antialiased when it shrinks,
    as gem's ``RandomResizedCrop`` resizes its crops."""
    if channels not in (1, 3):
        raise DataError(f"{path}: whole-image storage is for RGB / grayscale sets, not "
                        f"{channels}-band images")
    from PIL import Image

    with pil_image(path, fix=_IMAGE_FIX) as im:
        im = im.convert("L" if channels == 1 else "RGB")
        w, h = im.size
        arr = np.asarray(im.resize((side, side), Image.Resampling.BILINEAR))
    return (arr[None] if channels == 1 else arr.transpose(2, 0, 1)), (h, w)


def _split_key(split_paths: dict[str, Path]) -> str:
    return hashlib.md5("".join(md5sum(p) for p in split_paths.values()).encode(),
                       usedforsecurity=False).hexdigest()[:12]


def load_deic_whole(src: DEICSource, data_dir: str | os.PathLike[str] | None
                    ) -> dict[str, np.ndarray]:
    """The train and val images whole, for RandomResizedCrop on the original (see the
    module docstring): ``{train,val}_x`` uint8 (N, C, side, side), ``{train,val}_hw`` int64
    (N, 2) original (height, width), ``{train,val}_y``; in the split files' order, so row
    i is row i of :func:`load_deic`'s arrays."""
    if src.train_side is None:
        raise DataError(f"{src.name} has no whole-image training store (train_side); its "
                        "augmentation does not crop the original")
    root = data_root(data_dir)
    split_paths = fetch_splits(src, root)
    lists = {s: read_split(split_paths[s]) for s in ("train", "val")}
    cache = root / "deic" / src.name / f"whole_{src.train_side}_{_split_key(split_paths)}.npz"
    if cache.exists():
        return load_npz(cache, fix=_cache_fix(cache))
    images = fetch_images(src, root)
    idx = _index(images)
    arrays: dict[str, np.ndarray] = {}
    for s, items in lists.items():
        missing = [n for n, _ in items if n not in idx]
        if missing:
            raise DataError(f"{len(missing)} image(s) of the {s} split of {src.name} are not "
                            f"under {images} (first: {missing[0]!r}); the archive is "
                            "incomplete or a different version — delete the folder to "
                            "download it again")
        xs, hws = [], []
        for n, _ in items:
            x, hw = load_whole_image(idx[n], src.channels, src.train_side)
            xs.append(x)
            hws.append(hw)
        arrays[f"{s}_x"] = np.stack(xs)
        arrays[f"{s}_hw"] = np.asarray(hws, dtype=np.int64)
        arrays[f"{s}_y"] = np.asarray([lab for _, lab in items], dtype=np.int64)
    # the keys are array names (never savez's allow_pickle keyword)
    np.savez(cache, **cast("dict[str, Any]", arrays))
    return arrays


def deic_loader(src: DEICSource) -> Callable[..., RawDataset]:
    """The dataset loader of ``src`` (``(data_dir=None) -> RawDataset``), with the
    whole-image training store as its ``whole_images`` attribute when ``src`` has one —
    how the tune protocol finds it without a dataset-specific branch."""

    def load(data_dir: str | os.PathLike[str] | None = None) -> RawDataset:
        return load_deic(src, data_dir)

    load.__doc__ = f"The DEIC {src.name} dataset (see scarcelab.data.sources._deic)."
    if src.train_side is not None:
        load.whole_images = partial(load_deic_whole, src)  # type: ignore[attr-defined]
    return load


def load_deic(src: DEICSource, data_dir: str | os.PathLike[str] | None) -> RawDataset:
    root = data_root(data_dir)
    split_paths = fetch_splits(src, root)
    lists = {s: read_split(p) for s, p in split_paths.items()}
    key = _split_key(split_paths)
    cache = root / "deic" / src.name / f"cache_{src.size}_{key}.npz"
    if cache.exists():
        arrays = load_npz(cache, fix=_cache_fix(cache))
    else:
        images = fetch_images(src, root)
        idx = _index(images)
        arrays = {}
        for s, items in lists.items():
            missing = [n for n, _ in items if n not in idx]
            if missing:
                raise DataError(f"{len(missing)} image(s) of the {s} split of {src.name} are "
                                f"not under {images} (first: {missing[0]!r}); the archive is "
                                "incomplete or a different version — delete the folder to "
                                "download it again")
            arrays[f"{s}_x"] = np.stack([load_image(idx[n], src.channels, src.size)
                                         for n, _ in items])
            arrays[f"{s}_y"] = np.asarray([lab for _, lab in items], dtype=np.int64)
        np.savez(cache, **arrays)
    for s in SPLITS:
        y = arrays[f"{s}_y"]
        if y.min() < 0 or y.max() >= src.num_classes:
            raise DataError(f"{split_paths[s]}: labels outside 0..{src.num_classes - 1}")
    return RawDataset(
        name=src.name, train_x=arrays["train_x"], train_y=arrays["train_y"],
        val_x=arrays["val_x"], val_y=arrays["val_y"], test_x=arrays["test_x"],
        test_y=arrays["test_y"], num_classes=src.num_classes,
        class_names=[str(i) for i in range(src.num_classes)],
        source=f"DEIC {src.folder} @ {DEIC_COMMIT[:10]} ({root / 'deic' / src.name})",
        md5=key)
