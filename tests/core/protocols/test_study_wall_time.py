"""A study's budget is the command's wall time (issue 27 item 1, issue 28 §1).

Driven by a fake clock (no timing assertion on the real one): start-up counts against the
budget, the search stops early enough that its last step, its evaluation and the reserved
final phase fit, and the final phase neither re-runs the test set nor infers MLflow pip
requirements in a subprocess nor exports the model twice; segment batches the windows of
all tiles; every phase after the budget gets a progress line.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
import torch

import scarcelab.protocols.search as search_mod
import scarcelab.train as train_mod
from scarcelab.metrics import classification_metrics
from scarcelab.protocols.search import StudyConfig, run_study
from scarcelab.tracker import InMemoryTracker

STEP_S, EVAL_S, FINAL_S, STARTUP_S = 2.0, 1.0, 6.0, 15.0


class FakeClock:
    """``time.time`` and ``time.perf_counter`` of the training loop and the search."""

    def __init__(self) -> None:
        self.t = 1_000_000.0

    def time(self) -> float:
        return self.t

    perf_counter = time

    def strftime(self, fmt: str) -> str:
        import time

        return time.strftime(fmt)


@pytest.fixture
def clock(monkeypatch):  # type: ignore[no-untyped-def]
    c = FakeClock()
    monkeypatch.setattr(train_mod, "time", c)
    monkeypatch.setattr(search_mod, "time", c)
    step, ev = train_mod.optimizer_step, train_mod.evaluate

    def slow_step(*a: Any, **k: Any) -> Any:
        c.t += STEP_S
        return step(*a, **k)

    evals: list[float] = []

    def slow_eval(*a: Any, **k: Any) -> Any:
        c.t += EVAL_S
        evals.append(c.t)
        return ev(*a, **k)

    monkeypatch.setattr(train_mod, "optimizer_step", slow_step)
    monkeypatch.setattr(train_mod, "evaluate", slow_eval)
    c.evals = evals  # type: ignore[attr-defined]
    return c


class SlowFinal(InMemoryTracker):
    """The final phase (export + upload) costs FINAL_S on the fake clock."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.proba: Any = None

    def log_model(self, model, example):  # type: ignore[no-untyped-def]
        self.clock.t += FINAL_S
        super().log_model(model, example)

    def log_evaluation(self, y_true, proba, class_names, split="test", **kw):  # type: ignore[no-untyped-def]
        self.proba = proba


def _cfg(**kw: Any) -> StudyConfig:
    base = dict(method="sup", dataset="synthetic_tiny", arch="small_cnn", device="cpu",
                budget_minutes=1.0, max_epochs=1000, patience=1000, batch_size=16,
                max_steps_per_epoch=3, seed=0)
    base.update(kw)
    return StudyConfig(**base)  # type: ignore[arg-type]


def test_whole_study_fits_the_budget_startup_and_final_phase_included(clock):
    """Start-up (15 s before the search) and the final phase (6 s) are inside the 60 s;
    before, the budget started with the search and reserved nothing: 15 + ~61 + 6 s."""
    started = clock.t - STARTUP_S
    t = SlowFinal(clock)
    res = run_study(_cfg(started_at=started), t)
    total = clock.t - started
    reserve = min(search_mod.FINAL_RESERVE_S, search_mod.FINAL_RESERVE_SHARE * 60.0)
    assert total <= 60.0 + max(0.0, FINAL_S - reserve)  # the stated tail only
    # ... and the training used the budget up to one step + evaluation before the reserve
    assert clock.evals[-1] - started >= 60.0 - reserve - 2 * (STEP_S + EVAL_S)
    assert res.n_trials >= 1
    assert t.study.last("time/startup_s") == pytest.approx(STARTUP_S)


def test_library_use_counts_from_the_search_and_still_reserves_the_tail(clock):
    start = clock.t
    run_study(_cfg(), SlowFinal(clock))
    assert clock.t - start <= 60.0


