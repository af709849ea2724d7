"""A budget too short for a trial's schedules says so (issue 43 §3: a 0.5-minute study
ended at chance with no warning): when the selected trial ended before its learning-rate
cosine reached its end, or before the method's unlabeled-loss weight reached its full
value, the closing summary has one warning line and the study run's description (the
MLflow UI's Description) carries it; a study whose schedules completed has neither.
Against a real sqlite MLflow store, through the CLI."""

from __future__ import annotations

import mlflow
import pytest
from click.testing import CliRunner
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

from scarcelab.methods import get_method
from scarcelab.protocols.search import StudyConfig, schedule_warning

ARGS = ["semi", "--method", "mixmatch", "--dataset", "synthetic_tiny", "--arch", "small_cnn",
        "--device", "cpu", "--batch-size", "8", "--unlabeled-batch-size", "16",
        "--max-steps-per-epoch", "2", "--max-trials", "1", "--diag-samples", "0",
        "--patience", "1000", "--schedule-horizon", "epochs"]


def _study(experiment: str, *extra: str) -> tuple[str, str, dict[str, str]]:
    from scarcelab.entrypoints.cli import main

    r = CliRunner().invoke(main, [*ARGS, "--experiment", experiment, *extra])
    assert r.exit_code == 0, r.output
    runs = mlflow.search_runs(experiment_names=[experiment])
    study = runs[runs["tags.scarcelab.role"] == "study"].iloc[0]
    tags = MlflowClient().get_run(study.run_id).data.tags
    return r.output, tags[MLFLOW_RUN_NOTE], tags


def test_a_budget_that_cuts_the_schedules_short_says_so_at_the_end_and_in_the_description(
        store) -> None:  # type: ignore[no-untyped-def]
    # 5,000 epochs of 2 steps planned (the papers' plan), 12 s of budget: a few hundred
    # steps at most on CPU, short of the plan and of mixmatch's ramp (its first 40 %)
    out, desc, tags = _study("short", "--max-epochs", "5000", "--budget-minutes", "0.2")
    warn = [ln for ln in out.splitlines() if "warning: schedules not finished" in ln]
    assert len(warn) == 1, out
    assert "learning-rate schedule at" in warn[0] and "of its plan" in warn[0]
    assert "mixmatch's unlabeled-loss weight at" in warn[0]
    assert "budget ran out" in warn[0] and "lower --max-epochs" in warn[0]
    pct = int(warn[0].split("learning-rate schedule at ")[1].split("%")[0])
    assert 0 <= pct < 100
    assert "**Warning**: schedules not finished" in desc
    assert tags["scarcelab.schedule_short"] in desc


def test_a_study_whose_schedules_complete_has_no_warning(store) -> None:  # type: ignore[no-untyped-def]
    out, desc, tags = _study("done", "--max-epochs", "2", "--budget-minutes", "1")
    assert "2 epochs in this process" in out
    assert "schedules not finished" not in out and "Warning" not in desc
    assert "scarcelab.schedule_short" not in tags


def _cfg(**kw: object) -> StudyConfig:
    return StudyConfig(**{"method": "mixmatch", "dataset": "synthetic_tiny",
                          "budget_minutes": 0.5, "schedule_horizon": "epochs", **kw})


def test_the_warning_names_what_did_not_finish_and_why() -> None:
    cfg = _cfg()
    assert schedule_warning(cfg, 0, None) == ""  # unknown end (restored checkpoint)
    assert schedule_warning(cfg, 0, (1.0, 1.0, "max_epochs")) == ""
    assert schedule_warning(cfg, 0, (1.0, None, "max_epochs")) == ""  # no ramp (fixmatch)
    w = schedule_warning(cfg, 3, (0.5, None, "patience"))
    assert "trial 3" in w and "learning-rate schedule at 50%" in w
    assert "unlabeled" not in w and "early stopping (patience)" in w
    # the schedule ended but a ramp longer than the plan did not reach its full weight
    w = schedule_warning(_cfg(schedule_horizon="budget"), 1, (1.0, 0.8, "horizon"))
    assert "learning-rate" not in w and "unlabeled-loss weight at 80%" in w
    assert "--schedule-horizon budget" in w and "--max-epochs" not in w
    w = schedule_warning(cfg, 0, (0.1, 0.25, "budget"))
    assert "0.5-minute budget ran out" in w and "at 10%" in w and "at 25%" in w


@pytest.mark.parametrize("name,ramped", [("mixmatch", True), ("meanteacher", True),
                                         ("pseudolabel", True), ("ds3l", True),
                                         ("fixmatch", False), ("sup", False)])
def test_methods_with_an_unlabeled_weight_ramp_report_its_share(name: str,
                                                                ramped: bool) -> None:
    from scarcelab.models import create_model

    cls = get_method(name)
    m = cls(create_model("small_cnn", in_channels=1), 2, dict(cls.defaults))
    if not ramped:
        assert m.unlabeled_ramp(0.1) is None
        return
    assert m.unlabeled_ramp(1.0) == pytest.approx(1.0)
    assert 0.0 <= m.unlabeled_ramp(0.05) < 1.0
