"""Grid specs: a YAML file that names a benchmark grid, expanded into cells.

A cell is one invocation of a scarcelab entry point (one study, one AL sweep of a strategy,
one probe, ...). The spec lists grids; in a grid every list-valued key is an *axis* and
the grid is the cartesian product of its axes, every scalar key a fixed option. Keys are
the entry point's own options (``budget_minutes`` or ``budget-minutes`` for
``--budget-minutes``), so a cell runs exactly as the same command typed by hand would::

    name: ssl-mini                 # the sweep (tag scarcelab.sweep); required
    experiment: ssl-mini           # MLflow experiment of every cell (default: name)
    cpus_per_cell: 1               # Ray resources of one cell
    gpus_per_cell: auto            # auto: 1 when the cluster has GPUs, else 0; 0.125: 8 per GPU
    gpu_memory_fraction: auto      # auto: gpus_per_cell when below 1, else no cap
    mps: false                     # start CUDA MPS for cells sharing a GPU
    retries: 1                     # a failed cell is run again at most this often
    grids:
      - entry: semi
        method: [fixmatch, pseudolabel]
        dataset: [breastmnist, pneumoniamnist]
        seed: [0, 1]
        budget_minutes: 2
    full:                          # merged into every grid by `scarcelab sweep --full`
      budget_minutes: 60
    smoke:                         # merged into every grid by `scarcelab sweep --smoke`
      max_epochs: 1

Four scales: the grids as written (the *reference* scale), ``--full`` (the source study's
own scale), ``--smoke`` (a trivial size that still runs every method of the grid, for
CI) and ``--claims`` (a design sized to *test* the paper's headline claims on a small
machine, e.g. many repetitions of a few cells: issue 41 item 5; it records into
``<experiment>-claims``). A grid may carry its own ``full:`` / ``smoke:`` / ``claims:``
mapping, merged after the top-level one, for options only its entry point has
(``segment``'s ``steps_per_epoch``) or axes of its own at that scale (CDALBench's claims
design reshapes each grid). The top-level ``full:`` / ``smoke:`` / ``claims:`` may also
set the resource keys (``RESOURCE_KEYS``), which then replace the top-level ones at that
scale: a suite's CPU reference grid takes no GPU (``gpus_per_cell: 0``) while its
``full:`` GPU scale packs eight studies on a card (``gpus_per_cell: 0.125``). A smoke
sweep records into ``<experiment>-smoke`` (or the smoke block's ``experiment:``), so its
trivial numbers never mix with a reference run's in one leaderboard.

A grid may carry an ``id``; an option value ``"@<id>"`` in another grid is a *dependency*:
that option receives ``runs:/<run id>/model`` of the finished run of the matching cell of
the grid with that id (the one whose values agree on the referenced grid's axes), resolved
by the driver when the dependent cell is submitted::

    grids:
      - {id: pretrain, entry: self, method: simclr, dataset: pathology_crops, seed: [0, 1]}
      - {entry: probe, encoder: [random, "@pretrain"], seed: [0, 1]}

Exactly one cell must match (else a spec error with the line); cycles are refused. The
literal reference is part of the dependent cell's options, and the id of the cell it
matched is part of its cell id, so ids are stable across re-runs and a changed dependency
makes its dependents new cells.

Why validation happens here and not in the cell: a typo in an option name of cell 37 of 40
should fail the sweep before the first cell runs, with the line of the spec that holds it.
Option names are checked against the entry point's click command; values are checked by
the command itself when the cell runs (the one validation layer every caller shares).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from scarcelab.tracking import commands

#: a cell's share of a machine: Ray's resources, its GPU memory cap, CUDA MPS. Top-level,
#: and in a top-level ``full:`` / ``smoke:`` block for that scale (docs/sweeps.md)
RESOURCE_KEYS = ("cpus_per_cell", "gpus_per_cell", "gpu_memory_fraction", "mps")
TOP_KEYS = {"name", "experiment", "retries", "grids", "full", "smoke", "claims",
            "description", "env", *RESOURCE_KEYS}
#: the scales a spec runs at (``scarcelab sweep --smoke`` / ``--full`` / ``--claims``)
SCALES = ("reference", "smoke", "full", "claims")
#: the scales written as a block (``full:``, ``smoke:``, ``claims:``) merged into the grids
SCALE_BLOCKS = ("full", "smoke", "claims")
#: the scales that record into ``<experiment>-<scale>``: their numbers are of another
#: design than the reference grid's and must not mix with them in one leaderboard
OWN_EXPERIMENT = ("smoke", "claims")
# Options the driver sets itself: a spec may not override them.
RESERVED = {"experiment"}


#: Keys of a grid that are not options of its entry point.
GRID_KEYS = {"entry", "id", *SCALE_BLOCKS}
#: An option value starting with this refers to the grid with that ``id``.
REF = "@"

#: Cells one spec may expand to unless ``--max-cells`` says more: the largest shipped suite
#: has 104 at its reference scale; a few hundred bytes of axes can ask for 10^8.
MAX_CELLS = 10_000
#: Bytes a spec file may hold: the largest shipped suite is 5 KB. Parsing YAML in Python
#: costs ~6 CPU-s per MiB here, so a 4 MB spec of 100,000 one-cell grids took 34 CPU-s to
#: be refused by the cell cap; 128 KiB parses in under a second (measured: 0.7 s for 2,698
#: written-out grids or a 23,697-value list), and is refused before it is read.
MAX_SPEC_BYTES = 128 * 1024
#: YAML nodes that aliases may add beyond those written: a "billion laughs" of 400 bytes
#: (nine levels of ten aliases each) expands to 10^9 values and hung the driver.
MAX_ALIAS_EXPANSION = 10_000
#: What a sweep name may not hold: it is quoted inside MLflow search filters
#: (``tags.`scarcelab.sweep` = '<name>'``), whose parser has no escape for a quote.
NAME_FORBIDDEN = re.compile(r"['\"`\\\x00-\x1f\x7f]")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Environment variables that make a process load code named by their value: a spec's
#: ``env:`` is data, so it may not set them (``PYTHONPATH`` once ran a folder's
#: ``sitecustomize.py`` in every cell). Variables that start with one of the prefixes are
#: refused too, except those in ``ENV_PYTHON_SAFE``.
ENV_CODE = {
    "PATH",  # which git / nvidia-smi / python a cell's tools run
    "HOME", "XDG_CONFIG_HOME",  # the user's site-packages (.pth files run), ~/.gitconfig
    "BASH_ENV", "ENV",  # files a shell sources at start
    "PERL5LIB", "PERL5OPT", "PERLLIB", "RUBYLIB", "RUBYOPT", "NODE_OPTIONS", "NODE_PATH",
    "GCONV_PATH", "LOCPATH",  # glibc loads modules / locale data from these
    "OPENSSL_CONF", "OPENSSL_ENGINES", "OPENSSL_MODULES",  # engines are shared libraries
    "MPLBACKEND", "MATPLOTLIBRC", "MPLCONFIGDIR",  # "module://x" imports x
    "TORCH_EXTENSIONS_DIR", "CUDA_CACHE_PATH",
}
ENV_CODE_PREFIXES = ("PYTHON", "LD_", "DYLD_", "GIT_")
#: ``PYTHON*`` variables that load nothing: buffering, hashing, encodings, tracebacks
ENV_PYTHON_SAFE = {"PYTHONUNBUFFERED", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE",
                   "PYTHONFAULTHANDLER", "PYTHONIOENCODING", "PYTHONUTF8",
                   "PYTHONNOUSERSITE", "PYTHONSAFEPATH"}
#: set by the driver for every cell: a spec's value would be overwritten, so it is refused
ENV_DRIVER = {"MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID",
              "MLFLOW_EXPERIMENT_NAME", "SCARCELAB_GPU_MEMORY_FRACTION"}
#: What a spec's ``env:`` may set: an allowlist (issue 42 item 2). A denylist kept missing
#: variables: ``HTTP_PROXY`` in a spec received the tracking server's Basic-auth
#: credentials, ``REQUESTS_CA_BUNDLE`` with ``MLFLOW_TRACKING_INSECURE_TLS`` trusted another
#: certificate, ``OPTUNA_STORAGE`` sent every cell's search to another database. A cell
#: needs only settings of *how* it computes, never of where it sends or reads its records:
ENV_ALLOWED = {
    # threads of the numeric libraries (the driver sets the first two from the cell's share)
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
    "NUMEXPR_MAX_THREADS", "VECLIB_MAXIMUM_THREADS",
    # determinism and debugging of CUDA: cuBLAS' deterministic workspace, synchronous
    # launches, the caching allocator's options (sizes and modes; it loads nothing)
    "CUBLAS_WORKSPACE_CONFIG", "CUDA_LAUNCH_BLOCKING", "PYTORCH_CUDA_ALLOC_CONF",
    # scarcelab's switches of a cell's computation: where its datasets are read (read
    # without unpickling, as a `dataset: folder:…` value would be), AL's fast fit, system
    # metrics. Not its download URLs, cache, spool, stack or tracking settings.
    "SCARCELAB_DATA", "SCARCELAB_AL_FASTFIT", "SCARCELAB_SYSTEM_METRICS",
    "SCARCELAB_SYSTEM_METRICS_INTERVAL_S",
}
#: names under this prefix are the user's own (a plugin's settings): scarcelab reads none
ENV_USER_PREFIX = "SCARCELAB_USER_"


def env_refusal(name: str) -> str | None:
    """Why a spec's ``env:`` may not set ``name`` (None: it may). Shared by the spec parser
    and the driver, so a spec built in code is held to the same list."""
    if not ENV_NAME.fullmatch(name):
        return f"{name!r} is not a variable name (letters, digits and _)"
    upper = name.upper()
    if upper in ENV_DRIVER:
        return f"{name} is set by the sweep driver for every cell"
    if upper in ENV_PYTHON_SAFE or upper in ENV_ALLOWED or upper.startswith(ENV_USER_PREFIX):
        return None
    if upper in ENV_CODE or upper.startswith(ENV_CODE_PREFIXES):
        return (f"{name} can load code into every cell; a spec's env: is data and may not "
                "set it (set it in the environment of the driver or of the Ray workers "
                "instead; docs/sweeps.md lists the refused variables)")
    return (f"{name} is not a variable a spec may set: env: takes only the allowlist of "
            "docs/sweeps.md (thread counts, CUDA determinism, Python output, SCARCELAB_DATA "
            f"…, and {ENV_USER_PREFIX}* for your own code); proxies, certificates, TLS, "
            "stores and credentials belong in the environment of the driver or of the Ray "
            "workers")


class SpecError(ValueError):
    """A spec that cannot run; the message starts with ``file:line:``."""


@dataclass(frozen=True)
class Cell:
    """One invocation of an entry point with its options (values as strings)."""

    entry: str
    options: tuple[tuple[str, str], ...]
    grid: int  # index of the grid it came from
    #: dependencies: (option, id of the cell whose finished run the option receives);
    #: the option's value in ``options`` stays the literal reference ("@pretrain")
    refs: tuple[tuple[str, str], ...] = ()

    @property
    def id(self) -> str:
        """Stable across re-runs of the same spec: what a finished cell is recognised by."""
        # sorted: reordering the keys of a grid does not make its cells new ones
        parts: list[Any] = [self.entry, sorted(self.options)]
        if self.refs:  # the cells depended on (stable ids, not run ids) are part of it
            parts.append(sorted(self.refs))
        blob = json.dumps(parts)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def label(self) -> str:
        return " ".join([self.entry] + [f"{k}={v}" for k, v in self.options])

    def argv(self, resolved: Mapping[str, str] | None = None) -> list[str]:
        """The command line; ``resolved`` replaces the values of dependency options."""
        out = [self.entry]
        for k, v in self.options:
            out += [f"--{k.replace('_', '-')}", (resolved or {}).get(k, v)]
        return out


@dataclass
class SweepSpec:
    name: str
    experiment: str
    cells: list[Cell]
    cpus_per_cell: float = 1.0
    gpus_per_cell: float | str = "auto"
    #: cap of each cell's CUDA allocator, a fraction of the device; "auto": gpus_per_cell
    #: when it is below 1, else none (:meth:`memory_fraction`)
    gpu_memory_fraction: float | str = "auto"
    mps: bool = False  # CUDA MPS for the cells that share a GPU (tracking/sweep/gpu.py)
    retries: int = 1
    env: dict[str, str] = field(default_factory=dict)
    path: str = ""
    text: str = ""
    scale: str = "reference"
    #: line of each top-level key in the spec file (errors found later point at them)
    lines: dict[str, int] = field(default_factory=dict)
    #: (grid index, option) -> (line, key as written) of where the grid's value came from
    option_lines: dict[tuple[int, str], tuple[int, str]] = field(default_factory=dict)

    def where(self, key: str) -> str:
        """``file:line`` of a top-level key (of the file when the key is not written)."""
        return f"{self.path or '<spec>'}:{self.lines.get(key, 0)}"

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:16]

    def cell(self, cell_id: str) -> Cell:
        return next(c for c in self.cells if c.id == cell_id)

    def memory_fraction(self, gpus: float) -> float | None:
        """The memory cap of a cell that holds ``gpus`` GPUs (Ray's resolved share): the
        explicit ``gpu_memory_fraction``, else its share of one card when it shares one,
        else none (a whole card, or no GPU)."""
        if self.gpu_memory_fraction != "auto":
            return float(self.gpu_memory_fraction)
        return float(gpus) if 0.0 < gpus < 1.0 else None


def select_cells(cells: Sequence[Cell], only: Sequence[str]) -> list[Cell]:
    """The slice of a sweep that ``--only KEY=V1,V2`` filters name (every filter must hold),
    with the cells it depends on: a design longer than one machine's session runs in
    slices, each into its own store, and the slices' exports are merged into one page
    (``scarcelab results --merge``; docs/sweeps.md, "A design in slices"). Keeping the
    spec whole (not a second spec of the slice) keeps the slice's cells the design's own
    cells, ids included. A filter on an option no cell has, or a value no cell takes, is
    an error: a typo must not run an empty or a whole sweep."""
    want: dict[str, set[str]] = {}
    for f in only:
        key, eq, values = f.partition("=")
        key = key.strip().lstrip("-").replace("-", "_")
        vals = {v.strip() for v in values.split(",") if v.strip()}
        if not eq or not key or not vals:
            raise SpecError(f"--only {f!r}: write KEY=VALUE[,VALUE...], e.g. --only seed=3,4,5")
        want.setdefault(key, set()).update(vals)
    for key, vals in want.items():
        seen = {v for c in cells for k, v in c.options if k == key}
        if not seen:
            names = ", ".join(sorted({k for c in cells for k, _ in c.options}))
            raise SpecError(f"--only {key}=...: no cell has the option {key!r} (the cells' "
                            f"options: {names})")
        if missing := sorted(vals - seen):
            raise SpecError(f"--only {key}=...: no cell has {key} = {', '.join(missing)} "
                            f"(its values here: {', '.join(sorted(seen))})")
    keep = {c.id for c in cells
            if all(dict(c.options).get(k) in vals for k, vals in want.items())}
    by_id = {c.id: c for c in cells}
    todo = list(keep)
    while todo:  # what the slice depends on comes with it (a finished one is skipped)
        for _, dep in by_id[todo.pop()].refs:
            if dep not in keep and dep in by_id:
                keep.add(dep)
                todo.append(dep)
    return [c for c in cells if c.id in keep]


def check_gpus(value: Any) -> float | str:
    """``gpus_per_cell`` as Ray takes it: ``auto``, or a number >= 0 that is whole above 1
    (Ray packs fractions of one GPU, never 1.5 GPUs); ValueError says what is wrong."""
    if value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"must be a number >= 0, got {value!r}")
    if value > 1 and value != int(value):
        raise ValueError(f"must be a fraction of one GPU (e.g. 0.125: 8 cells per GPU) or a "
                         f"whole number of GPUs, got {value!r}")
    return float(value)


def check_memory_fraction(value: Any) -> float | str:
    """``gpu_memory_fraction``: ``auto`` or a fraction in (0, 1]."""
    if value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ValueError(f"must be 'auto' or a fraction in (0, 1], got {value!r}")
    return float(value)


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

    def __init__(self, path: str, node: yaml.Node | None) -> None:
        self.path = path
        self.node = node  # None: an empty document (refused by the first check)

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


def _dataset_at(value: str, spec_path: str) -> str:
    """A dataset of a user's files (``folder:data/chest``, ``encoded_csv:labels.csv``, a bare
    path) with its path made absolute against the spec file's folder: a cell runs in
    another working directory (on a Ray node: the same path must exist there, e.g. a
    shared filesystem). Other names are returned unchanged; the cell's own option check
    reads the folder or CSV."""
    from scarcelab.data.own import parse_ref
    from scarcelab.errors import ConfigError

    base = Path(spec_path).parent if spec_path and not spec_path.startswith("<") else None
    prefix = "encoded_" if value.startswith("encoded_") else ""
    try:
        ref = parse_ref(value[len(prefix):], base)
    except ConfigError:  # the cell's own check says it in its one line
        return value
    return prefix + ref.name if ref is not None else value


def entry_options(entry: str) -> dict[str, str] | None:
    """Option name (underscored) -> its help, for a registered entry point; None if the
    entry point does not exist. Reads the click commands (tracking/commands.py): no heavy
    import happens."""
    cmd = commands.command(entry)
    if cmd is None:
        return None
    out = {}
    for p in cmd.params:
        for opt in getattr(p, "opts", []):
            if opt.startswith("--"):
                out[opt[2:].replace("-", "_")] = getattr(p, "help", "") or ""
    return out


def entry_params(entry: str) -> dict[str, Any]:
    """Option name (underscored) -> its click parameter, for a registered entry point
    (empty if the entry point does not exist)."""
    return commands.params(entry)


def _is_name_type(ptype: Any) -> bool:
    """Whether an option takes a name from a closed set: a registered name (method,
    dataset, arch, strategy: the entry points' ``Registered`` types, checked against the
    registries' files without importing them) or one of fixed words (``Word`` with
    choices, ``click.Choice``). Those are checked when the spec is read; other values
    (numbers, paths, run ids) by the cell's command, where they are used."""
    return commands.takes_name(ptype)


