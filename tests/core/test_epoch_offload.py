"""The epoch's work off the critical path (issue 40 item 3): evaluation on the device with
one host copy of its probabilities, the best checkpoint kept on the device until its
upload, and the evaluation cadence for tiny sets. (The probe solver: tests/core/test_probe.py;
the diagnostics' scratch copy: tests/core/methods/test_diagnostics.py.)"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

import scarcelab.train as train_mod
from scarcelab.errors import ConfigError
from scarcelab.methods import get_method
from scarcelab.metrics import classification_metrics
from scarcelab.models import create_model
from scarcelab.probe import LinearProbe
from scarcelab.protocols import search as search_mod
from scarcelab.protocols.search import StudyConfig, run_study
from scarcelab.tracker import InMemoryTracker
from scarcelab.train import (
    EvalSets,
    OnEpochEnd,
    TrainConfig,
    checkpoint_to_host,
    evaluate,
    snapshot,
    train_trial,
)

#: what reads a tensor's values on the host: on a GPU each waits for the device's queue
HOST_READS = {"cpu", "item", "tolist", "__bool__", "__float__", "__int__", "__index__"}


class _HostReads(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.n += getattr(func, "__name__", "") in HOST_READS
        return func(*args, **(kwargs or {}))


def _method(name: str, bundle: Any, seed: int = 0) -> Any:
    torch.manual_seed(seed)
    cls = get_method(name)
    m = cls(create_model("small_cnn", in_channels=1), bundle.num_classes, dict(cls.defaults))
    m.to(memory_format=torch.channels_last)
    return m


def _old_evaluate(method, bundle, cfg, rng):  # type: ignore[no-untyped-def]
    """``train.evaluate`` before this change (a chunk at a time to the host, the metrics'
    inputs computed there): the reference the device path must reproduce bit for bit."""
    def fwd(fn, x):  # type: ignore[no-untyped-def]
        with torch.no_grad():
            out = [fn(train_mod.normalize(train_mod.to_float(torch.as_tensor(
                x[i:i + cfg.eval_batch_size])))).float().cpu()
                for i in range(0, len(x), cfg.eval_batch_size)]
        return torch.cat(out).numpy()

    method.eval()
    try:
        same = bundle.test_x is bundle.val_x
        if method.linear_probe:
            fl, fv = fwd(method.features, bundle.labeled_x), fwd(method.features, bundle.val_x)
            ft = fv if same else fwd(method.features, bundle.test_x)
            probe = LinearProbe(bundle.num_classes, balanced=cfg.class_weights == "balanced"
                                ).fit(fl, bundle.labeled_y, fv, bundle.val_y, rng)
            pv, pt = probe.predict_proba(fv), probe.predict_proba(ft)
        else:
            pv = torch.softmax(torch.as_tensor(fwd(method.logits, bundle.val_x)), 1).numpy()
            pt = pv if same else torch.softmax(torch.as_tensor(
                fwd(method.logits, bundle.test_x)), 1).numpy()
    finally:
        method.train()
    return (classification_metrics(bundle.val_y, pv)["balanced_accuracy"],
            classification_metrics(bundle.test_y, pt, bundle.meta.get("positive_class")), pt)


# -- 1. evaluation on the device ---------------------------------------------------------------
@pytest.mark.parametrize("name", ["sup", "simclr"])
@pytest.mark.parametrize("same", [False, True])
def test_device_evaluation_gives_the_old_numbers_bit_for_bit(tiny_bundle, name, same):
    """Head and (sklearn) probe methods, separate and shared val/test sets, several chunks
    per set: the validation score, every test metric and the test probabilities equal the
    old host-side computation exactly."""
    b = copy.copy(tiny_bundle)
    if same:
        b.test_x, b.test_y = b.val_x, b.val_y
    m = _method(name, b)
    cfg = TrainConfig(eval_batch_size=7, class_weights="balanced")
    val, test, pt = _old_evaluate(m, b, cfg, np.random.default_rng(3))
    ev = evaluate(m, b, cfg, np.random.default_rng(3), EvalSets(b, torch.device("cpu"),
                                                                m.linear_probe))
    assert ev[0] == val and ev[1] == test
    assert ev.test_proba is not None and np.array_equal(ev.test_proba, pt)
    assert ev.test_proba.dtype == pt.dtype


@pytest.mark.parametrize("name,solver,most", [("sup", "sklearn", 1), ("simclr", "sklearn", 1)])
def test_an_evaluation_reads_the_device_once(tiny_bundle, name, solver, most):
    """The evaluated sets' probabilities (or, for scikit-learn's probe, features) reach
    the host in one copy, however many chunks the forward passes take (the old code read
    every chunk: 5 + 22 with these sizes)."""
    m = _method(name, tiny_bundle)
    cfg = TrainConfig(eval_batch_size=7, probe_solver=solver)
    sets = EvalSets(tiny_bundle, torch.device("cpu"), m.linear_probe)
    with _HostReads() as reads:
        evaluate(m, tiny_bundle, cfg, np.random.default_rng(0), sets)
    assert reads.n == most


def test_the_torch_probe_never_reads_the_features_and_reads_its_answer_once(tiny_bundle):
    """The torch probe's evaluation: no host copy of the features; its probabilities come
    in one copy for validation and test; the rest are the solver's convergence checks
    (a few per Newton step), not data."""
    m = _method("simclr", tiny_bundle)
    cfg = TrainConfig(eval_batch_size=7, probe_solver="torch")
    sets = EvalSets(tiny_bundle, torch.device("cpu"), True)
    copies: list[tuple[int, ...]] = []

    class _Copies(_HostReads):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if getattr(func, "__name__", "") == "cpu":
                copies.append(tuple(args[0].shape))
            return super().__torch_function__(func, types, args, kwargs)

    with _Copies():
        ev = evaluate(m, tiny_bundle, cfg, np.random.default_rng(0), sets)
    n_val, n_test = len(tiny_bundle.val_y), len(tiny_bundle.test_y)
    # the validation predictions of the 10 penalties, then the chosen probe's probabilities
    assert copies == [(10, n_val), (n_val + n_test, tiny_bundle.num_classes)]
    assert ev[2].solver == "torch" and 0.0 <= ev[0] <= 1.0


def test_a_trial_moves_its_evaluated_images_to_the_device_once(tiny_bundle, monkeypatch):
    made: list[int] = []
    real = train_mod.EvalSets.__init__

    def counting(self, *a, **k):  # type: ignore[no-untyped-def]
        made.append(1)
        real(self, *a, **k)

    monkeypatch.setattr(train_mod.EvalSets, "__init__", counting)
    reports: list[Any] = []
    train_trial(_method("sup", tiny_bundle), tiny_bundle,
                TrainConfig(max_epochs=3, max_steps_per_epoch=1, batch_labeled=8),
                deadline=1e18, generator=torch.Generator().manual_seed(0),
                probe_rng=np.random.default_rng(0),
                callbacks=[OnEpochEnd(lambda r, i, s: reports.append(r))])
    assert len(reports) == 3 and made == [1]


# -- 2. the best snapshot on the device --------------------------------------------------------
def test_a_snapshot_stays_on_the_methods_device_as_a_copy(tiny_bundle):
    """Taken on the ``meta`` device (a device without host copies: the old snapshot,
    ``.to("cpu")``, cannot take one there), every tensor stays there; on the CPU it is a
    copy that later training does not change, and going to the host copies nothing more."""
    m = _method("sup", tiny_bundle).to("meta")
    s = snapshot(m, None, {"epoch": 3})
    assert s["epoch"] == 3 and s["probe"] is None
    assert all(t.device.type == "meta" for t in s["state_dict"].values())
    m = _method("sup", tiny_bundle)
    s = snapshot(m, None, {})
    w = s["state_dict"]["head.weight"]
    assert w.data_ptr() != m.head.weight.data_ptr()
    with torch.no_grad():
        m.head.weight.add_(1.0)
    assert not torch.equal(w, m.head.weight)
    h = checkpoint_to_host(s)
    assert h["state_dict"]["head.weight"] is w
    nested = checkpoint_to_host({"a": [torch.ones(1), (torch.zeros(2), 3)], "b": "x"})
    assert isinstance(nested["a"], list) and isinstance(nested["a"][1], tuple)
    assert nested["a"][1][1] == 3 and nested["b"] == "x"


def test_the_probe_head_of_a_snapshot_is_taken_on_the_device(tiny_bundle):
    """The torch probe's linear head is built where the probe is (no host read)."""
    m = _method("simclr", tiny_bundle)
    cfg = TrainConfig(probe_solver="torch")
    ev = evaluate(m, tiny_bundle, cfg, np.random.default_rng(0))
    with _HostReads() as reads:
        s = snapshot(m, ev[2], {})
    assert reads.n == 0 and set(s["probe"]) == {"weight", "bias"}


