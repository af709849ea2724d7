"""A user's image files -> one uint8 array: decoded once, cached, with one-line errors.

Why this module exists (issue 39, items 2 and 3): a team's own images come as PNG, JPEG,
BMP, TIFF (often 16-bit) or DICOM, at any size, grayscale or colour, and a few of them are
broken. Training wants one ``uint8 (N, C, S, S)`` array; the logged model must turn a new
file or array into exactly what training saw. So:

- :func:`decode_file` turns one file into ``uint8 (C, H, W)`` at its own size, and
  :func:`to_model_input` turns any image array into the model's ``(C, S, S)``. Training
  (:func:`load_images`) calls exactly these two per file, and the logged model calls them
  at predict time: one code path, so serving cannot drift from training.
- :func:`load_images` decodes a list of files in spawned worker processes into a ``.npy``
  written row by row (never the whole set in memory), and keeps it in a cache keyed by the
  files' *content* and the transform, so a second run opens it memory-mapped in well under
  a second instead of decoding again. What invalidates it is listed in docs/own-images.md
  ("The decode cache").

Rules chosen here (each is logged through :meth:`Transform.params`, and documented in
docs/own-images.md):

- 16-bit (and 32-bit integer / float) grayscale pixels become uint8 linearly over the
  image's own min..max: ``round(255 * (v - min) / (max - min))``, a constant image is all 0.
  Medical 16-bit files usually hold 10-14 significant bits (a 12-bit X-ray stored as
  0..4095): the full-range rule ``v / 257`` would leave it 16 grey levels, nearly black.
  The stretch is what a viewer without a window shows; its cost is that absolute intensity
  is not comparable across images (DICOM's own VOI window is used where a file has one).
  16-bit *colour* PNG/TIFF files are reduced by Pillow itself to their high byte.
- Transparency (RGBA, LA, palette with transparency) is composited on black,
  ``round(v * alpha / 255)``: black is the background of radiographs, CT/MR windows and
  ultrasound sectors, and dropping alpha instead would expose whatever colour a writer left
  under transparent pixels.
- Colour -> gray is ITU-R 601-2 luma with Pillow's own integer coefficients
  (``(19595 R + 38470 G + 7471 B + 32768) >> 16``, as ``Image.convert("L")``); gray ->
  colour repeats the channel.
- Resize: Pillow's bilinear filter, which Pillow widens by the scale factor when shrinking
  (antialiased, like torchvision's ``Resize(antialias=True)``). ``fit="crop"`` scales the
  shorter side to S and cuts the centre square; ``fit="pad"`` scales the longer side to S
  and pads the shorter one with zeros (black, for the reason above: edge replication would
  smear anatomy into the border) centred, the extra pixel of an odd margin at the
  bottom/right.
- EXIF orientation of JPEG/TIFF files is applied (a phone photo is seen upright).
- The first frame of a multi-frame file (TIFF pages, animated PNG/GIF, multi-frame DICOM).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import multiprocessing
import os
import re
import shlex
import sqlite3
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import PIL
from PIL import Image, ImageOps
from tqdm.auto import tqdm

from scarcelab.data.download import cache_root as _scarcelab_cache_root
from scarcelab.errors import ConfigError, DataError
from scarcelab.extras import need

IMAGE_SUFFIXES: frozenset[str] = frozenset(
    {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".dcm"})
"""Lower-case suffixes (with the dot) a folder scan treats as images; a file without a
suffix is not one. :func:`decode_file` itself recognises DICOM by content too."""
CHANNEL_MODES = ("auto", "gray", "rgb")
FIT_MODES = ("crop", "pad")

DECODER_VERSION = 1
"""Bump whenever decoding or the transform changes what a file becomes: it is part of every
cache key (and of the logged params), so old cache entries are simply not found again."""

RESAMPLE = "bilinear, antialiased when shrinking (Pillow)"
SCALE16 = "linear over each image's own min..max: round(255*(v-min)/(max-min)); constant -> 0"
ALPHA = "composited on black: round(v*alpha/255)"
GRAY = "ITU-R 601-2 luma, Pillow's integers (19595R+38470G+7471B+32768)>>16; gray->rgb repeats"
PAD_FILL = "0 (black)"

_GRAY_MODES = frozenset({"1", "L", "LA", "La", "I", "I;16", "I;16L", "I;16B", "I;16N", "F"})
_HIGH_DEPTH_MODES = frozenset({"I", "I;16", "I;16L", "I;16B", "I;16N", "F"})
_RACY_NS = 2_000_000_000
"""A stat-index entry is trusted only if the file's last change is at least this long
before it was hashed: a write in the same timestamp tick as the hashing (2 s on FAT, a
jiffy elsewhere) could otherwise leave size and times unchanged (git's "racy clean" rule)."""
_PER_WORKER = 400
"""Files per worker process below which another process costs more than it saves (a
spawned worker starts in ~0.3-0.5 s, in which this process decodes 500-1000 PNGs)."""


# --------------------------------------------------------------------------- transform


@dataclass(frozen=True)
class Transform:
    """How files become model input. ``image_size=None`` keeps the files' own size (they
    must all agree); ``channels`` ``auto`` keeps the files' own (all gray -> 1, all colour
    -> 3, mixed refused); ``fit`` says how a non-square image becomes square."""

    image_size: int | None = None
    channels: str = "auto"
    fit: str = "crop"

    def __post_init__(self) -> None:
        s = self.image_size
        if s is not None and (isinstance(s, bool) or not isinstance(s, int) or s < 1):
            raise ConfigError(f"image_size must be a positive integer (e.g. 28, 64, 224) or "
                              f"None to keep the files' own size, got {s!r}")
        if self.channels not in CHANNEL_MODES:
            raise ConfigError(f"channels must be one of {', '.join(CHANNEL_MODES)}, got "
                              f"{self.channels!r}")
        if self.fit not in FIT_MODES:
            raise ConfigError(f"fit must be one of {', '.join(FIT_MODES)}, got {self.fit!r}")

    def key(self) -> str:
        """Stable text for cache keys and run params (changes only with DECODER_VERSION)."""
        size = "native" if self.image_size is None else str(self.image_size)
        return f"size={size};channels={self.channels};fit={self.fit};decoder={DECODER_VERSION}"

    def params(self) -> dict[str, str]:
        """What a run logs, so a reader of the run knows exactly what its images were."""
        return {"image_size": "native" if self.image_size is None else str(self.image_size),
                "channels": self.channels,
                "fit": self.fit,
                "fit_rule": ("shorter side to image_size, centre crop" if self.fit == "crop"
                             else f"longer side to image_size, centred pad with {PAD_FILL}"),
                "resample": f"{RESAMPLE} {PIL.__version__}",
                "scale16": SCALE16,
                "alpha": ALPHA,
                "gray": GRAY,
                "decoder_version": str(DECODER_VERSION)}


# --------------------------------------------------------------------------- errors


class BadImageFile(DataError):
    """One file that cannot be decoded. The message is one line: the file, what is wrong,
    the fix. ``reason`` alone is what :attr:`DecodedImages.bad` lists; ``lasting`` is false
    when the cause is this environment (a missing decoder) rather than the file, so that a
    skip is not cached."""

    def __init__(self, path: str | os.PathLike[str], reason: str, fix: str | None = None,
                 *, lasting: bool = True) -> None:
        self.path = str(path)
        self.reason = " ".join(str(reason).split())
        self.fix = fix or ("fix or remove the file, or pass --skip-bad-files to skip bad "
                           "files (the run counts them)")
        self.lasting = lasting
        super().__init__(f"{self.path}: {self.reason}; {self.fix}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (_bad_file, (self.path, self.reason, self.fix, self.lasting))


def _bad_file(path: str, reason: str, fix: str, lasting: bool) -> BadImageFile:
    return BadImageFile(path, reason, fix, lasting=lasting)


def _described(e: BaseException) -> str:
    text = " ".join(str(e).split()) or "no details"
    return f"{type(e).__name__}: {text}"[:300]


# --------------------------------------------------------------------------- one file


def _read_bytes(path: str | os.PathLike[str]) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as e:
        raise BadImageFile(path, f"cannot be read ({_described(e)})",
                           "check the path and its permissions, or pass --skip-bad-files "
                           "to skip it") from None


def _is_dicom(path: str | os.PathLike[str], data: bytes) -> bool:
    """By content (the ``DICM`` preamble marker) or, for old files without a preamble, by
    the ``.dcm`` suffix."""
    return data[128:132] == b"DICM" or os.path.splitext(path)[1].lower() == ".dcm"


def decode_file(path: str | Path, channels: str = "auto") -> np.ndarray:
    """One file -> ``uint8 (C, H, W)`` at its own size, ``C`` 1 or 3: ``auto`` keeps the
    file's own (gray stays 1; RGB, RGBA, palette -> 3), ``gray``/``rgb`` force it.

    Raises :class:`BadImageFile` (one line) for an unreadable, corrupt or undecodable file,
    and :class:`scarcelab.extras.MissingExtra` for a DICOM file without pydicom.
    """
    if channels not in CHANNEL_MODES:
        raise ConfigError(f"channels must be one of {', '.join(CHANNEL_MODES)}, got "
                          f"{channels!r}")
    data = _read_bytes(path)
    chw = _decode_dicom(path, data) if _is_dicom(path, data) else _decode_pil(path, data)
    if channels == "auto":
        return chw
    return _convert_channels(chw, 1 if channels == "gray" else 3)


def _open_pil(path: str | os.PathLike[str], data: bytes) -> Image.Image:
    if not data:
        raise BadImageFile(path, "empty file (0 bytes)")
    try:
        return Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as e:
        raise BadImageFile(path, f"larger than Pillow's decompression-bomb limit ({e})",
                           "resize it beforehand, or pass --skip-bad-files") from None
    except Image.UnidentifiedImageError:
        raise BadImageFile(path, "not an image Pillow can read (unknown format or damaged "
                           "header)") from None
    except Exception as e:  # noqa: BLE001 - Pillow raises many types on garbage
        raise BadImageFile(path, f"not an image Pillow can read ({_described(e)})") from None


def _orientation(im: Image.Image) -> int:
    """EXIF orientation (1 = as stored) of a JPEG/TIFF; other formats are read as stored
    (Pillow reads a PNG's eXIf chunk only by decoding the whole file)."""
    if im.format not in ("JPEG", "MPO", "TIFF"):
        return 1
    try:
        return int(im.getexif().get(0x0112, 1))
    except Exception:  # noqa: BLE001 - a broken EXIF block is not a broken image
        return 1


def _decode_pil(path: str | os.PathLike[str], data: bytes) -> np.ndarray:
    im = _open_pil(path, data)
    try:
        im.seek(0)
        if _orientation(im) not in (0, 1):
            im = ImageOps.exif_transpose(im)
        im.load()
        return _pil_to_chw(im)
    except BadImageFile:
        raise
    except Exception as e:  # noqa: BLE001 - truncated/corrupt streams: OSError, SyntaxError...
        raise BadImageFile(path, f"corrupt or truncated {im.format or 'image'} data "
                           f"({_described(e)})") from None


def _pil_to_chw(im: Image.Image) -> np.ndarray:
    mode = im.mode
    if mode in _HIGH_DEPTH_MODES:
        return _scale_to_uint8(np.asarray(im))[None]
    if mode == "1":
        im = im.convert("L")
    elif mode == "P":
        im = im.convert("RGBA" if "transparency" in im.info else "RGB")
    elif mode in ("PA", "RGBa", "La"):
        im = im.convert("RGBA" if mode != "La" else "LA")
    elif mode not in ("L", "LA", "RGB", "RGBA"):
        im = im.convert("RGB")  # CMYK, YCbCr, LAB, HSV, RGBX
    a = np.asarray(im)
    chw = a[None] if a.ndim == 2 else a.transpose(2, 0, 1)
    return np.ascontiguousarray(_composite(chw))


def _scale_to_uint8(a: np.ndarray) -> np.ndarray:
    """The 16-bit rule (module docstring): linear over the image's own min..max. Non-finite
    float pixels count as the minimum."""
    x = a.astype(np.float64)
    finite = np.isfinite(x)
    if not finite.any():
        return np.zeros(a.shape, np.uint8)
    lo, hi = float(x[finite].min()), float(x[finite].max())
    if not finite.all():
        x = np.where(finite, x, lo)
    if hi <= lo:
        return np.zeros(a.shape, np.uint8)
    return np.rint((x - lo) * (255.0 / (hi - lo))).astype(np.uint8)


# --------------------------------------------------------------------------- DICOM


def _pydicom(path: str | os.PathLike[str]) -> Any:
    return need("pydicom", f"reading the DICOM file {path}")


def _first(value: Any) -> float:
    """WindowCenter/WindowWidth may hold several windows; the first is the default one."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        return float(value)
    return float(next(iter(value)))


def _check_decodable(path: str | os.PathLike[str], ds: Any) -> None:
    """A compressed transfer syntax without an installed decoder: say which syntax and what
    to install, before any pixel is touched."""
    # pydicom documents these names in pydicom.pixels but does not mark the re-exports
    from pydicom.pixels import get_decoder  # pyright: ignore[reportPrivateImportUsage]

    ts = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
    if ts is None or not getattr(ts, "is_compressed", False):
        return
    name = f"{ts.name} ({ts})"
    try:
        decoder = get_decoder(ts)
    except NotImplementedError:
        raise BadImageFile(path, f"DICOM transfer syntax {name} has no decoder in pydicom",
                           "convert it to an uncompressed transfer syntax (e.g. gdcmconv "
                           "--raw), or pass --skip-bad-files", lasting=False) from None
    if not decoder.is_available:
        raise BadImageFile(path, f"DICOM pixel data is compressed as {name}, which cannot be "
                           "decoded in this environment",
                           _install_fix(decoder.missing_dependencies), lasting=False)


#: pip's name of a decoder package pydicom names by its import name
_PIP_NAMES = {"gdcm": "python-gdcm"}


def pip_command(missing: Sequence[str]) -> str:
    """The ``pip install`` of one decoder plugin from pydicom's ``missing_dependencies``
    (``"pylibjpeg - requires pylibjpeg>=2.0 and pylibjpeg-libjpeg>=2.1"``): pylibjpeg's when
    it is among them (binary wheels on PyPI for the usual platforms), else the first one;
    the packages exactly as pydicom requires them, so the command fits the transfer syntax
    (JPEG-LS needs pylibjpeg-libjpeg, HTJ2K pylibjpeg-openjpeg >= 2)."""
    pick = next((m for m in missing if m.startswith("pylibjpeg ")),
                missing[0] if missing else "")
    reqs = pick.split(" - requires ", 1)[1].split(" and ") if " - requires " in pick else []
    pkgs = []
    for req in (r.strip() for r in reqs):
        name = re.split(r"[<>=!~ \[]", req, maxsplit=1)[0]
        if name and name != "numpy":
            pkgs.append(shlex.quote(_PIP_NAMES.get(name, name) + req[len(name):]))
    return "pip install " + (" ".join(pkgs) if pkgs else
                             "pylibjpeg pylibjpeg-libjpeg pylibjpeg-openjpeg")


def _install_fix(missing: Sequence[str]) -> str:
    options = "; ".join(missing)
    return (f"install a decoder ({options}; e.g. {pip_command(missing)}), or convert the "
            "file to uncompressed DICOM (dcmdjpeg, gdcmconv --raw), or pass "
            "--skip-bad-files")


def _decoder_gap(path: str | os.PathLike[str], ds: Any, e: BaseException
                 ) -> BadImageFile | None:
    """A compressed file that the installed decoder turned down for a feature it lacks
    (Pillow: 12-bit JPEG Extended, colour JPEG 2000 above 8 bits) while a decoder that is
    not installed reads it: that is this environment's gap, not a corrupt file, so the
    line names what to install (and a skip is not cached). None for any other failure."""
    text = str(e)
    if "does not support" not in text and "cannot decode" not in text:
        return None
    ts = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
    if ts is None or not getattr(ts, "is_compressed", False):
        return None
    # pydicom documents these names in pydicom.pixels but does not mark the re-exports
    from pydicom.pixels import get_decoder  # pyright: ignore[reportPrivateImportUsage]

    try:
        missing = list(get_decoder(ts).missing_dependencies)
    except NotImplementedError:
        return None
    if not missing:
        return None
    return BadImageFile(path, f"DICOM pixel data is compressed as {ts.name} ({ts}), which "
                        f"the installed decoder cannot decode ({_described(e)})",
                        _install_fix(missing), lasting=False)


def _read_dicom(path: str | os.PathLike[str], data: bytes, header_only: bool) -> Any:
    pydicom = _pydicom(path)
    if not data:
        raise BadImageFile(path, "empty file (0 bytes)")
    try:
        ds = pydicom.dcmread(io.BytesIO(data), force=True, stop_before_pixels=header_only)
    except Exception as e:  # noqa: BLE001 - InvalidDicomError, a header cut short
        raise BadImageFile(path, f"not a readable DICOM file ({_described(e)})") from None
    try:
        rows, cols = int(ds.Rows), int(ds.Columns)
    except (AttributeError, TypeError, ValueError):
        raise BadImageFile(path, "not a DICOM image: no Rows/Columns (truncated, damaged, "
                           "or not DICOM at all)") from None
    if rows < 1 or cols < 1:
        raise BadImageFile(path, f"DICOM image of {cols}x{rows} pixels")
    _check_decodable(path, ds)
    return ds


def _decode_dicom(path: str | os.PathLike[str], data: bytes) -> np.ndarray:
    """PS3.3 C.7.6.3 / C.11: first frame -> modality LUT (RescaleSlope/Intercept) -> VOI
    (the first WindowCenter/WindowWidth, else a VOI LUT, else the min..max rule) ->
    MONOCHROME1 inverted, so 0 is always black."""
    ds = _read_dicom(path, data, header_only=False)
    if "PixelData" not in ds:
        raise BadImageFile(path, "DICOM file without pixel data (a report, a DICOMDIR?)",
                           "leave it out of the image folder, or pass --skip-bad-files")
    from pydicom import pixels

    try:
        # first frame; YBR colour -> RGB. pydicom.pixels' public names are unmarked re-exports
        arr = pixels.pixel_array(ds, index=0)  # pyright: ignore[reportPrivateImportUsage]
        photometric = str(ds.get("PhotometricInterpretation", "MONOCHROME2")).upper()
        if photometric == "PALETTE COLOR":
            rgb = pixels.apply_color_lut(arr, ds)  # pyright: ignore[reportPrivateImportUsage]
            rgb = (rgb >> 8).astype(np.uint8) if rgb.dtype.itemsize > 1 else rgb
            return np.ascontiguousarray(rgb.astype(np.uint8).transpose(2, 0, 1))
        if arr.ndim == 3:  # colour: VOI does not apply (PS3.3 C.11.2)
            rgb = arr if arr.dtype == np.uint8 else _scale_to_uint8(arr)
            return np.ascontiguousarray(rgb.transpose(2, 0, 1))
        gray = _dicom_gray(arr, ds)
    except BadImageFile:
        raise
    except Exception as e:  # noqa: BLE001 - truncated pixel data, inconsistent header
        gap = _decoder_gap(path, ds, e)
        if gap is not None:
            raise gap from None
        raise BadImageFile(path, f"corrupt DICOM pixel data ({_described(e)})") from None
    if photometric == "MONOCHROME1":
        gray = 255 - gray
    return gray[None]


def _dicom_gray(arr: np.ndarray, ds: Any) -> np.ndarray:
    from pydicom import pixels

    # pydicom documents these names in pydicom.pixels but does not mark the re-exports
    x = pixels.apply_modality_lut(arr, ds)  # pyright: ignore[reportPrivateImportUsage]
    center, width = ds.get("WindowCenter"), ds.get("WindowWidth")
    if center is not None and width is not None and center != "" and width != "":
        c, w = _first(center), _first(width)
        if w > 0:
            return voi_window(x, c, w, str(ds.get("VOILUTFunction", "LINEAR") or "LINEAR"))
    if "VOILUTSequence" in ds and len(ds.VOILUTSequence):
        bits = int(ds.VOILUTSequence[0].LUTDescriptor[2])
        y = pixels.apply_voi_lut(x, ds, index=0, prefer_lut=True)  # pyright: ignore[reportPrivateImportUsage]
        top = float(2 ** bits - 1)
        return np.rint(np.clip(y, 0, top) * (255.0 / top)).astype(np.uint8)
    return _scale_to_uint8(x)


def voi_window(x: np.ndarray, center: float, width: float, function: str = "LINEAR"
               ) -> np.ndarray:
    """DICOM PS3.3 C.11.2.1.2 (LINEAR, LINEAR_EXACT) and C.11.2.1.3.1 (SIGMOID) with the
    output range 0..255, rounded to uint8."""
    x = np.asarray(x, dtype=np.float64)
    c, w = float(center), float(width)
    fn = function.strip().upper()
    if fn == "SIGMOID":
        y = 255.0 / (1.0 + np.exp(-4.0 * (x - c) / w))
    elif fn == "LINEAR_EXACT":
        y = np.clip((x - c) / w + 0.5, 0.0, 1.0) * 255.0
    else:  # LINEAR, the default
        if w <= 1.0:  # the standard's w >= 1; w == 1 is a step at c - 0.5
            y = np.where(x <= c - 0.5, 0.0, 255.0)
        else:
            y = np.clip((x - (c - 0.5)) / (w - 1.0) + 0.5, 0.0, 1.0) * 255.0
    return np.rint(y).astype(np.uint8)


# --------------------------------------------------------------------------- headers


def _header(path: str | os.PathLike[str], data: bytes) -> tuple[str, int, int]:
    """``(kind, width, height)`` as decoding will see it (EXIF rotation applied), kind
    ``gray`` or ``colour``, without decoding the pixels: what the channel and size checks
    need before the decode starts."""
    if _is_dicom(path, data):
        ds = _read_dicom(path, data, header_only=True)
        photometric = str(ds.get("PhotometricInterpretation", "MONOCHROME2")).upper()
        gray = int(ds.get("SamplesPerPixel", 1)) == 1 and photometric != "PALETTE COLOR"
        return ("gray" if gray else "colour"), int(ds.Columns), int(ds.Rows)
    im = _open_pil(path, data)
    w, h = im.size
    if _orientation(im) in (5, 6, 7, 8):
        w, h = h, w
    return ("gray" if im.mode in _GRAY_MODES else "colour"), w, h


# --------------------------------------------------------------------------- transform


def _as_chw(img: np.ndarray) -> np.ndarray:
    a = np.asarray(img)
    if a.ndim == 2:
        a = a[None]
    elif a.ndim == 3:
        chans = (1, 2, 3, 4)
        if a.shape[-1] in chans and a.shape[0] not in chans:
            a = a.transpose(2, 0, 1)
        elif a.shape[0] not in chans:
            a = None  # type: ignore[assignment]
    else:
        a = None  # type: ignore[assignment]
    if a is None:
        raise DataError(f"an image array of shape {tuple(np.shape(img))}: expected (H, W), "
                        "(C, H, W) or (H, W, C) with C 1, 3 or 4 (one image, not a batch)")
    if a.dtype == np.uint8:
        return a
    if a.dtype == np.bool_:
        return a.astype(np.uint8) * 255
    if np.issubdtype(a.dtype, np.integer):
        return _scale_to_uint8(a)  # as a 16-bit file is read
    raise DataError(f"an image array of dtype {a.dtype}: pass uint8 pixels 0..255 (a float "
                    "array could be 0..1 or 0..255; e.g. np.uint8(np.rint(x * 255)))")


def _composite(chw: np.ndarray) -> np.ndarray:
    """Alpha (the last of 2 or 4 channels) composited on black."""
    if chw.shape[0] not in (2, 4):
        return chw
    alpha = chw[-1:].astype(np.uint16)
    return ((chw[:-1].astype(np.uint16) * alpha + 127) // 255).astype(np.uint8)


def _convert_channels(chw: np.ndarray, channels: int) -> np.ndarray:
    c = chw.shape[0]
    if c == channels:
        return chw
    if channels == 3 and c == 1:
        return np.repeat(chw, 3, axis=0)
    if channels == 1 and c == 3:
        r, g, b = (chw[i].astype(np.uint32) for i in range(3))
        return ((19595 * r + 38470 * g + 7471 * b + 0x8000) >> 16).astype(np.uint8)[None]
    raise ConfigError(f"channels must be 1 or 3, got {channels!r}")


def _round_div(a: int, b: int) -> int:
    """round(a / b) with halves up, in integers (no float drift at the exact size)."""
    return (2 * a + b) // (2 * b)


def fitted_size(h: int, w: int, target: tuple[int, int], fit: str) -> tuple[int, int]:
    """The ``(height, width)`` an ``h x w`` image is resized to before the centre crop or
    pad to ``target``: ``crop`` covers the target (for a square one: shorter side = S),
    ``pad`` fits inside it (longer side = S); the aspect ratio is kept, rounded."""
    th, tw = target
    wider = w * th >= h * tw
    if fit == "crop":
        if wider:
            return th, max(tw, _round_div(w * th, h))
        return max(th, _round_div(h * tw, w)), tw
    if wider:
        return max(1, min(th, _round_div(h * tw, w))), tw
    return th, max(1, min(tw, _round_div(w * th, h)))


def _resize(chw: np.ndarray, h: int, w: int) -> np.ndarray:
    if chw.shape[1:] == (h, w):
        return chw
    if chw.shape[0] == 1:
        im = Image.fromarray(chw[0])
    else:
        im = Image.fromarray(np.ascontiguousarray(chw.transpose(1, 2, 0)))
    out = np.asarray(im.resize((w, h), Image.Resampling.BILINEAR))
    return out[None] if out.ndim == 2 else out.transpose(2, 0, 1)


def to_model_input(img: np.ndarray, transform: Transform, channels: int, *,
                   size: tuple[int, int] | None = None) -> np.ndarray:
    """``uint8 (C,H,W)``, ``(H,W)`` or ``(H,W,C)`` of any size -> ``uint8 (channels, S, S)``
    exactly as the training images were made (alpha, channels, resize, crop/pad).

    ``size`` (height, width) overrides the target; it is needed only when training kept the
    files' own, possibly non-square size (``image_size=None``): pass the training array's
    ``x.shape[-2:]``. Without either, the image keeps its size. A 3-D array is read as
    channels-first unless its last axis (and not its first) has 1-4 entries. Integer
    arrays other than uint8 follow the 16-bit rule; float arrays are refused.
    """
    chw = _convert_channels(_composite(_as_chw(img)), channels)
    if size is None and transform.image_size is not None:
        size = (transform.image_size, transform.image_size)
    if size is None or chw.shape[1:] == tuple(size):
        return np.ascontiguousarray(chw)
    th, tw = int(size[0]), int(size[1])
    nh, nw = fitted_size(chw.shape[1], chw.shape[2], (th, tw), transform.fit)
    out = _resize(chw, nh, nw)
    if transform.fit == "crop":
        top, left = (nh - th) // 2, (nw - tw) // 2
        return np.ascontiguousarray(out[:, top:top + th, left:left + tw])
    padded = np.zeros((out.shape[0], th, tw), np.uint8)
    top, left = (th - nh) // 2, (tw - nw) // 2
    padded[:, top:top + nh, left:left + nw] = out
    return padded


# --------------------------------------------------------------------------- result


@dataclass
class DecodedImages:
    """``x`` is ``uint8 (N, C, S, S)``: a read-only ``np.memmap`` of the cache file, so a
    set larger than memory is paged in as it is read; ``np.asarray(x)`` is free,
    ``np.array(x)`` copies it into memory. ``kept`` are the indices into the given paths
    that ``x``'s rows are (all of them unless ``skip_bad``); ``bad`` the skipped files
    with the reason; ``cache_key`` is what the run logs."""

    x: np.ndarray
    kept: np.ndarray
    bad: list[tuple[str, str]]
    cache_key: str
    cache_path: Path | None
    from_cache: bool
    channels: int
    #: each given path's content sha256 (None: unreadable), from the one read that hashed
    #: it (or the stat index): a caller that records digests uses these instead of
    #: reading and hashing every file again
    sha: list[str | None] = field(default_factory=list)


def cache_root() -> Path:
    """``$SCARCELAB_CACHE/images``, else ``$XDG_CACHE_HOME/scarcelab/images``, else
    ``~/.cache/scarcelab/images``: beside the computed encodings, never in the data folder
    (which may be read-only or shared)."""
    return _scarcelab_cache_root() / "images"


# --------------------------------------------------------------------------- workers


def _scan_one(path: str) -> tuple[str | None, tuple[str, int, int] | None, str | None, bool,
                                  str | None]:
    """Read once: content sha256 and header. -> (sha, header, bad reason, lasting, fix)."""
    try:
        data = _read_bytes(path)
    except BadImageFile as e:
        return None, None, e.reason, e.lasting, e.fix
    sha = hashlib.sha256(data).hexdigest()
    try:
        return sha, _header(path, data), None, True, None
    except BadImageFile as e:
        return sha, None, e.reason, e.lasting, e.fix


def _scan_chunk(items: list[tuple[int, str]]) -> list[tuple[int, Any]]:
    return [(i, _scan_one(p)) for i, p in items]


def _decode_chunk(npy: str, rows: list[tuple[int, int, str]], transform: Transform,
                  channels: int, size: tuple[int, int]) -> list[tuple[int, str, bool, str]]:
    """Decode files into their rows of the (temporary) cache file; a worker writes its
    rows straight into the file, so neither it nor the parent holds the set. Returns
    the failures as (row, reason, lasting, fix)."""
    out = np.lib.format.open_memmap(npy, mode="r+")
    failed: list[tuple[int, str, bool, str]] = []
    for row, _index, path in rows:
        try:
            out[row] = to_model_input(decode_file(path), transform, channels, size=size)
        except BadImageFile as e:
            failed.append((row, e.reason, e.lasting, e.fix))
    del out  # no msync here: the parent's one fsync of the file writes every row to disk
    return failed


def default_workers(n_files: int) -> int:
    """The CPUs this process may use, fewer when there is too little work for them."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, n_files // _PER_WORKER))


class _Workers:
    """Spawned processes (never forked: the parent may hold torch or MLflow threads, and a
    fork of a threaded process can deadlock), started only when a stage has work for
    more than one."""

    def __init__(self, workers: int | None) -> None:
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                    or workers < 1):
            raise ConfigError(f"workers must be a positive integer or None, got {workers!r}")
        self.requested = workers
        self.pool: ProcessPoolExecutor | None = None
        self.broken = False

    def __enter__(self) -> _Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)

    def run(self, fn: Callable[..., list[Any]], chunks: list[list[Any]], args: tuple[Any, ...],
            n_items: int, bar: tqdm, stop: Callable[[list[Any]], bool]) -> Iterator[list[Any]]:
        """Yield each chunk's result (any order); stop early when ``stop(result)``.

        Worker processes that cannot start (the classic case: a script that calls this at
        its top level without ``if __name__ == "__main__":``, which spawned children
        re-run) are reported once as a warning and the remaining chunks are done here.
        """
        n = min(self.requested or default_workers(n_items), len(chunks))
        if not self.broken and (n > 1 or self.pool is not None):
            done: set[int] = set()
            try:
                yield from self._parallel(fn, chunks, args, n, bar, stop, done)
                return
            except BrokenProcessPool as e:
                warnings.warn(f"image decoding worker processes failed to start or died "
                              f"({e}); decoding in this process instead. In a script of "
                              "your own, call load_images under if __name__ == "
                              "'__main__':", stacklevel=4)
                self.broken = True
                assert self.pool is not None
                self.pool.shutdown(wait=False, cancel_futures=True)
                self.pool = None
            chunks = [c for k, c in enumerate(chunks) if k not in done]
        for chunk in chunks:
            result = fn(*args[:1], chunk, *args[1:]) if args else fn(chunk)
            bar.update(len(chunk))
            yield result
            if stop(result):
                return

    def _parallel(self, fn: Callable[..., list[Any]], chunks: list[list[Any]],
                  args: tuple[Any, ...], n: int, bar: tqdm, stop: Callable[[list[Any]], bool],
                  done: set[int]) -> Iterator[list[Any]]:
        if self.pool is None:
            self.pool = ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn"))
        pending: dict[Future[list[Any]], int] = {}
        todo = iter(enumerate(chunks))
        window = 4 * n  # a few chunks ahead per worker, not every chunk's arguments at once
        for k, chunk in todo:
            pending[self._submit(fn, chunk, args)] = k
            if len(pending) >= window:
                break
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                k = pending.pop(fut)
                result = fut.result()
                done.add(k)
                bar.update(len(chunks[k]))
                yield result
                if stop(result):
                    for f in pending:
                        f.cancel()
                    return
                nxt = next(todo, None)
                if nxt is not None:
                    pending[self._submit(fn, nxt[1], args)] = nxt[0]

    def _submit(self, fn: Callable[..., list[Any]], chunk: list[Any], args: tuple[Any, ...]
                ) -> Future[list[Any]]:
        assert self.pool is not None
        if args:
            return self.pool.submit(fn, args[0], chunk, *args[1:])
        return self.pool.submit(fn, chunk)