def check_names(entry: str, key: str, values: list[str]) -> str | None:
    """Why one of ``values`` of option ``key`` of ``entry`` is not a name that option takes
    (None: they all are). A sweep refuses such a spec before it prints or runs anything:
    ``method: "sup; touch FILE"`` is no method, and a dry run's printed command must not
    carry it (issue 42 item 5). References (``@grid``) and a user's own images
    (``folder:…``, ``csv:…``, a path: read by the cell, on the machine that runs it) are
    left to the cell."""
    import click

    param = entry_params(entry).get(key)
    if param is None or not _is_name_type(param.type):
        return None
    for v in values:
        if v.startswith(REF) or commands.may_be_own(param.type, v.removeprefix("encoded_")):
            continue
        try:
            param.type.convert(v, param, None)
        except click.BadParameter as e:
            return e.format_message()
    return None


def check_spec_names(sp: SweepSpec) -> None:
    """Raise :class:`SpecError` at the spec's line when a cell's option that takes a name
    (:func:`check_names`) has a value that is none. Run by ``scarcelab sweep`` before it
    prints or runs anything, after :func:`parse_spec` (which checks the spec's structure
    and option names, and whose recorded outcomes tests/tracking/sweep/test_sweep_spec_guard.py
    pins). A running cell is an argument list, not a shell line, and its command checks its
    values again."""
    seen: set[tuple[int, str, str]] = set()
    for c in sp.cells:
        for k, v in c.options:
            if (c.grid, k, v) in seen:
                continue
            seen.add((c.grid, k, v))
            why = check_names(c.entry, k, [v])
            if why:
                line, raw = sp.option_lines.get((c.grid, k), (0, k))
                raise SpecError(f"{sp.path or '<spec>'}:{line}: {raw}: {why}")


