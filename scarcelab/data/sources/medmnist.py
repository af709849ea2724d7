"""MedMNIST v3 2D datasets at 28x28, from the official ``<name>.npz`` files.

One info table drives everything: each entry is registered in ``DATASETS`` by the loop at
the bottom, so adding a dataset is one table row. Files are looked up under the data root
(``<root>/<name>.npz``, or ``<root>/medmnist/<name>.npz`` so that a root shared with other
sources works too) and downloaded from the official Zenodo record when absent.

A local file whose md5 differs from the official one is used with a warning rather than
rejected: re-saved copies (different compression, sample order, flat label arrays) are
common and scientifically equivalent, and the warning keeps the difference visible.
Everything else that is wrong with a file (unreadable, missing keys, wrong shapes,
labels out of range) is a :class:`DataError` naming the file, because training on it
would silently produce meaningless numbers.

Facts in the table (md5 values, class names, split sizes, tasks) are copied from the
``medmnist`` package's ``INFO`` (v3.0.2), https://github.com/MedMNIST/MedMNIST.

The positive class of the two binary sets is the disease: PneumoniaMNIST's ``pneumonia``
(label 1; INFO: "binary-class classification of pneumonia against normal") and
BreastMNIST's ``malignant`` (label 0; INFO's labels are ``{"0": "malignant", "1":
"normal, benign"}``, and its description calls the merged "normal and benign" class the
*positive* one — the opposite of what a screening metric needs). ChestMNIST is
multi-label and has none.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scarcelab.data import DATASETS, provenance
from scarcelab.data.bundle import RawDataset
from scarcelab.data.download import ENV_DATA_ROOT, data_root, download, md5sum
from scarcelab.errors import DataError

ENV_URL = "SCARCELAB_MEDMNIST_URL"
"""Environment variable overriding the download URL; a format string with ``{name}``."""

DEFAULT_URL = "https://zenodo.org/records/10519652/files/{name}.npz?download=1"
HOMEPAGE = "https://zenodo.org/records/10519652"
SIZE = 28
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class MedMNISTInfo:
    """What the loader needs to know about one MedMNIST 2D dataset.

    ``official_task`` is MedMNIST's own wording; ``task`` is what :class:`RawDataset`
    carries (``"multi-label"`` or ``"multi-class"``: binary and ordinal sets are trained
    as ordinary single-label classification).
    """

    official_task: str
    n_channels: int
    class_names: tuple[str, ...]
    md5: str
    n_samples: tuple[int, int, int]
    license: str = "CC BY 4.0"
    # binary sets: the class the task detects (the disease), by name — not MedMNIST's own
    # "positive", which for BreastMNIST is "normal, benign" (see its INFO description)
    positive: str | None = None

    @property
    def task(self) -> str:
        return "multi-label" if self.official_task.startswith("multi-label") else "multi-class"

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


_ORGANS = (
    "bladder",
    "femur-left",
    "femur-right",
    "heart",
    "kidney-left",
    "kidney-right",
    "liver",
    "lung-left",
    "lung-right",
    "pancreas",
    "spleen",
)

MEDMNIST_INFO: dict[str, MedMNISTInfo] = {
    "pathmnist": MedMNISTInfo(
        "multi-class",
        3,
        (
            "adipose",
            "background",
            "debris",
            "lymphocytes",
            "mucus",
            "smooth muscle",
            "normal colon mucosa",
            "cancer-associated stroma",
            "colorectal adenocarcinoma epithelium",
        ),
        "a8b06965200029087d5bd730944a56c1",
        (89996, 10004, 7180),
    ),
    "chestmnist": MedMNISTInfo(
        "multi-label, binary-class",
        1,
        (
            "atelectasis",
            "cardiomegaly",
            "effusion",
            "infiltration",
            "mass",
            "nodule",
            "pneumonia",
            "pneumothorax",
            "consolidation",
            "edema",
            "emphysema",
            "fibrosis",
            "pleural",
            "hernia",
        ),
        "02c8a6516a18b556561a56cbdd36c4a8",
        (78468, 11219, 22433),
    ),
    "dermamnist": MedMNISTInfo(
        "multi-class",
        3,
        (
            "actinic keratoses and intraepithelial carcinoma",
            "basal cell carcinoma",
            "benign keratosis-like lesions",
            "dermatofibroma",
            "melanoma",
            "melanocytic nevi",
            "vascular lesions",
        ),
        "0744692d530f8e62ec473284d019b0c7",
        (7007, 1003, 2005),
        "CC BY-NC 4.0",
    ),
    "octmnist": MedMNISTInfo(
        "multi-class",
        1,
        ("choroidal neovascularization", "diabetic macular edema", "drusen", "normal"),
        "c68d92d5b585d8d81f7112f81e2d0842",
        (97477, 10832, 1000),
    ),
    "pneumoniamnist": MedMNISTInfo(
        "binary-class",
        1,
        ("normal", "pneumonia"),
        "28209eda62fecd6e6a2d98b1501bb15f",
        (4708, 524, 624),
        positive="pneumonia",
    ),
    "retinamnist": MedMNISTInfo(
        "ordinal-regression",
        3,
        ("0", "1", "2", "3", "4"),
        "bd4c0672f1bba3e3a89f0e4e876791e4",
        (1080, 120, 400),
    ),
    "breastmnist": MedMNISTInfo(
        "binary-class",
        1,
        ("malignant", "normal, benign"),
        "750601b1f35ba3300ea97c75c52ff8f6",
        (546, 78, 156),
        positive="malignant",
    ),
    "bloodmnist": MedMNISTInfo(
        "multi-class",
        3,
        (
            "basophil",
            "eosinophil",
            "erythroblast",
            "immature granulocytes(myelocytes, metamyelocytes and promyelocytes)",
            "lymphocyte",
            "monocyte",
            "neutrophil",
            "platelet",
        ),
        "7053d0359d879ad8a5505303e11de1dc",
        (11959, 1712, 3421),
    ),
    "tissuemnist": MedMNISTInfo(
        "multi-class",
        1,
        (
            "Collecting Duct, Connecting Tubule",
            "Distal Convoluted Tubule",
            "Glomerular endothelial cells",
            "Interstitial endothelial cells",
            "Leukocytes",
            "Podocytes",
            "Proximal Tubule Segments",
            "Thick Ascending Limb",
        ),
        "ebe78ee8b05294063de985d821c1c34b",
        (165466, 23640, 47280),
    ),
    "organamnist": MedMNISTInfo(
        "multi-class", 1, _ORGANS, "68e3f8846a6bd62f0c9bf841c0d9eacc", (34561, 6491, 17778)
    ),
    "organcmnist": MedMNISTInfo(
        "multi-class", 1, _ORGANS, "b9ceb9546e10131b32923c5bbeaea2b1", (12975, 2392, 8216)
    ),
    "organsmnist": MedMNISTInfo(
        "multi-class", 1, _ORGANS, "9ab87b696fb54e2a387ebe992d6ed5f1", (13932, 2452, 8827)
    ),
}


def medmnist_url(name: str) -> str:
    """Download URL for ``name``: ``$SCARCELAB_MEDMNIST_URL`` (with ``{name}``) or Zenodo."""
    template = os.environ.get(ENV_URL, "") or DEFAULT_URL
    return template.format(name=name)


def _find_local(name: str, root: Path) -> Path | None:
    for candidate in (root / f"{name}.npz", root / "medmnist" / f"{name}.npz"):
        if candidate.is_file():
            return candidate
    return None


def _fetch(name: str, root: Path, url: str, md5: str | None, progress: bool) -> Path:
    dest = root / f"{name}.npz"
    hint = (
        f"{name}.npz is published at {HOMEPAGE} (also via `pip install medmnist`); "
        f"set {ENV_URL} to use a mirror."
    )
    try:
        return download(url, dest, md5=md5, progress=progress, hint=hint)
    except DataError as exc:
        raise DataError(
            f"{name}: {dest} does not exist and could not be downloaded. {exc}"
        ) from exc
    except OSError as exc:  # e.g. the data root is read-only
        raise DataError(
            f"{name}: {dest} does not exist and cannot be written ({exc}). Place {name}.npz "
            f"there by hand or set {ENV_DATA_ROOT} / data_dir to a writable folder. {hint}"
        ) from exc


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    keys = [f"{split}_{kind}" for split in SPLITS for kind in ("images", "labels")]
    fix = f"delete {path} to have it downloaded again, or replace it with the official file"
    from scarcelab.data.safe_read import load_npz

    try:
        return load_npz(path, keys, fix=fix)
    except DataError as e:  # say what the file was meant to be
        raise DataError(f"{e} (expected a MedMNIST .npz with {', '.join(keys)})") from None


def _images(arr: np.ndarray, path: Path, split: str, info: MedMNISTInfo) -> np.ndarray:
    """(N,H,W) or (N,H,W,C) as stored -> uint8 (N,C,H,W) as scarcelab uses."""
    c = info.n_channels
    if arr.ndim == 3 and c == 1:
        arr = arr[:, None]
    elif arr.ndim == 4 and arr.shape[-1] == c:
        arr = arr.transpose(0, 3, 1, 2)
    else:
        want = f"(N, {SIZE}, {SIZE})" if c == 1 else f"(N, {SIZE}, {SIZE}, {c})"
        raise DataError(f"{path}: {split}_images has shape {arr.shape}, expected {want}")
    if arr.shape[2:] != (SIZE, SIZE):
        raise DataError(
            f"{path}: {split}_images are {arr.shape[2]}x{arr.shape[3]}, expected {SIZE}x{SIZE} "
            f"(this loader reads the 28x28 files; {arr.shape[2]}px files are separate datasets)"
        )
    if arr.dtype != np.uint8 and arr.size:
        if not np.issubdtype(arr.dtype, np.integer) or arr.min() < 0 or arr.max() > 255:
            raise DataError(
                f"{path}: {split}_images have dtype {arr.dtype} and range "
                f"[{arr.min()}, {arr.max()}]; expected uint8 pixels in [0, 255]"
            )
    return np.ascontiguousarray(arr, dtype=np.uint8)


def _labels(arr: np.ndarray, n: int, path: Path, split: str, info: MedMNISTInfo) -> np.ndarray:
    """Flat (N,) or (N,1) class indices -> int64 (N,); multi-label stays (N,K)."""
    k = info.num_classes
    if info.task == "multi-label":
        if arr.shape != (n, k):
            raise DataError(f"{path}: {split}_labels has shape {arr.shape}, expected ({n}, {k})")
        allowed = (0, 1)
        valid_text = "{0, 1}"
    else:
        if arr.shape not in ((n,), (n, 1)):
            raise DataError(
                f"{path}: {split}_labels has shape {arr.shape}, expected ({n},) or ({n}, 1) "
                f"to match {n} {split}_images"
            )
        arr = arr.reshape(n)
        allowed = tuple(range(k))
        valid_text = f"[0, {k})"
    if not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.bool_)):
        if not np.issubdtype(arr.dtype, np.floating) or not np.all(np.isfinite(arr)):
            raise DataError(f"{path}: {split}_labels have dtype {arr.dtype}; expected integers")
        if np.any(arr != np.round(arr)):
            raise DataError(f"{path}: {split}_labels hold non-integer values; expected integers")
    bad = ~np.isin(arr, allowed)
    if bad.any():
        offending = np.unique(arr[bad])
        shown = ", ".join(str(v) for v in offending[:10].tolist())
        more = f" (+{offending.size - 10} more)" if offending.size > 10 else ""
        raise DataError(
            f"{path}: {split}_labels contain values outside {valid_text} for {k} classes: "
            f"{shown}{more} ({int(bad.sum())} entries)"
        )
    return arr.astype(np.int64)


def load_medmnist(
    name: str,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    url: str | None = None,
    md5: str | None = None,
    progress: bool = True,
) -> RawDataset:
    """Load MedMNIST dataset ``name`` (28x28), downloading it into the data root if absent.

    ``url`` overrides the download URL (default :func:`medmnist_url`); ``md5`` overrides
    the expected checksum (default the official one), which both the download check and
    the "local copy differs" warning use.
    """
    key = name.lower()
    if key not in MEDMNIST_INFO:
        valid = ", ".join(sorted(MEDMNIST_INFO))
        raise DataError(f"unknown MedMNIST dataset {name!r}; valid names: {valid}")
    info = MEDMNIST_INFO[key]
    expected_md5 = (md5 or info.md5).lower()
    root = data_root(data_dir)
    path = _find_local(key, root)
    if path is None:
        path = _fetch(key, root, url or medmnist_url(key), expected_md5, progress)
        got_md5 = expected_md5  # verified by download()
    else:
        got_md5 = md5sum(path)

    provenance.record(path)
    raw = _read_npz(path)
    images: dict[str, np.ndarray] = {}
    labels: dict[str, np.ndarray] = {}
    for split in SPLITS:
        images[split] = _images(raw[f"{split}_images"], path, split, info)
        n = images[split].shape[0]
        labels[split] = _labels(raw[f"{split}_labels"], n, path, split, info)

    if got_md5 != expected_md5:
        sizes = tuple(len(labels[s]) for s in SPLITS)
        same = "match" if sizes == info.n_samples else f"differ: {sizes} vs {info.n_samples}"
        warnings.warn(
            f"{path}: md5 {got_md5} differs from the official {expected_md5} (a re-saved or "
            f"modified copy); using it anyway. Train/val/test sizes {same}.",
            UserWarning,
            stacklevel=2,
        )

    return RawDataset(
        name=key,
        train_x=images["train"],
        train_y=labels["train"],
        test_x=images["test"],
        test_y=labels["test"],
        num_classes=info.num_classes,
        class_names=list(info.class_names),
        val_x=images["val"],
        val_y=labels["val"],
        task=info.task,
        source=f"medmnist:{path}",
        md5=got_md5,
        positive_class=info.class_names.index(info.positive) if info.positive else None,
    )


def _make_loader(name: str) -> Callable[..., RawDataset]:
    def loader(data_dir: str | os.PathLike[str] | None = None) -> RawDataset:
        return load_medmnist(name, data_dir)

    loader.__name__ = loader.__qualname__ = f"load_{name}"
    loader.__doc__ = f"Load MedMNIST {name} (28x28) from the data root, downloading it if absent."
    return loader


for _name in MEDMNIST_INFO:
    DATASETS.register(_name)(_make_loader(_name))

__all__ = ["DEFAULT_URL", "ENV_URL", "MEDMNIST_INFO", "MedMNISTInfo", "load_medmnist"]