def test_startup_longer_than_the_budget_still_trains(clock):
    """At most half of the budget goes to start-up: a 1-minute study whose start-up took
    5 minutes still trains for ~half a minute instead of failing."""
    started = clock.t - 300.0
    res = run_study(_cfg(started_at=started), SlowFinal(clock))
    assert res.best_checkpoint is not None and len(clock.evals) >= 3


def _train_sup(bundle: Any, budget: Any) -> Any:
    """One ``sup`` trial on ``bundle`` under ``budget`` (enough epochs and steps that only
    the budget stops it)."""
    from scarcelab.methods import get_method
    from scarcelab.models import create_model

    m = get_method("sup")(create_model("small_cnn", in_channels=1), bundle.num_classes,
                          dict(get_method("sup").defaults))
    return train_mod.train_trial(
        m, bundle, train_mod.TrainConfig(max_epochs=100, patience=100,
                                         max_steps_per_epoch=100, batch_labeled=8),
        deadline=budget, generator=torch.Generator().manual_seed(0),
        probe_rng=np.random.default_rng(0))


def test_a_step_that_would_end_past_the_budget_is_not_started(clock, tiny_bundle):

    budget = train_mod.Budget(10.0)
    res = _train_sup(tiny_bundle, budget)
    # steps at 0-2, 2-4, 4-6 s; a 4th (6-8 s) and its evaluation (to 9 s) still fit; a 5th
    # would end at 10 s with the evaluation after it: before, it ran to 11 s
    assert budget.elapsed() <= 10.0
    assert res.steps == 4 and res.stopped == "budget"


def test_final_phase_does_not_re_evaluate_the_test_set(monkeypatch):
    """The figures get the test probabilities recorded with the selected checkpoint; the
    exported model is never run over the test set again."""
    calls: list[int] = []
    export = search_mod.export_classifier

    def counting(*a: Any, **k: Any) -> Any:
        model = export(*a, **k)
        fwd = model.forward

        def forward(x: torch.Tensor) -> torch.Tensor:
            calls.append(len(x))
            return fwd(x)

        model.forward = forward  # type: ignore[method-assign]
        return model

    monkeypatch.setattr(search_mod, "export_classifier", counting)

    class Rec(InMemoryTracker):
        proba: Any = None

        def log_evaluation(self, y_true, proba, class_names, split="test", **kw):  # type: ignore[no-untyped-def]
            self.proba = proba

    t = Rec()
    res = run_study(_cfg(budget_minutes=0.5, max_epochs=3, max_trials=2), t)
    assert calls == []
    from scarcelab.data import load_raw

    y = load_raw("synthetic_tiny").test_y
    assert t.proba.shape == (len(y), int(y.max()) + 1)
    got = classification_metrics(y, t.proba)
    assert got["balanced_accuracy"] == pytest.approx(res.best_test["balanced_accuracy"])
    assert got["auroc"] == pytest.approx(res.best_test["auroc"])


@pytest.mark.parametrize("remote", [False, True])
def test_model_logged_loadable_without_requirement_inference_and_one_export(
        tmp_path, monkeypatch, remote):
    """The model is exported once, local store or spooled (remote) path: the archive
    goes into the model folder as it is (before issue 39 the spooled path exported it
    for the spool and MLflow once more from the reloaded module). Neither starts MLflow's
    requirements inference (a subprocess importing torch and MLflow again: 38-62 s under
    load)."""
    import mlflow

    import scarcelab.tracking.spool as spool_mod
    from scarcelab.tracking.mlflow_tracker import MlflowTracker

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    mlflow.set_tracking_uri(uri)
    if remote:  # the spool's path (a tracking server) against the same local store
        monkeypatch.setattr(spool_mod, "is_remote", lambda uri: True)
    inferred: list[Any] = []
    monkeypatch.setattr(mlflow.models, "infer_pip_requirements",
                        lambda *a, **k: inferred.append(a) or [])
    exports: list[int] = []
    real_export = torch.export.export

    def counting_export(*a: Any, **k: Any) -> Any:
        exports.append(1)
        return real_export(*a, **k)

    monkeypatch.setattr(torch.export, "export", counting_export)
    t = MlflowTracker(experiment="unit")
    res = run_study(_cfg(budget_minutes=0.5, max_epochs=2, max_trials=1), t)
    assert t.spool is not None and t.spool.remote is remote
    assert inferred == [] and len(exports) == 1
    model = mlflow.pytorch.load_model(f"runs:/{t.study_run_id}/model")
    from scarcelab.data import load_raw

    raw = load_raw("synthetic_tiny")
    pred = model(torch.as_tensor(raw.test_x).float() / 255).argmax(1).numpy()
    assert (pred == raw.test_y).mean() == pytest.approx(res.best_test["accuracy"])
    reqs = mlflow.artifacts.download_artifacts(f"runs:/{t.study_run_id}/model/requirements.txt")
    text = open(reqs).read().split()
    from packaging.version import Version

    assert f"torch=={Version(torch.__version__).public}" in text
    assert any(r.startswith("mlflow==") for r in text)
    assert any(r.startswith("numpy==") for r in text)