def test_the_best_checkpoint_reaches_the_host_only_when_uploaded_or_its_trial_ends(
        monkeypatch):
    """The search brings a checkpoint to the host when it uploads it (rate-limited; here
    never mid-trial) or when the trial that took it ends — not at every new best epoch —
    and what it uploads and returns has been through that move."""
    moved: list[int] = []
    real = search_mod.checkpoint_to_host

    def spy(ckpt):  # type: ignore[no-untyped-def]
        moved.append(1)
        out = real(ckpt)
        out["_on_host"] = True
        return out

    monkeypatch.setattr(search_mod, "checkpoint_to_host", spy)
    monkeypatch.setattr(search_mod, "CHECKPOINT_MIN_INTERVAL_S", math.inf)  # none mid-trial
    uploads: list[dict[str, Any]] = []

    class _T(InMemoryTracker):
        def log_checkpoint(self, checkpoint, name="best.pt"):  # type: ignore[no-untyped-def]
            uploads.append(checkpoint)
            super().log_checkpoint(checkpoint, name)

    t = _T()
    best_epochs: list[tuple[int, int]] = []
    real_on_epoch = search_mod._Search._on_epoch

    def on_epoch(self, trial, hp, method, rep, snap):  # type: ignore[no-untyped-def]
        before = self.best.ckpt
        real_on_epoch(self, trial, hp, method, rep, snap)
        if self.best.ckpt is not before:
            best_epochs.append((trial.number, rep.epoch))
            assert "_on_host" not in self.best.ckpt  # taken, not moved

    monkeypatch.setattr(search_mod._Search, "_on_epoch", on_epoch)
    res = run_study(StudyConfig(method="sup", dataset="synthetic_tiny", budget_minutes=5.0,
                                max_epochs=4, patience=10, batch_size=8,
                                max_steps_per_epoch=1, max_trials=2, arch="small_cnn",
                                device="cpu"), t)
    assert len(best_epochs) > len({t for t, _ in best_epochs})  # several bests a trial,
    assert len(moved) == len({t for t, _ in best_epochs})  # moved once: at the trial's end
    assert uploads and all(u.get("_on_host") for u in uploads)
    assert res.best_checkpoint is not None and res.best_checkpoint.get("_on_host")


