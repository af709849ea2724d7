"""``cifair10``: the ciFAIR-10 split of the "Tune It or Don't Use It" benchmark (gem
``gem/datasets/cifair.py``, ``datasets/cifair/README.md``): ``train`` = the first 30
training images of each class in CIFAR order (``data_batch_1`` … ``data_batch_5``
concatenated), ``val`` = the following 20 (``trainval`` = 50 per class, 500 images),
``test`` = ciFAIR-10's 10,000-image test set.

ciFAIR-10 (Barz & Denzler, "Do We Train on Test Data? Purging CIFAR of Near-Duplicates",
J. Imaging 2020; cvjena.github.io/cifair) keeps CIFAR-10's training set and replaces the
3.25 % of its test images that have near-duplicates in the training set. The archive is
the official release (``cvjena/cifair`` ``loaders/pytorch/cifair.py``: URL and md5), in
CIFAR's python-batch layout; every member is checked against its md5 (the training
batches and ``batches.meta`` are CIFAR-10's, whose md5s torchvision's ``CIFAR10`` lists;
``test_batch`` is ciFAIR's own). The batches are Python pickles: they are read by an
unpickler that admits only the globals a CIFAR batch holds (numpy's array
reconstruction and ``_codecs.encode``) and refuses anything else before it can run — the
rule ``torch.load(weights_only=True)`` applies to checkpoints.

Where: ``<data root>/cifair10/ciFAIR-10.zip`` (downloaded when missing) or its extracted
``ciFAIR-10/`` folder. When neither is there but CIFAR-10 JPEG re-encodings are
(``cifar10_jpg/``, as on the project machines' ``../shared/data``), those are used instead,
loudly: their test set is CIFAR-10's, which still holds the near-duplicates, the training
order is the JPEG file number (whether that is CIFAR order cannot be checked without the
batches), and JPEG changes pixels. The dataset's ``notes`` (run tags ``scarcelab.test_set``,
``scarcelab.train_order``) and Table 3 say so.
"""

from __future__ import annotations

import io
import pickle
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from scarcelab.data import DATASETS
from scarcelab.data import provenance as _provenance
from scarcelab.data.bundle import RawDataset
from scarcelab.data.download import data_root, download, md5sum
from scarcelab.data.ood import find_shared_file
from scarcelab.data.sources.cifar10_5k import CLASSES, ZIPS, _read_zip
from scarcelab.errors import DataError

PER_CLASS = {"train": 30, "val": 20}
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))


@dataclass(frozen=True)
class CifairArchive:
    """Where the ciFAIR-10 release is and what its bytes must be."""

    url: str = "https://github.com/cvjena/cifair/releases/download/v1.0/ciFAIR-10.zip"
    filename: str = "ciFAIR-10.zip"
    md5: str = "ca08fd390f0839693d3fc45c4e49585f"  # cvjena/cifair loaders/pytorch/cifair.py
    folder: str = "ciFAIR-10"  # the archive's top folder
    members: dict[str, str] = field(default_factory=lambda: {
        # CIFAR-10's (torchvision.datasets.CIFAR10.train_list / .meta): ciFAIR keeps them
        "data_batch_1": "c99cafc152244af753f735de768cd75f",
        "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
        "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
        "data_batch_4": "634d18415352ddfa80567beed471001a",
        "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
        "batches.meta": "5ff9c542aee3614f3951f8cda6e48888",
        # ciFAIR-10's own test set (cvjena/cifair loaders/pytorch/cifair.py test_list)
        "test_batch": "01290e6b622a1977a000eff13650aca2",
    })


CIFAIR10 = CifairArchive()

# the globals a CIFAR python batch refers to (numpy 1.x and 2.x spellings)
_ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
            ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}


