"""MedMNIST loading: real shared files, generated files, bad input, and the download path.

Downloads are exercised against an HTTP server on 127.0.0.1 serving generated files, so
the code path is the real one (urllib, temp file, md5, atomic rename) without internet.
"""

from __future__ import annotations

import dataclasses
import functools
import http.server
import re
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from scarcelab.data import DATASETS, RawDataset, load_raw
from scarcelab.data.download import data_root, download, md5sum
from scarcelab.data.sources import medmnist as mm
from scarcelab.errors import DataError

ALL_2D = (
    "pathmnist", "chestmnist", "dermamnist", "octmnist", "pneumoniamnist", "retinamnist",
    "breastmnist", "bloodmnist", "tissuemnist", "organamnist", "organcmnist", "organsmnist",
)  # fmt: skip


def write_fake(
    path: Path,
    *,
    channels: int = 1,
    sizes: tuple[int, int, int] = (12, 4, 6),
    num_classes: int = 2,
    label_shape: str = "column",
    multilabel: int = 0,
    seed: int = 0,
    **overrides: np.ndarray,
) -> Path:
    """A small MedMNIST-format npz: official key names, (N,H,W[,3]) uint8 images."""
    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    for split, n in zip(mm.SPLITS, sizes, strict=True):
        shape = (n, 28, 28) if channels == 1 else (n, 28, 28, channels)
        arrays[f"{split}_images"] = rng.integers(0, 256, shape, dtype=np.uint8)
        if multilabel:
            labels = rng.integers(0, 2, (n, multilabel), dtype=np.uint8)
        else:
            labels = (np.arange(n) % num_classes).astype(np.uint8)
            labels = labels[:, None] if label_shape == "column" else labels
        arrays[f"{split}_labels"] = labels
    arrays.update(overrides)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays)
    return path


