"""AL sweeps through real MLflow (sqlite store): run structure, views, the CLI."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

TINY = {"budget": 4, "max_epochs": 3}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One sqlite store for the module: creating MLflow's schema costs seconds, so the
    tests share it and keep apart by experiment name."""
    import mlflow

    tmp = tmp_path_factory.mktemp("al_mlflow")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        mp.chdir(tmp)  # artifacts (./mlruns) stay in the temporary folder
        mp.delenv("MLFLOW_RUN_ID", raising=False)
        mlflow.set_tracking_uri(uri)
        yield uri


def _sweep(strategy: str, experiment: str, reps: int = 2) -> object:
    from scarcelab.active.loop import ALRunConfig, run_al
    from scarcelab.tracking.mlflow_tracker import MlflowTracker

    rc = ALRunConfig(strategy, "honeypot", query_size=2, repetitions=reps, overrides=TINY)
    return run_al(rc, MlflowTracker(experiment=experiment))


def test_sweep_is_a_parent_with_one_al_run_per_repetition(store: str) -> None:
    import mlflow

    res = _sweep("margin", "al-t1")
    runs = mlflow.search_runs(experiment_names=["al-t1"])
    assert len(runs) == 3
    parent = runs[runs["tags.scarcelab.role"] == "al_sweep"].iloc[0]
    kids = runs[runs["tags.scarcelab.role"] == "al"].sort_values("tags.scarcelab.repetition")
    assert len(kids) == 2 and (kids["tags.mlflow.parentRunId"] == parent.run_id).all()
    assert set(kids["tags.scarcelab.family"]) == {"active"}
    assert set(kids["tags.scarcelab.method"]) == {"margin"}
    assert kids["tags.scarcelab.seed_data"].tolist() == ["0", "1"]
    np.testing.assert_allclose(kids["metrics.al/auc"], res.aucs)  # type: ignore[attr-defined]
    hist = mlflow.MlflowClient().get_metric_history(kids.run_id.iloc[0], "al/test_accuracy")
    assert sorted(m.step for m in hist) == [2, 4, 6]
    assert parent["metrics.al/auc_mean"] == pytest.approx(res.aucs.mean())  # type: ignore


def test_al_views_rank_strategies_and_log_a_cd_diagram(store: str) -> None:
    import mlflow

    from scarcelab.tracking.al import al_report, al_runs

    for s in ("random", "margin", "coreset"):
        _sweep(s, "al-t2", reps=3)
    runs = al_runs(["al-t2"])
    assert len(runs) == 9 and set(runs.strategy) == {"random", "margin", "coreset"}
    rep = al_report(["al-t2"])
    # ranks within each repetition block, averaged: they sum to 1 + 2 + 3 per problem
    assert rep.ranks.loc[("honeypot", 2)].sum() == pytest.approx(6.0)
    blocks = runs.pivot_table(index="repetition", columns="strategy", values="auc")
    by_hand = blocks.rank(axis=1, ascending=False).mean()
    for s in by_hand.index:
        assert rep.ranks.loc[("honeypot", 2), s] == pytest.approx(by_hand[s])
    assert rep.friedman is not None and 0.0 <= rep.friedman[1] <= 1.0
    arts = {a.path for a in mlflow.MlflowClient().list_artifacts(rep.run_id)}
    assert {"al_cd_diagram.png", "al_ranks.csv", "al_scores.csv"} <= arts


def test_cli_al_command_and_strategy_listing(store: str) -> None:
    from scarcelab.entrypoints.cli import main

    r = CliRunner().invoke(main, ["list", "strategies"])
    assert r.exit_code == 0
    from scarcelab.active import STRATEGIES

    assert r.output.splitlines() == [f"{n}\tstrategy" for n in STRATEGIES.names()]
    assert "badge" in STRATEGIES
    r = CliRunner().invoke(main, ["al", "--strategy", "badge", "--dataset", "honeypot",
                                  "--query-size", "2", "--budget", "2", "--set",
                                  "max_epochs=2,hidden=8x4", "--experiment", "al-t3"])
    assert r.exit_code == 0, r.output
    assert "badge on honeypot q=2: AUC" in r.output
    import mlflow

    runs = mlflow.search_runs(experiment_names=["al-t3"])
    parent = runs[runs["tags.scarcelab.role"] == "al_sweep"].iloc[0]
    assert parent["params.al.hidden"] == "[8, 4]" and parent["params.al.budget"] == "2"


def test_cli_early_stop_on_test_reproduces_the_leak_and_tags_it(store: str) -> None:
    """``--early-stop-on test`` (MLproject ``early_stop_on``): CDALBench's earlier protocol,
    stopping on the test loss with no validation split, logged as such on every run."""
    import mlflow

    from scarcelab.entrypoints.cli import main

    r = CliRunner().invoke(main, ["al", "--strategy", "random", "--dataset", "honeypot",
                                  "--budget", "2", "--set", "max_epochs=2,hidden=8x4",
                                  "--early-stop-on", "test", "--experiment", "al-leak"])
    assert r.exit_code == 0, r.output
    runs = mlflow.search_runs(experiment_names=["al-leak"])
    parent = runs[runs["tags.scarcelab.role"] == "al_sweep"].iloc[0]
    assert parent["params.al.stop_on"] == "test" and parent["params.al.val_fraction"] == "0.0"
    assert runs["tags.scarcelab.leak"].str.contains("test-set early stopping").all()


