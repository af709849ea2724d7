"""Every suite's smoke scale through the real sweep driver (embedded Ray, a cell process per
cell, a real sqlite MLflow store), then its results page from that store: the report has a
row per method run and the page renders — its provenance, its verdict table, its tables and
its figures (small PNGs).

This is the test that keeps a suite from breaking silently: a view that no longer builds, a
page that no longer renders, a cell the driver can no longer run all fail here. Its sweeps
are 20 cell processes, the first two methods of each grid (tests/smoke_runner.py says why;
``SCARCELAB_SMOKE_PER_GRID=all`` runs all 52): conftest.py starts them in the background
when the session collects this module and runs this module last, so they use the core the
other tests leave idle. The data are the project machines' real files (../shared/data);
without them the module is skipped.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import mlflow
import pytest
import smoke_runner
from conftest import SHARED_DATA

REPO = Path(__file__).resolve().parents[3]
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
            page = build_page(path, "smoke", spec=smoke_runner.smoke_spec(path))
            res["pages"][path.stem] = page
            res["paths"][path.stem] = write_page(page, out / "pages")
        res["index"] = write_index(list(res["pages"].items()), out / "pages", "smoke")
        print("smoke seconds per suite:", {k: round(v["seconds"]) for k, v in status.items()})
        yield res
    finally:
        mp.undo()


def _methods(path: Path) -> set[str]:
    out = set()
    for c in smoke_runner.smoke_spec(path).cells:  # the methods run (pathology: encoders)
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
def test_the_report_has_a_row_per_method_run(smoke, path):
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


def test_compare_report_answers_from_the_store(smoke):
    """``scarcelab compare``'s smoke (tests/smoke_runner.py): its headline table and per-seed
    table are the store's studies, its statistics recomputed here (scipy, statsmodels), its
    winning model the best method's study chosen on validation, and the same command run
    again resumes without running a study."""
    check_compare(smoke["status"].get("compare"), smoke_runner, mlflow)


def check_compare(st, runner, mlf) -> None:  # type: ignore[no-untyped-def]
    """The checks of the compare smoke, given its status entry (also run by hand on a
    runner's output folder: docs/compare.md, "Tests")."""
    import numpy as np
    import pandas as pd
    from scipy import stats as sps
    from statsmodels.stats.multitest import multipletests

    assert st is not None and "error" not in st, (st or {}).get("error", "not run")
    first, again = st["first"], st["resume"]
    assert first["rc"] == 0, first["output"][-5000:]
    assert again["rc"] == 0 and "6 already finished, 0 to run" in again["output"], \
        again["output"][-3000:]
    out = Path(st["command"][st["command"].index("--output") + 1])
    per_seed = pd.read_csv(out / "per_seed.csv")
    summary = pd.read_csv(out / "summary.csv").set_index("method")
    md = (out / "report.md").read_text()
    client = mlf.tracking.MlflowClient()
    exp = client.get_experiment_by_name(runner_experiment(st))
    studies = [r for r in client.search_runs([exp.experiment_id],
                                             "tags.`scarcelab.role` = 'study'")
               if "scarcelab.cell" in r.data.tags and r.info.status == "FINISHED"]
    assert len(studies) == 6 and len(per_seed) == 6 and set(per_seed["status"]) == {"FINISHED"}
    score = {(r.data.tags["scarcelab.method"], int(r.data.tags["scarcelab.seed"])): r
             for r in studies}
    for row in per_seed.itertuples():
        run = score[(row.method, row.seed)]
        assert row.run_id == run.info.run_id
        assert row.test_balanced_accuracy == run.data.metrics["best/test_balanced_accuracy"]
        assert row.val_balanced_accuracy == run.data.metrics["best/val_balanced_accuracy"]
        assert row.split_hash == run.data.tags["scarcelab.split_hash"]
    # one split per seed, shared by the methods: the pairing the test relies on
    assert per_seed.groupby("seed")["split_hash"].nunique().eq(1).all()
    x = {m: np.array([score[(m, s)].data.metrics["best/test_balanced_accuracy"]
                      for s in (0, 1)]) for m in ("sup", "fixmatch", "simclr")}
    means = {m: v.mean() for m, v in x.items()}
    best = max(means, key=lambda m: (means[m], summary.loc[m, "val_balanced_accuracy_mean"]))
    assert summary.loc[best, "verdict"] == "best" and summary.loc[best, "rank"] == 1
    others = [m for m in x if m != best]
    p = {m: sps.ttest_rel(x[best], x[m]).pvalue for m in others}
    adj = dict(zip(others, multipletests([p[m] for m in others], method="holm")[1],
                   strict=True))
    for m in x:
        assert summary.loc[m, "test_balanced_accuracy_mean"] == pytest.approx(means[m])
        assert summary.loc[m, "gain"] == pytest.approx(means[m] - means["sup"])
        if m != best and np.isfinite(p[m]):
            assert summary.loc[m, "p_vs_best_holm"] == pytest.approx(adj[m])
        assert f"`{m}`" in md
    fam = {"sup": "supervised", "fixmatch": "semi", "simclr": "self"}
    assert summary["family"].to_dict() == fam
    win = max((r for (m, _), r in score.items() if m == best),
              key=lambda r: (r.data.metrics["best/val_balanced_accuracy"],
                             -int(r.data.tags["scarcelab.seed"])))
    assert f"**Winning model:** `runs:/{win.info.run_id}/model`" in md
    reports = client.search_runs([exp.experiment_id], "tags.`scarcelab.role` = 'report'")
    assert len(reports) == 2  # one per invocation, each with the files
    arts = {a.path for a in client.list_artifacts(reports[0].info.run_id, "report")}
    assert {"report/report.md", "report/summary.csv", "report/per_seed.csv"} <= arts


def runner_experiment(st) -> str:  # type: ignore[no-untyped-def]
    from scarcelab.tracking.compare.grid import sweep_name

    return sweep_name(st["dataset"])
