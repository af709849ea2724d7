"""Protocol fidelity of the budgeted search (issue 12 items 9, 10 and its test gaps):
which checkpoint is chosen, what the budget counts (diagnostics out, time already spent
in), and the transfer strategy (train + validation, train-loss early stopping)."""

from __future__ import annotations

import dataclasses
import logging
import math
import subprocess
import time
from typing import Any

import numpy as np
import optuna
import pytest
import torch
from optuna.trial import TrialState

import scarcelab.protocols.search as search_mod
import scarcelab.train as train_mod
from scarcelab.errors import ConfigError, TrialFailed
from scarcelab.methods import METHODS, SupervisedMethod
from scarcelab.protocols.search import StudyConfig, StudyResult, prepare_data, run_study
from scarcelab.protocols.study_store import HOST, StudyStore
from scarcelab.tracker import InMemoryTracker, ResumeState


def _cfg(**kw):
    base = dict(method="sup", dataset="synthetic_tiny", budget_minutes=0.5, max_epochs=3,
                patience=10, batch_size=16, unlabeled_batch_size=32, max_steps_per_epoch=2,
                max_trials=2, arch="small_cnn", device="cpu")
    base.update(kw)
    return StudyConfig(**base)


# -- checkpoint selection: by validation, first of ties ---------------------------------------

# (val, test) per epoch, trial after trial. Validation and test rank epochs differently and
# validation has ties: within trial 0 (epochs 1 and 2) and across trials (trial 1, epoch 0).
SCRIPT = [[(0.50, 0.90), (0.70, 0.60), (0.70, 0.80)],
          [(0.70, 0.95), (0.60, 0.99), (0.65, 0.10)]]


@pytest.fixture
def scripted_eval(monkeypatch):
    calls = iter([e for trial in SCRIPT for e in trial])

    def evaluate(method, bundle, cfg, rng, sets=None):
        v, t = next(calls)
        return v, {"balanced_accuracy": t, "accuracy": t}, None

    monkeypatch.setattr(train_mod, "evaluate", evaluate)


def test_best_checkpoint_is_the_first_val_best_not_the_test_best(scripted_eval):
    t = InMemoryTracker()
    res = run_study(_cfg(), t)
    # val-best = 0.70, first reached at trial 0, epoch 1 (test 0.60): not the later tied
    # epoch 2 (0.80), not trial 1's tied epoch 0 (0.95), not the test-best (0.99)
    assert (res.best_val, res.best_trial) == (0.70, 0)
    assert res.best_test["balanced_accuracy"] == 0.60
    ck = res.best_checkpoint
    assert (ck["trial"], ck["epoch"], ck["val_balanced_accuracy"]) == (0, 1, 0.70)
    assert ck["test_metrics"]["balanced_accuracy"] == 0.60
    assert t.checkpoints[-1]["epoch"] == 1 and t.checkpoints[-1]["trial"] == 0
    assert t.study.last("best/test_balanced_accuracy") == 0.60
    assert t.study.tags["scarcelab.best_trial"] == "0"
    # each trial's own answer: its first val-best epoch
    t0, t1 = t.trials
    assert t0.last("best/epoch") == 1 and t0.last("best/test_balanced_accuracy") == 0.60
    assert t1.last("best/epoch") == 0 and t1.last("best/test_balanced_accuracy") == 0.95
    # the study's best-so-far curve, one point per global epoch
    assert [v for _, v in t.study.history("best/test_balanced_accuracy")] == [
        0.90, 0.60, 0.60, 0.60, 0.60, 0.60]


# -- the budget: diagnostics out ----------------------------------------------------------------


class _SlowDiagnostics:
    """Stands in for EpochDiagnostics: each call "takes" 1000 s of (fake) wall clock."""

    def __init__(self, clock):
        self.clock = clock

    def __call__(self, method, epoch):
        self.clock[0] += 1000.0
        return {"diag/ple": 0.5}


