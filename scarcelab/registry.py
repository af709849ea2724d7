"""Name -> factory registries (the timm ``register_model`` / ``list_models`` pattern).

Every pluggable thing (method, dataset, backbone, active-learning strategy) lives in one
file and registers itself with a decorator, so adding one never edits a central list.
Registries import their package's modules lazily on first lookup, so a new file in the
package is found without being named anywhere.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from scarcelab.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """A named collection of factories, filled by ``@registry.register("name")``.

    ``packages`` are imported (recursively, every module) the first time the registry
    is read, which triggers the decorators in the files that define the entries.
    """

    def __init__(self, kind: str, packages: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self._packages = packages
        self._entries: dict[str, T] = {}
        self._loaded = False

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
        if key not in self._entries:
            valid = ", ".join(sorted(self._entries)) or "(none registered)"
            raise ConfigError(f"unknown {self.kind} {name!r}; valid names: {valid}")
        return self._entries[key]

    def names(self) -> list[str]:
        self._load()
        return sorted(self._entries)

    def items(self) -> Iterator[tuple[str, T]]:
        self._load()
        for key in sorted(self._entries):
            yield key, self._entries[key]

    def __contains__(self, name: object) -> bool:
        self._load()
        return str(name).lower() in self._entries

    def create(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self.get(name)(*args, **kwargs)  # type: ignore[operator]
