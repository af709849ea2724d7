"""The "Tune It or Don't Use It" protocol: ASHA pruning visible in Optuna and MLflow (an
embedded sqlite MLflow store and an sqlite Optuna storage, no mocks), the study shared by
workers, the 10 retrains, the paper's settings and trainval normalisation; at the end,
on the in-memory tracker: no early stopping, failed trials and retrains, resuming a final
phase, the data_dir."""

from __future__ import annotations

import dataclasses
import re
import warnings
from pathlib import Path

import numpy as np
import optuna
import pytest
import torch
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

import scarcelab
import scarcelab.protocols.tune as tune
from scarcelab.data import DATASETS, load_raw
from scarcelab.errors import ConfigError, TrialFailed
from scarcelab.models.standardize import Standardized, channel_stats
from scarcelab.protocols.tune import (
    SETTINGS,
    FinalResume,
    TuneConfig,
    asha_rung,
    prepare,
    run_tune,
)
from scarcelab.tracker import InMemoryTracker


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
    # retrain 0's model takes raw images (issue 39): from them, its own test score
    import mlflow

    from scarcelab.data import load_raw
    from scarcelab.metrics import classification_metrics

    raw = load_raw("synthetic_tiny_rgb")
    out = mlflow.pyfunc.load_model(f"runs:/{tracker.study_run_id}/model").predict(
        list(raw.test_x.transpose(0, 2, 3, 1)))  # (H, W, C) arrays
    r0 = next(r for r in retrains if r.data.tags["scarcelab.retrain"] == "0")
    assert classification_metrics(raw.test_y, out.iloc[:, 1:].to_numpy())[
        "balanced_accuracy"] == pytest.approx(r0.data.metrics["test/balanced_accuracy"],
                                              abs=1e-12)
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


# -- no early stopping, failures, resume, inputs (mutation sample, docs/mutation.md) -------
TINY = dict(method="ce", dataset="synthetic_tiny_rgb", arch="small_cnn", epochs=1,
            grace_period=1, batch_sizes=(8,), max_steps_per_epoch=1, n_final=1)
BEST = {"lr": 0.01, "weight_decay": 1e-4, "batch_size": 8}  # a configuration of ce's space


def _one_trial_cfg(tmp_path: Path, **kw: object) -> TuneConfig:
    """One trial, one epoch, one retrain on TINY (the module's ``_cfg`` runs 5 trials of
    2 epochs and 3 retrains)."""
    base = {**TINY, "n_trials": 1, "storage": f"sqlite:///{tmp_path}/optuna.db",
            "study_name": "t"}
    base.update(kw)
    return TuneConfig(**base)  # type: ignore[arg-type]


def _study_trials(tmp_path: Path) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name="t", storage=f"sqlite:///{tmp_path}/optuna.db"
                             ).get_trials()


# -- no early stopping in the tune protocol -----------------------------------------------


def test_trials_and_retrains_train_every_epoch_when_validation_never_improves(tmp_path,
                                                                              monkeypatch):
    """A validation score stuck at 0.5 from the first epoch: a trainer with early stopping
    (the loop's default patience is 20) would stop after epoch 21; the protocol trains all
    22 epochs in the search (ASHA alone may stop a trial) and in every retrain (no model
    selection on trainval)."""
    import scarcelab.train as train_mod

    monkeypatch.setattr(train_mod, "evaluate", lambda *a, **k: (0.5, {}, None))
    t = InMemoryTracker()
    run_tune(_one_trial_cfg(tmp_path, epochs=22, grace_period=22, storage=None), t)
    trial, retrain = t.trials
    assert trial.tags["scarcelab.role"] == "trial" and trial.status == "FINISHED"
    assert trial.tags["scarcelab.stopped"] == "max_epochs"
    assert [s for s, _ in trial.history("val/balanced_accuracy_avg5")] == list(range(22))
    # a finished trial's ASHA record: its five-epoch mean and the rung of epoch 22, grace 22
    assert [m for m in trial.metrics if m[0].startswith("asha/")] == \
        [("asha/final_value", 0.5, 22), ("asha/rung", 0.0, 22)]
    assert retrain.tags["scarcelab.role"] == "retrain" and retrain.status == "FINISHED"
    assert [s for s, _ in retrain.history("trainval/balanced_accuracy")] == list(range(22))
    assert {s for k, _, s in retrain.metrics if k.startswith("test/")} == {22}


# -- failures: recorded as failed, told to Optuna as FAIL, the search goes on -------------