@pytest.fixture
def fake_clock(monkeypatch):
    real = time.time
    offset = [0.0]
    monkeypatch.setattr(time, "time", lambda: real() + offset[0])
    return offset


def test_diagnostics_do_not_count_against_the_budget(fake_clock, monkeypatch):
    monkeypatch.setattr(search_mod, "EpochDiagnostics",
                        lambda *a, **k: _SlowDiagnostics(fake_clock))
    t = InMemoryTracker()
    run_study(_cfg(method="fixmatch", max_trials=1, batch_size=8, unlabeled_batch_size=16,
                   diag_samples=16, overrides={"threshold": 0.4}), t)
    tr = t.trials[0]
    # 3000 s of diagnostics in a 30 s budget: every epoch still trains
    assert tr.last("epochs") == 3 and tr.tags["scarcelab.stopped"] == "max_epochs"
    assert [v for _, v in tr.history("time/steps")] == [2.0, 2.0, 2.0]
    assert all(v >= 1000 for _, v in tr.history("time/diag_s"))
    assert all(v < 30 for _, v in tr.history("time/elapsed_s"))
    assert all(v < 1000 for _, v in tr.history("time/epoch_s"))
    assert t.study.last("time/diag_s") >= 3000  # logged separately, study-wide


# -- the budget: time already spent counts on resume -----------------------------------------


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


class _ResumingTracker(InMemoryTracker):
    def __init__(self, name: str, elapsed_s: float) -> None:
        super().__init__()
        self.state = ResumeState(optuna_study=name, elapsed_s=elapsed_s, global_epoch=0,
                                 best_checkpoint=None)

    def resume_state(self, study_key):
        return self.state


@pytest.mark.parametrize(("logged_s", "killed_trial_s", "spent_s"),
                         [(20.0, None, 20.0),  # the tracker's record of the dead run
                          (4.0, 12.0, 12.0)])  # + the killed trial's time after its last epoch
def test_time_already_spent_counts_against_the_budget_on_resume(
        tmp_path, logged_s, killed_trial_s, spent_s):
    storage = f"sqlite:///{tmp_path}/optuna.db"
    name = "killed-study"
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize")
    old = study.ask()  # the trial the killed process was running
    old.set_user_attr("owner", f"{HOST}:{_dead_pid()}")
    old.set_user_attr("heartbeat", time.time() - 3.0)
    if killed_trial_s is not None:
        old.set_user_attr("elapsed_s", killed_trial_s)
    t = _ResumingTracker(name, logged_s)
    run_study(_cfg(max_trials=2, storage=storage), t)
    first = t.study.history("time/elapsed_s")[0][1]
    assert spent_s <= first < spent_s + 8  # the clock continues from the time spent
    assert all(v >= spent_s for _, v in t.trials[0].history("time/elapsed_s"))
    reloaded = optuna.load_study(study_name=name, storage=storage)
    assert reloaded.trials[0].user_attrs.get("crashed") is True


def test_running_trials_carry_the_budget_clock(tmp_path):
    """What the resume above reads: each trial of a shared study holds the budget clock
    (diagnostics excluded) as of its last epoch or heartbeat."""
    storage = f"sqlite:///{tmp_path}/optuna.db"
    t = InMemoryTracker()
    run_study(_cfg(max_trials=2, storage=storage, study_name="clocked"), t)
    trials = optuna.load_study(study_name="clocked", storage=storage).trials
    for tr, rec in zip(trials, t.trials, strict=True):
        assert tr.user_attrs["elapsed_s"] == pytest.approx(rec.last("time/elapsed_s"))


# -- transfer strategy (SSL-vs-SSL App. D.2) ---------------------------------------------------


class _ConstantLoss(SupervisedMethod):
    """Its train loss never improves after the first epoch."""

    search_space = METHODS.get("sup").search_space
    defaults = METHODS.get("sup").defaults

    def step(self, batch, progress):
        loss = self.logits(batch.x[0]).sum() * 0.0 + 1.0
        return {"loss": loss, "loss_labeled": loss}


