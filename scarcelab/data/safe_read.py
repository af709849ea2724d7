"""Readers for data files that a user, a download or a store handed us: every failure is one
:class:`~scarcelab.errors.DataError` line naming the file and the fix, never a traceback.

Why one module: the loaders each caught a different subset of what numpy, zipfile, gzip,
json and Pillow raise on a broken file (``BadZipFile``, ``KeyError``, ``EOFError``,
``BadGzipFile``, ``ValueError: could not convert``, ``OSError: Truncated File Read`` ...),
so the same corruption was one line in one dataset and a traceback in the next.

Sizes are checked before anything is allocated. An ``.npy`` header (inside an ``.npz`` or
on its own) states the array's shape and dtype; numpy allocates that much before it reads
a byte, so a header claiming 700 TiB ended in ``MemoryError`` (or, under memory
overcommit, in a machine paging itself to death). Here the header is read first with
``numpy.lib.format.read_magic`` / ``read_array_header_*`` and its ``prod(shape) ×
itemsize`` compared with the bytes that actually follow it: the file size for an ``.npy``;
for an ``.npz`` member its uncompressed size in the zip directory, which itself must be
reachable from its compressed size (deflate expands at most 1032:1, so a larger claimed
ratio is a lie). Object arrays are refused: nothing read here is ever unpickled.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import warnings
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import numpy as np

from scarcelab.errors import DataError

#: Deflate's largest possible expansion (zlib technical details: "the limit is 1032:1");
#: a member claiming more than this times its compressed size is not a real deflate stream.
MAX_DEFLATE_RATIO = 1032
_SUPPORTED_NPY = ((1, 0), (2, 0), (3, 0))
#: Read errors that a corrupt file can raise from numpy/zipfile/zlib/gzip; MemoryError is
#: kept as a last line of defence (the size checks come first).
_READ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, KeyError,
                MemoryError, TypeError, IndexError, SyntaxError, UnicodeDecodeError)

DEFAULT_FIX = "restore it from the dataset's source (or delete it to have it fetched again)"


def _fail(path: str | os.PathLike[str], what: str, fix: str) -> DataError:
    return DataError(f"{path}: {what}; {fix}")


def _short(e: BaseException) -> str:
    text = " ".join(str(e).split())  # one line, whatever the library put in its message
    if len(text) > 160:
        text = text[:157] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def npy_header(fh: IO[bytes]) -> tuple[tuple[int, ...], bool, np.dtype[Any], int]:
    """(shape, fortran_order, dtype, bytes of data the header promises) of the ``.npy``
    stream at ``fh``'s position, leaving ``fh`` at the first data byte. Raises ValueError
    for a bad magic string, version or header, or an object dtype."""
    version = np.lib.format.read_magic(fh)
    if version not in _SUPPORTED_NPY:
        raise ValueError(f"npy format version {version[0]}.{version[1]} is not one numpy "
                         "writes (1.0, 2.0 or 3.0)")
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
    else:
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
    if dtype.hasobject:
        raise ValueError(f"the array holds Python objects (dtype {dtype}), which would have "
                         "to be unpickled; only plain numeric arrays are read")
    if any(int(s) < 0 for s in shape):
        raise ValueError(f"negative dimension in shape {shape}")
    return tuple(int(s) for s in shape), bool(fortran), dtype, math.prod(shape) * dtype.itemsize


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**30 else f"{n} bytes"


def load_npy(path: str | os.PathLike[str], *, fix: str = DEFAULT_FIX,
             mmap_mode: str | None = None) -> np.ndarray:
    """The array in the ``.npy`` file ``path`` (memory-mapped with ``mmap_mode``), or one
    :class:`DataError` line naming the file and ``fix``."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            shape, _fortran, dtype, nbytes = npy_header(fh)
            available = size - fh.tell()
        if nbytes > available:
            raise _fail(path, f"the .npy header claims shape {shape} of {dtype} "
                        f"({_gib(nbytes)}) but only {_gib(available)} follow it (truncated "
                        "or corrupt)", fix)
        return np.load(path, mmap_mode=mmap_mode, allow_pickle=False)  # type: ignore[arg-type]
    except DataError:
        raise
    except FileNotFoundError:
        raise _fail(path, "file not found", fix) from None
    except _READ_ERRORS as e:
        raise _fail(path, f"not a readable .npy file ({_short(e)})", fix) from None


