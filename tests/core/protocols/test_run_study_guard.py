"""Behaviour guard for ``scarcelab.protocols.search.run_study``: what the search tells its
tracker, call by call, in a few seeded scenarios, recorded on the implementation before it
was rebuilt on ``TrialRunner`` and ``Tracker.open_study`` (issue 26 item 1). The literals
below are that implementation's output, not values derived from a contract: a refactor of
the search must reproduce them exactly; a deliberate change of behaviour re-records them.

Only what a seed fixes is recorded: wall-clock metrics (``time/*``) by name, not value,
and of a failed trial's traceback only its last line (frames and line numbers are where
the code happens to be, not what it does)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import scarcelab
from scarcelab.accel import NAMES as ACCEL_NAMES
from scarcelab.errors import TrialFailed
from scarcelab.methods import METHODS, SupervisedMethod
from scarcelab.protocols.search import StudyConfig, StudyResult, run_study
from scarcelab.tracker import InMemoryTracker, ResumeState
from tests.guard_compare import assert_same_behaviour


def _cfg(**kw: Any) -> StudyConfig:
    base: dict[str, Any] = dict(
        method="sup", dataset="synthetic_tiny", budget_minutes=5.0, max_epochs=1, patience=10,
        batch_size=16, unlabeled_batch_size=32, max_steps_per_epoch=1, max_trials=2,
        arch="small_cnn", device="cpu", storage=None)
    base.update(kw)
    return StudyConfig(**base)


_TEST = ("accuracy", "auroc", "balanced_accuracy", "pauroc_spec90", "pauroc_spec90_mcclish",
         "sensitivity_at_spec95")
#: the metric sets the search logs, by name: an epoch of a trial, the study's best-so-far,
#: a trial's summary when it ends
_GROUPS = {
    "epoch": frozenset({*(f"test/{k}" for k in _TEST), "time/data_s", "time/elapsed_s",
                        "time/epoch_s", "time/eval_s", "time/steps", "train/loss",
                        "train/loss_labeled", "train/lr", "val/balanced_accuracy"}),
    "best": frozenset({*(f"best/test_{k}" for k in _TEST), "best/val_balanced_accuracy",
                       "time/diag_s", "time/elapsed_s"}),
    "trial_end": frozenset({*(f"best/test_{k}" for k in _TEST), "best/val_balanced_accuracy",
                            "best/epoch", "epochs"}),
}
#: of a known metric set, the values recorded (the others follow from them, or are clocks)
_KEPT = ("val/balanced_accuracy", "train/loss", "best/val_balanced_accuracy",
         "best/test_balanced_accuracy", "best/test_auroc", "best/epoch", "epochs")


def _metrics(metrics: dict[str, float]) -> tuple[str, dict[str, Any]]:
    keys = frozenset(metrics)
    for name, group in _GROUPS.items():
        if keys == group:
            return name, {k: round(float(metrics[k]), 8) for k in _KEPT if k in metrics}
    return "other", {k: "<time>" if k.startswith("time/") else round(float(v), 8)
                     for k, v in sorted(metrics.items())}


class _CallLog(InMemoryTracker):
    """The reference tracker, also writing every call it receives into ``calls``."""

    def __init__(self, resume: ResumeState | None = None) -> None:
        super().__init__()
        self.calls: list[tuple[Any, ...]] = []
        self._resume = resume
        self.study_tags_at_start: dict[str, str] = {}

    def start_study(self, name, tags, params, artifacts, dataset=None):  # type: ignore[no-untyped-def]
        self.calls.append(("start_study", name, sorted(artifacts)))
        self.study_tags_at_start = dict(tags)
        super().start_study(name, tags, params, artifacts, dataset)

    def start_trial(self, number, tags, params):  # type: ignore[no-untyped-def]
        self.calls.append(("start_trial", number))
        super().start_trial(number, tags, params)

    def log_metrics(self, metrics, step, scope="trial"):  # type: ignore[no-untyped-def]
        self.calls.append(("log_metrics", scope, step, *_metrics(metrics)))
        super().log_metrics(metrics, step, scope)

    def log_checkpoint(self, checkpoint, name="best.pt"):  # type: ignore[no-untyped-def]
        self.calls.append(("log_checkpoint", name, checkpoint["trial"]))
        super().log_checkpoint(checkpoint, name)

    def end_trial(self, status, error=None):  # type: ignore[no-untyped-def]
        last = None if error is None else error.strip().splitlines()[-1]
        self.calls.append(("end_trial", status, last))
        super().end_trial(status, error)

    def log_model(self, model, example):  # type: ignore[no-untyped-def]
        self.calls.append(("log_model", tuple(example.shape)))
        super().log_model(model, example)

    def log_evaluation(self, y_true, proba, class_names, split="test",  # type: ignore[no-untyped-def]
                       positive_class=None):
        self.calls.append(("log_evaluation", split, len(y_true), positive_class))
        super().log_evaluation(y_true, proba, class_names, split, positive_class)

    def log_search(self, trials):  # type: ignore[no-untyped-def]
        self.calls.append(("log_search", [(t.number, t.state.name) for t in trials]))
        super().log_search(trials)

    def end_study(self, status):  # type: ignore[no-untyped-def]
        self.calls.append(("end_study", status))
        super().end_study(status)

    def set_tags(self, tags, scope="study"):  # type: ignore[no-untyped-def]
        self.calls.append(("set_tags", scope, dict(tags)))
        super().set_tags(tags, scope)

    def resume_state(self, study_key):  # type: ignore[no-untyped-def]
        self.calls.append(("resume_state", study_key))
        return self._resume

    def mark_trials_failed(self, study_key, numbers, reason):  # type: ignore[no-untyped-def]
        self.calls.append(("mark_trials_failed", study_key, list(numbers), reason))

    def close_orphan_trials(self, completed):  # type: ignore[no-untyped-def]
        self.calls.append(("close_orphan_trials", sorted(completed)))


def _trials(t: _CallLog) -> list[tuple[Any, ...]]:
    """Each trial record: its status, params, and the tags it has beyond the study's."""
    assert t.study is not None
    start = t.study_tags_at_start
    return [(tr.name, tr.status, {k: (round(v, 8) if isinstance(v, float) else v)
                                  for k, v in sorted(tr.params.items())},
             {k: v for k, v in sorted(tr.tags.items()) if start.get(k) != v})
            for tr in t.trials]


