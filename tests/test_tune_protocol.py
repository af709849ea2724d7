"""The "Tune It or Don't Use It" protocol: ASHA pruning visible in Optuna and MLflow (an
embedded sqlite MLflow store and an sqlite Optuna storage, no mocks), the study shared by
workers, the 10 retrains, the paper's settings and trainval normalisation."""

from __future__ import annotations

import mlflow
import numpy as np
import optuna
import pytest
import torch
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from scarcelab.data import load_raw
from scarcelab.errors import ConfigError
from scarcelab.models.standardize import Standardized, channel_stats
from scarcelab.protocols.tune import SETTINGS, TuneConfig, asha_rung, prepare, run_tune
from scarcelab.tracker import InMemoryTracker


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    mlflow.set_tracking_uri(uri)
    yield uri
    while mlflow.active_run():
        mlflow.end_run()


def _cfg(tmp_path, **kw):
    base = dict(method="ce", dataset="synthetic_tiny_rgb", arch="small_cnn", epochs=2,
                grace_period=1, n_trials=5, batch_sizes=(8, 16), max_steps_per_epoch=2,
                n_final=3, storage=f"sqlite:///{tmp_path}/optuna.db", study_name="t")
    base.update(kw)
    return TuneConfig(**base)


def test_asha_prunes_and_retrains_visible_in_optuna_and_mlflow(tmp_path, store):
    from scarcelab.tracking.mlflow_tracker import MlflowTracker

    tracker = MlflowTracker(experiment="tune-unit")
    res = run_tune(_cfg(tmp_path), tracker)
    study = optuna.load_study(study_name="t", storage=f"sqlite:///{tmp_path}/optuna.db")
    states = [t.state for t in study.get_trials()]
    assert states.count(TrialState.PRUNED) >= 1 and states.count(TrialState.COMPLETE) >= 1
    assert len(states) == 5 and res.n_pruned == states.count(TrialState.PRUNED)
    c = MlflowClient()
    srun = c.get_run(tracker.study_run_id)
    assert srun.info.status == "FINISHED" and srun.data.tags["scarcelab.protocol"] == "tune"
    exp = srun.info.experiment_id
    children = c.search_runs([exp], f"tags.`mlflow.parentRunId` = '{tracker.study_run_id}'")
    trials = [r for r in children if r.data.tags["scarcelab.role"] == "trial"]
    retrains = [r for r in children if r.data.tags["scarcelab.role"] == "retrain"]
    pruned = [r for r in trials if r.data.tags.get("scarcelab.pruned") == "true"]
    assert len(trials) == 5 and len(pruned) == res.n_pruned
    for r in pruned:  # the pruning decision: status, rung tag and epoch metric
        assert r.info.status == "KILLED"
        epoch = int(r.data.metrics["asha/pruned_epoch"])
        assert epoch in (1, 2)  # rungs at grace·2^k = epochs 1 and 2
        assert r.data.tags["scarcelab.asha_rung"] == str(epoch - 1)
    assert len(retrains) == 3 and all(r.info.status == "FINISHED" for r in retrains)
    scores = sorted(r.data.metrics["test/balanced_accuracy"] for r in retrains)
    assert scores == sorted(res.final_test)
    m = srun.data.metrics
    assert m["final/test_balanced_accuracy_mean"] == pytest.approx(np.mean(scores))
    assert m["final/test_balanced_accuracy_std"] == pytest.approx(np.std(scores, ddof=1))
    hist = c.get_metric_history(tracker.study_run_id, "final/test_balanced_accuracy")
    assert sorted(h.step for h in hist) == [0, 1, 2]
    # the best configuration: the highest last report over finished and stopped trials
    # (gem get_best_trial(..., "last")), and it was retrained
    done = [t for t in study.get_trials()
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    best = max(done, key=lambda t: (t.intermediate_values[max(t.intermediate_values)],
                                    -t.number))
    assert res.best_params == best.params
    assert retrains[0].data.params["batch_size"] == str(best.params["batch_size"])
    # the Table-3 view renders from this store
    from scarcelab.tracking.query.frame import load
    from scarcelab.tracking.query.table3 import render_table3, retrain_scores, table3

    sc = retrain_scores(load("tune-unit", store))
    assert len(sc) == 3 and set(sc.method) == {"ce"}
    md = render_table3(table3(sc))
    assert "synthetic_tiny_rgb" in md.splitlines()[0]
    assert f"**{100 * np.mean(scores):.2f} ± {100 * np.std(scores, ddof=1):.2f}**" in md


def test_workers_share_one_study_and_its_trial_budget(tmp_path):
    """Two workers on one storage and study name: the second continues the first's study
    (its trials are the first's competitors in ASHA) and n_trials counts the whole study."""
    a = run_tune(_cfg(tmp_path, n_trials=3, phase="search"), InMemoryTracker())
    b = run_tune(_cfg(tmp_path, n_trials=5, phase="search"), InMemoryTracker())
    study = optuna.load_study(study_name="t", storage=f"sqlite:///{tmp_path}/optuna.db")
    assert len(study.get_trials()) == 5
    assert a.n_complete + a.n_pruned == 3 and b.n_complete + b.n_pruned == 5
    final = InMemoryTracker()
    r = run_tune(_cfg(tmp_path, n_trials=5, phase="final", n_final=2), final)
    assert len(r.final_test) == 2 and len(final.trials) == 2  # no new search trials
    assert {t.tags["scarcelab.role"] for t in final.trials} == {"retrain"}


def test_asha_rungs():
    assert [asha_rung(e, 50) for e in (49, 50, 99, 100, 200, 400, 500)] == \
        [-1, 0, 0, 1, 2, 3, 3]


def test_paper_settings_and_clear_errors(tmp_path):
    s = SETTINGS["cifair10"]
    assert (s.arch, s.epochs, s.grace_period, s.n_trials, s.batch_sizes) == \
        ("wrn16_8", 500, 50, 250, (10, 25, 50))
    assert SETTINGS["cub"].grace_period == 10 and SETTINGS["cub"].epochs == 200
    assert SETTINGS["clamm"].augmentation == "deic_rrc20"  # no flips for handwriting
    # ImageNet: the paper's Table 2 (not in gem's scripts): 200 epochs in the search, 500
    # in the final training, 100 trials, grace period 10
    im = TuneConfig(method="ce", dataset="imagenet50").settings()
    assert (im.epochs, im.final_epochs, im.n_trials, im.grace_period, im.augmentation) == \
        (200, 500, 100, 10, "deic_rrc10_hflip")
    assert SETTINGS["cub"].final_epochs == 200  # gem: --epochs-f defaults to --epochs
    # a user's --epochs scales the final training with it unless --epochs-final is given
    assert TuneConfig(method="ce", dataset="imagenet50", epochs=12).settings().final_epochs == 12
    assert TuneConfig(method="ce", dataset="cub", epochs=12,
                      epochs_final=30).settings().final_epochs == 30
    with pytest.raises(ConfigError, match="--epochs-final"):
        TuneConfig(method="ce", dataset="cub", epochs_final=-1).settings()
    with pytest.raises(ConfigError, match="grace_period"):
        TuneConfig(method="ce", dataset="cifair10", epochs=10).settings()
    with pytest.raises(ConfigError, match="supervised"):
        run_tune(_cfg(tmp_path, method="fixmatch"), InMemoryTracker())
    with pytest.raises(ConfigError, match="no fixed validation split"):
        prepare(_no_val())


def _no_val():
    raw = load_raw("synthetic_tiny")
    raw.val_x = raw.val_y = None
    return raw


def test_normalisation_statistics_come_from_trainval():
    raw = load_raw("synthetic_tiny_rgb")
    search, final, mean, std = prepare(raw)
    tv = np.concatenate([raw.train_x, raw.val_x]).astype(np.float64) / 255.0
    np.testing.assert_allclose(mean, tv.mean(axis=(0, 2, 3)), rtol=1e-9)
    np.testing.assert_allclose(std, tv.std(axis=(0, 2, 3)), rtol=1e-9)
    assert len(search.labeled_y) == len(raw.train_y) and len(search.val_y) == len(raw.val_y)
    assert len(final.labeled_y) == len(raw.train_y) + len(raw.val_y)
    ident = torch.nn.Identity()
    ident.num_features = 3
    net = Standardized(ident, mean, std)
    x = (torch.as_tensor(tv, dtype=torch.float32) - 0.5) / 0.5  # what the loop feeds
    z = net(x).double()
    np.testing.assert_allclose(z.mean(dim=(0, 2, 3)).numpy(), 0.0, atol=1e-5)
    np.testing.assert_allclose(z.std(dim=(0, 2, 3), unbiased=False).numpy(), 1.0, atol=1e-5)
    m2, _ = channel_stats(raw.train_x)
    assert not np.allclose(m2, mean, rtol=0, atol=1e-12)  # train-only stats differ


DEIC_METHODS = ("ce", "scattering", "ole", "gradl2", "cosine", "cosine_ce", "harmonic",
                "fconv", "dsk", "tvmf")


@pytest.mark.parametrize("method", DEIC_METHODS)
def test_every_method_trains_through_tune(method):
    from scarcelab.methods import get_method

    assert getattr(get_method(method), "deic", False) and get_method(method).optimizer == "sgd"
    t = InMemoryTracker()
    # J = 3 would leave 2x2 maps of the 16-px images: a failed trial, not a finished one
    fixed = {"J": 2} if method == "scattering" else {}
    res = run_tune(TuneConfig(method=method, dataset="synthetic_tiny_rgb", arch="small_cnn",
                              epochs=1, grace_period=1, n_trials=1, batch_sizes=(8,),
                              max_steps_per_epoch=2, n_final=1, overrides=fixed), t)
    assert res.n_complete == 1 and len(res.final_test) == 1
    assert 0.0 <= res.final_test[0] <= 1.0 and t.model is not None


def test_scattering_scale_too_large_for_the_input_is_a_failed_trial():
    t = InMemoryTracker()
    res = run_tune(TuneConfig(method="scattering", dataset="synthetic_tiny_rgb",
                              arch="small_cnn", epochs=1, grace_period=1, n_trials=1,
                              batch_sizes=(8,), max_steps_per_epoch=1, phase="search",
                              overrides={"J": 3}), t)
    assert res.n_failed == 1 and t.trials[0].status == "FAILED"
    assert "smaller J" in t.trials[0].error


def test_tune_command_line(tmp_path, store):
    from click.testing import CliRunner

    from scarcelab.entrypoints.cli import main

    args = ["tune", "--method", "ce", "--dataset", "synthetic_tiny_rgb", "--arch", "small_cnn",
            "--epochs", "2", "--grace-period", "1", "--n-trials", "2", "--batch-sizes", "8,16",
            "--n-final", "2", "--max-steps-per-epoch", "2", "--experiment", "cli"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert "final: test balanced accuracy" in r.output and "over 2 retrains" in r.output
    bad = CliRunner().invoke(main, [*args[:-2], "--batch-sizes", "8,x"])
    assert bad.exit_code != 0 and "--batch-sizes" in bad.output
    unknown = CliRunner().invoke(main, [*args, "--set", "lambda_ole=0.3"])
    assert unknown.exit_code != 0 and "unknown hyperparameter" in unknown.output


def test_final_training_has_its_own_epoch_count():
    """gem ``full_train.py --epochs-f``: the search trains ``epochs``, every retrain
    ``epochs_final`` (recorded as the retrain's ``epochs`` param, one train/loss per epoch)."""
    t = InMemoryTracker()
    res = run_tune(TuneConfig(method="ce", dataset="synthetic_tiny_rgb", arch="small_cnn",
                              epochs=1, epochs_final=3, grace_period=1, n_trials=2,
                              batch_sizes=(8,), max_steps_per_epoch=1, n_final=2), t)
    assert len(res.final_test) == 2
    trials = [r for r in t.trials if r.tags["scarcelab.role"] == "trial"]
    retrains = [r for r in t.trials if r.tags["scarcelab.role"] == "retrain"]
    assert all(len(r.history("train/loss")) == 1 for r in trials)
    assert all(len(r.history("train/loss")) == 3 and r.params["epochs"] == 3
               for r in retrains)
    assert t.study.params["epochs"] == 1 and t.study.params["epochs_final"] == 3


def test_tune_device_option_is_checked_like_the_other_entry_points():
    from click.testing import CliRunner

    from scarcelab.entrypoints.cli import main

    bad = CliRunner().invoke(main, ["tune", "--method", "ce", "--device", "nosuch"])
    assert bad.exit_code != 0 and "expected auto, cpu, cuda, cuda:N or mps" in bad.output
    import torch

    if not torch.cuda.is_available():
        r = CliRunner().invoke(main, ["tune", "--method", "ce", "--device", "cuda"])
        assert r.exit_code != 0 and "CUDA is not available" in r.output