@pytest.fixture
def constant_loss():
    METHODS.register("constant_loss")(_ConstantLoss)
    yield "constant_loss"
    METHODS._entries.pop("constant_loss")


def test_transfer_runs_transfer_epochs_on_train_plus_val():
    t = InMemoryTracker()
    res = run_study(_cfg(search="none", max_epochs=2, transfer_epochs=4, max_trials=5), t)
    assert len(t.trials) == 1 and t.trials[0].last("epochs") == 4  # not max_epochs
    assert t.trials[0].tags["scarcelab.stopped"] == "max_epochs"
    assert t.study.tags["scarcelab.val_in_train"] == "true"
    assert t.study.tags["scarcelab.hparams_source"] == "defaults"
    assert t.study.params["transfer_epochs"] == 4
    assert res.best_checkpoint["epoch"] == 3  # no selection: the last epoch is the answer
    assert t.trials[0].params["lr"] == METHODS.get("sup").defaults["lr"]


def test_transfer_stops_after_patience_epochs_without_lower_train_loss(constant_loss):
    t = InMemoryTracker()
    run_study(_cfg(method=constant_loss, search="none", transfer_epochs=50,
                   transfer_patience=2), t)
    tr = t.trials[0]
    assert [v for _, v in tr.history("train/loss")] == [1.0, 1.0, 1.0]
    assert tr.last("epochs") == 3 and tr.tags["scarcelab.stopped"] == "patience"


def test_transfer_epochs_default_and_given_configuration():
    assert StudyConfig(method="sup", dataset="tissuemnist").resolved_transfer_epochs() == 100
    assert StudyConfig(method="sup", dataset="tmed2").resolved_transfer_epochs() == 80
    t = InMemoryTracker()
    run_study(_cfg(search="none", transfer_epochs=1, hparams={"lr": 0.0123},
                   hparams_source="experiment:tissue-sweep"), t)
    assert t.trials[0].params["lr"] == 0.0123
    assert t.study.tags["scarcelab.hparams_source"] == "experiment:tissue-sweep"
    assert t.study.params["hparams.lr"] == 0.0123
    with pytest.raises(ConfigError, match="needs search=none.*or search=fixed"):
        run_study(_cfg(hparams={"lr": 0.01}, hparams_source="run:abc"), InMemoryTracker())
    with pytest.raises(ConfigError, match="'bogus'.*does not know"):
        run_study(_cfg(search="none", hparams={"bogus": 1}), InMemoryTracker())
    with pytest.raises(ConfigError, match="search=fixed trains a given configuration"):
        run_study(_cfg(search="fixed"), InMemoryTracker())


def test_fixed_search_trains_one_given_configuration_with_val_selection():
    t = InMemoryTracker()
    res = run_study(_cfg(search="fixed", hparams={"lr": 0.002, "weight_decay": 1e-5},
                         hparams_source="tuned", max_trials=0), t)
    assert len(t.trials) == 1 and t.trials[0].params["lr"] == 0.002
    assert "scarcelab.val_in_train" not in t.study.tags
    vals = [v for _, v in t.trials[0].history("val/balanced_accuracy")]
    assert res.best_val == max(vals)


def test_study_validation_from_the_official_split_is_tagged():
    t = InMemoryTracker()
    res = run_study(_cfg(max_trials=1, max_epochs=1), t)
    assert t.study.tags["scarcelab.val_from"] == "official"
    assert t.study.params["n_unlabeled"] == 570  # all of train but the 30 labeled
    t2 = InMemoryTracker()
    res2 = run_study(_cfg(max_trials=1, max_epochs=1, val_from="train"), t2)
    assert t2.study.tags["scarcelab.val_from"] == "train" and res2.split_hash != res.split_hash
    assert t2.study.params["n_unlabeled"] == 540


