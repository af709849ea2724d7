"""Instantiates the method contract for every registered method."""


import pytest
from method_contract import MethodContract

from scarcelab.methods import METHODS
from scarcelab.methods.space import (
    Distribution,
    IntLogUniform,
    LogUniform,
    contains,
    int_pow10,
    pow10,
)

for _name in METHODS.names():
    globals()[f"TestContract_{_name}"] = type(
        f"TestContract_{_name}", (MethodContract,), {"method": _name}
    )


def test_pseudo_label_declaration_must_match_the_implementation():
    """A method that implements ``_pseudo_targets`` without declaring ``has_pseudo_labels``
    (or the reverse) fails at class creation, instead of silently getting the generic
    filter in diagnostics."""
    import pytest

    from scarcelab.methods import PseudoTargets, SemiMethod

    with pytest.raises(TypeError, match="has_pseudo_labels = False but it implements"):
        class Undeclared(SemiMethod):  # noqa: F841
            def step(self, batch, progress):
                return {}

            def _pseudo_targets(self, x, index) -> PseudoTargets | None:
                return None

    with pytest.raises(TypeError, match="does not implement _pseudo_targets"):
        class Unimplemented(SemiMethod):  # noqa: F841
            has_pseudo_labels = True

            def step(self, batch, progress):
                return {}


# -- search-space notation (mutation sample, docs/mutation.md) -------------------------
def test_contains_rejects_values_of_an_unknown_distribution_kind():
    class Fixed(Distribution):
        def suggest(self, trial, name):  # type: ignore[no-untyped-def]
            return 1

    assert contains(Fixed(), 1) is False


def test_pow10_and_int_pow10_bounds_are_the_papers_notation():
    """``3·10^U(-5,-2)`` is log-uniform on [3e-5, 3e-2]; ``int 10^U(1,3)`` on [10, 1000]."""
    d = pow10(3, -5, -2)
    assert isinstance(d, LogUniform)
    assert d.low == pytest.approx(3e-5) and d.high == pytest.approx(3e-2)
    assert contains(d, 3e-5) and not contains(d, 1e-6)
    i = int_pow10(1, 3)
    assert isinstance(i, IntLogUniform)
    assert (i.low, i.high) == (10, 1000)
    assert contains(i, 10) and not contains(i, 9)
