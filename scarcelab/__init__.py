"""scarcelab: a benchmark suite for learning from scarce labels.

The learning core (``scarcelab.data``, ``.methods``, ``.models``, ``.active``, ``.metrics``,
``.protocols``…) never imports mlflow: protocols report through
:class:`scarcelab.tracker.Tracker`, which ``scarcelab.tracking`` implements with MLflow.

``scarcelab.tracking`` and ``scarcelab.entrypoints`` live in the repository's top-level
``tracking/`` and ``entrypoints/`` folders (the product layout). The wheel installs them
under this package (setup.py maps them), so nothing is installed as a top-level
``tracking`` or ``entrypoints`` module that could shadow another distribution. In a source
checkout the two folders sit beside this package and are found through ``__path__``.

An editable install (``pip install -e .``, as ``scripts/setup`` does per checkout) maps them
too, but the extension stays for the checkouts that are not installed into the interpreter
that runs them: ``mlflow run``'s own environment (``python_env.yaml`` installs the
requirements, not the project), and several checkouts sharing one environment, where the
editable finder would hand out the *installed* checkout's ``tracking/`` beside this
checkout's core.
"""

from pathlib import Path as _Path

__version__ = "0.1.0"

_checkout = _Path(__file__).resolve().parent.parent
if not (_Path(__file__).resolve().parent / "tracking").is_dir() and \
        (_checkout / "tracking" / "__init__.py").is_file() and \
        (_checkout / "entrypoints" / "__init__.py").is_file():
    __path__.append(str(_checkout))  # noqa: F821 - the package's own module path
del _Path, _checkout
