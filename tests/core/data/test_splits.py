import numpy as np
import pytest

from scarcelab.data.bundle import RawDataset
from scarcelab.data.splits import apply_split, make_split, split_hash, stratified_counts
from scarcelab.errors import ConfigError


def _raw(counts=(700, 200, 100), name="toy"):
    y = np.concatenate([np.full(c, i) for i, c in enumerate(counts)])
    x = np.arange(len(y), dtype=np.int64)[:, None, None, None].astype(np.uint8)
    x = np.broadcast_to(x, (len(y), 1, 2, 2)).copy()
    return RawDataset(name=name, train_x=x, train_y=y, test_x=x[:10], test_y=y[:10],
                      num_classes=len(counts), class_names=[str(i) for i in range(len(counts))])


def test_stratified_counts_natural_frequency_largest_remainder():
    assert stratified_counts(np.array([700, 200, 100]), 10).tolist() == [7, 2, 1]
    # quotas 3.5, 1.0, 0.5 -> floors 3, 1, 0 -> min 1 -> [3,1,1]
    assert stratified_counts(np.array([700, 200, 100]), 5).tolist() == [3, 1, 1]
    c = stratified_counts(np.array([500, 300, 200]), 7)
    assert c.sum() == 7 and (c >= 1).all()


def test_split_is_disjoint_complete_and_natural():
    raw = _raw()
    s = make_split(raw, 100, 50, seed=3)
    lab, val, unl = set(s["labeled"]), set(s["val"]), set(s["unlabeled"])
    assert len(lab) == 100 and len(val) == 50 and len(unl) == 850
    assert not (lab & val) and not (lab & unl) and not (val & unl)
    assert lab | val | unl == set(range(1000))
    assert np.bincount(raw.train_y[s["labeled"]]).tolist() == [70, 20, 10]
    assert np.bincount(raw.train_y[s["val"]]).tolist() == [35, 10, 5]


def test_split_deterministic_in_seed_and_hashed():
    raw = _raw()
    a, b, c = make_split(raw, 60, 30, 1), make_split(raw, 60, 30, 1), make_split(raw, 60, 30, 2)
    assert a == b and a["hash"] == b["hash"]
    assert a["labeled"] != c["labeled"] and a["hash"] != c["hash"]
    assert split_hash(a) == a["hash"] and len(a["hash"]) == 12


def test_val_larger_than_train_refused_unless_overridden():
    raw = _raw()
    with pytest.raises(ConfigError, match="n_val=80 is larger than n_labeled=40.*allow_large_val"):
        make_split(raw, 40, 80)
    assert len(make_split(raw, 40, 80, allow_large_val=True)["val"]) == 80


def test_defaults_and_all():
    raw = _raw()
    s = make_split(raw, None, None)
    assert len(s["labeled"]) == len(s["val"]) == 250  # min(400, n//4)
    s = make_split(raw, "all", None)  # all labels: the default validation size held out
    assert len(s["labeled"]) == 750 and len(s["val"]) == 250 and s["unlabeled"] == []
    with pytest.raises(ConfigError, match="empty validation set"):
        make_split(raw, "all", 0)  # issue 13 §7: no model selection without validation


def test_too_many_requested():
    with pytest.raises(ConfigError, match="exceeds the 1000 training samples"):
        make_split(_raw(), 600, 500, allow_large_val=True)


def test_apply_split_and_wrong_dataset():
    raw = _raw()
    s = make_split(raw, 30, 30)
    b = apply_split(raw, s)
    assert b.sizes() == {"labeled": 30, "unlabeled": 940, "val": 30, "test": 10}
    assert b.meta["split_hash"] == s["hash"] and b.num_classes == 3
    np.testing.assert_array_equal(b.labeled_y, raw.train_y[s["labeled"]])
    with pytest.raises(Exception, match="drawn for 'toy'"):
        apply_split(_raw(name="other"), s)


