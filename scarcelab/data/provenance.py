"""Which data files a run read: resolved absolute paths and sha256, for the run's record.

A number is only as good as the bytes it was computed from; a run must say which bytes.
Loaders call :func:`record` with every file they resolve (every call, also when they serve
the decoded arrays from a per-process cache), and the entry point logs :func:`used` with
the run (``data_files.json``) and then :func:`reset` s the list for the next run of the
process. A loader that had to look somewhere other than where the user pointed calls
:func:`fallback`, which says so on stderr and marks the record.

Hashes are cached per (path, size, mtime), so a sweep that loads the same file for each
child run hashes it once.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

_USED: dict[str, dict[str, Any]] = {}
_HASHES: dict[tuple[str, int, int], str] = {}
#: what a loader of many files says about them (:func:`describe`)
_DESCRIBED: dict[str, Any] = {}


def sha256_file(path: Path) -> str:
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _HASHES:
        h = hashlib.sha256()
        with path.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
        _HASHES[key] = h.hexdigest()
    return _HASHES[key]


def record(path: str | Path, role: str = "", note: str = "") -> Path:
    """Note that ``path`` was read (``role``: e.g. train/test); returns the resolved path."""
    p = Path(path).expanduser().resolve()
    entry = _USED.setdefault(str(p), {"path": str(p), "bytes": p.stat().st_size,
                                      "sha256": sha256_file(p), "roles": []})
    if role and role not in entry["roles"]:
        entry["roles"].append(role)
    if note:
        entry["note"] = note
    return p


def fallback(wanted: str | Path, used: str | Path, what: str) -> str:
    """Say loudly that ``what`` is read from ``used`` because ``wanted`` lacks it; returns
    the note to :func:`record` with those files."""
    print(f"[scarcelab] warning: {what}: not found in {wanted}; using {used} instead "
          "(pass --data-dir to choose the folder)", file=sys.stderr, flush=True)
    return f"fallback: not found in {wanted}"


def used() -> list[dict[str, Any]]:
    """The files recorded since the last :func:`reset`, in the order first read."""
    return [dict(v) for v in _USED.values()]


def reset() -> None:
    _USED.clear()
    _DESCRIBED.clear()


def describe(params: dict[str, Any], tags: dict[str, str], manifest: dict[str, Any]) -> None:
    """What a loader of a user's many image files (``scarcelab.data.own``) says about them,
    for the next run: params (the transform, the cache key, counts), tags and a manifest
    (each file's relative path and sha256). Why not :func:`record` per image: thousands of
    absolute paths in ``data_files.json`` and its tag, where one artifact lists them
    relative to the data folder (which a copy elsewhere shares). The last call wins."""
    _DESCRIBED.update(params=dict(params), tags=dict(tags), manifest=manifest)


def described() -> dict[str, Any]:
    """``{"params", "tags", "manifest"}`` of the last :func:`describe` since the last
    :func:`reset`, or ``{}``."""
    return dict(_DESCRIBED)


def summary(files: list[dict[str, Any]], limit: int = 5000) -> str:
    """One line per file for a run tag: ``<sha256[:16]> <path>``."""
    text = "\n".join(f"{f['sha256'][:16]} {f['path']}" for f in files)
    return text if len(text) <= limit else text[: limit - 3] + "..."
