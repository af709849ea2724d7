"""The query layer on a real sqlite MLflow store populated with hand-designed runs.

Every expected value below is computed from the run *specification* with plain loops,
independently of the pandas code under test: the selection rule (first strict maximum of
validation in time order), means / sample stds, gains, Welch's t-test from its formula,
the profile's best-so-far, the rank averages.
"""

from __future__ import annotations

import math
import re
import shutil
import statistics
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from matplotlib.collections import PolyCollection
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient
from scipy import stats as sps

from scarcelab import tags as T
from scarcelab.tracking import query
from scarcelab.tracking.query import render, views
from scarcelab.tracking.query.store import ApiReader, SqlReader, open_reader
from scarcelab.tracking.query.table3 import retrain_scores

T0 = 1_700_000_000_000  # ms; all timestamps derive from the spec, so the store is fixed


@dataclass
class StudySpec:
    exp: str
    dataset: str
    method: str
    family: str
    seed: int
    n_labeled: int = 40
    # trials -> epochs -> (val, test_bacc, test_acc, elapsed_s)
    trials: list[list[tuple[float, float, float, float]]] = field(default_factory=list)
    status: str = "FINISHED"
    series: str = "best"  # study-level best/* series: "best" (search), "last" (transfer), ""
    trial_status: tuple[str, ...] = ()


FAMILY = {"sup": "supervised", "mixup": "supervised", "fixmatch": "semi", "simclr": "self"}
OFFSET = {"sup": 0.0, "mixup": 0.03, "fixmatch": 0.08, "simclr": 0.05}


def _random_trials(rng: np.random.Generator, method: str, n_trials: int = 2,
                   n_epochs: int = 4) -> list[list[tuple[float, float, float, float]]]:
    trials, t = [], 0.0
    for _ in range(n_trials):
        epochs = []
        for _ in range(n_epochs):
            t += 10.0
            val = round(float(rng.uniform(0.4, 0.8)), 1)  # coarse: ties across trials
            test = round(val * 0.9 + OFFSET[method] + float(rng.normal(0, 0.02)), 3)
            epochs.append((val, test, round(test + 0.05, 3), t))
        trials.append(epochs)
        t += 5.0  # set-up time between trials
    return trials


def make_specs() -> list[StudySpec]:
    rng = np.random.default_rng(7)
    specs = []
    for exp, ds in (("qa", "dA"), ("qb", "dB")):
        for method in ("sup", "mixup", "fixmatch", "simclr"):
            seeds = (0, 1) if (ds, method) == ("dB", "mixup") else (0, 1, 2)
            for seed in seeds:
                specs.append(StudySpec(exp, ds, method, FAMILY[method], seed,
                                       trials=_random_trials(rng, method)))
    # another label budget on dA: must never be averaged with n_labeled=40
    specs.append(StudySpec("qa", "dA", "sup", "supervised", 0, n_labeled=80,
                           trials=_random_trials(rng, "sup")))
    # a failed study with a great score: left out unless include_failed
    specs.append(StudySpec("qa", "dA", "sup", "supervised", 9, status="FAILED",
                           trials=[[(0.99, 0.99, 0.99, 10.0)]]))
    # hand-written dataset dH: literal expectations in test_hand_written_selection
    specs.append(StudySpec(  # trials only: the record is recomputed from the trials
        "qa", "dH", "sup", "supervised", 0, series="",
        trials=[[(0.5, 0.50, 0.55, 10.0), (0.7, 0.60, 0.65, 20.0), (math.nan, 0.1, 0.1, 30.0)],
                [(0.7, 0.90, 0.95, 45.0), (0.8, 0.65, 0.70, 55.0)],  # 0.7 tie: first wins
                [(0.6, 0.99, 0.99, 70.0)]],
        trial_status=("FINISHED", "FAILED", "FINISHED")))  # a failed trial's epochs count
    specs.append(StudySpec(  # transfer: the study series keeps the *last* epoch
        "qa", "dH", "fixmatch", "semi", 0, series="last",
        trials=[[(0.9, 0.70, 0.75, 10.0), (0.6, 0.72, 0.77, 20.0)]]))
    # dT: test *falls* each time validation improves, down to the final val-best checkpoint,
    # and a validation tie carries the best test of all: a record or selection that follows
    # test anywhere (or lets a later tie win) cannot pass test_record_follows_validation
    specs.append(StudySpec(
        "qa", "dT", "sup", "supervised", 0,
        trials=[[(0.5, 0.80, 0.85, 10.0), (0.6, 0.70, 0.75, 20.0)],
                [(0.6, 0.95, 0.97, 35.0), (0.7, 0.55, 0.60, 45.0), (0.65, 0.90, 0.92, 55.0)]]))
    return specs


@dataclass
class ALSpec:
    exp: str
    dataset: str
    strategy: str
    query_size: int
    repetition: int
    auc: float


def make_al_specs() -> list[ALSpec]:
    base = {"random": 0.60, "margin": 0.66, "badge": 0.64}
    out = []
    rng = np.random.default_rng(3)
    for ds in ("dA", "dB"):
        for q in (1, 10):
            for rep in (0, 1):
                for s, b in base.items():
                    out.append(ALSpec("qa", ds, s, q, rep,
                                      round(b + float(rng.normal(0, 0.03)), 3)))
    return out


# -- independent expectations ----------------------------------------------------------
def checkpoints(spec: StudySpec) -> list[tuple[float, float, float, float]]:
    """Every evaluated checkpoint, in time order, NaN validation dropped."""
    out = [e for trial in spec.trials for e in trial if not math.isnan(e[0])]
    return sorted(out, key=lambda e: e[3])


def chosen(spec: StudySpec, until: float = math.inf, rule: str | None = None):
    best = None
    for e in checkpoints(spec):
        if e[3] > until:
            break
        if (rule or spec.series) == "last" or best is None or e[0] > best[0]:
            best = e
    return best


def counted(specs: list[StudySpec]) -> list[StudySpec]:
    return [s for s in specs if s.status == "FINISHED"]


def expected_leaderboard(specs: list[StudySpec]) -> dict[tuple, dict[str, float]]:
    groups: dict[tuple, list] = {}
    for s in counted(specs):
        groups.setdefault((s.dataset, s.n_labeled, s.method), []).append(chosen(s))
    out = {}
    for k, sel in groups.items():
        tests = [c[1] for c in sel]
        out[k] = {"n": len(sel), "val_mean": statistics.mean(c[0] for c in sel),
                  "test_mean": statistics.mean(tests),
                  "test_std": statistics.stdev(tests) if len(tests) > 1 else math.nan,
                  "acc_mean": statistics.mean(c[2] for c in sel)}
    return out


