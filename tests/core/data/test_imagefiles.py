"""Issue 39 items 2-3: a user's image files -> uint8 arrays (scarcelab.data.imagefiles).

Every format is written at test time from real pixels (PneumoniaMNIST from ../shared/data,
CoNSeP H&E patches for colour) and read back; the references are exact pixel arrays,
Pillow's own conversions and pydicom's own windowing, or hand-computed values."""

from __future__ import annotations

import io
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED_DATA
from PIL import Image

from scarcelab.data import imagefiles as m
from scarcelab.data.imagefiles import BadImageFile, Transform
from scarcelab.errors import ConfigError, DataError

REPO = Path(__file__).resolve().parents[3]
CONSEP = SHARED_DATA / "consep_patches" / "train" / "images"


# --------------------------------------------------------------------------- real pixels


@pytest.fixture(scope="module")
def gray() -> np.ndarray:
    """Real chest X-rays, 28x28 uint8 (PneumoniaMNIST)."""
    path = SHARED_DATA / "medmnist" / "pneumoniamnist.npz"
    if not path.exists():
        pytest.skip(f"real PneumoniaMNIST not found at {path}")
    with np.load(path, allow_pickle=False) as d:
        return np.array(d["train_images"][:64])


@pytest.fixture(scope="module")
def colour() -> np.ndarray:
    """Real H&E patches, (H, W, 3) uint8 cut to 40x48 (CoNSeP JPEGs)."""
    files = sorted(CONSEP.glob("*.jpg"))[:4]
    if not files:
        pytest.skip(f"real CoNSeP patches not found at {CONSEP}")
    return np.stack([np.asarray(Image.open(f).convert("RGB"))[:40, :48] for f in files])


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def _old(*paths: Path) -> None:
    """Give files an mtime a minute back, as in a real folder (the stat index does not trust
    a file changed within 2 s of its hashing)."""
    t = time.time() - 60
    for p in paths:
        os.utime(p, (t, t))


def _write(folder: Path, arrays: np.ndarray, fmt: str = "PNG", suffix: str = ".png",
           **save: object) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i, a in enumerate(arrays):
        p = folder / f"{i:03d}{suffix}"
        Image.fromarray(a).save(p, fmt, **save)
        out.append(p)
    _old(*out)
    return out


def _one_line(e: pytest.ExceptionInfo[BaseException], path: Path) -> str:
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg, msg
    return msg


# --------------------------------------------------------------------------- formats


@pytest.mark.parametrize("fmt,suffix", [("PNG", ".png"), ("BMP", ".bmp"), ("TIFF", ".tif")])
def test_lossless_formats_round_trip_real_pixels(tmp_path, gray, colour, fmt, suffix) -> None:  # type: ignore[no-untyped-def]
    g = tmp_path / f"g{suffix}"
    Image.fromarray(gray[0]).save(g, fmt)
    assert np.array_equal(m.decode_file(g), gray[0][None])
    c = tmp_path / f"c{suffix}"
    Image.fromarray(colour[0]).save(c, fmt)
    assert np.array_equal(m.decode_file(c), colour[0].transpose(2, 0, 1))


def test_jpeg_is_pillows_decode_of_the_file(tmp_path, gray, colour) -> None:  # type: ignore[no-untyped-def]
    for name, a in (("g.jpg", gray[1]), ("c.jpeg", colour[1])):
        p = tmp_path / name
        Image.fromarray(a).save(p, "JPEG", quality=95)
        ref = np.asarray(Image.open(p))
        got = m.decode_file(p)
        assert np.array_equal(got, ref[None] if ref.ndim == 2 else ref.transpose(2, 0, 1))
        assert np.abs(got.astype(int) - (a[None] if a.ndim == 2 else
                                         a.transpose(2, 0, 1))).mean() < 3  # lossy, close


def _minmax(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.float64)
    return np.rint((v - v.min()) * 255 / (v.max() - v.min())).astype(np.uint8)


@pytest.mark.parametrize("fmt,suffix", [("PNG", ".png"), ("TIFF", ".tif")])
def test_16_bit_gray_is_scaled_over_its_own_min_max(tmp_path, gray, fmt, suffix) -> None:  # type: ignore[no-untyped-def]
    v16 = gray[2].astype(np.uint16) * 16 + 37  # a 12-bit image as medical files hold them
    p = tmp_path / f"x{suffix}"
    Image.fromarray(v16).save(p, fmt)
    assert Image.open(p).mode.startswith("I;16")
    got = m.decode_file(p)[0]
    assert np.array_equal(got, _minmax(v16))
    assert got.max() == 255 and got.min() == 0  # /257 would have left it 0..16
    flat = tmp_path / f"flat{suffix}"
    Image.fromarray(np.full((5, 6), 999, np.uint16)).save(flat, fmt)
    assert not m.decode_file(flat).any()  # a constant image: all 0
    # the same rule for a uint16 array handed to the model
    assert np.array_equal(m.to_model_input(v16, Transform(), 1)[0], got)


def test_alpha_is_composited_on_black_and_palette_converted(tmp_path, colour) -> None:  # type: ignore[no-untyped-def]
    rgba = np.zeros((2, 3, 4), np.uint8)
    rgba[0, 0] = (200, 100, 50, 128)  # half transparent: round(v * 128 / 255)
    rgba[0, 1] = (9, 9, 9, 0)  # transparent: black, whatever colour is under it
    rgba[1, :] = (10, 20, 30, 255)
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    got = m.decode_file(tmp_path / "a.png")
    assert got.shape == (3, 2, 3)
    assert got[:, 0, 0].tolist() == [100, 50, 25] and got[:, 0, 1].tolist() == [0, 0, 0]
    assert got[:, 1, 2].tolist() == [10, 20, 30]
    la = np.stack([np.array([[200, 7]], np.uint8), np.array([[255, 0]], np.uint8)], -1)
    Image.fromarray(la, "LA").save(tmp_path / "la.png")
    assert m.decode_file(tmp_path / "la.png").tolist() == [[[200, 0]]]
    pal = Image.fromarray(colour[0]).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    pal.save(tmp_path / "p.png")
    ref = np.asarray(Image.open(tmp_path / "p.png").convert("RGB")).transpose(2, 0, 1)
    assert np.array_equal(m.decode_file(tmp_path / "p.png"), ref)


