"""Search-space distributions, written the way the papers write them.

The SSL-vs-SSL study (Huang et al., App. F.1) states ranges as ``3·10^U(-5,-2)``; such a
draw is exactly a log-uniform draw on ``[3e-5, 3e-2]``, so :func:`pow10` maps the paper's
notation onto Optuna's ``suggest_float(log=True)`` and the sampled value is what is
logged. Distributions are tiny value objects so a method file can declare its space as a
class attribute without importing Optuna.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Protocol


class _Trial(Protocol):  # the subset of optuna.Trial we use
    def suggest_float(self, name: str, low: float, high: float, *, log: bool = False) -> float: ...
    def suggest_int(self, name: str, low: int, high: int, *, log: bool = False) -> int: ...
    def suggest_categorical(self, name: str, choices: Any) -> Any: ...


class Distribution(ABC):
    @abstractmethod
    def suggest(self, trial: _Trial, name: str) -> Any:
        """Draw this hyperparameter for ``trial`` under ``name``."""

    def describe(self) -> str:
        return repr(self)


@dataclass(frozen=True)
class Uniform(Distribution):
    low: float
    high: float

    def suggest(self, trial: _Trial, name: str) -> float:
        return trial.suggest_float(name, self.low, self.high)

    def describe(self) -> str:
        return f"U({self.low:g}, {self.high:g})"


@dataclass(frozen=True)
class LogUniform(Distribution):
    low: float
    high: float
    label: str = ""

    def suggest(self, trial: _Trial, name: str) -> float:
        return trial.suggest_float(name, self.low, self.high, log=True)

    def describe(self) -> str:
        return self.label or f"logU({self.low:g}, {self.high:g})"


@dataclass(frozen=True)
class IntLogUniform(Distribution):
    low: int
    high: int
    label: str = ""

    def suggest(self, trial: _Trial, name: str) -> int:
        return trial.suggest_int(name, self.low, self.high, log=True)

    def describe(self) -> str:
        return self.label or f"int logU({self.low}, {self.high})"


@dataclass(frozen=True)
class Choice(Distribution):
    options: tuple[Any, ...]

    def suggest(self, trial: _Trial, name: str) -> Any:
        return trial.suggest_categorical(name, list(self.options))

    def describe(self) -> str:
        return f"one of {list(self.options)}"


def pow10(scale: float, a: float, b: float) -> LogUniform:
    """``scale · 10^U(a, b)``, the paper's notation, as a log-uniform distribution."""
    return LogUniform(scale * 10.0**a, scale * 10.0**b, label=f"{scale:g}·10^U({a:g},{b:g})")


def int_pow10(a: float, b: float) -> IntLogUniform:
    """Integer ``10^U(a, b)`` (e.g. SwAV's number of prototypes)."""
    return IntLogUniform(int(round(10.0**a)), int(round(10.0**b)), label=f"int 10^U({a:g},{b:g})")


# -- ranges several methods share (declared once; a method adds only its own entries) ----

#: SSL-vs-SSL (Huang et al., CVPR 2024) App. F.1: the optimiser ranges of every classifier
#: method it compares — the supervised baselines (``sup``, ``mixup``) and every
#: semi-supervised method. Listed first in each space, since :func:`sample` draws in order.
CLASSIFIER_SPACE: dict[str, Distribution] = {"lr": pow10(3, -5, -2),
                                             "weight_decay": pow10(4, -6, -3)}
#: Their literature-free defaults: roughly the centres of those ranges (docs/methods-semi.md).
CLASSIFIER_DEFAULTS: dict[str, Any] = {"lr": 3e-3, "weight_decay": 5e-4}
#: SSL-vs-SSL App. F.1: the optimiser ranges of every self-supervised method
#: (docs/methods-self.md: "All seven draw lr ~ 10^U(-4.5, -1.5) and ...").
SELFSUP_SPACE: dict[str, Distribution] = {"lr": pow10(1, -4.5, -1.5),
                                          "weight_decay": pow10(1, -6.5, -3.5)}


def sample(space: dict[str, Distribution], trial: _Trial) -> dict[str, Any]:
    """Draw one configuration; the order of keys fixes the order of RNG draws."""
    return {name: dist.suggest(trial, name) for name, dist in space.items()}


def contains(dist: Distribution, value: Any) -> bool:
    """Whether ``value`` lies in the support (used to validate user overrides in tests)."""
    if isinstance(dist, (Uniform, LogUniform)):
        return dist.low - 1e-12 <= float(value) <= dist.high + 1e-12 and math.isfinite(value)
    if isinstance(dist, IntLogUniform):
        return dist.low <= int(value) <= dist.high
    if isinstance(dist, Choice):
        return value in dist.options
    return False
