"""Behaviour guard for ``scarcelab.train.train_trial``, the epoch loop every method trains
in: what it reports, epoch by epoch, and in what order, in a few seeded scenarios that take
each of its branches (early stop on validation and on train loss, ``max_epochs``, a budget
that ends inside an epoch and one that ends before the next, diagnostics paused out of the
budget, a linear probe, a NaN loss, a bad ``stop_on``).

The literals below were recorded on the loop before it was split into named pieces: a
refactor must reproduce them exactly, a deliberate change of behaviour re-records them.
A fake clock makes every ``time/*`` metric a fixed number, so those are recorded too; the
RNGs' states after training pin that the same random draws were made in the same order.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
import pytest
import torch

import scarcelab.train as train_mod
from scarcelab.errors import TrialFailed
from scarcelab.methods import get_method
from scarcelab.models import create_model

STEP_S, EVAL_S, DIAG_S = 2.0, 1.0, 0.5


class _Clock:
    """``time.time`` and ``time.perf_counter`` of the loop, advanced by the stand-ins."""

    def __init__(self) -> None:
        self.t = 1_000_000.0

    def time(self) -> float:
        return self.t

    perf_counter = time


def _r(x: Any) -> Any:
    return round(float(x), 8)


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def _trace(monkeypatch: pytest.MonkeyPatch, bundle: Any, method: str = "sup", *,
           budget_s: float | None = None, diag: bool = False, nan_at: int | None = None,
           **cfg_kw: Any) -> dict[str, Any]:
    """Train one seeded trial and return everything it did, in order."""
    clock = _Clock()
    monkeypatch.setattr(train_mod, "time", clock)
    events: list[Any] = []
    step, ev = train_mod.optimizer_step, train_mod.evaluate

    def slow_step(m: Any, opt: Any, sched: Any, batch: Any, progress: Any) -> Any:
        clock.t += STEP_S
        events.append(("step", progress.epoch, progress.step, progress.total_steps))
        if nan_at is not None and progress.step == nan_at:
            real = m.step
            m.step = lambda b, p: {k: v * float("nan") for k, v in real(b, p).items()}
            try:
                return step(m, opt, sched, batch, progress)
            finally:
                m.step = real
        return step(m, opt, sched, batch, progress)

    def slow_eval(*a: Any, **k: Any) -> Any:
        clock.t += EVAL_S
        events.append(("eval", clock.t))
        return ev(*a, **k)

    monkeypatch.setattr(train_mod, "optimizer_step", slow_step)
    monkeypatch.setattr(train_mod, "evaluate", slow_eval)

    def diagnostics(m: Any, epoch: int) -> dict[str, float]:
        clock.t += DIAG_S
        events.append(("diag", epoch, clock.t))
        return {"diag/epoch": float(epoch)}

    snaps: list[Any] = []

    def on_epoch(rep: train_mod.EpochReport, improved: bool, snap: Any) -> None:
        proba = None if rep.test_proba is None else _digest(
            [_r(v) for v in np.asarray(rep.test_proba).ravel()])
        events.append(("on_epoch", rep.epoch, improved, _r(rep.val_balanced_accuracy),
                       {k: _r(v) for k, v in sorted(rep.metrics.items())},
                       {k: _r(v) for k, v in sorted(rep.test_metrics.items())}, proba))
        if improved:
            s = snap()
            snaps.append(snap)
            events.append(("snapshot", s["epoch"], _r(s["val_balanced_accuracy"]),
                           s["probe"] is not None, len(s["state_dict"])))

    cls = get_method(method)
    torch.manual_seed(0)
    m = cls(create_model("small_cnn", in_channels=1), bundle.num_classes, dict(cls.defaults))
    cfg = train_mod.TrainConfig(**cfg_kw)
    g = torch.Generator().manual_seed(1)
    prng = np.random.default_rng(2)
    deadline: Any = 1e18 if budget_s is None else train_mod.Budget(budget_s)
    out: dict[str, Any] = {}
    try:
        res = train_mod.train_trial(m, bundle, cfg, deadline=deadline, generator=g,
                                    probe_rng=prng, callbacks=[
                                        *([train_mod.Diagnostics(diagnostics)] if diag else []),
                                        train_mod.OnEpochEnd(on_epoch)])
        out["result"] = (_r(res.best_val), res.best_epoch,
                         {k: _r(v) for k, v in sorted(res.best_test.items())}, res.epochs,
                         res.steps, res.stopped, res.best_state, _r(res.step_s),
                         _r(res.eval_s))
    except (TrialFailed, ValueError) as e:
        out["raised"] = (type(e).__name__, str(e))
    if snaps:  # a checkpoint taken after training: this epoch's extras, today's weights
        late = snaps[0]()
        out["late_snapshot"] = (late["epoch"], _r(late["val_balanced_accuracy"]))
    if isinstance(deadline, train_mod.Budget):
        out["budget"] = (_r(deadline.elapsed()), _r(deadline.excluded_s))
    out["clock"] = _r(clock.t)
    out["rng"] = (_digest(g.get_state().tolist()), _r(prng.random()),
                  _r(torch.rand(1).item()))
    out["weights"] = _r(sum(p.double().sum().item() for p in m.parameters()))
    out["train_mode"] = m.training
    out["events"] = _digest(events)
    out["kinds"] = [e[0] for e in events]
    out["stops"] = [(e[1], e[2]) for e in events if e[0] == "on_epoch"]
    return out


# -- the recorded scenarios ------------------------------------------------------------------
SCENARIOS: dict[str, dict[str, Any]] = {
    "val_patience": dict(max_epochs=12, patience=2, max_steps_per_epoch=2, batch_labeled=8,
                         diag=True, class_weights="balanced"),
    "max_epochs": dict(max_epochs=2, patience=100, max_steps_per_epoch=3, batch_labeled=8),
    "train_loss": dict(stop_on="train_loss", max_epochs=10, patience=1, max_steps_per_epoch=2,
                       batch_labeled=8),
    "budget_inside_epoch": dict(budget_s=12.0, max_epochs=100, patience=100,
                                max_steps_per_epoch=3, batch_labeled=8, diag=True),
    "budget_at_epoch_end": dict(budget_s=6.0, max_epochs=100, patience=100,
                                max_steps_per_epoch=1, batch_labeled=8),
    "budget_none": dict(budget_s=0.0, max_epochs=5, batch_labeled=8),
    "probe": dict(method="simclr", max_epochs=2, max_steps_per_epoch=1, batch_labeled=8,
                  batch_unlabeled=8, diag=True),
    "nan_loss": dict(nan_at=3, max_epochs=5, max_steps_per_epoch=2, batch_labeled=8),
    "bad_stop_on": dict(stop_on="best", batch_labeled=8),
}


EXPECTED: dict[str, dict[str, Any]] = {'val_patience': {'result': (1.0,
                             0,
                             {'accuracy': 1.0,
                              'auroc': 1.0,
                              'balanced_accuracy': 1.0,
                              'pauroc_spec90': 1.0,
                              'pauroc_spec90_mcclish': 1.0,
                              'sensitivity_at_spec95': 1.0},
                             3,
                             6,
                             'patience',
                             None,
                             2.0,
                             1.0),
                  'late_snapshot': (0, 1.0),
                  'clock': 1000016.5,
                  'rng': ('11467aab4034110b', 0.26161213, 0.60235423),
                  'weights': 218.16806083,
                  'train_mode': True,
                  'events': '71b1dc0e2b025e46',
                  'kinds': ['step',
                            'step',
                            'diag',
                            'eval',
                            'on_epoch',
                            'snapshot',
                            'step',
                            'step',
                            'diag',
                            'eval',
                            'on_epoch',
                            'step',
                            'step',
                            'diag',
                            'eval',
                            'on_epoch'],
                  'stops': [(0, True), (1, False), (2, False)]},
 'max_epochs': {'result': (1.0,
                           0,
                           {'accuracy': 1.0,
                            'auroc': 1.0,
                            'balanced_accuracy': 1.0,
                            'pauroc_spec90': 1.0,
                            'pauroc_spec90_mcclish': 1.0,
                            'sensitivity_at_spec95': 1.0},
                           2,
                           6,
                           'max_epochs',
                           None,
                           2.0,
                           1.0),
                'late_snapshot': (0, 1.0),
                'clock': 1000014.0,
                'rng': ('11467aab4034110b', 0.26161213, 0.60235423),
                'weights': 226.91697523,
                'train_mode': True,
                'events': 'a397712236873a89',
                'kinds': ['step',
                          'step',
                          'step',
                          'eval',
                          'on_epoch',
                          'snapshot',
                          'step',
                          'step',
                          'step',
                          'eval',
                          'on_epoch'],
                'stops': [(0, True), (1, False)]},
 'train_loss': {'result': (1.0,
                           2,
                           {'accuracy': 1.0,
                            'auroc': 1.0,
                            'balanced_accuracy': 1.0,
                            'pauroc_spec90': 1.0,
                            'pauroc_spec90_mcclish': 1.0,
                            'sensitivity_at_spec95': 1.0},
                           3,
                           6,
                           'patience',
                           None,
                           2.0,
                           1.0),
                'late_snapshot': (0, 1.0),
                'clock': 1000015.0,
                'rng': ('11467aab4034110b', 0.26161213, 0.60235423),
                'weights': 218.56694626,
                'train_mode': True,
                'events': '1cb926ab615cea7a',
                'kinds': ['step',
                          'step',
                          'eval',
                          'on_epoch',
                          'snapshot',
                          'step',
                          'step',
                          'eval',
                          'on_epoch',
                          'snapshot',
                          'step',
                          'step',
                          'eval',
                          'on_epoch',
                          'snapshot'],
                'stops': [(0, True), (1, True), (2, True)]},
 'budget_inside_epoch': {'result': (1.0,
                                    0,
                                    {'accuracy': 1.0,
                                     'auroc': 1.0,
                                     'balanced_accuracy': 1.0,
                                     'pauroc_spec90': 1.0,
                                     'pauroc_spec90_mcclish': 1.0,
                                     'sensitivity_at_spec95': 1.0},
                                    2,
                                    4,
                                    'budget',
                                    None,
                                    2.0,
                                    1.0),
                         'late_snapshot': (0, 1.0),
                         'budget': (10.0, 1.0),
                         'clock': 1000011.0,
                         'rng': ('3b8328f04ab6396b', 0.26161213, 0.60235423),
                         'weights': 226.4024267,
                         'train_mode': True,
                         'events': '1ce71c2f6ee17674',
                         'kinds': ['step',
                                   'step',
                                   'step',
                                   'diag',
                                   'eval',
                                   'on_epoch',
                                   'snapshot',
                                   'step',
                                   'diag',
                                   'eval',
                                   'on_epoch'],
                         'stops': [(0, True), (1, False)]},
 'budget_at_epoch_end': {'result': (0.96666667,
                                    0,
                                    {'accuracy': 0.99333333,
                                     'auroc': 1.0,
                                     'balanced_accuracy': 0.99333333,
                                     'pauroc_spec90': 1.0,
                                     'pauroc_spec90_mcclish': 1.0,
                                     'sensitivity_at_spec95': 1.0},
                                    1,
                                    1,
                                    'budget',
                                    None,
                                    2.0,
                                    1.0),
                         'late_snapshot': (0, 0.96666667),
                         'budget': (3.0, 0.0),
                         'clock': 1000003.0,
                         'rng': ('662ec0fc5807b8ab', 0.26161213, 0.60235423),
                         'weights': 225.26054767,
                         'train_mode': True,
                         'events': 'fe196d68580ec55b',
                         'kinds': ['step', 'eval', 'on_epoch', 'snapshot'],
                         'stops': [(0, True)]},
 'budget_none': {'result': (-1.0, -1, {}, 0, 0, 'budget', None, 0.0, 0.0),
                 'budget': (0.0, 0.0),
                 'clock': 1000000.0,
                 'rng': ('a4f06b3db9b2753d', 0.26161213, 0.60235423),
                 'weights': 226.169302,
                 'train_mode': True,
                 'events': '4f53cda18c2baa0c',
                 'kinds': [],
                 'stops': []},
 'probe': {'result': (1.0,
                      0,
                      {'accuracy': 1.0,
                       'auroc': 1.0,
                       'balanced_accuracy': 1.0,
                       'pauroc_spec90': 1.0,
                       'pauroc_spec90_mcclish': 1.0,
                       'sensitivity_at_spec95': 1.0},
                      2,
                      2,
                      'max_epochs',
                      None,
                      2.0,
                      1.0),
           'late_snapshot': (0, 1.0),
           'clock': 1000007.0,
           'rng': ('20f2934a778ae7d7', 0.34596067, 0.43832028),
           'weights': 354.98557384,
           'train_mode': True,
           'events': '8c2bc2dae01d1bd9',
           'kinds': ['step',
                     'diag',
                     'eval',
                     'on_epoch',
                     'snapshot',
                     'step',
                     'diag',
                     'eval',
                     'on_epoch'],
           'stops': [(0, True), (1, False)]},
 'nan_loss': {'raised': ('TrialFailed', 'non-finite loss (nan) at epoch 1, step 3'),
              'late_snapshot': (0, 1.0),
              'clock': 1000009.0,
              'rng': ('3b8328f04ab6396b', 0.26161213, 0.60235423),
              'weights': 229.71332452,
              'train_mode': True,
              'events': 'ff623952a590eee5',
              'kinds': ['step', 'step', 'eval', 'on_epoch', 'snapshot', 'step', 'step'],
              'stops': [(0, True)]},
 'bad_stop_on': {'raised': ('ValueError',
                            "TrainConfig.stop_on='best': 'val' or 'train_loss'"),
                 'clock': 1000000.0,
                 'rng': ('a4f06b3db9b2753d', 0.26161213, 0.60235423),
                 'weights': 226.169302,
                 'train_mode': True,
                 'events': '4f53cda18c2baa0c',
                 'kinds': [],
                 'stops': []}}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_train_trial_reproduces_the_recorded_loop(name: str, monkeypatch: pytest.MonkeyPatch,
                                                  tiny_bundle: Any) -> None:
    assert _trace(monkeypatch, tiny_bundle, **SCENARIOS[name]) == EXPECTED[name]