def test_budget_pause_excludes_time():
    b = train_mod.Budget(10.0, spent_s=3.0)
    assert 3.0 <= b.elapsed() < 4.0
    with b.paused():
        time.sleep(0.05)
    assert b.excluded_s >= 0.05 and b.elapsed() < 4.0 and not b.expired()
    assert train_mod.Budget(1.0, spent_s=1.0).expired()
    _ = np, torch  # imported for the fixtures' monkeypatching targets


# -- the budget's clock: wall seconds or this process's CPU seconds ---------------------------


def test_cpu_budget_counts_cpu_seconds_not_waiting():
    """A CPU budget is what a study on a shared machine needs: time the process waits
    (another job holds the core, here a sleep) is not spent; its own work is."""
    wall, cpu = train_mod.Budget(10.0), train_mod.Budget(10.0, spent_s=2.0, clock="cpu")
    time.sleep(0.3)
    assert wall.elapsed() >= 0.3
    assert 2.0 <= cpu.elapsed() < 2.1
    t0 = time.process_time()
    while time.process_time() - t0 < 0.2:  # busy: 0.2 CPU seconds
        pass
    assert cpu.elapsed() >= 2.19
    with cpu.paused():  # diagnostics stay out of it on this clock too
        t0 = time.process_time()
        while time.process_time() - t0 < 0.1:
            pass
    assert cpu.excluded_s >= 0.1 and cpu.elapsed() < 2.2 + 0.1
    with pytest.raises(ValueError, match="budget clock 'gpu'"):
        train_mod.Budget(1.0, clock="gpu")


def test_study_budget_clock_is_validated_logged_and_keys_the_study():
    with pytest.raises(ConfigError, match="budget_clock='cycles'"):
        run_study(_cfg(budget_clock="cycles"), InMemoryTracker())
    t = InMemoryTracker()
    run_study(_cfg(budget_clock="cpu", max_trials=1, max_epochs=1), t)
    assert t.study.params["budget_clock"] == "cpu"
    key = search_mod._study_key
    assert key(_cfg(), "h") != key(_cfg(budget_clock="cpu"), "h")
    # the default leaves keys of studies recorded before the option unchanged
    legacy = {k: v for k, v in __import__("dataclasses").asdict(_cfg()).items()
              if k not in ("storage", "study_name", "fresh_study", "device", "label_fraction",
                           "budget_clock", "started_at", "final_reserve_s",
                           "probe_solver", "eval_every_steps", "accel", "data_options",
                           "schedule_horizon")}
    import hashlib
    import json
    blob = json.dumps({**legacy, "split_hash": "h"}, sort_keys=True, default=str)
    assert key(_cfg(), "h") == "study-" + hashlib.sha256(blob.encode()).hexdigest()[:16]


# -- AutoDevice, data, figures, shared storage, seeds, errors (mutation sample, docs/mutation.md) --
def _one_trial_cfg(**kw: Any) -> StudyConfig:
    """One trial of one epoch of one step (the module's ``_cfg`` runs 2 x 3 x 2)."""
    base: dict[str, Any] = dict(
        method="sup", dataset="synthetic_tiny", budget_minutes=0.5, max_epochs=1, patience=10,
        batch_size=16, unlabeled_batch_size=32, max_steps_per_epoch=1, max_trials=1,
        arch="small_cnn", device="cpu")
    base.update(kw)
    return StudyConfig(**base)


class _RecordingTracker(InMemoryTracker):
    """The reference tracker, also keeping what its optional hooks receive."""

    def __init__(self) -> None:
        super().__init__()
        self.evaluations: list[tuple[np.ndarray, np.ndarray, list[str]]] = []
        self.searches: list[list[Any]] = []
        self.marked_failed: list[tuple[str, list[int], str]] = []

    def log_evaluation(self, y_true, proba, class_names, split="test",  # type: ignore[no-untyped-def]
                       positive_class=None):
        self.evaluations.append((np.asarray(y_true), np.asarray(proba), list(class_names)))

    def log_search(self, trials):  # type: ignore[no-untyped-def]
        self.searches.append(list(trials))

    def mark_trials_failed(self, study_key, numbers, reason):  # type: ignore[no-untyped-def]
        self.marked_failed.append((study_key, list(numbers) if numbers is not None else None,
                                   reason))


