"""Instantiates the method contract for every registered method."""

from method_contract import MethodContract

from scarcelab.methods import METHODS

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
