"""Pathology classification sets: pathology_crops (real, shared data) and the tile-set
loaders (BACH, CRC, PCam, MHIST) on fixture files in their published layouts; downloads
through a real HTTP server on loopback (checksum verified, mismatch refused)."""

from __future__ import annotations

import csv
import functools
import gzip
import hashlib
import http.server
import io
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from scarcelab.errors import DataError
from tests.conftest import SHARED_DATA

CROPS = SHARED_DATA / "pathology_crops" / "consep_nucleus_crops32.npz"


def _solid(path: Path, rgb: tuple[int, int, int], size: tuple[int, int] = (12, 12)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, rgb).save(path)


def _colour(c: int) -> tuple[int, int, int]:
    return (10 + 20 * c, 200 - 15 * c, 7 * c)


# -- pathology_crops ----------------------------------------------------------------------
@pytest.fixture
def crops() -> Path:
    if not CROPS.exists():
        pytest.skip(f"{CROPS} not found (../shared/data is only on the project machines)")
    return CROPS


def test_pathology_crops_registered_with_consep_split(crops):
    from scarcelab.data import DATASETS, load_raw

    assert "pathology_crops" in DATASETS
    raw = load_raw("pathology_crops", SHARED_DATA)
    with np.load(crops) as d:
        y_train, y_test = d["y_train"], d["y_test"]
        x0 = d["x_train"][0]
    assert raw.train_x.shape == (1467, 3, 32, 32) and raw.test_x.shape == (1600, 3, 32, 32)
    np.testing.assert_array_equal(raw.train_y, y_train.reshape(-1) - 1)  # 1..4 -> 0..3
    np.testing.assert_array_equal(raw.test_y, y_test.reshape(-1) - 1)
    np.testing.assert_array_equal(raw.train_x[0], x0.transpose(2, 0, 1))  # HWC -> CHW
    assert np.bincount(raw.train_y).tolist() == [267, 400, 400, 400]  # MANIFEST.md
    assert raw.class_names == ["other", "inflammatory", "epithelial", "spindle-shaped"]


def test_pathology_crops_probe_split_is_seeded_and_from_train(crops):
    from scarcelab.data import load_raw
    from scarcelab.protocols.transfer import ProbeConfig, probe_split

    raw = load_raw("pathology_crops", SHARED_DATA)
    a = probe_split(ProbeConfig(seed=3), raw)
    b = probe_split(ProbeConfig(seed=3), raw)
    c = probe_split(ProbeConfig(seed=4), raw)
    assert a["hash"] == b["hash"] != c["hash"]
    assert a["n_val"] == round(0.2 * 1467)
    assert len(a["labeled"]) + len(a["val"]) == 1467 and not set(a["labeled"]) & set(a["val"])
    # natural class frequencies in validation (largest remainder)
    counts = np.bincount(raw.train_y[a["val"]], minlength=4)
    assert np.abs(counts - np.bincount(raw.train_y) * 0.2).max() <= 1


def test_pathology_crops_bad_labels_named(tmp_path):
    from scarcelab.data.sources.pathology_crops import read_crops

    p = tmp_path / "bad.npz"
    x = np.zeros((2, 32, 32, 3), np.uint8)
    np.savez(p, x_train=x, y_train=np.array([1, 5]), x_test=x, y_test=np.array([1, 2]))
    with pytest.raises(DataError, match=r"bad\.npz.*y_train.*\[5\].*1\.\.4"):
        read_crops(p)


# -- tile-folder loaders on fixtures --------------------------------------------------------
def _crc_tree(root: Path, per_class: int = 2) -> None:
    from scarcelab.data.sources.crc import CLASSES

    for folder, n in (("NCT-CRC-HE-100K", per_class), ("CRC-VAL-HE-7K", 1)):
        for c, name in enumerate(CLASSES):
            for i in range(n):
                _solid(root / folder / name / f"{name}-{i}.tif", _colour(c))


def test_crc_class_folders(tmp_path):
    from scarcelab.data.sources.crc import load_crc

    _crc_tree(tmp_path / "crc")
    raw = load_crc(tmp_path, size=8, download=False)
    assert raw.train_x.shape == (18, 3, 8, 8) and raw.test_x.shape == (9, 3, 8, 8)
    assert raw.train_y.tolist() == sorted(list(range(9)) * 2)
    for i, y in enumerate(raw.train_y):  # a solid tile keeps its colour through the resize
        assert raw.train_x[i, :, 3, 3].tolist() == list(_colour(int(y)))
    assert raw.num_classes == 9 and raw.class_names[0] == "adipose"