def _chunks(items: list[Any], n_workers: int) -> list[list[Any]]:
    size = max(8, min(128, math.ceil(len(items) / max(1, 8 * n_workers))))
    return [items[i:i + size] for i in range(0, len(items), size)]


def _bar(show: bool, total: int, desc: str) -> tqdm:
    return tqdm(total=total, desc=desc, unit="img", file=sys.stderr, disable=not show,
                leave=False, dynamic_ncols=True)


# --------------------------------------------------------------------------- stat index


class _StatIndex:
    """``path -> (device, inode, size, mtime_ns, ctime_ns) -> content sha256 + header``,
    one SQLite file per cache root, so a second load re-reads only files whose stat
    changed. Any SQLite trouble (a read-only or network file system) disables it: every
    file is then hashed, which is slower but never wrong."""

    COLUMNS = "path, dev, ino, size, mtime_ns, ctime_ns, hashed_ns, sha, header, version"

    def __init__(self, root: Path) -> None:
        self.db: sqlite3.Connection | None = None
        try:
            root.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(root / "stat-index.sqlite3", timeout=60)
            self.db.execute(
                "CREATE TABLE IF NOT EXISTS files (path TEXT PRIMARY KEY, dev INTEGER, "
                "ino INTEGER, size INTEGER, mtime_ns INTEGER, ctime_ns INTEGER, "
                "hashed_ns INTEGER, sha TEXT, header TEXT, version INTEGER)")
            self.db.commit()
        except (sqlite3.Error, OSError) as e:
            self._off(e)

    def _off(self, e: BaseException) -> None:
        warnings.warn(f"image stat index under {self!r} unusable ({_described(e)}); every "
                      "file is hashed on each load", stacklevel=3)
        if self.db is not None:
            with contextlib.suppress(sqlite3.Error):
                self.db.close()
        self.db = None

    def lookup(self, paths: list[str]) -> dict[str, tuple[Any, ...]]:
        found: dict[str, tuple[Any, ...]] = {}
        if self.db is None:
            return found
        try:
            for i in range(0, len(paths), 500):
                part = paths[i:i + 500]
                q = f"SELECT {self.COLUMNS} FROM files WHERE path IN ({','.join('?' * len(part))})"
                for row in self.db.execute(q, part):
                    found[row[0]] = row
        except sqlite3.Error as e:
            self._off(e)
        return found

    def store(self, rows: list[tuple[Any, ...]]) -> None:
        if self.db is None or not rows:
            return
        try:
            self.db.executemany(f"INSERT OR REPLACE INTO files ({self.COLUMNS}) VALUES "
                                "(?,?,?,?,?,?,?,?,?,?)", rows)
            self.db.commit()
        except sqlite3.Error as e:
            self._off(e)

    def close(self) -> None:
        if self.db is not None:
            self.db.close()