def test_partial_strategy_is_ranked_where_run_and_left_out_of_the_cd_diagram() -> None:
    import pandas as pd

    from scarcelab.tracking.al import cd_blocks, rank_table

    rows = []
    for ds, base in (("a", 0.7), ("b", 0.8)):
        for k in range(3):
            for s, off in (("x", 0.02), ("y", 0.0), ("z", -0.02)):
                rows.append((ds, 1, s, k, base + off + 0.001 * k))
    rows += [("a", 1, "oracle", k, 0.9) for k in range(3)]  # run on problem "a" only
    runs = pd.DataFrame(rows, columns=["dataset", "query_size", "strategy", "repetition",
                                       "auc"])
    ranks = rank_table(runs)
    assert ranks.loc[("a", 1), "oracle"] == 1.0 and ranks.loc[("a", 1), "x"] == 2.0
    assert pd.isna(ranks.loc[("b", 1), "oracle"]) and ranks.loc[("b", 1), "x"] == 1.0
    scores = cd_blocks(runs)  # (dataset, query size, repetition) blocks, CDALBench's
    assert list(scores.columns) == ["x", "y", "z"] and len(scores) == 6
    assert pd.isna(ranks.loc[("mean", "all"), "oracle"])
    assert ranks.loc[("mean", "all"), "x"] == 1.0


def _enc_cli(experiment: str, *extra: str) -> object:
    from scarcelab.entrypoints.cli import main

    r = CliRunner().invoke(main, ["al", "--strategy", "margin", "--dataset",
                                  "encoded_synthetic_tiny", "--query-size", "2", "--budget",
                                  "2", "--experiment", experiment, *extra])
    assert r.exit_code == 0, r.output
    return r


def test_encoding_is_cached_as_an_mlflow_artifact_and_reused_elsewhere(  # type: ignore[no-untyped-def]
        store: str, tmp_path, monkeypatch) -> None:
    import mlflow

    settings = ["--set", "encoder.epochs=1,encoder.arch=small_cnn,encoder.batch_size=64"]
    monkeypatch.setenv("SCARCELAB_DATA", str(tmp_path / "machine1"))
    monkeypatch.setenv("SCARCELAB_CACHE", str(tmp_path / "machine1"))  # encodings: a cache
    _enc_cli("al-enc", *settings)
    runs = mlflow.search_runs(experiment_names=["al-enc"])
    enc = runs[runs["tags.scarcelab.role"] == "encoding"]
    assert len(enc) == 1
    key, enc_id = enc["tags.scarcelab.encoding_key"].iloc[0], enc.run_id.iloc[0]
    arts = {a.path for a in mlflow.MlflowClient().list_artifacts(enc_id, "encoding")}
    assert arts == {f"encoding/{key}.npz", f"encoding/{key}.json",
                    f"encoding/{key}.encoder.pt"}
    sweep = runs[runs["tags.scarcelab.role"] == "al_sweep"].iloc[0]
    assert sweep["tags.scarcelab.encoding_key"] == key
    assert sweep["tags.scarcelab.encoding_source"] == f"computed mlflow-run:{enc_id}"
    assert sweep["params.encoder.method"] == "simclr"

    # A second machine (empty local cache) downloads the artifact instead of retraining.
    monkeypatch.setenv("SCARCELAB_DATA", str(tmp_path / "machine2"))
    monkeypatch.setenv("SCARCELAB_CACHE", str(tmp_path / "machine2"))
    _enc_cli("al-enc", *settings)
    runs = mlflow.search_runs(experiment_names=["al-enc"])
    assert (runs["tags.scarcelab.role"] == "encoding").sum() == 1
    newest = runs[runs["tags.scarcelab.role"] == "al_sweep"].sort_values("start_time").iloc[-1]
    assert newest["tags.scarcelab.encoding_source"] == f"mlflow-run:{enc_id}"
    assert (tmp_path / "machine2" / "encoded" / f"{key}.npz").is_file()