@dataclass(frozen=True)
class Continuation:
    """How an entry point continues a cell attempt that died partway, as its own command
    declares it (:func:`continues_with`): the sweep's next attempt runs ``<entry>
    --<option> <run id of the dead attempt's study>`` with only the ``carry`` options of
    the cell (the rest of the settings are read back from that run), instead of starting
    the cell again. The entry point knows what its record lets it continue; the driver
    must not keep a list of such commands that drifts from them."""

    option: str  # underscored, as in a spec ("resume" for --resume)
    carry: tuple[str, ...] = ()

    def argv(self, entry: str, study_run: str, options: Mapping[str, str]) -> list[str]:
        """The continuing attempt's command line."""
        out = [entry, f"--{self.option.replace('_', '-')}", study_run]
        for k in self.carry:
            if k in options:
                out += [f"--{k.replace('_', '-')}", options[k]]
        return out


_CONTINUATIONS: dict[str, Continuation] = {}


def continues_with(option: str, carry: tuple[str, ...] = ()) -> Callable[[Any], Any]:
    """Decorator over a registered click command (``@main.command`` beneath it): a sweep
    continues a killed cell of this command with ``--<option> <study run id>`` and the
    cell's ``carry`` options (:class:`Continuation`). Refuses, at import, an option the
    command does not have: a declaration that names nothing would only fail mid-sweep."""

    def deco(cmd: Any) -> Any:
        have = {o[2:].replace("-", "_") for p in cmd.params for o in getattr(p, "opts", [])
                if o.startswith("--")}
        missing = [k for k in (option, *carry) if k not in have]
        if missing:
            raise ValueError(f"command {cmd.name!r} has no option {missing[0]!r} to "
                             "continue a sweep cell with")
        _CONTINUATIONS[cmd.name] = Continuation(option, tuple(carry))
        return cmd

    return deco


