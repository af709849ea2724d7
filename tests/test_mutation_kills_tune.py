"""Behaviours of the tune, transfer and contamination protocols that the seeded mutation
sample of scarcelab/protocols (docs/mutation.md) showed no test checked. Expected values
come from the documented contracts: the tag and metric keys of DESIGN.md §4.2-4.3 and the
module docstrings (``scarcelab.protocols.tune``: "each for the full number of epochs with
no model selection"; a failed trial "is recorded as failed and the search goes on")."""

from __future__ import annotations

import dataclasses
import re
import warnings
from pathlib import Path

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

import scarcelab
import scarcelab.protocols.tune as tune
from scarcelab.data import DATASETS, load_raw
from scarcelab.errors import ConfigError, TrialFailed
from scarcelab.protocols.tune import FinalResume, TuneConfig, run_tune
from scarcelab.tracker import InMemoryTracker

TINY = dict(method="ce", dataset="synthetic_tiny_rgb", arch="small_cnn", epochs=1,
            grace_period=1, batch_sizes=(8,), max_steps_per_epoch=1, n_final=1)
BEST = {"lr": 0.01, "weight_decay": 1e-4, "batch_size": 8}  # a configuration of ce's space


def _cfg(tmp_path: Path, **kw: object) -> TuneConfig:
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
    run_tune(_cfg(tmp_path, epochs=22, grace_period=22, storage=None), t)
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
    res = run_tune(_cfg(tmp_path, n_trials=2, phase="search"), t)
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
        run_tune(_cfg(tmp_path, n_trials=5, phase="search"), t)
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
            run_tune(_cfg(tmp_path, phase="search"), t)
    assert [x.state for x in _study_trials(tmp_path)] == [TrialState.FAIL]
    assert t.trials[0].status == "FAILED" and "sgd_typo" in t.trials[0].error
    assert not [w for w in seen if "could not be cast" in str(w.message)]


def test_a_failed_retrain_records_its_traceback(monkeypatch):
    """Non-finite test logits fail the retrain: the run ends FAILED with the traceback
    (exception type and message), and the error reaches the caller."""
    monkeypatch.setattr(tune, "forward_images",
                        lambda fn, x, bs, device: np.full((len(x), 3), np.nan, np.float32))
    t = InMemoryTracker()
    with pytest.raises(TrialFailed, match="^non-finite test predictions$"):
        run_tune(TuneConfig(**TINY), t, resume=FinalResume(best_params=BEST))
    [retrain] = t.trials
    assert retrain.status == "FAILED" and t.study.status == "FAILED"
    assert retrain.error.startswith("Traceback (most recent call last):")
    assert "TrialFailed: non-finite test predictions" in retrain.error


# -- resuming a final phase (in-process; tests/test_tune_resume.py goes through the CLI) --

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
    run_tune(_cfg(tmp_path, dataset=FROM_DIR, data_dir=str(tmp_path), phase="search"), t)
    assert t.study.params["data_dir"] == str(tmp_path) and t.study.params["n_train"] == 45
    with pytest.raises(ConfigError, match="no .*empty"):
        run_tune(_cfg(tmp_path, dataset=FROM_DIR, data_dir=str(tmp_path / "empty")),
                 InMemoryTracker())


# -- contamination sweeps -----------------------------------------------------------------


def test_child_study_names_have_no_spaces():
    from scarcelab.protocols.contamination import _child
    from scarcelab.protocols.search import StudyConfig

    cfg = StudyConfig(method="fixmatch", study_name="sweep")
    assert _child(cfg, "clean r=0").study_name == "sweep-clean-r=0"
    assert _child(cfg, "mnist r=0.3").study_name == "sweep-mnist-r=0.3"
    assert _child(cfg, "mnist r=0.3").sweep_point == "mnist r=0.3"
    assert _child(dataclasses.replace(cfg, study_name=None), "clean r=0").study_name is None


def test_tagging_tracker_names_the_tuning_study_and_the_sweep_points():
    from scarcelab.protocols.contamination import TaggingTracker

    inner = InMemoryTracker()
    TaggingTracker(inner, {"scarcelab.sweep_role": "tuning"}).start_study("s", {}, {}, {})
    assert inner.study.name == "s-tuning-r0"
    TaggingTracker(inner, {"scarcelab.ood": "mnist", "scarcelab.ratio": "0.3"}).start_study(
        "s", {"a": "1"}, {}, {})
    assert inner.study.name == "s-mnist-r0.3"
    assert inner.study.tags == {"a": "1", "scarcelab.ood": "mnist", "scarcelab.ratio": "0.3"}


# -- transfer: the probe record -----------------------------------------------------------


def test_encoder_tags_leave_an_unknown_arch_empty():
    from scarcelab.protocols.transfer import ProbeConfig, encoder_tags

    tags = encoder_tags(ProbeConfig(encoder="/models/enc.pt"), {})
    assert tags == {"scarcelab.task": "probe", "scarcelab.protocol": "linear",
                    "scarcelab.encoder": "/models/enc.pt", "scarcelab.encoder_arch": "",
                    "scarcelab.encoder_format": "", "scarcelab.encoder_norm": "none",
                    "scarcelab.encoder_fingerprint": "", "scarcelab.encoder_method": "unknown"}


def test_linear_probe_record_keys():
    from scarcelab.models.encoder import build_encoder
    from scarcelab.protocols.transfer import ProbeConfig, run_linear

    enc, info = build_encoder("random", "small_cnn", 3, seed=0)
    t = InMemoryTracker()
    res = run_linear(ProbeConfig(dataset="synthetic_tiny_rgb", device="cpu", probe_trials=1,
                                 probe_max_iter=50), enc, info, t)
    assert t.study.tags["scarcelab.role"] == "probe"
    assert t.study.tags["scarcelab.family"] == "transfer"
    assert t.study.tags["scarcelab.method"] == "linear_probe"
    metrics = {k: (v, s) for k, v, s in t.study.metrics}
    assert set(metrics) == {"val/balanced_accuracy", "probe/C", "time/features_s",
                            "time/fit_s", "time/elapsed_s",
                            *(f"test/{k}" for k in res.test)}
    assert {s for _, s in metrics.values()} == {0}
    assert set(res.info) == {"C", "features", "encoding_key", "time_features_s",
                             "time_fit_s", "time_s"}
    assert res.info["time_fit_s"] == metrics["time/fit_s"][0]
    assert res.info["time_features_s"] == metrics["time/features_s"][0]
    assert res.info["time_s"] == metrics["time/elapsed_s"][0]
    assert res.info["time_fit_s"] + res.info["time_features_s"] <= res.info["time_s"]
