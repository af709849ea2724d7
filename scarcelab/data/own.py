"""A user's own images as a dataset, with no code: ``folder:PATH`` or ``csv:FILE``.

Why: the product's central job is the fair comparison on a team's *own* labeled images and
its *own* unlabeled ones (issue 39). torchvision's ``ImageFolder`` and Hugging Face's
``imagefolder`` read class folders; neither has a place for a real unlabeled pool or a
held-out test set, which a budgeted semi-/self-supervised comparison needs. So:

- ``folder:PATH``: ``labeled/<class>/…`` (the class is the folder's name; files at any depth
  below it), ``unlabeled/…`` (any depth), optional ``val/<class>/…`` and ``test/<class>/…``.
  Hidden files and folders and files whose suffix is not an image's
  (:data:`~scarcelab.data.imagefiles.IMAGE_SUFFIXES`) are ignored and counted.
- ``csv:FILE``: a header ``path,label[,split]`` (more columns are ignored); paths relative to
  the CSV's folder (absolute ones are taken as they are); an empty label is an unlabeled
  image; ``split`` is ``train`` (or empty: the labeled pool), ``val`` or ``test``.
- a bare path (one holding ``/``, starting with ``~`` or ending in ``.csv``) is read as
  ``folder:`` or ``csv:`` by what it is.

Classes are the sorted class names (numerically when every name is an integer), so the same
folder gives the same class indices on every machine. The ``unlabeled/`` images are the
unlabeled pool, exactly (``RawDataset.unlabeled_x``; a pool image whose bytes equal a
labeled, validation or test image is left out and counted, as it is not unlabeled). Without
``test/``, a stratified hold-out of the labeled images (``test_fraction``, drawn with a
fixed seed so every run on the folder scores on the same images) is the test set, or with
``folds = k`` fold ``i`` of a stratified k-fold partition (``fold``); ``RawDataset.test_from``
says which. Decoding is :mod:`scarcelab.data.imagefiles`' (one call over every file, so one
size and one channel count for all, and one cache entry).

Nothing here imports torch: the option checks (:func:`check_ref`) run before it is loaded.
"""

from __future__ import annotations

import csv
import difflib
import hashlib
import os
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from scarcelab.errors import ConfigError, DataError

SCHEMES = ("folder", "csv")
CSV_SPLITS = ("train", "val", "test")
FOLDER_PARTS = ("labeled", "unlabeled", "val", "test")
#: the default share of the labeled images held out as the test set (no ``test/``)
TEST_FRACTION = 0.2
#: the default validation share of the labeled training images (own datasets' default
#: budget: every other labeled image is trained on, see :func:`default_budget`)
VAL_SHARE = 0.2
#: the seed of the test hold-out and of the fold partition: fixed, so that every run and
#: seed on one folder scores on the same test images (the study seed draws labeled and
#: validation sets only)
PARTITION_SEED = 0
#: above this many bytes the unlabeled pool stays a read-only memory map of the decode
#: cache instead of being copied into memory
POOL_IN_MEMORY_MAX = 1 << 30


@dataclass(frozen=True)
class DatasetRef:
    """A dataset named by where its files are: ``scheme`` folder | csv, ``path`` absolute."""

    scheme: str
    path: Path

    @property
    def name(self) -> str:
        """The canonical name (run tag ``scarcelab.dataset``, the split's ``dataset``)."""
        return f"{self.scheme}:{self.path}"

    @property
    def slug(self) -> str:
        """A short name for run and model names, which may not hold ``/`` or ``:``."""
        stem = self.path.stem if self.scheme == "csv" else self.path.name
        return f"{self.scheme}-" + (re.sub(r"[^A-Za-z0-9_.-]+", "_", stem) or "root")