def entry_continuation(entry: str) -> Continuation | None:
    """The continuation the entry point's command declares, None when it declares none
    (its killed cells are run again from the start)."""
    cmd = commands.command(entry)  # loads the command modules, whose decorators declare
    return _CONTINUATIONS.get(cmd.name or entry) if cmd is not None else None


#: commands that are not a cell: they run sweeps (a compare is one) or manage services
NOT_CELLS = ("sweep", "list", "stack", "compare")


def _entries() -> list[str]:
    return sorted(n for n in commands.commands() if n not in NOT_CELLS)


def _check_tree(path: str, root: yaml.Node) -> None:
    """Refuse, before anything is built from it, a composed YAML tree whose aliases expand
    past ``MAX_ALIAS_EXPANSION`` nodes (or refer to themselves), and a mapping that holds a
    key twice (PyYAML keeps the last one silently: ``method: sup`` then ``method: mixup``
    ran mixup). Aliases are shared nodes in the composed tree, so this pass is linear in
    the file, while expanding them (``str()`` of a value, the grid product) is not."""
    sizes: dict[int, int] = {}
    active: set[int] = set()
    written = 0

    def children(n: yaml.Node) -> list[yaml.Node]:
        if isinstance(n, yaml.SequenceNode):
            return list(n.value)
        if isinstance(n, yaml.MappingNode):
            return [x for kv in n.value for x in kv]
        return []

    def size(n: yaml.Node) -> int:
        nonlocal written
        key = id(n)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise SpecError(f"{path}:{_line(n)}: a YAML alias refers to the value that holds "
                            "it (a recursive value); write the value out")
        active.add(key)
        written += 1
        if isinstance(n, yaml.MappingNode):
            first: dict[tuple[str, str], int] = {}
            for k, _ in n.value:
                if isinstance(k, yaml.ScalarNode) and k.tag != "tag:yaml.org,2002:merge":
                    if (k.tag, k.value) in first:
                        raise SpecError(
                            f"{path}:{_line(k)}: key {k.value!r} appears twice in this mapping "
                            f"(first at line {first[(k.tag, k.value)]}); keep one")
                    first[(k.tag, k.value)] = _line(k)
        total = 1 + sum(size(c) for c in children(n))
        active.discard(key)
        sizes[key] = total
        return total

    try:
        total = size(root)
    except RecursionError:
        raise SpecError(f"{path}:{_line(root)}: the spec nests values too deeply to read; "
                        "flatten it") from None
    if total - written > MAX_ALIAS_EXPANSION:
        node = root  # point at the smallest value that alone expands past the limit
        while True:
            big = max(children(node), key=lambda c: sizes[id(c)], default=None)
            if big is None or sizes[id(big)] <= MAX_ALIAS_EXPANSION:
                break
            node = big
        raise SpecError(f"{path}:{_line(node)}: YAML aliases expand this spec to {total:,} "
                        f"values from {written:,} written (at most {MAX_ALIAS_EXPANSION:,} "
                        f"more are allowed; this value alone is {sizes[id(node)]:,}): write "
                        "the values out or use fewer aliases")


