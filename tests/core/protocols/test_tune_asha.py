"""ASHA's stopping rule as Ray Tune's (gem ``scripts/hpo.py`` runs ``ASHAScheduler``), and
gem's choice of the best configuration over all trials, stopped ones included.

The reference is Ray itself: the same rung sequence is replayed through Ray's
``AsyncHyperBandScheduler`` (installed with the project) and through the pruner the tune
protocol attaches to its Optuna study; every decision must agree. Optuna's
``SuccessiveHalvingPruner`` (the protocol's pruner before issue 23) disagrees on the same
sequence, which is what makes the comparison a test."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

from scarcelab.protocols.tune import (
    RayASHAPruner,
    TuneConfig,
    asha_milestones,
    best_trial,
    run_tune,
)
from scarcelab.tracker import InMemoryTracker

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _ray_decisions(events, grace, max_t):
    """Ray's decision ("STOP"/"CONTINUE") per (trial, step, value) event, in order; events
    of a stopped trial are skipped (Ray sends it no more results)."""
    from ray.tune.schedulers.async_hyperband import AsyncHyperBandScheduler

    np.random.seed(0)  # Ray draws the bracket of a new trial; with one bracket it is fixed
    sched = AsyncHyperBandScheduler(metric="v", mode="max", max_t=max_t,
                                    grace_period=grace, reduction_factor=2)
    trials: dict[int, SimpleNamespace] = {}
    stopped: set[int] = set()
    out = []
    for k, step, value in events:
        if k in stopped:
            out.append(None)
            continue
        if k not in trials:
            trials[k] = SimpleNamespace(trial_id=str(k))
            sched.on_trial_add(None, trials[k])
        d = sched.on_trial_result(None, trials[k], {"training_iteration": step, "v": value})
        if d == "STOP":
            stopped.add(k)
            sched.on_trial_complete(None, trials[k], {"training_iteration": step, "v": value})
        out.append(d)
    return out


def _optuna_decisions(events, pruner, max_t):
    """The same events through an Optuna study with ``pruner``: "STOP" when the trial is
    pruned or reaches ``max_t`` (Ray ends a trial there), else "CONTINUE"."""
    study = optuna.create_study(direction="maximize", pruner=pruner)
    trials: dict[int, optuna.trial.Trial] = {}
    stopped: set[int] = set()
    out = []
    for k, step, value in events:
        if k in stopped:
            out.append(None)
            continue
        if k not in trials:
            trials[k] = study.ask()
        t = trials[k]
        t.report(value, step)
        if step >= max_t:
            study.tell(t, value)
            stopped.add(k)
            out.append("STOP")
        elif t.should_prune():
            study.tell(t, state=TrialState.PRUNED)
            stopped.add(k)
            out.append("STOP")
        else:
            out.append("CONTINUE")
    return out


def _async_events(n_trials=14, max_t=20, seed=3):
    """Trials start one after another and report every step, interleaved as asynchronous
    workers would (a random running trial reports next); values are noisy learning curves."""
    rng = np.random.default_rng(seed)
    level = rng.uniform(0.2, 0.9, n_trials)
    events, step = [], dict.fromkeys(range(n_trials), 0)
    started = 1
    while True:
        running = [k for k in range(started) if step[k] < max_t]
        if started < n_trials and (not running or rng.random() < 0.3):
            started += 1
            continue
        if not running:
            break
        k = int(rng.choice(running))
        step[k] += 1
        v = level[k] * (1 - np.exp(-step[k] / 4)) + rng.normal(0, 0.02)
        events.append((k, step[k], float(v)))
    return events


def test_ray_rungs_and_the_median_cutoff_by_hand():
    assert asha_milestones(50, 500) == [50, 100, 200, 400]  # ciFAIR-10: grace 50
    assert asha_milestones(10, 200) == [10, 20, 40, 80, 160]  # CUB, ImageNet: grace 10
    # two trials recorded 0.2 and 0.4 at rung 1: Ray's cutoff is their median, 0.3
    events = [(0, 1, 0.2), (1, 1, 0.4), (2, 1, 0.35), (3, 1, 0.25)]
    ray = _ray_decisions(events, grace=1, max_t=4)
    ours = _optuna_decisions(events, RayASHAPruner(1, 4), max_t=4)
    # 0.35 >= median(0.2, 0.4) = 0.3 continues; 0.25 < median(0.2, 0.4, 0.35) = 0.35 stops
    assert ours == ray == ["CONTINUE", "CONTINUE", "CONTINUE", "STOP"]
    # Optuna's successive halving keeps only the top floor(3/2) = 1 of three: 0.35 stops
    sh = optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=2,
                                                min_early_stopping_rate=0)
    assert _optuna_decisions(events, sh, max_t=4)[2] == "STOP"


@pytest.mark.parametrize("seed", [3, 7])
def test_replayed_rung_sequence_gets_rays_decisions(seed):
    events = _async_events(seed=seed)
    ray = _ray_decisions(events, grace=2, max_t=20)
    ours = _optuna_decisions(events, RayASHAPruner(2, 20), max_t=20)
    assert ours == ray
    stopped_early = {k for (k, s, _), d in zip(events, ray, strict=True) if d == "STOP" and s < 20}
    assert stopped_early and len(stopped_early) < 14  # both outcomes occur
    # the old rule decides differently on the same sequence (it prunes harder)
    sh = optuna.pruners.SuccessiveHalvingPruner(min_resource=2, reduction_factor=2,
                                                min_early_stopping_rate=0)
    old = _optuna_decisions(events, sh, max_t=20)
    assert old != ray
    trained = sum(d is not None for d in ray)  # epochs the study trains in all
    assert sum(d is not None for d in old) < trained


def test_the_protocols_search_stops_trials_as_ray_would(tmp_path):
    """run_tune's own search: its trials' recorded reports, replayed through Ray in the
    order the study ran them (one worker: trial after trial), give exactly the trials it
    pruned, each at the same epoch."""
    storage = f"sqlite:///{tmp_path}/optuna.db"
    cfg = TuneConfig(method="ce", dataset="synthetic_tiny_rgb", arch="small_cnn", epochs=8,
                     grace_period=1, n_trials=10, batch_sizes=(8, 16), max_steps_per_epoch=1,
                     phase="search", storage=storage, study_name="asha")
    run_tune(cfg, InMemoryTracker())
    study = optuna.load_study(study_name="asha", storage=storage)
    trials = sorted(study.get_trials(), key=lambda t: t.number)
    events = [(t.number, s, v) for t in trials for s, v in sorted(t.intermediate_values.items())]
    ray = _ray_decisions(events, grace=1, max_t=8)
    stop_at = {k: s for (k, s, _), d in zip(events, ray, strict=True) if d == "STOP"}
    pruned = {t.number: max(t.intermediate_values) for t in trials
              if t.state == TrialState.PRUNED}
    assert pruned == {k: s for k, s in stop_at.items() if s < 8}
    assert all(t.state == TrialState.COMPLETE for t in trials if t.number not in pruned)
    assert pruned, "the sequence should exercise the stopping rule"


def _frozen(number, state, values):
    return optuna.trial.create_trial(
        state=state, value=values[max(values)] if state == TrialState.COMPLETE else None,
        params={"lr": 0.01 * (number + 1)},
        distributions={"lr": optuna.distributions.FloatDistribution(1e-4, 1.0)},
        intermediate_values=values)


def test_best_configuration_over_all_trials_stopped_ones_included():
    study = optuna.create_study(direction="maximize")
    study.add_trial(_frozen(0, TrialState.COMPLETE, {1: 0.3, 8: 0.50}))
    study.add_trial(_frozen(1, TrialState.PRUNED, {1: 0.4, 2: 0.62}))  # stopped at rung 1
    study.add_trial(_frozen(2, TrialState.FAIL, {1: 0.9}))  # crashed: never retrained
    study.add_trial(_frozen(3, TrialState.PRUNED, {1: 0.62}))  # ties with trial 1: later
    best = best_trial(study.get_trials())
    assert best is not None and best.number == 1 and best.params == {"lr": 0.02}
    only_complete = best_trial([t for t in study.get_trials() if t.number == 0])
    assert only_complete is not None and only_complete.number == 0
    assert best_trial([t for t in study.get_trials() if t.number == 2]) is None
