"""The view registry: every table the query layer can build is one ``@view(...)`` entry.

A view's name, note, figures and the entry points whose sweeps report it live on its
registration, next to the function that computes it, so the ``leaderboard --view``
choices, the report's sections and a sweep's report parts are all read from here and
cannot drift apart (they were three hand-written lists, and ``transfer`` was missing from
one of them). A view added in a new module of this package is found without being listed
anywhere: the registry imports the package's modules on first lookup, like the method and
dataset registries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from scarcelab.registry import Registry

#: ``(tracked, table, filters) -> matplotlib Figure | None``: a figure drawn from a view
FigureFn = Callable[[Any, Any, dict[str, Any]], Any]
#: every grid's sweep report has the views whose ``entries`` hold this
EVERY_ENTRY = "*"


@dataclass(frozen=True)
class SweepContext:
    """What a sweep knows that a query does not: its name (the heading of a table file)
    and, read only when a view asks, its cells' resolved references (``@pretrain`` ->
    ``runs:/<id>/model``), so an encoder a dependency resolved is named as the spec does."""

    name: str
    experiment: str = ""
    refs: Callable[[], list[str]] = list


@dataclass(frozen=True)
class View:
    """One registered view.

    * ``build(tracked, **filters)`` returns the table;
    * ``note`` is the one paragraph under its section saying how it is computed;
    * ``figures`` maps figure names to :data:`FigureFn` (a figure may be ``None`` when the
      runs do not allow it, e.g. a CD diagram with no studies);
    * ``in_report``: a section of the full report (``leaderboard --output``);
    * ``entries``: the entry points whose sweep report includes it (:data:`EVERY_ENTRY`:
      every grid); empty: none;
    * ``section``: in a sweep report, part of the HTML/CSV sections page (True) or a file
      pair ``report/<name>.md`` / ``.csv`` of its own (False), written with ``markdown``
      under ``heading`` (none when empty) and built by ``sweep_build`` when a sweep knows
      more than a query (:class:`SweepContext`);
    * ``display``: a shorter table for the page (the CSV keeps every row), with
      ``display_note`` appended to the note when it is used;
    * ``needs``: the run role without which a sweep leaves its section out (the
      leaderboard of a grid with no studies);
    * ``order``: position among the report's sections and the CLI's choices.
    """

    name: str
    build: Callable[..., Any]
    note: str
    figures: Mapping[str, FigureFn] = field(default_factory=dict)
    in_report: bool = False
    entries: frozenset[str] = frozenset()
    section: bool = True
    markdown: Callable[[Any], str] | None = None
    heading: str = ""
    sweep_build: Callable[[Any, SweepContext], Any] | None = None
    display: Callable[[Any], Any] | None = None
    display_note: str = ""
    needs: str = ""
    order: int = 100

    def applies_to(self, entries: Iterable[str]) -> bool:
        """Whether a grid with cells of these entry points reports this view."""
        return EVERY_ENTRY in self.entries or bool(self.entries & set(entries))

    def for_sweep(self, t: Any, ctx: SweepContext) -> Any:
        return self.sweep_build(t, ctx) if self.sweep_build is not None else self.build(t)


REGISTRY: Registry[View] = Registry("view", packages=("scarcelab.tracking.query",))


def view(name: str, *, note: str, figures: Mapping[str, FigureFn] | None = None,
         in_report: bool = False, entries: Iterable[str] = (), section: bool = True,
         markdown: Callable[[Any], str] | None = None, heading: str = "",
         sweep_build: Callable[[Any, SweepContext], Any] | None = None,
         display: Callable[[Any], Any] | None = None, display_note: str = "",
         needs: str = "", order: int = 100) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated ``(tracked, **filters) -> DataFrame`` function as view
    ``name`` (see :class:`View` for the fields); the function itself is returned as it
    was, so it stays callable by its own name."""
    if not note.strip():
        raise ValueError(f"view {name!r}: give a note (the paragraph its section shows)")

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        REGISTRY.register(name)(View(name.lower(), fn, note, dict(figures or {}), in_report,
                                     frozenset(entries), section, markdown, heading,
                                     sweep_build, display, display_note, needs, order))
        return fn

    return deco


def static_view_names() -> list[str]:
    """The view names, in order, read from this package's files' ``@view("name", ...)``
    calls with ``ast`` instead of importing them, plus any view registered from outside
    (a plugin, a test) so far; once the registry is loaded, simply its names.

    Why: the CLI validates ``--view`` while parsing, and every command checks its options
    before importing MLflow, pandas or scipy (seconds); the registry's own lookup imports
    every view module. ``tests/tracking/query/test_query_view_registry.py`` checks both lists agree.
    """
    if REGISTRY._loaded:
        return view_names()
    import ast
    from pathlib import Path

    order: dict[str, float] = {}
    base = Path(__file__).resolve().parent
    for path in sorted(base.rglob("*.py")):
        if any(p.startswith("_") for p in path.relative_to(base).parts):
            continue  # as the registry's import walk: private modules and __init__
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            f = node.func
            fname = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            arg = node.args[0]
            if fname == "view" and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                pos = [k.value.value for k in node.keywords
                       if k.arg == "order" and isinstance(k.value, ast.Constant)
                       and isinstance(k.value.value, int | float)]
                order[arg.value.lower()] = float(pos[0]) if pos else 100.0
    for name, v in REGISTRY._entries.items():  # registered from code outside these files
        order.setdefault(name, float(v.order))
    return sorted(order, key=lambda n: (order[n], n))


def registered() -> list[View]:
    """Every view, in report order (then by name)."""
    return sorted((v for _, v in REGISTRY.items()), key=lambda v: (v.order, v.name))


def view_names() -> list[str]:
    return [v.name for v in registered()]


def get(name: str) -> View:
    """The view called ``name``; an unknown name is a ConfigError naming the valid ones."""
    return REGISTRY.get(name)


def report_views() -> list[str]:
    """The sections of the full report, in order."""
    return [v.name for v in registered() if v.in_report]


def sweep_views(entries: Iterable[str]) -> list[View]:
    """The views a grid with cells of these entry points reports, in order."""
    entries = set(entries)
    return [v for v in registered() if v.applies_to(entries)]


class ViewFunctions(Mapping[str, Callable[..., Any]]):
    """``name -> function`` of the registered views (the ``VIEWS`` dict older code reads),
    read from the registry on every access so that it never lists a view the registry
    does not hold, nor misses one."""

    def __getitem__(self, name: str) -> Callable[..., Any]:
        if name not in REGISTRY:
            raise KeyError(name)
        return REGISTRY.get(name).build

    def __iter__(self) -> Iterator[str]:
        return iter(view_names())

    def __len__(self) -> int:
        return len(view_names())
