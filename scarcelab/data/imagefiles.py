"""A user's image files -> one uint8 array (issue 39, items 2 and 3).

INTERFACE COMMIT: the signatures below are final; the implementation is filled in by the
following commits on branch h39-decode (formats, cache, workers).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from scarcelab.data.download import cache_root as _scarcelab_cache_root
from scarcelab.errors import ConfigError, DataError

IMAGE_SUFFIXES: frozenset[str] = frozenset(
    {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".dcm"})
CHANNEL_MODES = ("auto", "gray", "rgb")
FIT_MODES = ("crop", "pad")
DECODER_VERSION = 1


@dataclass(frozen=True)
class Transform:
    image_size: int | None = None
    channels: str = "auto"
    fit: str = "crop"

    def __post_init__(self) -> None:
        s = self.image_size
        if s is not None and (isinstance(s, bool) or not isinstance(s, int) or s < 1):
            raise ConfigError(f"image_size must be a positive integer or None, got {s!r}")
        if self.channels not in CHANNEL_MODES:
            raise ConfigError(f"channels must be one of {', '.join(CHANNEL_MODES)}, "
                              f"got {self.channels!r}")
        if self.fit not in FIT_MODES:
            raise ConfigError(f"fit must be one of {', '.join(FIT_MODES)}, got {self.fit!r}")

    def key(self) -> str:
        size = "native" if self.image_size is None else str(self.image_size)
        return f"size={size};channels={self.channels};fit={self.fit};v={DECODER_VERSION}"

    def params(self) -> dict[str, str]:
        return {"image_size": "native" if self.image_size is None else str(self.image_size),
                "channels": self.channels, "fit": self.fit,
                "resample": "bilinear-antialias", "scale16": "minmax",
                "decoder_version": str(DECODER_VERSION)}


class BadImageFile(DataError):
    """A file that cannot be decoded."""


def decode_file(path: str | Path, channels: str = "auto") -> np.ndarray:
    try:
        with Image.open(path) as im:
            im.load()
            if im.mode not in ("L", "RGB"):
                im = im.convert("RGB")
            a = np.asarray(im)
    except Exception as e:  # noqa: BLE001 - filled in by the next commit
        raise BadImageFile(f"{path}: cannot decode ({e})") from None
    return a[None] if a.ndim == 2 else np.ascontiguousarray(a.transpose(2, 0, 1))


def to_model_input(img: np.ndarray, transform: Transform, channels: int) -> np.ndarray:
    raise NotImplementedError("filled in by the next commit")


@dataclass
class DecodedImages:
    x: np.ndarray
    kept: np.ndarray
    bad: list[tuple[str, str]]
    cache_key: str
    cache_path: Path | None
    from_cache: bool
    channels: int


def load_images(paths: Sequence[str | Path], transform: Transform, *, skip_bad: bool = False,
                cache_dir: str | Path | None = None, progress: bool = True,
                workers: int | None = None) -> DecodedImages:
    raise NotImplementedError("filled in by the next commit")


def cache_root() -> Path:
    return _scarcelab_cache_root() / "images"


_ = os
