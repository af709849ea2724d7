"""The dataset contract, run over every registered dataset (timm's ``test_models.py`` runs
its template over ``list_models()``; here the image datasets' ``DATASETS`` and the active
learning sets' ``AL_DATASETS``), so that a newcomer's dataset file is checked without being
named in any test.

Every dataset is loaded from the real files under ../shared/data (never a copy in the
repository); one whose files are not there is skipped with the loader's own message as
the reason. The network is off for the whole module: a loader that would download must
fail at once with a clear, one-line error that says where to put the file, which is what
the missing-files tests check (from an empty folder) for every dataset that has files.
Loads are cached per dataset, so each is read once for all its checks.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import SHARED_DATA

from scarcelab.active.datasets import AL_DATASETS, load_al_dataset
from scarcelab.data import DATASETS, RawDataset, load_raw
from scarcelab.data.sources.medmnist import MEDMNIST_INFO
from scarcelab.data.splits import make_split
from scarcelab.errors import ConfigError, DataError

IMAGE_SETS = DATASETS.names()
AL_SETS = AL_DATASETS.names()
_NO_NETWORK = "network disabled in the dataset contract tests"


def _refuse(*args: object, **kwargs: object) -> Any:
    raise urllib.error.URLError(_NO_NETWORK)


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(urllib.request, "urlopen", _refuse)


#: the prefix of ``RawDataset.source`` for a set its loader makes rather than reads
#: (``synthetic:seed=…``, a toy's ``synthetic:bars``)
GENERATED = "synthetic:"


@cache
def _raw(name: str) -> RawDataset | str:
    """The dataset from the shared data, or why it cannot be loaded here."""
    import warnings

    orig = urllib.request.urlopen
    urllib.request.urlopen = _refuse  # the cache outlives a test's monkeypatch
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # md5 of re-saved copies, stand-in test sets
            return load_raw(name, data_dir=SHARED_DATA)
    except (DataError, ConfigError) as e:
        return f"{name}: files not under {SHARED_DATA} ({str(e)[:240]})"
    finally:
        urllib.request.urlopen = orig


def _need(name: str) -> RawDataset:
    raw = _raw(name)
    if isinstance(raw, str):
        pytest.skip(raw)
    return raw


def _splits(raw: RawDataset) -> list[tuple[str, np.ndarray, np.ndarray]]:
    out = [("train", raw.train_x, raw.train_y), ("test", raw.test_x, raw.test_y)]
    if raw.val_x is not None:
        out.append(("val", raw.val_x, raw.val_y))
    return out


# -- image datasets ------------------------------------------------------------------------
@pytest.mark.parametrize("name", IMAGE_SETS)
def test_images_are_uint8_nchw_with_one_shape_across_splits(name: str) -> None:
    raw = _need(name)
    shapes = set()
    for part, x, y in _splits(raw):
        assert x.dtype == np.uint8, f"{name} {part}: images are {x.dtype}, not uint8"
        assert x.ndim == 4 and x.shape[1] in (1, 3), f"{name} {part}: shape {x.shape}"
        assert len(x) == len(y) > 0, f"{name} {part}: {len(x)} images, {len(y)} labels"
        shapes.add(x.shape[1:])
    assert len(shapes) == 1, f"{name}: splits differ in (C, H, W): {shapes}"
    assert raw.channels == x.shape[1] and raw.resolution == x.shape[2:]


@pytest.mark.parametrize("name", IMAGE_SETS)
def test_labels_are_int64_in_range_with_one_name_per_class(name: str) -> None:
    raw = _need(name)
    assert raw.task in ("multi-class", "multi-label")
    names = raw.class_names
    assert len(names) == raw.num_classes >= 2
    assert all(isinstance(n, str) and n for n in names) and len(set(names)) == len(names)
    for part, _, y in _splits(raw):
        assert y.dtype == np.int64, f"{name} {part}: labels are {y.dtype}"
        if raw.task == "multi-label":
            assert y.ndim == 2 and y.shape[1] == raw.num_classes
            assert set(np.unique(y)) <= {0, 1}
        else:
            assert y.ndim == 1, f"{name} {part}: labels of shape {y.shape}"
            assert 0 <= y.min() and y.max() < raw.num_classes, f"{name} {part}: out of range"
    if raw.task == "multi-class":
        assert len(np.unique(raw.train_y)) == raw.num_classes, f"{name}: a class has no image"
    if raw.positive_class is not None:
        assert 0 <= raw.positive_class < raw.num_classes


@pytest.mark.parametrize("name", [n for n in IMAGE_SETS if n in MEDMNIST_INFO])
def test_medmnist_split_sizes_are_the_official_ones(name: str) -> None:
    """The sizes MedMNIST's own INFO table gives (train, val, test), class names and
    channels: a re-saved copy may reorder, never drop or add."""
    raw = _need(name)
    info = MEDMNIST_INFO[name]
    assert raw.val_x is not None
    assert (len(raw.train_x), len(raw.val_x), len(raw.test_x)) == info.n_samples
    assert tuple(raw.class_names) == info.class_names and raw.channels == info.n_channels


@pytest.mark.parametrize("name", IMAGE_SETS)
def test_a_split_is_the_same_under_a_seed_and_another_under_another(name: str) -> None:
    raw = _need(name)
    if raw.task == "multi-label":
        pytest.skip(f"{name}: multi-label; the realistic split draws single-label classes")
    a, b = make_split(raw, seed=0), make_split(raw, seed=0)
    assert a == b, f"{name}: two splits under seed 0 differ"
    parts = ("labeled", "val", "unlabeled")
    assert len(a["labeled"]) > 0 and not set(a["labeled"]) & set(a["unlabeled"])
    c = make_split(raw, seed=1)
    assert any(a[k] != c[k] for k in parts), f"{name}: seeds 0 and 1 give the same split"


@pytest.mark.parametrize("name", IMAGE_SETS)
def test_missing_files_are_one_clear_line_saying_where_to_put_them(name: str,
                                                                   tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    try:
        made = load_raw(name, data_dir=empty)
    except (DataError, ConfigError) as e:
        exc = e
    else:  # nothing to read: the loader must say it made the set, by its source
        assert made.source.startswith(GENERATED), (
            f"{name}: loaded from an empty folder, yet its source {made.source!r} does not "
            f"start with {GENERATED!r} (a set made rather than read says so)")
        assert made.num_classes >= 2
        return
    msg = str(exc)
    assert "\n" not in msg.strip(), f"{name}: a multi-line error: {msg!r}"
    assert str(empty) in msg, f"{name}: the error does not name the folder it looked in: {msg}"


# -- active learning sets ------------------------------------------------------------------
@cache
def _al(name: str, seed: int) -> Any:
    if AL_DATASETS.get(name).kind == "encoded":
        # an encoded set trains a self-supervised encoder on its image set first (minutes
        # on a CPU); its images are checked as the image set, its encoding in
        # tests/core/active/test_active_images.py
        return f"{name}: an encoded set; its image set and encoder have their own tests"
    orig = urllib.request.urlopen
    urllib.request.urlopen = _refuse
    try:
        return load_al_dataset(name, SHARED_DATA, np.random.default_rng(seed))
    except (DataError, ConfigError) as e:
        if AL_DATASETS.get(name).synthetic:
            raise  # made, not read: its error is the set's own, never a missing file
        return f"{name}: files not under {SHARED_DATA} ({str(e)[:240]})"
    finally:
        urllib.request.urlopen = orig


@pytest.mark.parametrize("name", AL_SETS)
def test_al_set_is_float32_features_with_labels_in_range(name: str) -> None:
    data = _al(name, 0)
    if isinstance(data, str):
        pytest.skip(data)
    for part, x, y in (("train", data.x_train, data.y_train), ("test", data.x_test,
                                                                data.y_test)):
        # features (N, D), or images (N, C, H, W) in [0, 1] for the image sets
        ndim = 4 if AL_DATASETS.get(name).kind == "image" else 2
        assert x.dtype == np.float32 and x.ndim == ndim, f"{name} {part}: {x.dtype} {x.shape}"
        assert len(x) == len(y) > 0 and y.ndim == 1
        assert np.issubdtype(y.dtype, np.integer), f"{name} {part}: labels are {y.dtype}"
        assert 0 <= y.min() and y.max() < data.num_classes
        assert np.isfinite(x).all()
    assert data.x_train.shape[1:] == data.x_test.shape[1:]
    assert len(np.unique(data.y_train)) == data.num_classes >= 2


@pytest.mark.parametrize("name", AL_SETS)
def test_al_set_is_the_same_under_a_seed(name: str) -> None:
    """Synthetic sets are drawn from the data seed: the same seed gives the same set and
    another seed another one; a set read from files is the same under every seed."""
    a = _al(name, 0)
    if isinstance(a, str):
        pytest.skip(a)
    b = load_al_dataset(name, SHARED_DATA, np.random.default_rng(0))  # a fresh load
    assert np.array_equal(a.x_train, b.x_train) and np.array_equal(a.y_train, b.y_train)
    other = _al(name, 1)
    if AL_DATASETS.get(name).synthetic:
        assert not np.array_equal(a.x_train, other.x_train), f"{name}: seed is ignored"
    else:
        assert np.array_equal(a.x_test, other.x_test)


@pytest.mark.parametrize("name", AL_SETS)
def test_al_missing_files_are_one_clear_line(name: str, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    if AL_DATASETS.get(name).synthetic:
        load_al_dataset(name, empty, np.random.default_rng(0))  # made, not read: no files
        return
    with pytest.raises((DataError, ConfigError)) as exc:
        load_al_dataset(name, empty, np.random.default_rng(0))
    msg = str(exc.value)
    assert "\n" not in msg.strip(), f"{name}: a multi-line error: {msg!r}"
    assert str(empty) in msg, f"{name}: the error does not name the folder it looked in: {msg}"
