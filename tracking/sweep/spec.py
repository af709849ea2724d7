"""Grid specs: a YAML file that names a benchmark grid, expanded into cells.

A cell is one invocation of a scarcelab entry point (one study, one AL sweep of a strategy,
one probe, ...). The spec lists grids; in a grid every list-valued key is an *axis* and
the grid is the cartesian product of its axes, every scalar key a fixed option. Keys are
the entry point's own options (``budget_minutes`` or ``budget-minutes`` for
``--budget-minutes``), so a cell runs exactly as the same command typed by hand would::

    name: ssl-mini                 # the sweep (tag scarcelab.sweep); required
    experiment: ssl-mini           # MLflow experiment of every cell (default: name)
    cpus_per_cell: 1               # Ray resources of one cell
    gpus_per_cell: auto            # auto: 1 when the cluster has GPUs, else 0
    retries: 1                     # a failed cell is run again at most this often
    grids:
      - entry: semi
        method: [fixmatch, pseudolabel]
        dataset: [breastmnist, pneumoniamnist]
        seed: [0, 1]
        budget_minutes: 2
    full:                          # merged into every grid by `scarcelab sweep --full`
      budget_minutes: 60

Why validation happens here and not in the cell: a typo in an option name of cell 37 of 40
should fail the sweep before the first cell runs, with the line of the spec that holds it.
Option names are checked against the entry point's click command; values are checked by
the command itself when the cell runs (the one validation layer every caller shares).
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

TOP_KEYS = {"name", "experiment", "cpus_per_cell", "gpus_per_cell", "retries", "grids",
            "full", "description", "env"}
# Options the driver sets itself: a spec may not override them.
RESERVED = {"experiment"}


class SpecError(ValueError):
    """A spec that cannot run; the message starts with ``file:line:``."""


@dataclass(frozen=True)
class Cell:
    """One invocation of an entry point with its options (values as strings)."""

    entry: str
    options: tuple[tuple[str, str], ...]
    grid: int  # index of the grid it came from

    @property
    def id(self) -> str:
        """Stable across re-runs of the same spec: what a finished cell is recognised by."""
        # sorted: reordering the keys of a grid does not make its cells new ones
        blob = json.dumps([self.entry, sorted(self.options)])
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def label(self) -> str:
        return " ".join([self.entry] + [f"{k}={v}" for k, v in self.options])

    def argv(self) -> list[str]:
        out = [self.entry]
        for k, v in self.options:
            out += [f"--{k.replace('_', '-')}", v]
        return out


@dataclass
class SweepSpec:
    name: str
    experiment: str
    cells: list[Cell]
    cpus_per_cell: float = 1.0
    gpus_per_cell: float | str = "auto"
    retries: int = 1
    env: dict[str, str] = field(default_factory=dict)
    path: str = ""
    text: str = ""

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:16]


def _line(node: yaml.Node | None) -> int:
    return node.start_mark.line + 1 if node is not None else 0


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        # `set: {lambda_u: 1, threshold: 0.9}` -> the CLI's "lambda_u=1,threshold=0.9"
        return ",".join(f"{k}={_scalar(v)}" for k, v in value.items())
    return str(value)


class _Located:
    """The composed YAML tree beside the loaded data, to point errors at lines."""

    def __init__(self, path: str, node: yaml.Node) -> None:
        self.path = path
        self.node = node

    def child(self, node: yaml.Node | None, key: str) -> yaml.Node | None:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == key:
                    return v
        return None

    def key_node(self, node: yaml.Node | None, key: str) -> yaml.Node | None:
        if isinstance(node, yaml.MappingNode):
            for k, _ in node.value:
                if k.value == key:
                    return k
        return None

    def item(self, node: yaml.Node | None, i: int) -> yaml.Node | None:
        if isinstance(node, yaml.SequenceNode) and i < len(node.value):
            return node.value[i]
        return None

    def error(self, node: yaml.Node | None, msg: str) -> SpecError:
        return SpecError(f"{self.path}:{_line(node)}: {msg}")


def entry_options(entry: str) -> dict[str, str] | None:
    """Option name (underscored) -> its help, for a registered entry point; None if the
    entry point does not exist. Reads the click commands: no heavy import happens."""
    from scarcelab.entrypoints.cli import main

    cmd = main.commands.get(entry)
    if cmd is None:
        return None
    out = {}
    for p in cmd.params:
        for opt in getattr(p, "opts", []):
            if opt.startswith("--"):
                out[opt[2:].replace("-", "_")] = getattr(p, "help", "") or ""
    return out


def _entries() -> list[str]:
    from scarcelab.entrypoints.cli import main

    return sorted(n for n in main.commands if n not in ("sweep", "list", "stack"))


def parse_spec(text: str, path: str = "<spec>", full: bool = False) -> SweepSpec:
    """Parse and validate a spec; ``full`` merges its ``full:`` section into every grid."""
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 0
        raise SpecError(f"{path}:{line}: not valid YAML: {getattr(e, 'problem', e)}") from None
    loc = _Located(path, node)
    if not isinstance(data, dict):
        raise loc.error(node, "a spec is a mapping with at least 'name' and 'grids'")
    for k in data:
        if k not in TOP_KEYS:
            raise loc.error(loc.key_node(node, k),
                            f"unknown key {k!r}; valid: {', '.join(sorted(TOP_KEYS))}")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise loc.error(loc.child(node, "name") or node, "'name' (the sweep's name) is required")
    grids = data.get("grids")
    gnode = loc.child(node, "grids")
    if not isinstance(grids, list) or not grids:
        raise loc.error(gnode or node, "'grids' must be a non-empty list of grids")
    full_over = data.get("full") or {}
    if not isinstance(full_over, dict):
        raise loc.error(loc.child(node, "full"), "'full' must be a mapping of options")

    def number(key: str, default: float, minimum: float) -> float:
        v = data.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int | float) or v < minimum:
            raise loc.error(loc.child(node, key), f"{key!r} must be a number >= {minimum}, "
                            f"got {v!r}")
        return float(v)

    cpus = number("cpus_per_cell", 1, 0.01)
    gpus: float | str = data.get("gpus_per_cell", "auto")
    if gpus != "auto":
        gpus = number("gpus_per_cell", 0, 0)
    retries = int(number("retries", 1, 0))
    env = data.get("env") or {}
    if not isinstance(env, dict):
        raise loc.error(loc.child(node, "env"), "'env' must be a mapping NAME: value")

    cells: list[Cell] = []
    seen: dict[str, int] = {}
    entries = None
    for gi, grid in enumerate(grids):
        gn = loc.item(gnode, gi)
        if not isinstance(grid, dict) or "entry" not in grid:
            raise loc.error(gn, "each grid is a mapping with an 'entry' (e.g. entry: semi)")
        entry = str(grid["entry"])
        opts = entry_options(entry)
        if opts is None:
            entries = entries or _entries()
            raise loc.error(loc.child(gn, "entry"), f"unknown entry point {entry!r}; valid: "
                            f"{', '.join(entries)}")
        merged = {**grid, **(full_over if full else {})}
        axes: list[tuple[str, list[str]]] = []
        for raw_key, value in merged.items():
            if raw_key == "entry":
                continue
            key = str(raw_key).replace("-", "_")
            kn = loc.key_node(gn, raw_key) or loc.key_node(loc.child(node, "full"), raw_key)
            if key in RESERVED:
                raise loc.error(kn, f"{raw_key!r} is set by the sweep (the spec's top-level "
                                "'experiment'), not per grid")
            if key not in opts:
                raise loc.error(kn, f"{entry} has no option {raw_key!r}; valid: "
                                f"{', '.join(sorted(k for k in opts if k not in RESERVED))}")
            values = value if isinstance(value, list) else [value]
            if not values:
                raise loc.error(kn, f"{raw_key!r} is an empty list: the grid would be empty")
            for v in values:
                if v is None or isinstance(v, list):
                    raise loc.error(kn, f"{raw_key!r}: each value must be a scalar or a "
                                    f"mapping, got {v!r}")
            axes.append((key, [_scalar(v) for v in values]))
        for combo in itertools.product(*(vals for _, vals in axes)):
            cell = Cell(entry, tuple((k, v) for (k, _), v in zip(axes, combo, strict=True)), gi)
            if cell.id in seen:
                raise loc.error(gn, f"cell {cell.label!r} appears twice (grids {seen[cell.id]} "
                                f"and {gi}): a sweep runs each cell once")
            seen[cell.id] = gi
            cells.append(cell)
    return SweepSpec(name=name.strip(), experiment=str(data.get("experiment") or name).strip(),
                     cells=cells, cpus_per_cell=cpus, gpus_per_cell=gpus, retries=retries,
                     env={str(k): str(v) for k, v in env.items()}, path=path, text=text)


def load_spec(path: str | Path, full: bool = False) -> SweepSpec:
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"{p}: no such spec file (a YAML grid spec; see docs/sweeps.md)")
    return parse_spec(p.read_text(), str(p), full=full)