def _yaml_error(path: str, e: yaml.YAMLError, text: str) -> SpecError:
    mark = getattr(e, "problem_mark", None)
    line = mark.line + 1 if mark is not None else 0
    problem = getattr(e, "problem", None) or e
    if isinstance(e, yaml.reader.ReaderError):  # a control character, a bad encoding
        line = text[:e.position].count("\n") + 1
        char = chr(e.character) if isinstance(e.character, int) else e.character
        problem = f"character {char!r} is not allowed in YAML ({e.reason}); remove it"
    hint = ""
    if "'@'" in str(problem):
        hint = ' (quote a reference to another grid: "@pretrain")'
    return SpecError(f"{path}:{line}: not valid YAML: {problem}{hint}")


def parse_spec(text: str, path: str = "<spec>", full: bool = False,
               smoke: bool = False, max_cells: int = MAX_CELLS,
               scale: str | None = None) -> SweepSpec:
    """Parse and validate a spec; ``full`` (``smoke``) merges its ``full:`` (``smoke:``)
    sections into the grids: the top-level one into every grid, a grid's own after it.
    More than ``max_cells`` cells is an error, found before a single cell is built.

    The steps below check in a fixed order (the top-level keys and name, the grids list,
    the scale blocks, resources, env, then each grid in turn, then references and repeated
    cells), so a spec with several mistakes always reports the same one."""
    chosen = {s for s, on in (("full", full), ("smoke", smoke)) if on}
    if scale not in (None, "reference"):
        if scale not in SCALES:
            raise SpecError(f"{path}: unknown scale {scale!r}; valid: {', '.join(SCALES)}")
        chosen.add(scale)
    if len(chosen) > 1:
        raise SpecError(f"{path}: {' and '.join('--' + c for c in sorted(chosen))} are "
                        f"{len(chosen)} scales; choose one")
    scale = next(iter(chosen), "reference")
    _check_size(path, len(text.encode("utf-8", "surrogatepass")))
    node, data = _load(path, text)
    loc = _Located(path, node)
    name = _checked_name(loc, data)
    grids = data.get("grids")
    gnode = loc.child(node, "grids")
    if not isinstance(grids, list) or not grids:
        raise loc.error(gnode or node, "'grids' must be a non-empty list of grids")
    over_key, over, smoke_exp, res = _scale_block(loc, data, scale)
    if scale == "claims" and "claims" not in data and not any(
            isinstance(g, dict) and "claims" in g for g in grids):
        # without a design the "claims" run would be the reference grid under another
        # experiment's name, and its page a claims page of a run sized for nothing
        raise loc.error(node, "no `claims:` block: this suite has no design sized to test "
                        "its paper's claims here (its header says why); run the reference "
                        "scale, or --full on a GPU")
    retries = int(_number(loc, data, "retries", 1, 0))
    env = _checked_env(loc, data)
    expanded = _Grids(loc, gnode, over_key, over, max_cells)
    expanded.count_all(grids)  # arithmetic: refused before any grid is checked or built
    for gi, grid in enumerate(grids):
        expanded.add(gi, grid)
    cells = expanded.cells()
    experiment = str(data.get("experiment") or name).strip()
    if scale in OWN_EXPERIMENT:
        experiment = (smoke_exp if scale == "smoke" else None) or f"{experiment}-{scale}"
    lines = {str(k.value): _line(k) for k, _ in node.value} \
        if isinstance(node, yaml.MappingNode) else {}
    return SweepSpec(name=name.strip(), experiment=experiment,
                     cells=cells, cpus_per_cell=res["cpus_per_cell"],
                     gpus_per_cell=res["gpus_per_cell"],
                     gpu_memory_fraction=res["gpu_memory_fraction"], mps=res["mps"],
                     retries=retries,
                     env={str(k): str(v) for k, v in env.items()}, path=path, text=text,
                     scale=scale, lines=lines, option_lines=expanded.option_lines)


def _check_size(path: str, n_bytes: int) -> None:
    if n_bytes > MAX_SPEC_BYTES:
        raise SpecError(f"{path}: the spec is {n_bytes / 1024:,.0f} KiB, more than a sweep spec "
                        f"needs (at most {MAX_SPEC_BYTES // 1024} KiB): write an option's "
                        "values as one list (seed: [0, 1, 2]) instead of a grid per value, or "
                        "split the sweep into several specs")


def _load(path: str, text: str) -> tuple[yaml.Node | None, Any]:
    """The composed tree (for lines) and the loaded data. The tree is checked first: an
    alias bomb is cheap to load but not to expand (``str()`` of a value, the grid product),
    and a duplicate key is gone from the loaded data."""
    try:
        node = yaml.compose(text)
        if node is not None:
            _check_tree(path, node)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise _yaml_error(path, e, text) from None
    except RecursionError:
        raise SpecError(f"{path}:0: the spec nests values too deeply to read; flatten it"
                        ) from None
    return node, data