# -- 5. the evaluation cadence -----------------------------------------------------------------
def _cadence(bundle: Any, monkeypatch: pytest.MonkeyPatch, vals: list[float] | None = None,
             **cfg: Any) -> tuple[list[Any], Any, list[float]]:
    """A trial of one step per epoch; the reports, the result and every step's loss."""
    losses: list[float] = []
    step = train_mod.optimizer_step

    def spy(*a: Any) -> Any:
        out = step(*a)
        losses.append(float(out["loss"].detach()))
        return out

    monkeypatch.setattr(train_mod, "optimizer_step", spy)
    if vals is not None:
        it = iter(vals)
        monkeypatch.setattr(train_mod, "evaluate",
                            lambda *a, **k: (next(it), {"balanced_accuracy": 0.5}, None))
    reports: list[Any] = []
    res = train_trial(_method("sup", bundle), bundle,
                      TrainConfig(max_steps_per_epoch=1, batch_labeled=8, **cfg),
                      deadline=1e18,
                      generator=torch.Generator().manual_seed(0),
                      probe_rng=np.random.default_rng(0),
                      callbacks=[OnEpochEnd(lambda r, i, s: reports.append(r))])
    return reports, res, losses


def test_evaluations_every_n_steps_and_always_at_the_last_epoch(tiny_bundle, monkeypatch):
    """One step per epoch, ``eval_every_steps=3``, 10 epochs: evaluated after epochs 2, 5
    and 8 and at the last (9); each report's train loss is the mean over its window's
    steps, ``time/steps`` their number."""
    reports, res, losses = _cadence(tiny_bundle, monkeypatch, max_epochs=10, patience=100,
                                    eval_every_steps=3)
    assert [r.epoch for r in reports] == [2, 5, 8, 9]
    assert [r.metrics["time/steps"] for r in reports] == [3.0, 3.0, 3.0, 1.0]
    windows = [losses[0:3], losses[3:6], losses[6:9], losses[9:10]]
    for r, w in zip(reports, windows, strict=True):
        assert r.metrics["train/loss"] == pytest.approx(sum(w) / len(w), rel=1e-6)
    assert res.epochs == 10 and res.steps == 10 and res.stopped == "max_epochs"


