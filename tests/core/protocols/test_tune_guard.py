"""A behaviour guard of ``run_tune`` (issue 26 item 1): the exact sequence of tracker
calls, Optuna trial states, pruned epochs, best value and final scores of the tiniest
searches the tune tests run, recorded on the protocol before its trial loop moved onto
:class:`~scarcelab.trials.TrialRunner`, so the move can be checked to change
nothing a study records."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import optuna
import pytest

import scarcelab.protocols.tune as tune
from scarcelab.accel import NAMES as ACCEL_NAMES
from scarcelab.errors import ConfigError, TrialFailed
from scarcelab.tracker import InMemoryTracker
from scarcelab.train import OnEpochEnd

optuna.logging.set_verbosity(optuna.logging.ERROR)


class Recorder(InMemoryTracker):
    """Every call, as (method, status-or-number, scope, sorted keys of tags/params/metrics)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, ...]] = []

    def start_study(self, name, tags, params, artifacts, dataset=None):
        # the precision and kernel params (issue 40, logged since) are kept apart, so that
        # the recorded keys stay those of the recording (their values: test below)
        self.accel_params = {k: params[k] for k in ACCEL_NAMES if k in params}
        self.calls.append(("start_study", tuple(sorted(tags)),
                           tuple(sorted(k for k in params if k not in ACCEL_NAMES)),
                           tuple(sorted(artifacts))))
        super().start_study(name, tags, params, artifacts, dataset)

    def start_trial(self, number, tags, params):
        self.calls.append(("start_trial", number, tuple(sorted(tags)), tuple(sorted(params))))
        super().start_trial(number, tags, params)

    def log_metrics(self, metrics, step, scope="trial"):
        self.calls.append(("log_metrics", step, scope, tuple(sorted(metrics))))
        super().log_metrics(metrics, step, scope)

    def set_tags(self, tags, scope="study"):
        self.calls.append(("set_tags", scope, tuple(sorted(tags))))
        super().set_tags(tags, scope)

    def end_trial(self, status, error=None):
        self.calls.append(("end_trial", status, ((error or "").splitlines() or [""])[-1]))
        super().end_trial(status, error)

    def log_model(self, model, example):
        self.calls.append(("log_model",))
        super().log_model(model, example)

    def end_study(self, status):
        self.calls.append(("end_study", status))
        super().end_study(status)


def _cfg(**kw: Any) -> tune.TuneConfig:
    base = dict(method="ce", dataset="synthetic_tiny_rgb", arch="small_cnn", epochs=2,
                grace_period=1, n_trials=5, batch_sizes=(8, 16), max_steps_per_epoch=2,
                n_final=3, study_name="guard")
    base.update(kw)
    return tune.TuneConfig(**base)


def _inject(monkeypatch: pytest.MonkeyPatch, faults: dict[int, str]) -> None:
    """Make call ``k`` of ``train_trial`` raise (``"error"``: a RuntimeError,
    ``"failed"``: a TrialFailed, ``"config"``: a ConfigError) or report NaN validation
    accuracies (``"nan"``)."""
    real = tune.train_trial
    count = [0]

    def train_trial(method, bundle, cfg, **kw):
        k, count[0] = count[0], count[0] + 1
        fault = faults.get(k)
        if fault == "error":
            raise RuntimeError(f"boom {k}")
        if fault == "failed":
            raise TrialFailed(f"diverged {k}")
        if fault == "config":
            raise ConfigError(f"bad configuration {k}")
        if fault == "nan":
            kw["callbacks"] = [OnEpochEnd(lambda rep, improved, snap, cb=cb: cb.on_epoch_end(
                dataclasses.replace(rep, val_balanced_accuracy=math.nan), improved, snap))
                for cb in kw["callbacks"]]
        return real(method, bundle, cfg, **kw)

    monkeypatch.setattr(tune, "train_trial", train_trial)


def _summary(t: Recorder) -> dict[str, Any]:
    return {"calls": t.calls,
            "trials": [(r.name, r.status, r.tags.get("scarcelab.pruned"),
                        r.tags.get("scarcelab.asha_rung"), r.tags.get("scarcelab.stopped"),
                        r.last("asha/pruned_epoch")) for r in t.trials],
            "study": (t.study.status, {k: v for k, v in t.study.tags.items()
                                       if k.startswith(("scarcelab.n_", "scarcelab.best"))})}


