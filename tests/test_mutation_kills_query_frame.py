"""Behaviours of tracking/query (frame, store, table3, views) that the seeded mutation
sample (docs/mutation.md) showed no test checked. Every store is a real MLflow store (sqlite,
or a file store for the API reader) holding a few hand-written runs; the expectations are
derived by hand from those runs and the documented contracts."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient
from scipy import stats as sps

from scarcelab.tracking import query
from scarcelab.tracking.query import views
from scarcelab.tracking.query.store import ROLE_TAG, ApiReader, SqlReader, open_reader
from scarcelab.tracking.query.table3 import retrain_scores

T0 = 1_700_000_000_000
# (dataset, method, family, seed) -> trials -> epochs (val, test_bacc, test_acc, elapsed_s)
STUDIES = {
    ("dX", "sup", "supervised", 0): [[(0.5, 0.60, 0.65, 10.0), (0.7, 0.70, 0.75, 20.0)],
                                     [(0.6, 0.90, 0.95, 35.0)]],
    ("dX", "sup", "supervised", 1): [[(0.6, 0.62, 0.66, 10.0), (0.8, 0.72, 0.76, 20.0)]],
    ("dX", "fixmatch", "semi", 0): [[(0.7, 0.80, 0.85, 10.0), (0.75, 0.82, 0.86, 20.0)]],
    ("dY", "sup", "supervised", 0): [[(0.4, 0.50, 0.55, 10.0), (0.5, 0.52, 0.56, 30.0)]],
    ("dY", "fixmatch", "semi", 0): [[(0.6, 0.66, 0.70, 10.0)]],
}
# AL: (strategy, repetition) -> al/auc, one dataset and query size
AL = {("random", 0): 0.60, ("random", 1): 0.70, ("margin", 0): 0.65, ("margin", 1): 0.55}


def _log_study(c: MlflowClient, exp: str, key: tuple, trials: list, start: int) -> str:
    ds, method, family, seed = key
    tags = {ROLE_TAG: "study", "scarcelab.family": family, "scarcelab.method": method,
            "scarcelab.dataset": ds, "scarcelab.seed": str(seed)}
    sid = c.create_run(exp, start_time=start, tags=tags).info.run_id
    c.log_batch(sid, params=[Param("n_labeled", "40")])
    series, best, g = [], None, 0
    for i, trial in enumerate(trials):
        tr = c.create_run(exp, start_time=start + 1 + i, tags={
            **tags, ROLE_TAG: "trial", "scarcelab.trial": str(i), "mlflow.parentRunId": sid})
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
def store():
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
    ids = {k: _log_study(c, q, k, v, T0 + 1000 * i) for i, (k, v) in enumerate(STUDIES.items())}
    for (s, rep), auc in AL.items():
        _finished(c, q, {ROLE_TAG: "al", "scarcelab.dataset": "dX", "scarcelab.strategy": s,
                         "scarcelab.query_size": "1", "scarcelab.repetition": str(rep)},
                  {"al/auc": auc})
    foreign = c.create_run(q, tags={ROLE_TAG: "retrain", "scarcelab.dataset": "dX"}).info.run_id
    c.log_batch(foreign, metrics=[Metric("val/balanced_accuracy", 0.99, T0 + 5000, 0),
                                  Metric("time/elapsed_s", 5.0, T0 + 5000, 0)])
    c.set_terminated(foreign, "FINISHED")
    like = _finished(c, q, {ROLE_TAG: "misc"}, {"a_b/x": 1.0, "axb/y": 2.0, "a_bc/z": 3.0})
    # transfer: two probe studies (one with a trial carrying its tags), one segment run
    probe = {ROLE_TAG: "study", "scarcelab.task": "probe", "scarcelab.family": "transfer"}
    _finished(c, tr, {**probe, "scarcelab.encoder": "random", "scarcelab.encoder_method": "random",
                      "scarcelab.protocol": "linear", "scarcelab.dataset": "pA"},
              {"test/accuracy": 0.5, "test/balanced_accuracy": 0.4})
    _finished(c, tr, {**probe, "scarcelab.encoder": "random", "scarcelab.encoder_method": "random",
                      "scarcelab.protocol": "linear", "scarcelab.dataset": "pA"},
              {"test/accuracy": 0.7, "test/balanced_accuracy": 0.6})
    _finished(c, tr, {**probe, ROLE_TAG: "trial", "scarcelab.encoder": "random",
                      "scarcelab.protocol": "linear", "scarcelab.dataset": "pA"},
              {"test/accuracy": 0.0, "test/balanced_accuracy": 0.0})
    _finished(c, tr, {**probe, "scarcelab.encoder": "w.pt", "scarcelab.encoder_method": "simclr",
                      "scarcelab.protocol": "finetune", "scarcelab.dataset": "pB"},
              {"test/accuracy": 0.9, "test/balanced_accuracy": 0.8})
    _finished(c, tr, {ROLE_TAG: "segment", "scarcelab.encoder": "random",
                      "scarcelab.dataset": "seg"}, {"seg/pq": 0.42, "seg/mpq": 0.21})
    # the same encoder as another arch, protocol or label fraction: never averaged in
    arch = {"scarcelab.encoder": "random", "scarcelab.encoder_method": "random"}
    _finished(c, tr, {**probe, **arch, "scarcelab.protocol": "linear", "scarcelab.arch": "r18",
                      "scarcelab.dataset": "pA"},
              {"test/accuracy": 0.95, "test/balanced_accuracy": 0.9})
    _finished(c, tr, {**probe, **arch, "scarcelab.protocol": "linear", "scarcelab.arch": "r18",
                      "scarcelab.label_fraction": "0.1", "scarcelab.dataset": "pA"},
              {"test/accuracy": 0.35, "test/balanced_accuracy": 0.3})
    _finished(c, tr, {ROLE_TAG: "study", "scarcelab.task": "segment", **arch,
                      "scarcelab.protocol": "frozen", "scarcelab.arch": "r18",
                      "scarcelab.label_fraction": "1", "scarcelab.dataset": "seg"},
              {"seg/pq": 0.3, "seg/mpq": 0.1})
    yield {"uri": uri, "ids": ids, "q": q, "foreign": foreign, "like": like}
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def tracked(store):
    return query.load("q", store["uri"])


# -- frame ------------------------------------------------------------------------------
def test_trial_record_holds_only_the_studies_trials(store, tracked):
    """source='trials' over every study reads all trials in one scan; a non-trial run of the
    experiment with a validation curve (the retrain run, val 0.99) must not enter it."""
    rec = tracked.record("trials")
    assert rec["study_id"].notna().all()
    assert store["foreign"] not in set(rec["run_id"])
    assert 0.99 not in set(rec["val_balanced_accuracy"])
    # sup seed 0: 0.5 -> 0.7 in trial 0, trial 1's 0.6 is no improvement
    sid = store["ids"][("dX", "sup", "supervised", 0)]
    assert list(rec.loc[rec.study_id == sid, "val_balanced_accuracy"]) == [0.5, 0.7]
    assert len(rec) == 2 + 2 + 2 + 2 + 1


@pytest.mark.parametrize("source", ["study", "trials"])
def test_record_reads_only_the_named_tests(tracked, source):
    rec = tracked.record(source, tests=["test_accuracy"])
    assert [c for c in rec.columns if c.startswith("test_")] == ["test_accuracy"]
    both = tracked.record(source)
    assert {"test_accuracy", "test_balanced_accuracy"} <= set(both.columns)


def test_selected_names_the_valid_sources(tracked):
    with pytest.raises(ValueError, match=r"source must be one of .*'trials'.*got 'nope'"):
        tracked.selected("nope")


def test_with_runs_keeps_store_and_experiments(tracked):
    runs = tracked.runs
    sub = tracked.with_runs(runs[runs["dataset"] == "dX"])
    assert sub.reader is tracked.reader and sub.experiment_ids == tracked.experiment_ids
    assert sub.include_failed is False and sub.experiments == tracked.experiments
    pd.testing.assert_frame_equal(query.leaderboard(sub),
                                  query.leaderboard(tracked, dataset="dX"))


# -- store ------------------------------------------------------------------------------
def test_uri_scheme_is_read_before_the_first_colon(store, tracked):
    # the sqlite path holds "a:b": still a database URI, read through SQL
    assert isinstance(tracked.reader, SqlReader)
    assert isinstance(open_reader(store["uri"]), SqlReader)
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
    made = {_finished(c, e, {ROLE_TAG: "al"}, {"al/auc": 0.5 + i / 10}) for i in range(3)}
    r = open_reader(uri)
    assert isinstance(r, ApiReader)
    assert set(r.runs([e])["run_id"]) == made
    assert set(r.runs([e], "al")["run_id"]) == made


def test_api_history_of_exactly_the_read_role_needs_no_new_search(store, monkeypatch):
    """A study's history is served from the runs read for its role when those cover the
    wanted runs — including when they are exactly the wanted runs."""
    r = ApiReader(store["uri"])
    q = [store["q"]]
    ids = list(r.runs(q, "study")["run_id"])
    assert len(ids) == len(STUDIES)
    filters = []
    real = r.client.search_runs

    def spy(exps, where, *a, **k):  # type: ignore[no-untyped-def]
        filters.append(where)
        return real(exps, where, *a, **k)

    monkeypatch.setattr(r.client, "search_runs", spy)
    h = r.histories(ids, q, keys=["best/val_balanced_accuracy"])
    assert filters == []
    assert set(h["run_id"]) == set(ids) and set(h["key"]) == {"best/val_balanced_accuracy"}


def test_sql_reader_role_scopes_tags_params_and_metrics(store):
    r = SqlReader(store["uri"])
    q = [store["q"]]
    studies = set(store["ids"].values())
    for read in (r.tags, r.params, r.latest_metrics):
        assert set(read(q, "study")["run_id"]) == studies, read.__name__
    assert set(r.tags(q, "retrain")["run_id"]) == {store["foreign"]}
    assert studies < set(r.tags(q)["run_id"])


@pytest.mark.parametrize("reader", [SqlReader, ApiReader])
def test_history_prefixes_are_literal(store, reader):
    """'_' in a prefix is a character, not LIKE's any-character wildcard (MLflow forbids '%'
    in metric names)."""
    r = reader(store["uri"])
    h = r.histories([store["like"]], [store["q"]], prefixes=["a_b"])
    assert sorted(h["key"]) == ["a_b/x", "a_bc/z"]


# -- table3 / views --------------------------------------------------------------------
def test_retrain_scores_without_scores_keeps_its_columns(tracked):
    # the only retrain run logged no test/balanced_accuracy
    out = retrain_scores(tracked)
    assert out.empty and list(out.columns) == ["dataset", "method", "study_id", "test_set",
                                               "start_time", "score"]


def test_al_scores_average_repetitions_by_default(tracked):
    s = views.al_scores(tracked)
    assert list(s.index.names) == ["dataset", "query_size"] and len(s) == 1
    assert s.loc[("dX", 1), "random"] == pytest.approx((0.60 + 0.70) / 2)
    assert s.loc[("dX", 1), "margin"] == pytest.approx((0.65 + 0.55) / 2)


def test_gains_empty_frames_keep_their_columns(tracked):
    cols = ["method", "median_gain", "worst_gain"]
    assert list(views.gains(tracked, dataset="nope").columns) == cols
    with pytest.warns(UserWarning, match="no labeled-only method"):
        only_semi = views.gains(tracked, family="semi")
    assert only_semi.empty and list(only_semi.columns) == cols


def test_profile_and_ranks_have_a_fresh_index(tracked):
    prof = views.profile(tracked, grid=[0.0, 15.0, 40.0])
    assert len(prof) == 4 * 3  # (dX, dY) x (sup, fixmatch) x 3 times
    assert prof.index.equals(pd.RangeIndex(len(prof)))
    r = views.ranks(tracked)
    assert set(r["scope"]) == {"study", "al"}
    assert r.index.equals(pd.RangeIndex(len(r)))


def test_transfer_wide_table(store):
    """Rows are (encoder, arch, protocol, label fraction): the probes of the encoder as
    another arch (r18), at another label fraction, and its frozen segmentation are rows of
    their own (the view used to average every run of an encoder into one row)."""
    t = query.load("tr", store["uri"])
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
        sid = _log_study(c, e, ("dZ", m, "supervised", seed), [[(v, v, v, 10.0)]],
                         T0 + 1000 * i)
        c.delete_tag(sid, "scarcelab.dataset")
    sig = views.significance(query.load("nd", uri))
    assert len(sig) == 2 and sig["dataset"].isna().all()
    b = sig.set_index("method").loc["b"]
    want = sps.ttest_ind([0.50, 0.54], [0.80, 0.82], equal_var=False).pvalue
    assert b["best_method"] == "a" and b["p_value"] == pytest.approx(want)
