"""Comparing a guard test's recorded behaviour with what the code does now.

The guards (``tests/**/test_*_guard.py``) pin a function's whole observable behaviour —
every call, tag and metric it records — so that a refactoring that changes any of it
fails. Their numbers come from short training runs, and float32 kernels round
differently on different CPUs (an AVX2-only AMD EPYC gave ``train/loss`` 1.03176117
where the AVX-512 machine that recorded the guard gave 1.03176105, at the same code).
Exact equality of such numbers tests the machine, not the code. So everything is
compared exactly except floats, which must agree to ``rel`` (relative) or ``abs_``
(absolute, for values near zero): far below any change a behavioural difference makes,
far above float32 rounding.
"""

from __future__ import annotations

import math
from typing import Any

REL = 1e-5
ABS = 1e-6


def differences(got: Any, expected: Any, rel: float = REL, abs_: float = ABS,
                path: str = "") -> list[str]:
    """Where ``got`` and ``expected`` differ (empty: they agree), one line each."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return [] if got == expected and type(got) is type(expected) else \
            [f"{path or '.'}: {got!r} != {expected!r}"]
    if isinstance(expected, float) or isinstance(got, float):
        if not isinstance(got, (int, float)) or not isinstance(expected, (int, float)):
            return [f"{path or '.'}: {got!r} != {expected!r}"]
        if math.isnan(got) and math.isnan(expected):
            return []
        if math.isclose(got, expected, rel_tol=rel, abs_tol=abs_):
            return []
        return [f"{path or '.'}: {got!r} != {expected!r}"]
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            return [f"{path or '.'}: {type(got).__name__} != dict"]
        out = [f"{path}.{k!r}: missing" for k in expected if k not in got]
        out += [f"{path}.{k!r}: unexpected" for k in got if k not in expected]
        for k in expected:
            if k in got:
                out += differences(got[k], expected[k], rel, abs_, f"{path}.{k!r}")
        return out
    if isinstance(expected, (list, tuple)):
        if type(got) is not type(expected):
            return [f"{path or '.'}: {type(got).__name__} != {type(expected).__name__}"]
        out = [] if len(got) == len(expected) else \
            [f"{path or '.'}: length {len(got)} != {len(expected)}"]
        for i, (g, e) in enumerate(zip(got, expected, strict=False)):
            out += differences(g, e, rel, abs_, f"{path}[{i}]")
        return out
    return [] if got == expected else [f"{path or '.'}: {got!r} != {expected!r}"]


def assert_same_behaviour(got: Any, expected: Any, rel: float = REL, abs_: float = ABS
                          ) -> None:
    diffs = differences(got, expected, rel, abs_)
    assert not diffs, f"{len(diffs)} difference(s):\n" + "\n".join(diffs[:40])