def test_forced_channels_match_pillows_conversions(tmp_path, gray, colour) -> None:  # type: ignore[no-untyped-def]
    Image.fromarray(colour[2]).save(tmp_path / "c.png")
    ref = np.asarray(Image.open(tmp_path / "c.png").convert("L"))
    assert np.array_equal(m.decode_file(tmp_path / "c.png", "gray"), ref[None])
    Image.fromarray(gray[3]).save(tmp_path / "g.png")
    assert np.array_equal(m.decode_file(tmp_path / "g.png", "rgb"), np.stack([gray[3]] * 3))
    with pytest.raises(ConfigError, match="channels"):
        m.decode_file(tmp_path / "g.png", "grey")


def test_jpeg_exif_orientation_is_applied(tmp_path, colour) -> None:  # type: ignore[no-untyped-def]
    exif = Image.Exif()
    exif[0x0112] = 6  # stored sideways: shown rotated 90 degrees clockwise
    p = tmp_path / "phone.jpg"
    Image.fromarray(colour[0]).save(p, "JPEG", quality=95, exif=exif)
    got = m.decode_file(p)
    stored = np.asarray(Image.open(p))  # 40 x 48 as stored
    assert got.shape == (3, 48, 40)
    assert np.array_equal(got.transpose(1, 2, 0), np.rot90(stored, k=-1))
    assert m._header(str(p), p.read_bytes())[1:] == (40, 48)  # width, height as decoded


def test_files_without_image_content_name_the_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    missing = tmp_path / "nope.png"
    with pytest.raises(BadImageFile, match="cannot be read") as e:
        m.decode_file(missing)
    _one_line(e, missing)


# --------------------------------------------------------------------------- DICOM


def _dicom(path: Path, pixels: np.ndarray, *, photometric: str = "MONOCHROME2",
           bits: int = 12, syntax: str | None = None, frames: list[bytes] | None = None,
           **attrs: object) -> Path:
    pydicom = pytest.importorskip("pydicom")
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.encaps import encapsulate
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    meta = FileMetaDataset()
    meta.TransferSyntaxUID = syntax or ExplicitVRLittleEndian
    meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.7"  # secondary capture
    meta.MediaStorageSOPInstanceUID = generate_uid()
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID = meta.MediaStorageSOPClassUID, \
        meta.MediaStorageSOPInstanceUID
    ds.Rows, ds.Columns = pixels.shape[-2:] if pixels.ndim != 3 or pixels.shape[-1] != 3 \
        else pixels.shape[:2]
    ds.SamplesPerPixel = 3 if photometric == "RGB" else 1
    if photometric == "RGB":
        ds.PlanarConfiguration = 0
    ds.PhotometricInterpretation = photometric
    ds.BitsAllocated = 8 if bits == 8 else 16
    ds.BitsStored, ds.HighBit, ds.PixelRepresentation = bits, bits - 1, 0
    if pixels.ndim == 3 and photometric != "RGB":
        ds.NumberOfFrames = pixels.shape[0]
    for k, v in attrs.items():
        setattr(ds, k, v)
    if frames is not None:
        ds.PixelData = encapsulate(frames)
    else:  # native pixel data in the syntax's byte order
        big = meta.TransferSyntaxUID == "1.2.840.10008.1.2.2"  # Explicit VR Big Endian
        ds.PixelData = pixels.astype(np.uint8 if bits == 8 else ">u2" if big else "<u2"
                                     ).tobytes()
    ds.save_as(path, enforce_file_format=True)
    assert pydicom.dcmread(path).Rows == ds.Rows
    return path


def test_dicom_monochrome2_and_monochrome1(tmp_path, gray) -> None:  # type: ignore[no-untyped-def]
    v12 = gray[4].astype(np.uint16) * 16 + 5
    m2 = m.decode_file(_dicom(tmp_path / "m2.dcm", v12))
    assert np.array_equal(m2[0], _minmax(v12))  # no window: the 16-bit rule
    m1 = m.decode_file(_dicom(tmp_path / "m1.dcm", v12, photometric="MONOCHROME1"))
    assert np.array_equal(m1[0], 255 - m2[0])  # inverted: 0 is black in every output


def _pydicom_window_as_uint8(stored: np.ndarray, path: Path) -> np.ndarray:
    """pydicom's own modality LUT + VOI window, mapped linearly from pydicom's output range
    (found by windowing values far below and above the window) onto 0..255."""
    import pydicom
    from pydicom.pixels import apply_modality_lut, apply_voi_lut

    ds = pydicom.dcmread(path)
    hu = apply_modality_lut(stored, ds)
    lo, hi = apply_voi_lut(np.array([-1e9, 1e9]), ds, index=0)
    return np.rint((apply_voi_lut(hu, ds, index=0) - lo) * 255 / (hi - lo)).astype(np.uint8)


