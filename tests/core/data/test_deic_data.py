"""DEIC benchmark data: split files and image archives downloaded from a local HTTP server
(loopback, real sockets) and verified, fixture images in every format the benchmark uses
(RGB JPEG, grayscale, 13-band TIFF), and the ciFAIR-10 split of the shared CIFAR-10 JPEGs."""

from __future__ import annotations

import hashlib
import http.server
import io
import threading
import zipfile
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED_DATA

from scarcelab.data import DATASETS
from scarcelab.data.sources._deic import SPLIT_MD5, Archive, DEICSource, load_deic
from scarcelab.data.sources.deic_cifair10 import first_per_class
from scarcelab.errors import DataError


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None  # type: ignore[attr-defined]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    th = threading.Thread(target=httpd.serve_forever, daemon=True)
    th.start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    th.join()


def _md5(b: bytes) -> str:
    return hashlib.md5(b, usedforsecurity=False).hexdigest()


def _publish(root: Path, folder: str, splits: dict[str, list[tuple[str, int]]],
             files: dict[str, bytes]) -> dict[tuple[str, str], str]:
    d = root / "datasets" / folder
    d.mkdir(parents=True)
    md5 = {}
    for s, items in splits.items():
        text = "".join(f"{n} {y}\n" for n, y in items).encode()
        (d / f"{s}.txt").write_bytes(text)
        md5[(folder, s)] = _md5(text)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    (root / "imgs.zip").write_bytes(buf.getvalue())
    return md5


def _png(arr: np.ndarray, mode: str) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(arr, mode=mode).save(out, format="PNG")
    return out.getvalue()


def _rgb_fixture(root: Path):
    rng = np.random.default_rng(0)
    splits = {"train": [("a/a_0", 0), ("b/b_0", 1)], "val": [("a/a_1", 0), ("b/b_1", 1)],
              "test": [("a/a_2", 0), ("b/b_2", 1), ("b/b_3", 1)]}
    imgs = {}
    for items in splits.values():
        for n, _y in items:
            # 12 x 16 images, nested under a top folder the split files do not name
            imgs[f"Top/{n}.png"] = _png(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8),
                                        "RGB")
    return splits, imgs


def _source(base: str, md5: dict, **kw) -> DEICSource:
    args = dict(name="fixture", folder="fix", num_classes=2, channels=3, size=8,
                archives=(Archive(f"{base}/imgs.zip", "imgs.zip"),),
                split_base_url=f"{base}/datasets", split_md5=md5)
    args.update(kw)
    return DEICSource(**args)


def test_download_verify_and_load_rgb(server, tmp_path):
    root, base = server
    splits, imgs = _rgb_fixture(root)
    md5 = _publish(root, "fix", splits, imgs)
    data = tmp_path / "data"
    raw = load_deic(_source(base, md5), data)
    assert raw.train_x.shape == (2, 3, 8, 8) and raw.train_x.dtype == np.uint8
    assert raw.test_y.tolist() == [0, 1, 1] and raw.val_y.tolist() == [0, 1]
    assert (data / "deic" / "fixture" / "splits" / "train.txt").exists()
    # short side resized to 8 (12 x 16 -> 8 x 11) and centre-cropped: compare with PIL
    from PIL import Image

    im = Image.open(io.BytesIO(imgs["Top/a/a_0.png"])).resize((11, 8), Image.Resampling.BILINEAR)
    ref = np.asarray(im)[:, 1:9].transpose(2, 0, 1)
    np.testing.assert_array_equal(raw.train_x[0], ref)
    # the decoded splits are cached: the server is no longer needed
    for p in root.rglob("*"):
        if p.is_file():
            p.unlink()
    again = load_deic(_source(base, md5), data)
    np.testing.assert_array_equal(again.test_x, raw.test_x)


def test_split_checksum_mismatch_is_refused_and_leaves_nothing(server, tmp_path):
    root, base = server
    splits, imgs = _rgb_fixture(root)
    md5 = _publish(root, "fix", splits, imgs)
    md5[("fix", "val")] = "0" * 32
    with pytest.raises(DataError, match="checksum mismatch"):
        load_deic(_source(base, md5), tmp_path / "data")
    assert not (tmp_path / "data" / "deic" / "fixture" / "splits" / "val.txt").exists()
    # an edited local copy is refused too
    good = _publish(tmp_path / "other", "fix", splits, imgs)
    src = _source(base, good)
    d = tmp_path / "d2" / "deic" / "fixture" / "splits"
    d.mkdir(parents=True)
    for s in ("train", "val", "test"):
        (d / f"{s}.txt").write_text("a/a_0 0\n")
    with pytest.raises(DataError, match="differs from the published split"):
        load_deic(src, tmp_path / "d2")


