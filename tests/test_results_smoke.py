"""Every suite's smoke scale through the real sweep driver (embedded Ray, a cell process per
cell, a real sqlite MLflow store), then its results page from that store (issue 24): the
report has a row per method of the suite's reference grid and the page renders — its
provenance, its verdict table, its tables and its figures (small PNGs).

This is the test that keeps a suite from breaking silently: a method that no longer runs,
a view that no longer builds, a page that no longer renders all fail here. It costs a few
minutes (one process per cell; tests/test_results_smoke.py's numbers are in
docs/sweeps.md, "The CI smoke"). The data are the project machines' real files
(../shared/data); without them the module is skipped.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import mlflow
import pytest
from conftest import SHARED_DATA

REPO = Path(__file__).resolve().parents[1]
SUITES = sorted((REPO / "suites").glob("*.yaml"))
NEEDED = ["medmnist/breastmnist.npz", "medmnist/pneumoniamnist.npz", "tabular/splice",
          "pathology_crops", "consep_patches", "nuclei_cpm15", "cifar10_jpg", "ood"]

pytestmark = pytest.mark.skipif(
    not all((SHARED_DATA / n).exists() for n in NEEDED),
    reason=f"the suites' real data ({', '.join(NEEDED)}) are not under {SHARED_DATA} "
           "(../shared/data is only on the project machines)")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):  # type: ignore[no-untyped-def]
    """Run the five smokes one after another on one embedded Ray, write their pages and the
    index; returns what the tests read."""
    ray = pytest.importorskip("ray")
    from scarcelab.tracking.results import build_page, write_index, write_page
    from scarcelab.tracking.sweep.driver import run_sweep
    from scarcelab.tracking.sweep.spec import load_spec

    tmp = tmp_path_factory.mktemp("smoke")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    mp = pytest.MonkeyPatch()
    mp.setenv("MLFLOW_TRACKING_URI", uri)
    mp.setenv("SCARCELAB_DATA", str(SHARED_DATA))
    mp.setenv("PYTHONPATH", str(REPO))
    mp.setenv("OMP_NUM_THREADS", "1")
    mp.delenv("MLFLOW_RUN_ID", raising=False)
    mp.chdir(tmp)
    mlflow.set_tracking_uri(uri)
    if ray.is_initialized():
        ray.shutdown()
    out = {"results": {}, "pages": {}, "paths": {}, "seconds": {}, "log": []}
    try:
        for path in SUITES:
            t0 = time.time()
            spec = load_spec(path, smoke=True)
            out["results"][path.stem] = run_sweep(spec, jobs=2, echo=out["log"].append)
            page = build_page(path, "smoke")
            out["pages"][path.stem] = page
            out["paths"][path.stem] = write_page(page, tmp / "pages")
            out["seconds"][path.stem] = time.time() - t0
        out["index"] = write_index([(s, p) for s, p in out["pages"].items()], tmp / "pages",
                                   "smoke")
        yield out
    finally:
        ray.shutdown()
        mp.undo()
        print("smoke seconds per suite:", {k: round(v) for k, v in out["seconds"].items()})


def _methods(path: Path) -> set[str]:
    from scarcelab.tracking.sweep.spec import load_spec

    out = set()
    for c in load_spec(path).cells:  # the *reference* grid's methods
        o = dict(c.options)
        out.add(o.get("method") or o.get("strategy") or o.get("encoder"))
    return out


@pytest.mark.parametrize("path", SUITES, ids=lambda p: p.stem)
def test_every_smoke_cell_finishes(smoke, path):
    res = smoke["results"][path.stem]
    failed = [(o.cell.label, o.error) for o in res.outcomes if o.status == "FAILED"]
    assert not failed, "\n".join(smoke["log"][-40:])
    page = smoke["pages"][path.stem]
    assert page.counts["finished"] == page.counts["cells"] > 0


@pytest.mark.parametrize("path", SUITES, ids=lambda p: p.stem)
def test_the_report_has_a_row_per_method_of_the_reference_grid(smoke, path):
    import pandas as pd

    page = smoke["pages"][path.stem]
    want = _methods(path)
    folder = smoke["paths"][path.stem].parent / path.stem
    if path.stem == "ssl_vs_ssl":
        got = set(pd.read_csv(folder / "leaderboard.csv")["method"])
        gains = set(pd.read_csv(folder / "gains.csv")["method"])
        assert gains == want  # every method has a gain over the labeled-only reference
    elif path.stem == "cdalbench":
        got = set(pd.read_csv(folder / "auc.csv")["strategy"])
    elif path.stem == "cscore":
        table = pd.read_csv(folder / "table_a1.csv")
        got = set(table["method"])
        assert set(table["source"]) == {"breastmnist", "mnist"}
        assert set(table["ratio"]) == {0.0, 0.3}
    elif path.stem == "tune_it":
        got = set(pd.read_csv(folder / "table3.csv")["method"])
    elif path.stem == "pathology":
        view = pd.read_csv(folder / "transfer.csv").set_index("encoder")
        got = set(view.index)
        for enc in got:  # every task measured for both encoders
            for task in ("linear", "finetune", "seg/pq", "seg/cross/nuclei_cpm15/pq"):
                cols = [c for c in view.columns if task in c and "balanced" not in c]
                assert cols and view.loc[enc, cols].notna().all(), (enc, task)
    else:  # a new suite: add its report's table here
        raise AssertionError(f"no row check for suite {path.stem}")
    assert got == want, (got ^ want)
    assert page.rows_per_method.keys() == want


@pytest.mark.parametrize("path", SUITES, ids=lambda p: p.stem)
def test_the_page_renders(smoke, path):
    page = smoke["pages"][path.stem]
    md = smoke["paths"][path.stem].read_text()
    assert md.startswith(f"# {page.paper.title}: results (smoke scale)")
    assert "**Smoke run.**" in md
    for head in ("## How it was run", "## Verdicts", "## Tables and figures",
                 "## Beside the paper"):
        assert head in md, head
    for key in ("command", "git commit", "machine", "wall time", "CPU time"):
        assert f"| {key} |" in md, key
    assert "scarcelab sweep" in page.provenance["command"]
    assert re.search(r"\| CPU time \| \d+m\d\ds", md), "the cells' CPU time was recorded"
    assert "cores" in page.provenance["machine"] and "GPU" in page.provenance["machine"]
    # one verdict row per claim of the paper file, each with a status
    verdict_rows = [ln for ln in md.split("## Verdicts")[1].split("\n## ")[0].splitlines()
                    if ln.startswith("| ") and "**" in ln]
    assert len(verdict_rows) == len(page.paper.claims) == len(page.verdicts)
    assert all(v.status in ("reproduced", "not reproduced", "not testable at this scale")
               for v in page.verdicts)
    # tables present, figures written, linked and small
    assert md.count("\n|") > 10 and "_(no rows)_" not in md.split("## Beside")[0]
    pngs = sorted((smoke["paths"][path.stem].parent / path.stem).glob("*.png"))
    assert pngs, "no figure written"
    for png in pngs:
        assert f"]({path.stem}/{png.name})" in md
        assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size < 100_000, png


def test_the_index_lists_every_suite(smoke):
    text = smoke["index"].read_text()
    for path in SUITES:
        assert f"[{path.stem}]({path.stem}.md)" in text
    assert text.count("finished |") == len(SUITES)