@dataclass(frozen=True)
class DataOptions:
    """How a user's files become a dataset (the dataset options of every command): the
    decode transform (``image_size`` None = the files' own size, ``channels``, ``fit``),
    whether bad files are skipped, and where the test set comes from when there is no
    ``test/`` (``test_fraction`` hold-out, or ``folds`` > 1 with fold ``fold``)."""

    image_size: int | None = None
    channels: str = "auto"
    fit: str = "crop"
    skip_bad_files: bool = False
    test_fraction: float = TEST_FRACTION
    folds: int = 1
    fold: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.test_fraction < 1.0:
            raise ConfigError(f"test_fraction must be in (0, 1), got {self.test_fraction}; "
                              "e.g. 0.2 holds out a fifth of the labeled images for testing")
        if self.folds < 1 or not 0 <= self.fold < self.folds:
            raise ConfigError(f"fold {self.fold} of folds={self.folds}: folds must be >= 1 "
                              "and fold in 0..folds-1")

    def transform(self) -> Any:
        from scarcelab.data.imagefiles import Transform

        return Transform(self.image_size, self.channels, self.fit)

    def is_default(self) -> bool:
        return self == DataOptions()

    def params(self) -> dict[str, Any]:
        """The options as run params (MLproject names; the fold is a tag, not a param)."""
        d = asdict(self)
        d.pop("fold")
        d["image_size"] = "native" if self.image_size is None else self.image_size
        return d


def looks_like_path(text: str) -> bool:
    """A bare path: it holds a separator, starts with ``~`` or ``.``, or ends in ``.csv``
    — unless it starts with another scheme (``encoded_folder:…``, ``runs:/…``)."""
    if re.match(r"[A-Za-z][\w.+-]+:", text):
        return False
    return ("/" in text or os.sep in text or text.startswith(("~", "."))
            or text.lower().endswith(".csv"))


def parse_ref(text: str, base: str | Path | None = None) -> DatasetRef | None:
    """``folder:PATH``, ``csv:PATH`` or a bare path -> a :class:`DatasetRef` (a relative
    path is taken relative to ``base``, else the working directory); None for a plain name
    (a registered dataset or a plugin). Nothing is read."""
    t = str(text).strip()
    scheme, sep, rest = t.partition(":")
    if sep and scheme.lower() in SCHEMES:
        scheme = scheme.lower()
        if not rest.strip():
            raise ConfigError(f"{t!r}: give a path after '{scheme}:', e.g. {scheme}:"
                              f"{'/data/chest' if scheme == 'folder' else '/data/labels.csv'}")
        return DatasetRef(scheme, _absolute(rest.strip(), base))
    if not looks_like_path(t):
        return None
    p = _absolute(t, base)
    return DatasetRef("csv" if p.suffix.lower() == ".csv" or p.is_file() else "folder", p)


def _absolute(path: str, base: str | Path | None) -> Path:
    p = Path(path).expanduser()
    if not p.is_absolute():
        p = Path(base or os.getcwd()) / p
    return p.resolve()


def is_own(name: str) -> bool:
    """Whether ``name`` names a user's files (folder/CSV), not a registered dataset."""
    try:
        return parse_ref(name) is not None
    except ConfigError:
        return True


def dataset_label(name: str) -> str:
    """``name`` for run and model names: a user's data by its short slug
    (``folder-chest``), any other dataset by its name."""
    prefix = "encoded_" if name.startswith("encoded_") else ""
    try:
        ref = parse_ref(name[len(prefix):])
    except ConfigError:
        return name
    return prefix + ref.slug if ref is not None else name


def pool_hint(name: str) -> str:
    """Where a user's unlabeled images go, for a refusal's fix."""
    ref = parse_ref(name)
    if ref is None:
        return "add unlabeled images"
    if ref.scheme == "csv":
        return f"add rows with an empty label (the unlabeled images) to {ref.path}"
    return f"add images to {ref.path / 'unlabeled'}/"


# --------------------------------------------------------------------------- listing


@dataclass
class Part:
    """Files of one part, in a fixed order; ``labels`` are class names (None: unlabeled);
    ``where`` (for messages) says where the part lives, ``lines`` the CSV line of each."""

    paths: list[Path] = field(default_factory=list)
    labels: list[str] | None = None
    where: str = ""
    lines: list[int] | None = None

    def __len__(self) -> int:
        return len(self.paths)


@dataclass
class Listing:
    """What a folder or CSV holds, before any file is decoded."""

    ref: DatasetRef
    root: Path  # manifest paths are relative to it
    classes: list[str]
    labeled: Part
    unlabeled: Part
    val: Part
    test: Part
    ignored: int = 0  # hidden or not-image files of a folder
    index_file: Path | None = None  # the CSV