class _BatchUnpickler(pickle.Unpickler):
    """Resolves only :data:`_ALLOWED`; any other global (the way a pickle runs code) is a
    :class:`DataError` raised before it is called."""

    def __init__(self, fh: io.BufferedIOBase, path: Path) -> None:
        super().__init__(fh, encoding="latin1")  # CIFAR batches are Python 2 pickles
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise DataError(f"{self.path}: refusing to unpickle {module}.{name} — a CIFAR "
                            "batch holds only numpy arrays and lists; the file is not a "
                            "ciFAIR-10 batch (delete it to download the archive again)")
        if name == "_reconstruct":
            from numpy._core import multiarray

            return multiarray._reconstruct
        if module == "_codecs":
            import codecs

            return codecs.encode
        return getattr(np, name)


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 images (N, 3, 32, 32), int64 labels) of one CIFAR python batch."""
    with path.open("rb") as fh:
        try:
            entry = _BatchUnpickler(fh, path).load()
        except (pickle.UnpicklingError, EOFError, ValueError) as e:
            raise DataError(f"{path}: not a readable CIFAR batch ({e}); delete it to "
                            "download the archive again") from e
    if not isinstance(entry, dict):
        raise DataError(f"{path}: a CIFAR batch is a dict, got {type(entry).__name__}")
    data, labels = entry.get("data"), entry.get("labels")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 \
            or data.shape[1] != 3 * 32 * 32 or labels is None or len(labels) != len(data):
        raise DataError(f"{path}: expected 'data' uint8 (N, 3072) and N 'labels'")
    y = np.asarray(labels, dtype=np.int64)
    if y.min() < 0 or y.max() >= len(CLASSES):
        raise DataError(f"{path}: labels outside 0..{len(CLASSES) - 1}")
    return data.reshape(-1, 3, 32, 32), y


def fetch_cifair(folder: Path, archive: CifairArchive = CIFAIR10) -> Path:
    """``folder/<archive.folder>`` with every member checked against its md5; downloads
    (md5-verified, atomically) and extracts the archive when needed."""
    target = folder / archive.folder
    if not all((target / m).exists() for m in archive.members):
        zpath = folder / archive.filename
        if not zpath.exists():
            download(archive.url, zpath, archive.md5,
                     hint="(ciFAIR-10, cvjena.github.io/cifair; or put the release zip "
                          f"there: {archive.filename}, md5 {archive.md5})")
        elif md5sum(zpath) != archive.md5:
            raise DataError(f"{zpath}: md5 {md5sum(zpath)} differs from the ciFAIR-10 release "
                            f"({archive.md5}); delete it to download the release again")
        with zipfile.ZipFile(zpath) as z:
            want = {f"{archive.folder}/{m}" for m in archive.members}
            absent = sorted(want - set(z.namelist()))
            if absent:
                raise DataError(f"{zpath} lacks {absent[0]}; not the ciFAIR-10 release")
            for m in sorted(want):
                z.extract(m, folder)
    for m, md5 in archive.members.items():
        got = md5sum(target / m)
        if got != md5:
            raise DataError(f"{target / m}: md5 {got}, the ciFAIR-10 release has {md5}; "
                            f"delete {target} to extract the archive again")
    return target


def first_per_class(y: np.ndarray, start: int, count: int) -> np.ndarray:
    """Indices of the images ``start .. start+count-1`` of every class, in input order,
    class by class (gem ``ciFAIR10``: ``class_members[lbl][start:end]`` concatenated)."""
    out = []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        if len(idx) < start + count:
            raise ValueError(f"class {c} has {len(idx)} images, need {start + count}")
        out.append(idx[start:start + count])
    return np.concatenate(out)


def _split(x: np.ndarray, y: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    tr = first_per_class(y, 0, PER_CLASS["train"])
    va = first_per_class(y, PER_CLASS["train"], PER_CLASS["val"])
    return {"train": (x[tr], y[tr]), "val": (x[va], y[va])}


def load_official(folder: Path, archive: CifairArchive = CIFAIR10) -> RawDataset:
    target = fetch_cifair(folder, archive)
    parts = [read_batch(_provenance.record(target / b, role="train")) for b in TRAIN_BATCHES]
    x, y = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    xte, yte = read_batch(_provenance.record(target / "test_batch", role="test"))
    s = _split(x, y)
    return RawDataset(name="cifair10", train_x=s["train"][0], train_y=s["train"][1],
                      val_x=s["val"][0], val_y=s["val"][1], test_x=xte, test_y=yte,
                      num_classes=10, class_names=list(CLASSES),
                      source=f"{target} (ciFAIR-10 v1.0; gem split)", md5=archive.md5,
                      notes={"test_set": "ciFAIR-10", "train_order": "CIFAR"})


def _cifar10_jpgs(data_dir: str | Path | None) -> tuple[Path, Path] | None:
    try:
        return find_shared_file(ZIPS["train"], data_dir), find_shared_file(ZIPS["test"], data_dir)
    except DataError:
        return None


def load_jpg_standin(train_zip: Path, test_zip: Path, wanted: Path) -> RawDataset:
    """The split cut from CIFAR-10 JPEG re-encodings; CIFAR-10's test set (see the module
    docstring), said on stderr and in the dataset's notes."""
    print(f"[scarcelab] warning: cifair10: ciFAIR-10 is not under {wanted}; using the "
          f"CIFAR-10 JPEGs of {train_zip.parent} instead — the test set is CIFAR-10's "
          "(with its near-duplicates of training images), not ciFAIR-10's; put "
          f"{CIFAIR10.filename} ({CIFAIR10.url}) there to use ciFAIR-10",
          file=sys.stderr, flush=True)
    (x, y), (xte, yte) = _read_zip(train_zip), _read_zip(test_zip)
    s = _split(x, y)
    return RawDataset(name="cifair10", train_x=s["train"][0], train_y=s["train"][1],
                      val_x=s["val"][0], val_y=s["val"][1], test_x=xte, test_y=yte,
                      num_classes=10, class_names=list(CLASSES),
                      source=f"{train_zip} (CIFAR-10 JPEGs, CIFAR-10 test set; gem split)",
                      notes={"test_set": "CIFAR-10", "train_order": "JPEG file number"})


@DATASETS.register("cifair10")
def load_cifair10(data_dir: str | Path | None = None,
                  archive: CifairArchive = CIFAIR10) -> RawDataset:
    folder = data_root(data_dir) / "cifair10"
    have = (folder / archive.filename).exists() or (folder / archive.folder / "test_batch").exists()
    if not have:
        jpgs = _cifar10_jpgs(data_dir)
        if jpgs is not None:
            return load_jpg_standin(*jpgs, folder)
    return load_official(folder, archive)