def test_encoder_can_be_a_logged_scarcelab_model(store: str, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import mlflow
    import torch

    from scarcelab.models import create_model
    from scarcelab.models.classifier import ExportedClassifier

    monkeypatch.setenv("SCARCELAB_DATA", str(tmp_path))
    with torch.random.fork_rng():
        torch.manual_seed(0)
        bb = create_model("small_cnn", in_channels=1)
        model = ExportedClassifier(bb, torch.nn.Linear(bb.num_features, 3), ["a", "b", "c"])
    mlflow.set_experiment("al-pre")
    with mlflow.start_run(tags={"scarcelab.arch": "small_cnn"}) as run:  # as a study's run
        mlflow.pytorch.log_model(model, name="model", serialization_format="pt2",
                                 input_example=torch.rand(2, 1, 28, 28).numpy())
    uri = f"runs:/{run.info.run_id}/model"
    _enc_cli("al-pre", "--encoder", uri)
    runs = mlflow.search_runs(experiment_names=["al-pre"])
    sweep = runs[runs["tags.scarcelab.role"] == "al_sweep"].iloc[0]
    assert sweep["tags.scarcelab.encoding_source"].startswith("computed mlflow-run:")
    enc = runs[runs["tags.scarcelab.role"] == "encoding"].iloc[0]
    assert enc["params.source"] == uri and enc["params.encoder"] == "pretrained"
    from scarcelab.entrypoints.cli import main

    r = CliRunner().invoke(main, ["al", "--strategy", "margin", "--dataset",
                                  "encoded_synthetic_tiny", "--encoder", uri, "--set",
                                  "encoder.epochs=3", "--experiment", "al-pre"])
    assert r.exit_code != 0 and "not to a logged model" in r.output


# -- al_report, al_runs, log_report (mutation sample, docs/mutation.md) ----------------
@pytest.fixture(scope="module")
def al_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A sqlite store with experiment ``al-uri``: strategies s1 > s2 > s3 on one dataset and
    query size, repetitions 0 and 1 (AUCs logged as by ``scarcelab.active.loop``)."""
    import mlflow
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    shm = Path("/dev/shm")  # sqlite on tmpfs when there is one: MLflow commits every call
    tmp = Path(tempfile.mkdtemp(prefix="scarcelab-alq-", dir=shm)) if shm.is_dir() \
        else tmp_path_factory.mktemp("alq")
    uri = f"sqlite:///{tmp / 'a.db'}"
    c = MlflowClient(tracking_uri=uri)
    exp = c.create_experiment("al-uri", artifact_location=str(tmp / "art"))
    for s, aucs in {"s1": [0.9, 0.8], "s2": [0.7, 0.6], "s3": [0.5, 0.4]}.items():
        for rep, a in enumerate(aucs):
            r = c.create_run(exp, tags={
                "scarcelab.role": "al", "scarcelab.dataset": "honeypot",
                "scarcelab.query_size": "2", "scarcelab.method": s,
                "scarcelab.repetition": str(rep)})
            c.log_batch(r.info.run_id, metrics=[Metric("al/auc", a, 0, 0)])
            c.set_terminated(r.info.run_id, "FINISHED")
    prev = mlflow.get_tracking_uri()
    yield {"uri": uri, "tmp": str(tmp)}
    mlflow.set_tracking_uri(prev)
    shutil.rmtree(tmp, ignore_errors=True)


def test_al_runs_repetition_is_an_integer_column(al_store):
    from scarcelab.tracking.al import al_runs

    runs = al_runs(["al-uri"], al_store["uri"])
    assert pd.api.types.is_integer_dtype(runs["repetition"])
    assert pd.api.types.is_integer_dtype(runs["query_size"])
    assert sorted(runs["repetition"].unique().tolist()) == [0, 1]


def test_al_report_reads_the_store_it_is_given(al_store, tmp_path):
    """``tracking_uri`` names the store to read even when the process points elsewhere."""
    import mlflow

    from scarcelab.tracking.al import al_report

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'elsewhere.db'}")
    rep = al_report(["al-uri"], tracking_uri=al_store["uri"], log=False)
    assert list(rep.scores.columns) == ["s1", "s2", "s3"]
    assert rep.scores.to_numpy().tolist() == [[0.9, 0.7, 0.5], [0.8, 0.6, 0.4]]
    assert rep.run_id is None


def test_log_report_logs_into_the_run_mlflow_projects_opened(al_store, tmp_path, monkeypatch):
    """Under ``mlflow run`` (MLFLOW_RUN_ID set) the report goes into that run, which keeps
    the name MLflow Projects gave it; no new run named ``report`` appears."""
    import mlflow
    import mlflow.tracking.fluent as fluent
    from mlflow import MlflowClient

    from scarcelab.tracking.query.report import log_report

    c = MlflowClient(tracking_uri=al_store["uri"])
    exp = c.create_experiment("projects", artifact_location=str(Path(al_store["tmp"]) / "pa"))
    run = c.create_run(exp, run_name="projects-run")
    mlflow.set_tracking_uri(al_store["uri"])
    monkeypatch.setattr(fluent, "_active_experiment_id", None)  # as in a fresh process
    monkeypatch.setenv("MLFLOW_RUN_ID", run.info.run_id)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_ID", exp)
    (tmp_path / "report.html").write_text("<html></html>")
    got = log_report({"report.html": tmp_path / "report.html"}, "ignored-under-projects",
                     run_name="report")
    assert got == run.info.run_id
    after = c.get_run(got)
    assert after.info.run_name == "projects-run"
    assert after.data.tags["scarcelab.role"] == "report"
    assert [a.path for a in c.list_artifacts(got, "report")] == ["report/report.html"]
    assert [r.info.run_id for r in c.search_runs([exp])] == [run.info.run_id]
    assert c.get_experiment_by_name("ignored-under-projects") is None