def sort_classes(names: set[str] | list[str]) -> list[str]:
    """Sorted, numerically when every name is an integer (``2`` before ``10``)."""
    names = sorted(set(names))
    if names and all(re.fullmatch(r"[+-]?\d+", n) for n in names):
        return sorted(names, key=int)
    return names


def _hidden(name: str) -> bool:
    return name.startswith(".")


def _image_files(folder: Path) -> tuple[list[Path], int]:
    """Image files below ``folder`` at any depth (hidden ones and their folders skipped),
    sorted by their path; and how many other files were ignored. Symlinked folders are
    followed once (a link loop is not walked twice)."""
    from scarcelab.data.imagefiles import IMAGE_SUFFIXES

    out: list[Path] = []
    ignored = 0
    seen: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:
            dirnames[:] = []
            continue
        seen.add(real)
        ignored += sum(1 for d in dirnames if _hidden(d))
        dirnames[:] = sorted(d for d in dirnames if not _hidden(d))
        for f in filenames:
            if _hidden(f) or Path(f).suffix.lower() not in IMAGE_SUFFIXES:
                ignored += 1
            else:
                out.append(Path(dirpath) / f)
    return sorted(out, key=lambda p: p.relative_to(folder).as_posix()), ignored


def _class_part(root: Path, folder: str, classes: list[str] | None) -> tuple[Part, int]:
    """``root/folder/<class>/…``: the files and their class names; ``classes`` (val/test):
    the labeled classes every class folder must be one of."""
    base = root / folder
    part = Part(labels=[], where=f"{base}/")
    if not base.exists():
        return part, 0
    if not base.is_dir():
        raise DataError(f"{base} is a file; {folder}/ must be a folder of class folders")
    ignored = 0
    loose, skipped = _loose_images(base)
    if loose:
        raise DataError(f"{base}/ holds images directly (e.g. {loose[0].name}); put each "
                        f"class in a folder of its own: {folder}/<class>/{loose[0].name}")
    ignored += skipped
    names = sorted(d.name for d in base.iterdir() if d.is_dir() and not _hidden(d.name))
    ignored += sum(1 for d in base.iterdir() if d.is_dir() and _hidden(d.name))
    for name in sort_classes(names):
        if classes is not None and name not in classes:
            raise DataError(f"{base / name}/: class {name!r} has no labeled images (labeled "
                            f"classes: {', '.join(classes)}); rename the folder to one of "
                            "them or add labeled/" + name + "/ images")
        files, skip = _image_files(base / name)
        ignored += skip
        part.paths += files
        part.labels += [name] * len(files)  # type: ignore[operator]
    return part, ignored


def _loose_images(base: Path) -> tuple[list[Path], int]:
    from scarcelab.data.imagefiles import IMAGE_SUFFIXES

    loose, other = [], 0
    for f in sorted(base.iterdir()):
        if f.is_file():
            if not _hidden(f.name) and f.suffix.lower() in IMAGE_SUFFIXES:
                loose.append(f)
            else:
                other += 1
    return loose, other


def scan_folder(ref: DatasetRef) -> Listing:
    """The folder layout (module docstring) -> a :class:`Listing`, with one-line errors
    naming the folder and the fix."""
    root = ref.path
    layout = ("lay it out as labeled/<class>/*.png, unlabeled/…, optional val/<class>/ "
              "and test/<class>/ (docs/own-images.md)")
    if not root.exists():
        raise DataError(f"{ref.name}: no such folder; {layout}")
    if not root.is_dir():
        raise DataError(f"{ref.name} is a file, not a folder (a CSV is csv:{root})")
    subdirs = {d.name for d in root.iterdir() if d.is_dir() and not _hidden(d.name)}
    if "labeled" not in subdirs:
        near = difflib.get_close_matches("labeled", sorted(subdirs - set(FOLDER_PARTS)), n=1,
                                         cutoff=0.6)
        hint = (f" (found {near[0]}/: rename it to labeled/)" if near else
                " (found train/: rename it to labeled/)" if "train" in subdirs else "")
        raise DataError(f"{ref.name} has no labeled/ folder{hint}; {layout}")
    unknown = sorted(subdirs - set(FOLDER_PARTS))
    if unknown:
        raise DataError(f"{ref.name}: unknown folder {unknown[0]}/ (expected only labeled/, "
                        f"unlabeled/, val/, test/); move it out or into one of them")
    labeled, ignored = _class_part(root, "labeled", None)
    classes = sort_classes(set(labeled.labels or []))
    if not classes:
        raise DataError(f"{ref.name}: labeled/ holds no class folder with images; {layout}")
    val, ig_v = _class_part(root, "val", classes)
    test, ig_t = _class_part(root, "test", classes)
    unl_paths: list[Path] = []
    ig_u = 0
    if (root / "unlabeled").is_dir():
        unl_paths, ig_u = _image_files(root / "unlabeled")
    top_files = sum(1 for f in root.iterdir() if f.is_file())
    return Listing(ref, root, classes, labeled,
                   Part(unl_paths, None, f"{root / 'unlabeled'}/"), val, test,
                   ignored + ig_v + ig_t + ig_u + top_files)


