"""``results``: a suite's results page (and the index of all suites) from the tracking store.

    scarcelab results suites/cdalbench.yaml                 # docs/results/cdalbench.md
    scarcelab results suites/*.yaml --index                 # every page + docs/results/README.md
    scarcelab results --index                               # the same, for every suites/*.yaml
    scarcelab results suites/cdalbench.yaml --smoke         # the smoke run: docs/results/smoke/
    mlflow run . -e results -P spec=suites/cdalbench.yaml
    scarcelab results suites/cdalbench.yaml --export docs/results/exports   # + its export
    scarcelab results --from-export docs/results/exports/cdalbench.json.gz  # no store needed
    scarcelab results --from-export docs/results/exports --index            # every export
    scarcelab results --merge a.json.gz,b.json.gz --export docs/results/exports/cscore.json.gz
                                       # slices of one design (sweep --only), one export

An export (tracking/results/export.py, docs/results/README.md) is what the page read from
the store, as a small gzip'd JSON file in the repository: ``--from-export`` builds the page
from it by the same code, on any checkout, without the store.

The page reads the sweep that ``scarcelab sweep <spec>`` (same scale flag) recorded; see
tracking/results/page.py for what it contains and where each number comes from.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from scarcelab.entrypoints.cli import main
from scarcelab.entrypoints.options import Bool, Word
from scarcelab.tracking.sweep.spec import SCALES

if TYPE_CHECKING:
    from scarcelab.tracking.results.page import SuitePage



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
@click.option("--claims", is_flag=True, help="the page of the spec's --claims run")
@click.option("--scale", type=Word((*SCALES, "default")), default="default",
              help="reference | smoke | full | claims (the same as the flags; for mlflow "
              "run)")
@click.option("--index", "index_flag", is_flag=True,
              help="also write <out>/README.md: one row per suite of --suites")
@click.option("--write-index", type=Bool(), default="false", hidden=True,
              help="--index as a true/false value (for mlflow run -P index=…)")
@click.option("--suites", default="suites", help="the folder of the suite specs the index "
              "lists")
@click.option("--tracking-uri", default="", help="default: MLFLOW_TRACKING_URI / MLflow's")
@click.option("--export", "export_to", default="", help="also write what each page read "
              "from the store to this file (.json.gz, one spec) or folder "
              "(<suite>.json.gz), e.g. docs/results/exports")
@click.option("--from-export", "from_export", default="", help="build the pages from "
              "this export file, or from the <suite>.json.gz files of this folder, instead "
              "of the store (the scale is the export's)")
@click.option("--merge", "merge", default="", help="exports of the slices of one design "
              "(`scarcelab sweep SPEC --only KEY=V…`, one store each), comma-separated: "
              "write their union to --export's file and build its page")
def results_cmd(specs: tuple[str, ...], spec_list: str, experiment: str, out: str,
                smoke: bool, full: bool, claims: bool, scale: str | None, index_flag: bool,
                write_index: bool, suites: str, tracking_uri: str, export_to: str,
                from_export: str, merge: str) -> None:
    """Write docs/results/<suite>.md (tables, figures, the paper's numbers beside ours and a
    verdict per headline claim) for each SPEC from the runs of its sweep (or from its
    export: --from-export)."""
    if merge:
        _merge(merge, export_to, from_export, specs, spec_list, out)
        return
    if export_to and from_export:
        raise click.BadParameter("--export writes what the store gave; with --from-export "
                                 "there is no store: give one of them",
                                 param_hint="'--export'")
    if claims and scale in (None, "default"):
        scale = "claims"  # the flag is --scale claims (the export's scale is checked)
    elif claims and scale != "claims":
        raise click.BadParameter(f"one scale at a time, got claims and {scale}",
                                 param_hint="'--scale'")
    if from_export:
        _from_export(specs, spec_list, out, smoke, full, scale, index_flag or write_index,
                     suites, from_export)
        return
    chosen = {s for s, on in (("smoke", smoke), ("full", full), ("claims", claims)) if on}
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
    if export_to and len(paths) != 1 and export_to.endswith((".json", ".json.gz")):
        raise click.BadParameter(f"{export_to} is one file: give one spec, or a folder",
                                 param_hint="'--export'")
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
            if export_to and p in paths:
                from scarcelab.tracking.results.export import export_page, write_export

                page, doc = export_page(p, sc, experiment or None, tracking_uri or None)
                target = Path(export_to) if export_to.endswith((".json", ".json.gz")) \
                    else Path(export_to) / f"{page.suite}.json.gz"
                f = write_export(doc, target)
                click.echo(f"{f}: {len(doc['runs'])} runs, {f.stat().st_size:,} bytes")
            else:
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
        _report(write_page(page, out_dir), page)
        entries.append((page.suite, page))
    if index:
        click.echo(f"{write_index_page(entries, out_dir, sc)}: {len(entries)} suites")
    if failed:
        raise SystemExit(1)


def _report(path: Path, page: SuitePage) -> None:
    n = {s: sum(v.status == s for v in page.verdicts) for s in
         ("reproduced", "not reproduced", "not testable at this scale")}
    click.echo(f"{path}: {page.counts['finished']}/{page.counts['cells']} cells, "
               f"{len(page.figures)} figures; verdicts: " +
               ", ".join(f"{v} {k}" for k, v in n.items()))


def _merge(merge: str, export_to: str, from_export: str, specs: tuple[str, ...],
           spec_list: str, out: str) -> None:
    """``--merge``: the slices' exports as one (tracking/results/export.py::merge_exports),
    then its page, as ``--from-export`` builds it."""
    from scarcelab.tracking.results.export import ExportError, merge_exports, write_export

    if from_export or not export_to.endswith((".json", ".json.gz")):
        raise click.BadParameter("--merge writes one export: name its file with --export "
                                 "(….json.gz), and no --from-export", param_hint="'--merge'")
    files = [f.strip() for f in merge.split(",") if f.strip()]
    try:
        doc = merge_exports(files)
    except ExportError as e:
        raise click.ClickException(str(e)) from None
    f = write_export(doc, export_to)
    click.echo(f"{f}: {len(doc['runs'])} runs of {len(doc['cells'])} cells from "
               f"{len(files)} exports ({f.stat().st_size:,} bytes)")
    _from_export(specs, spec_list, out, False, False, None, False, "suites", str(f))


def _from_export(specs: tuple[str, ...], spec_list: str, out: str, smoke: bool, full: bool,
                 scale: str | None, index: bool, suites: str, source: str) -> None:
    """The pages of exports (a file, or a folder's ``<suite>.json.gz`` files), each by the
    page builder that reads a store, with the spec and paper file of this checkout; the
    index lists every suite of ``--suites``, those without an export as before."""
    from scarcelab.tracking.results import write_index as write_index_page
    from scarcelab.tracking.results import write_page
    from scarcelab.tracking.results.export import ExportError, page_from_export
    from scarcelab.tracking.results.page import ResultsError
    from scarcelab.tracking.results.papers import PaperError
    from scarcelab.tracking.sweep.spec import SpecError

    src = Path(source)
    paths = list(specs) + [s.strip() for s in spec_list.split(",") if s.strip()]
    if src.is_dir():
        files = [src / f"{Path(p).stem}.json.gz" for p in paths] if paths else sorted(
            [*src.glob("*.json.gz"), *src.glob("*.json")])
        if not files:
            raise click.BadParameter(f"{src}: no exports (*.json.gz) in this folder",
                                     param_hint="'--from-export'")
        jobs = [(f, next((p for p in paths if Path(p).stem == f.name.split(".")[0]), None))
                for f in files]
    else:
        if len(paths) > 1:
            raise click.BadParameter(f"{src} is one export: give at most one spec",
                                     param_hint="'--from-export'")
        jobs = [(src, paths[0] if paths else None)]
    want = next((s for s, on in (("smoke", smoke), ("full", full)) if on), None) or (
        scale if scale and scale != "default" else None)
    pages, failed = [], False
    for f, spec in jobs:
        try:
            page = page_from_export(f, spec)
        except (ExportError, ResultsError, PaperError, SpecError) as e:
            click.echo(f"Error: {e}", err=True)
            failed = True
            continue
        if want is not None and page.spec.scale != want:
            click.echo(f"Error: {f}: an export of the {page.spec.scale} scale, not {want}",
                       err=True)
            failed = True
            continue
        out_dir = Path(out if out not in ("", "default") else
                       "docs/results" + ("" if page.spec.scale == "reference"
                                         else f"/{page.spec.scale}"))
        _report(write_page(page, out_dir), page)
        pages.append((out_dir, page))
    if index and pages:
        out_dir = pages[0][0]
        done = {p.suite: p for _, p in pages}
        entries = [(p.stem, done.get(p.stem, f"no export of it in {source}"))
                   for p in sorted(Path(suites).glob("*.yaml"))]
        entries += [(k, v) for k, v in done.items() if k not in {e[0] for e in entries}]
        # the title's scale: the pages' one scale when every row is such a page, else the
        # reference (a folder that mixes a claims page with carried reference rows is the
        # reference index; each row of another scale says its scale)
        scales = {v.spec.scale for _, v in entries if not isinstance(v, str)}
        one = next(iter(scales)) if len(scales) == 1 and all(
            not isinstance(v, str) for _, v in entries) else None
        index_path = write_index_page(entries, out_dir, want or one or "reference",
                                      source=f"the exports in {source}")
        click.echo(f"{index_path}: {len(entries)} suites")
    if failed or not pages:
        raise SystemExit(1)