def _stat_key(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


@dataclass
class _Scan:
    sha: list[str | None]
    header: list[tuple[str, int, int] | None]
    #: index -> (reason, lasting, fix): the fix travels with the reason, so the line a load
    #: stops with names what to do (e.g. the decoder to install), as decode_file's does
    bad: dict[int, tuple[str, bool, str | None]]
    rehashed: int


def _scan(paths: list[str], index: _StatIndex, workers: _Workers, show: bool,
          skip_bad: bool, shown: list[str]) -> _Scan:
    """Content digests (from the stat index where the stat is unchanged and not racy) and
    headers of every file; the rest are read, hashed and parsed in the workers."""
    n = len(paths)
    sha: list[str | None] = [None] * n
    header: list[tuple[str, int, int] | None] = [None] * n
    bad: dict[int, tuple[str, bool, str | None]] = {}
    known = index.lookup(paths)
    stats: list[tuple[int, int, int, int, int] | None] = [None] * n
    todo: list[tuple[int, str]] = []
    for i, p in enumerate(paths):
        try:
            stats[i] = _stat_key(os.stat(p))
        except OSError as e:
            reason = f"cannot be read ({_described(e)})"
            if not skip_bad:
                raise BadImageFile(shown[i], reason, "check the path and its permissions, "
                                   "or pass --skip-bad-files to skip it") from None
            bad[i] = (reason, True, None)
            continue
        row = known.get(p)
        if (row is not None and tuple(row[1:6]) == stats[i] and row[9] == DECODER_VERSION
                and row[4] + _RACY_NS <= row[6]):
            sha[i] = row[7]
            header[i] = tuple(json.loads(row[8])) if row[8] else None  # type: ignore[assignment]
            if header[i] is not None:
                continue
        todo.append((i, p))
    new_rows: list[tuple[Any, ...]] = []
    if todo:
        hashed_ns = time.time_ns()
        n_workers = workers.requested or default_workers(len(todo))
        with _bar(show, len(todo), "hashing images") as bar:
            for result in workers.run(_scan_chunk, _chunks(todo, n_workers), (), len(todo),
                                      bar, stop=lambda _r: False):
                for i, (digest, head, reason, lasting, fix) in result:
                    sha[i], header[i] = digest, head
                    if reason is not None:
                        bad[i] = (reason, lasting, fix)
                    if digest is not None:
                        new_rows.append((paths[i], *stats[i],  # type: ignore[misc]
                                         hashed_ns, digest,
                                         json.dumps(head) if head is not None else None,
                                         DECODER_VERSION))
        index.store(new_rows)
    return _Scan(sha, header, bad, len(todo))


# --------------------------------------------------------------------------- cache


def _versions(paths: Sequence[str]) -> str:
    text = f"pillow={PIL.__version__}"
    if any(p.lower().endswith(".dcm") for p in paths):
        from importlib.metadata import PackageNotFoundError, version

        try:
            text += f";pydicom={version('pydicom')}"
        except PackageNotFoundError:
            text += ";pydicom=none"
    return text


def _cache_key(scan: _Scan, transform: Transform, paths: Sequence[str]) -> str:
    """The files' content (in order) + the transform + the decoder (and Pillow/pydicom
    versions): never their paths or times, so a moved or touched folder keeps its cache."""
    h = hashlib.sha256()
    h.update(f"scarcelab-imagefiles\n{transform.key()}\n{_versions(paths)}\n"
             f"n={len(scan.sha)}\n".encode())
    for i, digest in enumerate(scan.sha):
        h.update((digest or f"unreadable:{scan.bad.get(i, ('', True, None))[0]}").encode()
                 + b"\n")
    return h.hexdigest()


class _Entry:
    """``<key>.npy`` (the array) and ``<key>.json`` (what it holds; written last, so an
    entry without it is unfinished and ignored), guarded by ``<key>.lock``."""

    def __init__(self, root: Path, key: str) -> None:
        self.root, self.key = root, key
        self.npy = root / f"{key}.npy"
        self.meta = root / f"{key}.json"

    def read(self, n: int, shown: Sequence[str]) -> DecodedImages | None:
        try:
            meta = json.loads(self.meta.read_text())
            if meta.get("key") != self.key or meta.get("n") != n:
                return None
            if self.npy.stat().st_size != meta["npy_bytes"]:
                return None
            x = np.load(self.npy, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, KeyError, TypeError):
            return None  # absent, unfinished or damaged: decode again
        if x.dtype != np.uint8 or list(x.shape) != meta["shape"]:
            return None
        bad_idx = {int(i): str(r) for i, r in meta["bad"]}
        kept = np.array([i for i in range(n) if i not in bad_idx], dtype=np.int64)
        return DecodedImages(x=x, kept=kept, bad=[(shown[i], r) for i, r in bad_idx.items()],
                             cache_key=self.key, cache_path=self.npy, from_cache=True,
                             channels=int(meta["channels"]))

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """One decode per key at a time (across processes); the others wait and then find
        the entry. Without ``fcntl`` (Windows) two loads may both decode: the renames are
        atomic and write identical bytes, so that only wastes time."""
        try:
            import fcntl
        except ImportError:
            yield
            return
        with open(self.root / f"{self.key}.lock", "a+b") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def temp(self, suffix: str) -> Path:
        fd, name = tempfile.mkstemp(prefix=f".{self.key}.", suffix=f".{suffix}.tmp",
                                    dir=self.root)
        os.close(fd)
        return Path(name)

    def clean_stale(self, older_than_s: float = 86400.0) -> None:
        """Temporary files a killed decode left behind (never entries: those are only
        ever complete)."""
        now = time.time()
        for p in self.root.glob(".*.tmp"):
            with contextlib.suppress(OSError):
                if now - p.stat().st_mtime > older_than_s:
                    p.unlink()


def _fsync(path: Path) -> None:
    with open(path, "rb+") as fh:
        os.fsync(fh.fileno())


def _replace_json(entry: _Entry, meta: dict[str, Any]) -> None:
    tmp = entry.temp("json")
    try:
        tmp.write_text(json.dumps(meta, indent=1))
        _fsync(tmp)
        os.replace(tmp, entry.meta)
    finally:
        tmp.unlink(missing_ok=True)


# --------------------------------------------------------------------------- load_images


def load_images(paths: Sequence[str | Path], transform: Transform, *, skip_bad: bool = False,
                cache_dir: str | Path | None = None, progress: bool = True,
                workers: int | None = None) -> DecodedImages:
    """Decode ``paths`` (in order) into ``uint8 (N, C, S, S)`` through the cache.

    A bad file raises :class:`BadImageFile` at once (one line naming it), or with
    ``skip_bad`` is left out (``kept``/``bad`` say which). Mixed sizes without
    ``image_size`` and mixed gray/colour files with ``channels="auto"`` are refused with
    :class:`DataError` before anything is decoded. ``workers`` defaults to the CPUs this
    process may use (1 for a few hundred files).
    """
    if not isinstance(transform, Transform):
        raise ConfigError(f"transform must be a Transform, got {type(transform).__name__}")
    shown = [os.fspath(p) for p in paths]
    files = [os.path.abspath(p) for p in shown]
    root = Path(cache_dir).expanduser() if cache_dir is not None else cache_root()
    show = bool(progress) and sys.stderr.isatty()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"image cache folder {root} cannot be created ({_described(e)}); "
                        "set SCARCELAB_CACHE to a writable folder") from None
    index = _StatIndex(root)
    try:
        with _Workers(workers) as pool:
            scan = _scan(files, index, pool, show, skip_bad, shown)
            if not skip_bad:
                _raise_first_bad(scan.bad, shown)
            key = _cache_key(scan, transform, files)
            entry = _Entry(root, key)
            hit = entry.read(len(files), shown)
            if hit is None:
                with entry.lock():
                    hit = entry.read(len(files), shown)
                    if hit is None:
                        return replace(_decode_into(entry, scan, transform, files, shown,
                                                    skip_bad, pool, show), sha=list(scan.sha))
    finally:
        index.close()
    if not skip_bad and hit.bad:
        path, reason = hit.bad[0]
        raise BadImageFile(path, reason)
    return replace(hit, sha=list(scan.sha))


