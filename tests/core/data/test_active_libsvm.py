"""The LibSVM reader: format rules, clear errors, and the real splice files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED_DATA

from scarcelab.data.libsvm import read_libsvm, read_libsvm_pair
from scarcelab.errors import DataError


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_parses_sparse_rows_comments_and_labels(tmp_path: Path) -> None:
    p = _write(tmp_path, "a", "+1 1:0.5 3:-1  # comment\n\n-1 2:2\n+1\n")
    d = read_libsvm(p)
    np.testing.assert_array_equal(d.x, [[0.5, 0, -1], [0, 2, 0], [0, 0, 0]])
    assert d.classes.tolist() == [-1.0, 1.0]
    assert d.y.tolist() == [1, 0, 1]
    assert d.x.dtype == np.float32 and d.y.dtype == np.int64


def test_pair_shares_width_and_label_map(tmp_path: Path) -> None:
    tr = _write(tmp_path, "tr", "3 1:1\n1 4:1\n2 2:1\n")
    te = _write(tmp_path, "te", "2 6:1\n3 1:1\n")
    a, b = read_libsvm_pair(tr, te)
    assert a.x.shape == (3, 6) and b.x.shape == (2, 6)
    assert b.y.tolist() == [1, 2]  # label 2 -> index 1, label 3 -> index 2, as in train


@pytest.mark.parametrize("text,match", [
    ("1 0:1\n", "1-based"),
    ("1 3:1 2:1\n", "strictly increasing"),
    ("1 2=1\n", "index:value"),
    ("abc 1:1\n", "not a number"),
    ("\n# only a comment\n", "no samples"),
])
def test_bad_files_name_file_and_line(tmp_path: Path, text: str, match: str) -> None:
    p = _write(tmp_path, "bad", text)
    with pytest.raises(DataError, match=match) as e:
        read_libsvm(p)
    assert str(p) in str(e.value)


def test_test_label_unknown_to_train_is_an_error(tmp_path: Path) -> None:
    tr = _write(tmp_path, "tr", "1 1:1\n2 1:1\n")
    te = _write(tmp_path, "te", "5 1:1\n")
    with pytest.raises(DataError, match="not among the classes"):
        read_libsvm_pair(tr, te)


def test_missing_file_says_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="data_dir"):
        read_libsvm(tmp_path / "nope")


def test_real_splice_files() -> None:
    tr_p = SHARED_DATA / "tabular" / "splice"
    te_p = SHARED_DATA / "tabular" / "splice.t.derived"
    if not tr_p.exists() or not te_p.exists():
        pytest.skip(f"real splice files not found under {SHARED_DATA / 'tabular'} "
                    "(../shared/data is only present on the project machines)")
    tr, te = read_libsvm_pair(tr_p, te_p)
    assert tr.x.shape == (1000, 60) and te.x.shape == (2079, 60)
    assert np.bincount(tr.y).tolist() == [483, 517]  # -1: 483, +1: 517 (MANIFEST)
    levels = np.array([-1.0, -1 / 3, 1 / 3, 1.0])
    assert np.abs(tr.x[..., None] - levels).min(-1).max() < 1e-5  # the 4 nucleotide codes
