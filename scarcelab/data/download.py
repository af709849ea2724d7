"""Where data lives on disk and how a missing file gets there.

Every source resolves its files under one data root, so a user points scarcelab at a
folder once (``data_dir`` or ``SCARCELAB_DATA``) instead of per dataset. Downloads are
streamed to a temporary file beside the destination and renamed only after the checksum
matched, so an interrupted or corrupted transfer never leaves a file that a later run
would mistake for a good copy.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any

from tqdm.auto import tqdm

from scarcelab.errors import DataError

ENV_DATA_ROOT = "SCARCELAB_DATA"
"""Environment variable naming the data root when no ``data_dir`` is passed."""

_CHUNK = 1 << 20
_NETWORK_ERRORS = (urllib.error.URLError, http.client.HTTPException, TimeoutError, ConnectionError)


def data_root(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The folder datasets are read from and downloaded to.

    Precedence: the explicit ``data_dir`` argument, then ``$SCARCELAB_DATA``, then
    ``~/.cache/scarcelab`` (a cache, because everything there can be fetched again).
    The folder is not created here: reading an existing local copy must not need write
    access.
    """
    if data_dir is not None and str(data_dir) != "":
        return Path(data_dir).expanduser()
    env = os.environ.get(ENV_DATA_ROOT, "")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "scarcelab"


ENV_CACHE_ROOT = "SCARCELAB_CACHE"


def cache_root() -> Path:
    """Where scarcelab keeps what it computed (encodings of ``encoded_*`` AL sets and of
    ``probe``): ``$SCARCELAB_CACHE``, else ``$XDG_CACHE_HOME/scarcelab`` (the XDG Base
    Directory rule for user caches), else ``~/.cache/scarcelab``.

    Never the data root: a user's data folder may be shared or read-only, and what is
    derived from it is not data. (With neither variable set both are ``~/.cache/
    scarcelab``; the encodings then sit in its ``encoded/`` folder, as before.)
    """
    env = os.environ.get(ENV_CACHE_ROOT, "")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "scarcelab"


def md5sum(path: str | os.PathLike[str], chunk_size: int = _CHUNK) -> str:
    """Hex md5 of a file, read in chunks so multi-GB files do not need to fit in memory."""
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        while chunk := fh.read(chunk_size):
            h.update(chunk)
    return h.hexdigest()


def _manual_hint(dest: Path) -> str:
    return (
        f"Without network access, fetch the file by other means and place it at {dest}, "
        f"or set {ENV_DATA_ROOT} (or pass data_dir) to a folder that already holds "
        f"{dest.name}."
    )


def download(
    url: str,
    dest: str | os.PathLike[str],
    md5: str | None = None,
    progress: bool = True,
    *,
    timeout: float = 60.0,
    hint: str | None = None,
) -> Path:
    """Download ``url`` to ``dest`` atomically, verifying ``md5`` when given.

    The bytes go to a temporary file in ``dest``'s folder (same filesystem, so the final
    ``os.replace`` is atomic) while the md5 is computed on the fly. A progress bar is shown
    on stderr only when ``progress`` is true and stderr is a terminal, so logs of batch
    jobs stay clean. ``hint`` is appended to failure messages (e.g. the dataset's home
    page). Returns ``dest``.

    Raises :class:`DataError` when the transfer fails (naming the URL and where to put the
    file by hand), when it is truncated, or when the checksum of the fresh download does
    not match (the partial file is deleted in every case).
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    extra = f" {hint}" if hint else ""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            response = _open(url, dest, timeout, extra)
            with response:
                length = response.headers.get("Content-Length")
                total = int(length) if length and length.isdigit() else None
                show = progress and sys.stderr.isatty()
                received, got = _stream(response, out, url, dest, total, show, extra)
        _check_received(url, dest, received, total, got, md5, extra)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _open(url: str, dest: Path, timeout: float, extra: str) -> Any:
    """The server's response, or a :class:`DataError` that says how to do without it (a
    connection refused or a 404 is where a user without network access first lands)."""
    request = urllib.request.Request(url, headers={"User-Agent": "scarcelab"})
    try:
        return urllib.request.urlopen(request, timeout=timeout)
    except _NETWORK_ERRORS as exc:
        raise DataError(
            f"download of {url} failed: {exc}. {_manual_hint(dest)}{extra}"
        ) from exc


def _stream(response: Any, out: IO[bytes], url: str, dest: Path, total: int | None,
            show: bool, extra: str) -> tuple[int, str]:
    """Copy the body to ``out`` in chunks, hashing on the fly so a multi-GB file is read
    once; returns (bytes received, hex md5)."""
    hasher = hashlib.md5(usedforsecurity=False)
    received = 0
    with tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=dest.name,
        file=sys.stderr,
        disable=not show,
        leave=False,
    ) as bar:
        while True:
            try:
                chunk = response.read(_CHUNK)
            except _NETWORK_ERRORS as exc:
                raise DataError(
                    f"download of {url} failed after {received} bytes: {exc}. "
                    f"{_manual_hint(dest)}{extra}"
                ) from exc
            if not chunk:
                break
            out.write(chunk)
            hasher.update(chunk)
            received += len(chunk)
            bar.update(len(chunk))
    return received, hasher.hexdigest()


def _check_received(url: str, dest: Path, received: int, total: int | None, got: str,
                    md5: str | None, extra: str) -> None:
    """Refuse a short or corrupted transfer before it is renamed into place: a file at
    ``dest`` is trusted by every later run. A short one is reported as such first, since
    its checksum cannot match either."""
    if total is not None and received != total:
        raise DataError(
            f"download of {url} was truncated: got {received} of {total} bytes. "
            f"Try again. {_manual_hint(dest)}{extra}"
        )
    if md5 is not None and got != md5.lower():
        raise DataError(
            f"checksum mismatch for {url}: expected md5 {md5.lower()}, got {got}; the "
            f"download was deleted. The server may serve a different version, or the "
            f"transfer was corrupted.{extra}"
        )


__all__ = ["ENV_DATA_ROOT", "data_root", "download", "md5sum"]
