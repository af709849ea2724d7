"""The tiny synthetic image sets that other unit tests train on."""

from __future__ import annotations

import numpy as np
import pytest

from scarcelab.data import DATASETS, load_raw
from scarcelab.data.sources.synthetic import make_synthetic_tiny


@pytest.mark.parametrize(("name", "channels"), [("synthetic_tiny", 1), ("synthetic_tiny_rgb", 3)])
def test_shapes_dtypes_and_balance(name: str, channels: int) -> None:
    assert name in DATASETS
    ds = load_raw(name)
    assert ds.name == name
    assert ds.train_x.shape == (600, channels, 16, 16)
    assert ds.val_x is not None and ds.val_y is not None
    assert ds.val_x.shape == (150, channels, 16, 16)
    assert ds.test_x.shape == (150, channels, 16, 16)
    for x, y in ((ds.train_x, ds.train_y), (ds.val_x, ds.val_y), (ds.test_x, ds.test_y)):
        assert x.dtype == np.uint8 and y.dtype == np.int64 and y.ndim == 1
        assert np.bincount(y, minlength=3).tolist() == [len(y) // 3] * 3
    assert ds.num_classes == 3 and len(ds.class_names) == 3
    assert ds.channels == channels and ds.resolution == (16, 16)
    assert ds.task == "multi-class"


def test_deterministic_and_seed_dependent() -> None:
    a, b = load_raw("synthetic_tiny"), load_raw("synthetic_tiny")
    assert np.array_equal(a.train_x, b.train_x) and np.array_equal(a.test_y, b.test_y)
    c = make_synthetic_tiny(seed=1)
    assert not np.array_equal(a.train_x, c.train_x)


def test_splits_are_not_copies_of_each_other() -> None:
    ds = load_raw("synthetic_tiny")
    assert not np.array_equal(ds.train_x[:150], ds.test_x)
    assert ds.val_x is not None and not np.array_equal(ds.val_x, ds.test_x)


@pytest.mark.parametrize("name", ["synthetic_tiny", "synthetic_tiny_rgb"])
def test_classes_are_separable_by_a_simple_rule(name: str) -> None:
    """Row vs column gradient energy tells stripes and checkerboards apart.

    A hand-written two-feature rule fitted on train reaches near-perfect test accuracy,
    so a method that fails to learn this data has a bug, not a hard problem.
    """
    ds = load_raw(name)

    def features(x: np.ndarray) -> np.ndarray:
        grey = x.astype(np.float64).mean(1)
        dv = np.abs(np.diff(grey, axis=1)).mean((1, 2))  # across rows: horizontal stripes
        dh = np.abs(np.diff(grey, axis=2)).mean((1, 2))  # across columns: vertical stripes
        return np.stack([dv, dh], 1)

    f_train, f_test = features(ds.train_x), features(ds.test_x)
    centroids = np.stack([f_train[ds.train_y == k].mean(0) for k in range(3)])
    pred = np.linalg.norm(f_test[:, None] - centroids[None], axis=2).argmin(1)
    assert (pred == ds.test_y).mean() > 0.95


def test_pixels_use_the_whole_range_without_being_saturated() -> None:
    x = load_raw("synthetic_tiny").train_x
    assert x.min() < 30 and x.max() > 225
    assert ((x == 0) | (x == 255)).mean() < 0.2