def test_a_model_that_cannot_be_exported_leaves_the_study_standing(tmp_path, monkeypatch):
    import mlflow

    from scarcelab.tracking.mlflow_tracker import MlflowTracker

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    mlflow.set_tracking_uri(uri)

    def refuse(*a: Any, **k: Any) -> Any:
        raise RuntimeError("data-dependent control flow")

    monkeypatch.setattr(torch.export, "export", refuse)
    t = MlflowTracker(experiment="unit")
    run_study(_cfg(budget_minutes=0.5, max_epochs=1, max_trials=1), t)
    run = mlflow.MlflowClient().get_run(t.study_run_id)
    assert run.info.status == "FINISHED"
    assert "data-dependent control flow" in run.data.tags["scarcelab.model_export_error"]


# -- segment: windows of all tiles in one batch --------------------------------------------------
class _Counting(torch.nn.Module):
    stride = 4

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.batches.append(len(x))
        s = x.sum(1, keepdim=True)
        return torch.cat([torch.zeros_like(s), s, torch.tanh(s), -torch.tanh(s),
                          torch.zeros_like(s), s], 1)


def test_segment_windows_of_all_tiles_are_batched_and_equal_tile_by_tile():
    from scarcelab.models.nucleus_maps import predict_tile, predict_tiles

    rng = np.random.default_rng(0)
    imgs = [rng.integers(0, 255, (32, 32, 3), dtype=np.uint8) for _ in range(5)]
    imgs.append(rng.integers(0, 255, (70, 90, 3), dtype=np.uint8))  # 4 x 5 windows of 32
    m = _Counting()
    together = predict_tiles(m, imgs, window=32, batch=16)
    assert m.batches == [16, 9]  # 5 + 20 windows: before, one forward pass per tile (6)
    for img, got in zip(imgs, together, strict=True):
        np.testing.assert_allclose(got, predict_tile(_Counting(), img, window=32), atol=1e-6)
        s = torch.from_numpy(img).float().div(255).sum(-1)
        np.testing.assert_allclose(got[1], torch.sigmoid(s).numpy(), atol=1e-5)


