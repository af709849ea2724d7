"""The grid of ``scarcelab compare``: which studies answer "which method on my data?", the
YAML file a user edits, the checks that refuse a grid before any work, the split of a total
budget over the cells, and the sweep spec that runs them (tracking/sweep).

Nothing here imports MLflow or torch: ``--dry-run`` and every refusal answer in well under a
second. The choices (default methods, seeds, the budget formula) are explained in
docs/compare.md.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from scarcelab.tracking import commands

#: The default shortlist (docs/compare.md, "The grid"): the two labeled-only baselines that
#: SSL-vs-SSL (Huang et al., CVPR 2024) found hard to beat (plain supervised training and
#: MixUp), its most reliable semi-supervised method (MixMatch) beside the common reference
#: (FixMatch), and two self-supervised methods of different kinds (SimCLR: contrastive; BYOL:
#: no negatives). Six methods keep each study's share of a one-day budget large.
DEFAULT_METHODS = ("sup", "mixup", "fixmatch", "mixmatch", "simclr", "byol")
#: Three seeds: the fewest that give a paired interval with some width estimate (t with 2
#: degrees of freedom); more seeds narrow it faster than longer studies do.
DEFAULT_SEEDS = (0, 1, 2)
#: Options of every cell unless the grid says otherwise: semi-supervised studies' C-Score
#: diagnostics are not charged to their budget (README), so they would take longer than the
#: others for the same budget; a comparison under one budget turns them off.
DEFAULT_OPTIONS = {"diag_samples": "0"}
#: The family whose methods are the labeled-only baselines of the gain.
LABELED_ONLY = "supervised"
#: What compare sets per cell: a grid's options may not.
RESERVED = ("method", "dataset", "seed", "budget_minutes", "experiment", "run_name")
#: Options a compare cell may not set to other values than these, and why.
REFUSED = {"folds": (("1",), "--folds runs k studies in one cell, which the report cannot "
                     "pair by seed; leave it at 1 (seeds draw the labeled / validation "
                     "images; the test hold-out is the same for every seed)")}
#: Keys of a grid file.
GRID_KEYS = ("dataset", "methods", "seeds", "options", "method_options", "budget_hours",
             "cell_minutes")
SEED_MAX = 2**32 - 1

#: Seconds a cell takes beyond its ``budget_minutes`` (Ray's dispatch, the driver creating
#: its run and logging its output and cost, the study's last seconds past its reserve).
#: Measured: docs/compare.md, "The budget".
CELL_OVERHEAD_S = 15.0
#: Seconds of one compare invocation outside the cells (Python and Ray start-up, the sweep
#: run, the sweep's own report, this report). Measured: docs/compare.md.
SWEEP_OVERHEAD_S = 60.0
#: The smallest per-study budget a computed split may give (minutes): a study's start-up
#: (imports, data, the first trial) takes 10-20 s on a CPU and is charged to its budget.
MIN_CELL_MINUTES = 1.0
#: Per-study budgets are rounded down to this (minutes): the value is part of every cell's
#: id, so it must come out the same on every re-run of the same arguments.
STEP_MINUTES = 0.1


class GridError(ValueError):
    """A grid or an option that cannot run; one line naming the file (or option) and the
    fix."""


# -- methods, families ------------------------------------------------------------------

_INDEX: Any = None


def _index() -> Any:
    global _INDEX
    if _INDEX is None:
        from scarcelab.registry import StaticIndex

        _INDEX = StaticIndex("method")
    return _INDEX


def family(method: str) -> str:
    """``supervised``, ``semi`` or ``self``: the entry point that runs the method."""
    fam = _index().family(method)
    if fam is None:
        raise GridError(f"method {method!r} has no family (scarcelab list methods)")
    return str(fam)


def check_methods(names: list[str], where: str) -> tuple[str, ...]:
    """The methods, each a registered study method, none twice, at least two, one of them
    labeled-only (the gain is measured against the best of those)."""
    from scarcelab.registry import check_name

    out = []
    for n in names:
        try:
            if not str(n).strip():
                raise ValueError("must not be empty")
            out.append(check_name("method", str(n).strip()).lower())
        except ValueError as e:
            raise GridError(f"{where}: {n!r}: {e}") from None
    twice = sorted({m for m in out if out.count(m) > 1})
    if twice:
        raise GridError(f"{where}: {', '.join(twice)} given twice; give each method once")
    if len(out) < 2:
        raise GridError(f"{where}: a comparison needs at least 2 methods, got {out or 'none'}")
    if not any(family(m) == LABELED_ONLY for m in out):
        base = ", ".join(_index().names(LABELED_ONLY))
        raise GridError(f"{where}: no labeled-only method ({base}) among {', '.join(out)}: "
                        "the report measures every gain against the best of them; add one")
    return tuple(out)


def check_seeds(seeds: list[Any], where: str) -> tuple[int, ...]:
    out = []
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int | str):
            raise GridError(f"{where}: seed {s!r} is not an integer")
        try:
            v = int(str(s).strip())
        except ValueError:
            raise GridError(f"{where}: seed {s!r} is not an integer") from None
        if not 0 <= v <= SEED_MAX:
            raise GridError(f"{where}: seed {v} must be between 0 and {SEED_MAX}")
        out.append(v)
    twice = sorted({s for s in out if out.count(s) > 1})
    if twice:
        raise GridError(f"{where}: seed {twice[0]} given twice; each seed is one paired "
                        "sample")
    if len(out) < 2:
        raise GridError(f"{where}: {len(out)} seed gives no interval and no test (a paired "
                        "difference needs at least 2 seeds; 3 or more recommended)")
    return tuple(out)


# -- options of the study commands ------------------------------------------------------

def _command(entry: str) -> Any:
    """The study command's click command, from the table the command line installs
    (tracking/commands.py: tracking does not import the entry points)."""
    cmd = commands.command(entry)
    if cmd is None:  # pragma: no cover - the three study commands always exist
        raise GridError(f"no command {entry!r}")
    return cmd


def _param(entry: str, key: str) -> Any:
    flag = "--" + key.replace("_", "-")
    return next((p for p in _command(entry).params if flag in getattr(p, "opts", ())), None)


def _options_of(entry: str) -> list[str]:
    return sorted(o[2:].replace("-", "_") for p in _command(entry).params
                  for o in getattr(p, "opts", ()) if o.startswith("--")
                  and not getattr(p, "is_flag", False))


def _scalar(value: Any) -> str:
    """A YAML value as the command-line string a sweep cell passes (a mapping
    ``{lambda_u: 1}`` -> ``lambda_u=1``, as in a sweep spec)."""
    from scarcelab.tracking.sweep.spec import _scalar as spec_scalar

    return spec_scalar(value)


def check_option(entries: set[str], key: str, value: Any, where: str) -> tuple[str, str]:
    """(option, value) of a study option every cell passes: an option of every entry point
    the grid runs, checked by that option's own type (the message the study command
    would print). A folder option's value is made absolute (the cells run in the
    repository, not in the user's folder)."""
    import click

    k = str(key).strip().replace("-", "_")
    if not k:
        raise GridError(f"{where}: an option needs a name (KEY=VALUE)")
    if k in REFUSED and _scalar(value) not in REFUSED[k][0]:
        raise GridError(f"{where}: {k}={_scalar(value)}: {REFUSED[k][1]}")
    if k in RESERVED:
        raise GridError(f"{where}: {k!r} is set by compare for each cell (methods, dataset, "
                        "seeds and the budget are the grid's own keys); remove it")
    if isinstance(value, list) or value is None:
        raise GridError(f"{where}: {k}: one value per option, got {value!r} (compare varies "
                        "only the method and the seed)")
    text = _scalar(value)
    out = text
    for entry in sorted(entries):
        p = _param(entry, k)
        if p is None:
            from scarcelab.registry import did_you_mean

            valid = [o for o in _options_of(entry) if o not in RESERVED]
            raise GridError(f"{where}: {k!r} is not an option of scarcelab {entry};"
                            f"{did_you_mean(k, valid)} valid: {', '.join(valid)}")
        if getattr(p, "is_flag", False):
            raise GridError(f"{where}: {k!r} is a flag of scarcelab {entry}; a compare cell "
                            "passes only KEY=VALUE options")
        try:
            conv = p.type.convert(text, p, click.Context(_command(entry)))
        except click.BadParameter as e:
            raise GridError(f"{where}: {k}={text!r}: {e.message}") from None
        if commands.gives_path(p.type) and conv is not None:
            out = str(conv)
    return k, out


