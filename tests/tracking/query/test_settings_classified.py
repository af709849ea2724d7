"""Every param a study logs is classified for the leaderboard (issue 44 item 2): part of the
row key since the start, added later with the value older studies ran with
(``ADDED_SETTINGS``), or not a setting (``NOT_SETTINGS``). An unclassified new option
would split an older study and a newer one of the same configuration onto two rows, as
``probe_solver``, ``eval_every_steps``, ``schedule_horizon`` and the own-image options did
until this test, and ``--diag-samples 0`` vs ``512`` did (issue 44's example)."""

from __future__ import annotations

import mlflow
import pandas as pd
from click.testing import CliRunner

from scarcelab.tracking.query.frame import (
    ADDED_SETTINGS,
    NOT_SETTINGS,
    SETTINGS_BEFORE_ADDED,
    study_settings,
)

TINY = ["--dataset", "synthetic_tiny", "--arch", "small_cnn", "--device", "cpu",
        "--max-epochs", "2", "--batch-size", "8", "--max-steps-per-epoch", "2",
        "--max-trials", "1", "--budget-minutes", "1", "--budget-clock", "cpu", "-q"]
STUDIES = {"supervised": ["--method", "sup"],
           "semi": ["--method", "fixmatch", "--unlabeled-batch-size", "16"],
           "self": ["--method", "simclr"]}


def _study(cmd: str, *extra: str) -> pd.DataFrame:
    from scarcelab.entrypoints.cli import main

    r = CliRunner().invoke(main, [cmd, *STUDIES[cmd], *TINY, *extra])
    assert r.exit_code == 0, r.output
    runs = mlflow.search_runs(search_all_experiments=True)
    return runs[runs["tags.scarcelab.role"] == "study"]


def test_every_param_a_study_logs_is_classified(store) -> None:  # type: ignore[no-untyped-def]
    for cmd in STUDIES:
        studies = _study(cmd)
    names = {c[len("params."):] for c in studies.columns  # the studies' own params
             if c.startswith("params.") and studies[c].notna().any()}
    names = {n for n in names if not n.startswith(("resolved.", "hparams.", "override."))}
    assert len(studies) == 3 and {"method", "precision", "seed"} <= names
    unclassified = names - SETTINGS_BEFORE_ADDED - set(ADDED_SETTINGS) - NOT_SETTINGS
    assert not unclassified, (
        f"params no leaderboard rule classifies: {sorted(unclassified)}; add each to "
        "ADDED_SETTINGS (with the value studies logged before it ran with) or NOT_SETTINGS "
        "(tracking/query/frame.py)")
    assert not set(ADDED_SETTINGS) & SETTINGS_BEFORE_ADDED
    assert not NOT_SETTINGS & set(ADDED_SETTINGS)


def test_an_older_study_and_a_newer_one_of_the_same_configuration_are_one_row() -> None:
    base = {"params.method": "sup", "params.dataset": "breastmnist", "params.seed": "0",
            "params.budget_minutes": "3", "params.n_labeled": "100"}
    old = dict(base, run_id="old")  # logged before the added settings existed
    new = dict(base, run_id="new", **{f"params.{k}": v for k, v in ADDED_SETTINGS.items()},
               **{"params.diag_samples": "0"})
    other = dict(new, run_id="bf16", **{"params.precision": "bf16"})
    s = study_settings(pd.DataFrame([old, new, other]))
    assert s.loc["old"].equals(s.loc["new"])
    assert not s.loc["new"].equals(s.loc["bf16"])
    budget = dict(new, run_id="budget", **{"params.schedule_horizon": "budget"})
    s = study_settings(pd.DataFrame([old, budget]))
    assert not s.loc["old"].equals(s.loc["budget"])  # planned differently: another row


def test_diag_samples_does_not_change_what_a_study_trains(store) -> None:  # type: ignore[no-untyped-def]
    """Why ``diag_samples`` is not a setting: the diagnostics read a scratch copy of the
    model outside the budget, so the trials' losses are the same for 0 and 512 samples."""
    losses = {}
    for samples in ("0", "512"):
        _study("semi", "--diag-samples", samples, "--seed", "3", "--max-trials", "2",
               "--experiment", f"diag-{samples}")
        trials = mlflow.search_runs(experiment_names=[f"diag-{samples}"],
                                    filter_string="tags.`scarcelab.role` = 'trial'",
                                    order_by=["start_time ASC"])
        got = trials[["metrics.train/loss", "metrics.train/loss_labeled",
                      "metrics.val/balanced_accuracy"]]
        assert len(got) == 2 and got.notna().all().all()
        losses[samples] = got.round(7).to_numpy().tolist()
    assert losses["0"] == losses["512"]
