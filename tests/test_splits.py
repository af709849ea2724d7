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