def _r(x: float) -> float:
    return round(x, 6)


def _run(tmp_path, monkeypatch, faults: dict[int, str]) -> dict[str, Any]:
    """One guarded run: what it returned (or raised) and everything it recorded."""
    _inject(monkeypatch, faults)
    storage = f"sqlite:///{tmp_path}/optuna.db"
    t = Recorder()
    try:
        res = tune.run_tune(_cfg(storage=storage), t)
        out: Any = (res.n_complete, res.n_pruned, res.n_failed, res.best_params,
                    _r(res.best_value), [_r(x) for x in res.final_test])
    except Exception as e:  # noqa: BLE001 - what escapes is part of the behaviour
        out = repr(e)
    # the precision and kernel params, logged since the recording: the CPU's former path
    assert t.accel_params == {"precision": "fp32", "channels_last": "weights",
                              "cudnn_benchmark": "off", "fused_optimizer": "off",
                              "tf32": "off", "compile": "off"}
    study = optuna.load_study(study_name="guard", storage=storage)
    trials = sorted(study.get_trials(), key=lambda x: x.number)
    kinds: dict[str, set[tuple[Any, ...]]] = {}
    for c in t.calls:
        if c[0] in ("end_trial", "log_model", "end_study"):
            continue
        kinds.setdefault(c[0], set()).add(c[-1] if c[0] != "start_study" else c[1:])
    return {
        "result": out,
        "sequence": [c[:3] if c[0] == "log_metrics" else c[:2] for c in t.calls],
        "keys": {k: sorted(v) for k, v in kinds.items()},
        "errors": [c[2] for c in t.calls if c[0] == "end_trial"],
        "tracker": [(r.name, r.status, r.tags.get("scarcelab.pruned"),
                     r.tags.get("scarcelab.asha_rung"), r.tags.get("scarcelab.stopped"),
                     r.last("asha/pruned_epoch")) for r in t.trials],
        "study": (t.study.status, {k: v for k, v in t.study.tags.items()
                                   if k.startswith(("scarcelab.n_", "scarcelab.best"))}),
        "optuna": [(x.number, x.state.name, max(x.intermediate_values, default=None),
                    x.user_attrs.get("slot")) for x in trials],
    }


# -- recorded on the protocol before its trial loop moved onto TrialRunner ------------------

