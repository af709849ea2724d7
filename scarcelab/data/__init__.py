"""Datasets by name, realistic splits and batched augmentation.

Each source file in ``scarcelab/data/sources/`` registers its loaders in ``DATASETS``;
a loader is a callable ``(data_dir=None) -> RawDataset``.
"""

from __future__ import annotations

from pathlib import Path

from scarcelab.data.bundle import DatasetBundle, RawDataset
from scarcelab.registry import PACKAGES, Registry

DATASETS: Registry = Registry("dataset", PACKAGES["dataset"])


def load_raw(name: str, data_dir: str | Path | None = None) -> RawDataset:
    """Load a registered dataset (downloading it if the source supports that)."""
    return DATASETS.get(name)(data_dir=data_dir)


__all__ = ["DATASETS", "DatasetBundle", "RawDataset", "load_raw"]
