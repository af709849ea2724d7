"""``scarcelab compare``: which method on your data? One command, one budget, a fair answer.

    scarcelab compare --dataset breastmnist --budget-hours 8 --dry-run   # the plan
    scarcelab compare --dataset folder:./xray --budget-hours 8           # run + report
    scarcelab compare --dataset breastmnist --write-grid grid.yaml       # edit the grid…
    scarcelab compare --grid grid.yaml --budget-hours 8                  # …and run it
    scarcelab compare --grid grid.yaml --budget-hours 8 --report-only    # report again
    mlflow run . -e compare -P dataset=breastmnist -P budget_hours=8

It builds the grid (labeled-only baselines, semi- and self-supervised methods, seeds),
gives every study the same share of the total budget, runs the grid as a sweep (``scarcelab
sweep``: embedded Ray, a Ray cluster, CPU or GPU cells) and writes the report: the best and
tied methods on validation-selected test balanced accuracy, the gain over the best
labeled-only method with a confidence interval, the cost, the winning model's URI. Re-run
with the same arguments, it continues (finished studies are kept). docs/compare.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from scarcelab.entrypoints.cli import main
from scarcelab.entrypoints.options import (
    Bool,
    Float,
    Int,
    IntList,
    Text,
    _Typed,
    identity_options,
)
from scarcelab.tracking.compare.grid import (
    CELL_OVERHEAD_S,
    DEFAULT_METHODS,
    MIN_CELL_MINUTES,
    SWEEP_OVERHEAD_S,
)


class MaybeFloat(_Typed):
    """A positive number, or ``''`` / ``default`` for "not given"."""

    name = "number"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "FLOAT"

    def parse(self, value: str) -> float | None:
        if value.lower() in ("", "default", "none"):
            return None
        return Float(0.0, 10**7, lo_open=True).parse(value)


class AutoNumber(_Typed):
    """``auto`` or a number >= 0 (CPUs / GPUs per cell; GPUs are checked further by
    ``grid.check_gpus_per_cell``)."""

    name = "auto|number"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "auto|FLOAT"

    def parse(self, value: str) -> str:
        if value.lower() in ("", "auto", "default"):
            return "auto"
        Float(0.0, None).parse(value)
        return value


def _pairs(pairs: tuple[str, ...], text: str) -> dict[str, str]:
    """``-o KEY=VALUE`` (repeatable) and ``--options 'K=V;K=V'`` (one string, for
    ``mlflow run -P options=…``; ``;`` because a value such as ``set=lr=0.1,ema=0.9`` holds
    commas) as one mapping."""
    items = list(pairs) + [p for p in (text or "").split(";") if p.strip()]
    out: dict[str, str] = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k.strip():
            raise click.BadParameter(f"{item!r}: expected KEY=VALUE (e.g. arch=resnet18)",
                                     param_hint="'--option'")
        k = k.strip().replace("-", "_")
        if k in out:
            raise click.BadParameter(f"{k} given twice", param_hint="'--option'")
        out[k] = v.strip()
    return out


def _given(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT,
                                                  ParameterSource.DEFAULT_MAP, None)


def _command_line(ctx: click.Context) -> str:
    """The compare command as given (the options not left at their defaults), for the
    report: the line that regenerates it."""
    import shlex

    parts = ["scarcelab", "compare"]
    for p in ctx.command.params:
        if not p.name or not _given(ctx, p.name) or not isinstance(p, click.Option):
            continue
        raw = ctx.params[p.name]
        if p.is_flag:
            if raw:
                parts.append(p.opts[0])
        elif p.multiple:
            for v in raw:
                parts += [p.opts[0], str(v)]
        elif p.name in ("tags",):
            parts += [p.opts[0], ",".join(f"{k}={v}" for k, v in raw.items()) or "none"]
        elif p.name == "seeds":
            parts += [p.opts[0], ",".join(map(str, raw))]
        else:
            parts += [p.opts[0], str(raw)]
    return shlex.join(parts)


@main.command(name="compare", short_help="Which method on your data: a budgeted report.")
@click.option("--dataset", default="", help="any dataset the study commands accept "
              "(scarcelab list datasets), passed to every study unchanged")
@click.option("--methods", default="default", type=Text(),
              help=f"comma-separated methods; default: {','.join(DEFAULT_METHODS)} (at "
              "least one labeled-only method: the gain's reference)")
@click.option("--seeds", default="0,1,2", show_default=True, type=IntList(lo=0),
              help="seeds (each one split of labeled / validation images, shared by all "
              "methods): at least 2")
@click.option("--budget-hours", default="", type=MaybeFloat(),
              help="the total wall time, split equally over the studies (--dry-run shows "
              "the formula)")
@click.option("--cell-minutes", default="", type=MaybeFloat(),
              help="instead of --budget-hours: each study's budget in minutes")
@click.option("--option", "-o", "option_pairs", multiple=True, metavar="KEY=VALUE",
              help="an option of every study, e.g. -o arch=resnet18 -o n_labeled=200 "
              "(repeatable; scarcelab semi --help lists them)")
@click.option("--options", "options_text", default="none", type=Text(),
              help="the same as one string, 'KEY=VALUE;KEY=VALUE' (for mlflow run)")
@click.option("--grid", "grid_file", default="", help="a grid file (--write-grid writes "
              "one): its dataset, methods, seeds and options replace those options")
@click.option("--write-grid", default="", help="write the grid to this file and stop")
@click.option("--experiment", default="", help="MLflow experiment of the studies "
              "(default: compare-<dataset>)")
@click.option("--output", default="", help="folder of the report (default: "
              "./compare-<dataset>)")
@click.option("--jobs", type=Int(1, None), default=None,
              help="embedded Ray: studies at once (default: one per cpus-per-cell CPUs)")
@click.option("--address", default="", help="a Ray cluster (ray://head:10001); needs "
              "--slots")
@click.option("--slots", default="default", type=Int(1, None, default_ok=True),
              help="studies that run at once, the budget's divisor (default: from this "
              "machine's CPUs and GPUs)")
@click.option("--cpus-per-cell", default="auto", type=AutoNumber(),
              help="CPUs each study declares (auto: 1, or this machine's cores over its "
              "GPU slots)")
@click.option("--gpus-per-cell", default="auto", type=AutoNumber(),
              help="GPUs each study declares: auto (1 where there are GPUs), 0, a fraction "
              "(0.5: two studies packed on one GPU) or a whole number")
@click.option("--retries", default="1", show_default=True, type=Int(0, None),
              help="attempts after a study's first failure")
@click.option("--alpha", default="0.05", show_default=True,
              type=Float(0.0, 0.5, lo_open=True), help="significance level of the tie test "
              "and 1 - confidence of the gain's interval")
@click.option("--min-cell-minutes", default=f"{MIN_CELL_MINUTES:g}", show_default=True,
              type=Float(0.0, None, lo_open=True),
              help="refuse a budget that leaves a study less than this")
@click.option("--overhead-seconds", default=f"{CELL_OVERHEAD_S:g}", show_default=True,
              type=Float(0.0, None), help="seconds a study's cell takes beyond its budget")
@click.option("--fixed-seconds", default=f"{SWEEP_OVERHEAD_S:g}", show_default=True,
              type=Float(0.0, None),
              help="seconds of an invocation outside the studies (start, reports)")
@click.option("--dry-run", is_flag=True, help="print the grid, the budget split, the "
              "estimate and every study's command; run and log nothing")
@click.option("--report-only", is_flag=True, help="only (re)write the report from the "
              "tracking store")
@click.option("--report-only-value", default="", hidden=True, type=Bool(),
              help="--report-only as a true/false value (for mlflow run -P report_only=…)")
@click.option("--log/--no-log", "do_log", default=True,
              help="log the report as a `report` run")
@identity_options
@click.pass_context
def compare_cmd(ctx: click.Context, dataset: str, methods: str, seeds: tuple[int, ...],
                budget_hours: float | None, cell_minutes: float | None,
                option_pairs: tuple[str, ...], options_text: str, grid_file: str,
                write_grid: str, experiment: str, output: str, jobs: int | None,
                address: str, slots: int | None, cpus_per_cell: str, gpus_per_cell: str,
                retries: int, alpha: float, min_cell_minutes: float,
                overhead_seconds: float, fixed_seconds: float, dry_run: bool,
                report_only: bool, report_only_value: bool, do_log: bool, run_name: str,
                tags: dict[str, str], description: str) -> None:
    """Compare labeled-only, semi- and self-supervised methods on DATASET under one total
    budget, every method on the same seeds (splits), and write the answer: the best and
    tied methods, the gain over the best labeled-only method with its confidence interval,
    the cost, the winning model."""
    from scarcelab.tracking.compare import grid as G

    report_only = report_only or report_only_value
    opts = _pairs(option_pairs, options_text)
    try:
        if grid_file:
            # by value, not by source: under mlflow run every option is on the command line
            clash = [name for name, given in (
                ("--dataset", bool(dataset.strip())),
                ("--methods", methods.strip().lower() not in ("", "default")),
                ("--seeds", _given(ctx, "seeds") and tuple(seeds) != G.DEFAULT_SEEDS),
                ("--option", bool(opts))) if given]
            if clash:
                raise G.GridError(f"--grid {grid_file} holds the dataset, methods, seeds and "
                                  f"options; edit the file instead of giving {', '.join(clash)}")
            grid = G.load_grid(grid_file)
            if budget_hours is not None or cell_minutes is not None:  # the command line wins
                import dataclasses

                grid = dataclasses.replace(grid, budget_hours=budget_hours,
                                           cell_minutes=cell_minutes)
        else:
            if not dataset.strip():
                raise click.UsageError("give --dataset NAME (scarcelab list datasets) or "
                                       "--grid FILE")
            names = None if methods.strip().lower() in ("", "default") else \
                [m for m in methods.split(",") if m.strip()]
            grid = G.build_grid(dataset, names, list(seeds), opts, budget_hours,
                                cell_minutes)
        if write_grid:
            Path(write_grid).write_text(G.grid_yaml(grid))
            click.echo(f"wrote {write_grid}: {len(grid.methods)} methods x "
                       f"{len(grid.seeds)} seeds on {grid.dataset}; edit it, then run "
                       f"scarcelab compare --grid {write_grid}"
                       + ("" if grid.budget_hours or grid.cell_minutes
                          else " --budget-hours H"))
            return
        gpus = G.check_gpus_per_cell(gpus_per_cell)
        cpus = None if cpus_per_cell == "auto" else float(cpus_per_cell)
        if cpus is not None and cpus <= 0:
            raise G.GridError(f"--cpus-per-cell {cpus_per_cell}: must be > 0")
        res = G.resources(jobs, address, slots, cpus, gpus)
        plan = G.plan_budget(grid.n_cells, res.slots, grid.budget_hours, grid.cell_minutes,
                             overhead_seconds, fixed_seconds, min_cell_minutes)
        name = G.sweep_name(grid.dataset)
        exp = experiment.strip() or name
        out = Path(output.strip() or name)
        spec = G.spec_of(grid, plan, res, name, exp, retries,
                         path=str(out / "sweep.yaml"))
    except G.GridError as e:
        raise click.ClickException(str(e)) from None
    if dry_run:
        click.echo(G.dry_run_text(grid, plan, res, spec, str(out)))
        return
    from scarcelab.tracking.mlflow_tracker import check_tracking_server

    check_tracking_server()  # a dead server: one line now, not a traceback later
    failed = False
    if not report_only:
        failed = _run(ctx, grid, plan, res, spec, out, address, jobs, retries)
    _report(grid, plan, spec, out, alpha, _command_line(ctx), do_log, run_name, tags,
            description)
    if failed:
        raise SystemExit(1)


def _run(ctx: click.Context, grid: Any, plan: Any, res: Any, spec: Any, out: Path,
         address: str, jobs: int | None, retries: int) -> bool:
    """Write the grid (with each study's budget pinned, so ``--grid out/grid.yaml`` continues
    the same cells on any machine) and its sweep spec, then run the spec with ``scarcelab
    sweep`` itself: its checks, its resume, its interrupt handling. Returns whether a cell
    failed for good."""
    import dataclasses

    from scarcelab.entrypoints.sweep import sweep_cmd
    from scarcelab.tracking.compare import grid as G

    out.mkdir(parents=True, exist_ok=True)
    pinned = dataclasses.replace(grid, budget_hours=None, cell_minutes=plan.cell_minutes)
    (out / "grid.yaml").write_text(G.grid_yaml(pinned))
    (out / "sweep.yaml").write_text(G.sweep_text(grid, plan, res, spec.name, spec.experiment,
                                                 retries))
    click.echo(f"compare {grid.dataset}: {grid.n_cells} studies of {plan.cell_minutes:g} min, "
               f"{plan.slots} at once, about {G.fmt_duration(plan.estimate_s)} "
               f"-> experiment {spec.experiment!r}; spec {out / 'sweep.yaml'}", err=True)
    try:
        ctx.invoke(sweep_cmd, spec=str(out / "sweep.yaml"), address=address, jobs=jobs,
                   retries=retries)
    except SystemExit as e:
        if e.code == 1:  # cells failed for good: the report says which
            return True
        raise
    return False


def _report(grid: Any, plan: Any, spec: Any, out: Path, alpha: float, command: str,
            do_log: bool, run_name: str, tags: dict[str, str], description: str) -> None:
    from scarcelab.tracking.compare import report as R
    from scarcelab.tracking.compare.analysis import analyse

    col = R.collect(spec, grid)
    an = analyse(col.per_seed, grid.families, alpha)
    paths = R.write(an, col, grid, plan, spec, out, command)
    text = paths["report.md"].read_text()
    answer = text.split("## The answer", 1)[1].split("## Per seed", 1)[0]
    click.echo("\n".join(ln for ln in answer.strip().splitlines()).replace("## ", "").strip())
    click.echo(f"\nreport: {paths['report.md']}")
    if do_log:
        rid = R.log(paths, spec.experiment, col, an, run_name=run_name, tags=tags,
                    description=description)
        import os

        where = "the run mlflow run opened" if os.environ.get("MLFLOW_RUN_ID") else \
            f"experiment {spec.experiment!r}"
        click.echo(f"report run: {rid} ({where})")
    n_done = int((col.per_seed["status"] == "FINISHED").sum())
    if n_done < len(col.per_seed):
        click.echo(f"{len(col.per_seed) - n_done} of {len(col.per_seed)} studies have no "
                   "finished run (see the report); re-run the same command to continue",
                   err=True)