def test_auto_arch_is_small_cnn_on_cpu_and_resnet18_on_cuda():
    """AutoDevice: resnet18 on a GPU (the paper's backbone), small_cnn on CPU."""
    assert StudyConfig(method="sup", arch="auto", device="cpu").resolved_arch() == "small_cnn"
    assert StudyConfig(method="sup", arch="auto", device="cuda").resolved_arch() == "resnet18"
    assert StudyConfig(method="sup", arch="resnet18", device="cpu").resolved_arch() == "resnet18"


def test_prepare_data_passes_allow_large_val_through():
    """A validation set larger than the labeled set is refused unless allowed."""
    with pytest.raises(ConfigError, match="allow_large_val"):
        prepare_data(_one_trial_cfg(n_labeled=9, n_val=21))
    bundle, split = prepare_data(_one_trial_cfg(n_labeled=9, n_val=21, allow_large_val=True))
    assert (split["n_labeled"], split["n_val"]) == (9, 21)
    assert (len(bundle.labeled_y), len(bundle.val_y)) == (9, 21)


def test_dataset_digest_identifies_the_data_file_and_the_split(tiny_bundle):
    """The digest logged with the dataset input changes when the data file (its md5)
    changes, even for the same split, and not otherwise."""
    meta = tiny_bundle.meta

    def digest(**m: Any) -> str:
        b = dataclasses.replace(tiny_bundle, meta={**meta, **m})
        return search_mod._dataset_info(b).digest

    assert digest(md5="0" * 32) == digest(md5="0" * 32)
    assert digest(md5="0" * 32) != digest(md5="1" * 32)
    assert digest(md5="0" * 32, split_hash="a") != digest(md5="0" * 32, split_hash="b")


def test_figures_get_the_selected_models_test_probabilities(tiny_bundle):
    """log_evaluation receives the exported model's softmax probabilities on every test
    image (one row per image, summing to 1), the test labels and the class names."""
    t = _RecordingTracker()
    run_study(_one_trial_cfg(), t)
    assert len(t.evaluations) == 1 and len(t.searches) == 1
    y, proba, names = t.evaluations[0]
    np.testing.assert_array_equal(y, tiny_bundle.test_y)
    assert names == list(tiny_bundle.meta["class_names"])
    assert proba.shape == (len(tiny_bundle.test_y), tiny_bundle.num_classes)
    np.testing.assert_allclose(proba.sum(1), 1.0, atol=1e-5)
    with torch.no_grad():
        want = torch.softmax(t.model(torch.as_tensor(tiny_bundle.test_x).float() / 255), 1)
    np.testing.assert_allclose(proba, want.numpy(), atol=1e-6)
    assert [tr.state for tr in t.searches[0]] == [TrialState.COMPLETE]


def test_no_checkpoint_is_uploaded_before_an_epoch_sets_a_best(monkeypatch):
    """An epoch whose validation score is not a number sets no best (strict ">"), so there
    is nothing to store yet: the first upload is the first real best (epoch 1)."""
    script = iter([math.nan, 0.5, 0.4])

    def evaluate(method, bundle, cfg, rng, sets=None):  # type: ignore[no-untyped-def]
        v = next(script)
        return v, {"balanced_accuracy": 0.3, "accuracy": 0.3}, None

    monkeypatch.setattr(train_mod, "evaluate", evaluate)
    t = InMemoryTracker()
    res = run_study(_one_trial_cfg(max_epochs=3), t)
    assert (res.best_val, res.best_checkpoint["epoch"]) == (0.5, 1)
    assert len(t.checkpoints) == 1 and t.checkpoints[0]["epoch"] == 1


