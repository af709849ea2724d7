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


def _parse_lines(path: Path) -> tuple[list[float], list[list[tuple[int, float]]]]:
    labels: list[float] = []
    rows: list[list[tuple[int, float]]] = []
    with path.open("r", encoding="ascii", errors="strict") as fh:
        for lineno, raw in enumerate(fh, start=1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            tokens = line.split()
            try:
                label = float(tokens[0])
            except ValueError:
                raise DataError(f"{path}:{lineno}: label {tokens[0]!r} is not a number; "
                                "is this a LibSVM file?") from None
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
                if idx <= last:
                    raise DataError(f"{path}:{lineno}: feature index {idx} is not 1-based and "
                                    f"strictly increasing (previous {last})")
                last = idx
                feats.append((idx, val))
            labels.append(label)
            rows.append(feats)
    if not rows:
        raise DataError(f"{path}: no samples found (empty LibSVM file)")
    return labels, rows


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
    labels, rows = _parse_lines(path)
    width = max((r[-1][0] for r in rows if r), default=0)
    if n_features is not None:
        if width > n_features:
            raise DataError(f"{path}: feature index {width} exceeds n_features={n_features}")
        width = n_features
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
    if tr.x.shape[1] < width:
        tr = read_libsvm(train, n_features=width)
    if te.x.shape[1] < width:
        te = read_libsvm(test, n_features=width, classes=tr.classes)
    return tr, te