ASHA_AND_RETRAINS: dict[str, Any] = {
 'errors': ['', 'pruned by ASHA after epoch 1', 'pruned by ASHA after epoch 1', '', '', '',
            '', ''],
 'keys': {'log_metrics': [('asha/final_value', 'asha/rung'),
                          ('asha/pruned_epoch', 'asha/rung'),
                          ('best/val_balanced_accuracy_avg5',),
                          ('final/n_runs', 'final/test_balanced_accuracy_mean',
                           'final/test_balanced_accuracy_std'),
                          ('final/test_balanced_accuracy',),
                          ('test/accuracy', 'test/auroc', 'test/balanced_accuracy',
                           'test/pauroc_spec90', 'test/pauroc_spec90_mcclish',
                           'test/sensitivity_at_spec95'),
                          ('time/data_s', 'time/epoch_s', 'time/eval_s', 'time/steps',
                           'train/loss', 'train/loss_labeled', 'train/lr',
                           'trainval/balanced_accuracy'),
                          ('time/data_s', 'time/epoch_s', 'time/eval_s', 'time/steps',
                           'train/loss', 'train/loss_labeled', 'train/lr',
                           'val/balanced_accuracy', 'val/balanced_accuracy_avg5')],
          'set_tags': [('scarcelab.asha_rung', 'scarcelab.pruned', 'scarcelab.stopped'),
                       ('scarcelab.best_params', 'scarcelab.best_trial',
                        'scarcelab.best_trial_state'),
                       ('scarcelab.n_complete', 'scarcelab.n_failed', 'scarcelab.n_pruned'),
                       ('scarcelab.pruned', 'scarcelab.stopped')],
          'start_study': [(('scarcelab.arch', 'scarcelab.dataset', 'scarcelab.family',
                            'scarcelab.method', 'scarcelab.optuna_study',
                            'scarcelab.protocol', 'scarcelab.role', 'scarcelab.search',
                            'scarcelab.seed', 'scarcelab.study_key', 'scarcelab.test_set',
                            'scarcelab.tune_phase', 'scarcelab.version'),
                           ('arch', 'augmentation', 'batch_sizes', 'budget_minutes',
                            'data_dir', 'dataset', 'device', 'epochs', 'epochs_final',
                            'grace_period', 'max_steps_per_epoch', 'method', 'n_final',
                            'n_test', 'n_train', 'n_trials', 'n_val', 'phase', 'seed',
                            'source', 'storage', 'study_name', 'test_set', 'train_images'),
                           ('config.json',))],
          'start_trial': [('arch', 'batch_size', 'epochs', 'lr', 'retrain_seed',
                           'train_split', 'weight_decay'),
                          ('arch', 'batch_size', 'epochs', 'lr', 'trial_seed',
                           'weight_decay')]},
 'optuna': [(0, 'COMPLETE', 2, 0), (1, 'PRUNED', 1, 1), (2, 'PRUNED', 1, 2),
            (3, 'COMPLETE', 2, 3), (4, 'COMPLETE', 2, 4)],
 'result': (3, 2, 0,
            {'batch_size': 16,
             'lr': 0.016934236026245303,
             'weight_decay': 0.003385224477566269},
            0.833333, [0.673333, 0.406667, 0.973333]),
 'sequence': [('start_study',
               ('scarcelab.arch', 'scarcelab.dataset', 'scarcelab.family',
                'scarcelab.method', 'scarcelab.optuna_study', 'scarcelab.protocol',
                'scarcelab.role', 'scarcelab.search', 'scarcelab.seed',
                'scarcelab.study_key', 'scarcelab.test_set', 'scarcelab.tune_phase',
                'scarcelab.version')),
              ('start_trial', 0), ('log_metrics', 0, 'trial'), ('log_metrics', 1, 'trial'),
              ('log_metrics', 2, 'trial'), ('set_tags', 'trial'), ('end_trial', 'FINISHED'),
              ('start_trial', 1), ('log_metrics', 0, 'trial'), ('log_metrics', 1, 'trial'),
              ('set_tags', 'trial'), ('end_trial', 'KILLED'), ('start_trial', 2),
              ('log_metrics', 0, 'trial'), ('log_metrics', 1, 'trial'),
              ('set_tags', 'trial'), ('end_trial', 'KILLED'), ('start_trial', 3),
              ('log_metrics', 0, 'trial'), ('log_metrics', 1, 'trial'),
              ('log_metrics', 2, 'trial'), ('set_tags', 'trial'), ('end_trial', 'FINISHED'),
              ('start_trial', 4), ('log_metrics', 0, 'trial'), ('log_metrics', 1, 'trial'),
              ('log_metrics', 2, 'trial'), ('set_tags', 'trial'), ('end_trial', 'FINISHED'),
              ('set_tags', 'study'), ('set_tags', 'study'), ('log_metrics', 0, 'study'),
              ('start_trial', 0), ('log_metrics', 0, 'trial'), ('log_metrics', 1, 'trial'),
              ('log_metrics', 2, 'trial'), ('end_trial', 'FINISHED'),
              ('log_metrics', 0, 'study'), ('log_model',), ('start_trial', 1),
              ('log_metrics', 0, 'trial'), ('log_metrics', 1, 'trial'),
              ('log_metrics', 2, 'trial'), ('end_trial', 'FINISHED'),
              ('log_metrics', 1, 'study'), ('start_trial', 2), ('log_metrics', 0, 'trial'),
              ('log_metrics', 1, 'trial'), ('log_metrics', 2, 'trial'),
              ('end_trial', 'FINISHED'), ('log_metrics', 2, 'study'),
              ('log_metrics', 0, 'study'), ('end_study', 'FINISHED')],
 'study': ('FINISHED',
           {'scarcelab.best_params': '{"batch_size": 16, "lr": 0.016934236026245303, '
                                     '"weight_decay": 0.003385224477566269}',
            'scarcelab.best_trial': '3',
            'scarcelab.best_trial_state': 'complete',
            'scarcelab.n_complete': '3',
            'scarcelab.n_failed': '0',
            'scarcelab.n_pruned': '2'}),
 'tracker': [('trial-0', 'FINISHED', 'false', None, 'max_epochs', None),
             ('trial-1', 'KILLED', 'true', '0', 'asha', 1.0),
             ('trial-2', 'KILLED', 'true', '0', 'asha', 1.0),
             ('trial-3', 'FINISHED', 'false', None, 'max_epochs', None),
             ('trial-4', 'FINISHED', 'false', None, 'max_epochs', None),
             ('trial-0', 'FINISHED', None, None, None, None),
             ('trial-1', 'FINISHED', None, None, None, None),
             ('trial-2', 'FINISHED', None, None, None, None)]}