def load_npz(path: str | os.PathLike[str], keys: Sequence[str] | None = None, *,
             fix: str = DEFAULT_FIX) -> dict[str, np.ndarray]:
    """``{key: array}`` for ``keys`` (all members when None) of the ``.npz`` file ``path``,
    or one :class:`DataError` line naming the file, the missing keys or the broken member,
    and ``fix``. Every member's header is checked against its size before it is read."""
    try:
        archive_size = os.path.getsize(path)
        with open(path, "rb") as fh:
            magic = fh.read(4)
        if magic != b"PK\x03\x04":
            raise _fail(path, f"not an .npz (zip) archive: it starts with {magic!r} (an "
                        "interrupted copy, or an HTML error page saved under that name?)", fix)
        with zipfile.ZipFile(path) as z:
            members = {n[:-4]: n for n in z.namelist() if n.endswith(".npy")}
            wanted = list(members) if keys is None else list(keys)
            missing = [k for k in wanted if k not in members]
            if missing:
                raise _fail(path, f"key(s) {', '.join(missing)} missing from the archive "
                            f"(found: {', '.join(sorted(members)) or 'none'})", fix)
            infos = {k: z.getinfo(members[k]) for k in wanted}
            for k, info in infos.items():  # every header before any array is read
                _check_member(path, k, info, archive_size, z, fix)
            out: dict[str, np.ndarray] = {}
            for k, info in infos.items():
                with z.open(info) as member:
                    out[k] = np.lib.format.read_array(member, allow_pickle=False)
            return out
    except DataError:
        raise
    except FileNotFoundError:
        raise _fail(path, "file not found", fix) from None
    except _READ_ERRORS as e:
        raise _fail(path, f"not a readable .npz file, truncated or corrupt ({_short(e)})",
                    fix) from None


def _check_member(path: str | os.PathLike[str], key: str, info: zipfile.ZipInfo,
                  archive_size: int, z: zipfile.ZipFile, fix: str) -> None:
    if info.compress_size > archive_size:
        raise _fail(path, f"member {key} claims {_gib(info.compress_size)} of compressed "
                    f"data in a {_gib(archive_size)} file (truncated or corrupt)", fix)
    ratio = 1 if info.compress_type == zipfile.ZIP_STORED else MAX_DEFLATE_RATIO
    if info.file_size > ratio * info.compress_size + 4096:
        raise _fail(path, f"member {key} claims {_gib(info.file_size)} uncompressed from "
                    f"{_gib(info.compress_size)}, more than the format can expand (corrupt)",
                    fix)
    try:
        with z.open(info) as member:
            shape, _f, dtype, nbytes = npy_header(member)  # type: ignore[arg-type]
            header_len = member.tell()
    except ValueError as e:
        raise _fail(path, f"member {key} is not a readable .npy array ({_short(e)})",
                    fix) from None
    if nbytes > info.file_size - header_len:
        raise _fail(path, f"member {key}'s header claims shape {shape} of {dtype} "
                    f"({_gib(nbytes)}) but the member holds {_gib(info.file_size)} "
                    "(truncated or corrupt)", fix)