def _checked_name(loc: _Located, data: Any) -> str:
    """The sweep's name, once the spec is known to be a mapping of known keys: the name is
    quoted inside MLflow search filters, so what they cannot hold is refused here."""
    node = loc.node
    if not isinstance(data, dict):
        raise loc.error(node, "a spec is a mapping with at least 'name' and 'grids'")
    for k in data:
        if k not in TOP_KEYS:
            raise loc.error(loc.key_node(node, k),
                            f"unknown key {k!r}; valid: {', '.join(sorted(TOP_KEYS))}")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise loc.error(loc.child(node, "name") or node, "'name' (the sweep's name) is required")
    bad = NAME_FORBIDDEN.search(name)
    if bad:
        raise loc.error(loc.child(node, "name"), f"the sweep name {name!r} holds "
                        f"{bad.group()!r}: quotes, backticks, backslashes and control "
                        "characters cannot be searched for in MLflow; rename it")
    return name


def _scale_block(loc: _Located, data: dict[str, Any], scale: str
                 ) -> tuple[str | None, dict[str, Any], str | None, dict[str, Any]]:
    """(``full`` or ``smoke`` or None, the top-level options that scale merges into every
    grid, the smoke block's own experiment, the resources at that scale: the top-level
    ones with the block's ``RESOURCE_KEYS`` over them). Both blocks are checked whichever
    scale runs, so a broken ``smoke:`` fails the reference run too rather than first in
    CI."""
    over: dict[str, Any] = {}
    over_key = scale if scale in SCALE_BLOCKS else None
    smoke_exp = None
    res = _resources(loc, data, loc.node, defaults=True)
    for key in SCALE_BLOCKS:
        block = data.get(key) or {}
        if not isinstance(block, dict):
            raise loc.error(loc.child(loc.node, key), f"{key!r} must be a mapping of options")
        if key == "smoke" and "experiment" in block:
            smoke_exp = str(block["experiment"]).strip()
            block = {k: v for k, v in block.items() if k != "experiment"}
        own = _resources(loc, block, loc.child(loc.node, key), defaults=False)
        block = {k: v for k, v in block.items() if k not in RESOURCE_KEYS}
        if key == over_key:
            over = block
            res.update(own)
    return over_key, over, smoke_exp, res


def _resources(loc: _Located, data: dict[str, Any], node: yaml.Node | None,
               defaults: bool) -> dict[str, Any]:
    """The ``RESOURCE_KEYS`` a mapping sets, checked (with their defaults for the top level),
    an error pointing at the value."""
    out: dict[str, Any] = {}
    if defaults or "cpus_per_cell" in data:
        out["cpus_per_cell"] = _number(loc, data, "cpus_per_cell", 1, 0.01, node)
    for key, check, default in (("gpus_per_cell", check_gpus, "auto"),
                                ("gpu_memory_fraction", check_memory_fraction, "auto")):
        if key in data:
            try:
                out[key] = check(data[key])
            except ValueError as e:
                raise loc.error(loc.child(node, key), f"{key!r} {e}") from None
        elif defaults:
            out[key] = default
    if "mps" in data:
        if not isinstance(data["mps"], bool):
            raise loc.error(loc.child(node, "mps"), f"'mps' must be true or false, got "
                            f"{data['mps']!r}")
        out["mps"] = data["mps"]
    elif defaults:
        out["mps"] = False
    return out


def _number(loc: _Located, data: dict[str, Any], key: str, default: float,
            minimum: float, node: yaml.Node | None = None) -> float:
    """A resource number of ``data`` (the top level unless ``node`` says which mapping);
    a bool is refused although Python counts it as one."""
    v = data.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int | float) or v < minimum:
        raise loc.error(loc.child(node or loc.node, key), f"{key!r} must be a number >= "
                        f"{minimum}, got {v!r}")
    return float(v)


def _checked_env(loc: _Located, data: dict[str, Any]) -> dict[Any, Any]:
    """The spec's ``env:`` as written, each name held to ``env_refusal`` and each value a
    string-like scalar (a NUL cannot be passed to a process's environment)."""
    env = data.get("env") or {}
    env_node = loc.child(loc.node, "env")
    if not isinstance(env, dict):
        raise loc.error(env_node, "'env' must be a mapping NAME: value")
    for k, v in env.items():
        why = env_refusal(str(k))
        if why:
            raise loc.error(loc.key_node(env_node, k), f"env: {why}")
        if v is None or isinstance(v, list | dict) or "\x00" in str(v):
            raise loc.error(loc.child(env_node, k), f"env: {k}'s value must be a string, "
                            f"got {type(v).__name__}")
    return env


#: option -> (id of the grid it refers to, the node of the option's key)
_Refs = dict[str, tuple[str, yaml.Node | None]]


