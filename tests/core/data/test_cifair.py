"""ciFAIR-10 as the benchmark uses it: the release archive downloaded from a local HTTP
server (loopback, real sockets) and checked by md5, the batches read without running any
pickled code, gem's split (first 30 + next 20 per class in CIFAR order), and, where only
CIFAR-10 JPEGs are on disk, a run and a Table 3 that say the test set is CIFAR-10's."""

from __future__ import annotations

import hashlib
import http.server
import io
import os
import pickle
import threading
import zipfile
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from scarcelab.data.sources.deic_cifair10 import (
    CifairArchive,
    load_cifair10,
    read_batch,
)
from scarcelab.errors import DataError

N_PER_CLASS = 60  # 50 are needed: 30 train + 20 val


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


def _batch(x: np.ndarray, y: np.ndarray) -> bytes:
    """A batch as CIFAR's are: a protocol-2 pickle of a dict with ``data`` (N, 3072)."""
    return pickle.dumps({"batch_label": "fixture", "labels": [int(v) for v in y],
                         "data": x.reshape(len(x), -1), "filenames": [f"{i}.png" for i in
                                                                      range(len(x))]},
                        protocol=2)


def _release(root: Path):
    """A small ciFAIR-10-shaped release: 10 classes × 60 training images spread over five
    batches in a shuffled class order, 20 test images; each image's first pixel encodes its
    global training index so the split can be checked by hand."""
    rng = np.random.default_rng(0)
    y = rng.permutation(np.repeat(np.arange(10), N_PER_CLASS))
    x = rng.integers(0, 256, (len(y), 3, 32, 32), dtype=np.uint8)
    x[:, 0, 0, 0] = np.arange(len(y)) % 256
    x[:, 0, 0, 1] = np.arange(len(y)) // 256
    members, blobs = {}, {}
    for i, part in enumerate(np.array_split(np.arange(len(y)), 5), 1):
        blobs[f"data_batch_{i}"] = _batch(x[part], y[part])
    yte = np.arange(20) % 10
    blobs["test_batch"] = _batch(np.full((20, 3, 32, 32), 7, np.uint8), yte)
    blobs["batches.meta"] = pickle.dumps({"label_names": ["c"] * 10}, protocol=2)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, b in blobs.items():
            z.writestr(f"ciFAIR-10/{name}", b)
            members[name] = _md5(b)
    (root / "ciFAIR-10.zip").write_bytes(buf.getvalue())
    return x, y, members, _md5(buf.getvalue())


def _index(x: np.ndarray) -> np.ndarray:
    return x[:, 0, 0, 0].astype(int) + 256 * x[:, 0, 0, 1].astype(int)


def test_release_downloaded_checked_and_split_as_gem(server, tmp_path):
    root, base = server
    x, y, members, md5 = _release(root)
    arch = CifairArchive(url=f"{base}/ciFAIR-10.zip", md5=md5, members=members)
    raw = load_cifair10(tmp_path / "data", archive=arch)
    # gem: class by class, the first 30 (train) and the next 20 (val) in CIFAR order
    want_tr = np.concatenate([np.flatnonzero(y == c)[:30] for c in range(10)])
    want_va = np.concatenate([np.flatnonzero(y == c)[30:50] for c in range(10)])
    np.testing.assert_array_equal(_index(raw.train_x), want_tr)
    np.testing.assert_array_equal(_index(raw.val_x), want_va)
    np.testing.assert_array_equal(raw.train_y, y[want_tr])
    assert raw.test_x.shape == (20, 3, 32, 32) and (raw.test_x == 7).all()
    assert raw.notes == {"test_set": "ciFAIR-10", "train_order": "CIFAR"}
    # extracted once: the server is no longer needed
    (root / "ciFAIR-10.zip").unlink()
    again = load_cifair10(tmp_path / "data", archive=arch)
    np.testing.assert_array_equal(again.val_x, raw.val_x)


def test_a_wrong_checksum_is_refused(server, tmp_path):
    root, base = server
    _, _, members, md5 = _release(root)
    bad = CifairArchive(url=f"{base}/ciFAIR-10.zip", md5="0" * 32, members=members)
    with pytest.raises(DataError, match="checksum mismatch"):
        load_cifair10(tmp_path / "d1", archive=bad)
    assert not (tmp_path / "d1" / "cifair10" / "ciFAIR-10.zip").exists()
    # a member that differs from the release (here: a test set other than ciFAIR's)
    other = CifairArchive(url=f"{base}/ciFAIR-10.zip", md5=md5,
                          members={**members, "test_batch": "1" * 32})
    with pytest.raises(DataError, match="test_batch: md5"):
        load_cifair10(tmp_path / "d2", archive=other)


def test_a_pickle_that_would_run_code_is_refused_before_it_runs(tmp_path):
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.makedirs, (str(marker),))

    p = tmp_path / "data_batch_1"
    p.write_bytes(pickle.dumps({"data": Evil(), "labels": [0]}, protocol=2))
    with pytest.raises(DataError, match=r"refusing to unpickle (posix|os)\.makedirs"):
        read_batch(p)
    assert not marker.exists()


def _jpg_zips(folder: Path) -> None:
    """CIFAR-10-JPEG-shaped zips (the layout of ../shared/data/cifar10_jpg): 50 training
    images per class, 2 test images per class."""
    from PIL import Image

    from scarcelab.data.sources.cifar10_5k import CLASSES

    (folder / "cifar10_jpg").mkdir(parents=True)
    rng = np.random.default_rng(1)
    for split, n, name in (("train", 50, "cifar10_train_500perclass_jpg.zip"),
                           ("test", 2, "cifar10_test_10000_jpg.zip")):
        with zipfile.ZipFile(folder / "cifar10_jpg" / name, "w") as z:
            for c in CLASSES:
                for i in range(n):
                    b = io.BytesIO()
                    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(
                        b, format="JPEG")
                    z.writestr(f"{split}/{c}/{i:04d}.jpg", b.getvalue())


def test_cifar10_jpegs_stand_in_and_every_record_says_so(tmp_path):
    from scarcelab.protocols.tune import TuneConfig, run_tune
    from scarcelab.tracker import InMemoryTracker
    from scarcelab.tracking.query.table3 import render_table3, table3

    _jpg_zips(tmp_path)
    raw = load_cifair10(tmp_path)
    assert raw.notes["test_set"] == "CIFAR-10" and len(raw.train_y) == 300
    assert np.bincount(raw.val_y).tolist() == [20] * 10
    t = InMemoryTracker()
    res = run_tune(TuneConfig(method="ce", dataset="cifair10", data_dir=str(tmp_path),
                              arch="small_cnn", epochs=1, grace_period=1, n_trials=1,
                              batch_sizes=(10,), max_steps_per_epoch=1, n_final=2), t)
    assert t.study.tags["scarcelab.test_set"] == "CIFAR-10"
    assert t.study.tags["scarcelab.train_order"] == "JPEG file number"
    retrains = [r for r in t.trials if r.tags["scarcelab.role"] == "retrain"]
    assert len(retrains) == 2 and all(r.tags["scarcelab.test_set"] == "CIFAR-10"
                                      for r in retrains)
    import pandas as pd

    scores = pd.DataFrame({"dataset": "cifair10", "method": "ce", "study_id": "s",
                           "test_set": "CIFAR-10", "score": res.final_test})
    md = render_table3(table3(scores))
    assert "cifair10 (CIFAR-10 test set)" in md.splitlines()[0]