def read_numeric_csv(path: str | os.PathLike[str], *, columns: int, fix: str = DEFAULT_FIX,
                     dtype: type = np.float32) -> np.ndarray:
    """A ``(rows, columns)`` array from a comma-separated text file of numbers (gzipped when
    the name ends in ``.gz``), or one :class:`DataError` line naming the file, the first bad
    row and ``fix``: a non-gzip ``.gz``, a truncated stream, a row with another number of
    columns, a value that is not a number. (numpy's parser does the work: its messages name
    the row and column.)"""
    try:
        if str(path).endswith(".gz"):
            with gzip.open(path, "rb") as f:
                raw = f.read()
        else:
            raw = Path(path).read_bytes()
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise _fail(path, "file not found", fix) from None
    except gzip.BadGzipFile as e:
        raise _fail(path, f"not a gzip file ({_short(e)})", fix) from None
    except EOFError as e:
        raise _fail(path, f"the compressed stream ends early (truncated: {_short(e)})", fix
                    ) from None
    except _READ_ERRORS as e:
        raise _fail(path, f"not a readable text file ({_short(e)})", fix) from None
    try:
        with warnings.catch_warnings():  # "input contained no data": said below, one line
            warnings.simplefilter("ignore", UserWarning)
            arr = np.loadtxt(io.StringIO(text), delimiter=",", dtype=dtype, ndmin=2)
    except ValueError as e:  # "could not convert string 'x' ... at row 3, column 785",
        # "the number of columns changed from 785 to 700 at row 2"
        raise _fail(path, f"not a table of numbers ({_short(e)})", fix) from None
    if arr.shape[0] == 0:
        raise _fail(path, "no rows", fix)
    if arr.shape[1] != columns:
        raise _fail(path, f"{arr.shape[1]} column(s) per row, expected {columns}", fix)
    return arr


def read_json(path: str | os.PathLike[str], *, fix: str = DEFAULT_FIX) -> Any:
    """The JSON value in ``path``, or one :class:`DataError` line naming the file, where the
    parse failed and ``fix`` (a truncated file, not UTF-8, empty)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        return json.loads(text)
    except FileNotFoundError:
        raise _fail(path, "file not found", fix) from None
    except json.JSONDecodeError as e:
        raise _fail(path, f"not valid JSON (line {e.lineno} column {e.colno}: {e.msg}; "
                    "truncated?)", fix) from None
    except (OSError, UnicodeDecodeError, RecursionError, ValueError) as e:
        raise _fail(path, f"not a readable JSON file ({_short(e)})", fix) from None


@contextmanager
def pil_image(source: str | os.PathLike[str] | bytes, *, name: str | None = None,
              fix: str = DEFAULT_FIX) -> Iterator[Any]:
    """A fully decoded Pillow image of ``source`` (a path, or bytes named ``name``), or one
    :class:`DataError` line. ``load()`` runs inside: Pillow reads lazily, so a truncated
    JPEG or PNG ("Truncated File Read", "image file is truncated") only fails once its
    pixels are read. Errors raised by the caller's own code inside the block pass through."""
    from PIL import Image

    label = name if name is not None else str(source)
    try:
        im = Image.open(io.BytesIO(source) if isinstance(source, bytes) else source)
        im.load()
    except FileNotFoundError:
        raise _fail(label, "file not found", fix) from None
    except Image.DecompressionBombError as e:
        raise _fail(label, f"larger than Pillow's decompression-bomb limit ({e})", fix
                    ) from None
    except (*_READ_ERRORS, Image.UnidentifiedImageError) as e:
        raise _fail(label, f"not a readable image, truncated or corrupt ({_short(e)})", fix
                    ) from None
    with im:
        yield im


@contextmanager
def zip_archive(path: str | os.PathLike[str], *, fix: str = DEFAULT_FIX
                ) -> Iterator[zipfile.ZipFile]:
    """``zipfile.ZipFile(path)`` or one :class:`DataError` line (truncated, not a zip).
    Reading a member can still fail (a corrupt member): use :func:`zip_member`."""
    try:
        z = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise _fail(path, "file not found", fix) from None
    except _READ_ERRORS as e:
        raise _fail(path, f"not a readable zip archive ({_short(e)})", fix) from None
    with z:
        yield z


def zip_member(z: zipfile.ZipFile, member: str, *, fix: str = DEFAULT_FIX) -> bytes:
    """The bytes of ``member``, or one :class:`DataError` line (bad CRC, truncated)."""
    try:
        return z.read(member)
    except _READ_ERRORS as e:
        raise _fail(f"{z.filename}:{member}", f"a corrupt archive member ({_short(e)})", fix
                    ) from None


__all__ = ["MAX_DEFLATE_RATIO", "load_npy", "load_npz", "npy_header", "pil_image",
           "read_json", "read_numeric_csv", "zip_archive", "zip_member"]
