"""Behaviour guard for ``download``: what it asks of urllib and tqdm, what it leaves on disk
and the exact message (and cause) of each failure, recorded on the code before it was
restructured. urllib and tqdm are replaced by recorders, so every branch (a read failing
midway, a non-numeric Content-Length, a terminal) runs in milliseconds without a server."""

from __future__ import annotations

import hashlib
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import scarcelab.data.download as dl

BODY = b"0123456789" * 5


class _Response:
    """Serves ``chunks`` (bytes, or an exception to raise at that read) and logs its use."""

    def __init__(self, log: list, chunks: list, length: str | None) -> None:
        self.log, self.chunks = log, list(chunks)
        self.headers = {} if length is None else {"Content-Length": length}

    def __enter__(self) -> _Response:
        self.log.append(("response.enter",))
        return self

    def __exit__(self, *exc: object) -> None:
        self.log.append(("response.exit", exc[0].__name__ if exc[0] else None))

    def read(self, n: int) -> bytes:
        self.log.append(("read", n))
        item = self.chunks.pop(0) if self.chunks else b""
        if isinstance(item, BaseException):
            raise item
        return item


class _Bar:
    def __init__(self, log: list, **kwargs: object) -> None:
        self.log = log
        shown = {k: ("stderr" if v is sys.stderr else v) for k, v in kwargs.items()}
        log.append(("tqdm", sorted(shown.items())))

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.log.append(("tqdm.exit", exc[0].__name__ if exc[0] else None))

    def update(self, n: int) -> None:
        self.log.append(("update", n))


def _run(monkeypatch: pytest.MonkeyPatch, folder: Path, *, chunks=(BODY,), length="50",
         open_error: BaseException | None = None, tty: bool = False, existing: bytes | None = None,
         **kwargs: object) -> tuple:
    log: list = []

    def urlopen(request: urllib.request.Request, timeout: float) -> _Response:
        log.append(("urlopen", request.full_url, sorted(request.header_items()), timeout))
        if open_error is not None:
            raise open_error
        return _Response(log, list(chunks), length)

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(dl, "tqdm", lambda **kw: _Bar(log, **kw))
    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty, raising=False)
    dest = folder / "sub" / "f.bin"
    if existing is not None:
        dest.parent.mkdir(parents=True)
        dest.write_bytes(existing)
    try:
        got = dl.download("http://h/f.bin", str(dest), **kwargs)  # type: ignore[arg-type]
        result: tuple = ("ok", type(got).__name__, got == dest)
    except Exception as e:  # noqa: BLE001 - the failure is the behaviour pinned
        cause = type(e.__cause__).__name__ if e.__cause__ else None
        result = ("error", type(e).__name__, str(e).replace(str(dest), "<DEST>"), cause)
    files = sorted((p.name, p.read_bytes()) for p in dest.parent.iterdir()) \
        if dest.parent.exists() else None
    return result, files, log


MD5 = hashlib.md5(BODY).hexdigest()
TWO = (BODY[:20], BODY[20:])
CASES = {
    "ok_md5_upper": dict(md5=MD5.upper(), progress=False),
    "ok_two_chunks_no_md5": dict(chunks=TWO),
    "ok_no_length": dict(length=None, md5=MD5),
    "ok_length_not_numeric": dict(length="abc", chunks=(BODY[:7],)),
    "ok_terminal_progress": dict(tty=True, timeout=3.5),
    "ok_terminal_no_progress": dict(tty=True, progress=False),
    "ok_replaces_existing": dict(existing=b"old"),
    "err_open_urlerror": dict(open_error=urllib.error.URLError("no route"), hint="See x."),
    "err_open_timeout": dict(open_error=TimeoutError("timed out")),
    "err_open_other": dict(open_error=ValueError("unknown url type")),
    "err_read_reset": dict(chunks=(BODY[:20], ConnectionResetError("reset")), hint="H."),
    "err_read_other": dict(chunks=(BODY[:20], ValueError("odd"))),
    "err_truncated": dict(length="60", hint="Home: y.", existing=b"old"),
    "err_md5": dict(md5="0" * 32, hint="Home: y."),
    "err_md5_upper_expected": dict(md5="AB" * 16),
    "err_truncated_and_md5": dict(length="51", md5="0" * 32),
}

