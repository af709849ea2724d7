"""Training methods by name. One file per method under ``supervised/``, ``semi/``, ``selfsup/``.

Adding a method = adding one file that subclasses ``SupervisedMethod`` / ``SemiMethod`` /
``SelfSupMethod`` and decorates it with ``@register("name")``; nothing else changes.
"""

from __future__ import annotations

from scarcelab.methods.base import (
    Batch,
    DataInfo,
    Losses,
    Method,
    Progress,
    PseudoTargets,
    SelfSupMethod,
    SemiMethod,
    SupervisedMethod,
)
from scarcelab.registry import PACKAGES, Registry

METHODS: Registry = Registry("method", PACKAGES["method"])
register = METHODS.register


def get_method(name: str) -> type[Method]:
    return METHODS.get(name)


__all__ = [
    "METHODS",
    "Batch",
    "DataInfo",
    "Losses",
    "Method",
    "Progress",
    "PseudoTargets",
    "SelfSupMethod",
    "SemiMethod",
    "SupervisedMethod",
    "get_method",
    "register",
]