# -- store ---------------------------------------------------------------------------
def _log_study(c: MlflowClient, exp_ids: dict[str, str], s: StudySpec, start: int) -> str:
    tags = {"scarcelab.role": "study", "scarcelab.family": s.family,
            "scarcelab.method": s.method, "scarcelab.dataset": s.dataset,
            "scarcelab.seed": str(s.seed)}
    run = c.create_run(exp_ids[s.exp], start_time=start, tags=tags,
                       run_name=f"{s.method}-{s.dataset}-s{s.seed}")
    sid = run.info.run_id
    # as under `mlflow run`: the raw param plus the resolved value
    c.log_batch(sid, params=[mlflow.entities.Param("n_labeled", "default"),
                             mlflow.entities.Param("resolved.n_labeled", str(s.n_labeled)),
                             mlflow.entities.Param("budget_minutes", "3")])
    study_metrics, best = [], None
    g = 0
    for i, trial in enumerate(s.trials):
        tr = c.create_run(exp_ids[s.exp], start_time=start + 1 + i, run_name=f"trial-{i}",
                          tags={**tags, "scarcelab.role": "trial", "scarcelab.trial": str(i),
                                "mlflow.parentRunId": sid})
        ms = []
        for ep, (val, test, acc, el) in enumerate(trial):
            ts = T0 + int(el * 1000)
            ms += [Metric("val/balanced_accuracy", val, ts, ep),
                   Metric("test/balanced_accuracy", test, ts, ep),
                   Metric("test/accuracy", acc, ts, ep), Metric("time/elapsed_s", el, ts, ep),
                   Metric("train/loss", 1.0 / (ep + 1), ts, ep)]
            if not math.isnan(val) and (s.series == "last" or best is None or val > best[0]):
                best = (val, test, acc)
            if s.series and best is not None:
                study_metrics += [Metric("best/val_balanced_accuracy", best[0], ts, g),
                                  Metric("best/test_balanced_accuracy", best[1], ts, g),
                                  Metric("best/test_accuracy", best[2], ts, g),
                                  Metric("time/elapsed_s", el, ts, g)]
            g += 1
        c.log_batch(tr.info.run_id, metrics=ms)
        st = s.trial_status[i] if s.trial_status else "FINISHED"
        c.set_terminated(tr.info.run_id, st, end_time=start + 100)
    if study_metrics:
        c.log_batch(sid, metrics=study_metrics)
    c.set_terminated(sid, s.status, end_time=start + 200)
    return sid


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    # sqlite on tmpfs when there is one: MLflow commits every call, and fsync dominates
    shm = Path("/dev/shm")
    root = Path(tempfile.mkdtemp(prefix="scarcelab-query-", dir=shm)) if shm.is_dir() \
        else tmp_path_factory.mktemp("querystore")
    uri = f"sqlite:///{root}/mlflow.db"
    c = MlflowClient(tracking_uri=uri)
    exp_ids = {e: c.create_experiment(e, artifact_location=str(root / "artifacts" / e))
               for e in ("qa", "qb", "other")}
    specs, al = make_specs(), make_al_specs()
    for i, s in enumerate(specs):
        _log_study(c, exp_ids, s, T0 + 1000 * i)
    for a in al:
        r = c.create_run(exp_ids[a.exp], tags={
            "scarcelab.role": "al", "scarcelab.family": "active", "scarcelab.dataset": a.dataset,
            "scarcelab.strategy": a.strategy, "scarcelab.query_size": str(a.query_size),
            "scarcelab.repetition": str(a.repetition)})
        c.log_batch(r.info.run_id, metrics=[Metric("al/auc", a.auc, T0, 0)])
        c.set_terminated(r.info.run_id, "FINISHED")
    # noise that must not leak in: another experiment, a report run, a deleted study
    junk = StudySpec("other", "dA", "sup", "supervised", 0, trials=[[(1.0, 1.0, 1.0, 1.0)]])
    _log_study(c, exp_ids, junk, T0)
    rep = c.create_run(exp_ids["qa"], tags={"scarcelab.role": "report"})
    c.set_terminated(rep.info.run_id)
    gone = _log_study(c, exp_ids, StudySpec("qa", "dA", "sup", "supervised", 5,
                                            trials=[[(1.0, 1.0, 1.0, 1.0)]]), T0)
    c.delete_run(gone)  # its trial stays: an orphan whose study is not counted
    yield {"uri": uri, "specs": specs, "al": al, "root": root}
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def tracked(store):
    return query.load("qa,qb", store["uri"])


# -- tests ---------------------------------------------------------------------------
def test_tidy_frame(store, tracked):
    runs = tracked.runs
    specs = store["specs"]
    n_trials = sum(len(s.trials) for s in specs)
    # + the report run and the deleted study's orphan trial
    assert len(runs) == len(specs) + n_trials + len(store["al"]) + 2
    assert set(runs["experiment"]) == {"qa", "qb"}
    assert runs["role"].value_counts().to_dict() == {
        "trial": n_trials + 1, "study": len(specs), "al": len(store["al"]), "report": 1}
    study = runs[(runs.role == "study") & (runs.dataset == "dA") & (runs.n_labeled == 80)]
    assert len(study) == 1 and study.iloc[0]["params.n_labeled"] == "default"
    assert study.iloc[0]["budget_minutes"] == 3 and study.iloc[0]["seed"] == 0
    trials = runs[runs.parent_run_id == study.iloc[0]["run_id"]]
    assert len(trials) == 2 and set(trials.role) == {"trial"}
    assert {"metrics.val/balanced_accuracy", "metrics.best/test_balanced_accuracy",
            "tags.mlflow.parentRunId"} <= set(runs.columns)
    assert len(tracked.studies()) == len(counted(specs))
    with pytest.raises(ValueError, match="no MLflow experiment named 'nope'"):
        query.load("qa,nope", store["uri"])


def test_hand_written_selection(tracked):
    sel = views.per_study(tracked, dataset="dH").set_index("method")
    # sup: 0.5 -> 0.7 at 20 s (test .60); the 0.7 tie at 45 s loses; 0.8 at 55 s wins
    assert sel.loc["sup", "val_balanced_accuracy"] == 0.8
    assert sel.loc["sup", "test_balanced_accuracy"] == 0.65
    assert sel.loc["sup", "test_accuracy"] == 0.70
    assert sel.loc["sup", "elapsed_s"] == 55.0 and sel.loc["sup", "source"] == "trial"
    # transfer study: its own series says the last epoch, and that is what is reported
    assert sel.loc["fixmatch", "test_balanced_accuracy"] == 0.72
    assert sel.loc["fixmatch", "source"] == "study"
    rec = tracked.record().set_index("study_id")
    sup_id = sel.loc["sup", "study_id"]
    assert list(rec.loc[sup_id, "val_balanced_accuracy"]) == [0.5, 0.7, 0.8]
    # recomputed from trials, the transfer study gets the best-on-validation epoch instead
    trials = views.per_study(tracked, source="trials", dataset="dH").set_index("method")
    assert trials.loc["fixmatch", "test_balanced_accuracy"] == 0.70


@pytest.mark.parametrize("source", ["study", "trials"])
def test_record_follows_validation_when_test_falls(tracked, source):
    rec = tracked.record(source)
    sel = views.per_study(tracked, source=source, dataset="dT")
    rec = rec[rec["study_id"] == sel.iloc[0]["study_id"]]
    # one row per change of the answer (the study's series or the trials' improvements)
    assert list(rec["val_balanced_accuracy"]) == [0.5, 0.6, 0.7]
    assert list(rec["test_balanced_accuracy"]) == [0.80, 0.70, 0.55]
    assert list(rec["elapsed_s"]) == [10.0, 20.0, 45.0]
    assert sel.iloc[0]["test_balanced_accuracy"] == 0.55  # the final val-best checkpoint
    assert sel.iloc[0]["test_accuracy"] == 0.60


def test_record_sources_agree(store, tracked):
    """The study series and the trial histories give the same choice (search rule)."""
    a = views.per_study(tracked, source="study").set_index("study_id")
    b = views.per_study(tracked, source="trials").set_index("study_id")
    assert len(a) == len([s for s in counted(store["specs"]) if s.series])
    assert len(b) == len(counted(store["specs"]))
    transfer = (a.dataset == "dH") & (a.method == "fixmatch")  # the one "last" series
    both = a.index[~transfer.to_numpy()]
    cols = ["val_balanced_accuracy", "test_balanced_accuracy", "test_accuracy"]
    pd.testing.assert_frame_equal(a.loc[both, cols], b.loc[both, cols])
    # the study series' record ends where the trials' record ends, at the same time
    ra = tracked.record("study").groupby("study_id").tail(1).set_index("study_id")
    rb = tracked.record("trials").groupby("study_id").tail(1).set_index("study_id")
    pd.testing.assert_frame_equal(ra.loc[both, [*cols, "elapsed_s", "end_s"]],
                                  rb.loc[both, [*cols, "elapsed_s", "end_s"]])


