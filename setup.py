"""Package layout only (everything else is in pyproject.toml).

The repository keeps ``tracking/`` and ``entrypoints/`` at its top level (the product
layout, DESIGN §1); ``scarcelab/tracking`` and ``scarcelab/entrypoints`` are relative
symlinks to them, so they are the packages ``scarcelab.tracking`` and
``scarcelab.entrypoints`` for Python, for the wheel (setuptools follows the links and
copies the files) and for editors and type checkers, which saw them as unresolved imports
while a ``package_dir`` mapping and a ``__path__`` extension made them (issue 44 item 1).
Nothing is installed as a top-level ``tracking`` or ``entrypoints`` module (a PyPI
distribution has that name). A new subpackage needs no edit here.
"""

from setuptools import find_packages, setup

setup(packages=find_packages(include=["scarcelab", "scarcelab.*"]),
      package_data={"scarcelab": ["py.typed"]}, include_package_data=False)
