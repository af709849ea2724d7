"""Datasets by name, realistic splits and batched augmentation.

Each source file in ``scarcelab/data/sources/`` registers its loaders in ``DATASETS``;
a loader is a callable ``(data_dir=None) -> RawDataset``. Installed plugins (entry-point
group ``scarcelab.datasets``, :data:`scarcelab.registry.PLUGIN_GROUPS`) are loaders too.
A user's own images are named by where they are, ``folder:PATH`` or ``csv:FILE``
(:mod:`scarcelab.data.own`), and take the dataset options (:class:`~scarcelab.data.own.
DataOptions`).
"""

from __future__ import annotations

from pathlib import Path

from scarcelab.data.bundle import DatasetBundle, RawDataset
from scarcelab.data.own import DataOptions
from scarcelab.errors import ConfigError
from scarcelab.registry import PACKAGES, Registry

DATASETS: Registry = Registry("dataset", PACKAGES["dataset"])


def load_raw(name: str, data_dir: str | Path | None = None,
             options: DataOptions | None = None) -> RawDataset:
    """Load a registered dataset or plugin (downloading it if the source supports that),
    or a user's folder/CSV with the dataset ``options`` (``data_dir`` is not used there:
    the name says where the files are). The options apply only to a user's files: given
    with another dataset they are refused rather than silently ignored."""
    from scarcelab.data.own import parse_ref

    ref = parse_ref(name)
    if ref is not None:
        from scarcelab.data.own import load

        return load(ref, options)  # type: ignore[no-any-return]
    if options is not None and not options.is_default():
        raise ConfigError(f"the dataset options ({_given(options)}) apply to a user's images "
                          f"(folder:PATH or csv:FILE); dataset {name!r} has its own "
                          "resolution, channels and test set: leave them at their defaults")
    return DATASETS.get(name)(data_dir=data_dir)


def _given(options: DataOptions) -> str:
    default = DataOptions()
    return ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(options).items()
                     if getattr(default, k) != v)


__all__ = ["DATASETS", "DataOptions", "DatasetBundle", "RawDataset", "load_raw"]