def _study(t: _CallLog, params: bool = False) -> tuple[Any, ...]:
    """The study record: name, status, tags (but the version), params when asked. The
    precision and kernel params (issue 40, logged since) are the CPU's former behaviour
    here, checked apart so that the recorded params stay those of the recording."""
    assert t.study is not None
    assert t.study.tags["scarcelab.version"] == scarcelab.__version__
    rest = dict(t.study.params)
    accel = {k: rest.pop(k) for k in ACCEL_NAMES}
    assert accel == {"precision": "fp32", "channels_last": "weights", "cudnn_benchmark": "off",
                     "fused_optimizer": "off", "tf32": "off", "compile": "off"}
    return (t.study.name, t.study.status,
            {k: v for k, v in sorted(t.study.tags.items()) if k != "scarcelab.version"},
            dict(sorted(rest.items())) if params else None)


def _result(r: StudyResult) -> tuple[Any, ...]:
    return (r.n_trials, r.n_failed, r.best_trial, round(r.best_val, 8),
            {k: round(v, 8) for k, v in sorted(r.best_test.items())})


class _Mixed(SupervisedMethod):
    """Each kind of failed trial, by learning rate: an unexpected error (lr < 3e-4), a NaN
    loss (3e-4 <= lr < 1e-3), the method rejecting its configuration (lr > 7e-3)."""

    search_space = METHODS.get("sup").search_space
    defaults = METHODS.get("sup").defaults

    def step(self, batch, progress):  # type: ignore[no-untyped-def]
        lr = self.hp["lr"]
        if lr < 3e-4:
            raise RuntimeError(f"boom at lr {lr:.3g}")
        if lr > 7e-3:
            raise TrialFailed(f"lr {lr:.3g} rejected")
        loss = torch.nn.functional.cross_entropy(self.logits(batch.x[0]), batch.y)
        if lr < 1e-3:
            loss = loss * float("nan")
        return {"loss": loss, "loss_labeled": loss}


class _Crashes(SupervisedMethod):
    """An unexpected error (a bug, not a bad configuration) in every step."""

    search_space = METHODS.get("sup").search_space
    defaults = METHODS.get("sup").defaults

    def step(self, batch, progress):  # type: ignore[no-untyped-def]
        raise RuntimeError("boom: every step")


@pytest.fixture
def guard_methods():  # type: ignore[no-untyped-def]
    METHODS.register("guard_mixed")(_Mixed)
    METHODS.register("guard_crashes")(_Crashes)
    yield
    METHODS._entries.pop("guard_mixed")
    METHODS._entries.pop("guard_crashes")


def _record(t: _CallLog, res: StudyResult | None, params: bool = False,
            raised: str | None = None) -> dict[str, Any]:
    return {"calls": t.calls, "trials": _trials(t), "study": _study(t, params),
            "result": None if res is None else _result(res), "raised": raised}


# -- the old behaviour, as recorded --------------------------------------------------------