# recorded on the code before download was split into helpers
EXPECTED: dict[str, tuple] = {
    'err_md5': (
        ('error', 'DataError',
         'checksum mismatch for http://h/f.bin: expected md5 00000000000000000000000000000000, '
         'got baed005300234f3d1503c50a48ce8e6f; the download was deleted. The server may serve '
         'a different version, or the transfer was corrupted. Home: y.',
         None),
        [],
        [('urlopen', 'http://h/f.bin', [('User-agent', 'scarcelab')], 60.0),
         ('response.enter',),
         ('tqdm',
          [('desc', 'f.bin'), ('disable', True), ('file', 'stderr'), ('leave', False),
           ('total', 50), ('unit', 'B'), ('unit_divisor', 1024), ('unit_scale', True)]),
         ('read', 1048576), ('update', 50), ('read', 1048576), ('tqdm.exit', None),
         ('response.exit', None)],
    ),
    'err_md5_upper_expected': (
        ('error', 'DataError',
         'checksum mismatch for http://h/f.bin: expected md5 abababababababababababababababab, '
         'got baed005300234f3d1503c50a48ce8e6f; the download was deleted. The server may serve '
         'a different version, or the transfer was corrupted.',
         None),
        [],
        [('urlopen', 'http://h/f.bin', [('User-agent', 'scarcelab')], 60.0),
         ('response.enter',),
         ('tqdm',
          [('desc', 'f.bin'), ('disable', True), ('file', 'stderr'), ('leave', False),
           ('total', 50), ('unit', 'B'), ('unit_divisor', 1024), ('unit_scale', True)]),
         ('read', 1048576), ('update', 50), ('read', 1048576), ('tqdm.exit', None),
         ('response.exit', None)],
    ),
    'err_open_other': (
        ('error', 'ValueError', 'unknown url type', None),
        [],
        [('urlopen', 'http://h/f.bin', [('User-agent', 'scarcelab')], 60.0)],
    ),
    'err_open_timeout': (
        ('error', 'DataError',
         'download of http://h/f.bin failed: timed out. Without network access, fetch the file '
         'by other means and place it at <DEST>, or set SCARCELAB_DATA (or pass data_dir) to a '
         'folder that already holds f.bin.',
         'TimeoutError'),
        [],
        [('urlopen', 'http://h/f.bin', [('User-agent', 'scarcelab')], 60.0)],
    ),
    'err_open_urlerror': (
        ('error', 'DataError',
         'download of http://h/f.bin failed: <urlopen error no route>. Without network access, '
         'fetch the file by other means and place it at <DEST>, or set SCARCELAB_DATA (or pass '
         'data_dir) to a folder that already holds f.bin. See x.',
         'URLError'),
        [],
        [('urlopen', 'http://h/f.bin', [('User-agent', 'scarcelab')], 60.0)],
    ),
    'err_read_other': (
        ('error', 'ValueError', 'odd', None),
        [],
        [('urlopen', 'http://h/f.bin', [('User-agent', 'scarcelab')], 60.0),
         ('response.enter',),
         ('tqdm',
          [('desc', 'f.bin'), ('disable', True), ('file', 'stderr'), ('leave', False),
           ('total', 50), ('unit', 'B'), ('unit_divisor', 1024), ('unit_scale', True)]),
         ('read', 1048576), ('update', 20), ('read', 1048576), ('tqdm.exit', 'ValueError'),
         ('response.exit', 'ValueError')],
    ),
    'err_read_reset': (
        ('error', 'DataError',
         'download of http://h/f.bin failed after 20 bytes: reset. Without network access, '
         'fetch the file by other means and place it at <DEST>, or set SCARCELAB_DATA (or pass '
         'data_dir) to a folder that already holds f.bin. H.',
         'ConnectionResetError'),
        [],
        [('urlopen', 'http://h/f.bin', [('User-agent', 'scarcelab')], 60.0),
         ('response.enter',),
         ('tqdm',
          [('desc', 'f.bin'), ('disable', True), ('file', 'stderr'), ('leave', False),
           ('total', 50), ('unit', 'B'), ('unit_divisor', 1024), ('unit_scale', True)]),
         ('read', 1048576), ('update', 20), ('read', 1048576), ('tqdm.exit', 'DataError'),
         ('response.exit', 'DataError')],
    ),
    'err_truncated': (
        ('error', 'DataError',
         'download of http://h/f.bin was truncated: got 50 of 60 bytes. Try again. Without '
         'network access, fetch the file by other means and place it at <DEST>, or set '
         'SCARCELAB_DATA (or pass data_dir) to a folder that already holds f.bin. Home: y.',
         None),
        [('f.bin', b'old')],
        [('urlopen', 'http://h/f.bin', [('User-agent', 'scarcelab')], 60.0),
         ('response.enter',),
         ('tqdm',
          [('desc', 'f.bin'), ('disable', True), ('file', 'stderr'), ('leave', False),
           ('total', 60), ('unit', 'B'), ('unit_divisor', 1024), ('unit_scale', True)]),
         ('read', 1048576), ('update', 50), ('read', 1048576), ('tqdm.exit', None),
         ('response.exit', None)],
    ),
    'err_truncated_and_md5': (
        ('error', 'DataError',
         'download of http://h/f.bin was truncated: got 50 of 51 bytes. Try again. Without '
         'network access, fetch the file by other means and place it at <DEST>, or set '
         'SCARCELAB_DATA (or pass data_dir) to a folder that already holds f.bin.',
         None),
        [],
        [('urlopen', 'http://h/f.bin', [('User-agent', 'scarcelab')], 60.0),
         ('response.enter',),
         ('tqdm',
          [('desc', 'f.bin'), ('disable', True), ('file', 'stderr'), ('leave', False),
           ('total', 51), ('unit', 'B'), ('unit_divisor', 1024), ('unit_scale', True)]),
         ('read', 1048576), ('update', 50), ('read', 1048576), ('tqdm.exit', None),
         ('response.exit', None)],
    ),
    'ok_length_not_numeric': (
        ('ok', 'PosixPath', True),
        [('f.bin', b'0123456')],
        [('urlopen', 'http://h/f.bin', [('User-agent', 'scarcelab')], 60.0),
         ('response.enter',),
         ('tqdm',
          [('desc', 'f.bin'), ('disable', True), ('file', 'stderr'), ('leave', False),
           ('total', None), ('unit', 'B'), ('unit_divisor', 1024), ('unit_scale', True)]),
         ('read', 1048576), ('update', 7), ('read', 1048576), ('tqdm.exit', None),
         ('response.exit', None)],
    ),
    'ok_md5_upper': (
        ('ok', 'PosixPath', True),
        [('f.bin', b'01234567890123456789012345678901234567890123456789')],
        [('urlopen', 'http://h/f.bin', [('User-agent', 'scarcelab')], 60.0),
         ('response.enter',),
         ('tqdm',
          [('desc', 'f.bin'), ('disable', True), ('file', 'stderr'), ('leave', False),
           ('total', 50), ('unit', 'B'), ('unit_divisor', 1024), ('unit_scale', True)]),
         ('read', 1048576), ('update', 50), ('read', 1048576), ('tqdm.exit', None),
         ('response.exit', None)],
    ),
    'ok_no_length': (
        ('ok', 'PosixPath', True),
        [('f.bin', b'01234567890123456789012345678901234567890123456789')],
        [('urlopen', 'http://h/f.bin', [('User-agent', 'scarcelab')], 60.0),
         ('response.enter',),
         ('tqdm',
          [('desc', 'f.bin'), ('disable', True), ('file', 'stderr'), ('leave', False),
           ('total', None), ('unit', 'B'), ('unit_divisor', 1024), ('unit_scale', True)]),
         ('read', 1048576), ('update', 50), ('read', 1048576), ('tqdm.exit', None),
         ('response.exit', None)],
    ),
    'ok_replaces_existing': (
        ('ok', 'PosixPath', True),
        [('f.bin', b'01234567890123456789012345678901234567890123456789')],
        [('urlopen', 'http://h/f.bin', [('User-agent', 'scarcelab')], 60.0),
         ('response.enter',),
         ('tqdm',
          [('desc', 'f.bin'), ('disable', True), ('file', 'stderr'), ('leave', False),
           ('total', 50), ('unit', 'B'), ('unit_divisor', 1024), ('unit_scale', True)]),
         ('read', 1048576), ('update', 50), ('read', 1048576), ('tqdm.exit', None),
         ('response.exit', None)],
    ),
    'ok_terminal_no_progress': (
        ('ok', 'PosixPath', True),
        [('f.bin', b'01234567890123456789012345678901234567890123456789')],
        [('urlopen', 'http://h/f.bin', [('User-agent', 'scarcelab')], 60.0),
         ('response.enter',),
         ('tqdm',
          [('desc', 'f.bin'), ('disable', True), ('file', 'stderr'), ('leave', False),
           ('total', 50), ('unit', 'B'), ('unit_divisor', 1024), ('unit_scale', True)]),
         ('read', 1048576), ('update', 50), ('read', 1048576), ('tqdm.exit', None),
         ('response.exit', None)],
    ),
    'ok_terminal_progress': (
        ('ok', 'PosixPath', True),
        [('f.bin', b'01234567890123456789012345678901234567890123456789')],
        [('urlopen', 'http://h/f.bin', [('User-agent', 'scarcelab')], 3.5), ('response.enter',),
         ('tqdm',
          [('desc', 'f.bin'), ('disable', False), ('file', 'stderr'), ('leave', False),
           ('total', 50), ('unit', 'B'), ('unit_divisor', 1024), ('unit_scale', True)]),
         ('read', 1048576), ('update', 50), ('read', 1048576), ('tqdm.exit', None),
         ('response.exit', None)],
    ),
    'ok_two_chunks_no_md5': (
        ('ok', 'PosixPath', True),
        [('f.bin', b'01234567890123456789012345678901234567890123456789')],
        [('urlopen', 'http://h/f.bin', [('User-agent', 'scarcelab')], 60.0),
         ('response.enter',),
         ('tqdm',
          [('desc', 'f.bin'), ('disable', True), ('file', 'stderr'), ('leave', False),
           ('total', 50), ('unit', 'B'), ('unit_divisor', 1024), ('unit_scale', True)]),
         ('read', 1048576), ('update', 20), ('read', 1048576), ('update', 30),
         ('read', 1048576), ('tqdm.exit', None), ('response.exit', None)],
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_download_outcome_is_unchanged(name: str, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    assert _run(monkeypatch, tmp_path, **CASES[name]) == EXPECTED[name]