def _raise_first_bad(bad: dict[int, tuple[str, bool, str | None]], shown: Sequence[str]
                     ) -> None:
    if bad:
        i = min(bad)
        raise BadImageFile(shown[i], bad[i][0], bad[i][2], lasting=bad[i][1])


def _resolve_channels(transform: Transform, good: list[int], scan: _Scan,
                      shown: Sequence[str]) -> int:
    if transform.channels != "auto":
        return 1 if transform.channels == "gray" else 3
    gray = [i for i in good if scan.header[i][0] == "gray"]  # type: ignore[index]
    colour = [i for i in good if scan.header[i][0] != "gray"]  # type: ignore[index]
    if gray and colour:
        raise DataError(
            f"the images mix grayscale and colour files: {len(gray)} grayscale (e.g. "
            f"{shown[gray[0]]}) and {len(colour)} colour (e.g. {shown[colour[0]]}); choose "
            "one with channels gray or rgb (--channels gray|rgb)")
    return 3 if colour else 1


def _resolve_size(transform: Transform, good: list[int], scan: _Scan,
                  shown: Sequence[str]) -> tuple[int, int]:
    if transform.image_size is not None:
        return transform.image_size, transform.image_size
    if not good:
        return 0, 0
    first = good[0]
    _, w0, h0 = scan.header[first]  # type: ignore[misc]
    for i in good:
        _, w, h = scan.header[i]  # type: ignore[misc]
        if (w, h) != (w0, h0):
            raise DataError(
                f"the images differ in size: {shown[first]} is {w0}x{h0} and {shown[i]} is "
                f"{w}x{h} (width x height); set image_size (e.g. --image-size "
                f"{min(w0, h0, w, h)}) to resize every image to one size")
    return h0, w0


