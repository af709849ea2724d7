"""The query layer: tracked studies -> the tables and figures of the papers we implement.

    from scarcelab.tracking.query import load, leaderboard, gains, profile, significance, ranks
    t = load("my-benchmark", tracking_uri="sqlite:///mlflow.db")   # read once
    leaderboard(t, dataset="pathmnist", sort_by="test_auroc_mean")
    gains(t); profile(t); significance(t); ranks(t)

See docs/query.md for what every column means and how each view is computed; a new view
is one ``@view(name, note=...)`` function in a module of this package (registry.py).

The names below are imported on first use (PEP 562), so that the CLI can read the view
registry's names (``registry.static_view_names``) when it parses ``--view`` without
importing pandas, scipy and MLflow: every command checks its options before those.
"""

from __future__ import annotations

import importlib
from typing import Any

#: exported name -> the module that defines it
_EXPORTS = {
    "Tracked": "frame", "load": "frame", "tidy_runs": "frame",
    "View": "registry", "view": "registry", "view_names": "registry",
    "log_report": "report", "sections": "report",
    "ApiReader": "store", "SqlReader": "store", "open_reader": "store",
    **{n: "views" for n in ("VIEWS", "al_ranks", "al_scores", "filter_frame", "gains",
                            "leaderboard", "mixed_budgets", "per_study", "profile", "ranks",
                            "significance", "study_scores", "transfer")},
}

# built from _EXPORTS (the names __getattr__ imports on first use): pyright follows only
# a literal __all__, and no name here is bound until first use anyway
__all__ = sorted(_EXPORTS)  # pyright: ignore[reportUnsupportedDunderAll]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    try:  # a submodule: ``query.render`` after ``import scarcelab.tracking.query as query``
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
