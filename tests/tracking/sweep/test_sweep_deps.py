"""Dependencies between sweep cells and the grid report, through the real driver, embedded
Ray and a real MLflow sqlite store.

Cells run ``tests/sweep_fake_cell.py`` (the driver's ``python`` is a wrapper that starts it
instead of ``python -m scarcelab.entrypoints.cli``), so a cell costs an MLflow client
import, not a study: it records the argv it received and checks that an
``--encoder runs:/<id>/model`` names a FINISHED run. One module-scoped store is shared: a
first sweep invocation (a dependent waiting within it, a failing dependency), then a second
one of the same sweep without the failing part and with a new dependent (resume); the
report test builds its runs with the client in a store of its own.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from scarcelab import tags as T
from scarcelab.tracking.sweep.driver import Driver
from scarcelab.tracking.sweep.spec import parse_spec

REPO = Path(__file__).resolve().parents[3]

GOOD = """\
name: deps
retries: 0
grids:
  - id: pre
    entry: self
    method: simclr
    seed: [0, 1]
  - entry: probe             # waits within the first invocation for pre seed=0
    encoder: "@pre"
    protocol: finetune
    seed: 0
"""
SPEC = GOOD + """\
  - id: bad
    entry: self
    method: simclr
    seed: 7
    set: {fail: 1}           # the stand-in cell fails on this
  - id: seg
    entry: segment
    encoder: "@bad"
  - entry: probe             # depends on a cell that depends on the failing one
    encoder: "@seg"
    seed: 3
"""
# the second invocation: a linear probe on an encoder finished in the first one
SPEC2 = GOOD + """\
  - entry: probe
    encoder: "@pre"
    protocol: linear
    seed: 1