def _decode_into(entry: _Entry, scan: _Scan, transform: Transform, files: list[str],
                 shown: Sequence[str], skip_bad: bool, pool: _Workers, show: bool
                 ) -> DecodedImages:
    n = len(files)
    good = [i for i in range(n) if i not in scan.bad]
    channels = _resolve_channels(transform, good, scan, shown)
    height, width = _resolve_size(transform, good, scan, shown)
    entry.clean_stale()
    tmp = entry.temp("npy")
    bad = dict(scan.bad)
    try:
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8,
                                        shape=(len(good), channels, height, width))
        del out
        rows = [(r, i, files[i]) for r, i in enumerate(good)]
        failed: list[tuple[int, str, bool, str]] = []
        n_workers = pool.requested or default_workers(len(rows))
        with _bar(show, len(rows), "decoding images") as bar:
            for result in pool.run(_decode_chunk, _chunks(rows, n_workers),
                                   (str(tmp), transform, channels, (height, width)),
                                   len(rows), bar, stop=lambda r: bool(r) and not skip_bad):
                failed.extend(result)
        if failed:
            failed.sort()
            if not skip_bad:
                row, reason, lasting, fix = failed[0]
                raise BadImageFile(shown[good[row]], reason, fix, lasting=lasting)
            for row, reason, lasting, fix in failed:
                bad[good[row]] = (reason, lasting, fix)
            _drop_rows(tmp, entry, {f[0] for f in failed})
        _fsync(tmp)
        kept = np.array(sorted(set(range(n)) - set(bad)), dtype=np.int64)
        cacheable = all(entry[1] for entry in bad.values())
        if cacheable:
            os.replace(tmp, entry.npy)
            x = np.load(entry.npy, mmap_mode="r", allow_pickle=False)
            _replace_json(entry, {
                "key": entry.key, "n": n, "shape": list(x.shape), "channels": channels,
                "npy_bytes": entry.npy.stat().st_size,
                "bad": [[i, bad[i][0]] for i in sorted(bad)],
                "transform": transform.params(), "versions": _versions(files),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
            path: Path | None = entry.npy
        else:  # skipped for this environment's sake (a missing decoder): not cached
            x = np.array(np.load(tmp, allow_pickle=False))
            path = None
    finally:
        tmp.unlink(missing_ok=True)
    return DecodedImages(x=x, kept=kept, bad=[(shown[i], bad[i][0]) for i in sorted(bad)],
                         cache_key=entry.key, cache_path=path, from_cache=False,
                         channels=channels)


def _drop_rows(tmp: Path, entry: _Entry, drop: set[int]) -> None:
    """Rewrite the temporary array without the rows whose file failed to decode, a few
    hundred rows at a time (never the whole array in memory)."""
    src = np.load(tmp, mmap_mode="r", allow_pickle=False)
    keep = [r for r in range(src.shape[0]) if r not in drop]
    tmp2 = entry.temp("npy")
    try:
        dst = np.lib.format.open_memmap(tmp2, mode="w+", dtype=np.uint8,
                                        shape=(len(keep), *src.shape[1:]))
        for j in range(0, len(keep), 256):
            dst[j:j + 256] = src[keep[j:j + 256]]
        dst.flush()
        del dst, src
        os.replace(tmp2, tmp)
    finally:
        tmp2.unlink(missing_ok=True)


__all__ = ["CHANNEL_MODES", "DECODER_VERSION", "FIT_MODES", "IMAGE_SUFFIXES", "BadImageFile",
           "DecodedImages", "Transform", "cache_root", "decode_file", "default_workers",
           "fitted_size", "load_images", "to_model_input", "voi_window"]