def check_dataset(name: str, where: str, base: Path | None = None) -> str:
    """The dataset string every cell passes unchanged, checked by the study commands' own
    ``--dataset`` type (registered names, and whatever forms it accepts, e.g.
    ``folder:PATH``). A ``<kind>:<relative path>`` whose path exists (relative to ``base``,
    the grid file's folder, else the current folder) is made absolute: the cells run in the
    repository folder."""
    import click

    name = str(name).strip()
    if not name:
        raise GridError(f"{where}: no dataset given (a registered name, scarcelab list "
                        "datasets)")
    m = re.fullmatch(r"([A-Za-z][A-Za-z0-9_]*):(.+)", name)
    if m and not os.path.isabs(m.group(2)):
        p = (base or Path.cwd()) / m.group(2)
        if p.exists():
            name = f"{m.group(1)}:{p.resolve()}"
    par = _param("semi", "dataset")  # every study command shares the one --dataset type
    try:
        conv = par.type.convert(name, par, click.Context(_command("semi")))
    except click.BadParameter as e:
        raise GridError(f"{where}: {name!r}: {e.message}") from None
    # the type's canonical form where it gives one (a user's folder as folder:/absolute)
    return conv if isinstance(conv, str) and conv else name


# -- the grid ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Grid:
    """What is compared: every method on every seed, with the same options and budget."""

    dataset: str
    methods: tuple[str, ...]
    seeds: tuple[int, ...]
    options: dict[str, str] = field(default_factory=dict)
    method_options: dict[str, dict[str, str]] = field(default_factory=dict)
    budget_hours: float | None = None
    cell_minutes: float | None = None

    @property
    def families(self) -> dict[str, str]:
        return {m: family(m) for m in self.methods}

    @property
    def n_cells(self) -> int:
        return len(self.methods) * len(self.seeds)

    def cell_options(self, method: str) -> dict[str, str]:
        return {**self.options, **self.method_options.get(method, {})}