def test_leaderboard_equals_hand_computation(store, tracked):
    lb = query.leaderboard(tracked)
    exp = expected_leaderboard(store["specs"])
    assert len(lb) == len(exp)
    for row in lb.itertuples():
        e = exp[(row.dataset, row.n_labeled, row.method)]
        assert row.n == e["n"]
        assert row.val_balanced_accuracy_mean == pytest.approx(e["val_mean"])
        assert row.test_balanced_accuracy_mean == pytest.approx(e["test_mean"])
        assert row.test_accuracy_mean == pytest.approx(e["acc_mean"])
        if math.isnan(e["test_std"]):
            assert math.isnan(row.test_balanced_accuracy_std)
        else:
            assert row.test_balanced_accuracy_std == pytest.approx(e["test_std"])
        assert row.family == FAMILY[row.method]
    # sorted best-first within each (dataset, budget) block
    for _, part in lb.groupby(["dataset", "n_labeled"]):
        assert part.test_balanced_accuracy_mean.is_monotonic_decreasing
    by_auc = query.leaderboard(tracked, sort_by="test_accuracy_mean", ascending=True)
    for _, part in by_auc.groupby(["dataset", "n_labeled"]):
        assert part.test_accuracy_mean.is_monotonic_increasing
    with pytest.raises(ValueError, match="cannot sort by 'nope'"):
        query.leaderboard(tracked, sort_by="nope")


def test_leaderboard_filters(store, tracked):
    semi = query.leaderboard(tracked, family="semi")
    assert set(semi.method) == {"fixmatch"} and set(semi.dataset) == {"dA", "dB", "dH"}
    one = query.leaderboard(tracked, dataset="dA", n_labeled=80)
    assert list(one.method) == ["sup"] and one.n.tolist() == [1]
    both = query.leaderboard(tracked, dataset=["dA", "dB"], family="supervised,self")
    assert set(both.method) == {"sup", "mixup", "simclr"}
    assert set(both.dataset) == {"dA", "dB"}
    assert query.leaderboard(tracked, budget_minutes=99).empty
    # a failed study only counts on request
    full = query.load("qa", store["uri"], include_failed=True)
    lb = query.leaderboard(full, dataset="dA", n_labeled=40, method="sup")
    assert lb.n.tolist() == [4]
    # one experiment only
    assert set(query.leaderboard(query.load("qb", store["uri"])).dataset) == {"dB"}


def test_gains_equal_hand_computation(store, tracked):
    g = query.gains(tracked, n_labeled=40).set_index("method")
    exp = expected_leaderboard(store["specs"])
    blocks = {}
    for (ds, nl, m), v in exp.items():
        if nl == 40:
            blocks.setdefault(ds, {})[m] = v["test_mean"]
    for ds, means in blocks.items():
        ref = max(v for m, v in means.items() if m in ("sup", "mixup", "supcon"))
        for m, v in means.items():
            assert g.loc[m, ds] == pytest.approx(v - ref)
    for m in g.index:
        gains_m = [blocks[ds][m] - max(v for k, v in blocks[ds].items() if k in ("sup", "mixup"))
                   for ds in blocks if m in blocks[ds]]
        assert g.loc[m, "median_gain"] == pytest.approx(statistics.median(gains_m))
        assert g.loc[m, "worst_gain"] == pytest.approx(min(gains_m))
    assert g["median_gain"].is_monotonic_decreasing
    # a block without a labeled-only method is left out, with a warning
    with pytest.warns(UserWarning, match="no labeled-only method"):
        only_semi = query.gains(tracked, family="semi")
    assert only_semi.empty
    # two budgets of dA become two columns
    g2 = query.gains(tracked, dataset="dA")
    assert {"dA (n=40)", "dA (n=80)"} <= set(g2.columns)


def welch_p(x: list[float], y: list[float]) -> float:
    vx, vy = statistics.variance(x) / len(x), statistics.variance(y) / len(y)
    t = (statistics.mean(x) - statistics.mean(y)) / math.sqrt(vx + vy)
    df = (vx + vy) ** 2 / (vx**2 / (len(x) - 1) + vy**2 / (len(y) - 1))
    return 2 * sps.t.sf(abs(t), df)


def test_significance_equals_welch_formula(store, tracked):
    sig = query.significance(tracked, n_labeled=40)
    per: dict[str, dict[str, list[float]]] = {}
    for s in counted(store["specs"]):
        if s.n_labeled == 40:
            per.setdefault(s.dataset, {}).setdefault(s.method, []).append(chosen(s)[1])
    checked = 0
    for ds, methods in per.items():
        best = max(methods, key=lambda m: statistics.mean(methods[m]))
        rows = sig[sig.dataset == ds].set_index("method")
        assert set(rows.best_method) == {best}
        for m, vals in methods.items():
            assert rows.loc[m, "mean"] == pytest.approx(statistics.mean(vals))
            if m == best or len(vals) < 2 or len(methods[best]) < 2:
                assert math.isnan(rows.loc[m, "p_value"])
                continue
            p = welch_p(vals, methods[best])
            assert rows.loc[m, "p_value"] == pytest.approx(p)
            assert rows.loc[m, "significantly_worse"] == (p < 0.05)
            checked += 1
    assert checked >= 6 and sig.significantly_worse.any()


def test_profile_equals_best_so_far(store, tracked):
    grid = [0.0, 5.0, 10.0, 25.0, 44.0, 60.0, 95.0]
    prof = query.profile(tracked, grid=grid, n_labeled=40)
    groups: dict[tuple, list[StudySpec]] = {}
    for s in counted(store["specs"]):
        if s.n_labeled == 40:
            groups.setdefault((s.dataset, s.method), []).append(s)
    for (ds, m), studies in groups.items():
        part = prof[(prof.dataset == ds) & (prof.method == m)].set_index("t_s")
        assert list(part.index) == grid and set(part.n) == {len(studies)}
        for t in grid:
            picks = [chosen(s, until=t) for s in studies]
            if any(p is None for p in picks):
                assert math.isnan(part.loc[t, "test_balanced_accuracy_mean"])
                continue
            tests, vals = [p[1] for p in picks], [p[0] for p in picks]
            assert part.loc[t, "test_balanced_accuracy_mean"] == pytest.approx(
                statistics.mean(tests))
            assert part.loc[t, "test_balanced_accuracy_min"] == pytest.approx(min(tests))
            assert part.loc[t, "test_balanced_accuracy_max"] == pytest.approx(max(tests))
            assert part.loc[t, "val_balanced_accuracy_mean"] == pytest.approx(
                statistics.mean(vals))
        if all(s.series != "last" for s in studies):  # transfer keeps the latest epoch
            assert part["val_balanced_accuracy_mean"].dropna().is_monotonic_increasing
    # default grid: from 0 to the block's last checkpoint
    auto = query.profile(tracked, n_points=5, dataset="dA", n_labeled=40)
    last = max(checkpoints(s)[-1][3] for s in groups[("dA", "sup")])
    assert sorted(set(auto.t_s)) == pytest.approx(list(np.linspace(0, last, 5)))


def _ranks_by_hand(table: dict[str, dict[str, float]]) -> dict[str, float]:
    """table: problem -> method -> score; rank 1 = best, ties share the mean rank."""
    total: dict[str, float] = {}
    for scores in table.values():
        for m, v in scores.items():
            higher = sum(1 for w in scores.values() if w > v)
            equal = sum(1 for w in scores.values() if w == v)
            total[m] = total.get(m, 0.0) + higher + (equal + 1) / 2
    return {m: r / len(table) for m, r in total.items()}


