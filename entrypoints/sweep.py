"""``sweep``: a whole benchmark grid (a YAML spec) as Ray tasks, recorded in MLflow.

    scarcelab sweep grid.yaml                               # embedded Ray: all cores/GPUs
    scarcelab sweep grid.yaml --address ray://head:10001    # a running Ray cluster
    scarcelab sweep grid.yaml --dry-run                     # print the cells, run nothing
    scarcelab sweep suites/cdalbench.yaml --smoke           # every method at a trivial size
    scarcelab sweep suites/ssl_vs_ssl.yaml --full --gpus-per-cell 0.125 --mps true
                                                            # 8 studies per GPU, CUDA MPS
    mlflow run . -e sweep -P spec=grid.yaml

Re-running the same spec continues it: finished cells are skipped (docs/sweeps.md).
"""

from __future__ import annotations

from typing import Any

import click

from scarcelab import tags as T
from scarcelab.entrypoints.cli import main
from scarcelab.entrypoints.options import DEFAULT_WORDS, Bool, Int, _Typed, identity_options


class _Share(_Typed):
    """``--gpus-per-cell`` / ``--gpu-memory-fraction``: ``auto``, a number the spec's check
    accepts, or ``default`` (the spec's value: None)."""

    name = "share"

    def __init__(self, key: str) -> None:
        self.key = key

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "auto|NUMBER|default"

    def parse(self, value: str) -> Any:
        from scarcelab.tracking.sweep.spec import check_gpus, check_memory_fraction

        v = value.lower()
        if v in DEFAULT_WORDS:
            return None
        check = check_gpus if self.key == "gpus_per_cell" else check_memory_fraction
        if v == "auto":
            return check("auto")
        try:
            number = float(v)
        except ValueError:
            raise ValueError("not 'auto', a number or 'default'") from None
        return check(number)


class _OptBool(_Typed):
    """``true`` / ``false`` (as :class:`Bool`), or ``default`` (the spec's value: None)."""

    name = Bool.name

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "true|false|default"

    def parse(self, value: str) -> bool | None:
        if value.lower() == "default":
            return None
        return Bool().parse(value)


@main.command(name="sweep", short_help="Run a benchmark grid (YAML spec) on Ray.")
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("--address", default="", help="Ray cluster address (ray://head:10001, or "
              "'auto' for a cluster started on this machine with `ray start`); default: an "
              "embedded Ray on this machine")
@click.option("--jobs", type=Int(1, None), default=None,
              help="embedded Ray: cells at once (default: one per cpus_per_cell CPUs)")
@click.option("--retries", default="default", type=Int(0, None, default_ok=True),
              help="attempts after a cell's first failure (default: the spec's, else 1)")
@click.option("--full", is_flag=True, help="merge the spec's `full:` section (the paper's "
              "scale) into every grid")
@click.option("--full-scale", default="", hidden=True, type=Bool(),
              help="--full as a true/false value (for mlflow run -P full=…)")
@click.option("--smoke", is_flag=True, help="merge the spec's `smoke:` sections (every "
              "method at a trivial size, into the experiment <experiment>-smoke)")
@click.option("--smoke-scale", default="", hidden=True, type=Bool(),
              help="--smoke as a true/false value (for mlflow run -P smoke=…)")
@click.option("--claims", is_flag=True, help="merge the spec's `claims:` sections (a design "
              "sized to test the paper's headline claims, into the experiment "
              "<experiment>-claims)")
@click.option("--claims-scale", default="", hidden=True, type=Bool(),
              help="--claims as a true/false value (for mlflow run -P claims=…)")
@click.option("--dry-run", is_flag=True, help="print the cells and what a run would do")
@click.option("--only", multiple=True, metavar="KEY=V1,V2",
              help="run the cells whose option KEY takes one of the values (repeatable: "
              "all must hold), with the cells they depend on: a design in slices, one "
              "store each, merged with `scarcelab results --merge` (docs/sweeps.md)")
@click.option("--max-cells", type=Int(1, None), default=None,
              help="refuse a spec of more cells than this (default 10000), counted before "
              "any cell is built")
@click.option("--gpus-per-cell", default="default", type=_Share("gpus_per_cell"),
              help="GPUs each cell takes, over the spec's gpus_per_cell: a fraction packs "
              "several cells on one GPU (0.125: 8 per GPU), auto: 1 where the cluster has "
              "GPUs (docs/sweeps.md, 'Many studies on one GPU')")
@click.option("--gpu-memory-fraction", default="default",
              type=_Share("gpu_memory_fraction"),
              help="cap of each cell's CUDA allocator, a fraction of its GPU, over the "
              "spec's (auto: its GPU share when below 1, else no cap)")
@click.option("--mps", default="default", type=_OptBool(),
              help="true: start CUDA MPS so that cells sharing a GPU run at once (over the "
              "spec's mps)")