def test_dicom_rescale_and_first_voi_window(tmp_path, gray) -> None:  # type: ignore[no-untyped-def]
    v12 = gray[5].astype(np.uint16) * 16
    hu = v12.astype(float) * 2 - 1024
    centre, width = round(float(np.median(hu))), round(float(np.ptp(hu)) / 2)
    p = _dicom(tmp_path / "ct.dcm", v12, RescaleSlope=2, RescaleIntercept=-1024,
               WindowCenter=[centre, 50], WindowWidth=[width, 10])
    got = m.decode_file(p)[0]
    ref = _pydicom_window_as_uint8(v12, p)
    assert np.abs(got.astype(int) - ref).max() <= 1
    assert 0 < (got == 0).sum() < got.size and 0 < (got == 255).sum() < got.size
    # hand-computed (PS3.3 C.11.2.1.2, c=1000, w=2000)
    assert m.voi_window(np.array([1000.0, -0.5, 1999.5, -5.0, 3000.0]), 1000, 2000).tolist() \
        == [128, 0, 255, 0, 255]
    # the second window (c=50, w=10) would make almost everything 0 or 255
    assert ((got > 0) & (got < 255)).mean() > 0.3


def test_dicom_voi_lut_sequence_and_palette_colour(tmp_path, gray) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("pydicom")
    from pydicom.dataset import Dataset
    from pydicom.sequence import Sequence

    v12 = gray[11].astype(np.uint16) * 16
    lut = Dataset()
    lut.LUTDescriptor = [4096, 0, 12]
    lut.LUTData = (4095 - np.arange(4096)).astype("<u2").tobytes()  # inverting, 12-bit out
    p = _dicom(tmp_path / "lut.dcm", v12, VOILUTSequence=Sequence([lut]))
    assert np.array_equal(m.decode_file(p)[0],
                          np.rint((4095 - v12.astype(float)) * 255 / 4095).astype(np.uint8))
    idx = gray[12]  # palette indices 0..255, a 16-bit palette per channel
    red, green = np.arange(256) * 256 + 3, (255 - np.arange(256)) * 256 + 200
    blue = np.full(256, 128 * 256 + 99)  # the high byte is the 8-bit value
    q = _dicom(tmp_path / "pal.dcm", idx, photometric="PALETTE COLOR", bits=8,
               RedPaletteColorLookupTableDescriptor=[256, 0, 16],
               GreenPaletteColorLookupTableDescriptor=[256, 0, 16],
               BluePaletteColorLookupTableDescriptor=[256, 0, 16],
               RedPaletteColorLookupTableData=red.astype("<u2").tobytes(),
               GreenPaletteColorLookupTableData=green.astype("<u2").tobytes(),
               BluePaletteColorLookupTableData=blue.astype("<u2").tobytes())
    got = m.decode_file(q)
    assert got.shape == (3, 28, 28)
    assert np.array_equal(got[0], idx) and np.array_equal(got[1], 255 - idx)
    assert (got[2] == 128).all()
    assert m._header(str(q), q.read_bytes())[0] == "colour"


def test_dicom_multi_frame_takes_the_first_frame(tmp_path, gray) -> None:  # type: ignore[no-untyped-def]
    frames = np.stack([gray[6], gray[7], gray[8]]).astype(np.uint16) * 16
    got = m.decode_file(_dicom(tmp_path / "mf.dcm", frames))
    assert np.array_equal(got[0], _minmax(frames[0]))
    assert not np.array_equal(got[0], _minmax(frames[1]))


def test_dicom_rgb_and_8_bit(tmp_path, colour, gray) -> None:  # type: ignore[no-untyped-def]
    got = m.decode_file(_dicom(tmp_path / "rgb.dcm", colour[0], photometric="RGB", bits=8))
    assert np.array_equal(got, colour[0].transpose(2, 0, 1))
    got8 = m.decode_file(_dicom(tmp_path / "g8.dcm", gray[0], bits=8))
    assert np.array_equal(got8[0], _minmax(gray[0]))


def test_dicom_jpeg_baseline_decodes_and_jpeg_lossless_names_what_to_install(tmp_path, gray
                                                                            ) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("pydicom")
    from pydicom.uid import JPEGBaseline8Bit, JPEGLosslessSV1

    b = io.BytesIO()
    Image.fromarray(gray[9]).save(b, "JPEG", quality=95)
    p = _dicom(tmp_path / "jb.dcm", gray[9], bits=8, syntax=JPEGBaseline8Bit,
               frames=[b.getvalue()])
    ref = np.asarray(Image.open(io.BytesIO(b.getvalue())))
    assert np.array_equal(m.decode_file(p)[0], _minmax(ref))  # Pillow decodes it for pydicom
    q = _dicom(tmp_path / "jl.dcm", gray[9].astype(np.uint16) * 16, syntax=JPEGLosslessSV1,
               frames=[b"\xff\xd8 JPEG lossless stream \xff\xd9"])
    with pytest.raises(BadImageFile) as e:
        m.decode_file(q)
    msg = _one_line(e, q)
    assert "JPEG Lossless" in msg and str(JPEGLosslessSV1) in msg and "pylibjpeg" in msg
    assert e.value.lasting is False  # the environment's fault: a skip is not cached


@pytest.mark.parametrize("syntax", ["ImplicitVRLittleEndian", "ExplicitVRLittleEndian",
                                    "ExplicitVRBigEndian", "DeflatedExplicitVRLittleEndian"])