FAILURES_DO_NOT_STOP_THE_SEARCH: dict[str, Any] = {
 # trial 3's NaN objective: FAILED in the tracker as in Optuna (it was FINISHED there)
 'errors': ['', 'RuntimeError: boom 1', 'diverged 2',
            'non-finite objective (nan)', '', '', '', ''],
 'keys': {'log_metrics': [('asha/final_value', 'asha/rung'),
                          ('best/val_balanced_accuracy_avg5',),
                          ('final/n_runs', 'final/test_balanced_accuracy_mean',
                           'final/test_balanced_accuracy_std'),
                          ('final/test_balanced_accuracy',),
                          ('test/accuracy', 'test/auroc', 'test/balanced_accuracy',
                           'test/pauroc_spec90', 'test/pauroc_spec90_mcclish',
                           'test/sensitivity_at_spec95'),
                          ('time/data_s', 'time/epoch_s', 'time/eval_s', 'time/steps',
                           'train/loss', 'train/loss_labeled', 'train/lr',
                           'trainval/balanced_accuracy'),
                          ('time/data_s', 'time/epoch_s', 'time/eval_s', 'time/steps',
                           'train/loss', 'train/loss_labeled', 'train/lr',
                           'val/balanced_accuracy', 'val/balanced_accuracy_avg5')],
          'set_tags': [('scarcelab.best_params', 'scarcelab.best_trial',
                        'scarcelab.best_trial_state'),
                       ('scarcelab.n_complete', 'scarcelab.n_failed', 'scarcelab.n_pruned'),
                       ('scarcelab.pruned', 'scarcelab.stopped')],
          'start_study': [(('scarcelab.arch', 'scarcelab.dataset', 'scarcelab.family',
                            'scarcelab.method', 'scarcelab.optuna_study',
                            'scarcelab.protocol', 'scarcelab.role', 'scarcelab.search',
                            'scarcelab.seed', 'scarcelab.study_key', 'scarcelab.test_set',
                            'scarcelab.tune_phase', 'scarcelab.version'),
                           ('arch', 'augmentation', 'batch_sizes', 'budget_minutes',
                            'data_dir', 'dataset', 'device', 'epochs', 'epochs_final',
                            'grace_period', 'max_steps_per_epoch', 'method', 'n_final',
                            'n_test', 'n_train', 'n_trials', 'n_val', 'phase', 'seed',
                            'source', 'storage', 'study_name', 'test_set', 'train_images'),
                           ('config.json',))],
          'start_trial': [('arch', 'batch_size', 'epochs', 'lr', 'retrain_seed',
                           'train_split', 'weight_decay'),
                          ('arch', 'batch_size', 'epochs', 'lr', 'trial_seed',
                           'weight_decay')]},
 'optuna': [(0, 'COMPLETE', 2, 0), (1, 'FAIL', None, 1), (2, 'FAIL', None, 2),
            (3, 'FAIL', 2, 3), (4, 'COMPLETE', 2, 4)],
 'result': (2, 0, 3,
            {'batch_size': 16,
             'lr': 0.020575497375253736,
             'weight_decay': 0.014417917398488479},
            0.74, [0.753333, 0.406667, 0.94]),
 'sequence': [('start_study',
               ('scarcelab.arch', 'scarcelab.dataset', 'scarcelab.family',
                'scarcelab.method', 'scarcelab.optuna_study', 'scarcelab.protocol',
                'scarcelab.role', 'scarcelab.search', 'scarcelab.seed',
                'scarcelab.study_key', 'scarcelab.test_set', 'scarcelab.tune_phase',
                'scarcelab.version')),
              ('start_trial', 0), ('log_metrics', 0, 'trial'), ('log_metrics', 1, 'trial'),
              ('log_metrics', 2, 'trial'), ('set_tags', 'trial'), ('end_trial', 'FINISHED'),
              ('start_trial', 1), ('end_trial', 'FAILED'), ('start_trial', 2),
              ('end_trial', 'FAILED'), ('start_trial', 3), ('log_metrics', 0, 'trial'),
              ('log_metrics', 1, 'trial'), ('end_trial', 'FAILED'), ('start_trial', 4),
              ('log_metrics', 0, 'trial'), ('log_metrics', 1, 'trial'),
              ('log_metrics', 2, 'trial'), ('set_tags', 'trial'), ('end_trial', 'FINISHED'),
              ('set_tags', 'study'), ('set_tags', 'study'), ('log_metrics', 0, 'study'),
              ('start_trial', 0), ('log_metrics', 0, 'trial'), ('log_metrics', 1, 'trial'),
              ('log_metrics', 2, 'trial'), ('end_trial', 'FINISHED'),
              ('log_metrics', 0, 'study'), ('log_model',), ('start_trial', 1),
              ('log_metrics', 0, 'trial'), ('log_metrics', 1, 'trial'),
              ('log_metrics', 2, 'trial'), ('end_trial', 'FINISHED'),
              ('log_metrics', 1, 'study'), ('start_trial', 2), ('log_metrics', 0, 'trial'),
              ('log_metrics', 1, 'trial'), ('log_metrics', 2, 'trial'),
              ('end_trial', 'FINISHED'), ('log_metrics', 2, 'study'),
              ('log_metrics', 0, 'study'), ('end_study', 'FINISHED')],
 'study': ('FINISHED',
           {'scarcelab.best_params': '{"batch_size": 16, "lr": 0.020575497375253736, '
                                     '"weight_decay": 0.014417917398488479}',
            'scarcelab.best_trial': '4',
            'scarcelab.best_trial_state': 'complete',
            'scarcelab.n_complete': '2',
            'scarcelab.n_failed': '3',
            'scarcelab.n_pruned': '0'}),
 'tracker': [('trial-0', 'FINISHED', 'false', None, 'max_epochs', None),
             ('trial-1', 'FAILED', None, None, None, None),
             ('trial-2', 'FAILED', None, None, None, None),
             ('trial-3', 'FAILED', None, None, None, None),
             ('trial-4', 'FINISHED', 'false', None, 'max_epochs', None),
             ('trial-0', 'FINISHED', None, None, None, None),
             ('trial-1', 'FINISHED', None, None, None, None),
             ('trial-2', 'FINISHED', None, None, None, None)]}