"""


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):  # type: ignore[no-untyped-def]
    """Both invocations, run once: (uri, [result 1, result 2], [spec 1, spec 2])."""
    ray = pytest.importorskip("ray")
    tmp = tmp_path_factory.mktemp("sweepdeps")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    python = tmp / "python"  # what the driver runs as `python -m scarcelab.entrypoints.cli`
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {REPO / 'tests/sweep_fake_cell.py'} "
                      '"$@"\n')
    python.chmod(0o755)
    mp = pytest.MonkeyPatch()
    mp.setenv("MLFLOW_TRACKING_URI", uri)
    mp.setenv("PYTHONPATH", str(REPO))
    mp.setenv("OMP_NUM_THREADS", "1")
    mp.delenv("MLFLOW_RUN_ID", raising=False)
    mlflow.set_tracking_uri(uri)
    lines: list[str] = []
    try:
        specs = [parse_spec(SPEC, "s1.yaml"), parse_spec(SPEC2, "s2.yaml")]
        results = [Driver(sp, jobs=2, echo=lines.append, cwd=str(tmp),
                          python=str(python)).run() for sp in specs]
        yield uri, results, specs, lines
    finally:
        if ray.is_initialized():
            ray.shutdown()
        mp.undo()
        mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI", ""))


@pytest.fixture
def store(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    mlflow.set_tracking_uri(uri)
    yield uri
    mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI", ""))


def _runs_by_cell(spec):  # type: ignore[no-untyped-def]
    c = MlflowClient()
    exp = c.get_experiment_by_name(spec.experiment).experiment_id
    out: dict[str, list] = {}
    for r in c.search_runs([exp], "tags.`scarcelab.sweep` = 'deps'", max_results=1000):
        if T.CELL in r.data.tags:
            out.setdefault(r.data.tags[T.CELL], []).append(r)
    return out


def test_dependents_get_the_finished_run_and_fail_with_their_dependency(sweeps):
    _, (res, _), _, lines = sweeps
    by = {o.cell.label: o for o in res.outcomes}
    pre0 = by["self method=simclr seed=0"]
    assert pre0.status == "FINISHED"
    # the dependent waited for pre seed=0 and got its cell run as the encoder
    fin = by["probe encoder=@pre protocol=finetune seed=0"]
    assert fin.status == "FINISHED", fin.error
    run = MlflowClient().get_run(fin.run_id)
    want = f"runs:/{pre0.run_id}/model"
    assert f"--encoder {want}" in run.data.params["cell_argv"]
    assert json.loads(run.data.tags[T.SWEEP_REFS]) == {"encoder": ["@pre", want]}
    # the failing dependency fails its dependents (transitively) without starting them
    assert by["self method=simclr seed=7 set=fail=1"].status == "FAILED"
    seg, chained = by["segment encoder=@bad"], by["probe encoder=@seg seed=3"]
    assert seg.status == chained.status == "FAILED" and seg.attempts == 0
    assert "dependency encoder=@bad (cell 'self method=simclr seed=7 set=fail=1') failed" \
        in seg.error and "fails on purpose" in seg.error
    assert "dependency encoder=@seg (cell 'segment encoder=@bad') failed" in chained.error
    rec = MlflowClient().get_run(seg.run_id)  # recorded in MLflow, never started
    assert rec.info.status == "FAILED" and "cell_argv" not in rec.data.params
    assert "dependency encoder=@bad" in rec.data.tags["scarcelab.error"]
    # ... while the rest of the grid finished
    assert res.count("FINISHED") == 3 and res.count("FAILED") == 3
    assert any("not run, dependency" in ln for ln in lines)


def test_resume_resolves_dependencies_finished_by_an_earlier_invocation(sweeps):
    _, (res1, res2), (_, spec2), _ = sweeps
    first = {o.cell.id: o for o in res1.outcomes}
    by = {o.cell.label: o for o in res2.outcomes}
    runs = _runs_by_cell(spec2)
    for seed in (0, 1):
        pre = by[f"self method=simclr seed={seed}"]
        assert pre.status == "SKIPPED" and pre.run_id == first[pre.cell.id].run_id
        assert len(runs[pre.cell.id]) == 1  # never run twice
    # a new dependent of the skipped pre seed=1 cell gets that cell's earlier run
    lin = by["probe encoder=@pre protocol=linear seed=1"]
    assert lin.status == "FINISHED", lin.error
    argv = MlflowClient().get_run(lin.run_id).data.params["cell_argv"]
    assert f"--encoder runs:/{by['self method=simclr seed=1'].run_id}/model" in argv
    # the dependent finished in the first invocation is skipped too
    assert by["probe encoder=@pre protocol=finetune seed=0"].status == "SKIPPED"
    assert res2.count("FINISHED") == 1 and res2.count("SKIPPED") == 3
    # the sweep run is the first invocation's, reused; it ends FINISHED now nothing failed
    assert res2.sweep_run_id == res1.sweep_run_id
    assert MlflowClient().get_run(res2.sweep_run_id).info.status == "FINISHED"


def _tune_runs(c: MlflowClient, exp: str, sweep: str) -> None:
    """Two tune studies as the tune protocol tags them: 3 retrains each, test score on
    the retrains (the studies have none of their own)."""
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

    scores = {"ce": [0.50, 0.52, 0.54], "ole": [0.30, 0.31, 0.32]}
    for m, vals in scores.items():
        tags = {"scarcelab.role": "study", "scarcelab.protocol": "tune",
                "scarcelab.method": m, "scarcelab.dataset": "cifair10",
                "scarcelab.family": "supervised"}
        study = c.create_run(exp, tags={**tags, "scarcelab.sweep": sweep}).info.run_id
        for i, v in enumerate(vals):
            r = c.create_run(exp, tags={**tags, "scarcelab.role": "retrain",
                                        "scarcelab.retrain": str(i),
                                        MLFLOW_PARENT_RUN_ID: study}).info.run_id
            c.log_metric(r, "test/balanced_accuracy", v)
            c.set_terminated(r, "FINISHED")
        c.set_terminated(study, "FINISHED")


def test_report_adds_table3_and_transfer_and_survives_a_broken_part(store, monkeypatch,
                                                                     tmp_path):
    """Tune and probe/segment cells: report/table3.* and report/transfer.* on the sweep
    run, built from runs made here with the client as the entry points tag them."""
    spec = parse_spec("""\
name: rep
grids:
  - {id: pre, entry: self, method: simclr}
  - {entry: tune, method: [ce, ole], dataset: cifair10}
  - {entry: probe, encoder: [random, "@pre"], seed: [0, 1]}
  - {entry: segment, encoder: random, cross_test: nuclei_cpm15}