def test_one_crashing_trial_is_failed_and_the_search_goes_on(tmp_path, monkeypatch):
    calls = []
    real = tune.build_method

    def first_crashes(*a, **k):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("out of host memory (trial 0)")
        return real(*a, **k)

    monkeypatch.setattr(tune, "build_method", first_crashes)
    t = InMemoryTracker()
    res = run_tune(_one_trial_cfg(tmp_path, n_trials=2, phase="search"), t)
    assert (res.n_failed, res.n_complete + res.n_pruned) == (1, 1)
    assert [x.state for x in _study_trials(tmp_path)][0] == TrialState.FAIL
    assert t.trials[0].status == "FAILED"
    assert "Traceback" in t.trials[0].error and "out of host memory" in t.trials[0].error
    assert t.trials[1].status == "FINISHED"


def test_three_crashing_trials_in_a_row_stop_the_search(tmp_path, monkeypatch):
    def crash(*a, **k):  # type: ignore[no-untyped-def]
        raise RuntimeError("broken backbone")

    monkeypatch.setattr(tune, "build_method", crash)
    t = InMemoryTracker()
    with pytest.raises(RuntimeError, match="broken backbone"):
        run_tune(_one_trial_cfg(tmp_path, n_trials=5, phase="search"), t)
    assert [x.status for x in t.trials] == ["FAILED"] * 3 and t.study.status == "FAILED"
    assert [x.state for x in _study_trials(tmp_path)] == [TrialState.FAIL] * 3


def test_a_config_error_inside_a_trial_is_told_as_fail_and_raised(tmp_path, monkeypatch):
    """The trial is told FAIL explicitly; telling it no value at all would also end it
    FAIL in Optuna 5 but with Optuna's misleading "value None could not be cast" warning."""
    from scarcelab.methods.supervised.ce import CrossEntropy

    monkeypatch.setattr(CrossEntropy, "optimizer", "sgd_typo")  # make_optimizer refuses it
    t = InMemoryTracker()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(ConfigError, match="sgd_typo"):
            run_tune(_one_trial_cfg(tmp_path, phase="search"), t)
    assert [x.state for x in _study_trials(tmp_path)] == [TrialState.FAIL]
    assert t.trials[0].status == "FAILED" and "sgd_typo" in t.trials[0].error
    assert not [w for w in seen if "could not be cast" in str(w.message)]


def test_a_failed_retrain_records_its_traceback(monkeypatch):
    """Non-finite test logits fail the retrain: the run ends FAILED with the traceback
    (exception type and message), and the error reaches the caller."""
    monkeypatch.setattr(tune, "forward_images",
                        lambda fn, x, bs, device, *rest: np.full((len(x), 3), np.nan,
                                                                   np.float32))
    t = InMemoryTracker()
    with pytest.raises(TrialFailed, match="^non-finite test predictions$"):
        run_tune(TuneConfig(**TINY), t, resume=FinalResume(best_params=BEST))
    [retrain] = t.trials
    assert retrain.status == "FAILED" and t.study.status == "FAILED"
    assert retrain.error.startswith("Traceback (most recent call last):")
    assert "TrialFailed: non-finite test predictions" in retrain.error


# -- resuming a final phase (in-process; tests/tracking/test_tune_resume.py goes through the CLI) --

STUDY_TAGS = {"scarcelab.role": "study", "scarcelab.protocol": "tune",
              "scarcelab.family": "supervised", "scarcelab.method": "ce",
              "scarcelab.dataset": "synthetic_tiny_rgb", "scarcelab.seed": "0",
              "scarcelab.version": scarcelab.__version__, "scarcelab.arch": "small_cnn",
              "scarcelab.search": "asha", "scarcelab.study_key": "study-a",
              "scarcelab.optuna_study": "study-a", "scarcelab.tune_phase": "all",
              "scarcelab.test_set": "official"}


def test_resume_runs_the_missing_retrain_under_the_recorded_study():
    raw = load_raw("synthetic_tiny_rgb")
    recorded = {"resolved.method": "ce", "resolved.epochs": "1", "n_final": "2",
                "resolved.n_train": str(len(raw.train_y)), "seed": "0"}
    t = InMemoryTracker()
    res = run_tune(TuneConfig(**{**TINY, "n_final": 2, "study_name": "study-a"}), t,
                   resume=FinalResume(best_params=BEST, done={0: 0.25},
                                      logged=frozenset({0}), recorded=recorded))
    assert (res.n_complete, res.n_pruned, res.n_failed) == (0, 0, 0)  # no search ran
    assert (res.kept, res.ran, res.study_name) == ([0], [1], "study-a")
    assert res.best_params == BEST and np.isnan(res.best_value)
    assert res.final_test[0] == 0.25 and len(res.final_test) == 2
    assert t.study.name == "tune-ce-synthetic_tiny_rgb-s0" and t.study.status == "FINISHED"
    assert t.study.tags == {**STUDY_TAGS, "scarcelab.final_kept": "0",
                            "scarcelab.final_resumed": "1"}
    assert t.study.params == {}  # the record's params stay as the first process wrote them
    [retrain] = t.trials
    assert retrain.tags["scarcelab.retrain"] == "1" and retrain.tags["scarcelab.resumed"] == "true"