class _Grids:
    """The grids of a spec expanded one at a time into their cells. A class because state
    runs across grids: the cell cap counts every grid before the current one, and grid ids
    and references are collected first and resolved only once every grid is known (a grid
    may refer to one written after it)."""

    def __init__(self, loc: _Located, gnode: yaml.Node | None, over_key: str | None,
                 over: dict[str, Any], max_cells: int) -> None:
        self.loc = loc
        self.gnode = gnode
        self.over_key = over_key
        self.over = over
        self.over_node = loc.child(loc.node, over_key) if over_key else None
        self.max_cells = max_cells
        self.n_cells = 0  # counted before any grid is expanded
        self.grid_cells: list[list[Cell]] = []
        self.grid_axes: list[set[str]] = []  # list-valued keys: what tells a grid's cells apart
        self.grid_refs: list[_Refs] = []
        self.ids: dict[str, tuple[int, yaml.Node | None]] = {}
        #: (grid, option) -> (line of its value's key, the key as written)
        self.option_lines: dict[tuple[int, str], tuple[int, str]] = {}
        self._gi = 0

    def count_all(self, grids: list[Any]) -> None:
        """Refuse a spec of more than ``max_cells`` cells from the product of its list
        lengths alone, before any grid is checked, converted or expanded: refusing 100,000
        one-cell grids one grid at a time took 34 CPU-s (the options of every grid before
        the cap were checked and built first). Malformed grids count as one cell here;
        :meth:`add` reports them."""
        total = 0
        for gi, grid in enumerate(grids):
            if not isinstance(grid, dict):
                total += 1
                continue
            own = grid.get(self.over_key) if self.over_key else None
            merged = {**grid, **self.over, **(own if isinstance(own, dict) else {})}
            lens = [(str(k), len(v) if isinstance(v, list) else 1)
                    for k, v in merged.items() if k not in GRID_KEYS]
            size = math.prod(n for _, n in lens)
            total += size
            if total > self.max_cells:
                dims = " x ".join(f"{n} {k}" for k, n in lens if n > 1)
                before = f", {total:,} with the grids before it" if total != size else ""
                raise self.loc.error(self.loc.item(self.gnode, gi),
                                     f"this grid has {size:,} cells ({dims or 'one'}){before}: "
                                     f"more than the cap of {self.max_cells:,}; shrink its "
                                     "axes, split the sweep, or raise the cap with --max-cells")

    def add(self, gi: int, grid: Any) -> None:
        """Check grid ``gi`` and expand it (its references still unresolved)."""
        loc = self.loc
        self._gi = gi
        gn = loc.item(self.gnode, gi)
        if not isinstance(grid, dict) or "entry" not in grid:
            raise loc.error(gn, "each grid is a mapping with an 'entry' (e.g. entry: semi)")
        entry = str(grid["entry"])
        opts = entry_options(entry)
        if opts is None:
            raise loc.error(loc.child(gn, "entry"), f"unknown entry point {entry!r}; valid: "
                            f"{', '.join(_entries())}")
        if "id" in grid:
            self._add_id(gi, grid["id"], loc.child(gn, "id"))
        own, own_node = self._own_block(grid, gn)
        axes, refs = self._axes(entry, opts, {**grid, **self.over, **own}, own, own_node, gn)
        self._count(gn, axes)
        self.grid_axes.append({k for k, vals in axes if len(set(vals)) > 1})
        self.grid_refs.append(refs)
        self.grid_cells.append([Cell(entry, tuple((k, v) for (k, _), v in
                                                  zip(axes, combo, strict=True)), gi)
                                for combo in itertools.product(*(vals for _, vals in axes))])

    def _add_id(self, gi: int, gid: Any, idn: yaml.Node | None) -> None:
        if not isinstance(gid, str) or not gid.strip() or gid.startswith(REF):
            raise self.loc.error(idn, f"a grid's 'id' is a name (e.g. id: pretrain), got "
                                 f"{gid!r}")
        if gid in self.ids:
            raise self.loc.error(idn, f"grid id {gid!r} is used twice (first at line "
                                 f"{_line(self.ids[gid][1])})")
        self.ids[gid] = (gi, idn)

    def _own_block(self, grid: dict[str, Any],
                   gn: yaml.Node | None) -> tuple[dict[str, Any], yaml.Node | None]:
        """The grid's own options for the running scale (merged after the top-level ones);
        both of its blocks are checked whichever scale runs, as the top-level ones are."""
        own: dict[str, Any] = {}
        for key in SCALE_BLOCKS:
            block = grid.get(key) or {}
            if not isinstance(block, dict):
                raise self.loc.error(self.loc.child(gn, key), f"a grid's {key!r} must be a "
                                     "mapping of its options")
            if key == self.over_key:
                own = block
        own_node = self.loc.child(gn, self.over_key) if self.over_key else None
        return own, own_node

    def _axes(self, entry: str, opts: dict[str, str], merged: dict[str, Any],
              own: dict[str, Any], own_node: yaml.Node | None,
              gn: yaml.Node | None) -> tuple[list[tuple[str, list[str]]], _Refs]:
        """(option, its values as strings) in the merged grid's order, and its references.
        An error points at the key where the merged value came from: the grid's own scale
        block, else the top-level one, else the grid."""
        loc = self.loc
        axes: list[tuple[str, list[str]]] = []
        refs: _Refs = {}
        spelled: dict[str, str] = {}  # option -> how the grid wrote it
        for raw_key, value in merged.items():
            if raw_key in GRID_KEYS:
                continue
            key = str(raw_key).replace("-", "_")
            kn = (loc.key_node(own_node, raw_key) if raw_key in own else None) or (
                loc.key_node(self.over_node, raw_key) if raw_key in self.over else None) or \
                loc.key_node(gn, raw_key)
            if key in spelled:  # budget_minutes and budget-minutes: one option twice
                raise loc.error(kn, f"{raw_key!r} and {spelled[key]!r} are the same option "
                                f"--{key.replace('_', '-')}; keep one")
            spelled[key] = str(raw_key)
            if key in RESERVED:
                raise loc.error(kn, f"{raw_key!r} is set by the sweep (the spec's top-level "
                                "'experiment'), not per grid")
            if key not in opts:
                raise loc.error(kn, f"{entry} has no option {raw_key!r}; valid: "
                                f"{', '.join(sorted(k for k in opts if k not in RESERVED))}")
            values = self._values(raw_key, key, value, kn, refs)
            strs = [_scalar(v) for v in values]
            if key == "dataset":
                strs = [_dataset_at(v, loc.path) for v in strs]
            self.option_lines[(self._gi, key)] = (_line(kn), str(raw_key))
            axes.append((key, strs))
        return axes, refs

    def _values(self, raw_key: Any, key: str, value: Any, kn: yaml.Node | None,
                refs: _Refs) -> list[Any]:
        """An option's values (a scalar is a one-value axis); a value ``@<id>`` is recorded
        in ``refs``: an option may take one grid's cells, not a mix of two grids'."""
        values = value if isinstance(value, list) else [value]
        if not values:
            raise self.loc.error(kn, f"{raw_key!r} is an empty list: the grid would be empty")
        for v in values:
            if v is None or isinstance(v, list):
                raise self.loc.error(kn, f"{raw_key!r}: each value must be a scalar or a "
                                     f"mapping, got {v!r}")
            if isinstance(v, str) and v.startswith(REF):
                if key in refs and refs[key][0] != v[1:]:
                    raise self.loc.error(kn, f"{raw_key!r} refers to two grids ({REF}"
                                         f"{refs[key][0]}, {v}); one reference per option")
                refs[key] = (v[1:], kn)
        return values

    def _count(self, gn: yaml.Node | None, axes: list[tuple[str, list[str]]]) -> None:
        """Add the grid's cells to the count, refused past the cap before they are built."""
        size = math.prod(len(vals) for _, vals in axes)
        self.n_cells += size
        if self.n_cells > self.max_cells:
            dims = " x ".join(f"{len(vals)} {k}" for k, vals in axes if len(vals) > 1)
            before = f", {self.n_cells:,} with the grids before it" \
                if self.n_cells != size else ""
            raise self.loc.error(gn, f"this grid has {size:,} cells ({dims or 'one'}){before}: "
                                 f"more than the cap of {self.max_cells:,}; shrink its axes, "
                                 "split the sweep, or raise the cap with --max-cells")

    def cells(self) -> list[Cell]:
        """Every grid's cells with their references resolved, in the spec's order; a cell
        twice (in one grid or two) is an error, since a sweep runs each cell once."""
        for gi in _grid_order(self.loc, self.grid_refs, self.ids):
            if self.grid_refs[gi]:
                self.grid_cells[gi] = [_with_refs(self.loc, c, self.grid_refs[gi], self.ids,
                                                  self.grid_cells, self.grid_axes)
                                       for c in self.grid_cells[gi]]
        cells: list[Cell] = []
        seen: dict[str, int] = {}
        for gi, part in enumerate(self.grid_cells):
            for cell in part:
                if cell.id in seen:
                    raise self.loc.error(self.loc.item(self.gnode, gi), f"cell {cell.label!r} "
                                         f"appears twice (grids {seen[cell.id]} and {gi}): a "
                                         "sweep runs each cell once")
                seen[cell.id] = gi
                cells.append(cell)
        return cells