THREE_ERRORS_IN_A_ROW_STOP_IT: dict[str, Any] = {
 'errors': ['', 'RuntimeError: boom 1', 'RuntimeError: boom 2', 'RuntimeError: boom 3'],
 'keys': {'log_metrics': [('asha/final_value', 'asha/rung'),
                          ('time/data_s', 'time/epoch_s', 'time/eval_s', 'time/steps',
                           'train/loss', 'train/loss_labeled', 'train/lr',
                           'val/balanced_accuracy', 'val/balanced_accuracy_avg5')],
          'set_tags': [('scarcelab.pruned', 'scarcelab.stopped')],
          'start_study': [(('scarcelab.arch', 'scarcelab.dataset', 'scarcelab.family',
                            'scarcelab.method', 'scarcelab.optuna_study',
                            'scarcelab.protocol', 'scarcelab.role', 'scarcelab.search',
                            'scarcelab.seed', 'scarcelab.study_key', 'scarcelab.test_set',
                            'scarcelab.tune_phase', 'scarcelab.version'),
                           ('arch', 'augmentation', 'batch_sizes', 'budget_minutes',
                            'data_dir', 'dataset', 'device', 'epochs', 'epochs_final',
                            'grace_period', 'max_steps_per_epoch', 'method', 'n_final',
                            'n_test', 'n_train', 'n_trials', 'n_val', 'phase', 'seed',
                            'source', 'storage', 'study_name', 'test_set', 'train_images'),
                           ('config.json',))],
          'start_trial': [('arch', 'batch_size', 'epochs', 'lr', 'trial_seed',
                           'weight_decay')]},
 'optuna': [(0, 'COMPLETE', 2, 0), (1, 'FAIL', None, 1), (2, 'FAIL', None, 2),
            (3, 'FAIL', None, 3)],
 'result': "RuntimeError('boom 3')",
 'sequence': [('start_study',
               ('scarcelab.arch', 'scarcelab.dataset', 'scarcelab.family',
                'scarcelab.method', 'scarcelab.optuna_study', 'scarcelab.protocol',
                'scarcelab.role', 'scarcelab.search', 'scarcelab.seed',
                'scarcelab.study_key', 'scarcelab.test_set', 'scarcelab.tune_phase',
                'scarcelab.version')),
              ('start_trial', 0), ('log_metrics', 0, 'trial'), ('log_metrics', 1, 'trial'),
              ('log_metrics', 2, 'trial'), ('set_tags', 'trial'), ('end_trial', 'FINISHED'),
              ('start_trial', 1), ('end_trial', 'FAILED'), ('start_trial', 2),
              ('end_trial', 'FAILED'), ('start_trial', 3), ('end_trial', 'FAILED'),
              ('end_study', 'FAILED')],
 'study': ('FAILED', {}),
 'tracker': [('trial-0', 'FINISHED', 'false', None, 'max_epochs', None),
             ('trial-1', 'FAILED', None, None, None, None),
             ('trial-2', 'FAILED', None, None, None, None),
             ('trial-3', 'FAILED', None, None, None, None)]}