def test_dicom_uncompressed_transfer_syntaxes(tmp_path, gray, syntax) -> None:  # type: ignore[no-untyped-def]
    """The four native (uncompressed) syntaxes, pixel data written in each one's byte order
    (and zlib-deflated for the last): all decode to the same pixels."""
    pydicom = pytest.importorskip("pydicom")
    from pydicom import uid

    v12 = gray[13].astype(np.uint16) * 16 + 3
    p = _dicom(tmp_path / "u.dcm", v12, syntax=getattr(uid, syntax))
    assert pydicom.dcmread(p).file_meta.TransferSyntaxUID == getattr(uid, syntax)
    assert np.array_equal(m.decode_file(p)[0], _minmax(v12))
    mono1 = _dicom(tmp_path / "m1.dcm", v12, syntax=getattr(uid, syntax),
                   photometric="MONOCHROME1")
    assert np.array_equal(m.decode_file(mono1)[0], 255 - _minmax(v12))


def test_dicom_rle_lossless_is_decoded_by_pydicom_itself(tmp_path, gray, colour) -> None:  # type: ignore[no-untyped-def]
    """RLE Lossless, written here by pydicom's own RLE encoder (12-bit gray, 8-bit RGB,
    a 3-frame file), decodes without any plugin to exactly the uncompressed file's
    pixels, and a load through the cache reads it like any other file."""
    pydicom = pytest.importorskip("pydicom")
    from pydicom.uid import RLELossless

    def rle(src: Path, dst: Path) -> Path:
        ds = pydicom.dcmread(src)
        ds.compress(RLELossless, encoding_plugin="pydicom")
        ds.save_as(dst, enforce_file_format=True)
        assert pydicom.dcmread(dst).file_meta.TransferSyntaxUID == RLELossless
        assert dst.stat().st_size != src.stat().st_size
        return dst

    v12 = gray[14].astype(np.uint16) * 16 + 7
    g = rle(_dicom(tmp_path / "g.dcm", v12), tmp_path / "g_rle.dcm")
    assert np.array_equal(m.decode_file(g)[0], _minmax(v12))
    c = rle(_dicom(tmp_path / "c.dcm", colour[1], photometric="RGB", bits=8),
            tmp_path / "c_rle.dcm")
    assert np.array_equal(m.decode_file(c), colour[1].transpose(2, 0, 1))
    frames = np.stack([gray[15], gray[16], gray[17]]).astype(np.uint16) * 16
    f = rle(_dicom(tmp_path / "f.dcm", frames), tmp_path / "f_rle.dcm")
    assert np.array_equal(m.decode_file(f)[0], _minmax(frames[0]))
    got = m.load_images([g, f], Transform(), cache_dir=tmp_path / "c", progress=False)
    assert got.bad == [] and np.array_equal(got.x[0, 0], _minmax(v12))


def test_dicom_jpeg_2000_lossless_decodes_through_pillow(tmp_path, gray) -> None:  # type: ignore[no-untyped-def]
    """JPEG 2000 (lossless, 12 bits in 16) through Pillow's OpenJPEG: the exact pixels."""
    pytest.importorskip("pydicom")
    from PIL import features
    from pydicom.uid import JPEG2000Lossless

    if not features.check("jpg_2000"):
        pytest.skip("this Pillow has no OpenJPEG")
    v12 = gray[18].astype(np.uint16) * 16 + 1
    b = io.BytesIO()
    Image.fromarray(v12).save(b, "JPEG2000", irreversible=False, no_jp2=True)
    p = _dicom(tmp_path / "j2k.dcm", v12, syntax=JPEG2000Lossless, frames=[b.getvalue()])
    assert np.array_equal(m.decode_file(p)[0], _minmax(v12))


def _need_missing_decoder(syntax: object) -> None:
    from pydicom.pixels import get_decoder

    if get_decoder(syntax).is_available:
        pytest.skip(f"a decoder for {syntax} is installed here")


@pytest.mark.parametrize("syntax,pip,not_pip", [
    ("JPEGLosslessSV1", "pip install 'pylibjpeg>=2.0' 'pylibjpeg-libjpeg>=2.1'",
     "pylibjpeg-openjpeg"),
    ("JPEGLSLossless", "pip install 'pylibjpeg>=2.0' 'pylibjpeg-libjpeg>=2.1'",
     "pylibjpeg-openjpeg"),
    ("JPEGLSNearLossless", "pip install 'pylibjpeg>=2.0' 'pylibjpeg-libjpeg>=2.1'",
     "pylibjpeg-openjpeg"),
    ("HTJ2KLossless", "pip install 'pylibjpeg>=2.0' 'pylibjpeg-openjpeg>=2.0'",
     "pylibjpeg-libjpeg")])
def test_dicom_without_its_decoder_is_one_line_with_the_pip_command(tmp_path, gray, syntax,
                                                                    pip, not_pip
                                                                    ) -> None:  # type: ignore[no-untyped-def]
    """A syntax whose decoder plugin is not installed: one line naming the file, the syntax
    and the pip command for *that* syntax (the packages pydicom requires for it), from
    decode_file and the same line from load_images (which a run stops with: it used to
    lose the fix and say "fix or remove the file"); with skip_bad it is skipped, counted
    and not cached (installing the decoder brings it back)."""
    pytest.importorskip("pydicom")
    from pydicom import uid

    ts = getattr(uid, syntax)
    _need_missing_decoder(ts)
    v12 = gray[19].astype(np.uint16) * 16
    p = _dicom(tmp_path / "x.dcm", v12, syntax=ts, frames=[b"\xff\xd8 compressed \xff\xd9"])
    with pytest.raises(BadImageFile) as e:
        m.decode_file(p)
    msg = _one_line(e, p)
    assert str(ts) in msg and ts.name in msg and pip in msg and not_pip not in msg
    assert e.value.lasting is False
    good = _write(tmp_path / "png", gray[:2])
    with pytest.raises(BadImageFile) as e2:  # stops the load, named, before any decode
        m.load_images([*good, p], Transform(), cache_dir=tmp_path / "c", progress=False)
    assert _one_line(e2, p) == msg
    got = m.load_images([*good, p], Transform(), skip_bad=True, cache_dir=tmp_path / "c",
                        progress=False)
    assert got.kept.tolist() == [0, 1] and got.cache_path is None  # not cached
    assert got.bad == [(str(p), e.value.reason)]