# -- progress lines after the budget ---------------------------------------------------------------
class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_every_phase_after_the_budget_has_a_line(monkeypatch):
    from scarcelab.entrypoints._progress import NORMAL, Display, ProgressTracker

    monkeypatch.setenv("TERM", "xterm")
    out = Tty()
    t = ProgressTracker(InMemoryTracker(), Display(NORMAL, out), budget_s=60.0)
    t.start_study("x", {}, {}, {})
    # segment: an epoch line per validation
    t.log_metrics({"seg/val_pq": 0.25, "train/loss": 1.5, "time/elapsed_s": 5.0}, 0,
                  scope="study")
    # tune: a trial stopped by ASHA at its rung, then the retrains
    t.start_trial(3, {"scarcelab.role": "trial"}, {"lr": 0.1})
    t.log_metrics({"val/balanced_accuracy": 0.4, "train/loss": 1.0}, 0)
    t.set_tags({"scarcelab.pruned": "true", "scarcelab.asha_rung": "1"}, scope="trial")
    t.end_trial("KILLED", "pruned at epoch 2")
    t.start_trial(0, {"scarcelab.role": "retrain"}, {"lr": 0.1})
    t.log_metrics({"train/loss": 0.9}, 0)
    t.log_metrics({"test/balanced_accuracy": 0.625}, 1)
    t.end_trial("FINISHED")
    # segment's test / cross-test phases, then the model
    t.set_tags({"scarcelab.phase": "testing epoch 0's checkpoint on 224 tiles (about 70 s)"})
    t.set_tags({"scarcelab.phase": "cross-test on 15 nuclei_cpm15 tiles (about 40 s)"})
    t.log_model(torch.nn.Linear(1, 1), torch.zeros(1, 1))
    t.end_study("FINISHED")
    text = out.getvalue()
    for line in ("epoch   0: val PQ 0.2500, train loss 1.5000",
                 "trial   3 pruned at rung 1",
                 "retrain 0 …", "retrain  0 finished   1 ep",
                 "test balanced accuracy 0.6250",
                 "testing epoch 0's checkpoint on 224 tiles (about 70 s) …",
                 "cross-test on 15 nuclei_cpm15 tiles (about 40 s) …",
                 "testing epoch 0's checkpoint on 224 tiles (about 70 s): done in",
                 "logging the selected model (torch.export, signature, upload) …",
                 "figures, run description, closing the run …", "run closed in"):
        assert line in text, line


def test_segment_training_and_validation_stay_inside_the_budget(monkeypatch):
    """An epoch longer than the whole budget (4 steps of 10 s + a 3 s validation vs 30 s):
    before, epoch 0 ran whole (43 s); now it stops after the step that still leaves room
    for its validation, which ends inside the budget."""
    from pathlib import Path

    import scarcelab.protocols.segment as seg
    from scarcelab.protocols.segment import SegmentConfig, run_segment

    data = Path(__file__).resolve().parents[4] / "shared" / "data" / "consep_patches"
    if not data.exists():
        pytest.skip(f"{data} not found (../shared/data is only on the project machines)")
    c = FakeClock()
    monkeypatch.setattr(seg, "time", c)
    loss, predict = seg.hovernet_loss, seg.predict_set

    def slow_loss(*a: Any, **k: Any) -> Any:
        c.t += 10.0
        return loss(*a, **k)

    def slow_predict(*a: Any, **k: Any) -> Any:
        c.t += 3.0
        return predict(*a, **k)

    monkeypatch.setattr(seg, "hovernet_loss", slow_loss)
    monkeypatch.setattr(seg, "predict_set", slow_predict)
    phases: list[str] = []

    class Rec(InMemoryTracker):
        def set_tags(self, tags, scope="study"):  # type: ignore[no-untyped-def]
            phases.extend(v for k, v in tags.items() if k == "scarcelab.phase")
            super().set_tags(tags, scope)

    t = Rec()
    res = run_segment(SegmentConfig(
        budget_minutes=0.5, max_epochs=5, patience=5, steps_per_epoch=4, batch_size=2,
        crop=32, window=64, scale=0.25, max_train_tiles=3, max_val_tiles=2, max_test_tiles=2,
        n_overlays=0, device="cpu", arch="small_cnn", data_dir=str(data)), t)
    elapsed = [v for _, v in t.study.history("time/elapsed_s")]
    assert res.epochs == 1 and t.study.history("time/steps") == [(0, 2.0)]
    assert 30.0 - 13.0 <= elapsed[0] <= 30.0
    # the test phase is announced with its estimate at the validation's speed (3 s for 2
    # validation tiles of the same size as the 2 test tiles)
    assert phases[0] == ("testing epoch 0's checkpoint on 2 consep_patches tiles (about 3 s "
                         "at the validation's speed)")