def test_crc_missing_class_folder_named(tmp_path):
    from scarcelab.data.sources.crc import load_crc

    _crc_tree(tmp_path / "crc")
    for f in (tmp_path / "crc" / "CRC-VAL-HE-7K" / "TUM").iterdir():
        f.unlink()
    (tmp_path / "crc" / "CRC-VAL-HE-7K" / "TUM").rmdir()
    with pytest.raises(DataError, match=r"CRC-VAL-HE-7K.*\['TUM'\] missing"):
        load_crc(tmp_path, size=8, download=False)


def test_bach_centre_crop_and_fixed_holdout(tmp_path):
    from scarcelab.data.sources.bach import CLASSES, PHOTOS, load_bach

    for c, name in enumerate(CLASSES):
        for i in range(5):
            p = tmp_path / "bach" / PHOTOS / name / f"{name[0].lower()}{i:03d}.tif"
            p.parent.mkdir(parents=True, exist_ok=True)
            im = Image.new("RGB", (16, 12), (255, 255, 255))  # 4:3 like BACH's 2048x1536
            im.paste(_colour(c), (2, 0, 14, 12))  # the centred 12x12 square is solid
            im.save(p)
    a = load_bach(tmp_path, size=6, download=False)
    b = load_bach(tmp_path, size=6, download=False)
    assert a.train_x.shape == (16, 3, 6, 6) and a.test_x.shape == (4, 3, 6, 6)
    assert sorted(a.test_y.tolist()) == [0, 1, 2, 3]  # 20 % of each class
    np.testing.assert_array_equal(a.test_x, b.test_x)  # the hold-out is fixed
    for x, y in zip(a.train_x, a.train_y, strict=True):  # white borders were cropped away
        assert (x.reshape(3, -1).T == np.array(_colour(int(y)))).all()


def _pcam_files(root: Path, n: dict[str, int]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    import h5py

    rng = np.random.default_rng(0)
    out = {}
    root.mkdir(parents=True, exist_ok=True)
    for split, k in n.items():
        x = rng.integers(0, 256, (k, 96, 96, 3), dtype=np.uint8)
        y = rng.integers(0, 2, (k, 1, 1, 1), dtype=np.uint8)
        with h5py.File(root / f"camelyonpatch_level_2_split_{split}_x.h5", "w") as f:
            f.create_dataset("x", data=x)
        with h5py.File(root / f"camelyonpatch_level_2_split_{split}_y.h5", "w") as f:
            f.create_dataset("y", data=y)
        out[split] = (x, y)
    return out


def test_pcam_hdf5_files(tmp_path):
    from scarcelab.data.sources.pcam import load_pcam

    arrays = _pcam_files(tmp_path / "pcam", {"train": 12, "valid": 4, "test": 5})
    raw = load_pcam(tmp_path, download=False)
    np.testing.assert_array_equal(raw.train_x, arrays["train"][0].transpose(0, 3, 1, 2))
    np.testing.assert_array_equal(raw.test_y, arrays["test"][1].reshape(-1))
    assert raw.val_x.shape == (4, 3, 96, 96)
    sub = load_pcam(tmp_path, download=False, max_train=5, seed=1)
    assert len(sub.train_y) == 5
    rows = [np.flatnonzero((raw.train_x == s).all(axis=(1, 2, 3)))[0] for s in sub.train_x]
    np.testing.assert_array_equal(sub.train_y, raw.train_y[rows])  # images keep their labels


def _mhist_tree(root: Path, rows: list[tuple[str, str, str]]) -> None:
    for name, label, _ in rows:
        _solid(root / "images" / name, (255, 0, 0) if label == "SSA" else (0, 0, 255), (10, 10))
    with open(root / "annotations.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Image Name", "Majority Vote Label",
                    "Number of Annotators who Selected SSA (Out of 7)", "Partition"])
        for name, label, part in rows:
            w.writerow([name, label, 5 if label == "SSA" else 1, part])


def test_mhist_follows_partition_column(tmp_path):
    from scarcelab.data.sources.mhist import load_mhist

    rows = [("MHIST_aaa.png", "SSA", "train"), ("MHIST_aab.png", "HP", "test"),
            ("MHIST_aac.png", "HP", "train"), ("MHIST_aad.png", "SSA", "test"),
            ("MHIST_aae.png", "HP", "train")]
    _mhist_tree(tmp_path / "mhist", rows)
    raw = load_mhist(tmp_path, size=4, download=False)
    assert raw.train_y.tolist() == [1, 0, 0] and raw.test_y.tolist() == [0, 1]
    assert raw.train_x[0, :, 0, 0].tolist() == [255, 0, 0]  # SSA fixture is red