A_FAILING_RETRAIN_ENDS_THE_STUDY: dict[str, Any] = {
 'errors': ['', 'pruned by ASHA after epoch 1', 'pruned by ASHA after epoch 1', '', '', '',
            'RuntimeError: boom 6'],
 'keys': {'log_metrics': [('asha/final_value', 'asha/rung'),
                          ('asha/pruned_epoch', 'asha/rung'),
                          ('best/val_balanced_accuracy_avg5',),
                          ('final/test_balanced_accuracy',),
                          ('test/accuracy', 'test/auroc', 'test/balanced_accuracy',
                           'test/pauroc_spec90', 'test/pauroc_spec90_mcclish',
                           'test/sensitivity_at_spec95'),
                          ('time/data_s', 'time/epoch_s', 'time/eval_s', 'time/steps',
                           'train/loss', 'train/loss_labeled', 'train/lr',
                           'trainval/balanced_accuracy'),
                          ('time/data_s', 'time/epoch_s', 'time/eval_s', 'time/steps',
                           'train/loss', 'train/loss_labeled', 'train/lr',
                           'val/balanced_accuracy', 'val/balanced_accuracy_avg5')],
          'set_tags': [('scarcelab.asha_rung', 'scarcelab.pruned', 'scarcelab.stopped'),
                       ('scarcelab.best_params', 'scarcelab.best_trial',
                        'scarcelab.best_trial_state'),
                       ('scarcelab.n_complete', 'scarcelab.n_failed', 'scarcelab.n_pruned'),
                       ('scarcelab.pruned', 'scarcelab.stopped')],
          'start_study': [(('scarcelab.arch', 'scarcelab.dataset', 'scarcelab.family',
                            'scarcelab.method', 'scarcelab.optuna_study',
                            'scarcelab.protocol', 'scarcelab.role', 'scarcelab.search',
                            'scarcelab.seed', 'scarcelab.study_key', 'scarcelab.test_set',
                            'scarcelab.tune_phase', 'scarcelab.version'),
                           ('arch', 'augmentation', 'batch_sizes', 'budget_minutes',
                            'data_dir', 'dataset', 'device', 'epochs', 'epochs_final',
                            'grace_period', 'max_steps_per_epoch', 'method', 'n_final',
                            'n_test', 'n_train', 'n_trials', 'n_val', 'phase', 'seed',
                            'source', 'storage', 'study_name', 'test_set', 'train_images'),
                           ('config.json',))],
          'start_trial': [('arch', 'batch_size', 'epochs', 'lr', 'retrain_seed',
                           'train_split', 'weight_decay'),
                          ('arch', 'batch_size', 'epochs', 'lr', 'trial_seed',
                           'weight_decay')]},
 'optuna': [(0, 'COMPLETE', 2, 0), (1, 'PRUNED', 1, 1), (2, 'PRUNED', 1, 2),
            (3, 'COMPLETE', 2, 3), (4, 'COMPLETE', 2, 4)],
 'result': "RuntimeError('boom 6')",
 'sequence': [('start_study',
               ('scarcelab.arch', 'scarcelab.dataset', 'scarcelab.family',
                'scarcelab.method', 'scarcelab.optuna_study', 'scarcelab.protocol',
                'scarcelab.role', 'scarcelab.search', 'scarcelab.seed',
                'scarcelab.study_key', 'scarcelab.test_set', 'scarcelab.tune_phase',
                'scarcelab.version')),
              ('start_trial', 0), ('log_metrics', 0, 'trial'), ('log_metrics', 1, 'trial'),
              ('log_metrics', 2, 'trial'), ('set_tags', 'trial'), ('end_trial', 'FINISHED'),
              ('start_trial', 1), ('log_metrics', 0, 'trial'), ('log_metrics', 1, 'trial'),
              ('set_tags', 'trial'), ('end_trial', 'KILLED'), ('start_trial', 2),
              ('log_metrics', 0, 'trial'), ('log_metrics', 1, 'trial'),
              ('set_tags', 'trial'), ('end_trial', 'KILLED'), ('start_trial', 3),
              ('log_metrics', 0, 'trial'), ('log_metrics', 1, 'trial'),
              ('log_metrics', 2, 'trial'), ('set_tags', 'trial'), ('end_trial', 'FINISHED'),
              ('start_trial', 4), ('log_metrics', 0, 'trial'), ('log_metrics', 1, 'trial'),
              ('log_metrics', 2, 'trial'), ('set_tags', 'trial'), ('end_trial', 'FINISHED'),
              ('set_tags', 'study'), ('set_tags', 'study'), ('log_metrics', 0, 'study'),
              ('start_trial', 0), ('log_metrics', 0, 'trial'), ('log_metrics', 1, 'trial'),
              ('log_metrics', 2, 'trial'), ('end_trial', 'FINISHED'),
              ('log_metrics', 0, 'study'), ('log_model',), ('start_trial', 1),
              ('end_trial', 'FAILED'), ('end_study', 'FAILED')],
 'study': ('FAILED',
           {'scarcelab.best_params': '{"batch_size": 16, "lr": 0.016934236026245303, '
                                     '"weight_decay": 0.003385224477566269}',
            'scarcelab.best_trial': '3',
            'scarcelab.best_trial_state': 'complete',
            'scarcelab.n_complete': '3',
            'scarcelab.n_failed': '0',
            'scarcelab.n_pruned': '2'}),
 'tracker': [('trial-0', 'FINISHED', 'false', None, 'max_epochs', None),
             ('trial-1', 'KILLED', 'true', '0', 'asha', 1.0),
             ('trial-2', 'KILLED', 'true', '0', 'asha', 1.0),
             ('trial-3', 'FINISHED', 'false', None, 'max_epochs', None),
             ('trial-4', 'FINISHED', 'false', None, 'max_epochs', None),
             ('trial-0', 'FINISHED', None, None, None, None),
             ('trial-1', 'FAILED', None, None, None, None)]}