RANDOM = {'calls': [('start_study', 'sup-synthetic_tiny-s0', ['config.json', 'split.json']),
                ('start_trial', 0),
                ('log_metrics',
                 'trial',
                 0,
                 'epoch',
                 {'val/balanced_accuracy': 0.4, 'train/loss': 1.03176105}),
                ('log_metrics',
                 'study',
                 0,
                 'best',
                 {'best/val_balanced_accuracy': 0.4,
                  'best/test_balanced_accuracy': 0.39333333,
                  'best/test_auroc': 1.0}),
                ('log_checkpoint', 'best.pt', 0),
                ('log_metrics',
                 'trial',
                 1,
                 'trial_end',
                 {'best/val_balanced_accuracy': 0.4,
                  'best/test_balanced_accuracy': 0.39333333,
                  'best/test_auroc': 1.0,
                  'best/epoch': 0.0,
                  'epochs': 1.0}),
                ('set_tags', 'trial', {'scarcelab.stopped': 'max_epochs'}),
                ('end_trial', 'FINISHED', None),
                ('start_trial', 1),
                ('log_metrics',
                 'trial',
                 0,
                 'epoch',
                 {'val/balanced_accuracy': 0.33333333, 'train/loss': 1.13969719}),
                ('log_metrics',
                 'study',
                 1,
                 'best',
                 {'best/val_balanced_accuracy': 0.4,
                  'best/test_balanced_accuracy': 0.39333333,
                  'best/test_auroc': 1.0}),
                ('log_metrics',
                 'trial',
                 1,
                 'trial_end',
                 {'best/val_balanced_accuracy': 0.33333333,
                  'best/test_balanced_accuracy': 0.33333333,
                  'best/test_auroc': 0.5946,
                  'best/epoch': 0.0,
                  'epochs': 1.0}),
                ('set_tags', 'trial', {'scarcelab.stopped': 'max_epochs'}),
                ('end_trial', 'FINISHED', None),
                ('start_trial', 2),
                ('log_metrics',
                 'trial',
                 0,
                 'epoch',
                 {'val/balanced_accuracy': 0.33333333, 'train/loss': 1.07014072}),
                ('log_metrics',
                 'study',
                 2,
                 'best',
                 {'best/val_balanced_accuracy': 0.4,
                  'best/test_balanced_accuracy': 0.39333333,
                  'best/test_auroc': 1.0}),
                ('log_metrics',
                 'trial',
                 1,
                 'trial_end',
                 {'best/val_balanced_accuracy': 0.33333333,
                  'best/test_balanced_accuracy': 0.33333333,
                  'best/test_auroc': 0.75333333,
                  'best/epoch': 0.0,
                  'epochs': 1.0}),
                ('set_tags', 'trial', {'scarcelab.stopped': 'max_epochs'}),
                ('end_trial', 'FINISHED', None),
                ('set_tags',
                 'study',
                 {'scarcelab.n_trials': '3',
                  'scarcelab.n_failed': '0',
                  'scarcelab.best_trial': '0'}),
                ('log_model', (2, 1, 16, 16)),
                ('log_evaluation', 'test', 150, None),
                ('log_search', [(0, 'COMPLETE'), (1, 'COMPLETE'), (2, 'COMPLETE')]),
                ('end_study', 'FINISHED')],
      'trials': [('trial-0',
                  'FINISHED',
                  {'arch': 'small_cnn',
                   'batch_size': 16,
                   'lr': 0.00365148,
                   'trial_seed': 0,
                   'unlabeled_batch_size': 32,
                   'weight_decay': 8.734e-05},
                  {'scarcelab.role': 'trial',
                   'scarcelab.stopped': 'max_epochs',
                   'scarcelab.trial': '0'}),
                 ('trial-1',
                  'FINISHED',
                  {'arch': 'small_cnn',
                   'batch_size': 16,
                   'lr': 4.25e-05,
                   'trial_seed': 1,
                   'unlabeled_batch_size': 32,
                   'weight_decay': 2.019e-05},
                  {'scarcelab.role': 'trial',
                   'scarcelab.stopped': 'max_epochs',
                   'scarcelab.trial': '1'}),
                 ('trial-2',
                  'FINISHED',
                  {'arch': 'small_cnn',
                   'batch_size': 16,
                   'lr': 0.00013385,
                   'trial_seed': 2,
                   'unlabeled_batch_size': 32,
                   'weight_decay': 0.00264929},
                  {'scarcelab.role': 'trial',
                   'scarcelab.stopped': 'max_epochs',
                   'scarcelab.trial': '2'})],
      'study': ('sup-synthetic_tiny-s0',
                'FINISHED',
                {'scarcelab.arch': 'small_cnn',
                 'scarcelab.best_trial': '0',
                 'scarcelab.dataset': 'synthetic_tiny',
                 'scarcelab.family': 'supervised',
                 'scarcelab.method': 'sup',
                 'scarcelab.n_failed': '0',
                 'scarcelab.n_trials': '3',
                 'scarcelab.optuna_study': 'study-1e4b435ae11e471a',
                 'scarcelab.role': 'study',
                 'scarcelab.search': 'random',
                 'scarcelab.seed': '0',
                 'scarcelab.split_hash': '8e3a62931ca1',
                 'scarcelab.study_key': 'study-1e4b435ae11e471a',
                 'scarcelab.val_from': 'official'},
                {'allow_large_val': False,
                 'arch': 'small_cnn',
                 'batch_size': 16,
                 'budget_clock': 'wall',
                 'budget_minutes': 5.0,
                 'class_weights': 'balanced',
                 'data_dir': None,
                 'dataset': 'synthetic_tiny',
                 'device': 'cpu',
                 'diag_samples': 512,
                 'eval_every_steps': 0,
                 'family': None,
                 'final_reserve_s': 8.0,
                 'hparams_source': 'defaults',
                 'label_fraction': 1.0,
                 'max_epochs': 1,
                 'max_steps_per_epoch': 1,
                 'max_trials': 3,
                 'method': 'sup',
                 'n_labeled': 30,
                 'n_test': 150,
                 'n_unlabeled': 570,
                 'n_val': 30,
                 'patience': 10,
                 'positive_class': None,
                 'probe_solver': 'sklearn',
                 'schedule_horizon': 'epochs',
                 'search': 'random',
                 'seed': 0,
                 'storage': '',
                 'study_name': None,
                 'sweep_point': '',
                 'transfer_epochs': None,
                 'transfer_patience': 20,
                 'unlabeled_batch_size': 32,
                 'val_from': 'official'}),
      'result': (3,
                 0,
                 0,
                 0.4,
                 {'accuracy': 0.39333333,
                  'auroc': 1.0,
                  'balanced_accuracy': 0.39333333,
                  'pauroc_spec90': 1.0,
                  'pauroc_spec90_mcclish': 1.0,
                  'sensitivity_at_spec95': 1.0}),
      'raised': None}