def build_grid(dataset: str, methods: list[str] | None, seeds: list[int] | None,
               options: dict[str, Any], budget_hours: float | None = None,
               cell_minutes: float | None = None) -> Grid:
    """The grid of command-line arguments (the defaults where not given), checked."""
    ds = check_dataset(dataset, "--dataset")
    ms = check_methods(list(methods) if methods else list(DEFAULT_METHODS), "--methods")
    ss = check_seeds(list(seeds) if seeds else list(DEFAULT_SEEDS), "--seeds")
    entries = {family(m) for m in ms}
    opts = dict(DEFAULT_OPTIONS)
    for k, v in options.items():
        key, val = check_option(entries, k, v, f"--option {k}={v}")
        opts[key] = val
    return Grid(ds, ms, ss, opts, {}, budget_hours, cell_minutes)


def load_grid(path: str | Path) -> Grid:
    """A grid file (the format :func:`grid_yaml` writes), every value checked; an error
    names the file and the line."""
    from scarcelab.tracking.sweep.spec import SpecError, _line, _load, _Located

    p = Path(path)
    if not p.is_file():
        raise GridError(f"{p}: no such grid file (write one with scarcelab compare --dataset "
                        "NAME --write-grid FILE)")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise GridError(f"{p}: cannot read the grid: {e}") from None
    try:
        node, data = _load(str(p), text)
    except SpecError as e:
        raise GridError(str(e)) from None
    if node is None or not isinstance(data, dict):  # an empty file composes to no node
        raise GridError(f"{p}:1: a grid is a mapping with dataset, methods, seeds "
                        "(scarcelab compare --write-grid FILE writes one)")
    loc = _Located(str(p), node)

    def at(key: str, sub: Any = None) -> str:
        n = loc.child(node, key) if sub is None else sub
        return f"{p}:{_line(n)}: {key}"

    for k in data:
        if k not in GRID_KEYS:
            raise GridError(f"{p}:{_line(loc.key_node(node, k))}: unknown key {k!r}; valid: "
                            f"{', '.join(GRID_KEYS)}")
    if "dataset" not in data:
        raise GridError(f"{p}:1: dataset: missing (a registered name or e.g. folder:PATH)")
    ds = check_dataset(str(data["dataset"]), at("dataset"), base=p.resolve().parent)
    methods = data.get("methods", list(DEFAULT_METHODS))
    if not isinstance(methods, list):
        raise GridError(f"{at('methods')}: a list of method names, e.g. [sup, fixmatch]")
    ms = check_methods(methods, at("methods"))
    seeds = data.get("seeds", list(DEFAULT_SEEDS))
    if not isinstance(seeds, list):
        raise GridError(f"{at('seeds')}: a list of integers, e.g. [0, 1, 2]")
    ss = check_seeds(seeds, at("seeds"))
    entries = {family(m) for m in ms}
    opts_node = loc.child(node, "options")
    raw = data.get("options") or {}
    if not isinstance(raw, dict):
        raise GridError(f"{at('options')}: a mapping of study options, e.g. "
                        "{arch: resnet18}")
    opts = {}
    for k, v in raw.items():
        where = f"{p}:{_line(loc.key_node(opts_node, k))}: options"
        key, val = check_option(entries, k, v, where)
        opts[key] = val
    mo_node = loc.child(node, "method_options")
    mo_raw = data.get("method_options") or {}
    if not isinstance(mo_raw, dict):
        raise GridError(f"{at('method_options')}: a mapping method -> its options, e.g. "
                        "{fixmatch: {set: {threshold: 0.9}}}")
    mo: dict[str, dict[str, str]] = {}
    for m, block in mo_raw.items():
        where = f"{p}:{_line(loc.key_node(mo_node, m))}: method_options: {m}"
        if str(m).lower() not in ms:
            raise GridError(f"{where}: not one of the grid's methods ({', '.join(ms)})")
        if not isinstance(block, dict):
            raise GridError(f"{where}: a mapping of its options, e.g. {{set: {{lr: 0.01}}}}")
        mo[str(m).lower()] = dict(check_option({family(str(m).lower())}, k, v, where)
                                  for k, v in block.items())
    hours = _positive(data.get("budget_hours"), at("budget_hours"))
    minutes = _positive(data.get("cell_minutes"), at("cell_minutes"))
    if hours is not None and minutes is not None:
        raise GridError(f"{at('cell_minutes')}: give budget_hours (the total) or "
                        "cell_minutes (each study's), not both")
    return Grid(ds, ms, ss, opts, mo, hours, minutes)


