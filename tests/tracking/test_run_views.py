"""What a study run shows in the MLflow UI (issue 16): figures, description, unique trial
names, system metrics, a registered model — through a real embedded MLflow store."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from scarcelab.entrypoints.cli import main

TINY = ["--dataset", "synthetic_tiny", "--arch", "small_cnn", "--device", "cpu",
        "--max-epochs", "2", "--patience", "2", "--batch-size", "16",
        "--max-steps-per-epoch", "3", "--max-trials", "2", "--budget-minutes", "5"]


@pytest.fixture
def store(store, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """conftest's store with this module's extras, as its own copy had: 1 s pip-requirement
    inference, system metrics every 0.5 s (a short study still records some), and the
    record spool in tmp_path."""
    monkeypatch.setenv("MLFLOW_REQUIREMENTS_INFERENCE_TIMEOUT", "1")
    monkeypatch.setenv("SCARCELAB_SYSTEM_METRICS_INTERVAL_S", "0.5")
    monkeypatch.setenv("SCARCELAB_SPOOL_DIR", str(tmp_path / "spool"))
    return store


def test_study_run_has_figures_description_names_system_metrics_and_registry(store):
    res = CliRunner().invoke(main, ["-q", "supervised", "--method", "sup", *TINY,
                                    "--experiment", "views", "--register-model", "tiny-sup"])
    assert res.exit_code == 0, res.output
    c = MlflowClient()
    exp = c.get_experiment_by_name("views")
    study = c.search_runs([exp.experiment_id], "tags.`scarcelab.role` = 'study'")[0]
    arts = {a.path for a in c.list_artifacts(study.info.run_id, "plots")}
    assert {"plots/test_confusion_matrix.png", "plots/test_roc.png",
            "plots/accuracy_over_time.png", "plots/search_parallel_coordinate.png",
            "plots/search_param_importances.png"} <= arts, arts
    note = study.data.tags["mlflow.note.content"]
    assert "Selected checkpoint" in note and "runs:/" in note and "Trials: 2" in note
    trials = c.search_runs([exp.experiment_id], "tags.`scarcelab.role` = 'trial'")
    names = sorted(t.info.run_name for t in trials)
    assert names == ["sup-synthetic_tiny-s0/t00", "sup-synthetic_tiny-s0/t01"]
    assert any(k.startswith("system/") for k in study.data.metrics), study.data.metrics.keys()
    versions = c.search_model_versions("name = 'tiny-sup'")
    assert len(versions) == 1 and versions[0].run_id == study.info.run_id


def test_al_sweep_run_has_learning_curves(store):
    res = CliRunner().invoke(main, ["-q", "al", "--strategy", "random", "--dataset",
                                    "honeypot", "--query-size", "5", "--budget", "20",
                                    "--repetitions", "2", "--experiment", "al-views"])
    assert res.exit_code == 0, res.output
    c = MlflowClient()
    exp = c.get_experiment_by_name("al-views")
    sweep = c.search_runs([exp.experiment_id], "tags.`scarcelab.role` = 'al_sweep'")[0]
    arts = {a.path for a in c.list_artifacts(sweep.info.run_id, "plots")}
    assert "plots/learning_curves.png" in arts
    assert "2 repetitions" in sweep.data.tags["mlflow.note.content"]