FAILURES = {'calls': [('start_study', 'guard_mixed-synthetic_tiny-s0',
                        ['config.json', 'split.json']),
                  ('start_trial', 0),
                  ('log_metrics',
                   'trial',
                   0,
                   'epoch',
                   {'val/balanced_accuracy': 0.4, 'train/loss': 1.03176105}),
                  ('log_metrics',
                   'study',
                   0,
                   'best',
                   {'best/val_balanced_accuracy': 0.4,
                    'best/test_balanced_accuracy': 0.39333333,
                    'best/test_auroc': 1.0}),
                  ('log_checkpoint', 'best.pt', 0),
                  ('log_metrics',
                   'trial',
                   1,
                   'trial_end',
                   {'best/val_balanced_accuracy': 0.4,
                    'best/test_balanced_accuracy': 0.39333333,
                    'best/test_auroc': 1.0,
                    'best/epoch': 0.0,
                    'epochs': 1.0}),
                  ('set_tags', 'trial', {'scarcelab.stopped': 'max_epochs'}),
                  ('end_trial', 'FINISHED', None),
                  ('start_trial', 1),
                  ('end_trial', 'FAILED', 'RuntimeError: boom at lr 4.25e-05'),
                  ('start_trial', 2),
                  ('end_trial', 'FAILED', 'RuntimeError: boom at lr 0.000134'),
                  ('start_trial', 3),
                  ('log_metrics',
                   'trial',
                   0,
                   'epoch',
                   {'val/balanced_accuracy': 1.0, 'train/loss': 1.0632987}),
                  ('log_metrics',
                   'study',
                   1,
                   'best',
                   {'best/val_balanced_accuracy': 1.0,
                    'best/test_balanced_accuracy': 1.0,
                    'best/test_auroc': 1.0}),
                  ('log_metrics',
                   'trial',
                   1,
                   'trial_end',
                   {'best/val_balanced_accuracy': 1.0,
                    'best/test_balanced_accuracy': 1.0,
                    'best/test_auroc': 1.0,
                    'best/epoch': 0.0,
                    'epochs': 1.0}),
                  ('set_tags', 'trial', {'scarcelab.stopped': 'max_epochs'}),
                  ('end_trial', 'FINISHED', None),
                  ('log_checkpoint', 'best.pt', 3),
                  ('start_trial', 4),
                  ('log_metrics',
                   'trial',
                   0,
                   'epoch',
                   {'val/balanced_accuracy': 0.66666667, 'train/loss': 1.10107684}),
                  ('log_metrics',
                   'study',
                   2,
                   'best',
                   {'best/val_balanced_accuracy': 1.0,
                    'best/test_balanced_accuracy': 1.0,
                    'best/test_auroc': 1.0}),
                  ('log_metrics',
                   'trial',
                   1,
                   'trial_end',
                   {'best/val_balanced_accuracy': 0.66666667,
                    'best/test_balanced_accuracy': 0.66666667,
                    'best/test_auroc': 1.0,
                    'best/epoch': 0.0,
                    'epochs': 1.0}),
                  ('set_tags', 'trial', {'scarcelab.stopped': 'max_epochs'}),
                  ('end_trial', 'FINISHED', None),
                  ('start_trial', 5),
                  ('end_trial', 'FAILED', 'lr 0.00728 rejected'),
                  ('start_trial', 6),
                  ('end_trial', 'FAILED', 'non-finite loss (nan) at epoch 0, step 0'),
                  ('start_trial', 7),
                  ('end_trial', 'FAILED', 'lr 0.0115 rejected'),
                  ('set_tags',
                   'study',
                   {'scarcelab.n_trials': '8',
                    'scarcelab.n_failed': '5',
                    'scarcelab.best_trial': '3'}),
                  ('log_model', (2, 1, 16, 16)),
                  ('log_evaluation', 'test', 150, None),
                  ('log_search',
                   [(0, 'COMPLETE'),
                    (1, 'FAIL'),
                    (2, 'FAIL'),
                    (3, 'COMPLETE'),
                    (4, 'COMPLETE'),
                    (5, 'FAIL'),
                    (6, 'FAIL'),
                    (7, 'FAIL')]),
                  ('end_study', 'FINISHED')],
        'trials': [('trial-0',
                    'FINISHED',
                    {'arch': 'small_cnn',
                     'batch_size': 16,
                     'lr': 0.00365148,
                     'trial_seed': 0,
                     'unlabeled_batch_size': 32,
                     'weight_decay': 8.734e-05},
                    {'scarcelab.role': 'trial',
                     'scarcelab.stopped': 'max_epochs',
                     'scarcelab.trial': '0'}),
                   ('trial-1',
                    'FAILED',
                    {'arch': 'small_cnn',
                     'batch_size': 16,
                     'lr': 4.25e-05,
                     'trial_seed': 1,
                     'unlabeled_batch_size': 32,
                     'weight_decay': 2.019e-05},
                    {'scarcelab.role': 'trial', 'scarcelab.trial': '1'}),
                   ('trial-2',
                    'FAILED',
                    {'arch': 'small_cnn',
                     'batch_size': 16,
                     'lr': 0.00013385,
                     'trial_seed': 2,
                     'unlabeled_batch_size': 32,
                     'weight_decay': 0.00264929},
                    {'scarcelab.role': 'trial', 'scarcelab.trial': '2'}),
                   ('trial-3',
                    'FINISHED',
                    {'arch': 'small_cnn',
                     'batch_size': 16,
                     'lr': 0.00508027,
                     'trial_seed': 3,
                     'unlabeled_batch_size': 32,
                     'weight_decay': 0.00031568},
                    {'scarcelab.role': 'trial',
                     'scarcelab.stopped': 'max_epochs',
                     'scarcelab.trial': '3'}),
                   ('trial-4',
                    'FINISHED',
                    {'arch': 'small_cnn',
                     'batch_size': 16,
                     'lr': 0.00617265,
                     'trial_seed': 4,
                     'unlabeled_batch_size': 32,
                     'weight_decay': 0.00093592},
                    {'scarcelab.role': 'trial',
                     'scarcelab.stopped': 'max_epochs',
                     'scarcelab.trial': '4'}),
                   ('trial-5',
                    'FAILED',
                    {'arch': 'small_cnn',
                     'batch_size': 16,
                     'lr': 0.00728357,
                     'trial_seed': 5,
                     'unlabeled_batch_size': 32,
                     'weight_decay': 0.00166888},
                    {'scarcelab.role': 'trial', 'scarcelab.trial': '5'}),
                   ('trial-6',
                    'FAILED',
                    {'arch': 'small_cnn',
                     'batch_size': 16,
                     'lr': 0.0003671,
                     'trial_seed': 6,
                     'unlabeled_batch_size': 32,
                     'weight_decay': 0.00021403},
                    {'scarcelab.role': 'trial', 'scarcelab.trial': '6'}),
                   ('trial-7',
                    'FAILED',
                    {'arch': 'small_cnn',
                     'batch_size': 16,
                     'lr': 0.01146315,
                     'trial_seed': 7,
                     'unlabeled_batch_size': 32,
                     'weight_decay': 0.00089896},
                    {'scarcelab.role': 'trial', 'scarcelab.trial': '7'})],
        'study': ('guard_mixed-synthetic_tiny-s0',
                  'FINISHED',
                  {'scarcelab.arch': 'small_cnn',
                   'scarcelab.best_trial': '3',
                   'scarcelab.dataset': 'synthetic_tiny',
                   'scarcelab.family': 'supervised',
                   'scarcelab.method': 'guard_mixed',
                   'scarcelab.n_failed': '5',
                   'scarcelab.n_trials': '8',
                   'scarcelab.optuna_study': 'study-019cf76059b666ec',
                   'scarcelab.role': 'study',
                   'scarcelab.search': 'random',
                   'scarcelab.seed': '0',
                   'scarcelab.split_hash': '8e3a62931ca1',
                   'scarcelab.study_key': 'study-019cf76059b666ec',
                   'scarcelab.val_from': 'official'},
                  None),
        'result': (8,
                   5,
                   3,
                   1.0,
                   {'accuracy': 1.0,
                    'auroc': 1.0,
                    'balanced_accuracy': 1.0,
                    'pauroc_spec90': 1.0,
                    'pauroc_spec90_mcclish': 1.0,
                    'sensitivity_at_spec95': 1.0}),
        'raised': None}

