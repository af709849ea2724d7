"""Reader for the LibSVM sparse text format (``label idx:value idx:value ...``).

The LibSVM collection (splice, dna, usps, ...) is the common currency of tabular
active-learning benchmarks, so one strict reader serves all of them instead of a loader per
dataset. Strict, because a silently mis-parsed row (a stray token, a 0-based index) changes a
benchmark's numbers without any error; every problem is reported with file and line.

Format rules followed (as written by LibSVM's own tools): one sample per line; the first
token is the label (an integer or float; ``+1``/``-1`` for binary sets); the rest are
``index:value`` pairs with 1-based, strictly increasing indices; features not listed are 0;
``#`` starts a comment; blank lines are ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scarcelab.errors import DataError


@dataclass
class LibSVMData:
    """Dense features plus class indices; ``classes`` maps index -> the file's label."""

    x: np.ndarray  # (N, D) float32
    y: np.ndarray  # (N,) int64 class indices 0..K-1
    classes: np.ndarray  # (K,) the original label values, sorted

    @property
    def num_classes(self) -> int:
        return len(self.classes)


#: Largest dense matrix a LibSVM file may expand to (bytes, float32). One stray line with an
#: index like 10**9 would otherwise allocate gigabytes before anything could complain.
MAX_DENSE_BYTES = 2 * 1024**3


def _parse_lines(path: Path) -> tuple[list[float], list[list[tuple[int, float]]], int]:
    """Labels, rows and the line number of the largest feature index."""
    labels: list[float] = []
    rows: list[list[tuple[int, float]]] = []
    top, top_line = 0, 0
    with path.open("rb") as fh:
        for lineno, raw_bytes in enumerate(fh, start=1):
            try:
                raw = raw_bytes.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{lineno}: byte {raw_bytes[e.start]:#04x} at column "
                                f"{e.start + 1} is not UTF-8 text; is this a LibSVM text "
                                "file (not a binary or compressed one)?") from None
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            tokens = line.split()
            try:
                label = float(tokens[0])
            except ValueError:
                raise DataError(f"{path}:{lineno}: label {tokens[0]!r} is not a number; "
                                "is this a LibSVM file?") from None
            if not math.isfinite(label):
                raise DataError(f"{path}:{lineno}: label {tokens[0]!r} is not finite")
            feats: list[tuple[int, float]] = []
            last = 0
            for tok in tokens[1:]:
                idx_s, sep, val_s = tok.partition(":")
                try:
                    if not sep:
                        raise ValueError
                    idx, val = int(idx_s), float(val_s)
                except ValueError:
                    raise DataError(f"{path}:{lineno}: token {tok!r} is not 'index:value'"
                                    ) from None
                if not math.isfinite(val):
                    raise DataError(f"{path}:{lineno}: feature {idx} has the non-finite value "
                                    f"{val_s!r}; clean the file or drop the row")
                if idx <= last:
                    raise DataError(f"{path}:{lineno}: feature index {idx} is not 1-based and "
                                    f"strictly increasing (previous {last})")
                last = idx
                feats.append((idx, val))
            if last > top:
                top, top_line = last, lineno
            labels.append(label)
            rows.append(feats)
    if not rows:
        raise DataError(f"{path}: no samples found (empty LibSVM file)")
    return labels, rows, top_line


def _check_width(path: Path, n_rows: int, width: int, line: int) -> None:
    if n_rows * width * 4 > MAX_DENSE_BYTES:
        raise DataError(f"{path}:{line}: feature index {width} would make a dense "
                        f"{n_rows} x {width} matrix of {n_rows * width * 4 / 1024**3:.1f} GiB "
                        f"(limit {MAX_DENSE_BYTES / 1024**3:.0f} GiB); a corrupt line or not "
                        "a dense-able dataset")


def read_libsvm(
    path: str | Path,
    n_features: int | None = None,
    classes: np.ndarray | None = None,
) -> LibSVMData:
    """Read one LibSVM file into dense arrays.

    ``n_features`` fixes the width (a test split may not mention the last feature);
    ``classes`` fixes the label -> index map so that a train and a test file agree — pass
    the ``classes`` of the train split when reading its test split.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"LibSVM file {path} not found; pass data_dir= the folder holding it")
    labels, rows, top_line = _parse_lines(path)
    width = max((r[-1][0] for r in rows if r), default=0)
    if n_features is not None:
        if width > n_features:
            raise DataError(f"{path}:{top_line}: feature index {width} exceeds "
                            f"n_features={n_features}")
        width = n_features
    _check_width(path, len(rows), width, top_line)
    x = np.zeros((len(rows), width), dtype=np.float32)
    for i, feats in enumerate(rows):
        for idx, val in feats:
            x[i, idx - 1] = val
    lab = np.asarray(labels, dtype=np.float64)
    cls = np.unique(lab) if classes is None else np.asarray(classes, dtype=np.float64)
    y = np.searchsorted(cls, lab)
    bad = (y >= len(cls)) | (cls[np.minimum(y, len(cls) - 1)] != lab)
    if bad.any():
        raise DataError(f"{path}: label {lab[bad][0]:g} is not among the classes "
                        f"{cls.tolist()} of the training file")
    return LibSVMData(x=x, y=y.astype(np.int64), classes=cls)


def read_libsvm_pair(train: str | Path, test: str | Path) -> tuple[LibSVMData, LibSVMData]:
    """Read a train/test pair with a shared width and label map."""
    tr = read_libsvm(train)
    te = read_libsvm(test, classes=tr.classes)
    width = max(tr.x.shape[1], te.x.shape[1])
    if te.x.shape[1] > 2 * tr.x.shape[1] + 10:
        raise DataError(f"{test}: feature indices reach {te.x.shape[1]}, far beyond the "
                        f"{tr.x.shape[1]} features of the training file {train}; the test file "
                        "does not belong to it or has a corrupt line")
    if tr.x.shape[1] < width:
        tr = read_libsvm(train, n_features=width)
    if te.x.shape[1] < width:
        te = read_libsvm(test, n_features=width, classes=tr.classes)
    return tr, te
