"""Optional dependencies: which extra of ``pip install scarcelab[...]`` brings a module.

Ray (sweeps), scikit-image and h5py (pathology) are heavy and serve one command each, and
pydicom (DICOM images in a dataset folder) serves only users with DICOM files, so a
researcher installing scarcelab into an existing environment is not made to take them.
The code imports them where they are used, through :func:`need`, so a
missing one is a one-line error naming the command, the extra and the pip command instead
of a ``ModuleNotFoundError`` from deep inside a run. ``scarcelab[all]`` is everything;
scripts/setup and ``mlflow run`` install the full lock (requirements.txt) regardless.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from scarcelab.errors import ConfigError

# import name -> (distribution, extra); pyproject.toml's [project.optional-dependencies]
# declares the same (tests/core/test_extras.py checks they agree)
EXTRAS: dict[str, tuple[str, str]] = {
    "ray": ("ray", "sweep"),
    "skimage": ("scikit-image", "pathology"),
    "h5py": ("h5py", "pathology"),
    "pydicom": ("pydicom", "dicom"),
}


class MissingExtra(ConfigError, ImportError):
    """An optional dependency is not installed (also an ``ImportError``, so code that
    already handled a failed import keeps working)."""


def need(module: str, what: str) -> ModuleType:
    """``import module`` for ``what`` (e.g. "scarcelab sweep"), or :class:`MissingExtra`
    naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        dist, extra = EXTRAS.get(module.split(".")[0], (module.split(".")[0], "all"))
        raise MissingExtra(
            f"{what} needs {dist}, which is not installed ({e}); install it with "
            f"pip install 'scarcelab[{extra}]' (or 'scarcelab[all]' for every optional "
            "part)") from None