ERRORS_IN_A_ROW = {'calls': [('start_study', 'guard_crashes-synthetic_tiny-s0',
                               ['config.json', 'split.json']),
                         ('start_trial', 0),
                         ('end_trial', 'FAILED', 'RuntimeError: boom: every step'),
                         ('start_trial', 1),
                         ('end_trial', 'FAILED', 'RuntimeError: boom: every step'),
                         ('start_trial', 2),
                         ('end_trial', 'FAILED', 'RuntimeError: boom: every step'),
                         ('end_study', 'FAILED')],
               'trials': [('trial-0',
                           'FAILED',
                           {'arch': 'small_cnn',
                            'batch_size': 16,
                            'lr': 0.00365148,
                            'trial_seed': 0,
                            'unlabeled_batch_size': 32,
                            'weight_decay': 8.734e-05},
                           {'scarcelab.role': 'trial', 'scarcelab.trial': '0'}),
                          ('trial-1',
                           'FAILED',
                           {'arch': 'small_cnn',
                            'batch_size': 16,
                            'lr': 4.25e-05,
                            'trial_seed': 1,
                            'unlabeled_batch_size': 32,
                            'weight_decay': 2.019e-05},
                           {'scarcelab.role': 'trial', 'scarcelab.trial': '1'}),
                          ('trial-2',
                           'FAILED',
                           {'arch': 'small_cnn',
                            'batch_size': 16,
                            'lr': 0.00013385,
                            'trial_seed': 2,
                            'unlabeled_batch_size': 32,
                            'weight_decay': 0.00264929},
                           {'scarcelab.role': 'trial', 'scarcelab.trial': '2'})],
               'study': ('guard_crashes-synthetic_tiny-s0',
                         'FAILED',
                         {'scarcelab.arch': 'small_cnn',
                          'scarcelab.dataset': 'synthetic_tiny',
                          'scarcelab.family': 'supervised',
                          'scarcelab.method': 'guard_crashes',
                          'scarcelab.optuna_study': 'study-de5eb317c9daf59e',
                          'scarcelab.role': 'study',
                          'scarcelab.search': 'random',
                          'scarcelab.seed': '0',
                          'scarcelab.split_hash': '8e3a62931ca1',
                          'scarcelab.study_key': 'study-de5eb317c9daf59e',
                          'scarcelab.val_from': 'official'},
                         None),
               'result': None,
               'raised': "RuntimeError('boom: every step')"}