def read_csv(ref: DatasetRef) -> Listing:
    """The CSV layout (module docstring) -> a :class:`Listing`; every error names the
    CSV's line and the fix."""
    path = ref.path
    if not path.exists():
        raise DataError(f"{ref.name}: no such file")
    if not path.is_file():
        raise DataError(f"{ref.name} is a folder, not a CSV file (a folder is folder:{path})")
    root = path.parent
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:
            rows = list(csv.reader(fh))
    except (UnicodeDecodeError, csv.Error) as e:
        raise DataError(f"{ref.name}: not a UTF-8 CSV file ({e})") from None
    if not rows:
        raise DataError(f"{ref.name} is empty; its first line must be the header path,label"
                        "[,split]")
    cols = _csv_columns(ref, rows[0])
    parts = {s: Part([], [], f"{ref.name} rows with split {s}", []) for s in CSV_SPLITS}
    unl = Part([], None, f"{ref.name} rows with an empty label", [])
    seen: dict[Path, int] = {}
    for lineno, row in enumerate(rows[1:], start=2):
        if not any(c.strip() for c in row):
            continue
        cells = row + [""] * (len(rows[0]) - len(row))
        rel, label = cells[cols["path"]].strip(), cells[cols["label"]].strip()
        split = cells[cols["split"]].strip().lower() if "split" in cols else ""
        at = f"{ref.name} line {lineno}"
        if not rel:
            raise DataError(f"{at}: empty path")
        if split not in ("", *CSV_SPLITS):
            raise DataError(f"{at}: split {split!r} is not one of {', '.join(CSV_SPLITS)} "
                            "(empty = train)")
        try:
            file = _absolute(rel, root)
            found = file.is_file()
        except (OSError, ValueError) as e:  # a NUL byte, a name longer than the OS allows
            raise DataError(f"{at}: {rel[:80]!r} is not a usable file path ({e}); fix the "
                            "path or remove the row") from None
        if not found:
            raise DataError(f"{at}: file {rel!r} not found (looked for {file}); fix the path "
                            "(paths are relative to the CSV's folder) or remove the row")
        if file in seen:
            raise DataError(f"{at}: {rel!r} is listed twice (first on line {seen[file]}); "
                            "keep one row per file")
        seen[file] = lineno
        if not label:
            if split in ("val", "test"):
                raise DataError(f"{at}: an unlabeled row (empty label) cannot be in split "
                                f"{split!r}; give its label or leave split empty")
            unl.paths.append(file)
            unl.lines.append(lineno)  # type: ignore[union-attr]
            continue
        p = parts[split or "train"]
        p.paths.append(file)
        p.labels.append(label)  # type: ignore[union-attr]
        p.lines.append(lineno)  # type: ignore[union-attr]
    classes = sort_classes(set(parts["train"].labels or []))
    if not classes:
        raise DataError(f"{ref.name}: no labeled training row (a label and split train or "
                        "empty); add labeled rows")
    for s in ("val", "test"):
        p = parts[s]
        for i, lab in enumerate(p.labels or []):
            if lab not in classes:
                raise DataError(f"{ref.name} line {p.lines[i]}: label {lab!r} appears only in "  # type: ignore[index]
                                f"{s} rows, never in training rows (training labels: "
                                f"{', '.join(classes)}); a model cannot learn a class it "
                                "never sees: add training rows of it or drop these rows")
    return Listing(ref, root, classes, parts["train"], unl, parts["val"], parts["test"],
                   index_file=path)