""", "rep.yaml")
    c = MlflowClient()
    exp = c.create_experiment("rep")
    sweep = c.create_run(exp, tags={"scarcelab.role": "sweep", "scarcelab.sweep": "rep"})
    _tune_runs(c, exp, "rep")
    pre = {s: c.create_run(exp).info.run_id for s in (0, 1)}  # two pre-trained encoders
    acc = {("random", 0): 0.5, ("random", 1): 0.6, ("@pre", 0): 0.7, ("@pre", 1): 0.9}
    for (enc, s), v in acc.items():
        value = "random" if enc == "random" else f"runs:/{pre[s]}/model"
        tags = {"scarcelab.sweep": "rep", "scarcelab.task": "probe",
                "scarcelab.protocol": "linear", "scarcelab.encoder": value,
                "scarcelab.dataset": "pathology_crops", "scarcelab.seed": str(s)}
        if enc != "random":
            tags[T.SWEEP_REFS] = json.dumps({"encoder": [enc, value]})
        r = c.create_run(exp, tags=tags).info.run_id
        c.log_metric(r, "test/accuracy", v)
        c.set_terminated(r, "FINISHED")

    seg = c.create_run(exp, tags={"scarcelab.sweep": "rep", "scarcelab.role": "study",
                                  "scarcelab.family": "segment", "scarcelab.encoder": "random",
                                  "scarcelab.dataset": "consep_patches"}).info.run_id
    c.log_metric(seg, "seg/pq", 0.25)
    c.log_metric(seg, "seg/cross/nuclei_cpm15/pq", 0.125)
    c.set_terminated(seg, "FINISHED")

    lines: list[str] = []

    def broken(self, sweep_run, t):  # type: ignore[no-untyped-def]
        raise RuntimeError("leaderboard broke")

    monkeypatch.setattr(Driver, "_report_views", broken)
    drv = Driver(spec, echo=lines.append)
    assert drv._log_report(sweep.info.run_id)
    assert any("report's leaderboard part could not be built: RuntimeError" in ln
               for ln in lines)
    arts = {a.path for a in c.list_artifacts(sweep.info.run_id, "report")}
    assert {"report/table3.md", "report/table3.csv", "report/transfer.md",
            "report/transfer.csv"} <= arts
    assert "report/contamination.md" not in arts  # no contamination cells
    md = Path(c.download_artifacts(sweep.info.run_id, "report/table3.md", str(tmp_path)))
    text = md.read_text()
    assert "| ce | **52.00 ± 2.00** |" in text and "| ole | 31.00 ± 1.00 |" in text
    tr = Path(c.download_artifacts(sweep.info.run_id, "report/transfer.csv", str(tmp_path)))
    import pandas as pd

    view = pd.read_csv(tr, keep_default_na=False).set_index(["encoder", "protocol"])
    # the resolved encoders of both seeds are one row, named by the spec's reference
    assert set(view.index) == {("random", "linear"), ("@pre", "linear"),
                               ("random", "finetune")}  # the segment run: its own row
    assert float(view.loc[("@pre", "linear"), "pathology_crops accuracy"]) == \
        pytest.approx(0.8)
    assert float(view.loc[("random", "linear"), "pathology_crops accuracy"]) == \
        pytest.approx(0.55)
    assert int(view.loc[("@pre", "linear"), "n_runs"]) == 2
    seg = view.loc[("random", "finetune")]
    assert float(seg["consep_patches seg/pq"]) == pytest.approx(0.25)
    assert float(seg["consep_patches seg/cross/nuclei_cpm15/pq"]) == pytest.approx(0.125)


def test_a_tune_only_grid_gets_table3_without_a_broken_leaderboard(store, tmp_path):
    """Tune studies have no study-level test score, which the leaderboard and ranks need:
    they are left to Table 3 instead of failing the generic part."""
    spec = parse_spec("name: tonly\ngrids:\n  - {entry: tune, method: [ce, ole]}\n", "t.yaml")
    c = MlflowClient()
    exp = c.create_experiment("tonly")
    sweep = c.create_run(exp, tags={"scarcelab.role": "sweep", "scarcelab.sweep": "tonly"})
    _tune_runs(c, exp, "tonly")
    lines: list[str] = []
    assert Driver(spec, echo=lines.append)._log_report(sweep.info.run_id)
    assert not [ln for ln in lines if "could not be built" in ln], lines
    assert any("their leaderboard is report/table3.md" in ln for ln in lines)
    arts = {a.path for a in c.list_artifacts(sweep.info.run_id, "report")}
    assert {"report/table3.md", "report/table3.csv"} <= arts