A_CONFIG_ERROR_ENDS_THE_SEARCH: dict[str, Any] = {
 'errors': ['', 'scarcelab.errors.ConfigError: bad configuration 1'],
 'keys': {'log_metrics': [('asha/final_value', 'asha/rung'),
                          ('time/data_s', 'time/epoch_s', 'time/eval_s', 'time/steps',
                           'train/loss', 'train/loss_labeled', 'train/lr',
                           'val/balanced_accuracy', 'val/balanced_accuracy_avg5')],
          'set_tags': [('scarcelab.pruned', 'scarcelab.stopped')],
          'start_study': [(('scarcelab.arch', 'scarcelab.dataset', 'scarcelab.family',
                            'scarcelab.method', 'scarcelab.optuna_study',
                            'scarcelab.protocol', 'scarcelab.role', 'scarcelab.search',
                            'scarcelab.seed', 'scarcelab.study_key', 'scarcelab.test_set',
                            'scarcelab.tune_phase', 'scarcelab.version'),
                           ('arch', 'augmentation', 'batch_sizes', 'budget_minutes',
                            'data_dir', 'dataset', 'device', 'epochs', 'epochs_final',
                            'grace_period', 'max_steps_per_epoch', 'method', 'n_final',
                            'n_test', 'n_train', 'n_trials', 'n_val', 'phase', 'seed',
                            'source', 'storage', 'study_name', 'test_set', 'train_images'),
                           ('config.json',))],
          'start_trial': [('arch', 'batch_size', 'epochs', 'lr', 'trial_seed',
                           'weight_decay')]},
 'optuna': [(0, 'COMPLETE', 2, 0), (1, 'FAIL', None, 1)],
 'result': "ConfigError('bad configuration 1')",
 'sequence': [('start_study',
               ('scarcelab.arch', 'scarcelab.dataset', 'scarcelab.family',
                'scarcelab.method', 'scarcelab.optuna_study', 'scarcelab.protocol',
                'scarcelab.role', 'scarcelab.search', 'scarcelab.seed',
                'scarcelab.study_key', 'scarcelab.test_set', 'scarcelab.tune_phase',
                'scarcelab.version')),
              ('start_trial', 0), ('log_metrics', 0, 'trial'), ('log_metrics', 1, 'trial'),
              ('log_metrics', 2, 'trial'), ('set_tags', 'trial'), ('end_trial', 'FINISHED'),
              ('start_trial', 1), ('end_trial', 'FAILED'), ('end_study', 'FAILED')],
 'study': ('FAILED', {}),
 'tracker': [('trial-0', 'FINISHED', 'false', None, 'max_epochs', None),
             ('trial-1', 'FAILED', None, None, None, None)]}