def test_incomplete_archive_names_the_missing_images(server, tmp_path):
    root, base = server
    splits, imgs = _rgb_fixture(root)
    del imgs["Top/b/b_3.png"]
    md5 = _publish(root, "fix", splits, imgs)
    with pytest.raises(DataError, match="1 image.*test split.*'b/b_3'"):
        load_deic(_source(base, md5), tmp_path / "data")


def test_grayscale_and_multispectral(server, tmp_path):
    tifffile = pytest.importorskip("tifffile")
    root, base = server
    splits = {"train": [("x_0", 0), ("y_0", 1)], "val": [("x_1", 0), ("y_1", 1)],
              "test": [("x_2", 0), ("y_2", 1)]}
    files = {}
    for items in splits.values():
        for n, y in items:
            bands = np.full((8, 8, 13), 1600 * (y + 1), dtype=np.uint16)  # HWC, as EuroSAT
            bands[..., 12] = 9000  # beyond 12 bits: clipped to 255
            out = io.BytesIO()
            tifffile.imwrite(out, bands)
            files[f"ms/{n}.tif"] = out.getvalue()
    md5 = _publish(root, "fix", splits, files)
    raw = load_deic(_source(base, md5, channels=13), tmp_path / "ms")
    assert raw.channels == 13 and raw.train_x.shape == (2, 13, 8, 8)
    assert raw.train_x[0, 0, 0, 0] == 100 and raw.train_x[1, 0, 0, 0] == 200  # 1600/16
    assert raw.train_x[0, 12, 0, 0] == 255
    root2 = tmp_path / "www"  # reuse the server root for a grayscale set
    for p in list(root2.rglob("*")):
        if p.is_file():
            p.unlink()
    gray = {f"g/{n}.png": _png(np.full((10, 8), 40 * (y + 1), np.uint8), "L")
            for items in splits.values() for n, y in items}
    (root2 / "datasets" / "gfix").mkdir(parents=True)
    md5 = _publish_into(root2, "gfix", splits, gray)
    raw = load_deic(_source(base, md5, folder="gfix", name="gfixture", channels=1),
                    tmp_path / "gray")
    assert raw.channels == 1 and raw.test_x.shape == (2, 1, 8, 8)
    assert raw.test_x[1].min() == raw.test_x[1].max() == 80


def _publish_into(root: Path, folder: str, splits, files):
    d = root / "datasets" / folder
    md5 = {}
    for s, items in splits.items():
        text = "".join(f"{n} {y}\n" for n, y in items).encode()
        (d / f"{s}.txt").write_bytes(text)
        md5[(folder, s)] = _md5(text)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    (root / "imgs.zip").write_bytes(buf.getvalue())
    return md5


def test_benchmark_datasets_registered_with_pinned_splits():
    for name in ("cifair10", "cub", "eurosat", "isic2018", "clamm", "imagenet50"):
        assert name in DATASETS
    for folder in ("cub", "eurosat", "isic2018", "clamm", "imagenet"):
        for s in ("train", "val", "test"):
            assert len(SPLIT_MD5[(folder, s)]) == 32
    from scarcelab.data.sources import deic_clamm, deic_eurosat

    assert deic_eurosat.SOURCE.channels == 13 and deic_clamm.SOURCE.channels == 1


def test_first_per_class_hand_case():
    y = np.array([1, 0, 1, 0, 1, 0, 1])
    np.testing.assert_array_equal(first_per_class(y, 0, 2), [1, 3, 0, 2])
    np.testing.assert_array_equal(first_per_class(y, 2, 1), [5, 4])
    with pytest.raises(ValueError):
        first_per_class(y, 3, 1)


def test_cifair10_split_from_shared_cifar10():
    zips = SHARED_DATA / "cifar10_jpg" / "cifar10_train_500perclass_jpg.zip"
    if not zips.exists():
        pytest.skip(f"{zips} not present (only on the project machines)")
    from scarcelab.data import load_raw

    raw = load_raw("cifair10")
    assert raw.notes["test_set"] == "CIFAR-10"  # not ciFAIR-10's test set: said so
    assert np.bincount(raw.train_y).tolist() == [30] * 10
    assert np.bincount(raw.val_y).tolist() == [20] * 10
    assert len(raw.test_y) == 10_000 and raw.channels == 3
    from scarcelab.data.sources.cifar10_5k import _read_zip

    x, y = _read_zip(zips)
    first = np.flatnonzero(y == 0)
    np.testing.assert_array_equal(raw.train_x[0], x[first[0]])  # "first 30" of class 0
    np.testing.assert_array_equal(raw.val_x[0], x[first[30]])  # then the next 20