RESUME = [{'calls': [('resume_state', 'guard'),
                 ('start_study', 'sup-synthetic_tiny-s0', ['config.json', 'split.json']),
                 ('start_trial', 0),
                 ('log_metrics',
                  'trial',
                  0,
                  'epoch',
                  {'val/balanced_accuracy': 0.4, 'train/loss': 1.03176105}),
                 ('log_metrics',
                  'study',
                  0,
                  'best',
                  {'best/val_balanced_accuracy': 0.4,
                   'best/test_balanced_accuracy': 0.39333333,
                   'best/test_auroc': 1.0}),
                 ('log_checkpoint', 'best.pt', 0),
                 ('log_metrics',
                  'trial',
                  1,
                  'trial_end',
                  {'best/val_balanced_accuracy': 0.4,
                   'best/test_balanced_accuracy': 0.39333333,
                   'best/test_auroc': 1.0,
                   'best/epoch': 0.0,
                   'epochs': 1.0}),
                 ('set_tags', 'trial', {'scarcelab.stopped': 'max_epochs'}),
                 ('end_trial', 'FINISHED', None),
                 ('set_tags',
                  'study',
                  {'scarcelab.n_trials': '1',
                   'scarcelab.n_failed': '0',
                   'scarcelab.best_trial': '0'}),
                 ('log_model', (2, 1, 16, 16)),
                 ('log_evaluation', 'test', 150, None),
                 ('log_search', [(0, 'COMPLETE')]),
                 ('end_study', 'FINISHED')],
       'trials': [('trial-0',
                   'FINISHED',
                   {'arch': 'small_cnn',
                    'batch_size': 16,
                    'lr': 0.00365148,
                    'trial_seed': 0,
                    'unlabeled_batch_size': 32,
                    'weight_decay': 8.734e-05},
                   {'scarcelab.role': 'trial',
                    'scarcelab.stopped': 'max_epochs',
                    'scarcelab.trial': '0'})],
       'study': ('sup-synthetic_tiny-s0',
                 'FINISHED',
                 {'scarcelab.arch': 'small_cnn',
                  'scarcelab.best_trial': '0',
                  'scarcelab.dataset': 'synthetic_tiny',
                  'scarcelab.family': 'supervised',
                  'scarcelab.method': 'sup',
                  'scarcelab.n_failed': '0',
                  'scarcelab.n_trials': '1',
                  'scarcelab.optuna_study': 'guard',
                  'scarcelab.role': 'study',
                  'scarcelab.search': 'random',
                  'scarcelab.seed': '0',
                  'scarcelab.split_hash': '8e3a62931ca1',
                  'scarcelab.study_key': 'guard',
                  'scarcelab.val_from': 'official'},
                 None),
       'result': (1,
                  0,
                  0,
                  0.4,
                  {'accuracy': 0.39333333,
                   'auroc': 1.0,
                   'balanced_accuracy': 0.39333333,
                   'pauroc_spec90': 1.0,
                   'pauroc_spec90_mcclish': 1.0,
                   'sensitivity_at_spec95': 1.0}),
       'raised': None},
      {'calls': [('resume_state', 'guard'),
                 ('close_orphan_trials', [0]),
                 ('start_study', 'sup-synthetic_tiny-s0', ['config.json', 'split.json']),
                 ('start_trial', 1),
                 ('log_metrics',
                  'trial',
                  0,
                  'epoch',
                  {'val/balanced_accuracy': 0.33333333, 'train/loss': 1.13969719}),
                 ('log_metrics',
                  'study',
                  1,
                  'best',
                  {'best/val_balanced_accuracy': 0.4,
                   'best/test_balanced_accuracy': 0.39333333,
                   'best/test_auroc': 1.0}),
                 ('log_checkpoint', 'best.pt', 0),
                 ('log_metrics',
                  'trial',
                  1,
                  'trial_end',
                  {'best/val_balanced_accuracy': 0.33333333,
                   'best/test_balanced_accuracy': 0.33333333,
                   'best/test_auroc': 0.5946,
                   'best/epoch': 0.0,
                   'epochs': 1.0}),
                 ('set_tags', 'trial', {'scarcelab.stopped': 'max_epochs'}),
                 ('end_trial', 'FINISHED', None),
                 ('set_tags',
                  'study',
                  {'scarcelab.n_trials': '2',
                   'scarcelab.n_failed': '0',
                   'scarcelab.best_trial': '0'}),
                 ('log_model', (2, 1, 16, 16)),
                 ('log_evaluation', 'test', 150, None),
                 ('log_search', [(0, 'COMPLETE'), (1, 'COMPLETE')]),
                 ('end_study', 'FINISHED')],
       'trials': [('trial-1',
                   'FINISHED',
                   {'arch': 'small_cnn',
                    'batch_size': 16,
                    'lr': 4.25e-05,
                    'trial_seed': 1,
                    'unlabeled_batch_size': 32,
                    'weight_decay': 2.019e-05},
                   {'scarcelab.role': 'trial',
                    'scarcelab.stopped': 'max_epochs',
                    'scarcelab.trial': '1'})],
       'study': ('sup-synthetic_tiny-s0',
                 'FINISHED',
                 {'scarcelab.arch': 'small_cnn',
                  'scarcelab.best_trial': '0',
                  'scarcelab.dataset': 'synthetic_tiny',
                  'scarcelab.family': 'supervised',
                  'scarcelab.method': 'sup',
                  'scarcelab.n_failed': '0',
                  'scarcelab.n_trials': '2',
                  'scarcelab.optuna_study': 'guard',
                  'scarcelab.role': 'study',
                  'scarcelab.search': 'random',
                  'scarcelab.seed': '0',
                  'scarcelab.split_hash': '8e3a62931ca1',
                  'scarcelab.study_key': 'guard',
                  'scarcelab.val_from': 'official'},
                 None),
       'result': (2,
                  0,
                  0,
                  0.4,
                  {'accuracy': 0.39333333,
                   'auroc': 1.0,
                   'balanced_accuracy': 0.39333333,
                   'pauroc_spec90': 1.0,
                   'pauroc_spec90_mcclish': 1.0,
                   'sensitivity_at_spec95': 1.0}),
       'raised': None},
      {'calls': [('resume_state', 'guard'),
                 ('close_orphan_trials', [0, 1]),
                 ('start_study', 'sup-synthetic_tiny-s0', ['config.json', 'split.json']),
                 ('log_metrics',
                  'study',
                  2,
                  'best',
                  {'best/val_balanced_accuracy': 0.4,
                   'best/test_balanced_accuracy': 0.39333333,
                   'best/test_auroc': 1.0}),
                 ('set_tags',
                  'study',
                  {'scarcelab.n_trials': '2',
                   'scarcelab.n_failed': '0',
                   'scarcelab.best_trial': '0'}),
                 ('log_model', (2, 1, 16, 16)),
                 ('log_evaluation', 'test', 150, None),
                 ('log_search', [(0, 'COMPLETE'), (1, 'COMPLETE')]),
                 ('end_study', 'FINISHED')],
       'trials': [],
       'study': ('sup-synthetic_tiny-s0',
                 'FINISHED',
                 {'scarcelab.arch': 'small_cnn',
                  'scarcelab.best_trial': '0',
                  'scarcelab.dataset': 'synthetic_tiny',
                  'scarcelab.family': 'supervised',
                  'scarcelab.method': 'sup',
                  'scarcelab.n_failed': '0',
                  'scarcelab.n_trials': '2',
                  'scarcelab.optuna_study': 'guard',
                  'scarcelab.role': 'study',
                  'scarcelab.search': 'random',
                  'scarcelab.seed': '0',
                  'scarcelab.split_hash': '8e3a62931ca1',
                  'scarcelab.study_key': 'guard',
                  'scarcelab.val_from': 'official'},
                 None),
       'result': (2,
                  0,
                  0,
                  0.4,
                  {'accuracy': 0.39333333,
                   'auroc': 1.0,
                   'balanced_accuracy': 0.39333333,
                   'pauroc_spec90': 1.0,
                   'pauroc_spec90_mcclish': 1.0,
                   'sensitivity_at_spec95': 1.0}),
       'raised': None}]


