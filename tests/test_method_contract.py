"""Instantiates the method contract for every registered method."""

from method_contract import MethodContract

from scarcelab.methods import METHODS

for _name in METHODS.names():
    globals()[f"TestContract_{_name}"] = type(
        f"TestContract_{_name}", (MethodContract,), {"method": _name}
    )