def test_multilabel_refused():
    raw = _raw()
    raw.task = "multi-label"
    with pytest.raises(ConfigError, match="multi-label"):
        make_split(raw, 10, 10)


# -- validation from the official validation split (SSL-vs-SSL App. D.1) ---------------------


def _raw_with_val(counts=(700, 200, 100), val_counts=(140, 40, 20), name="toy"):
    raw = _raw(counts, name)
    vy = np.concatenate([np.full(c, i) for i, c in enumerate(val_counts)])
    # official validation images are 4x4 (train ones 2x2) so a test can tell them apart
    raw.val_x = np.zeros((len(vy), 1, 4, 4), np.uint8) + vy[:, None, None, None].astype(
        np.uint8)
    raw.val_y = vy
    return raw


def test_validation_defaults_to_the_official_split_by_class_frequency():
    raw = _raw_with_val()
    s = make_split(raw, 100, 50, seed=3)
    assert s["val_from"] == "official"
    # validation indexes the official validation split, drawn by its class frequency
    assert max(s["val"]) < len(raw.val_y)
    assert np.bincount(raw.val_y[s["val"]]).tolist() == [35, 10, 5]
    # the labeled set comes from train; the whole rest of train is unlabeled
    assert len(s["labeled"]) == 100 and len(s["unlabeled"]) == 900
    assert not set(s["labeled"]) & set(s["unlabeled"])
    b = apply_split(raw, s)
    assert b.val_x.shape == (50, 1, 4, 4) and b.labeled_x.shape == (100, 1, 2, 2)
    np.testing.assert_array_equal(b.val_y, raw.val_y[s["val"]])
    np.testing.assert_array_equal(b.labeled_x, raw.train_x[s["labeled"]])
    assert b.sizes() == {"labeled": 100, "unlabeled": 900, "val": 50, "test": 10}
    assert b.meta["val_from"] == "official"


def test_draw_from_train_stays_an_option_and_changes_the_hash():
    raw = _raw_with_val()
    off = make_split(raw, 100, 50, seed=3)
    tr = make_split(raw, 100, 50, seed=3, val_from="train")
    assert tr["val_from"] == "train" and len(tr["unlabeled"]) == 850
    assert tr == make_split(_raw(), 100, 50, seed=3)  # exactly the old split ...
    assert tr["hash"] == make_split(_raw(), 100, 50, seed=3)["hash"]  # ... and its hash
    assert off["labeled"] == tr["labeled"]  # same labeled draw either way
    assert off["hash"] != tr["hash"]
    # the same index lists into the other split are another split: another hash
    assert split_hash({**tr, "val_from": "official"}) != tr["hash"]


def test_official_split_too_small_or_missing():
    raw = _raw_with_val(val_counts=(14, 4, 2))  # 20 official validation images
    assert make_split(raw, 100, 30)["val_from"] == "train"  # auto falls back
    with pytest.raises(ConfigError, match="n_val=30 exceeds the 20 images.*val_from=train"):
        make_split(raw, 100, 30, val_from="official")
    with pytest.raises(ConfigError, match="no official validation split"):
        make_split(_raw(), 100, 30, val_from="official")
    with pytest.raises(ConfigError, match="val_from='nope'"):
        make_split(raw, 100, 30, val_from="nope")


def test_real_pneumoniamnist_validation_comes_from_its_official_split(medmnist_dir):
    from scarcelab.data import load_raw

    raw = load_raw("pneumoniamnist", str(medmnist_dir))
    s = make_split(raw, 400, 400, seed=0)
    b = apply_split(raw, s)
    assert s["val_from"] == "official" and len(s["unlabeled"]) == len(raw.train_y) - 400
    # by class frequency of the official validation split (524 images)
    want = stratified_counts(np.bincount(raw.val_y), 400).tolist()
    assert np.bincount(b.val_y).tolist() == want
    vals = {bytes(x) for x in raw.val_x[s["val"]]}
    assert {bytes(x) for x in b.val_x} == vals