# -- the scenarios -------------------------------------------------------------------------


def test_a_random_search_of_three_trials() -> None:
    t = _CallLog()
    res = run_study(_cfg(max_trials=3), t)
    assert_same_behaviour(_record(t, res, params=True), RANDOM)


def test_failed_trials_are_recorded_and_the_search_goes_on(guard_methods: None) -> None:
    """Unexpected errors not in a row, a NaN loss and a rejected configuration: each trial
    FAILED with its reason, the search runs all 8 and ends FINISHED."""
    t = _CallLog()
    res = run_study(_cfg(method="guard_mixed", max_trials=8), t)
    assert_same_behaviour(_record(t, res), FAILURES)


def test_unexpected_errors_in_a_row_abort_the_study(guard_methods: None) -> None:
    """The third unexpected error in a row is re-raised; the study record ends FAILED."""
    t = _CallLog()
    with pytest.raises(RuntimeError, match="boom: every step") as err:
        run_study(_cfg(method="guard_crashes", max_trials=6), t)
    assert_same_behaviour(_record(t, None, raised=repr(err.value)), ERRORS_IN_A_ROW)


def test_a_resumed_study_continues_the_search_and_its_best(tmp_path: Path) -> None:
    """A study of one trial; resumed (on a new record) with a second slot, it runs trial 1
    and keeps trial 0's checkpoint; resumed again with no slot left, it trains nothing and
    ends its best/* series with the restored answer."""
    url = f"sqlite:///{tmp_path}/optuna.db"
    t1 = _CallLog()
    r1 = run_study(_cfg(max_trials=1, storage=url, study_name="guard"), t1)
    t2 = _CallLog(ResumeState("guard", 2.0, 1, r1.best_checkpoint, same_record=False))
    r2 = run_study(_cfg(max_trials=2, storage=url, study_name="guard"), t2)
    t3 = _CallLog(ResumeState("guard", 3.0, 2, r2.best_checkpoint, same_record=True))
    r3 = run_study(_cfg(max_trials=2, storage=url, study_name="guard"), t3)
    assert_same_behaviour([_record(t1, r1), _record(t2, r2), _record(t3, r3)], RESUME)
