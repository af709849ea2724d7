"""Package layout only (everything else is in pyproject.toml).

The repository keeps ``tracking/`` and ``entrypoints/`` at its top level (the product
layout, DESIGN §1), but they are installed as ``scarcelab.tracking`` and
``scarcelab.entrypoints``: a wheel must not install top-level modules named ``tracking`` or
``entrypoints`` (``entrypoints`` is a PyPI distribution in wide use). setuptools' static
configuration cannot both map a folder under another package name and discover its
subpackages, so the list is computed here — a new subpackage needs no edit.
"""

from setuptools import find_packages, setup

MAPPED = {"scarcelab.tracking": "tracking", "scarcelab.entrypoints": "entrypoints"}

packages = find_packages(include=["scarcelab", "scarcelab.*"])
for name, folder in MAPPED.items():
    packages += [name + sub.removeprefix(folder)
                 for sub in find_packages(include=[folder, folder + ".*"])]

setup(packages=packages, package_dir=MAPPED,
      package_data={"scarcelab": ["py.typed"]}, include_package_data=False)
