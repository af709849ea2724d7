"""Tiny synthetic image datasets for unit tests: seeded, class-separable, milliseconds to make.

Each class is a texture whose identity survives the augmentations methods use (flips,
shifts, crops, colour jitter): horizontal stripes, vertical stripes and a checkerboard,
each with a random phase, random contrast and pixel noise. A small network separates them
in a few steps, which is what method tests need ("a few steps lower the loss on separable
data"), while the noise and random phase keep it from being a constant lookup.
"""

from __future__ import annotations

import os

import numpy as np

from scarcelab.data import DATASETS
from scarcelab.data.bundle import RawDataset

CLASS_NAMES = ("horizontal stripes", "vertical stripes", "checkerboard")
SEED = 0
_NAMES = {1: "synthetic_tiny", 3: "synthetic_tiny_rgb"}


def _patterns(labels: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """Float (N, size, size) textures in [-1, 1], one per label, with a random phase."""
    n = labels.shape[0]
    period = 4
    coords = np.arange(size)
    rows = (coords[None, :, None] + rng.integers(0, period, (n, 1, 1))) // (period // 2) % 2
    cols = (coords[None, None, :] + rng.integers(0, period, (n, 1, 1))) // (period // 2) % 2
    horizontal = np.broadcast_to(rows, (n, size, size))
    vertical = np.broadcast_to(cols, (n, size, size))
    checker = rows ^ cols
    stacked = np.stack([horizontal, vertical, checker])  # (3, N, size, size)
    chosen = stacked[labels, np.arange(n)]
    return chosen.astype(np.float32) * 2.0 - 1.0


def make_synthetic_tiny(
    channels: int = 1,
    n_train: int = 600,
    n_val: int = 150,
    n_test: int = 150,
    size: int = 16,
    seed: int = SEED,
    noise: float = 0.25,
) -> RawDataset:
    """Build the tiny dataset: balanced classes, uint8 (N, channels, size, size).

    ``noise`` is the pixel noise standard deviation relative to the pattern amplitude.
    With ``channels == 3`` every channel carries the same texture with its own random
    gain and offset, so colour augmentations change colours but never the class.
    """
    rng = np.random.default_rng(seed)
    k = len(CLASS_NAMES)
    splits: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for split, n in (("train", n_train), ("val", n_val), ("test", n_test)):
        labels = rng.permutation(np.arange(n) % k).astype(np.int64)
        pattern = _patterns(labels, size, rng)[:, None]  # (N, 1, H, W)
        amplitude = rng.uniform(0.5, 1.0, (n, channels, 1, 1)).astype(np.float32)
        offset = rng.uniform(-0.15, 0.15, (n, channels, 1, 1)).astype(np.float32)
        pixel_noise = rng.standard_normal((n, channels, size, size), dtype=np.float32)
        signal = pattern * amplitude + offset + noise * pixel_noise
        images = np.clip(127.5 + 100.0 * signal, 0, 255).round().astype(np.uint8)
        splits[split] = (images, labels)
    return RawDataset(
        name=_NAMES.get(channels, f"synthetic_tiny_c{channels}"),
        train_x=splits["train"][0],
        train_y=splits["train"][1],
        test_x=splits["test"][0],
        test_y=splits["test"][1],
        num_classes=k,
        class_names=list(CLASS_NAMES),
        val_x=splits["val"][0],
        val_y=splits["val"][1],
        task="multi-class",
        source=f"synthetic:seed={seed}",
        md5=None,
    )


@DATASETS.register("synthetic_tiny")
def synthetic_tiny(data_dir: str | os.PathLike[str] | None = None) -> RawDataset:
    """3 classes, 1 channel, 16x16; 600 train / 150 val / 150 test. ``data_dir`` is unused."""
    return make_synthetic_tiny(channels=1)


@DATASETS.register("synthetic_tiny_rgb")
def synthetic_tiny_rgb(data_dir: str | os.PathLike[str] | None = None) -> RawDataset:
    """As ``synthetic_tiny`` with 3 channels. ``data_dir`` is unused."""
    return make_synthetic_tiny(channels=3)


__all__ = ["CLASS_NAMES", "make_synthetic_tiny", "synthetic_tiny", "synthetic_tiny_rgb"]
