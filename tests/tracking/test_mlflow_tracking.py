"""The MLflow side against a real (file-backed sqlite) tracking store, never a mock."""

import mlflow
import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from scarcelab.errors import TrialFailed
from scarcelab.protocols.search import StudyConfig, run_study
from scarcelab.tracking.leaderboard import leaderboard, load_studies
from scarcelab.tracking.mlflow_tracker import MlflowTracker


def _study(method, seed=0, **kw):
    cfg = dict(method=method, dataset="synthetic_tiny", budget_minutes=0.5, max_epochs=2,
               patience=2, batch_size=16, unlabeled_batch_size=32, max_steps_per_epoch=4,
               max_trials=2, arch="small_cnn", device="cpu", seed=seed)
    cfg.update(kw)
    tracker = MlflowTracker(experiment="unit")
    res = run_study(StudyConfig(**cfg), tracker)
    return tracker.study_run_id, res


def test_study_and_trials_land_in_mlflow(store):
    run_id, res = _study("fixmatch")
    c = MlflowClient()
    study = c.get_run(run_id)
    assert study.info.status == "FINISHED"
    t = study.data.tags
    assert t["scarcelab.role"] == "study" and t["scarcelab.family"] == "semi"
    assert t["scarcelab.method"] == "fixmatch" and t["scarcelab.split_hash"] == res.split_hash
    assert t["scarcelab.dataset"] == "synthetic_tiny" and t["scarcelab.seed"] == "0"
    assert "scarcelab.version" in t
    assert study.data.params["arch"] == "small_cnn"
    m = study.data.metrics
    assert m["best/val_balanced_accuracy"] == pytest.approx(res.best_val)
    assert m["best/test_balanced_accuracy"] == pytest.approx(res.best_test["balanced_accuracy"])
    trials = mlflow.search_runs(experiment_ids=[study.info.experiment_id],
                                filter_string=f"tags.`mlflow.parentRunId` = '{run_id}'")
    assert len(trials) == 2 and set(trials["tags.scarcelab.role"]) == {"trial"}
    tid = trials.iloc[0].run_id
    hist = c.get_metric_history(tid, "val/balanced_accuracy")
    assert [h.step for h in hist] == list(range(len(hist))) and len(hist) >= 1
    for key in ("train/loss", "train/loss_labeled", "train/loss_unlabeled", "train/mask_rate",
                "test/auroc", "test/pauroc_spec90", "test/sensitivity_at_spec95",
                "time/elapsed_s"):
        assert c.get_metric_history(tid, key), key
    arts = {a.path for a in c.list_artifacts(run_id)}
    assert {"split.json", "config.json", "checkpoints"} <= arts
    split = mlflow.artifacts.load_dict(f"runs:/{run_id}/split.json")
    assert split["hash"] == res.split_hash
    ckpt_path = mlflow.artifacts.download_artifacts(f"runs:/{run_id}/checkpoints/best.pt")
    ckpt = torch.load(ckpt_path, weights_only=True)
    assert ckpt["val_balanced_accuracy"] == pytest.approx(res.best_val)
    assert study.inputs.dataset_inputs[0].dataset.name == "synthetic_tiny"
    # the final model, loaded back through MLflow, predicts with the best checkpoint
    model_uri = f"runs:/{run_id}/model"
    model = mlflow.pytorch.load_model(model_uri)
    from scarcelab.data import load_raw

    raw = load_raw("synthetic_tiny")
    pred = model(torch.as_tensor(raw.test_x).float() / 255).argmax(1).numpy()
    assert (pred == raw.test_y).mean() == pytest.approx(res.best_test["accuracy"])


def test_failed_study_marked_failed(store):
    with pytest.raises(TrialFailed, match="all 2 trials of sup failed.*could not convert"):
        _study("sup", overrides={"lr": "not-a-number"})
    runs = mlflow.search_runs(experiment_names=["unit"])
    study = runs[runs["tags.scarcelab.role"] == "study"]
    assert list(study["status"]) == ["FAILED"]


def test_leaderboard(store):
    ids = [_study("sup", seed=s, max_trials=1)[1] for s in (0, 1)]
    _study("fixmatch", seed=0, max_trials=1)
    studies = load_studies("unit")
    assert len(studies) == 3
    lb = leaderboard("unit")
    row = lb[(lb.dataset == "synthetic_tiny") & (lb.method == "sup")].iloc[0]
    assert row["n"] == 2
    expect = np.mean([r.best_test["balanced_accuracy"] for r in ids])
    assert row["test_balanced_accuracy_mean"] == pytest.approx(expect)
    assert set(lb.method) == {"sup", "fixmatch"}
    with pytest.raises(ValueError, match="no MLflow experiment named 'nope'"):
        leaderboard("nope")