def _positive(v: Any, where: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
        raise GridError(f"{where}: must be a number > 0, got {v!r}")
    return float(v)


def grid_yaml(grid: Grid) -> str:
    """The grid file: what compare runs, with comments saying what each key does."""
    def dump(v: Any) -> str:
        text = yaml.safe_dump(v, default_flow_style=True, width=1000, sort_keys=False)
        return text.strip().removesuffix("\n...").strip()

    fams = grid.families
    lines = [
        "# scarcelab compare grid (docs/compare.md). Edit it, then run it with",
        "#   scarcelab compare --grid THIS_FILE [--budget-hours H] [--dry-run]",
        f"dataset: {dump(grid.dataset)}",
        "# every method runs on every seed; a seed is one split (labeled / validation)",
        "# shared by all methods, so the report pairs the methods seed by seed",
        f"seeds: {dump(list(grid.seeds))}",
        "# labeled-only (supervised) methods are the baselines of the gain; semi and self",
        "# methods are the candidates (scarcelab list methods)",
        "methods:",
    ]
    for m in grid.methods:
        lines.append(f"  - {m}  # {fams[m]}")
    lines += ["# options of every study (scarcelab semi --help), e.g. arch: resnet18,",
              "# n_labeled: 200, budget_clock: cpu, device: cuda",
              f"options: {dump(dict(grid.options)) if grid.options else '{}'}",
              "# one method's own options, e.g. fixmatch: {set: {threshold: 0.9}}",
              f"method_options: {dump(grid.method_options) if grid.method_options else '{}'}"]
    if grid.budget_hours is not None:
        lines += ["# the total budget, split equally over the cells (--dry-run shows how)",
                  f"budget_hours: {grid.budget_hours:g}"]
    if grid.cell_minutes is not None:
        lines += ["# each study's budget in minutes (instead of a total)",
                  f"cell_minutes: {grid.cell_minutes:g}"]
    return "\n".join(lines) + "\n"


# -- resources and the budget -----------------------------------------------------------

def count_gpus() -> int:
    """The GPUs a cell could be given on this machine: ``CUDA_VISIBLE_DEVICES`` when set
    (as Ray reads it), else ``nvidia-smi -L``'s lines; 0 without either. No torch import."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return len([d for d in vis.split(",") if d.strip() and d.strip() != "-1"])
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                             timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return 0
    return len([ln for ln in out.stdout.splitlines() if ln.startswith("GPU ")]) \
        if out.returncode == 0 else 0


@dataclass(frozen=True)
class Resources:
    """How many cells run at once, and what each declares to Ray."""

    slots: int
    cpus_per_cell: float
    gpus_per_cell: float | str  # "auto" only on a cluster (its pool decides)
    how: str  # where ``slots`` came from, for --dry-run and the report


def check_gpus_per_cell(value: str) -> float | str:
    """``auto`` or a number of GPUs per cell: 0 (CPU cells), a fraction of one GPU (cells
    packed onto a GPU) or a whole number; Ray refuses fractions above 1."""
    v = value.strip().lower()
    if v in ("", "auto", "default"):
        return "auto"
    try:
        g = float(v)
    except ValueError:
        raise GridError(f"--gpus-per-cell {value!r}: expected auto or a number (0, 0.25, "
                        "0.5, 1, 2 ...)") from None
    if not math.isfinite(g) or g < 0:
        raise GridError(f"--gpus-per-cell {value!r}: must be >= 0")
    if g > 1 and g != int(g):
        raise GridError(f"--gpus-per-cell {value!r}: a fraction of a GPU must be at most 1 "
                        "(Ray packs fractions onto one GPU); give a whole number above 1")
    return g


def resources(jobs: int | None, address: str, slots: int | None,
              cpus_per_cell: float | None, gpus_per_cell: float | str,
              n_cpus: int | None = None, n_gpus: int | None = None) -> Resources:
    """The parallel slots the budget is split over. Embedded (no ``address``), as
    tracking/sweep/pool.py computes them: CPUs (``jobs`` × CPUs per cell, else this
    machine's) over the CPUs per cell, and GPUs over the GPUs per cell. On a cluster they
    cannot be known before it is joined: ``slots`` must be given."""
    if address and slots is None:
        raise GridError("--address: give --slots N as well, the cells the cluster runs at "
                        "once (each study's budget is the total over them)")
    if slots is not None:
        g = gpus_per_cell
        if address:  # a cluster's nodes are not known here: one CPU unless told
            return Resources(slots, cpus_per_cell or 1.0, g, "--slots")
        if g == "auto":
            g = 1.0 if (count_gpus() if n_gpus is None else n_gpus) else 0.0
        if cpus_per_cell is None:  # this machine's cores shared by the slots
            cpus_per_cell = float(max(1, (n_cpus or os.cpu_count() or 1) // slots))
        return Resources(slots, cpus_per_cell, g, "--slots")
    n_cpus = n_cpus if n_cpus is not None else (os.cpu_count() or 1)
    n_gpus = n_gpus if n_gpus is not None else count_gpus()
    g = (1.0 if n_gpus else 0.0) if gpus_per_cell == "auto" else float(gpus_per_cell)
    if g > 0 and n_gpus == 0:
        raise GridError(f"--gpus-per-cell {g:g}: this machine has no GPU (CUDA_VISIBLE_DEVICES"
                        " / nvidia-smi); use 0 or auto")
    gpu_slots = int(n_gpus // g) if g else None
    if g and gpu_slots == 0:
        raise GridError(f"--gpus-per-cell {g:g}: this machine has {n_gpus} GPU(s); a cell "
                        "cannot ask for more")
    if cpus_per_cell is None:  # auto: the cores shared by the GPU slots, else one each
        cpus_per_cell = float(max(1, n_cpus // gpu_slots)) if gpu_slots else 1.0
    total = jobs * cpus_per_cell if jobs else float(n_cpus)
    if not jobs and cpus_per_cell > n_cpus:
        raise GridError(f"--cpus-per-cell {cpus_per_cell:g}: this machine has {n_cpus} CPUs")
    cpu_slots = int(total // cpus_per_cell)
    s = max(1, min(cpu_slots, gpu_slots) if gpu_slots else cpu_slots)
    how = (f"{'--jobs ' + str(jobs) if jobs else f'{n_cpus} CPUs'} / {cpus_per_cell:g} CPU "
           f"per cell" + (f", {n_gpus} GPU(s) / {g:g} GPU per cell" if g else ", no GPU"))
    return Resources(s, float(cpus_per_cell), g, how)


@dataclass(frozen=True)
class Plan:
    """Each study's budget and what the whole compare should take."""

    n_cells: int
    slots: int
    cell_minutes: float
    budget_hours: float | None  # None: the per-study budget was given (--cell-minutes)
    overhead_s: float = CELL_OVERHEAD_S
    fixed_s: float = SWEEP_OVERHEAD_S

    @property
    def waves(self) -> int:
        """Rounds of ``slots`` cells: equal budgets end together, so a last round of fewer
        cells takes as long as a full one."""
        return math.ceil(self.n_cells / self.slots)

    @property
    def estimate_s(self) -> float:
        return self.fixed_s + self.waves * (self.cell_minutes * 60.0 + self.overhead_s)

    def formula(self) -> str:
        """The split, with its numbers (--dry-run and the report print it)."""
        if self.budget_hours is None:
            return (f"each study {self.cell_minutes:g} min (--cell-minutes); "
                    f"{self.n_cells} cells on {self.slots} slot(s) = {self.waves} wave(s)")
        raw = (self.budget_hours * 60.0 - self.fixed_s / 60.0) / self.waves - \
            self.overhead_s / 60.0
        return (f"budget_minutes = floor_{STEP_MINUTES:g}((total - fixed) / waves - "
                f"per-cell overhead) = floor_{STEP_MINUTES:g}(({self.budget_hours * 60:g} min "
                f"- {self.fixed_s / 60:.2f} min) / {self.waves} - {self.overhead_s / 60:.2f} "
                f"min) = floor_{STEP_MINUTES:g}({raw:.3f}) = {self.cell_minutes:g} min; "
                f"waves = ceil({self.n_cells} cells / {self.slots} slot(s)) = {self.waves}")


def plan_budget(n_cells: int, slots: int, budget_hours: float | None,
                cell_minutes: float | None, overhead_s: float = CELL_OVERHEAD_S,
                fixed_s: float = SWEEP_OVERHEAD_S,
                min_minutes: float = MIN_CELL_MINUTES) -> Plan:
    """Every cell gets the same budget: the total, less the fixed start and end, over the
    waves of ``slots`` cells, less each cell's overhead, rounded down to STEP_MINUTES.
    Refuses a split that leaves a cell less than ``min_minutes``, naming the total that
    would give it that."""
    if (budget_hours is None) == (cell_minutes is None):
        raise GridError("give --budget-hours (the total, split equally over the studies) or "
                        "--cell-minutes (each study's), one of the two")
    waves = math.ceil(n_cells / slots)
    if cell_minutes is not None:
        minutes = float(cell_minutes)
        if minutes < min_minutes:
            raise GridError(f"--cell-minutes {minutes:g}: below the minimum of "
                            f"{min_minutes:g} min per study (--min-cell-minutes)")
        return Plan(n_cells, slots, minutes, None, overhead_s, fixed_s)
    assert budget_hours is not None
    raw = (budget_hours * 60.0 - fixed_s / 60.0) / waves - overhead_s / 60.0
    minutes = math.floor(raw / STEP_MINUTES + 1e-9) * STEP_MINUTES
    minutes = round(minutes, 6)
    if minutes < min_minutes:
        need = (fixed_s + waves * (min_minutes * 60.0 + overhead_s)) / 3600.0
        need = math.ceil(need * 100) / 100
        raise GridError(f"--budget-hours {budget_hours:g}: {n_cells} studies on {slots} "
                        f"slot(s) ({waves} wave(s)) leave {max(raw, 0):.2f} min per study "
                        f"after overheads, below the minimum of {min_minutes:g} min "
                        f"(--min-cell-minutes); give at least --budget-hours {need:g}, "
                        "fewer methods or seeds, or more slots")
    return Plan(n_cells, slots, minutes, budget_hours, overhead_s, fixed_s)


# -- the sweep --------------------------------------------------------------------------

def sweep_name(dataset: str) -> str:
    """``compare-<dataset>``, made safe for MLflow names and filters; a dataset string
    that had to be changed (a path) gets a digest of itself, so two folders never share a
    sweep."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", dataset.lower()).strip("-.")
    out = slug[:40].strip("-.") or "data"
    if out != dataset:
        out += "-" + hashlib.sha256(dataset.encode()).hexdigest()[:8]
    return f"compare-{out}"


def minutes_text(m: float) -> str:
    return f"{m:g}"


def sweep_text(grid: Grid, plan: Plan, res: Resources, name: str, experiment: str,
               retries: int) -> str:
    """The sweep spec of the grid (tracking/sweep/spec.py): one grid per (seed, method), in
    seed order, so that a compare cut short has whole seeds (every method on them)."""
    fams = grid.families
    grids = []
    for s in grid.seeds:
        for m in grid.methods:
            grids.append({"entry": fams[m], "method": m, "dataset": grid.dataset, "seed": s,
                          "budget_minutes": minutes_text(plan.cell_minutes),
                          **grid.cell_options(m)})
    # no env: the sweep gives each cell its CPU share's threads (OMP_NUM_THREADS, MKL_...)
    data = {"name": name, "experiment": experiment, "cpus_per_cell": res.cpus_per_cell,
            "gpus_per_cell": res.gpus_per_cell, "retries": retries, "grids": grids}
    head = ("# Written by scarcelab compare (docs/compare.md): its grid as a sweep spec.\n"
            "# `scarcelab sweep THIS_FILE` runs (or continues) the same cells.\n")
    return head + yaml.safe_dump(data, sort_keys=False, width=1000)


def spec_of(grid: Grid, plan: Plan, res: Resources, name: str, experiment: str,
            retries: int, path: str = "<compare>") -> Any:
    """The parsed :class:`~tracking.sweep.spec.SweepSpec` (every option checked again by
    the sweep's own parser)."""
    from scarcelab.tracking.sweep.spec import SpecError, parse_spec

    try:
        return parse_spec(sweep_text(grid, plan, res, name, experiment, retries), path)
    except SpecError as e:
        raise GridError(f"the grid's sweep spec: {e}") from None


def _num(v: float | str) -> str:
    return v if isinstance(v, str) else f"{v:g}"


def fmt_duration(s: float) -> str:
    s = int(round(s))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s"


def dry_run_text(grid: Grid, plan: Plan, res: Resources, spec: Any, output: str) -> str:
    """What a run would do: the grid, the slots, the budget formula, the estimate and every
    cell's command (shell-quoted)."""
    fams = grid.families
    by = {}
    for m in grid.methods:
        by.setdefault(fams[m], []).append(m)
    fam_text = " | ".join(f"{'labeled-only' if f == LABELED_ONLY else f}: {', '.join(ms)}"
                          for f, ms in by.items())
    lines = [
        f"compare {grid.dataset}: {len(grid.methods)} methods x {len(grid.seeds)} seeds = "
        f"{grid.n_cells} studies -> experiment {spec.experiment!r} (sweep {spec.name!r})",
        f"  methods: {fam_text}",
        f"  seeds: {', '.join(str(s) for s in grid.seeds)}",
        "  options of every study: "
        + (", ".join(f"{k}={v}" for k, v in grid.options.items()) or "none"),
        *(f"  {m}'s own options: " + ", ".join(f"{k}={v}" for k, v in o.items())
          for m, o in grid.method_options.items()),
        f"  slots: {plan.slots} at once ({res.how}; cpus_per_cell={res.cpus_per_cell:g}, "
        f"gpus_per_cell={_num(res.gpus_per_cell)})",
        f"  budget: {plan.formula()}",
        f"  overheads: {plan.overhead_s:g} s per cell beyond its budget, {plan.fixed_s:g} s "
        "per invocation (start, reports)",
        f"  estimate: {plan.fixed_s:g} s + {plan.waves} wave(s) x ({plan.cell_minutes:g} min "
        f"+ {plan.overhead_s:g} s) = {fmt_duration(plan.estimate_s)}"
        + (f" of the {fmt_duration(plan.budget_hours * 3600)} given"
           if plan.budget_hours is not None else ""),
        f"  output: {output} (report.md, per_seed.csv, summary.csv, grid.yaml, sweep.yaml)",
        f"cells ({len(spec.cells)}; `scarcelab sweep {shlex.quote(str(Path(output)))}/"
        "sweep.yaml` runs the same):",
    ]
    for c in spec.cells:
        lines.append(f"{c.id}  {shlex.join(['scarcelab', *c.argv()])}")
    return "\n".join(lines)
