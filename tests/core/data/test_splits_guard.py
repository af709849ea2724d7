"""Behaviour guard for ``make_split``: split hashes recorded in tracked runs depend on its
exact output, so every index list (and every refusal's type and message) of a spread of
configurations is pinned here, recorded on the code before it was restructured."""

from __future__ import annotations

import hashlib
import json
import warnings

import numpy as np
import pytest

from scarcelab.data.bundle import RawDataset
from scarcelab.data.splits import make_split


def _raw(counts=(700, 200, 100), val_counts=None, name="toy", test_one_class=False):
    y = np.concatenate([np.full(c, i) for i, c in enumerate(counts)])
    x = np.zeros((len(y), 1, 2, 2), np.uint8)
    test_y = np.zeros(10, dtype=y.dtype) if test_one_class else y[::max(1, len(y) // 10)][:10]
    raw = RawDataset(name=name, train_x=x, train_y=y, test_x=x[:10], test_y=test_y,
                     num_classes=len(counts), class_names=[str(i) for i in range(len(counts))])
    if val_counts is not None:
        vy = np.concatenate([np.full(c, i) for i, c in enumerate(val_counts)])
        raw.val_x, raw.val_y = np.zeros((len(vy), 1, 2, 2), np.uint8), vy
    return raw


def _digest(split: dict) -> str:
    """Every index and every key, in their order (the JSON written is in insertion order)."""
    return hashlib.sha256(json.dumps(split).encode()).hexdigest()[:16]


def _warned(caught: list) -> list[tuple[str, str]]:
    """Message and reported file: the warning's stacklevel names make_split's caller."""
    return [(str(w.message), w.filename.rsplit("/", 1)[-1]) for w in caught]


def _outcome(raw: RawDataset, *args, **kwargs) -> tuple:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            s = make_split(raw, *args, **kwargs)
        except Exception as e:  # noqa: BLE001 - the refusal is the behaviour pinned
            return ("error", type(e).__name__, str(e), _warned(caught))
    return ("ok", s["hash"], _digest(s), _warned(caught))


CASES = {
    "train_100_50_s3": lambda: _outcome(_raw(), 100, 50, seed=3),
    "train_60_30_s1": lambda: _outcome(_raw(), 60, 30, 1),
    "train_defaults": lambda: _outcome(_raw(), None, None),
    "train_default_strings": lambda: _outcome(_raw(), "default", ""),
    "train_val_unset": lambda: _outcome(_raw(), 40, None, seed=5),
    "train_all": lambda: _outcome(_raw(), "all", None, seed=2),
    "train_all_val_given": lambda: _outcome(_raw(), "all", "120", seed=2),
    "train_large_val": lambda: _outcome(_raw(), 40, 80, seed=4, allow_large_val=True),
    "train_str_counts": lambda: _outcome(_raw(), "50", "20", seed=9),
    "frac_half": lambda: _outcome(_raw(), 100, 50, seed=3, label_fraction=0.5,
                                  allow_large_val=True),
    "frac_tenth": lambda: _outcome(_raw(), 200, 20, seed=7, label_fraction=0.1),
    "frac_one": lambda: _outcome(_raw(), 100, 50, seed=3, label_fraction=1.0),
    "official_100_50": lambda: _outcome(_raw(val_counts=(140, 40, 20)), 100, 50, seed=3),
    "official_frac": lambda: _outcome(_raw(val_counts=(140, 40, 20)), 100, 30, seed=1,
                                      label_fraction=0.3),
    "official_all": lambda: _outcome(_raw(val_counts=(140, 40, 20)), "all", None, seed=0),
    "official_all_val": lambda: _outcome(_raw(val_counts=(140, 40, 20)), "all", 60,
                                         val_from="official"),
    "auto_falls_back": lambda: _outcome(_raw(val_counts=(14, 4, 2)), 100, 30, seed=2),
    "forced_train": lambda: _outcome(_raw(val_counts=(140, 40, 20)), 100, 50, seed=3,
                                     val_from="train"),
    "default_budget_name": lambda: _outcome(_raw(name="synthetic_tiny"), None, None, seed=1),
    "four_classes": lambda: _outcome(_raw(counts=(50, 30, 15, 5)), 20, 12, seed=11),
    "empty_class": lambda: _outcome(_raw(counts=(60, 0, 40)), 10, 10, seed=2),
    "test_one_class_warns": lambda: _outcome(_raw(test_one_class=True), 10, 10),
    "err_fraction_zero": lambda: _outcome(_raw(), 10, 10, label_fraction=0.0),
    "err_fraction_big": lambda: _outcome(_raw(), 10, 10, label_fraction=1.5),
    "err_multilabel": lambda: _outcome(_multilabel(), 10, 10),
    "err_empty_val": lambda: _outcome(_raw(), "all", 0),
    "err_zero_labeled": lambda: _outcome(_raw(), 0, 5),
    "err_large_val": lambda: _outcome(_raw(), 40, 80),
    "err_frac_large_val": lambda: _outcome(_raw(), 100, 50, label_fraction=0.4),
    "err_too_many": lambda: _outcome(_raw(), 600, 500, allow_large_val=True),
    "err_bad_val_from": lambda: _outcome(_raw(), 100, 30, val_from="nope"),
    "err_no_official": lambda: _outcome(_raw(), 100, 30, val_from="official"),
    "err_official_small": lambda: _outcome(_raw(val_counts=(14, 4, 2)), 100, 30,
                                           val_from="official"),
    "err_all_no_official": lambda: _outcome(_raw(), "all", None, val_from="official"),
    "err_frac_fewer_than_classes": lambda: _outcome(_raw(), 10, 1, label_fraction=0.2),
    "err_single_class": lambda: _outcome(_raw(counts=(100,)), 10, 10),
    "err_strat_too_few": lambda: _outcome(_raw(), 2, 2),
    "val_class_small": lambda: _outcome(_raw(counts=(700, 200, 2)), 100, 50,
                                                allow_large_val=True),
}


def _multilabel() -> RawDataset:
    raw = _raw()
    raw.task = "multi-label"
    return raw


# recorded on the code before make_split was split into helpers
EXPECTED: dict[str, tuple] = {
    'auto_falls_back': ('ok', '1289318185b1', '7a04457ab8a4f8a0', []),
    'default_budget_name': ('ok', 'e7e4b38f51bf', '628735d2da458f27', []),
    'empty_class': ('ok', '498cf74e678d', 'da8fa99cd29076b5', []),
    'err_all_no_official': (
        'error',
        'ConfigError',
        ("val_from=official: dataset 'toy' has no official validation split; use"
         ' val_from=train (or auto)'),
        [],
    ),
    'err_bad_val_from': (
        'error',
        'ConfigError',
        "val_from='nope': valid values are auto, official, train",
        [],
    ),
    'err_empty_val': (
        'error',
        'ConfigError',
        ('n_labeled=1000, n_val=0: both must be >= 1 (an empty validation set cannot select'
         ' a model or stop early)'),
        [],
    ),
    'err_frac_fewer_than_classes': (
        'error',
        'ConfigError',
        ('label_fraction=0.2 keeps 2 of 10 labeled images, fewer than the 3 classes; raise'
         ' label_fraction'),
        [],
    ),
    'err_frac_large_val': (
        'error',
        'ConfigError',
        ('n_val=50 is larger than n_labeled=40; a validation set larger than the labeled'
         ' training set is unrealistic. Lower n_val or pass allow_large_val=true to'
         ' override.'),
        [],
    ),
    'err_fraction_big': (
        'error',
        'ConfigError',
        'label_fraction must be in (0, 1], got 1.5; e.g. 0.1 keeps 10 % of the labeled images',
        [],
    ),
    'err_fraction_zero': (
        'error',
        'ConfigError',
        'label_fraction must be in (0, 1], got 0.0; e.g. 0.1 keeps 10 % of the labeled images',
        [],
    ),
    'err_large_val': (
        'error',
        'ConfigError',
        ('n_val=80 is larger than n_labeled=40; a validation set larger than the labeled'
         ' training set is unrealistic. Lower n_val or pass allow_large_val=true to'
         ' override.'),
        [],
    ),
    'err_multilabel': (
        'error',
        'ConfigError',
        ("dataset 'toy' is multi-label; scarcelab's classifiers and splits are single-label"
         ' multi-class (pick another dataset)'),
        [],
    ),
    'err_no_official': (
        'error',
        'ConfigError',
        ("val_from=official: dataset 'toy' has no official validation split; use"
         ' val_from=train (or auto)'),
        [],
    ),
    'err_official_small': (
        'error',
        'ConfigError',
        ("val_from=official: n_val=30 exceeds the 20 images of toy's official validation"
         ' split; lower n_val or use val_from=train'),
        [],
    ),
    'err_single_class': (
        'error',
        'DataError',
        'toy: the train split has a single class (0); a labeled set needs at least two classes',
        [],
    ),
    'err_strat_too_few': (
        'error',
        'ConfigError',
        'cannot draw 2 samples with at least one from each of 3 classes',
        [],
    ),
    'err_too_many': (
        'error',
        'ConfigError',
        'n_labeled + n_val = 1100 exceeds the 1000 training samples of toy',
        [],
    ),
    'err_zero_labeled': (
        'error',
        'ConfigError',
        ('n_labeled=0, n_val=5: both must be >= 1 (an empty validation set cannot select a'
         ' model or stop early)'),
        [],
    ),
    'forced_train': ('ok', '90ff0797af07', 'c4da07cc42ed487b', []),
    'four_classes': ('ok', 'e5b00e869a8c', '3d0fb5aa4af03763', []),
    'frac_half': ('ok', '3130d3c32fcd', '47aca23b538bce06', []),
    'frac_one': ('ok', '90ff0797af07', 'c4da07cc42ed487b', []),
    'frac_tenth': ('ok', '87744e7fea23', '7dbd3cc1fc87df25', []),
    'official_100_50': ('ok', '09d778e46769', 'ea51a8b7f1efc61f', []),
    'official_all': ('ok', 'b28bea833ebe', '33ecde3525a3a9d9', []),
    'official_all_val': ('ok', 'a3dc42c42270', '72d3e990cdfb88f0', []),
    'official_frac': ('ok', '4ed5669fbc7a', '8a3518b6f94e85c9', []),
    'test_one_class_warns': (
        'ok',
        '995b7e399a57',
        '427c377d65e3a0cb',
        [('toy: the test split has a single class; test AUROC is undefined and will be'
          ' missing, balanced accuracy is not comparable', 'test_splits_guard.py')],
    ),
    'train_100_50_s3': ('ok', '90ff0797af07', 'c4da07cc42ed487b', []),
    'train_60_30_s1': ('ok', '0f89201d1410', '81c60cd52044828b', []),
    'train_all': ('ok', '6c3034217234', 'e5ad4ce48ef0baa2', []),
    'train_all_val_given': ('ok', '363e46ece1fb', 'e789726e6d16a5a4', []),
    'train_default_strings': ('ok', '6152bde3e6be', 'aee0007aa44c0b8e', []),
    'train_defaults': ('ok', '6152bde3e6be', 'aee0007aa44c0b8e', []),
    'train_large_val': ('ok', 'e1a46c95acd1', 'e1c9e39546e65ec6', []),
    'train_str_counts': ('ok', '5faaa2edc8cc', '9e9f793de75a8d53', []),
    'train_val_unset': ('ok', 'cf19f2e49a23', '09625a38084271af', []),
    'val_class_small': ('ok', '33bfd3fe1141', '92ccb9c04ae4505c', []),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_make_split_outcome_is_unchanged(name: str) -> None:
    assert CASES[name]() == EXPECTED[name]