def test_reap_marks_exactly_the_dead_processes_trials_failed(tmp_path):
    """A trial left running by a dead process is failed in the store and its tracker record
    closed; a live worker's running trial on another host is left alone."""
    url = f"sqlite:///{tmp_path}/optuna.db"
    study = optuna.create_study(study_name="reaped", storage=url, direction="maximize")
    dead = study.ask()
    dead.set_user_attr("owner", f"{HOST}:{_dead_pid()}")
    dead.set_user_attr("heartbeat", time.time())
    live = study.ask()
    live.set_user_attr("owner", "another-host:1")
    live.set_user_attr("heartbeat", time.time())
    t = _RecordingTracker()
    run_study(_one_trial_cfg(max_trials=3, storage=url, study_name="reaped"), t)
    assert len(t.marked_failed) == 1
    key, numbers, reason = t.marked_failed[0]
    assert key == "reaped" and numbers == [dead.number] and "died" in reason
    states = {tr.number: tr.state for tr in optuna.load_study(study_name="reaped",
                                                              storage=url).trials}
    assert states[dead.number] == TrialState.FAIL and states[live.number] == TrialState.RUNNING


def test_a_dead_processs_trial_does_not_take_the_last_slot(tmp_path):
    """A trial left RUNNING by a dead process is reaped before the slots are counted: with
    ``max_trials=1`` the joining worker still runs its trial (found while writing these
    tests: it ran none and failed with "no trial ... completed an epoch")."""
    url = f"sqlite:///{tmp_path}/optuna.db"
    study = optuna.create_study(study_name="slot", storage=url, direction="maximize")
    dead = study.ask()
    dead.set_user_attr("owner", f"{HOST}:{_dead_pid()}")
    dead.set_user_attr("heartbeat", time.time())
    t = _RecordingTracker()
    res = run_study(_one_trial_cfg(max_trials=1, storage=url, study_name="slot"), t)
    assert res.n_trials == 1 and len(t.trials) == 1
    assert [n for _, n, _ in t.marked_failed] == [[dead.number]]


def test_a_slot_taken_by_another_worker_still_ends_with_the_studys_result(tmp_path,
                                                                          monkeypatch):
    """With a study-wide max_trials, a worker whose new trial finds the last slot taken by
    another worker prunes it and finishes normally: the study's counts, best model and
    result are still recorded."""
    url = f"sqlite:///{tmp_path}/optuna.db"
    real_ask = StudyStore.ask
    asked = []

    def ask(self, elapsed=None):  # type: ignore[no-untyped-def]
        asked.append(1)
        if len(asked) == 2:  # another worker asks (and finishes) a trial just before us
            other = StudyStore(self.name, 0, url)
            trial = real_ask(other)
            other.tell(trial, 0.1)
            other.close()
        return real_ask(self, elapsed)

    monkeypatch.setattr(StudyStore, "ask", ask)
    t = InMemoryTracker()
    res = run_study(_one_trial_cfg(max_trials=2, storage=url, study_name="race"), t)
    assert isinstance(res, StudyResult)
    assert (res.n_trials, res.n_failed, res.best_trial) == (2, 0, 0)
    assert len(t.trials) == 1 and t.model is not None
    assert t.study.status == "FINISHED" and t.study.tags["scarcelab.n_trials"] == "2"
    states = [tr.state for tr in optuna.load_study(study_name="race", storage=url).trials]
    assert states == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED]


