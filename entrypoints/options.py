"""Parsing of MLflow-Projects-style string parameters, shared by all commands.

MLflow Projects passes every parameter as a string (an empty default renders as ``''``,
a float one as ``"2.0"``), so options accept the literal ``default`` / empty string and
are converted here, once.
"""

from __future__ import annotations

import click


def opt_int(value: str | None, name: str) -> int | None:
    if value in (None, "", "default", "none", "None"):
        return None
    try:
        return int(float(value))  # MLflow renders float params as "2.0"
    except ValueError:
        raise click.BadParameter(f"expected an integer or 'default', got {value!r}",
                                 param_hint=name) from None


def label_budget(value: str | None, name: str) -> int | str | None:
    if value in (None, "", "default"):
        return None
    if value == "all":
        return "all"
    return opt_int(value, name)


def bool_option(value: str) -> bool:
    v = str(value).strip().lower()
    if v in ("1", "true", "yes", "y", "on"):
        return True
    if v in ("0", "false", "no", "n", "off", ""):
        return False
    raise click.BadParameter(f"expected true/false, got {value!r}")