def _csv_columns(ref: DatasetRef, header: list[str]) -> dict[str, int]:
    names = [h.strip().lower() for h in header]
    want = ("path", "label")
    cols = {n: i for i, n in enumerate(names) if n in (*want, "split")}
    missing = [w for w in want if w not in cols]
    if missing:
        extra = [n for n in names if n not in cols]
        near = [f"{n} -> {m[0]}" for n in extra
                if (m := difflib.get_close_matches(n, [*missing, "split"], n=1, cutoff=0.6))]
        raise DataError(f"{ref.name}: the header {','.join(header)!r} lacks column(s) "
                        f"{', '.join(missing)}" + (f" (did you mean {'; '.join(near)}?)"
                                                  if near else "")
                        + "; the first line must be path,label[,split]")
    for n in names:  # a near miss of 'split' would silently make every row train
        if n not in cols and difflib.get_close_matches(n, ["split"], n=1, cutoff=0.7):
            raise DataError(f"{ref.name}: column {n!r} is not 'split'; rename it to split "
                            "(train, val, test) or to something else")
    return cols


def listing(ref: DatasetRef) -> Listing:
    return scan_folder(ref) if ref.scheme == "folder" else read_csv(ref)


def check_ref(text: str, base: str | Path | None = None) -> DatasetRef | None:
    """The option check of a dataset name (no decoding, no torch): None for a plain name,
    else the reference, its folder or CSV read and checked, or :class:`DataError`."""
    ref = parse_ref(text, base)
    if ref is not None:
        listing(ref)
    return ref


# --------------------------------------------------------------------------- loading


