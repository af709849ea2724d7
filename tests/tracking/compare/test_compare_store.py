"""``scarcelab compare`` through the real sweep driver (embedded Ray), a real sqlite MLflow
store and the real report, with stand-in study cells (tests/compare_fake_cell.py: known
scores, no training), so that the report's numbers can be checked exactly against the runs
in the store and an independent computation (scipy, statsmodels):

1. a first invocation in which one study fails: the command exits 1, the report leaves that
   seed out of the paired statistics and names the failed study;
2. the same command again: only the failed study runs (the sweep resumes), the report has
   every seed;
3. ``--report-only``: no study runs, the report is written again, the same numbers.

The e2e with real studies is the smoke's (tests/smoke_runner.py, compare step).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from mlflow.tracking import MlflowClient
from scipy import stats as sps
from statsmodels.stats.multitest import multipletests

REPO = Path(__file__).resolve().parents[3]
SCORES = {"sup": [0.70, 0.72, 0.66], "mixup": [0.72, 0.76, 0.69],
          "fixmatch": [0.80, 0.83, 0.78], "simclr": [0.77, 0.70, 0.81]}
ARGS = ["compare", "--dataset", "synthetic_tiny", "--methods", "sup,mixup,fixmatch,simclr",
        "--seeds", "0,1,2", "--cell-minutes", "0.2", "--min-cell-minutes", "0.1",
        "--retries", "0", "--jobs", "2"]
EXP = "compare-synthetic_tiny"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):  # type: ignore[no-untyped-def]
    """The three invocations, once: (output folder, [CliRunner results], snapshots of the
    store's runs after each)."""
    ray = pytest.importorskip("ray")
    from scarcelab.entrypoints.cli import main
    from scarcelab.tracking.sweep import driver

    tmp = tmp_path_factory.mktemp("compare")
    python = tmp / "python"  # what the driver runs as `python -m scarcelab.entrypoints.cli`
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {REPO / 'tests/compare_fake_cell.py'}"
                      ' "$@"\n')
    python.chmod(0o755)
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    mp = pytest.MonkeyPatch()
    mp.setenv("MLFLOW_TRACKING_URI", uri)
    mp.setenv("PYTHONPATH", str(REPO))
    mp.setenv("OMP_NUM_THREADS", "1")
    mp.setenv("FAKE_COMPARE_SCORES", json.dumps(SCORES))
    mp.setenv("FAKE_COMPARE_VAL_BONUS", "fixmatch:0=0.1")  # val picks seed 0, test seed 1
    fail = tmp / "fail"
    fail.write_text("simclr:2")
    mp.setenv("FAKE_COMPARE_FAIL", str(fail))
    mp.delenv("MLFLOW_RUN_ID", raising=False)
    mp.chdir(tmp)
    init = driver.Driver.__init__

    def fake_python(self, *a, **k):  # type: ignore[no-untyped-def]
        k["python"] = str(python)
        init(self, *a, **k)

    mp.setattr(driver.Driver, "__init__", fake_python)
    mlflow.set_tracking_uri(uri)
    out = tmp / "out"
    results, snaps = [], []
    try:
        for i, extra in enumerate([[], [], ["--report-only"]]):
            if i == 1:  # the failing study now succeeds
                fail.unlink()
            results.append(CliRunner().invoke(main, [*ARGS, "--output", str(out), *extra]))
            snaps.append((_cell_runs(), _report_runs(),
                          pd.read_csv(out / "summary.csv"), (out / "report.md").read_text()))
        yield out, results, snaps
    finally:
        if ray.is_initialized():
            ray.shutdown()
        mp.undo()
        mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI", ""))


def _cell_runs() -> list:  # type: ignore[type-arg]
    c = MlflowClient()
    exp = c.get_experiment_by_name(EXP).experiment_id
    return [r for r in c.search_runs([exp], "tags.`scarcelab.sweep` = 'compare-synthetic_tiny'",
                                     max_results=1000) if "scarcelab.cell" in r.data.tags]


def _report_runs() -> list:  # type: ignore[type-arg]
    c = MlflowClient()
    exp = c.get_experiment_by_name(EXP).experiment_id
    return c.search_runs([exp], "tags.`scarcelab.role` = 'report'", max_results=100)


def _expected(cells: list, seeds: list[int]) -> pd.DataFrame:  # type: ignore[type-arg]
    """The headline numbers recomputed from the store's runs with scipy and statsmodels."""
    score = {(r.data.tags["scarcelab.method"], int(r.data.tags["scarcelab.seed"])):
             r.data.metrics["best/test_balanced_accuracy"]
             for r in cells if r.info.status == "FINISHED"}
    x = {m: np.array([score[(m, s)] for s in seeds]) for m in SCORES}
    means = {m: v.mean() for m, v in x.items()}
    best = max(means, key=means.get)
    base = max(("sup", "mixup"), key=means.get)
    others = [m for m in sorted(means, key=means.get, reverse=True) if m != best]
    p = [sps.ttest_rel(x[best], x[m]).pvalue for m in others]
    adj = dict(zip(others, multipletests(p, method="holm")[1], strict=True))
    rows = []
    for m in x:
        d = x[m] - x[base]
        lo, hi = sps.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=sps.sem(d)) \
            if d.std() > 1e-12 else (d.mean(), d.mean())  # the baseline itself
        rows.append({"method": m, "mean": means[m], "p_holm": adj.get(m, np.nan),
                     "gain": d.mean(), "low": lo, "high": hi, "best": m == best})
    return pd.DataFrame(rows).set_index("method")