def test_dicom_12_bit_jpeg_extended_names_the_decoder_not_a_corrupt_file(tmp_path, gray
                                                                         ) -> None:  # type: ignore[no-untyped-def]
    """Pillow decodes 8-bit JPEG Extended only: a 12-bit one is a decoder this environment
    lacks (pylibjpeg-libjpeg or GDCM reads it), not a corrupt file to fix or remove."""
    pytest.importorskip("pydicom")
    from pydicom.pixels import get_decoder
    from pydicom.uid import JPEGExtended12Bit

    if set(get_decoder(JPEGExtended12Bit).available_plugins) - {"pillow"}:
        pytest.skip("a 12-bit JPEG decoder is installed here")
    b = io.BytesIO()
    Image.fromarray(gray[20]).save(b, "JPEG", quality=95)
    p = _dicom(tmp_path / "j12.dcm", gray[20].astype(np.uint16) * 16, bits=12,
               syntax=JPEGExtended12Bit, frames=[b.getvalue()])
    with pytest.raises(BadImageFile) as e:
        m.decode_file(p)
    msg = _one_line(e, p)
    assert "corrupt" not in msg and "fix or remove" not in msg
    assert str(JPEGExtended12Bit) in msg and "12-bit" in msg
    assert "pip install 'pylibjpeg>=2.0' 'pylibjpeg-libjpeg>=2.1'" in msg
    assert e.value.lasting is False


def test_dicom_without_pydicom_is_one_line_naming_the_extra(tmp_path, gray, monkeypatch
                                                           ) -> None:  # type: ignore[no-untyped-def]
    from scarcelab.extras import MissingExtra

    p = _dicom(tmp_path / "x.dcm", gray[0].astype(np.uint16))
    monkeypatch.setitem(sys.modules, "pydicom", None)
    with pytest.raises(MissingExtra) as e:
        m.decode_file(p)
    msg = _one_line(e, p)
    assert "pip install 'scarcelab[dicom]'" in msg
    with pytest.raises(MissingExtra):  # never skipped as a "bad file"
        m.load_images([p], Transform(), skip_bad=True, cache_dir=tmp_path / "c",
                      progress=False)


# --------------------------------------------------------------------------- bad files