def default_budget(n_train: int, num_classes: int, n_val_given: int = 0) -> tuple[int, int]:
    """A user's images by default train on every labeled image: validation takes
    :data:`VAL_SHARE` of the labeled training images (at least one per class) and the
    rest are labeled; with a ``val/`` folder (``n_val_given`` images) validation is that
    folder, capped at the labeled size (never larger than the labeled set), and every
    training image is labeled."""
    if n_val_given:
        return n_train, max(1, min(n_val_given, n_train))
    n_val = min(max(num_classes, round(VAL_SHARE * n_train)), max(1, n_train // 2))
    return max(1, n_train - n_val), max(1, n_val)


def load(ref: DatasetRef, options: DataOptions | None = None, *,
         progress: bool = True) -> Any:
    """Decode the listing's files and build the :class:`~scarcelab.data.bundle.RawDataset`
    (module docstring); records the run's provenance (the files read, the manifest, the
    params and tags a run logs: :func:`scarcelab.data.provenance.describe`)."""
    from scarcelab.data import provenance
    from scarcelab.data.bundle import RawDataset
    from scarcelab.data.imagefiles import load_images

    opts = options or DataOptions()
    lst = listing(ref)
    if lst.index_file is not None:
        provenance.record(lst.index_file, role="index")
    if len(lst.test) and opts.folds > 1:
        raise ConfigError(f"--folds {opts.folds}: {ref.name} has its own test set "
                          f"({len(lst.test)} images in {lst.test.where}); folds are drawn "
                          "only when there is none: drop --folds or the test images")
    order = [("labeled", lst.labeled), ("val", lst.val), ("test", lst.test),
             ("unlabeled", lst.unlabeled)]
    paths = [p for _, part in order for p in part.paths]
    transform = opts.transform()
    dec = load_images(paths, transform, skip_bad=opts.skip_bad_files, progress=progress)
    if dec.bad:
        first = dec.bad[0]
        print(f"[scarcelab] skipped {len(dec.bad)} bad file(s) of {ref.name} (first: "
              f"{first[0]}: {first[1]}); the run counts them (data.n_bad_files)",
              file=sys.stderr, flush=True)
    # rows of dec.x per part: kept keeps the paths' order, so every part is a row range
    kept = np.asarray(dec.kept, dtype=np.int64)
    # the digests load_images computed in the one read that hashed each file (or took from
    # its stat index): hashing every file again here read the whole folder a second time
    # on a first load and once more on every later one
    sha = {int(i): (dec.sha[int(i)] if int(i) < len(dec.sha) else None)
           or provenance.sha256_file(Path(paths[int(i)])) for i in kept}
    idx = _classes_index(lst.classes)
    parts: dict[str, dict[str, Any]] = {}
    lo = 0
    for name, part in order:
        hi = lo + len(part)
        sel = np.flatnonzero((kept >= lo) & (kept < hi))
        files = (kept[sel] - lo).tolist()
        parts[name] = {"rows": sel, "files": files, "part": part,
                       "sha": [sha[lo + f] for f in files],
                       "y": (np.asarray([idx[part.labels[f]] for f in files], np.int64)
                             if part.labels is not None else None)}
        lo = hi
    taken = {s for n in ("labeled", "val", "test") for s in parts[n]["sha"]}
    pool_keep = [j for j, s in enumerate(parts["unlabeled"]["sha"]) if s not in taken]
    n_dup = len(parts["unlabeled"]["sha"]) - len(pool_keep)
    if n_dup:
        print(f"[scarcelab] {n_dup} unlabeled file(s) of {ref.name} are byte-identical to "
              "labeled, validation or test images and are left out of the unlabeled pool",
              file=sys.stderr, flush=True)
    lab = parts["labeled"]
    y_all = lab["y"]
    _check_class_counts(ref, lst, y_all, opts)
    train_i, test_i, test_from = _test_split(ref, lst, y_all, opts)
    x = dec.x
    x_lab = np.asarray(x[lab["rows"]])
    if len(lst.test):
        test_x = np.asarray(x[parts["test"]["rows"]])
        test_y, test_sha = parts["test"]["y"], parts["test"]["sha"]
    else:
        test_x, test_y = x_lab[test_i], y_all[test_i]
        test_sha = [lab["sha"][i] for i in test_i]
    _warn_test_copies(ref, {lab["sha"][i] for i in train_i}, test_sha)
    pool_rows = parts["unlabeled"]["rows"][pool_keep]
    pool = _pool(x, pool_rows)
    val = parts["val"]
    has_val = len(val["files"]) > 0
    digests = {"train": _digest(lab["sha"], y_all, train_i),
               "test": _digest(test_sha, test_y, np.arange(len(test_y))),
               "unlabeled": _digest([parts["unlabeled"]["sha"][j] for j in pool_keep])}
    if has_val:
        digests["val"] = _digest(val["sha"], val["y"], np.arange(len(val["files"])))
    n_ref = _smallest_train(y_all, opts) if test_from.startswith("fold ") else len(train_i)
    raw = RawDataset(
        name=ref.name, train_x=x_lab[train_i], train_y=y_all[train_i], test_x=test_x,
        test_y=test_y, num_classes=len(lst.classes), class_names=list(lst.classes),
        val_x=np.asarray(x[val["rows"]]) if has_val else None,
        val_y=val["y"] if has_val else None, source=ref.name, unlabeled_x=pool,
        test_from=test_from, digests=digests,
        default_budget=default_budget(n_ref, len(lst.classes),
                                      len(val["files"]) if has_val else 0),
        transform=_resolved_transform(opts, dec.channels))
    _describe(ref, lst, opts, dec, parts, train_i, test_i, test_from, pool_keep, n_dup,
              paths, kept)
    return raw


def _resolved_transform(opts: DataOptions, channels: int) -> dict[str, str]:
    """The transform as training saw it, ``auto`` channels resolved (what the files were:
    all gray or all colour), for the logged model to replay on a new file."""
    from scarcelab.data.imagefiles import Transform

    mode = opts.channels if opts.channels != "auto" else ("gray" if channels == 1 else "rgb")
    return Transform(opts.image_size, mode, opts.fit).params()


def _classes_index(classes: list[str]) -> dict[str, int]:
    return {c: i for i, c in enumerate(classes)}


def _pool(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The pool's rows: a contiguous range stays a view of the (memory-mapped) cache when it
    is too large for memory; otherwise a copy in memory."""
    if len(rows) == 0:
        return np.zeros((0, *x.shape[1:]), np.uint8)
    contiguous = bool(np.all(np.diff(rows) == 1))
    nbytes = len(rows) * int(np.prod(x.shape[1:]))
    if contiguous and nbytes > POOL_IN_MEMORY_MAX:
        return x[int(rows[0]):int(rows[-1]) + 1]
    return np.array(x[rows])


def _digest(shas: list[str], y: np.ndarray | None = None,
            order: np.ndarray | list[int] | None = None) -> str:
    """sha256 over the files' content digests (with their labels), in the given order."""
    h = hashlib.sha256()
    ids = range(len(shas)) if order is None else order
    for i in ids:
        h.update(shas[int(i)].encode())
        if y is not None:
            h.update(f"\t{int(y[int(i)])}".encode())
        h.update(b"\n")
    return h.hexdigest()


def _train_need(lst: Listing) -> int:
    """Labeled training images a class needs: one labeled and one validation image (just
    the labeled one when a val/ set exists to validate on)."""
    return 1 if len(lst.val) else 2


def _class_need(lst: Listing, opts: DataOptions) -> tuple[int, str]:
    """(labeled images a class needs, why): training's need, plus the test images drawn
    from the labeled ones when there is no test/ (one for the hold-out; one per fold, with
    enough left over in every fold's training part)."""
    train = _train_need(lst)
    why = "one to train on, one to validate on" if train == 2 else "one to train on"
    if len(lst.test):
        return train, why
    if opts.folds == 1:
        return train + 1, why + ", one for the test hold-out"
    n = opts.folds
    while n - -(-n // opts.folds) < train:
        n += 1
    return n, why + f", one in each of the {opts.folds} folds' test sets"


def _check_class_counts(ref: DatasetRef, lst: Listing, y: np.ndarray,
                        opts: DataOptions) -> None:
    """Refuse a class too small to be split (one line naming it, the count and the fix)
    before any run exists, rather than a split error or failed trials later."""
    counts = np.bincount(y, minlength=len(lst.classes))
    need, why = _class_need(lst, opts)
    for c, n in enumerate(counts):
        if n < need:
            name = lst.classes[c]
            raise DataError(f"class {name!r} of {ref.name} has {int(n)} labeled image"
                            f"{'s' if n != 1 else ''}; a class needs at least {need} "
                            f"({why}): add labeled images of {name!r} or remove the class")
    if len(lst.classes) < 2:
        raise DataError(f"{ref.name} has a single labeled class ({lst.classes[0]!r}); a "
                        "classifier needs at least two")


def _fold_of(y: np.ndarray, k: int) -> np.ndarray:
    """A stratified k-fold partition: each class in a seeded order, the classes one after
    the other, the j-th image of that sequence in fold j mod k — every fold holds floor or
    ceil(n/k) images and each class spread evenly (±1)."""
    rng = np.random.default_rng(PARTITION_SEED)
    order = np.concatenate([rng.permutation(np.flatnonzero(y == c))
                            for c in range(int(y.max()) + 1)])
    fold = np.empty(len(y), np.int64)
    fold[order] = np.arange(len(order)) % k
    return fold


def _smallest_train(y: np.ndarray, opts: DataOptions) -> int:
    """The smallest training set over the folds: the default budget every fold can draw
    (so that all folds have the same label budget and pool together on a leaderboard)."""
    return len(y) - -(-len(y) // opts.folds)


def _test_split(ref: DatasetRef, lst: Listing, y: np.ndarray, opts: DataOptions
                ) -> tuple[np.ndarray, np.ndarray, str]:
    """(train indices, test indices, test_from) into the labeled images."""
    n = len(y)
    if len(lst.test):
        return np.arange(n), np.zeros(0, np.int64), "folder"
    if opts.folds > 1:
        fold = _fold_of(y, opts.folds)
        return (np.flatnonzero(fold != opts.fold), np.flatnonzero(fold == opts.fold),
                f"fold {opts.fold + 1}/{opts.folds}")
    from scarcelab.data.splits import stratified_counts

    counts = np.bincount(y)
    n_test = max(int((counts > 0).sum()), round(opts.test_fraction * n))
    per = stratified_counts(counts, n_test)
    short = counts - per < _train_need(lst)
    if np.any(short):
        c = int(np.argmax(short))
        raise DataError(f"class {lst.classes[c]!r} of {ref.name} has {int(counts[c])} labeled "
                        f"images; the test hold-out (--test-fraction {opts.test_fraction:g}) "
                        f"takes {int(per[c])}, leaving too few to train and validate on: "
                        "lower --test-fraction, add images or give a test/ set")
    rng = np.random.default_rng(PARTITION_SEED)
    test = np.concatenate([rng.permutation(np.flatnonzero(y == c))[:per[c]]
                           for c in range(len(counts))])
    test = np.sort(test)
    keep = np.ones(n, bool)
    keep[test] = False
    return np.flatnonzero(keep), test, "holdout"


def _warn_test_copies(ref: DatasetRef, train: set[str], test: list[str]) -> None:
    same = sum(1 for s in test if s in train)
    if same:
        import warnings

        warnings.warn(f"{ref.name}: {same} test image(s) are byte-identical to labeled "
                      "training images; their test scores are not held-out scores",
                      UserWarning, stacklevel=3)


def _describe(ref: DatasetRef, lst: Listing, opts: DataOptions, dec: Any,
              parts: dict[str, dict[str, Any]], train_i: np.ndarray, test_i: np.ndarray,
              test_from: str, pool_keep: list[int], n_dup: int, paths: list[Path],
              kept: np.ndarray) -> None:
    """What a run on this data logs (``provenance.describe``): params (the options, the
    decode transform's rules, the cache key and counts), tags (``test_from``, ``fold``)
    and the manifest artifact (every file's path relative to the data, its sha256, part,
    label and role)."""
    from scarcelab import tags as T
    from scarcelab.data import provenance

    role: dict[int, str] = {int(i): "train" for i in train_i}
    role.update({int(i): "test" for i in test_i})
    pool_set = set(pool_keep)
    files = []
    for name in ("labeled", "val", "test", "unlabeled"):
        p = parts[name]
        part: Part = p["part"]
        for j, f in enumerate(p["files"]):
            r = role.get(j, name) if name == "labeled" else (
                "pool" if j in pool_set else "pool-duplicate") if name == "unlabeled" \
                else name
            files.append({"path": _rel(part.paths[f], lst.root), "sha256": p["sha"][j],
                          "part": name, "label": None if part.labels is None
                          else part.labels[f], "role": r})
    bad = [{"path": _rel(Path(b[0]), lst.root), "reason": b[1]} for b in dec.bad]
    shape = tuple(int(s) for s in dec.x.shape[1:])
    params: dict[str, Any] = {
        **{f"transform.{k}": v for k, v in opts.transform().params().items()},
        "data.cache_key": dec.cache_key, "data.image_shape": "x".join(map(str, shape)),
        "data.n_files": len(kept), "data.n_bad_files": len(dec.bad),
        "data.n_ignored_files": lst.ignored, "data.n_labeled_images": len(lst.labeled),
        "data.n_unlabeled_images": len(pool_keep), "data.n_pool_duplicates": n_dup,
        "data.classes": ",".join(lst.classes)[:500],
        "data.test_from": test_from.split(" ")[0]}  # the fold itself is a tag
    tags = {T.TEST_FROM: test_from.split(" ")[0]}
    if test_from.startswith("fold "):
        tags[T.FOLD] = test_from.split(" ")[1]
    manifest = {"dataset": ref.name, "root": str(lst.root), "classes": lst.classes,
                "cache_key": dec.cache_key, "test_from": test_from,
                "options": opts.params(), "transform": opts.transform().params(),
                "ignored_files": lst.ignored, "bad_files": bad, "files": files}
    provenance.describe(params=params, tags=tags, manifest=manifest)


def _rel(p: Path, root: Path) -> str:
    try:
        return p.relative_to(root).as_posix()
    except ValueError:
        return str(p)


__all__ = ["CSV_SPLITS", "SCHEMES", "TEST_FRACTION", "DataOptions", "DatasetRef", "Listing",
           "Part", "check_ref", "default_budget", "is_own", "listing", "load", "parse_ref",
           "read_csv", "scan_folder", "sort_classes"]
