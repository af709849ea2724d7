"""Name -> factory registries (the timm ``register_model`` / ``list_models`` pattern).

Every pluggable thing (method, dataset, backbone, active-learning strategy) lives in one
file and registers itself with a decorator, so adding one never edits a central list.
Registries import their package's modules lazily on first lookup, so a new file in the
package is found without being named anywhere.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar, cast

from scarcelab.errors import ConfigError

T = TypeVar("T")


#: the registry of each kind, once its package is imported (see :func:`registered_so_far`)
_LIVE: dict[str, Registry[Any]] = {}


def registered_so_far(kind: str) -> set[str]:
    """The names a registry of ``kind`` holds right now, without importing its files: the
    names registered from code outside them (a plugin or a test that registers its own
    dataset before calling the CLI), which :class:`StaticIndex` cannot see."""
    live = _LIVE.get(kind)
    return set(live._entries) if live is not None else set()


class Registry(Generic[T]):
    """A named collection of factories, filled by ``@registry.register("name")``.

    ``packages`` are imported (recursively, every module) the first time the registry
    is read, which triggers the decorators in the files that define the entries.
    """

    def __init__(self, kind: str, packages: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self._packages = packages
        self._entries: dict[str, T] = {}
        self._plugins: set[str] = set()  # the entries loaded from plugins
        self._loaded = False
        _LIVE.setdefault(kind, self)

    def _plugin(self, key: str) -> bool:
        """Register the installed plugin named ``key`` (its entry point loaded now, not
        before: a plugin is imported only when it is used); whether there is one. A name
        the package registers itself always wins over a plugin's."""
        ep = plugin_entry_points(self.kind).get(key)
        if ep is None:
            return False
        try:
            obj = ep.load()
        except Exception as e:  # noqa: BLE001 - a broken plugin: one line naming it
            raise ConfigError(f"{self.kind} plugin {key!r} ({ep.value}, group "
                              f"{PLUGIN_GROUPS[self.kind]}) failed to load: "
                              f"{type(e).__name__}: {e}") from None
        if not callable(obj):
            raise ConfigError(f"{self.kind} plugin {key!r} ({ep.value}) is not callable; "
                              "its entry point must name a loader function")
        self._entries[key] = cast(T, obj)  # a plugin is a loader, what this registry holds
        self._plugins.add(key)
        return True

    def register(self, name: str) -> Callable[[T], T]:
        key = name.lower()

        def deco(obj: T) -> T:
            if key in self._entries and self._entries[key] is not obj:
                raise ConfigError(f"{self.kind} {key!r} is registered twice")
            self._entries[key] = obj
            try:
                obj.registered_name = key  # type: ignore[attr-defined]
            except (AttributeError, TypeError):
                pass
            return obj

        return deco

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for pkg_name in self._packages:
            pkg = importlib.import_module(pkg_name)
            for info in pkgutil.walk_packages(pkg.__path__, prefix=pkg.__name__ + "."):
                if info.name.rsplit(".", 1)[-1].startswith("_"):
                    continue
                importlib.import_module(info.name)

    def get(self, name: str) -> T:
        self._load()
        key = str(name).lower()
        if key not in self._entries and not self._plugin(key):
            raise ConfigError(unknown_name(self.kind, name, self.names()))
        return self._entries[key]

    def names(self) -> list[str]:
        """Registered names, and those of installed plugins (not imported)."""
        self._load()
        return sorted(set(self._entries) | set(plugin_entry_points(self.kind)))

    def items(self) -> Iterator[tuple[str, T]]:
        self._load()
        for key in sorted(self._entries):
            yield key, self._entries[key]

    def __contains__(self, name: object) -> bool:
        self._load()
        key = str(name).lower()
        return key in self._entries or key in plugin_entry_points(self.kind)

    def create(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self.get(name)(*args, **kwargs)  # type: ignore[operator]


# -- plugins: a user's package of its own ---------------------------------------------------
#: the entry-point group of each kind that takes plugins. A dataset plugin is a package that
#: declares, e.g. in its pyproject.toml, ``[project.entry-points."scarcelab.datasets"]
#: chest = "mypkg.data:load_chest"``, a loader ``(data_dir=None) -> RawDataset``; once it
#: is installed (``pip install``; on every Ray node of a sweep too, e.g. through the
#: cluster's ``runtime_env={"pip": [...]}``), ``--dataset chest`` finds it. Why entry
#: points: the names are read from the installed packages' metadata, so listing and
#: checking a name import nothing, and a user's loader travels as their own package, never
#: as a fork of this one (issue 39).
PLUGIN_GROUPS: dict[str, str] = {"dataset": "scarcelab.datasets"}
#: characters a plugin's name may not hold: ``:`` and ``/`` belong to folder:/csv: names
_PLUGIN_FORBIDDEN = re.compile(r"[:/\\\s]")


def plugin_entry_points(kind: str) -> dict[str, Any]:
    """Installed plugins of ``kind``: lower-case name -> its ``importlib.metadata``
    entry point (metadata only; nothing is imported). Names holding ``:``, ``/`` or
    whitespace are skipped: they could not be told from a path."""
    group = PLUGIN_GROUPS.get(kind)
    if group is None:
        return {}
    import sys
    from importlib.metadata import entry_points

    where = (group, tuple(sys.path))  # reading the metadata costs ~10 ms: once per path
    if where not in _PLUGIN_CACHE:
        out: dict[str, Any] = {}
        for ep in entry_points(group=group):
            key = ep.name.lower()
            if not _PLUGIN_FORBIDDEN.search(key):
                out.setdefault(key, ep)
        _PLUGIN_CACHE[where] = out
    return _PLUGIN_CACHE[where]


_PLUGIN_CACHE: dict[tuple[str, tuple[str, ...]], dict[str, Any]] = {}


def refresh_plugins() -> None:
    """Forget the plugins read and loaded so far (a package installed or removed while the
    process runs): they are looked up again on next use."""
    _PLUGIN_CACHE.clear()
    for reg in _LIVE.values():
        for key in reg._plugins:
            reg._entries.pop(key, None)
        reg._plugins.clear()


def plugin_names(kind: str) -> list[str]:
    return sorted(plugin_entry_points(kind))


# -- names without imports ---------------------------------------------------------------
#: the packages each registry loads, by kind (the registries themselves are built from
#: this, so the static index below reads the same files the real lookup imports)
PACKAGES: dict[str, tuple[str, ...]] = {
    "method": ("scarcelab.methods.supervised", "scarcelab.methods.semi",
               "scarcelab.methods.selfsup"),
    "strategy": ("scarcelab.active.strategies",),
    "arch": ("scarcelab.models",),
    "dataset": ("scarcelab.data.sources",),
    "segmentation dataset": ("scarcelab.data.nuclei",),
}
#: the family of a method, from the sub-package its file lives in
METHOD_FAMILY = {"supervised": "supervised", "semi": "semi", "selfsup": "self"}
_REGISTER_CALLS = ("register", "register_model", "register_strategy")


class StaticIndex:
    """The names a registry will hold, read from its files' ``@register("name")`` calls
    with ``ast`` instead of importing them.

    Why: importing a method file imports torch (seconds); a typo in ``--method`` must be
    answered before that. ``complete`` is False where some file registers a computed name
    (MedMNIST's loop over its table): a name missing from such an index is decided by the
    real registry, never refused here.
    """

    def __init__(self, kind: str) -> None:
        import ast
        from pathlib import Path

        self.kind = kind
        self.where: dict[str, str] = {}  # name -> the module (file) that registers it
        self.complete = True
        root = Path(__file__).resolve().parent  # the scarcelab package
        for pkg in PACKAGES[kind]:
            base = root.joinpath(*pkg.split(".")[1:])
            for path in sorted(base.rglob("*.py")):
                if any(p.startswith("_") and p != "__init__.py"
                       for p in path.relative_to(base).parts):
                    continue
                rel = path.relative_to(base).with_suffix("").parts
                mod = ".".join((pkg, *(rel[:-1] if rel[-1] == "__init__" else rel)))
                tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
                loops = _loop_names(tree)
                for node in ast.walk(tree):
                    if not (isinstance(node, ast.Call) and node.args):
                        continue
                    f = node.func
                    fname = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                    if fname not in _REGISTER_CALLS:
                        continue
                    arg = node.args[0]
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        self.where[arg.value.lower()] = mod
                    elif isinstance(arg, ast.Name) and arg.id in loops:
                        self.where.update({n.lower(): mod for n in loops[arg.id]})
                    else:
                        self.complete = False

    def names(self, family: str | None = None) -> list[str]:
        return sorted(n for n in self.where if family is None or self.family(n) == family)

    def family(self, name: str) -> str | None:
        """A method's family (``supervised``/``semi``/``self``), from its folder."""
        parts = self.where.get(name.lower(), "").split(".")
        return METHOD_FAMILY.get(parts[-2]) if self.kind == "method" and len(parts) > 2 else None


def _loop_names(tree: Any) -> dict[str, list[str]]:
    """``for _name in TABLE: register(_name)`` at module level, with ``TABLE`` a literal dict
    or list of strings: loop variable -> those strings (how MedMNIST registers its 12+
    datasets from one table)."""
    import ast

    literals: dict[str, list[str]] = {}
    for node in tree.body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if not isinstance(target, ast.Name) or value is None:
            continue
        items = value.keys if isinstance(value, ast.Dict) else (
            value.elts if isinstance(value, (ast.List, ast.Tuple)) else [])
        strs = [k.value for k in items if isinstance(k, ast.Constant)
                and isinstance(k.value, str)]
        if strs and len(strs) == len(items):
            literals[target.id] = strs
    out: dict[str, list[str]] = {}
    for node in tree.body:
        if (isinstance(node, ast.For) and isinstance(node.target, ast.Name)
                and isinstance(node.iter, ast.Name) and node.iter.id in literals):
            out[node.target.id] = literals[node.iter.id]
    return out


def did_you_mean(name: str, names: list[str] | tuple[str, ...]) -> str:
    """`` did you mean fixmatch? (also close: mixmatch)`` for a near miss (difflib's ratio
    >= 0.6, the closest three, best first), else ``''``."""
    import difflib

    close = difflib.get_close_matches(str(name).lower(), list(names), n=3, cutoff=0.6)
    if not close:
        return ""
    also = f" (also close: {', '.join(close[1:])})" if close[1:] else ""
    return f" did you mean {close[0]}?{also}"


def unknown_name(kind: str, name: str, names: list[str] | tuple[str, ...],
                 what: str = "") -> str:
    """The one message for an unknown name: the near misses first, then the valid names
    (``what``: which of them, e.g. 'semi methods')."""
    valid = ", ".join(sorted(names)) or "(none registered)"
    return (f"unknown {kind} {name!r};{did_you_mean(name, names)} "
            f"{what or 'valid names'}: {valid}").replace(";  ", "; ")


def static_index(kind: str) -> StaticIndex:
    """One :class:`StaticIndex` per kind and process."""
    if kind not in _INDEXES:
        _INDEXES[kind] = StaticIndex(kind)
    return _INDEXES[kind]


_INDEXES: dict[str, StaticIndex] = {}
#: the ``scarcelab list`` word that lists each kind (named in an unknown name's message)
LIST_WORDS = {"method": "methods", "dataset": "datasets", "arch": "archs",
              "strategy": "strategies", "segmentation dataset": "datasets"}


def check_name(kind: str, value: str, family: str | None = None) -> str:
    """``value`` if it is a registered ``kind`` name (of ``family``, for a method), read
    from the registry's files without importing them (:class:`StaticIndex`); else
    ``ValueError`` with the near misses and the names that fit. A registry whose names are
    computed (``StaticIndex.complete`` false) decides after import: the name passes here.

    Why in the core: the entry points' option type (``Registered``) and the compare grid
    (``tracking/compare/grid.py``, below the entry points) both check names with it, and
    the layers below the command line may not import it (tests/project/test_layers.py)."""
    idx = static_index(kind)
    if value.lower() in idx.where:
        got = idx.family(value)
        if family is not None and got != family:
            raise ValueError(f"{value} is a {got} method, not {family}; run it with "
                             f"`scarcelab {got} --method {value}` (mlflow run . -e {got} "
                             f"-P method={value}); {family} methods: "
                             f"{', '.join(idx.names(family))}")
        return value
    if not idx.complete or value.lower() in registered_so_far(kind):
        return value  # computed names, or one registered by the caller's code
    names = idx.names(family)
    what = f"{family} methods" if family else f"{kind}s"
    near = did_you_mean(value, names)
    raise ValueError(f"unknown {kind};{near}{';' if near else ''} {what}: "
                     f"{', '.join(names)} (scarcelab list {LIST_WORDS.get(kind, '')})"
                     .replace(" ()", ""))