def _bad_variants(tmp_path: Path, gray: np.ndarray, suffix: str) -> tuple[Path, list[Path]]:
    """A good file of the format and its truncated and garbage twins."""
    big = np.asarray(Image.fromarray(gray[10]).resize((96, 96)))
    good = tmp_path / f"good{suffix}"
    if suffix == ".dcm":
        _dicom(good, big.astype(np.uint16) * 16)
    else:
        Image.fromarray(big).save(good, {".jpg": "JPEG", ".tif": "TIFF"}.get(
            suffix, suffix[1:].upper()))
    data = good.read_bytes()
    trunc, junk = tmp_path / f"trunc{suffix}", tmp_path / f"junk{suffix}"
    trunc.write_bytes(data[: len(data) // 2])
    junk.write_bytes(np.random.default_rng(0).bytes(len(data) // 2))
    _old(good, trunc, junk)
    return good, [trunc, junk]


@pytest.mark.parametrize("suffix", [".png", ".jpg", ".bmp", ".tif", ".dcm"])
def test_corrupt_file_is_one_line_or_skipped_and_counted(tmp_path, gray, cache, suffix
                                                        ) -> None:  # type: ignore[no-untyped-def]
    good, bads = _bad_variants(tmp_path, gray, suffix)
    for bad in bads:
        with pytest.raises(BadImageFile) as e:
            m.decode_file(bad)
        assert "--skip-bad-files" in _one_line(e, bad)
    paths = [good, bads[0], good, bads[1]]
    with pytest.raises(BadImageFile) as e:
        m.load_images(paths, Transform(), cache_dir=cache, progress=False)
    _one_line(e, Path(e.value.path))  # a garbage header is found before a cut-off stream
    assert e.value.path in map(str, bads)
    r = m.load_images(paths, Transform(), skip_bad=True, cache_dir=cache, progress=False)
    assert r.kept.tolist() == [0, 2] and [p for p, _ in r.bad] == [str(b) for b in bads]
    assert r.x.shape[0] == 2 and np.array_equal(r.x[0], m.decode_file(good))
    again = m.load_images(paths, Transform(), skip_bad=True, cache_dir=cache, progress=False)
    assert again.from_cache and again.kept.tolist() == [0, 2] and again.bad == r.bad
    with pytest.raises(BadImageFile) as e:  # the cached skip does not hide the file later
        m.load_images(paths[:3], Transform(), cache_dir=cache, progress=False)
    _one_line(e, bads[0])


# --------------------------------------------------------------------------- refusals


def test_mixed_sizes_need_image_size(tmp_path, gray, cache) -> None:  # type: ignore[no-untyped-def]
    a = _write(tmp_path / "a", gray[:2])
    b = tmp_path / "b.png"
    Image.fromarray(gray[3]).resize((40, 30)).save(b)
    with pytest.raises(DataError) as e:
        m.load_images([*a, b], Transform(), cache_dir=cache, progress=False)
    msg = str(e.value)
    assert f"{a[0]} is 28x28" in msg and f"{b} is 40x30" in msg and "image_size" in msg
    r = m.load_images([*a, b], Transform(image_size=28), cache_dir=cache, progress=False)
    assert r.x.shape == (3, 1, 28, 28)
    assert np.array_equal(r.x[2], m.to_model_input(m.decode_file(b), Transform(28), 1))


def test_native_size_may_be_non_square(tmp_path, gray, cache) -> None:  # type: ignore[no-untyped-def]
    files = _write(tmp_path / "n", np.stack([np.asarray(Image.fromarray(g).resize((40, 30)))
                                             for g in gray[:3]]))
    r = m.load_images(files, Transform(), cache_dir=cache, progress=False)
    assert r.x.shape == (3, 1, 30, 40)


def test_mixed_gray_and_colour_need_a_forced_mode(tmp_path, gray, colour, cache) -> None:  # type: ignore[no-untyped-def]
    g = _write(tmp_path / "g", gray[:3])
    c = _write(tmp_path / "c", colour[:2])
    with pytest.raises(DataError) as e:
        m.load_images([*g, *c], Transform(image_size=16), cache_dir=cache, progress=False)
    msg = str(e.value)
    assert f"3 grayscale (e.g. {g[0]})" in msg and f"2 colour (e.g. {c[0]})" in msg
    assert "gray or rgb" in msg
    r = m.load_images([*g, *c], Transform(16, channels="gray"), cache_dir=cache,
                      progress=False)
    assert r.channels == 1 and r.x.shape == (5, 1, 16, 16)
    r = m.load_images([*g, *c], Transform(16, channels="rgb"), cache_dir=cache,
                      progress=False)
    assert r.channels == 3 and np.array_equal(r.x[0, 0], r.x[0, 2])
    assert m.load_images(c, Transform(16), cache_dir=cache, progress=False).channels == 3


@pytest.mark.parametrize("kw", [{"image_size": 0}, {"image_size": True}, {"image_size": 2.5},
                                {"channels": "grey"}, {"fit": "stretch"}])
def test_transform_refuses_bad_values(kw) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError):
        Transform(**kw)


def test_transform_key_and_params() -> None:
    t = Transform(224, "gray", "pad")
    assert t.key() == Transform(224, "gray", "pad").key() != Transform(224, "gray").key()
    p = t.params()
    assert p["image_size"] == "224" and p["channels"] == "gray" and p["fit"] == "pad"
    assert {"resample", "scale16", "decoder_version"} <= set(p)
    assert Transform().params()["image_size"] == "native"


# --------------------------------------------------------------------------- geometry


def _triangle_resize(a: np.ndarray, out: int, axis: int) -> np.ndarray:
    """Independent reference: an antialiased bilinear (triangle) filter, its support
    widened by the shrink factor, weights renormalised at the edges (Pillow's rule)."""
    n = a.shape[axis]
    scale = n / out
    support = max(scale, 1.0)
    rows = []
    for i in range(out):
        centre = (i + 0.5) * scale
        j = np.arange(n)
        w = np.clip(1 - np.abs((j + 0.5 - centre) / support), 0, None)
        rows.append(w / w.sum())
    weights = np.array(rows)
    return np.moveaxis(np.tensordot(weights, np.moveaxis(a.astype(float), axis, 0), 1), 0,
                       axis)


def test_crop_and_pad_geometry_on_a_hand_made_image() -> None:
    img = (np.arange(32, dtype=np.uint8).reshape(4, 8) * 7)  # H=4, W=8, every pixel known
    crop4 = m.to_model_input(img, Transform(4, fit="crop"), 1)[0]
    assert np.array_equal(crop4, img[:, 2:6])  # shorter side already 4: the centre columns
    pad8 = m.to_model_input(img, Transform(8, fit="pad"), 1)[0]
    assert np.array_equal(pad8[2:6], img) and not pad8[:2].any() and not pad8[6:].any()
    # shrinking: 4x8 -> 2x4 (crop keeps its centre 2x2, pad puts it on rows 1..2 of 4x4)
    half = _triangle_resize(_triangle_resize(img, 2, 0), 4, 1)
    crop2 = m.to_model_input(img, Transform(2, fit="crop"), 1)[0]
    assert np.abs(crop2 - half[:, 1:3]).max() <= 1
    pad4 = m.to_model_input(img, Transform(4, fit="pad"), 1)[0]
    assert np.abs(pad4[1:3] - half).max() <= 1 and not pad4[0].any() and not pad4[3].any()
    # a tall image crops rows, not columns; an odd margin goes to the bottom/right
    tall = img.T.copy()  # 8x4
    assert np.array_equal(m.to_model_input(tall, Transform(4), 1)[0], tall[2:6])
    odd = np.arange(15, dtype=np.uint8).reshape(3, 5) + 1
    pad5 = m.to_model_input(odd, Transform(5, fit="pad"), 1)[0]
    assert np.array_equal(pad5[1:4], odd) and not pad5[0].any() and not pad5[4].any()
    # a non-square target (training kept its own 3x5 size)
    assert m.to_model_input(img, Transform(), 1, size=(3, 5)).shape == (1, 3, 5)


def test_fitted_size_rounds_the_longer_side() -> None:
    assert m.fitted_size(28, 37, (224, 224), "crop") == (224, 296)
    assert m.fitted_size(37, 28, (224, 224), "crop") == (296, 224)
    assert m.fitted_size(28, 37, (224, 224), "pad") == (_r(28 * 224 / 37), 224)
    assert m.fitted_size(3, 1000, (8, 8), "pad") == (1, 8)  # never 0 pixels


def _r(v: float) -> int:
    return int(v + 0.5)


def test_to_model_input_layouts_and_dtypes(gray, colour) -> None:  # type: ignore[no-untyped-def]
    t = Transform(20, fit="crop")
    hwc = colour[0]
    assert np.array_equal(m.to_model_input(hwc, t, 3),
                          m.to_model_input(hwc.transpose(2, 0, 1).copy(), t, 3))
    assert m.to_model_input(gray[0], t, 3).shape == (3, 20, 20)
    with pytest.raises(DataError, match="float"):
        m.to_model_input(gray[0].astype(np.float32), t, 1)
    with pytest.raises(DataError, match="shape"):
        m.to_model_input(np.zeros((2, 5, 5, 5), np.uint8), t, 1)


def test_training_and_serving_share_one_path(tmp_path, gray, cache) -> None:  # type: ignore[no-untyped-def]
    files = _write(tmp_path / "s", np.stack([np.asarray(Image.fromarray(g).resize((50, 36)))
                                             for g in gray[:4]]))
    t = Transform(24, fit="pad")
    r = m.load_images(files, t, cache_dir=cache, progress=False)
    for i, f in enumerate(files):
        assert np.array_equal(r.x[i], m.to_model_input(np.asarray(Image.open(f)), t, 1))


# --------------------------------------------------------------------------- cache


def test_second_load_is_a_memmapped_cache_hit(tmp_path, gray, cache) -> None:  # type: ignore[no-untyped-def]
    files = _write(tmp_path / "f", gray[:12])
    first = m.load_images(files, Transform(), cache_dir=cache, progress=False)
    assert not first.from_cache and first.cache_path == cache / f"{first.cache_key}.npy"
    assert np.array_equal(first.x[:, 0], gray[:12])
    second = m.load_images(files, Transform(), cache_dir=cache, progress=False)
    assert second.from_cache and second.cache_key == first.cache_key
    assert isinstance(second.x, np.memmap) and not second.x.flags.writeable
    assert np.array_equal(np.asarray(second.x), np.asarray(first.x))
    assert second.kept.tolist() == list(range(12)) and second.bad == []
    assert len(first.cache_key) == 64 and int(first.cache_key, 16) >= 0
    meta = json.loads((cache / f"{first.cache_key}.json").read_text())
    assert meta["shape"] == [12, 1, 28, 28] and meta["transform"]["image_size"] == "native"
    other = m.load_images(files, Transform(image_size=32), cache_dir=cache, progress=False)
    assert other.cache_key != first.cache_key and not other.from_cache
    fit = m.load_images(files, Transform(image_size=32, fit="pad"), cache_dir=cache,
                        progress=False)
    assert fit.cache_key not in (first.cache_key, other.cache_key)


def test_cache_follows_content_not_paths_or_times(tmp_path, gray, cache, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    files = _write(tmp_path / "f", gray[:10])
    key = m.load_images(files, Transform(), cache_dir=cache, progress=False).cache_key
    hashed: list[str] = []
    real = m._scan_chunk
    monkeypatch.setattr(m, "_scan_chunk", lambda items: hashed.extend(p for _, p in items)
                        or real(items))
    r = m.load_images(files, Transform(), cache_dir=cache, progress=False)
    assert r.from_cache and r.cache_key == key and hashed == []  # stat index: nothing read
    t = time.time() - 30
    os.utime(files[3], (t, t))  # touched, same bytes: re-hashed, still the same entry
    r = m.load_images(files, Transform(), cache_dir=cache, progress=False)
    assert hashed == [str(files[3])] and r.from_cache and r.cache_key == key
    hashed.clear()
    Image.fromarray(gray[40]).save(files[5])  # new content
    _old(files[5])
    r = m.load_images(files, Transform(), cache_dir=cache, progress=False)
    assert hashed == [str(files[5])] and not r.from_cache and r.cache_key != key
    assert np.array_equal(r.x[5, 0], gray[40]) and np.array_equal(r.x[4, 0], gray[4])
    moved = tmp_path / "moved"
    (tmp_path / "f").rename(moved)
    r2 = m.load_images(sorted(moved.glob("*.png")), Transform(), cache_dir=cache,
                       progress=False)
    assert r2.from_cache and r2.cache_key == r.cache_key  # a moved folder keeps its cache


def test_a_file_changed_in_the_tick_it_was_hashed_is_hashed_again(tmp_path, gray, cache,
                                                                   monkeypatch) -> None:  # type: ignore[no-untyped-def]
    files = _write(tmp_path / "f", gray[:3])
    os.utime(files[1])  # changed "now": within 2 s of the hashing below
    m.load_images(files, Transform(), cache_dir=cache, progress=False)
    hashed: list[str] = []
    real = m._scan_chunk
    monkeypatch.setattr(m, "_scan_chunk", lambda items: hashed.extend(p for _, p in items)
                        or real(items))
    m.load_images(files, Transform(), cache_dir=cache, progress=False)
    assert hashed == [str(files[1])]


def test_cache_root_follows_scarcelab_cache_and_xdg(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("SCARCELAB_CACHE", str(tmp_path / "c"))
    assert m.cache_root() == tmp_path / "c" / "images"
    monkeypatch.delenv("SCARCELAB_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert m.cache_root() == tmp_path / "x" / "scarcelab" / "images"


def test_default_cache_is_outside_the_data_folder(tmp_path, gray, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("SCARCELAB_CACHE", str(tmp_path / "c"))
    files = _write(tmp_path / "data", gray[:2])
    before = sorted(p.name for p in (tmp_path / "data").iterdir())
    r = m.load_images(files, Transform(), progress=False)
    assert r.cache_path is not None and r.cache_path.parent == tmp_path / "c" / "images"
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == before


_KILLED_WRITER = """
import os, signal, sys
from scarcelab.data import imagefiles as m
real = m._decode_chunk
def dying(npy, rows, *rest):
    real(npy, rows[:2], *rest)  # some rows are in the temporary file, then SIGKILL
    os.kill(os.getpid(), signal.SIGKILL)
m._decode_chunk = dying
m.load_images(sys.argv[2:], m.Transform(), cache_dir=sys.argv[1], workers=1, progress=False)
"""


def test_a_killed_writer_leaves_no_cache_entry(tmp_path, gray, cache) -> None:  # type: ignore[no-untyped-def]
    files = _write(tmp_path / "f", gray[:20])
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(cache),
                           *map(str, files)], env=env, capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert list(cache.glob("*.npy")) == [] and list(cache.glob("*.json")) == []
    assert list(cache.glob(".*.npy.tmp"))  # what it left is only a temporary file
    r = m.load_images(files, Transform(), cache_dir=cache, progress=False)  # lock released
    assert not r.from_cache and np.array_equal(r.x[:, 0], gray[:20])
    assert m.load_images(files, Transform(), cache_dir=cache, progress=False).from_cache


def test_a_damaged_or_pickled_entry_is_decoded_again_never_unpickled(tmp_path, gray, cache
                                                                    ) -> None:  # type: ignore[no-untyped-def]
    files = _write(tmp_path / "f", gray[:4])
    r = m.load_images(files, Transform(), cache_dir=cache, progress=False)
    npy = r.cache_path
    assert npy is not None
    with open(npy, "r+b") as fh:  # truncated
        fh.truncate(npy.stat().st_size - 100)
    again = m.load_images(files, Transform(), cache_dir=cache, progress=False)
    assert not again.from_cache and np.array_equal(again.x[:, 0], gray[:4])
    marker = tmp_path / "unpickled"

    class Bomb:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (Path.touch, (marker,))

    arr = np.empty(1, dtype=object)
    arr[0] = Bomb()
    with open(npy, "wb") as fh:
        np.save(fh, arr, allow_pickle=True)
    meta = json.loads(npy.with_suffix(".json").read_text())
    meta["npy_bytes"] = npy.stat().st_size
    npy.with_suffix(".json").write_text(json.dumps(meta))
    assert pickle.dumps(Bomb())  # the payload would run if it were ever unpickled
    third = m.load_images(files, Transform(), cache_dir=cache, progress=False)
    assert not third.from_cache and not marker.exists()
    assert np.array_equal(third.x[:, 0], gray[:4])


def test_concurrent_loads_of_one_key_decode_once(tmp_path, gray, cache, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    files = _write(tmp_path / "f", gray[:30])
    calls: list[int] = []
    real = m._decode_into

    def counted(*a, **k):  # type: ignore[no-untyped-def]
        calls.append(1)
        time.sleep(0.3)  # let the other thread reach the lock
        return real(*a, **k)

    monkeypatch.setattr(m, "_decode_into", counted)
    out: list[m.DecodedImages] = []
    start = threading.Barrier(2)

    def load() -> None:
        start.wait()
        out.append(m.load_images(files, Transform(), cache_dir=cache, progress=False))

    threads = [threading.Thread(target=load) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(out) == 2 and len(calls) == 1
    assert sorted(r.from_cache for r in out) == [False, True]
    assert np.array_equal(np.asarray(out[0].x), np.asarray(out[1].x))


def test_worker_processes_give_the_same_bytes_and_skip_bad_files(tmp_path, gray, cache
                                                                 ) -> None:  # type: ignore[no-untyped-def]
    files = _write(tmp_path / "f", np.stack([np.asarray(Image.fromarray(g).resize((40, 40)))
                                             for g in gray[:40]]))
    data = files[7].read_bytes()
    files[7].write_bytes(data[: len(data) // 2])  # passes the header check, fails decoding
    _old(files[7])
    t = Transform(32, fit="crop")
    one = m.load_images(files, t, skip_bad=True, cache_dir=cache / "1", workers=1,
                        progress=False)
    two = m.load_images(files, t, skip_bad=True, cache_dir=cache / "2", workers=2,
                        progress=False)
    assert one.cache_key == two.cache_key and one.kept.tolist() == two.kept.tolist()
    assert 7 not in two.kept and [p for p, _ in two.bad] == [str(files[7])]
    assert np.array_equal(np.asarray(one.x), np.asarray(two.x)) and two.x.shape[0] == 39


def test_a_script_without_a_main_guard_falls_back_to_one_process(tmp_path, gray) -> None:  # type: ignore[no-untyped-def]
    files = _write(tmp_path / "f", gray[:20])
    script = tmp_path / "noguard.py"
    script.write_text(textwrap.dedent(f"""
        import numpy as np
        from scarcelab.data import imagefiles as m
        files = {[str(f) for f in files]!r}
        r = m.load_images(files, m.Transform(), cache_dir={str(tmp_path / 'c')!r},
                          workers=2, progress=False)
        print("ROWS", r.x.shape[0], int(np.asarray(r.x).sum()))
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"ROWS 20 {int(gray[:20].astype(np.int64).sum())}" in proc.stdout
    assert "if __name__ == '__main__'" in proc.stderr


def test_no_files_and_all_bad_give_an_empty_array(tmp_path, cache) -> None:  # type: ignore[no-untyped-def]
    r = m.load_images([], Transform(16), cache_dir=cache, progress=False)
    assert r.x.shape == (0, 1, 16, 16) and r.kept.size == 0
    junk = tmp_path / "junk.png"
    junk.write_bytes(b"not a png")
    r = m.load_images([junk], Transform(16, channels="rgb"), skip_bad=True, cache_dir=cache,
                      progress=False)
    assert r.x.shape == (0, 3, 16, 16) and r.bad == [(str(junk), r.bad[0][1])]
