"""Pool-based active learning following the CDALBench protocol (Werner et al.).

``STRATEGIES`` holds one query strategy per file in ``scarcelab.active.strategies``; the
loop in :mod:`scarcelab.active.loop` runs them under three independent seeds (strategy,
data, model) and reports through the core ``Tracker`` interface.
"""

from __future__ import annotations

from scarcelab.registry import PACKAGES, Registry

STRATEGIES: Registry = Registry("strategy", PACKAGES["strategy"])
register_strategy = STRATEGIES.register

__all__ = ["STRATEGIES", "register_strategy"]
