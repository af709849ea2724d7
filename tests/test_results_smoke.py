"""Every suite's smoke scale through the real sweep driver (embedded Ray, a cell process per
cell, a real sqlite MLflow store), then its results page from that store (issue 24): the
report has a row per method of the suite's reference grid and the page renders — its
provenance, its verdict table, its tables and its figures (small PNGs).

This is the test that keeps a suite from breaking silently: a method that no longer runs,
a view that no longer builds, a page that no longer renders all fail here. Its sweeps cost
~50 cell processes (docs/sweeps.md, "The CI smoke"): conftest.py starts them in the
background when the session collects this module (tests/smoke_runner.py) and runs this
module last, so they use the core the other tests leave idle. The data are the project
machines' real files (../shared/data); without them the module is skipped.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import mlflow
import pytest
import smoke_runner
from conftest import SHARED_DATA

REPO = Path(__file__).resolve().parents[1]
SUITES = smoke_runner.SUITES

pytestmark = pytest.mark.skipif(
    not all((SHARED_DATA / n).exists() for n in smoke_runner.NEEDED),
    reason=f"the suites' real data ({', '.join(smoke_runner.NEEDED)}) are not under "
           f"{SHARED_DATA} (../shared/data is only on the project machines)")


@pytest.fixture(scope="module")
def smoke(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    """Wait for the five smoke sweeps (started by conftest.py at collection, or here), then
    write their pages and the index from their store; returns what the tests read."""
    from scarcelab.tracking.results import build_page, write_index, write_page

    started = getattr(request.config, "_scarcelab_smoke", None)
    if started is None:  # collected some other way: start the sweeps now
        out = tmp_path_factory.mktemp("smoke")
        started = (smoke_runner.start(out, 2, SHARED_DATA), out)
    proc, out = started
    rc = proc.wait(timeout=3600)
    log = (out / "runner.log").read_text() if (out / "runner.log").exists() else ""
    assert rc == 0, (out / "runner.out").read_text()[-5000:] + log[-5000:]
    status = json.loads((out / "status.json").read_text())
    mp = pytest.MonkeyPatch()
    uri = smoke_runner.environment(out, SHARED_DATA)["MLFLOW_TRACKING_URI"]
    mp.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    res = {"status": status, "log": log, "pages": {}, "paths": {}}
    try:
        for path in SUITES:
            if "error" in status.get(path.stem, {"error": "not run"}):
                continue
            page = build_page(path, "smoke")
            res["pages"][path.stem] = page
            res["paths"][path.stem] = write_page(page, out / "pages")
        res["index"] = write_index(list(res["pages"].items()), out / "pages", "smoke")
        print("smoke seconds per suite:", {k: round(v["seconds"]) for k, v in status.items()})
        yield res
    finally:
        mp.undo()


def _methods(path: Path) -> set[str]:
    from scarcelab.tracking.sweep.spec import load_spec

    out = set()
    for c in load_spec(path).cells:  # the *reference* grid's methods (pathology: encoders)
        o = dict(c.options)
        if path.stem == "pathology" and "encoder" not in o:
            continue  # the pre-training cell makes the @pretrain encoder
        out.add(o.get("encoder") or o.get("method") or o.get("strategy"))
    return out


@pytest.mark.parametrize("path", SUITES, ids=lambda p: p.stem)
def test_every_smoke_cell_finishes(smoke, path):
    st = smoke["status"].get(path.stem, {"error": "the runner did not get to it"})
    assert "error" not in st, st["error"]
    assert not st["failed"], "\n".join([str(f) for f in st["failed"]]
                                       + smoke["log"].splitlines()[-40:])
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
    assert want <= page.rows_per_method.keys()


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