def test_asha_prunes_and_the_best_configuration_is_retrained(tmp_path, monkeypatch):
    """(a) the search's trials, two of them stopped by ASHA at their first rung, then the
    three retrains of the best configuration: every call, status and score."""
    assert _run(tmp_path, monkeypatch, {}) == ASHA_AND_RETRAINS


def test_failed_trials_do_not_stop_the_search(tmp_path, monkeypatch):
    """(b) an unexpected error, a TrialFailed and a NaN objective: each trial fails, in
    Optuna and in the tracker (the NaN one was FINISHED in the tracker before), and the
    search goes on."""
    assert _run(tmp_path, monkeypatch, {1: "error", 2: "failed", 3: "nan"}) == \
        FAILURES_DO_NOT_STOP_THE_SEARCH


def test_three_unexpected_errors_in_a_row_end_the_study(tmp_path, monkeypatch):
    """(c) three unexpected errors in a row are a bug: the third is re-raised and the
    study record closed FAILED, without tags or a final phase."""
    assert _run(tmp_path, monkeypatch, {1: "error", 2: "error", 3: "error"}) == \
        THREE_ERRORS_IN_A_ROW_STOP_IT


def test_a_failing_retrain_fails_its_record_and_the_study(tmp_path, monkeypatch):
    """(d) a retrain that raises: its record FAILED with the error, the study FAILED, the
    error re-raised; no further retrain and no final mean."""
    assert _run(tmp_path, monkeypatch, {6: "error"}) == A_FAILING_RETRAIN_ENDS_THE_STUDY


def test_a_configuration_error_in_a_trial_ends_the_search_at_once(tmp_path, monkeypatch):
    """(e) a ConfigError no other configuration can fix: the trial FAILED (FAIL in
    Optuna), the study FAILED, re-raised at once."""
    assert _run(tmp_path, monkeypatch, {1: "config"}) == A_CONFIG_ERROR_ENDS_THE_SEARCH
