"""scarcelab: a benchmark suite for learning from scarce labels.

The learning core (``scarcelab.data``, ``.methods``, ``.models``, ``.active``, ``.metrics``,
``.protocols``…) never imports mlflow: protocols report through
:class:`scarcelab.tracker.Tracker`, which ``scarcelab.tracking`` implements with MLflow.

``scarcelab.tracking`` and ``scarcelab.entrypoints`` live in the repository's top-level
``tracking/`` and ``entrypoints/`` folders (the product layout); ``scarcelab/tracking`` and
``scarcelab/entrypoints`` are relative symlinks to them, so every tool (Python, setuptools,
editors, type checkers) sees one package tree and each checkout's core finds its own
``tracking/``. (Until issue 44 a ``package_dir`` mapping and a ``__path__`` extension did
this, invisibly to editors: 243 imports in 47 files were unresolved for pyright.)
"""

__version__ = "0.1.0"