def load_exact(name: str, root: Path) -> RawDataset:
    """Load a generated file with its own md5 as the expected one (so no warning)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return mm.load_medmnist(name, root, md5=md5sum(root / f"{name}.npz"), progress=False)


# ----------------------------------------------------------------------------- the table


def test_all_2d_datasets_registered_from_one_table() -> None:
    assert set(ALL_2D) == set(mm.MEDMNIST_INFO)
    assert set(ALL_2D) <= set(DATASETS.names())


def test_info_table_is_consistent() -> None:
    md5s = [info.md5 for info in mm.MEDMNIST_INFO.values()]
    assert all(re.fullmatch(r"[0-9a-f]{32}", m) for m in md5s)
    assert len(set(md5s)) == len(md5s)
    for name, info in mm.MEDMNIST_INFO.items():
        assert info.n_channels in (1, 3), name
        assert len(info.n_samples) == 3 and min(info.n_samples) > 0, name
        assert len(set(info.class_names)) == info.num_classes, name
    chest = mm.MEDMNIST_INFO["chestmnist"]
    assert chest.task == "multi-label" and chest.num_classes == 14
    assert mm.MEDMNIST_INFO["pathmnist"].md5 == "a8b06965200029087d5bd730944a56c1"
    assert mm.MEDMNIST_INFO["breastmnist"].n_samples == (546, 78, 156)
    assert {mm.MEDMNIST_INFO[n].n_channels for n in ("pathmnist", "dermamnist")} == {3}


def test_default_url_is_the_official_zenodo_record(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(mm.ENV_URL, raising=False)
    assert mm.medmnist_url("octmnist") == (
        "https://zenodo.org/records/10519652/files/octmnist.npz?download=1"
    )
    monkeypatch.setenv(mm.ENV_URL, "http://mirror.local/{name}.npz")
    assert mm.medmnist_url("octmnist") == "http://mirror.local/octmnist.npz"


# ----------------------------------------------------------------------------- real files


def test_breastmnist_real_file_flat_labels_and_md5_warning(medmnist_dir: Path) -> None:
    """Real shared copy (``medmnist_dir`` from conftest skips when ../shared is absent)."""
    path = medmnist_dir / "breastmnist.npz"
    with pytest.warns(UserWarning) as record:
        ds = load_raw("breastmnist", medmnist_dir)
    message = " ".join(str(w.message) for w in record)
    assert str(path) in message
    assert mm.MEDMNIST_INFO["breastmnist"].md5 in message and md5sum(path) in message
    assert ds.train_x.shape == (546, 1, 28, 28) and ds.train_x.dtype == np.uint8
    assert ds.train_y.shape == (546,) and ds.train_y.dtype == np.int64
    assert ds.val_x is not None and ds.val_x.shape == (78, 1, 28, 28)
    assert ds.test_y.shape == (156,)
    assert np.bincount(ds.train_y).tolist() == [147, 399]  # see shared MANIFEST.md
    assert ds.class_names == ["malignant", "normal, benign"] and ds.num_classes == 2
    assert ds.md5 == md5sum(path) and str(path) in ds.source


def test_pneumoniamnist_real_file_found_via_data_root_subfolder(
    medmnist_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not (medmnist_dir / "pneumoniamnist.npz").is_file():
        pytest.skip(f"{medmnist_dir / 'pneumoniamnist.npz'} not found")
    # SCARCELAB_DATA pointing at the shared root finds medmnist/<name>.npz
    monkeypatch.setenv("SCARCELAB_DATA", str(medmnist_dir.parent))
    with pytest.warns(UserWarning, match="differs from the official"):
        ds = load_raw("pneumoniamnist")
    assert ds.train_x.shape == (4708, 1, 28, 28)
    assert ds.train_y.shape == (4708,)  # stored (N, 1)
    assert np.bincount(ds.train_y).tolist() == [1214, 3494]
    assert ds.val_y is not None and len(ds.val_y) == 524 and len(ds.test_y) == 624


# ----------------------------------------------------------------------------- conversion


def test_grayscale_column_labels(tmp_path: Path) -> None:
    path = write_fake(tmp_path / "breastmnist.npz", label_shape="column")
    ds = load_exact("breastmnist", tmp_path)
    raw = np.load(path)
    assert ds.train_x.shape == (12, 1, 28, 28)
    assert np.array_equal(ds.train_x[:, 0], raw["train_images"])
    assert np.array_equal(ds.train_y, raw["train_labels"][:, 0].astype(np.int64))
    assert ds.train_y.dtype == np.int64 and ds.task == "multi-class"


def test_rgb_is_transposed_to_channels_first(tmp_path: Path) -> None:
    path = write_fake(tmp_path / "bloodmnist.npz", channels=3, num_classes=8, label_shape="flat")
    ds = load_exact("bloodmnist", tmp_path)
    raw = np.load(path)["test_images"]
    assert ds.test_x.shape == (6, 3, 28, 28) and ds.test_x.flags.c_contiguous
    assert np.array_equal(ds.test_x[2, 1, 5, 7], raw[2, 5, 7, 1])
    assert ds.num_classes == 8 and len(ds.class_names) == 8


def test_chestmnist_keeps_multilabel_matrix(tmp_path: Path) -> None:
    write_fake(tmp_path / "chestmnist.npz", multilabel=14)
    ds = load_exact("chestmnist", tmp_path)
    assert ds.train_y.shape == (12, 14) and ds.train_y.dtype == np.int64
    assert ds.task == "multi-label" and ds.num_classes == 14


def test_md5_matching_file_loads_without_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_fake(tmp_path / "retinamnist.npz", channels=3, num_classes=5)
    info = dataclasses.replace(mm.MEDMNIST_INFO["retinamnist"], md5=md5sum(path))
    monkeypatch.setitem(mm.MEDMNIST_INFO, "retinamnist", info)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = load_raw("retinamnist", tmp_path)
    assert ds.md5 == info.md5


# ----------------------------------------------------------------------------- bad input


def test_corrupt_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "breastmnist.npz"
    path.write_bytes(b"PK\x03\x04 this is not a zip archive")
    with pytest.raises(DataError, match=re.escape(str(path))):
        load_exact("breastmnist", tmp_path)


def test_truncated_archive_names_the_file(tmp_path: Path) -> None:
    path = write_fake(tmp_path / "breastmnist.npz")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=re.escape(str(path))):
        load_exact("breastmnist", tmp_path)


def test_missing_keys_are_named(tmp_path: Path) -> None:
    path = tmp_path / "breastmnist.npz"
    np.savez(path, train_images=np.zeros((2, 28, 28), np.uint8))
    with pytest.raises(DataError, match=r"test_labels") as exc:
        load_exact("breastmnist", tmp_path)
    assert str(path) in str(exc.value)


def test_wrong_image_shape(tmp_path: Path) -> None:
    bad = np.zeros((4, 32, 32), np.uint8)
    path = write_fake(tmp_path / "breastmnist.npz", val_images=bad)
    with pytest.raises(DataError, match=r"val_images.*32") as exc:
        load_exact("breastmnist", tmp_path)
    assert str(path) in str(exc.value)


def test_rgb_file_for_grayscale_dataset_is_rejected(tmp_path: Path) -> None:
    write_fake(tmp_path / "breastmnist.npz", channels=3)
    with pytest.raises(DataError, match="train_images has shape"):
        load_exact("breastmnist", tmp_path)


def test_label_count_mismatch(tmp_path: Path) -> None:
    write_fake(tmp_path / "breastmnist.npz", test_labels=np.zeros((5, 1), np.uint8))
    with pytest.raises(DataError, match=r"test_labels has shape \(5, 1\)"):
        load_exact("breastmnist", tmp_path)


def test_labels_out_of_range_name_file_split_and_values(tmp_path: Path) -> None:
    labels = np.array([0, 1, 7, 1, -3, 7], np.int64)
    path = write_fake(tmp_path / "breastmnist.npz", test_labels=labels)
    with pytest.raises(DataError) as exc:
        load_exact("breastmnist", tmp_path)
    message = str(exc.value)
    assert str(path) in message and "test_labels" in message
    assert "-3, 7" in message and "[0, 2)" in message


def test_multilabel_values_must_be_binary(tmp_path: Path) -> None:
    labels = np.zeros((6, 14), np.uint8)
    labels[0, 3] = 2
    write_fake(tmp_path / "chestmnist.npz", multilabel=14, test_labels=labels)
    with pytest.raises(DataError, match=r"test_labels.*\{0, 1\}.*: 2"):
        load_exact("chestmnist", tmp_path)


def test_unknown_name_lists_valid_ones() -> None:
    with pytest.raises(DataError, match="pathmnist"):
        mm.load_medmnist("nosuchmnist")


# ----------------------------------------------------------------------------- data root


def test_data_root_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SCARCELAB_DATA", raising=False)
    assert data_root() == Path.home() / ".cache" / "scarcelab"
    monkeypatch.setenv("SCARCELAB_DATA", str(tmp_path / "env"))
    assert data_root() == tmp_path / "env"
    assert data_root(tmp_path / "arg") == tmp_path / "arg"
    assert data_root(str(tmp_path / "arg")) == tmp_path / "arg"


def test_md5sum_matches_hashlib(tmp_path: Path) -> None:
    import hashlib

    path = tmp_path / "blob"
    path.write_bytes(bytes(range(256)) * 5000)
    assert md5sum(path, chunk_size=1000) == hashlib.md5(path.read_bytes()).hexdigest()


# ----------------------------------------------------------------------------- downloads


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serves a folder; ``/truncated.npz`` promises more bytes than it sends."""

    def do_GET(self) -> None:
        if self.path.startswith("/truncated"):
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            self.wfile.write(b"x" * 100)
            return
        super().do_GET()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(base URL, served folder) of an HTTP server on 127.0.0.1 in a thread."""
    served = tmp_path / "served"
    served.mkdir()
    handler = functools.partial(_Handler, directory=str(served))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", served
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def _no_partial_files(folder: Path) -> bool:
    return not any(p.name.endswith(".part") for p in folder.iterdir()) if folder.exists() else True


def test_download_through_registry_with_url_override(
    server: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, served = server
    source = write_fake(served / "breastmnist.npz", label_shape="flat")
    info = dataclasses.replace(mm.MEDMNIST_INFO["breastmnist"], md5=md5sum(source))
    monkeypatch.setitem(mm.MEDMNIST_INFO, "breastmnist", info)
    monkeypatch.setenv(mm.ENV_URL, base + "/{name}.npz")
    root = tmp_path / "root"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = load_raw("breastmnist", root)
    dest = root / "breastmnist.npz"
    assert dest.read_bytes() == source.read_bytes()
    assert ds.train_x.shape == (12, 1, 28, 28) and ds.md5 == info.md5
    assert _no_partial_files(root)
    # second load uses the local copy: the server is no longer needed
    source.unlink()
    assert np.array_equal(load_raw("breastmnist", root).test_y, ds.test_y)


def test_download_checksum_mismatch_deletes_and_reports(
    server: tuple[str, Path], tmp_path: Path
) -> None:
    base, served = server
    source = write_fake(served / "breastmnist.npz")
    url = f"{base}/breastmnist.npz"
    wrong = "0" * 32
    root = tmp_path / "root"
    with pytest.raises(DataError) as exc:
        mm.load_medmnist("breastmnist", root, url=url, md5=wrong, progress=False)
    message = str(exc.value)
    assert url in message and wrong in message and md5sum(source) in message
    assert not (root / "breastmnist.npz").exists()
    assert _no_partial_files(root)


def test_download_404_explains_manual_placement(server: tuple[str, Path], tmp_path: Path) -> None:
    base, _ = server
    url = f"{base}/missing.npz"
    root = tmp_path / "root"
    with pytest.raises(DataError) as exc:
        mm.load_medmnist("octmnist", root, url=url, progress=False)
    message = str(exc.value)
    assert url in message and "404" in message
    assert str(root / "octmnist.npz") in message and "SCARCELAB_DATA" in message
    assert "zenodo.org/records/10519652" in message
    assert not (root / "octmnist.npz").exists() and _no_partial_files(root)


def test_download_connection_refused(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/x.npz"
    with pytest.raises(DataError, match=re.escape(url)):
        download(url, tmp_path / "x.npz", progress=False, timeout=5)
    assert _no_partial_files(tmp_path)


def test_download_truncated_transfer(server: tuple[str, Path], tmp_path: Path) -> None:
    base, _ = server
    with pytest.raises(DataError, match="truncated"):
        download(f"{base}/truncated.npz", tmp_path / "t.npz", progress=False, timeout=5)
    assert not (tmp_path / "t.npz").exists() and _no_partial_files(tmp_path)


def test_download_without_md5_and_no_progress_output_off_tty(
    server: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, served = server
    (served / "blob.bin").write_bytes(b"abc" * 1000)
    dest = download(f"{base}/blob.bin", tmp_path / "sub" / "blob.bin", progress=True)
    assert dest.read_bytes() == b"abc" * 1000
    assert capsys.readouterr().err == ""  # stderr is not a terminal under pytest