def test_resume_refuses_a_study_recorded_with_other_settings():
    recorded = {"resolved.epochs": "3", "method": "ce"}
    t = InMemoryTracker()
    with pytest.raises(ConfigError, match=re.escape("epochs: recorded 3, now 1")):
        run_tune(TuneConfig(**TINY), t, resume=FinalResume(best_params=BEST,
                                                           recorded=recorded))
    assert t.study is None and t.trials == []  # refused before anything was written


def test_param_text_renders_non_json_values_through_str():
    """As the MLflow tracker records a param (``tracking.mlflow_tracker._param_value``:
    JSON, ``str`` for what JSON cannot encode), so a resume compares like with like
    instead of crashing on a value such as a Path."""
    assert tune._param_text(Path("/data/x")) == '"/data/x"'
    assert tune._param_text(np.float32(0.5)) == '"0.5"'
    assert tune._param_text({"p": Path("/d")}) == '{"p": "/d"}'
    assert tune._param_text("text") == "text" and tune._param_text(None) == "null"


# -- run_tune's checks and inputs ---------------------------------------------------------


def test_a_linear_probe_method_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match=re.escape(
            "method 'supcon' is supervised (linear probe); the tune protocol trains")):
        run_tune(TuneConfig(method="supcon", dataset="synthetic_tiny_rgb"), InMemoryTracker())


FROM_DIR = "test_tune_from_dir"


def _from_dir(data_dir: object = None):  # type: ignore[no-untyped-def]
    """A dataset read from the folder given as ``data_dir`` (``tiny.npz``)."""
    path = Path(str(data_dir)) / "tiny.npz"
    if data_dir is None or not path.exists():
        raise ConfigError(f"{FROM_DIR}: no {path}; pass --data-dir")
    z = np.load(path)
    return dataclasses.replace(load_raw("synthetic_tiny_rgb"), name=FROM_DIR,
                               **{k: z[k] for k in z.files})


def test_the_data_dir_is_where_the_dataset_is_read(tmp_path, monkeypatch):
    DATASETS._load()  # registered for this test only: other tests list every dataset
    monkeypatch.setitem(DATASETS._entries, FROM_DIR, _from_dir)
    raw = load_raw("synthetic_tiny_rgb")
    np.savez(tmp_path / "tiny.npz", train_x=raw.train_x[:45], train_y=raw.train_y[:45],
             val_x=raw.val_x, val_y=raw.val_y, test_x=raw.test_x, test_y=raw.test_y)
    t = InMemoryTracker()
    run_tune(_one_trial_cfg(tmp_path, dataset=FROM_DIR, data_dir=str(tmp_path), phase="search"), t)
    assert t.study.params["data_dir"] == str(tmp_path) and t.study.params["n_train"] == 45
    with pytest.raises(ConfigError, match="no .*empty"):
        run_tune(_one_trial_cfg(tmp_path, dataset=FROM_DIR, data_dir=str(tmp_path / "empty")),
                 InMemoryTracker())


def test_rebuild_puts_each_prior_trial_back_in_its_slot_as_it_ended():
    """A resumed search's trials, in process: trial n is asked as trial n and keeps its
    slot n, its state, its reports and value; only a trial cut by the wall-clock budget is
    marked ``budget_cut`` (with how many reports it gave), not one that failed."""
    from scarcelab.methods import METHODS
    from scarcelab.protocols.study_store import StudyStore
    from scarcelab.protocols.tune import PriorTrial, SearchResume, TuneSettings

    prior = (PriorTrial(0, "complete", ((1, 0.4), (2, 0.5)), 0.5),
             PriorTrial(1, "budget", ((1, 0.3),)),
             PriorTrial(2, "failed"),
             PriorTrial(3, "pruned", ((1, 0.1),)))
    s = TuneSettings(arch="small_cnn", epochs=2, grace_period=1, n_trials=8,
                     batch_sizes=(16, 32), augmentation="none")
    store = StudyStore("rebuild", 0)
    kept = tune._rebuild(store, SearchResume(trials=prior), METHODS.get("sup"), s, {})
    assert kept == [0, 1, 2, 3]
    trials = store.study.get_trials()
    assert [t.user_attrs.get("slot") for t in trials] == [0, 1, 2, 3]
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL,
                                         TrialState.FAIL, TrialState.PRUNED]
    assert [t.user_attrs.get("budget_cut") for t in trials] == [None, 1, None, None]
    assert trials[0].value == 0.5 and trials[0].intermediate_values == {1: 0.4, 2: 0.5}