def test_default_cadence_evaluates_every_epoch(tiny_bundle, monkeypatch):
    reports, _, _ = _cadence(tiny_bundle, monkeypatch, max_epochs=3, patience=100)
    assert [r.epoch for r in reports] == [0, 1, 2]


def test_patience_counts_evaluations_not_epochs(tiny_bundle, monkeypatch):
    """patience=2 with every third epoch evaluated and no improvement after the first
    evaluation: the trial stops after the third evaluation (epoch 8), not after epoch 2."""
    reports, res, _ = _cadence(tiny_bundle, monkeypatch, vals=[0.6, 0.6, 0.5, 0.9],
                               max_epochs=30, patience=2, eval_every_steps=3)
    assert [r.epoch for r in reports] == [2, 5, 8]
    assert res.stopped == "patience" and res.epochs == 9 and res.best_epoch == 2


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def time(self) -> float:
        return self.t

    perf_counter = time


def test_the_budget_ends_with_the_unevaluated_steps_evaluated(tiny_bundle, monkeypatch):
    """Steps cost 2 s, evaluations 1 s, budget 9 s, one step per epoch, evaluation every 5
    steps: four steps fit, the fifth would not leave room for an evaluation, so the four
    are evaluated then (reported at epoch 3, the epoch of their last step) and the trial
    stops on the budget — it never ends with trained steps nobody evaluated."""
    clock = _Clock()
    monkeypatch.setattr(train_mod, "time", clock)
    step, ev = train_mod.optimizer_step, train_mod.evaluate

    def slow_step(*a: Any) -> Any:
        clock.t += 2.0
        return step(*a)

    def slow_eval(*a: Any, **k: Any) -> Any:
        clock.t += 1.0
        return ev(*a, **k)

    monkeypatch.setattr(train_mod, "optimizer_step", slow_step)
    monkeypatch.setattr(train_mod, "evaluate", slow_eval)
    reports: list[Any] = []
    budget = train_mod.Budget(9.0)
    res = train_trial(_method("sup", tiny_bundle), tiny_bundle,
                      TrainConfig(max_epochs=50, patience=100, max_steps_per_epoch=1,
                                  batch_labeled=8, eval_every_steps=5),
                      deadline=budget, generator=torch.Generator().manual_seed(0),
                      probe_rng=np.random.default_rng(0),
                      callbacks=[OnEpochEnd(lambda r, i, s: reports.append(r))])
    assert [r.epoch for r in reports] == [3]
    assert reports[0].metrics["time/steps"] == 4.0
    assert res.stopped == "budget" and res.steps == 4 and res.epochs == 4
    assert budget.elapsed() <= 9.0