@identity_options
def sweep_cmd(spec: str, address: str, jobs: int | None, retries: int | None, full: bool,
              full_scale: bool, smoke: bool, smoke_scale: bool, claims: bool, claims_scale: bool,
              dry_run: bool, only: tuple[str, ...],
              max_cells: int | None, gpus_per_cell: float | str | None,
              gpu_memory_fraction: float | str | None, mps: bool | None, run_name: str,
              tags: dict[str, str], description: str) -> None:
    """Run every cell of a grid spec as a Ray task; one sweep run in MLflow records them."""
    import dataclasses
    import os
    import shlex

    from scarcelab.tracking.sweep.spec import (
        MAX_CELLS,
        SpecError,
        check_spec_names,
        load_spec,
        select_cells,
    )

    full, smoke, n_retries = full or full_scale, smoke or smoke_scale, retries
    claims = claims or claims_scale

    try:
        sp = load_spec(spec, full=full, smoke=smoke, max_cells=max_cells or MAX_CELLS,
                       scale="claims" if claims else None)
        check_spec_names(sp)  # before anything is printed (issue 42 item 5)
        if only:
            sp = dataclasses.replace(sp, cells=select_cells(sp.cells, only))
    except SpecError as e:
        raise click.ClickException(str(e)) from None
    over = {k: v for k, v in (("gpus_per_cell", gpus_per_cell),
                              ("gpu_memory_fraction", gpu_memory_fraction),
                              ("mps", mps)) if v is not None}
    sp = dataclasses.replace(sp, **over)
    if dry_run:
        click.echo(f"sweep {sp.name}: {len(sp.cells)} cells -> experiment {sp.experiment!r} "
                   f"({sp.scale} scale, cpus_per_cell={sp.cpus_per_cell:g}, "
                   f"gpus_per_cell={sp.gpus_per_cell}, "
                   + (f"gpu_memory_fraction={sp.gpu_memory_fraction}, "
                      if sp.gpu_memory_fraction != "auto" else "")
                   + ("mps=true, " if sp.mps else "")
                   + f"retries={sp.retries if n_retries is None else n_retries})")
        from scarcelab.tracking.sweep.driver import RESOLVE, RESOLVE_DEFAULT

        for c in sp.cells:
            # every argument shell-quoted (issue 42 item 5): the printed command is one a
            # user copies into a shell, and a spec's value is data, not shell syntax; the
            # note on a dependency follows as a shell comment
            after = "".join(
                f"  [{k} = {RESOLVE.get(k, RESOLVE_DEFAULT).format(run_id=f'<run of {d}>')}"
                f" once cell {d} finished]" for k, d in c.refs)
            click.echo(f"{c.id}  {shlex.join(['scarcelab', *c.argv()])}"
                       + (f"  #{after}" if after else ""))
        return
    from scarcelab.extras import MissingExtra, need

    try:  # before the sweep run is opened: a missing extra is one line, not a failed run
        need("ray", "scarcelab sweep (cells as Ray tasks)")
    except MissingExtra as e:
        raise click.ClickException(str(e)) from None
    from scarcelab.tracking.mlflow_tracker import check_tracking_server
    from scarcelab.tracking.sweep.driver import Identity, run_sweep

    check_tracking_server()  # the store: one line before Ray starts or a sweep run opens
    from scarcelab.tracking.store_check import open_store

    open_store()  # a new sqlite file's tables, under a lock, before cells open it too

    try:
        from scarcelab.tracking.results.page import rel

        command = shlex.join(
            ["scarcelab", "sweep", rel(spec)] + (["--smoke"] if smoke else []) +
            (["--full"] if full else []) + (["--claims"] if claims else []) +
            (["--jobs", str(jobs)] if jobs else []) +
            [a for f in only for a in ("--only", f)] +
            (["--address", address] if address else []) +
            (["--retries", str(n_retries)] if n_retries is not None else []) +
            [a for k, v in over.items() for a in (f"--{k.replace('_', '-')}", str(v).lower())])
        import signal

        got: list[int] = []

        def _terminate(signum: int, frame: object) -> None:
            # SIGTERM as SystemExit: the driver closes its running cells' runs FAILED and the
            # sweep run, and Ray's exit handler stops its daemons and workers (whose cells
            # die with them); killed outright, all of them lingered
            got.append(signum)
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, _terminate)
        try:
            res = run_sweep(sp, address=address or None, jobs=jobs, retries=n_retries,
                            echo=lambda s: click.echo(s, err=True), command=command,
                            identity=Identity(run_name, tags, description))
        except SystemExit:
            if got:  # Ray turns a signal inside ray.wait into SystemExit(1): say which
                raise SystemExit(128 + got[0]) from None
            raise
    except (RuntimeError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    if os.environ.get("MLFLOW_RUN_ID"):  # under `mlflow run`: link the launcher's run
        from mlflow.tracking import MlflowClient

        c = MlflowClient()
        for k, v in {T.ROLE: "sweep_launcher", T.SWEEP: res.name,
                     T.SWEEP_RUN: res.sweep_run_id}.items():
            c.set_tag(os.environ["MLFLOW_RUN_ID"], k, v)
    click.echo(f"sweep {res.name}: {res.count('FINISHED')} cells run, {res.count('SKIPPED')} "
               f"already finished, {res.count('FAILED')} failed; sweep run "
               f"{res.sweep_run_id}" + ("; report logged under report/" if res.report_logged
                                        else ""))
    if res.count("FAILED"):
        raise SystemExit(1)
