"""The entry points' commands, as the layers below them read them (issue 44 item 3).

A sweep checks a spec against the commands its cells run (their options, the help it
prints, the names an option takes) and continues a killed cell as its command declares;
the compare grid checks each cell's options with the study commands' own types. Those are
click commands defined in ``entrypoints/``, the layer above ``tracking/`` (DESIGN §1), and
importing them from here made tracking depend on the command line
(tests/project/test_layers.py). So the command line installs its table here when its group is
created (``entrypoints/cli.py`` calls :func:`install`), and tracking reads the table
through :func:`commands` without importing it. Every way a sweep or a compare starts goes
through that group (``scarcelab sweep``, ``mlflow run . -e sweep``, a sweep cell's
process), so the table is there when they read it; Python code that reads a spec without
the command line gets one line naming the fix.

What tracking asks of an option's type is duck-typed, so the types stay where they are
(``entrypoints/options.py``):

* ``names_only`` (true): the value is a name from a closed set (a registered method,
  dataset…, or fixed words); a ``click.Choice`` is one too. A sweep checks such values
  when it reads the spec, before anything runs;
* ``may_be_own(value)``: whether a dataset value may name a user's files, which only the
  cell's machine can read (the sweep leaves it to the cell);
* ``gives_path`` (true): the converted value is an absolute folder, passed on as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

_source: Callable[[], Mapping[str, Any]] | None = None


def install(source: Callable[[], Mapping[str, Any]]) -> None:
    """Called by the command line with a function that returns its commands (name ->
    click command; the group loads its command modules when they are first read)."""
    global _source
    _source = source


def commands() -> Mapping[str, Any]:
    """Name -> click command of every entry point."""
    if _source is None:
        raise LookupError("no command table: the sweep and compare layers read the "
                          "entry points' commands, which `import scarcelab.entrypoints.cli` "
                          "installs (the scarcelab command does); import it first")
    return _source()


def command(entry: str) -> Any | None:
    """The click command of ``entry``, None if there is none."""
    return commands().get(entry)


def params(entry: str) -> dict[str, Any]:
    """Option name (underscored) -> its click parameter, for an entry point (empty if it
    does not exist)."""
    cmd = command(entry)
    return {opt[2:].replace("-", "_"): p for p in (cmd.params if cmd else [])
            for opt in getattr(p, "opts", []) if opt.startswith("--")}


def takes_name(ptype: Any) -> bool:
    """Whether an option's type takes a name from a closed set (``names_only``, or a
    ``click.Choice``)."""
    import click

    return isinstance(ptype, click.Choice) or bool(getattr(ptype, "names_only", False))


def may_be_own(ptype: Any, value: str) -> bool:
    """Whether ``value`` of an option of type ``ptype`` may name a user's files."""
    check = getattr(ptype, "may_be_own", None)
    return bool(check(value)) if callable(check) else False


def gives_path(ptype: Any) -> bool:
    """Whether the option's converted value is an absolute folder."""
    return bool(getattr(ptype, "gives_path", False))