def test_bad_settings_are_one_clear_error(tiny_bundle):
    with pytest.raises(ValueError, match="eval_every_steps=-1"):
        train_trial(_method("sup", tiny_bundle), tiny_bundle,
                    TrainConfig(eval_every_steps=-1), deadline=1e18,
                    generator=torch.Generator(), probe_rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="probe_solver='gpu'"):
        train_trial(_method("sup", tiny_bundle), tiny_bundle,
                    TrainConfig(probe_solver="gpu"), deadline=1e18,
                    generator=torch.Generator(), probe_rng=np.random.default_rng(0))
    base = dict(method="simclr", dataset="synthetic_tiny", device="cpu", arch="small_cnn")
    with pytest.raises(ConfigError, match="eval_every_steps must be >= 0"):
        run_study(StudyConfig(**base, eval_every_steps=-2), InMemoryTracker())
    with pytest.raises(ConfigError, match="probe_solver='gpu'"):
        run_study(StudyConfig(**base, probe_solver="gpu"), InMemoryTracker())


def test_both_settings_are_study_params_and_key_the_study_only_when_set():
    """Logged on the study; a study keyed before the settings existed keeps its key at
    their defaults, a non-default value is another study."""
    t = InMemoryTracker()
    run_study(StudyConfig(method="simclr", dataset="synthetic_tiny", device="cpu",
                          arch="small_cnn", budget_minutes=0.5, max_epochs=2,
                          max_steps_per_epoch=1, max_trials=1, batch_size=8,
                          unlabeled_batch_size=16, eval_every_steps=2,
                          probe_solver="torch"), t)
    assert t.study is not None
    assert t.study.params["eval_every_steps"] == 2 and t.study.params["probe_solver"] == "torch"
    hist = t.trials[0].history("val/balanced_accuracy")
    assert len(hist) == 1 and not math.isnan(hist[0][1])  # 2 steps, evaluated once
    key = search_mod._study_key
    base = StudyConfig(method="simclr")
    assert key(base, "h") != key(StudyConfig(method="simclr", eval_every_steps=4), "h")
    assert key(base, "h") != key(StudyConfig(method="simclr", probe_solver="torch"), "h")


def test_cli_options_reach_the_study_config(monkeypatch):
    """``--probe-solver`` / ``--eval-every-steps`` on every study command (MLproject's
    parameters of the same names: tests/entrypoints/test_cli.py checks the parity); a bad value
    is one line naming the option."""
    import importlib

    from click.testing import CliRunner

    from scarcelab.entrypoints.cli import main

    study = importlib.import_module("scarcelab.entrypoints.study")
    seen: dict[str, Any] = {}
    monkeypatch.setattr(study, "_run", lambda family, kw, ctx: seen.update(
        cfg=study.study_config(family, kw)))
    for family, method in (("self", "simclr"), ("semi", "fixmatch"), ("supervised", "sup")):
        res = CliRunner().invoke(main, [family, "--method", method])
        assert res.exit_code == 0, res.output
        assert (seen["cfg"].probe_solver, seen["cfg"].eval_every_steps) == ("sklearn", 0)
        res = CliRunner().invoke(main, [family, "--method", method, "--probe-solver",
                                        "torch", "--eval-every-steps", "8"])
        assert res.exit_code == 0, res.output
        assert (seen["cfg"].probe_solver, seen["cfg"].eval_every_steps) == ("torch", 8)
    res = CliRunner().invoke(main, ["self", "--method", "simclr", "--eval-every-steps", "-1"])
    assert res.exit_code != 0 and "--eval-every-steps" in res.output
    res = CliRunner().invoke(main, ["self", "--method", "simclr", "--probe-solver", "gpu"])
    assert res.exit_code != 0 and "--probe-solver" in res.output
