"""Trial runs say what they are in the MLflow UI's Description, and counts read as English
("1 trial", not "1 trials") in figure titles and the closing summary (issue 43 §3).
Against a real sqlite MLflow store."""

from __future__ import annotations

import mlflow
from click.testing import CliRunner
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

from scarcelab.tracking import plots
from scarcelab.tracking.run_views import counted


def test_trial_runs_have_a_description_naming_study_trial_and_hyperparameters(store):  # type: ignore[no-untyped-def]
    from scarcelab.entrypoints.cli import main

    r = CliRunner().invoke(main, [
        "semi", "--method", "fixmatch", "--dataset", "synthetic_tiny", "--arch", "small_cnn",
        "--device", "cpu", "--max-epochs", "2", "--batch-size", "16",
        "--max-steps-per-epoch", "2", "--max-trials", "1", "--budget-minutes", "1",
        "--experiment", "desc"])
    assert r.exit_code == 0, r.output
    assert "1 trial (0 failed), 2 epochs in this process" in r.output  # was "1 trials"
    runs = mlflow.search_runs(experiment_names=["desc"])
    study = runs[runs["tags.scarcelab.role"] == "study"].iloc[0]
    trial = runs[runs["tags.scarcelab.role"] == "trial"].iloc[0]
    text = MlflowClient().get_run(trial.run_id).data.tags[MLFLOW_RUN_NOTE]
    assert text.startswith(f"**Trial 0** of study **{study['tags.mlflow.runName']}** "
                           f"(run `{study.run_id}`).")
    assert "Study: method=fixmatch, dataset=synthetic_tiny, seed=0, budget_minutes=1" in text
    hp = MlflowClient().get_run(trial.run_id).data.params
    assert "Hyperparameters: " in text and all(f"{k}=" in text for k in hp)
    assert "best on validation balanced accuracy" in text
    assert "Ended FINISHED after 2 evaluations; best validation balanced accuracy" in text


def test_counts_read_as_english() -> None:
    assert counted(1, "trial") == "1 trial" and counted(2, "trial") == "2 trials"
    assert counted(0, "epoch") == "0 epochs" and counted(1, "repetition") == "1 repetition"
    one = plots.trials_profile_figure({0: [(5, .5, .4), (9, .6, .5)]})
    assert one.axes[0].get_title().endswith("(1 trial)")
    two = plots.trials_profile_figure({0: [(5, .5, .4)], 1: [(12, .7, .6)]})
    assert two.axes[0].get_title().endswith("(2 trials)")
