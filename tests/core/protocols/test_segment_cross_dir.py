"""Issue 42 item 7: ``segment --cross-test`` reads its sets from the ``--data-dir`` given.

Before, the cross-test set was looked up with no folder at all (``$SCARCELAB_DATA``, then
``../shared/data``), whatever ``--data-dir`` said, and nothing said where it came from: the
cross-test numbers could come from other files than the ones the user pointed at.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image
from test_segment import _patches_folder

from scarcelab.data import provenance
from scarcelab.data.nuclei.cpm15 import ALL_TILES
from scarcelab.errors import DataError
from scarcelab.protocols import segment as seg
from scarcelab.tracker import InMemoryTracker


def _cpm15(root: Path, shade: int) -> Path:
    """A nuclei_cpm15-shaped folder: 15 tiles of 32 x 32 with one square nucleus each."""
    root.mkdir(parents=True)
    masks = {}
    for i, name in enumerate(ALL_TILES):
        img = np.full((32, 32, 3), shade, np.uint8)
        inst = np.zeros((32, 32), np.int32)
        inst[4 + i % 5:14 + i % 5, 6:16] = 1
        img[inst > 0] = (80, 40, 120)
        Image.fromarray(img).save(root / f"{name}.png")
        masks[name] = inst
    np.savez_compressed(root / "instance_masks.npz", **masks)
    return root


@pytest.fixture
def folders(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """The user's folder (the training set and the cross-test set beside it) and another
    cross-test copy where ``$SCARCELAB_DATA`` points."""
    data = tmp_path / "data"
    train = _patches_folder(data / "consep_patches")
    mine = _cpm15(data / "nuclei_cpm15", 220)
    other = _cpm15(tmp_path / "env" / "nuclei_cpm15", 60)
    monkeypatch.setenv("SCARCELAB_DATA", str(tmp_path / "env"))
    monkeypatch.setenv("SCARCELAB_SHARED_DATA", str(tmp_path / "env"))
    return train, mine, other


def test_the_cross_test_set_comes_from_the_data_dir_and_the_run_says_so(
        folders, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    from scarcelab.entrypoints.cli import main

    train, mine, other = folders
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.chdir(tmp_path)
    read: list[str] = []
    real = provenance.record

    def record(path, *a, **k):  # type: ignore[no-untyped-def]
        read.append(str(Path(path).resolve()))
        return real(path, *a, **k)

    monkeypatch.setattr(provenance, "record", record)
    r = CliRunner().invoke(main, [
        "segment", "--dataset", "consep_patches", "--data-dir", str(train),
        "--experiment", "seg", "--max-epochs", "1", "--steps-per-epoch", "1",
        "--batch-size", "2", "--crop", "32", "--window", "32", "--scale", "1.0",
        "--max-test-tiles", "2", "--cross-test", "nuclei_cpm15", "--device", "cpu",
        "--arch", "small_cnn"])
    assert r.exit_code == 0, r.output
    assert any(p.startswith(str(mine.resolve())) for p in read), read
    assert not [p for p in read if p.startswith(str(other.resolve()))], \
        "the cross-test set was read from $SCARCELAB_DATA, not from --data-dir"
    line = next(ln for ln in r.output.splitlines() if "nuclei_cpm15 PQ" in ln)
    assert f"(read from {mine})" in line, line


def test_a_cross_test_set_missing_from_the_data_dir_is_refused_naming_it(
        folders, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """Not silently taken from ``$SCARCELAB_DATA``: refused before any run, naming the
    folder it was looked for in."""
    _patches_folder(tmp_path / "alone" / "consep_patches")

    def no_training(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("trained with a cross-test set from another folder")

    monkeypatch.setattr(seg, "_train_and_test", no_training)
    tr = InMemoryTracker()
    with pytest.raises(DataError, match=r"cross-test set nuclei_cpm15: .*--data-dir given \(" +
                       str(tmp_path / "alone" / "consep_patches")):
        seg.run_segment(seg.SegmentConfig(
            dataset="consep_patches", data_dir=str(tmp_path / "alone" / "consep_patches"),
            cross_test=("nuclei_cpm15",), device="cpu", arch="small_cnn"), tr)
    assert tr.study is None


def test_a_folder_holding_the_sets_is_searched_by_name(folders):  # type: ignore[no-untyped-def]
    train, mine, _ = folders
    assert seg.load_cross_test("nuclei_cpm15", str(train.parent)).source == str(mine)
    assert seg.load_cross_test("nuclei_cpm15", str(train)).source == str(mine)  # beside