def _grid_order(loc: _Located, grid_refs: list[dict[str, tuple[str, yaml.Node | None]]],
                ids: dict[str, tuple[int, yaml.Node | None]]) -> list[int]:
    """Grid indices with every grid after the grids it refers to; unknown ids and cycles
    are spec errors at the line of the reference."""
    for refs in grid_refs:
        for key, (gid, kn) in refs.items():
            if gid not in ids:
                known = ", ".join(sorted(ids)) or "none: give the grid an 'id: <name>'"
                raise loc.error(kn, f"{key}: {REF}{gid} names no grid (grid ids: {known})")
    order: list[int] = []
    placed: set[int] = set()

    def visit(gi: int, path: list[int]) -> None:
        if gi in placed:
            return
        for key, (gid, kn) in grid_refs[gi].items():
            gj = ids[gid][0]
            if gj in path + [gi]:
                cyc = (path + [gi])[(path + [gi]).index(gj):] + [gj]
                names = " -> ".join(f"grid {g}" + (f" ({_id_of(ids, g)})" if _id_of(ids, g)
                                                   else "") for g in cyc)
                raise loc.error(kn, f"{key}: {REF}{gid} makes a dependency cycle ({names}); "
                                "a grid cannot depend on itself, directly or not")
            visit(gj, path + [gi])
        placed.add(gi)
        order.append(gi)

    for gi in range(len(grid_refs)):
        visit(gi, [])
    return order


def _id_of(ids: dict[str, tuple[int, yaml.Node | None]], gi: int) -> str:
    return next((k for k, (g, _) in ids.items() if g == gi), "")


def _with_refs(loc: _Located, cell: Cell, refs: dict[str, tuple[str, yaml.Node | None]],
               ids: dict[str, tuple[int, yaml.Node | None]], grid_cells: list[list[Cell]],
               grid_axes: list[set[str]]) -> Cell:
    """``cell`` with its dependencies: for each reference, the one cell of the referenced
    grid that agrees with ``cell`` on that grid's axes (the keys its cells differ in)."""
    mine = dict(cell.options)
    out = []
    for key, (gid, kn) in refs.items():
        if not mine[key].startswith(REF):
            continue  # this cell took another value of the axis (e.g. encoder=random)
        gj = ids[gid][0]
        on = {k: mine[k] for k in sorted(grid_axes[gj]) if k in mine and k not in refs}
        match = [d for d in grid_cells[gj] if all(dict(d.options).get(k) == v
                                                  for k, v in on.items())]
        agree = ", ".join(f"{k}={v}" for k, v in on.items()) or "nothing (no shared axis)"
        if not match:
            raise loc.error(kn, f"{key}={mine[key]} for cell {cell.label!r}: no cell of grid "
                            f"{gid!r} has {agree}; give both grids the same values on the "
                            "axes they share")
        if len(match) > 1:
            free = sorted(grid_axes[gj] - set(on))
            raise loc.error(kn, f"{key}={mine[key]} for cell {cell.label!r} matches "
                            f"{len(match)} cells of grid {gid!r} (matched on {agree}; they "
                            f"differ in {', '.join(free)}): add those keys to this grid with "
                            f"the same values, or split grid {gid!r} into grids with their "
                            "own ids")
        out.append((key, match[0].id))
    return Cell(cell.entry, cell.options, cell.grid, tuple(out))


def load_spec(path: str | Path, full: bool = False, smoke: bool = False,
              max_cells: int = MAX_CELLS, scale: str | None = None) -> SweepSpec:
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"{p}: no such spec file (a YAML grid spec; see docs/sweeps.md)")
    try:
        _check_size(str(p), p.stat().st_size)  # before reading it into memory
        raw = p.read_bytes()
    except OSError as e:
        raise SpecError(f"{p}: cannot read the spec: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise SpecError(f"{p}:{line}: the spec is not UTF-8 (byte 0x{raw[e.start]:02x} at "
                        f"offset {e.start}); save it as UTF-8") from None
    return parse_spec(text, str(p), full=full, smoke=smoke, max_cells=max_cells,
                      scale=scale)
