"""What each registered dataset is and whether its files are here, without loading it.

``scarcelab list datasets`` prints this. Loading a dataset to describe it would read
gigabytes (PCam) or start a download (MedMNIST fetches a missing file), so the facts come
from each source's own tables — MedMNIST's info table (classes, official split sizes),
the class tuples and ``SOURCE`` records of the other modules — and "on disk" is the same
file test the loader makes first, never a read of the data.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

SYNTHETIC_SIZES = "600/150/150"


@dataclass(frozen=True)
class Entry:
    """One dataset's line: ``sizes`` is train/val/test where the source states them (``-``
    where only the files know), ``where`` the file or folder found, or what happens when
    it is missing."""

    name: str
    classes: int | None
    sizes: str
    on_disk: str  # yes | no | generated
    where: str


def _module(name: str) -> object:
    """The file that registers ``name`` (not the loader's own module: the DEIC sets share
    one loader factory)."""
    from scarcelab.registry import StaticIndex

    return importlib.import_module(StaticIndex("dataset").where[name])


def _shared(rel: str, data_dir: str | Path | None) -> Path | None:
    """Where ``find_shared_file`` would find ``rel``, without its provenance record and its
    fallback warning (a listing reads nothing)."""
    from scarcelab.data.download import data_root

    root = data_root(data_dir)
    bases = [root, root.parent]
    if not data_dir:  # the loaders fall back to the machines' shared folder only then
        bases.append(Path(__file__).resolve().parents[3] / "shared" / "data")
    for base in bases:
        for cand in (base / rel, base / Path(rel).name):
            if cand.exists():
                return cand
    return None


#: what ``scarcelab list datasets`` says about a user's own images (docs/own-images.md)
OWN_IMAGES = """\
your own images (no code): --dataset folder:PATH or --dataset csv:FILE
  folder:PATH  labeled/<class>/... (class = folder name), unlabeled/... (any depth: the
               unlabeled pool), optional val/<class>/... and test/<class>/...
  csv:FILE     header path,label[,split]; paths relative to the CSV; empty label =
               unlabeled; split train|val|test (empty = train)
  without test/: --test-fraction 0.2 of the labeled images is the test set, or --folds k
  options: --image-size --channels auto|gray|rgb --fit crop|pad --skip-bad-files
  (docs/own-images.md)
plugins: a package of yours with a loader in entry-point group scarcelab.datasets
  (docs/own-images.md, "Plugins"); installed ones are listed above as 'plugin'"""


def describe(name: str, data_dir: str | Path | None = None) -> Entry:
    """The :class:`Entry` of a registered dataset, for the data root ``data_dir`` (None:
    ``$SCARCELAB_DATA`` or ``~/.cache/scarcelab``)."""
    from scarcelab.data.download import data_root
    from scarcelab.data.sources import medmnist
    from scarcelab.registry import StaticIndex

    root = data_root(data_dir)
    if name in medmnist.MEDMNIST_INFO:
        info = medmnist.MEDMNIST_INFO[name]
        path = medmnist._find_local(name, root)
        sizes = "/".join(str(n) for n in info.n_samples)
        if path is not None:
            return Entry(name, info.num_classes, sizes, "yes", str(path))
        return Entry(name, info.num_classes, sizes, "no",
                     f"downloaded to {root / (name + '.npz')} on first use")
    if name.startswith("synthetic"):
        return Entry(name, 3, SYNTHETIC_SIZES, "generated", "made in memory from the seed")
    if name not in StaticIndex("dataset").where:  # registered by code outside the package
        from scarcelab.registry import plugin_entry_points

        ep = plugin_entry_points("dataset").get(name)
        if ep is not None:  # described from its metadata: listing imports no plugin
            dist = getattr(getattr(ep, "dist", None), "name", None) or "?"
            return Entry(name, None, "-", "plugin", f"plugin {ep.value} (package {dist})")
        return Entry(name, None, "-", "-", "registered at run time (not a file of scarcelab)")
    mod = _module(name)
    source = getattr(mod, "SOURCE", None)
    classes = getattr(mod, "CLASSES", None)
    n_classes = len(classes) if classes is not None else getattr(source, "num_classes", None)
    rels = [getattr(mod, "REL", None)] + list(getattr(mod, "ZIPS", {}).values())
    rels = [r for r in rels if r]
    if rels:
        found = [_shared(r, data_dir) for r in rels]
        if all(found):
            return Entry(name, n_classes, "-", "yes", str(found[0]))
        return Entry(name, n_classes, "-", "no", f"{rels[0]} under {root} or ../shared/data")
    # the DEIC sets live in <root>/deic/<name>, the others in <root>/<name>
    folder = root / "deic" / name if source is not None else root / name
    if folder.is_dir() and any(folder.iterdir()):
        return Entry(name, n_classes, "-", "yes", str(folder))
    return Entry(name, n_classes, "-", "no", f"expected in {folder}")