def test_same_seed_gives_the_same_study_including_the_linear_probe():
    """A probe-evaluated (self-supervised) study is a function of its seed: the probe's
    random C search is seeded by the trial seed, so two runs pick the same C."""
    runs = []
    for _ in range(2):
        t = InMemoryTracker()
        res = run_study(_one_trial_cfg(method="simclr", batch_size=8, unlabeled_batch_size=16), t)
        runs.append((res, t))
    (r1, t1), (r2, t2) = runs
    c1, c2 = t1.trials[0].history("probe/C"), t2.trials[0].history("probe/C")
    assert c1 and c1 == c2
    assert (r1.best_val, r1.best_test) == (r2.best_val, r2.best_test)
    x = torch.rand(4, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    assert torch.equal(t1.model(x), t2.model(x))


class _Crashes(SupervisedMethod):
    """An unexpected error (a bug, not a bad configuration) in every step."""

    search_space = METHODS.get("sup").search_space
    defaults = METHODS.get("sup").defaults

    def step(self, batch, progress):  # type: ignore[no-untyped-def]
        raise RuntimeError("boom: tensor 7 has the wrong shape")


@pytest.fixture
def crashing_method():  # type: ignore[no-untyped-def]
    METHODS.register("crashes_in_step")(_Crashes)
    yield "crashes_in_step"
    METHODS._entries.pop("crashes_in_step")


def test_an_unexpected_trial_error_is_logged_with_its_message(crashing_method, caplog):
    with caplog.at_level(logging.ERROR, logger="scarcelab"), \
            pytest.raises(TrialFailed, match="all 1 trials.*boom: tensor 7"):
        run_study(_one_trial_cfg(method=crashing_method), InMemoryTracker())
    msgs = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("trial 0 raised RuntimeError: boom: tensor 7 has the wrong shape" in m
               for m in msgs), msgs


def test_a_restored_checkpoint_is_run_over_every_test_image_in_unit_range():
    """A resumed study's checkpoint has no recorded test probabilities: the figures get the
    model's softmax over *every* test image (more than one 512-image chunk), fed as the
    exported model takes them, pixels scaled to [0, 1]."""
    from types import SimpleNamespace

    rng = np.random.default_rng(0)
    test_x = rng.integers(0, 256, (600, 1, 2, 2), dtype=np.uint8)
    test_y = rng.integers(0, 3, 600)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    with torch.no_grad():
        model[1].weight.mul_(40.0)  # large enough that 1/256 vs 1/255 shows in the softmax
        expected = torch.softmax(model(torch.as_tensor(test_x).float() / 255.0), 1).numpy()
    seen: dict[str, Any] = {}

    class Figures:
        def log_evaluation(self, y, proba, class_names, positive_class=None):  # type: ignore[no-untyped-def]
            seen["eval"] = (y, proba, class_names, positive_class)

        def log_search(self, trials):  # type: ignore[no-untyped-def]
            seen["trials"] = trials

    bundle = SimpleNamespace(test_x=test_x, test_y=test_y,
                             meta={"class_names": ["a", "b", "c"], "positive_class": None})
    store = SimpleNamespace(study=SimpleNamespace(get_trials=lambda: ["t0"]))
    search_mod._log_figures(Figures(), model, bundle, store, None)  # type: ignore[arg-type]
    y, proba, names, _ = seen["eval"]
    assert proba.shape == (600, 3) and np.array_equal(y, test_y) and names == ["a", "b", "c"]
    np.testing.assert_allclose(proba, expected, rtol=1e-5, atol=1e-6)
    assert seen["trials"] == ["t0"]


def test_a_new_stored_study_is_named_by_its_key_or_key_start_time_and_process(tmp_path):
    """No ``study_name`` and nothing to resume: the shared storage gets the study named by
    the key, which every worker of the command joins (issue 42 item 6); ``fresh_study``
    gets ``<key>-<start time, %Y%m%dT%H%M%S>-<pid>``, so repeats of one command sort by
    time."""
    import datetime as dt
    import os

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    store, resume = search_mod._open_store(_one_trial_cfg(storage=url), InMemoryTracker(),
                                           "sup-key")
    assert resume is None and store.study.study_name == "sup-key"
    before = dt.datetime.now().replace(microsecond=0)
    store, resume = search_mod._open_store(_one_trial_cfg(storage=url, fresh_study=True),
                                           InMemoryTracker(), "sup-key")
    after = dt.datetime.now()
    assert resume is None
    key, stamp, pid = store.study.study_name.rsplit("-", 2)
    assert key == "sup-key" and pid == str(os.getpid())
    assert before <= dt.datetime.strptime(stamp, "%Y%m%dT%H%M%S") <= after
    assert optuna.load_study(study_name=store.study.study_name, storage=url) is not None