def test_ranks_study_and_al(store, tracked):
    r = query.ranks(tracked, n_labeled=40, dataset="dA,dB")
    study = r[r.scope == "study"].set_index("method")
    exp = expected_leaderboard(store["specs"])
    table = {}
    for (ds, nl, m), v in exp.items():
        if nl == 40 and ds in ("dA", "dB"):
            table.setdefault(ds, {})[m] = v["test_mean"]
    for m, avg in _ranks_by_hand(table).items():
        assert study.loc[m, "average_rank"] == pytest.approx(avg)
    al = r[r.scope == "al"].set_index("method")
    # CDALBench's blocks: every (dataset, query size, repetition) is ranked on its own
    al_table: dict[str, dict[str, float]] = {}
    for a in store["al"]:
        al_table.setdefault(f"{a.dataset}/{a.query_size}/{a.repetition}", {})[a.strategy] = a.auc
    hand = _ranks_by_hand(al_table)
    assert set(al.index) == set(hand) and set(al.n_problems) == {8}
    for s, avg in hand.items():
        assert al.loc[s, "average_rank"] == pytest.approx(avg)
    assert list(al.average_rank) == sorted(al.average_rank)
    per_rep = query.al_scores(tracked, per_repetition=True)
    assert len(per_rep) == 8 and list(per_rep.columns) == sorted(hand)


def test_api_reader_matches_sql_reader(store, tracked):
    api = query.load(["qa", "qb"], store["uri"], reader="api")
    assert isinstance(api.reader, query.ApiReader)
    assert isinstance(tracked.reader, query.SqlReader)
    a = query.leaderboard(api)
    b = query.leaderboard(tracked)
    pd.testing.assert_frame_equal(a, b)
    pa = query.profile(api, n_points=7, source="trials")
    pb = query.profile(tracked, n_points=7, source="trials")
    pd.testing.assert_frame_equal(pa, pb)


def test_cli_csv_on_stdout(store, tracked):
    from scarcelab.entrypoints.cli import main

    res = CliRunner().invoke(main, ["leaderboard", "--experiment", "qa,qb", "--tracking-uri",
                                    store["uri"], "--view", "significance"])
    assert res.exit_code == 0, res.output
    from io import StringIO

    got = pd.read_csv(StringIO(res.output))
    want = query.significance(tracked)
    assert list(got.columns) == list(want.columns) and len(got) == len(want)
    np.testing.assert_allclose(got["mean"], want["mean"])
    res = CliRunner().invoke(main, ["leaderboard", "--experiment", "qb", "--tracking-uri",
                                    store["uri"], "--format", "markdown"])
    assert res.exit_code == 0 and res.output.lstrip().startswith("| dataset")
    bad = CliRunner().invoke(main, ["leaderboard", "--experiment", "nope", "--tracking-uri",
                                    store["uri"]])
    assert bad.exit_code != 0 and "no MLflow experiment named 'nope'" in bad.output