def _check_summary(summary: pd.DataFrame, exp: pd.DataFrame) -> None:
    s = summary.set_index("method")
    assert set(s.index) == set(exp.index)
    for m in exp.index:
        assert s.loc[m, "test_balanced_accuracy_mean"] == pytest.approx(exp.loc[m, "mean"])
        assert s.loc[m, "gain"] == pytest.approx(exp.loc[m, "gain"])
        assert s.loc[m, "gain_low"] == pytest.approx(exp.loc[m, "low"])
        assert s.loc[m, "gain_high"] == pytest.approx(exp.loc[m, "high"])
        if exp.loc[m, "best"]:
            assert s.loc[m, "verdict"] == "best"
        else:
            assert s.loc[m, "p_vs_best_holm"] == pytest.approx(exp.loc[m, "p_holm"])
            assert s.loc[m, "verdict"] == ("tied" if exp.loc[m, "p_holm"] >= 0.05 else "worse")


def test_a_failed_study_is_named_and_its_seed_left_out(runs) -> None:  # type: ignore[no-untyped-def]
    out, results, snaps = runs
    r = results[0]
    assert r.exit_code == 1, r.output  # a study failed for good: scripts must notice
    cells, reports, summary, md = snaps[0]
    assert len(cells) == 12 and len(reports) == 1
    assert sum(c.info.status == "FAILED" for c in cells) == 1
    _check_summary(summary, _expected(cells, [0, 1]))
    assert "`simclr` seed 2: FAILED — exit 1: Error: simclr:2 fails on purpose" in md
    assert "seeds 2: left out of the paired statistics" in md
    # its cost is counted although it never finished
    walls = [c.data.metrics["sweep/cell_wall_s"] for c in cells
             if c.data.tags["scarcelab.cell_label"].startswith("self method=simclr")]
    s = summary.set_index("method")
    assert len(walls) == 3 and s.loc["simclr", "failed_attempts"] == 1
    assert s.loc["simclr", "wall_s_total"] == pytest.approx(sum(walls))
    per_seed = pd.read_csv(out / "per_seed.csv")  # (the last invocation's, same rows)
    assert len(per_seed) == 12


def test_the_same_command_resumes_and_answers_on_every_seed(runs) -> None:  # type: ignore[no-untyped-def]
    out, results, snaps = runs
    r = results[1]
    assert r.exit_code == 0, r.output
    assert "11 already finished, 1 to run" in r.output
    cells, reports, summary, md = snaps[1]
    assert len(cells) == 13  # one new attempt, for the failed study only
    finished = [c for c in cells if c.info.status == "FINISHED"]
    assert len(finished) == 12 and len({c.data.tags["scarcelab.cell"] for c in finished}) == 12
    exp = _expected(cells, [0, 1, 2])
    _check_summary(summary, exp)
    assert exp["best"].idxmax() == "fixmatch"
    # the model to deploy: fixmatch's study with the best *validation* score (seed 0)
    win = next(c for c in finished if c.data.tags["scarcelab.method"] == "fixmatch"
               and c.data.tags["scarcelab.seed"] == "0")
    assert f"**Winning model:** `runs:/{win.info.run_id}/model`" in md
    assert "**Best: `fixmatch`**" in md and "over 3 seeds" in md
    # the report run: in the experiment, linked to the sweep run, with every file
    rep = max(reports, key=lambda x: x.info.start_time)
    arts = {a.path for a in MlflowClient().list_artifacts(rep.info.run_id, "report")}
    assert {"report/report.md", "report/summary.csv", "report/per_seed.csv",
            "report/grid.yaml", "report/sweep.yaml"} <= arts
    sweep = MlflowClient().get_run(rep.data.tags["scarcelab.sweep_run"])
    assert sweep.data.tags["scarcelab.role"] == "sweep"
    # the cost counts every attempt: simclr's failed one of the first invocation too
    s = summary.set_index("method")
    walls = [c.data.metrics["sweep/cell_wall_s"] for c in cells
             if c.data.tags["scarcelab.cell_label"].startswith("self method=simclr")]
    assert len(walls) == 4 and s.loc["simclr", "failed_attempts"] == 1
    assert s.loc["simclr", "wall_s_total"] == pytest.approx(sum(walls))
    # the per-seed table is the store's, run by run
    per_seed = pd.read_csv(out / "per_seed.csv")
    for c in finished:
        row = per_seed[per_seed["run_id"] == c.info.run_id].iloc[0]
        assert row["test_balanced_accuracy"] == c.data.metrics["best/test_balanced_accuracy"]
        assert row["split_hash"] == f"split{row['seed']}"
        assert row["wall_s"] == c.data.metrics["sweep/cell_wall_s"]


def test_report_only_runs_nothing_and_gives_the_same_answer(runs) -> None:  # type: ignore[no-untyped-def]
    _, results, snaps = runs
    r = results[2]
    assert r.exit_code == 0, r.output
    cells, reports, summary, _ = snaps[2]
    assert len(cells) == 13 and len(reports) == 3  # no study ran; a new report run
    pd.testing.assert_frame_equal(summary, snaps[1][2])
    assert "[sweep" not in r.output  # the sweep was not started
