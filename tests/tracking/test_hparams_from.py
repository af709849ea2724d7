"""``hparams_from`` (issue 12 item 10): the transfer strategy's configuration is looked up
in a real MLflow store (a study run, a trial run or an experiment) and passed into the core
as a plain dict."""

from __future__ import annotations

import pytest

from scarcelab.errors import ConfigError
from scarcelab.methods import METHODS
from scarcelab.protocols.search import StudyConfig, run_study
from scarcelab.tracker import InMemoryTracker

CFG = dict(method="sup", dataset="synthetic_tiny", budget_minutes=0.5, max_epochs=1,
           patience=5, batch_size=16, max_steps_per_epoch=2, arch="small_cnn", device="cpu")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        yield from _store(tmp_path_factory.mktemp("hparams"), mp)


def _store(tmp_path, monkeypatch):
    import mlflow
    from mlflow.tracking import MlflowClient

    from scarcelab.tracking.mlflow_tracker import MlflowTracker

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.setenv("SCARCELAB_SPOOL_DIR", str(tmp_path / "spool"))
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    client = MlflowClient()
    client.create_experiment("tissue-source", artifact_location=str(tmp_path / "art"))

    class NoModel(MlflowTracker):  # log_model (~10 s) is not under test
        def log_model(self, model, example):
            pass

    runs = []
    for seed in (0, 1):  # two studies: the experiment lookup must take the better one
        tr = NoModel(experiment="tissue-source")
        res = run_study(StudyConfig(**CFG, seed=seed, max_trials=3), tr)
        runs.append((tr.study_run_id, res))
    yield client, runs
    mlflow.set_tracking_uri("")


def test_configuration_from_a_study_run_a_trial_run_and_an_experiment(store):
    from scarcelab.tracking.hparams import resolve_hparams

    client, runs = store
    (rid, res), _ = runs
    hp, label = resolve_hparams(rid, "sup")
    want = {k: res.best_checkpoint["hp"][k] for k in ("lr", "weight_decay")}
    assert {k: hp[k] for k in want} == pytest.approx(want)
    assert isinstance(hp["lr"], float) and set(hp) <= set(METHODS.get("sup").defaults) | set(
        METHODS.get("sup").search_space)
    assert label == f"run {rid}, trial {res.best_trial} (synthetic_tiny)"
    trial = client.search_runs(
        [client.get_run(rid).info.experiment_id],
        f"tags.`mlflow.parentRunId` = '{rid}' and tags.`scarcelab.trial` = '{res.best_trial}'")[0]
    assert resolve_hparams(trial.info.run_id, "sup")[0] == hp
    best_rid, best_res = max(runs, key=lambda r: r[1].best_val)
    hp_e, label_e = resolve_hparams("tissue-source", "sup")
    assert label_e.startswith(f"experiment tissue-source: study {best_rid}")
    assert hp_e["lr"] == pytest.approx(best_res.best_checkpoint["hp"]["lr"])
    assert resolve_hparams("defaults", "sup") == (None, "defaults")
    # the resolved dict drives a transfer study on another seed / dataset
    t = InMemoryTracker()
    run_study(StudyConfig(**{**CFG, "seed": 5}, search="none", transfer_epochs=1,
                          hparams=hp_e, hparams_source=label_e), t)
    assert t.trials[0].params["lr"] == pytest.approx(best_res.best_checkpoint["hp"]["lr"])
    assert t.study.tags["scarcelab.hparams_source"] == label_e


def test_unknown_source_or_other_method_is_a_clear_error(store):
    from scarcelab.tracking.hparams import resolve_hparams

    _, runs = store
    with pytest.raises(ConfigError, match="hparams_from='nosuch'.*no MLflow run or experiment"):
        resolve_hparams("nosuch", "sup")
    with pytest.raises(ConfigError, match="for method 'sup', not 'fixmatch'"):
        resolve_hparams(runs[0][0], "fixmatch")
    with pytest.raises(ConfigError, match="no finished study of 'fixmatch'"):
        resolve_hparams("tissue-source", "fixmatch")


def test_cli_options_reach_the_study_config(store):
    from scarcelab.entrypoints.cli import (
        main,  # registers the commands (entrypoints.study among them)
    )
    from scarcelab.entrypoints.study import study_config

    _, runs = store
    args = ["--method", "sup", "--dataset", "synthetic_tiny", "--arch", "small_cnn",
            "--budget-minutes", "1", "--max-epochs", "2", "--patience", "2", "--search",
            "none", "--device", "cpu", "--diag-samples", "0", "--val-from", "train",
            "--hparams-from", runs[0][0], "--transfer-epochs", "80"]
    kw = main.commands["supervised"].make_context("supervised", args).params
    cfg = study_config("supervised", kw)
    assert cfg.val_from == "train" and cfg.transfer_epochs == 80
    assert cfg.hparams["lr"] == pytest.approx(runs[0][1].best_checkpoint["hp"]["lr"])
    assert cfg.hparams_source.startswith(f"run {runs[0][0]}")


@pytest.mark.parametrize("extra", [[], ["--hparams-from", "defaults"]])
def test_cli_fixed_search_with_defaults_trains_the_literature_defaults(extra):
    """The help offers `defaults` for search=fixed (also its default value): the CLI used to
    refuse it with 'pass hparams_from'; it now trains the method's defaults."""
    from scarcelab.entrypoints.cli import main
    from scarcelab.entrypoints.study import study_config

    args = ["--method", "fixmatch", "--dataset", "synthetic_tiny", "--arch", "small_cnn",
            "--budget-minutes", "0.5", "--max-epochs", "1", "--max-steps-per-epoch", "2",
            "--batch-size", "8", "--unlabeled-batch-size", "8", "--search", "fixed",
            "--device", "cpu", "--diag-samples", "0", *extra]
    kw = main.commands["semi"].make_context("semi", args).params
    cfg = study_config("semi", kw)
    assert cfg.hparams == {} and cfg.hparams_source == "defaults"
    t = InMemoryTracker()
    run_study(cfg, t)
    assert len(t.trials) == 1
    assert t.trials[0].params["lr"] == METHODS.get("fixmatch").defaults["lr"]
