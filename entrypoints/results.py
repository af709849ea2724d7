"""``results``: a suite's results page (and the index of all suites) from the tracking store.

    scarcelab results suites/cdalbench.yaml                 # docs/results/cdalbench.md
    scarcelab results suites/*.yaml --index                 # every page + docs/results/README.md
    scarcelab results --index                               # the same, for every suites/*.yaml
    scarcelab results suites/cdalbench.yaml --smoke         # the smoke run: docs/results/smoke/
    mlflow run . -e results -P spec=suites/cdalbench.yaml

The page reads the sweep that ``scarcelab sweep <spec>`` (same scale flag) recorded; see
tracking/results/page.py for what it contains and where each number comes from.
"""

from __future__ import annotations

from pathlib import Path

import click

from scarcelab.entrypoints.cli import main
from scarcelab.entrypoints.options import Bool, Word

SCALES = ("reference", "smoke", "full")


@main.command(name="results", short_help="Write a suite's results page from the store.")
@click.argument("specs", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--spec", "spec_list", default="", help="spec file(s), comma-separated (the "
              "same as the arguments; for mlflow run -P spec=…)")
@click.option("--experiment", default="", help="read this experiment instead of the spec's "
              "(one spec only)")
@click.option("--out", default="default", help="folder of the pages (default: docs/results, "
              "docs/results/smoke for --smoke, docs/results/full for --full)")
@click.option("--smoke", is_flag=True, help="the page of the spec's --smoke run")
@click.option("--full", is_flag=True, help="the page of the spec's --full run")
@click.option("--scale", type=Word((*SCALES, "default")), default="default",
              help="reference | smoke | full (the same as the flags; for mlflow run)")
@click.option("--index", "index_flag", is_flag=True,
              help="also write <out>/README.md: one row per suite of --suites")
@click.option("--write-index", type=Bool(), default="false", hidden=True,
              help="--index as a true/false value (for mlflow run -P index=…)")
@click.option("--suites", default="suites", help="the folder of the suite specs the index "
              "lists")
@click.option("--tracking-uri", default="", help="default: MLFLOW_TRACKING_URI / MLflow's")
def results_cmd(specs: tuple[str, ...], spec_list: str, experiment: str, out: str,
                smoke: bool, full: bool, scale: str | None, index_flag: bool,
                write_index: bool, suites: str, tracking_uri: str) -> None:
    """Write docs/results/<suite>.md (tables, figures, the paper's numbers beside ours and a
    verdict per headline claim) for each SPEC from the runs of its sweep."""
    chosen = {s for s, on in (("smoke", smoke), ("full", full)) if on}
    if scale and scale != "default":
        chosen.add(scale)
    if len(chosen - {"reference"}) > 1 or ("reference" in chosen and len(chosen) > 1):
        raise click.BadParameter(f"one scale at a time, got {sorted(chosen)}",
                                 param_hint="'--scale'")
    sc = next(iter(chosen), "reference")
    paths = list(specs) + [s.strip() for s in spec_list.split(",") if s.strip()]
    index = index_flag or write_index
    if not paths and not index:
        raise click.UsageError("name a suite spec (e.g. suites/cdalbench.yaml) or --index")
    if experiment and len(paths) != 1:
        raise click.BadParameter("--experiment reads one experiment: give exactly one spec",
                                 param_hint="'--experiment'")
    for p in paths:
        if not Path(p).is_file():
            raise click.BadParameter(f"{p}: no such spec file", param_hint="'SPECS'")
    out_dir = Path(out if out not in ("", "default") else
                   "docs/results" + ("" if sc == "reference" else f"/{sc}"))
    from scarcelab.tracking.results import build_page, write_page
    from scarcelab.tracking.results import write_index as write_index_page
    from scarcelab.tracking.results.page import ResultsError, rel
    from scarcelab.tracking.results.papers import PaperError
    from scarcelab.tracking.sweep.spec import SpecError

    listed = sorted(Path(suites).glob("*.yaml")) if index else []
    if index and not listed and not paths:
        raise click.BadParameter(f"{suites}: no suite specs (*.yaml) there",
                                 param_hint="'--suites'")
    todo = paths + [str(p) for p in listed if str(p) not in paths and
                    p.resolve() not in {Path(q).resolve() for q in paths}]
    entries = []
    failed = False
    for p in todo:
        try:
            page = build_page(p, sc, experiment or None, tracking_uri or None)
        except (ResultsError, PaperError, SpecError) as e:
            if p in paths:
                click.echo(f"Error: {e}", err=True)
                failed = True
            flag = "" if sc == "reference" else f" --{sc}"
            entries.append((Path(p).stem, f"no {sc}-scale sweep in the store: "
                            f"`scarcelab sweep {rel(p)}{flag}`" if isinstance(e, ResultsError)
                            else str(e)))
            continue
        path = write_page(page, out_dir)
        n = {s: sum(v.status == s for v in page.verdicts) for s in
             ("reproduced", "not reproduced", "not testable at this scale")}
        click.echo(f"{path}: {page.counts['finished']}/{page.counts['cells']} cells, "
                   f"{len(page.figures)} figures; verdicts: " +
                   ", ".join(f"{v} {k}" for k, v in n.items()))
        entries.append((page.suite, page))
    if index:
        click.echo(f"{write_index_page(entries, out_dir, sc)}: {len(entries)} suites")
    if failed:
        raise SystemExit(1)