def test_mhist_missing_files_point_to_the_form(tmp_path, monkeypatch):
    from scarcelab.data.sources.mhist import load_mhist

    monkeypatch.delenv("SCARCELAB_MHIST_URL", raising=False)
    with pytest.raises(DataError, match="data-use form"):
        load_mhist(tmp_path)
    _mhist_tree(tmp_path / "mhist", [("a.png", "XX", "train")])
    with pytest.raises(DataError, match="line 2: label 'XX'"):
        load_mhist(tmp_path, download=False)


# -- downloads against a local HTTP server --------------------------------------------------
@pytest.fixture
def http_dir(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *a, **k: None  # type: ignore[method-assign]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield served, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _zip_of(tree: Path, dest: Path) -> str:
    with zipfile.ZipFile(dest, "w") as z:
        for p in sorted(tree.rglob("*")):
            if p.is_file():
                z.write(p, p.relative_to(tree).as_posix())
    return hashlib.md5(dest.read_bytes()).hexdigest()


def test_crc_download_verified_and_unpacked(tmp_path, http_dir, monkeypatch):
    from scarcelab.data.sources.crc import load_crc

    served, base = http_dir
    _crc_tree(tmp_path / "src")
    md5 = {}
    for name in ("NCT-CRC-HE-100K", "CRC-VAL-HE-7K"):
        sub = tmp_path / "one" / name
        sub.parent.mkdir(exist_ok=True)
        (tmp_path / "src" / name).rename(sub)
        md5[f"{name}.zip"] = _zip_of(tmp_path / "one", served / f"{name}.zip")
        sub.rename(tmp_path / "src" / name)
    monkeypatch.setenv("SCARCELAB_CRC_URL", base + "/{filename}")
    raw = load_crc(tmp_path / "root", size=8, md5=md5)
    assert len(raw.train_y) == 18 and len(raw.test_y) == 9
    assert not list((tmp_path / "root" / "crc").glob("*.zip"))  # archives removed


def test_download_with_wrong_checksum_refused(tmp_path, http_dir, monkeypatch):
    from scarcelab.data.sources.crc import load_crc

    served, base = http_dir
    _crc_tree(tmp_path / "src")
    for name in ("NCT-CRC-HE-100K", "CRC-VAL-HE-7K"):
        _zip_of(tmp_path / "src", served / f"{name}.zip")
    monkeypatch.setenv("SCARCELAB_CRC_URL", base + "/{filename}")
    # the fixture is not the published archive: the official md5 must refuse it
    with pytest.raises(DataError, match="checksum mismatch.*035777cf327776a71a05c95da6d6325f"):
        load_crc(tmp_path / "root", size=8)
    left = list((tmp_path / "root" / "crc").iterdir())
    assert left == []  # nothing half-downloaded or unpacked stays behind


def test_pcam_gz_download(tmp_path, http_dir, monkeypatch):
    from scarcelab.data.sources.pcam import load_pcam

    served, base = http_dir
    arrays = _pcam_files(tmp_path / "plain", {"train": 6, "valid": 2, "test": 3})
    md5 = {}
    for p in (tmp_path / "plain").iterdir():
        gz = served / (p.name + ".gz")
        gz.write_bytes(gzip.compress(p.read_bytes()))
        md5[gz.name] = hashlib.md5(gz.read_bytes()).hexdigest()
    monkeypatch.setenv("SCARCELAB_PCAM_URL", base + "/{filename}")
    raw = load_pcam(tmp_path / "root", md5=md5)
    np.testing.assert_array_equal(raw.test_y, arrays["test"][1].reshape(-1))
    with pytest.raises(DataError, match="checksum mismatch.*d5b63470df7cfa627aeec8b9dc0c066e"):
        load_pcam(tmp_path / "root2", md5={k: v for k, v in md5.items() if "valid_x" not in k})


def test_zip_member_escaping_the_root_refused(tmp_path, http_dir, monkeypatch):
    from scarcelab.data.sources.bach import load_bach

    served, base = http_dir
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("../evil.txt", "x")
    (served / "ICIAR2018_BACH_Challenge.zip").write_bytes(buf.getvalue())
    monkeypatch.setenv("SCARCELAB_BACH_URL", base + "/{filename}")
    with pytest.raises(DataError, match="outside"):
        load_bach(tmp_path / "root", md5=hashlib.md5(buf.getvalue()).hexdigest())
    assert not (tmp_path / "root" / "evil.txt").exists()