def test_one_set_in_both_evaluation_slots_is_run_once(tiny_bundle):
    """The tune protocol's bundles hold one array in the validation and the test slot
    (search: validation; retrains: train+val): each epoch ran it through the network
    twice; once now, with the same metrics as two passes over a copy."""
    import dataclasses

    from scarcelab.methods import get_method
    from scarcelab.models import create_model

    torch.manual_seed(0)
    m = get_method("sup")(create_model("small_cnn", in_channels=1), tiny_bundle.num_classes,
                          dict(get_method("sup").defaults))
    calls: list[int] = []
    logits = m.logits

    def counting(x: torch.Tensor) -> torch.Tensor:
        calls.append(len(x))
        return logits(x)

    m.logits = counting  # type: ignore[method-assign]
    one = dataclasses.replace(tiny_bundle, test_x=tiny_bundle.val_x, test_y=tiny_bundle.val_y)
    two = dataclasses.replace(one, test_x=one.val_x.copy())
    cfg = train_mod.TrainConfig()
    e1 = train_mod.evaluate(m, one, cfg, np.random.default_rng(0))
    assert calls == [len(one.val_x)]
    e2 = train_mod.evaluate(m, two, cfg, np.random.default_rng(0))
    assert len(calls) == 3 and e1[:2] == e2[:2]
    assert np.array_equal(e1.test_proba, e2.test_proba)


def test_command_start_is_the_process_start_or_its_mlflow_run():
    """What the budget counts from: a child process reports its own start (to the 1 s of
    /proc/stat's boot time), not the moment it asks."""
    import subprocess
    import sys
    import time

    t0 = time.time()
    out = subprocess.run([sys.executable, "-c", (
        "import time; time.sleep(1.5); "
        "from scarcelab.tracking.lifecycle import command_started_at; "
        "print(time.time() - command_started_at())")], capture_output=True, text=True,
        check=True, env={**__import__("os").environ, "MLFLOW_RUN_ID": ""})
    age = float(out.stdout)
    assert 1.5 - 1.0 <= age <= time.time() - t0 + 1.0


def test_the_command_skips_exit_time_garbage_collection():
    """The heap is frozen when the interpreter finalises (the CLI group registers it), so
    the exit-time collections do not traverse it (bench: 2.7 s -> 0.5 s of CPU)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", (
        "import atexit, gc\n"
        "atexit.register(lambda: print('frozen', gc.get_freeze_count()))\n"
        "from scarcelab.entrypoints.cli import main\n"
        "main.main(args=['list', 'archs'], standalone_mode=False)\n")],
        capture_output=True, text=True, check=True)
    assert int(out.stdout.split("frozen")[-1]) > 10_000


def test_a_cpu_clock_budget_buys_the_same_training_on_a_loaded_machine(clock):
    """budget_clock=cpu on a machine where this process gets half a core: its CPU seconds
    run at half the wall rate, so the 60 s budget lasts ~120 s of wall time; the start-up
    charged is the CPU the process spent before the search (not the wall time since the
    command started), and the step costs compared with what is left are CPU seconds too
    (measured in wall seconds they would stop the search twice too early)."""
    clock.process_time = lambda: (clock.t - 999_000.0) / 2  # type: ignore[attr-defined]
    cpu_at_start = clock.process_time()
    started = clock.t - STARTUP_S
    t = SlowFinal(clock)
    run_study(_cfg(started_at=started, budget_clock="cpu"), t)
    assert t.study.last("time/startup_s") == pytest.approx(min(cpu_at_start, 30.0))
    assert t.study.params["budget_clock"] == "cpu"


def test_cpu_clock_step_costs_are_cpu_seconds(clock, tiny_bundle):

    clock.process_time = lambda: clock.t / 2  # type: ignore[attr-defined]
    budget = train_mod.Budget(10.0, clock="cpu")
    res = _train_sup(tiny_bundle, budget)
    # a step costs 1 CPU s, the evaluation 0.5: steps to 1..8 CPU s fit with their
    # evaluation (8 + 0.5 <= 10) and a 9th would too (9 + .5); wall-second costs (2 + 1)
    # would have stopped after 8
    assert budget.elapsed() <= 10.0
    assert res.steps == 9 and res.stopped == "budget"