def test_resume_reconciles_runs_with_the_optuna_trial_states(store, tmp_path):
    """The two-store window, made deterministic: a dead process left its study run and two
    trial runs RUNNING — trial 1 complete in Optuna (the kill came after `tell`), trial 2
    not. Running the command again closes trial 1's run FINISHED (tagged as reconciled) and
    trial 2's FAILED, and redoes neither."""
    import socket
    import subprocess

    import optuna

    storage = f"sqlite:///{tmp_path}/optuna.db"
    run_id, _ = _study("sup", storage=storage, max_trials=2)
    c = MlflowClient()
    study = c.get_run(run_id)
    kids = {r.data.tags["scarcelab.trial"]: r for r in c.search_runs(
        [study.info.experiment_id], f"tags.`mlflow.parentRunId` = '{run_id}'")}
    assert set(kids) == {"0", "1"}
    dead = subprocess.Popen(["true"])
    dead.wait()
    c.set_tag(run_id, "scarcelab.owner", f"{socket.gethostname()}:{dead.pid}")
    c.update_run(run_id, status="RUNNING")
    c.update_run(kids["1"].info.run_id, status="RUNNING")
    orphan = c.create_run(study.info.experiment_id, tags={
        "mlflow.parentRunId": run_id, "scarcelab.role": "trial", "scarcelab.trial": "2"})
    ostudy = optuna.load_study(study_name=study.data.tags["scarcelab.optuna_study"],
                               storage=storage)
    assert [t.state for t in ostudy.trials] == [optuna.trial.TrialState.COMPLETE] * 2

    run_id2, _ = _study("sup", storage=storage, max_trials=2)
    assert run_id2 == run_id  # the same study run continued
    t1 = c.get_run(kids["1"].info.run_id)
    assert t1.info.status == "FINISHED" and "scarcelab.reconciled" in t1.data.tags
    t2 = c.get_run(orphan.info.run_id)
    assert t2.info.status == "FAILED"
    assert t2.data.tags["scarcelab.error"] == "the process running this trial died"
    assert c.get_run(kids["0"].info.run_id).info.status == "FINISHED"
    assert len(optuna.load_study(study_name=study.data.tags["scarcelab.optuna_study"],
                                 storage=storage).trials) == 2  # nothing redone


def test_experiment_created_concurrently_is_reused(store, monkeypatch):
    """Two workers starting together both see no experiment and both create it: the loser
    of that race must use the winner's experiment, not fail (seen once in the two-worker
    e2e test)."""
    from scarcelab.tracking import mlflow_tracker as mt

    winner = MlflowClient().create_experiment("raced")
    real = MlflowClient.get_experiment_by_name
    calls = []

    def stale_then_real(self, name):  # the first look happens before the winner's create
        calls.append(name)
        return None if len(calls) == 1 else real(self, name)
    monkeypatch.setattr(MlflowClient, "get_experiment_by_name", stale_then_real)
    assert mt._experiment_id("raced") == winner
    assert calls == ["raced", "raced"]


def _as_killed(c, run_id):  # type: ignore[no-untyped-def]
    """Make a study run look like one whose process was killed (RUNNING, owner dead)."""
    import socket
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()
    c.set_tag(run_id, "scarcelab.owner", f"{socket.gethostname()}:{dead.pid}")
    c.update_run(run_id, status="RUNNING")


def test_a_resumed_study_with_nothing_left_to_train_keeps_its_scores_and_trials(
        store, tmp_path, monkeypatch):
    """Issue 25 item 8: a study killed after its last trial (e.g. in log_model) and run
    again under ``mlflow run`` (a new run continues the dead one) trained nothing, logged no
    ``best/*`` and so was missing from the leaderboard, its trials left under the old, now
    FAILED, run. Now the run that owns the study carries the whole series, its trials hang
    under it, and the leaderboard counts it once."""
    storage = f"sqlite:///{tmp_path}/optuna.db"
    first, res = _study("sup", storage=storage, max_trials=2)
    c = MlflowClient()
    old = c.get_run(first)
    exp = old.info.experiment_id
    series = {k: [(m.step, m.value) for m in c.get_metric_history(first, k)]
              for k in old.data.metrics if k.startswith(("best/", "time/"))}
    assert series["best/val_balanced_accuracy"]
    trials = {r.info.run_id for r in c.search_runs(
        [exp], f"tags.`mlflow.parentRunId` = '{first}'")}
    assert len(trials) == 2
    _as_killed(c, first)

    launcher = c.create_run(exp).info.run_id  # what `mlflow run` creates for the re-run
    monkeypatch.setenv("MLFLOW_RUN_ID", launcher)
    second, res2 = _study("sup", storage=storage, max_trials=2)
    monkeypatch.delenv("MLFLOW_RUN_ID")
    assert second == launcher and res2.n_trials == 2  # nothing trained again
    assert res2.best_val == pytest.approx(res.best_val)
    new = c.get_run(second)
    assert new.info.status == "FINISHED"
    assert new.data.tags["scarcelab.resumed_from"] == first
    m = new.data.metrics
    assert m["best/val_balanced_accuracy"] == pytest.approx(res.best_val)
    assert m["best/test_balanced_accuracy"] == pytest.approx(res.best_test["balanced_accuracy"])
    for key, points in series.items():  # the dead run's series, carried over
        got = [(x.step, x.value) for x in c.get_metric_history(second, key)]
        assert got[:len(points)] == points, key
    moved = c.search_runs([exp], f"tags.`mlflow.parentRunId` = '{second}'")
    assert {r.info.run_id for r in moved} == trials  # the trials now hang under it
    assert {r.data.tags["scarcelab.moved_from"] for r in moved} == {first}
    assert not c.search_runs([exp], f"tags.`mlflow.parentRunId` = '{first}'")
    assert c.get_run(first).info.status == "FAILED"
    assert c.get_run(first).data.tags["scarcelab.resumed_by"] == second

    studies = load_studies("unit")
    assert list(studies["run_id"]) == [second]  # in the leaderboard, once
    assert studies.iloc[0]["test_balanced_accuracy"] == pytest.approx(
        res.best_test["balanced_accuracy"])
    row = leaderboard("unit").iloc[0]
    assert row["n"] == 1 and row["method"] == "sup"