class _Recorder:
    """Wraps a reader and records which runs each bulk read asked for."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if name not in ("runs", "tags", "params", "latest_metrics"):
            return attr

        def call(ids, role=None):
            self.calls.append((name, role))
            return attr(ids, role)
        return call


def _by_run(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values("run_id").reset_index(drop=True).sort_index(axis=1)


def test_leaderboard_reads_only_the_studies(store, tracked):
    """A leaderboard whose studies carry their own best/* series needs the study runs' rows
    only: at 100,000 trials reading every trial's tags/params/metrics is what made
    load + leaderboard miss 2 s (docs/performance.md)."""
    t = query.load("qa,qb", store["uri"])
    t.reader = rec = _Recorder(t.reader)
    lb = query.leaderboard(t, source="study")
    assert rec.calls and {role for _, role in rec.calls} == {"study"}, rec.calls
    pd.testing.assert_frame_equal(lb, query.leaderboard(tracked, source="study"))
    # the default (auto) reads the trials only for the studies without a series of their own
    rec.calls.clear()
    pd.testing.assert_frame_equal(query.leaderboard(t), query.leaderboard(tracked))
    assert {role for _, role in rec.calls} <= {"study", "trial"}


@pytest.mark.parametrize("scoped_max", [None, 0])
def test_role_frames_read_alone_equal_the_full_frame(store, monkeypatch, scoped_max):
    """Every role read on its own (by run ids, or with scoped_max=0 the whole tables cut
    here) has the rows and values of that role in the full tidy frame."""
    from scarcelab.tracking.query import store as store_mod

    if scoped_max is not None:
        monkeypatch.setattr(store_mod, "SCOPED_MAX", scoped_max)
    full = query.load("qa,qb", store["uri"])
    assert len(full.runs)  # read the whole frame first: role() then cuts it
    for role in ("study", "trial", "al", "report", "nope"):
        alone = query.load("qa,qb", store["uri"])
        part = alone.role(role)
        assert alone._runs is None  # the full frame was not read
        want = full.role(role)
        assert set(part["run_id"]) == set(full.runs.loc[full.runs["role"] == role, "run_id"])
        pd.testing.assert_frame_equal(_by_run(part), _by_run(want), check_dtype=False)
    # the API reader's role filter (a search_runs filter string) gives the same rows
    api = query.load("qa,qb", store["uri"], reader="api")
    for role in ("study", "al"):
        pd.testing.assert_frame_equal(_by_run(api.role(role)), _by_run(full.role(role)),
                                      check_dtype=False)


@pytest.fixture(scope="module")
def report(store, tmp_path_factory):
    """The full report written by the CLI and logged as a `report` run."""
    from scarcelab.entrypoints.cli import main

    out = tmp_path_factory.mktemp("report")
    res = CliRunner().invoke(main, ["leaderboard", "--experiment", "qa,qb", "--tracking-uri",
                                    store["uri"], "--output", str(out), "--format", "html"])
    assert res.exit_code == 0, res.output
    return out, res.output


def test_report_files_and_report_run(store, report):
    out, output = report
    names = {p.name for p in out.iterdir()}
    for v in ("leaderboard", "gains", "profile", "significance", "ranks"):
        assert {f"{v}.csv", f"{v}.md"} <= names
    assert {"report.html", "leaderboard.png", "profile.png", "cd_study.png",
            "cd_al.png"} <= names
    html = (out / "report.html").read_text()
    assert html.count("<table") == 5 and html.count("data:image/png;base64,") >= 4
    c = MlflowClient(tracking_uri=store["uri"])
    exp = c.get_experiment_by_name("qa")
    runs = c.search_runs([exp.experiment_id], "tags.`scarcelab.role` = 'report'")
    logged = [r for r in runs if r.info.run_name == "report"]
    assert len(logged) == 1 and logged[0].info.run_id in output
    arts = {a.path for a in c.list_artifacts(logged[0].info.run_id, "report")}
    assert "report/report.html" in arts and "report/leaderboard.csv" in arts
    # the report run never shows up in a view
    again = query.load("qa,qb", store["uri"])
    pd.testing.assert_frame_equal(query.leaderboard(again),
                                  query.leaderboard(query.load("qa,qb", store["uri"])))
    assert "report" not in set(query.leaderboard(again).method.astype(str))


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    try:
        subprocess.run(["apt-get", "update", "-qq"], check=True, capture_output=True,
                       timeout=300)
        subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], check=True,
                       capture_output=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as e:
        pytest.skip(f"headless Chromium not installed and apt-get install chromium failed: {e}")
    found = shutil.which("chromium")
    if not found:
        pytest.skip("apt-get install chromium succeeded but no chromium binary on PATH")
    return found


def test_report_renders_in_headless_chromium(report, tmp_path):
    out, _ = report
    exe = _chromium()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-quic", "--no-first-run", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tempfile.mkdtemp(dir=tmp_path)}", "--window-size=1280,900"]
    url = (out / "report.html").resolve().as_uri()
    dom = subprocess.run([exe, *flags, "--dump-dom", url], capture_output=True, text=True,
                         timeout=120)
    assert "id=\"table-leaderboard\"" in dom.stdout, dom.stderr[-2000:]
    assert "fixmatch" in dom.stdout and "<img" in dom.stdout
    shot = tmp_path / "shot.png"
    subprocess.run([exe, *flags, f"--screenshot={shot}", url], capture_output=True,
                   timeout=120)
    assert shot.exists(), "chromium wrote no screenshot"
    import matplotlib.image as mpimg

    img = mpimg.imread(shot)[..., :3]
    assert img.shape[0] >= 800 and img.shape[1] >= 1200
    # the top of the page shows the title and the leaderboard table: dark text and the
    # table header colour (#eef) on white, i.e. far from blank
    top = img[: img.shape[0] // 2]
    dark = (top.mean(axis=2) < 0.4).mean()
    header = (np.abs(top - np.array([0xEE, 0xEE, 0xFF]) / 255).max(axis=2) < 0.02).mean()
    assert dark > 0.002 and header > 0.001, (dark, header)
    assert Path(shot).stat().st_size > 10_000


# -- render and report sections (mutation sample, docs/mutation.md) --------------------
def test_markdown_of_an_empty_view_says_no_rows():
    assert render.to_markdown(pd.DataFrame()) == "_(no rows)_"
    assert render.to_markdown(pd.DataFrame(columns=["method", "x"])) == "_(no rows)_"


def test_html_tables_carry_no_index_column():
    """The frame's index (a row number after filtering) is not a column of the report: the
    header has exactly the frame's columns and no row has a header cell."""
    df = pd.DataFrame({"method": ["sup", "fixmatch"], "score": [0.5, 0.75]},
                      index=[17, 42])
    page = render.html_report([render.Section("leaderboard", df)])
    table = page[page.index("<table"):page.index("</table>")]
    assert re.findall(r"<th[^>]*>([^<]*)</th>", table) == ["method", "score"]
    assert "17" not in table and "42" not in table
    assert "<td>sup</td>" in table and "<td>0.7500</td>" in table


def test_leaderboard_error_bars_are_the_seed_std():
    """Each bar carries a horizontal error bar mean ± std; a missing std (one seed) is 0."""
    import matplotlib.pyplot as plt

    lb = pd.DataFrame({"dataset": ["d", "d", "d"], "n_labeled": [40, 40, 40],
                       "method": ["sup", "fixmatch", "mixup"],
                       "test_balanced_accuracy_mean": [0.6, 0.8, 0.7],
                       "test_balanced_accuracy_std": [0.05, 0.02, np.nan]})
    fig = render.plot_leaderboard(lb)
    ax = fig.axes[0]
    (bars,) = [c for c in ax.containers if hasattr(c, "errorbar")]
    assert bars.errorbar is not None
    (segs,) = [lc.get_segments() for lc in bars.errorbar.lines[2]]
    # bars sorted by mean ascending: sup (0.6), mixup (0.7), fixmatch (0.8)
    got = sorted((float(s[:, 0].min()), float(s[:, 0].max())) for s in segs)
    want = [(0.55, 0.65), (0.7, 0.7), (0.78, 0.82)]
    np.testing.assert_allclose(got, want, atol=1e-12)
    plt.close(fig)


def test_profile_lines_step_and_bands_span_min_to_max():
    """Best-so-far scores hold until the next checkpoint: lines are drawn steps-post; the
    band is the min..max over seeds (not 0..max)."""
    import matplotlib.pyplot as plt

    t = np.array([0.0, 60.0, 120.0])
    prof = pd.DataFrame({"dataset": "d", "n_labeled": 40, "method": "sup", "t_s": t,
                         "test_balanced_accuracy_mean": [0.5, 0.6, 0.7],
                         "test_balanced_accuracy_min": [0.45, 0.55, 0.65],
                         "test_balanced_accuracy_max": [0.55, 0.65, 0.75],
                         "val_balanced_accuracy_mean": [0.52, 0.62, 0.72],
                         "val_balanced_accuracy_min": [0.5, 0.6, 0.7],
                         "val_balanced_accuracy_max": [0.54, 0.64, 0.74]})
    fig = render.plot_profile(prof)
    axes = fig.axes
    assert len(axes) == 2  # test on top, validation below
    for ax, lo, hi in ((axes[0], 0.45, 0.75), (axes[1], 0.5, 0.74)):
        (line,) = ax.get_lines()
        assert line.get_drawstyle() == "steps-post"
        (band,) = [c for c in ax.collections if isinstance(c, PolyCollection)]
        ys = np.concatenate([p.vertices[:, 1] for p in band.get_paths()])
        assert ys.min() == pytest.approx(lo) and ys.max() == pytest.approx(hi)
    plt.close(fig)


# -- report sections ------------------------------------------------------------------
def _al_tracked():  # type: ignore[no-untyped-def]
    """AL runs only (no studies), as the tidy frame: 3 strategies on 2 datasets x 3
    repetitions; s1 > s2 > s3 everywhere."""
    from scarcelab.tracking.query.frame import Tracked

    rows = []
    for s, aucs in {"s1": [0.9, 0.8, 0.85], "s2": [0.7, 0.6, 0.65],
                    "s3": [0.5, 0.4, 0.45]}.items():
        for rep, a in enumerate(aucs):
            for ds in ("d", "e"):
                rows.append({"run_id": f"{s}-{rep}-{ds}", "role": "al", "status": "FINISHED",
                             "dataset": ds, "query_size": 2, "repetition": rep,
                             "strategy": s, "metrics.al/auc": a})
    return Tracked(pd.DataFrame(rows), None, ["0"])  # type: ignore[arg-type]


def test_ranks_section_titles_the_al_cd_diagram():
    import matplotlib.pyplot as plt

    from scarcelab.tracking.query import report

    (sec,) = report.sections(_al_tracked(), ["ranks"])
    assert sec.note == report.NOTES["ranks"]
    assert sec.figures["cd_study"] is None  # no studies: no methods-over-datasets diagram
    fig = sec.figures["cd_al"]
    assert fig.axes[0].texts[0].get_text().startswith("AL strategies  (Friedman p = ")
    plt.close(fig)


def test_a_section_without_a_note_gets_no_note_paragraph():
    """A section with an empty note gets no note paragraph on the page (not a
    placeholder). Every registered view has a note (the registry refuses one without), so
    ``transfer``'s section, which had none, now shows its own."""
    from scarcelab.tracking.query import report

    (sec,) = report.sections(_al_tracked(), ["transfer"])
    assert sec.note == report.NOTES["transfer"] and sec.note
    assert "class='note'" in render.html_report([sec])
    sec.note = ""
    assert "class='note'" not in render.html_report([sec])


# -- frame, readers, views on hand-written runs (mutation sample, docs/mutation.md) ----
# (dataset, method, family, seed) -> trials -> epochs (val, test_bacc, test_acc, elapsed_s)
FRAME_STUDIES = {
    ("dX", "sup", "supervised", 0): [[(0.5, 0.60, 0.65, 10.0), (0.7, 0.70, 0.75, 20.0)],
                                     [(0.6, 0.90, 0.95, 35.0)]],
    ("dX", "sup", "supervised", 1): [[(0.6, 0.62, 0.66, 10.0), (0.8, 0.72, 0.76, 20.0)]],
    ("dX", "fixmatch", "semi", 0): [[(0.7, 0.80, 0.85, 10.0), (0.75, 0.82, 0.86, 20.0)]],
    ("dY", "sup", "supervised", 0): [[(0.4, 0.50, 0.55, 10.0), (0.5, 0.52, 0.56, 30.0)]],
    ("dY", "fixmatch", "semi", 0): [[(0.6, 0.66, 0.70, 10.0)]],
}


# AL: (strategy, repetition) -> al/auc, one dataset and query size
FRAME_AL = {("random", 0): 0.60, ("random", 1): 0.70, ("margin", 0): 0.65, ("margin", 1): 0.55}


def _log_frame_study(c: MlflowClient, exp: str, key: tuple, trials: list, start: int) -> str:
    ds, method, family, seed = key
    tags = {T.ROLE: "study", "scarcelab.family": family, "scarcelab.method": method,
            "scarcelab.dataset": ds, "scarcelab.seed": str(seed)}
    sid = c.create_run(exp, start_time=start, tags=tags).info.run_id
    c.log_batch(sid, params=[Param("n_labeled", "40")])
    series, best, g = [], None, 0
    for i, trial in enumerate(trials):
        tr = c.create_run(exp, start_time=start + 1 + i, tags={
            **tags, T.ROLE: "trial", "scarcelab.trial": str(i), "mlflow.parentRunId": sid})
        ms = []
        for ep, (val, test, acc, el) in enumerate(trial):
            ts = T0 + int(el * 1000)
            ms += [Metric("val/balanced_accuracy", val, ts, ep),
                   Metric("test/balanced_accuracy", test, ts, ep),
                   Metric("test/accuracy", acc, ts, ep), Metric("time/elapsed_s", el, ts, ep)]
            if best is None or val > best[0]:
                best = (val, test, acc)
            series += [Metric("best/val_balanced_accuracy", best[0], ts, g),
                       Metric("best/test_balanced_accuracy", best[1], ts, g),
                       Metric("best/test_accuracy", best[2], ts, g),
                       Metric("time/elapsed_s", el, ts, g)]
            g += 1
        c.log_batch(tr.info.run_id, metrics=ms)
        c.set_terminated(tr.info.run_id, "FINISHED")
    c.log_batch(sid, metrics=series)
    c.set_terminated(sid, "FINISHED")
    return sid


def _finished(c: MlflowClient, exp: str, tags: dict, metrics: dict[str, float]) -> str:
    rid = c.create_run(exp, tags=tags).info.run_id
    c.log_batch(rid, metrics=[Metric(k, v, T0, 0) for k, v in metrics.items()])
    c.set_terminated(rid, "FINISHED")
    return rid


@pytest.fixture(scope="module")
def frame_store():
    """Experiment ``q``: the studies above, their trials, AL runs, a retrain run that logs a
    validation curve of its own (not a trial of any study) and a run with look-alike metric
    keys. Experiment ``tr``: probe / segment runs for the transfer view. The folder name
    holds a ':' so the URI's scheme must be read from its first colon."""
    shm = Path("/dev/shm")
    root = Path(tempfile.mkdtemp(prefix="scarcelab-qkill-", dir=shm if shm.is_dir() else None))
    (root / "a:b").mkdir()
    uri = f"sqlite:///{root}/a:b/mlflow.db"
    c = MlflowClient(tracking_uri=uri)
    q = c.create_experiment("q", artifact_location=str(root / "art" / "q"))
    tr = c.create_experiment("tr", artifact_location=str(root / "art" / "tr"))
    ids = {k: _log_frame_study(c, q, k, v, T0 + 1000 * i)
           for i, (k, v) in enumerate(FRAME_STUDIES.items())}
    for (s, rep), auc in FRAME_AL.items():
        _finished(c, q, {T.ROLE: "al", "scarcelab.dataset": "dX", "scarcelab.strategy": s,
                         "scarcelab.query_size": "1", "scarcelab.repetition": str(rep)},
                  {"al/auc": auc})
    foreign = c.create_run(q, tags={T.ROLE: "retrain", "scarcelab.dataset": "dX"}).info.run_id
    c.log_batch(foreign, metrics=[Metric("val/balanced_accuracy", 0.99, T0 + 5000, 0),
                                  Metric("time/elapsed_s", 5.0, T0 + 5000, 0)])
    c.set_terminated(foreign, "FINISHED")
    like = _finished(c, q, {T.ROLE: "misc"}, {"a_b/x": 1.0, "axb/y": 2.0, "a_bc/z": 3.0})
    # transfer: two probe studies (one with a trial carrying its tags), one segment run
    probe = {T.ROLE: "study", "scarcelab.task": "probe", "scarcelab.family": "transfer"}
    _finished(c, tr, {**probe, "scarcelab.encoder": "random", "scarcelab.encoder_method": "random",
                      "scarcelab.protocol": "linear", "scarcelab.dataset": "pA"},
              {"test/accuracy": 0.5, "test/balanced_accuracy": 0.4})
    _finished(c, tr, {**probe, "scarcelab.encoder": "random", "scarcelab.encoder_method": "random",
                      "scarcelab.protocol": "linear", "scarcelab.dataset": "pA"},
              {"test/accuracy": 0.7, "test/balanced_accuracy": 0.6})
    _finished(c, tr, {**probe, T.ROLE: "trial", "scarcelab.encoder": "random",
                      "scarcelab.protocol": "linear", "scarcelab.dataset": "pA"},
              {"test/accuracy": 0.0, "test/balanced_accuracy": 0.0})
    _finished(c, tr, {**probe, "scarcelab.encoder": "w.pt", "scarcelab.encoder_method": "simclr",
                      "scarcelab.protocol": "finetune", "scarcelab.dataset": "pB"},
              {"test/accuracy": 0.9, "test/balanced_accuracy": 0.8})
    _finished(c, tr, {T.ROLE: "segment", "scarcelab.encoder": "random",
                      "scarcelab.dataset": "seg"}, {"seg/pq": 0.42, "seg/mpq": 0.21})
    # the same encoder as another arch, protocol or label fraction: never averaged in
    arch = {"scarcelab.encoder": "random", "scarcelab.encoder_method": "random"}
    _finished(c, tr, {**probe, **arch, "scarcelab.protocol": "linear", "scarcelab.arch": "r18",
                      "scarcelab.dataset": "pA"},
              {"test/accuracy": 0.95, "test/balanced_accuracy": 0.9})
    _finished(c, tr, {**probe, **arch, "scarcelab.protocol": "linear", "scarcelab.arch": "r18",
                      "scarcelab.label_fraction": "0.1", "scarcelab.dataset": "pA"},
              {"test/accuracy": 0.35, "test/balanced_accuracy": 0.3})
    _finished(c, tr, {T.ROLE: "study", "scarcelab.task": "segment", **arch,
                      "scarcelab.protocol": "frozen", "scarcelab.arch": "r18",
                      "scarcelab.label_fraction": "1", "scarcelab.dataset": "seg"},
              {"seg/pq": 0.3, "seg/mpq": 0.1})
    yield {"uri": uri, "ids": ids, "q": q, "foreign": foreign, "like": like}
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def frame_tracked(frame_store):
    return query.load("q", frame_store["uri"])


# -- frame ------------------------------------------------------------------------------
def test_trial_record_holds_only_the_studies_trials(frame_store, frame_tracked):
    """source='trials' over every study reads all trials in one scan; a non-trial run of the
    experiment with a validation curve (the retrain run, val 0.99) must not enter it."""
    rec = frame_tracked.record("trials")
    assert rec["study_id"].notna().all()
    assert frame_store["foreign"] not in set(rec["run_id"])
    assert 0.99 not in set(rec["val_balanced_accuracy"])
    # sup seed 0: 0.5 -> 0.7 in trial 0, trial 1's 0.6 is no improvement
    sid = frame_store["ids"][("dX", "sup", "supervised", 0)]
    assert list(rec.loc[rec.study_id == sid, "val_balanced_accuracy"]) == [0.5, 0.7]
    assert len(rec) == 2 + 2 + 2 + 2 + 1


@pytest.mark.parametrize("source", ["study", "trials"])
def test_record_reads_only_the_named_tests(frame_tracked, source):
    rec = frame_tracked.record(source, tests=["test_accuracy"])
    assert [c for c in rec.columns if c.startswith("test_")] == ["test_accuracy"]
    both = frame_tracked.record(source)
    assert {"test_accuracy", "test_balanced_accuracy"} <= set(both.columns)


def test_selected_names_the_valid_sources(frame_tracked):
    with pytest.raises(ValueError, match=r"source must be one of .*'trials'.*got 'nope'"):
        frame_tracked.selected("nope")


def test_with_runs_keeps_store_and_experiments(frame_tracked):
    runs = frame_tracked.runs
    sub = frame_tracked.with_runs(runs[runs["dataset"] == "dX"])
    assert sub.reader is frame_tracked.reader and sub.experiment_ids == frame_tracked.experiment_ids
    assert sub.include_failed is False and sub.experiments == frame_tracked.experiments
    pd.testing.assert_frame_equal(query.leaderboard(sub),
                                  query.leaderboard(frame_tracked, dataset="dX"))


# -- store ------------------------------------------------------------------------------
def test_uri_scheme_is_read_before_the_first_colon(frame_store, frame_tracked):
    # the sqlite path holds "a:b": still a database URI, read through SQL
    assert isinstance(frame_tracked.reader, SqlReader)
    assert isinstance(open_reader(frame_store["uri"]), SqlReader)
    # user:password@host:port never changes the scheme: reader="sql" accepts the URI (the
    # engine connects lazily; without the default driver, psycopg, creating it fails with
    # an ImportError, still past the scheme check that raises ValueError)
    try:
        pg = open_reader("postgresql://user:secret@localhost:5432/mlflow", reader="sql")
    except ImportError:
        pass
    else:
        assert isinstance(pg, SqlReader)


def test_api_reader_reads_a_file_store(tmp_path, monkeypatch):
    """File stores go through the API reader (module doc); its paged search must work on
    them too."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    c = MlflowClient(tracking_uri=uri)
    e = c.create_experiment("f")
    made = {_finished(c, e, {T.ROLE: "al"}, {"al/auc": 0.5 + i / 10}) for i in range(3)}
    r = open_reader(uri)
    assert isinstance(r, ApiReader)
    assert set(r.runs([e])["run_id"]) == made
    assert set(r.runs([e], "al")["run_id"]) == made


def test_api_history_of_exactly_the_read_role_needs_no_new_search(frame_store, monkeypatch):
    """A study's history is served from the runs read for its role when those cover the
    wanted runs — including when they are exactly the wanted runs."""
    r = ApiReader(frame_store["uri"])
    q = [frame_store["q"]]
    ids = list(r.runs(q, "study")["run_id"])
    assert len(ids) == len(FRAME_STUDIES)
    filters = []
    real = r.client.search_runs

    def spy(exps, where, *a, **k):  # type: ignore[no-untyped-def]
        filters.append(where)
        return real(exps, where, *a, **k)

    monkeypatch.setattr(r.client, "search_runs", spy)
    h = r.histories(ids, q, keys=["best/val_balanced_accuracy"])
    assert filters == []
    assert set(h["run_id"]) == set(ids) and set(h["key"]) == {"best/val_balanced_accuracy"}


def test_sql_reader_role_scopes_tags_params_and_metrics(frame_store):
    r = SqlReader(frame_store["uri"])
    q = [frame_store["q"]]
    studies = set(frame_store["ids"].values())
    for read in (r.tags, r.params, r.latest_metrics):
        assert set(read(q, "study")["run_id"]) == studies, read.__name__
    assert set(r.tags(q, "retrain")["run_id"]) == {frame_store["foreign"]}
    assert studies < set(r.tags(q)["run_id"])


@pytest.mark.parametrize("reader", [SqlReader, ApiReader])
def test_history_prefixes_are_literal(frame_store, reader):
    """'_' in a prefix is a character, not LIKE's any-character wildcard (MLflow forbids '%'
    in metric names)."""
    r = reader(frame_store["uri"])
    h = r.histories([frame_store["like"]], [frame_store["q"]], prefixes=["a_b"])
    assert sorted(h["key"]) == ["a_b/x", "a_bc/z"]


# -- table3 / views --------------------------------------------------------------------
def test_retrain_scores_without_scores_keeps_its_columns(frame_tracked):
    # the only retrain run logged no test/balanced_accuracy
    out = retrain_scores(frame_tracked)
    assert out.empty and list(out.columns) == ["dataset", "method", "study_id", "test_set",
                                               "start_time", "score"]


def test_al_scores_average_repetitions_by_default(frame_tracked):
    s = views.al_scores(frame_tracked)
    assert list(s.index.names) == ["dataset", "query_size"] and len(s) == 1
    assert s.loc[("dX", 1), "random"] == pytest.approx((0.60 + 0.70) / 2)
    assert s.loc[("dX", 1), "margin"] == pytest.approx((0.65 + 0.55) / 2)


def test_gains_empty_frames_keep_their_columns(frame_tracked):
    cols = ["method", "median_gain", "worst_gain"]
    assert list(views.gains(frame_tracked, dataset="nope").columns) == cols
    with pytest.warns(UserWarning, match="no labeled-only method"):
        only_semi = views.gains(frame_tracked, family="semi")
    assert only_semi.empty and list(only_semi.columns) == cols


def test_profile_and_ranks_have_a_fresh_index(frame_tracked):
    prof = views.profile(frame_tracked, grid=[0.0, 15.0, 40.0])
    assert len(prof) == 4 * 3  # (dX, dY) x (sup, fixmatch) x 3 times
    assert prof.index.equals(pd.RangeIndex(len(prof)))
    r = views.ranks(frame_tracked)
    assert set(r["scope"]) == {"study", "al"}
    assert r.index.equals(pd.RangeIndex(len(r)))


def test_transfer_wide_table(frame_store):
    """Rows are (encoder, arch, protocol, label fraction): the probes of the encoder as
    another arch (r18), at another label fraction, and its frozen segmentation are rows of
    their own (the view used to average every run of an encoder into one row)."""
    t = query.load("tr", frame_store["uri"])
    view = views.transfer(t)
    assert list(view.columns[:6]) == ["encoder", "arch", "protocol", "label_fraction",
                                      "encoder_method", "n_runs"]
    v = view.set_index(["encoder", "arch", "protocol", "label_fraction"])
    assert set(v.index) == {("random", "", "linear", 1.0), ("random", "", "finetune", 1.0),
                            ("w.pt", "", "finetune", 1.0), ("random", "r18", "linear", 1.0),
                            ("random", "r18", "linear", 0.1), ("random", "r18", "frozen", 1.0)}
    assert set(v.columns[2:]) == {"pA accuracy", "pA balanced_accuracy", "pB accuracy",
                                  "pB balanced_accuracy", "seg seg/pq", "seg seg/mpq"}
    # means over the two linear probes without an arch; the trial (0.0) is left out
    lin = v.loc[("random", "", "linear", 1.0)]
    assert lin["pA accuracy"] == pytest.approx(0.6) and lin["n_runs"] == 2
    assert lin["pA balanced_accuracy"] == pytest.approx(0.5)
    assert v.loc[("random", "r18", "linear", 1.0), "pA accuracy"] == pytest.approx(0.95)
    assert v.loc[("random", "r18", "linear", 0.1), "pA accuracy"] == pytest.approx(0.35)
    # a segment run without a protocol tag is the fine-tuning it always was
    assert v.loc[("random", "", "finetune", 1.0), "seg seg/pq"] == pytest.approx(0.42)
    assert v.loc[("random", "r18", "frozen", 1.0), "seg seg/pq"] == pytest.approx(0.3)
    assert np.isnan(v.loc[("random", "r18", "frozen", 1.0), "pA accuracy"])
    w = v.loc[("w.pt", "", "finetune", 1.0)]
    assert w["pB accuracy"] == pytest.approx(0.9) and np.isnan(w["seg seg/pq"])
    assert w["n_runs"] == 1 and w["encoder_method"] == "simclr"
    assert (v.loc["random", "encoder_method"] == "random").all()
    only = views.transfer(t, dataset="pB")
    assert only[["encoder", "protocol"]].values.tolist() == [["w.pt", "finetune"]]
    assert set(only.columns) == {"encoder", "arch", "protocol", "label_fraction",
                                 "encoder_method", "n_runs", "pB accuracy",
                                 "pB balanced_accuracy"}


def test_significance_of_studies_without_a_dataset_tag_is_one_block(tmp_path):
    """Studies logged without ``scarcelab.dataset`` form one block, as in ``leaderboard``
    (found while writing these tests: ``significance`` raised KeyError 'dataset')."""
    uri = f"sqlite:///{tmp_path}/m.db"
    c = MlflowClient(tracking_uri=uri)
    e = c.create_experiment("nd", artifact_location=str(tmp_path / "art"))
    vals = {("a", 0): 0.80, ("a", 1): 0.82, ("b", 0): 0.50, ("b", 1): 0.54}
    for i, ((m, seed), v) in enumerate(vals.items()):
        sid = _log_frame_study(c, e, ("dZ", m, "supervised", seed), [[(v, v, v, 10.0)]],
                         T0 + 1000 * i)
        c.delete_tag(sid, "scarcelab.dataset")
    sig = views.significance(query.load("nd", uri))
    assert len(sig) == 2 and sig["dataset"].isna().all()
    b = sig.set_index("method").loc["b"]
    want = sps.ttest_ind([0.50, 0.54], [0.80, 0.82], equal_var=False).pvalue
    assert b["best_method"] == "a" and b["p_value"] == pytest.approx(want)


def test_the_report_run_takes_the_identity_options(store, tmp_path):
    """`leaderboard --output` logs a run like every other command: --run-name, --tags and
    --description name, tag and describe it (the MLflow UI's Description); reserved tag
    keys are refused before anything is read. Last in this module: it adds a report run
    to the shared store."""
    from scarcelab.entrypoints.cli import main

    bad = CliRunner().invoke(main, ["leaderboard", "--experiment", "qa", "--tracking-uri",
                                    store["uri"], "--output", str(tmp_path / "x"),
                                    "--tags", "scarcelab.role=study"])
    assert bad.exit_code == 2 and "scarcelab." in bad.output
    res = CliRunner().invoke(main, ["leaderboard", "--experiment", "qa,qb", "--tracking-uri",
                                    store["uri"], "--output", str(tmp_path / "rep"),
                                    "--run-name", "weekly board", "--tags",
                                    "project=liver,owner=ana", "--description",
                                    "for the Monday meeting"])
    assert res.exit_code == 0, res.output
    c = MlflowClient(tracking_uri=store["uri"])
    exp = c.get_experiment_by_name("qa")
    runs = [r for r in c.search_runs([exp.experiment_id], "tags.`scarcelab.role` = 'report'")
            if r.info.run_name == "weekly board"]
    assert len(runs) == 1 and runs[0].info.run_id in res.output
    tags = runs[0].data.tags
    assert tags["project"] == "liver" and tags["owner"] == "ana"
    assert tags["mlflow.note.content"] == "for the Monday meeting"
    assert tags["scarcelab.experiments"] == "qa,qb"


@pytest.mark.parametrize("reader", [SqlReader, ApiReader])
def test_params_of_one_role_are_only_that_roles(tmp_path, reader):
    """``params(…, role)`` returns the params of the runs of that role, not every run's."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    c = MlflowClient(tracking_uri=uri)
    e = c.create_experiment("p", artifact_location=str(tmp_path / "art"))
    runs = {}
    for role in ("study", "trial", "trial"):
        rid = c.create_run(e, tags={T.ROLE: role}).info.run_id
        c.log_batch(rid, params=[Param("lr", "0.1"), Param("role_of_run", role)])
        c.set_terminated(rid, "FINISHED")
        runs.setdefault(role, set()).add(rid)
    r = reader(uri)
    study = r.params([e], "study")
    assert set(study["run_id"]) == runs["study"] and set(study["value"]) >= {"study"}
    assert set(r.params([e], "trial")["run_id"]) == runs["trial"]
    assert len(r.params([e])) == 6


def test_a_studys_own_series_is_kept_in_step_order_even_where_its_clock_is_missing():
    """A study's series is its answer at each global epoch: every point, in step order —
    also when an epoch logged no elapsed time (read as +inf) or the clock went back; trial
    checkpoints are ordered by time instead."""
    from scarcelab.tracking.query.frame import _record_rows

    cand = pd.DataFrame({"study_id": ["s"] * 4, "run_id": ["s"] * 4, "step": [0, 1, 2, 3],
                         "val": [0.5, 0.6, 0.55, 0.7], "elapsed_s": [5.0, np.nan, 4.0, 9.0],
                         "source": ["study"] * 4, "start_time": [0] * 4})
    cand = cand.rename(columns={"val": query.frame.VAL})
    rec = _record_rows(cand)
    assert list(rec["step"]) == [0, 1, 2, 3] and list(rec["order"]) == [0, 1, 2, 3]


def test_a_record_of_every_trial_reads_their_histories_in_one_experiment_scoped_query(
        frame_store, monkeypatch):
    """All trials of the experiments: one join over the experiments (``run_ids=None``)
    instead of a long ``IN (...)`` list of their ids."""
    t = query.load("q", frame_store["uri"])  # fresh: the shared one caches its records
    asked = []
    real = t.reader.histories

    def spy(run_ids, *a, **k):  # type: ignore[no-untyped-def]
        asked.append((None if run_ids is None else len(run_ids), tuple(k.get("keys") or ())))
        return real(run_ids, *a, **k)

    monkeypatch.setattr(t.reader, "histories", spy)
    rec = t.record("trials")
    val = [n for n, keys in asked if "val/balanced_accuracy" in keys]
    assert val == [None] and len(rec)


def test_results_page_reads_per_seed_scores_and_scale_from_a_real_store(tracked):
    """The claim rules' inputs from an MLflow store: ``data.studies`` is the query layer's
    per-seed samples (so the SSL rules pair over the seeds the studies share) and the
    scale frame has a row per study with its seed, method and completed trials."""
    from scarcelab.tracking.results import claims as C
    from scarcelab.tracking.results import page as P

    data = C.SuiteData()
    P._study_sections(tracked, data)
    smp = views.samples(tracked)
    assert len(data.studies) == len(smp) > 0
    assert list(data.studies["method"]) == list(smp["variant"])
    assert np.allclose(data.studies["score"], pd.to_numeric(smp["test_balanced_accuracy"]),
                       equal_nan=True)
    sc = P.scale_frame(tracked.runs)
    studies = tracked.runs[tracked.runs["role"] == "study"]
    assert len(sc) == len(studies)
    assert sc["seed"].notna().all() and set(sc["method"]) == set(studies["method"])
