"""Behaviours of scarcelab/protocols/search.py and study_store.py that the seeded mutation
sample (docs/mutation.md) showed no test checked. Expected values are derived from the
documented contracts (module and method docstrings), not read off the code's output; the
shared Optuna storage is a real sqlite file, the tracker the in-memory reference one."""

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

import scarcelab.train as train_mod
from scarcelab.errors import ConfigError, TrialFailed
from scarcelab.methods import METHODS, SupervisedMethod
from scarcelab.protocols import search as search_mod
from scarcelab.protocols.search import StudyConfig, StudyResult, prepare_data, run_study
from scarcelab.protocols.study_store import HOST, StudyStore, TrialSeededSampler, redact
from scarcelab.tracker import InMemoryTracker


def _cfg(**kw: Any) -> StudyConfig:
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


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


# -- AutoDevice -------------------------------------------------------------------------------


def test_auto_arch_is_small_cnn_on_cpu_and_resnet18_on_cuda():
    """AutoDevice: resnet18 on a GPU (the paper's backbone), small_cnn on CPU."""
    assert StudyConfig(method="sup", arch="auto", device="cpu").resolved_arch() == "small_cnn"
    assert StudyConfig(method="sup", arch="auto", device="cuda").resolved_arch() == "resnet18"
    assert StudyConfig(method="sup", arch="resnet18", device="cpu").resolved_arch() == "resnet18"


# -- data ---------------------------------------------------------------------------------------


def test_prepare_data_passes_allow_large_val_through():
    """A validation set larger than the labeled set is refused unless allowed."""
    with pytest.raises(ConfigError, match="allow_large_val"):
        prepare_data(_cfg(n_labeled=9, n_val=21))
    bundle, split = prepare_data(_cfg(n_labeled=9, n_val=21, allow_large_val=True))
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


# -- the study's figures ------------------------------------------------------------------------


def test_figures_get_the_selected_models_test_probabilities(tiny_bundle):
    """log_evaluation receives the exported model's softmax probabilities on every test
    image (one row per image, summing to 1), the test labels and the class names."""
    t = _RecordingTracker()
    run_study(_cfg(), t)
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


# -- checkpoints are uploaded only once there is a best ------------------------------------------


def test_no_checkpoint_is_uploaded_before_an_epoch_sets_a_best(monkeypatch):
    """An epoch whose validation score is not a number sets no best (strict ">"), so there
    is nothing to store yet: the first upload is the first real best (epoch 1)."""
    script = iter([math.nan, 0.5, 0.4])

    def evaluate(method, bundle, cfg, rng):  # type: ignore[no-untyped-def]
        v = next(script)
        return v, {"balanced_accuracy": 0.3, "accuracy": 0.3}, None

    monkeypatch.setattr(train_mod, "evaluate", evaluate)
    t = InMemoryTracker()
    res = run_study(_cfg(max_epochs=3), t)
    assert (res.best_val, res.best_checkpoint["epoch"]) == (0.5, 1)
    assert len(t.checkpoints) == 1 and t.checkpoints[0]["epoch"] == 1


# -- shared storage: crashed trials and other workers --------------------------------------------


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
    run_study(_cfg(max_trials=3, storage=url, study_name="reaped"), t)
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
    res = run_study(_cfg(max_trials=1, storage=url, study_name="slot"), t)
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
    res = run_study(_cfg(max_trials=2, storage=url, study_name="race"), t)
    assert isinstance(res, StudyResult)
    assert (res.n_trials, res.n_failed, res.best_trial) == (2, 0, 0)
    assert len(t.trials) == 1 and t.model is not None
    assert t.study.status == "FINISHED" and t.study.tags["scarcelab.n_trials"] == "2"
    states = [tr.state for tr in optuna.load_study(study_name="race", storage=url).trials]
    assert states == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED]


# -- determinism and error reporting -----------------------------------------------------------


def test_same_seed_gives_the_same_study_including_the_linear_probe():
    """A probe-evaluated (self-supervised) study is a function of its seed: the probe's
    random C search is seeded by the trial seed, so two runs pick the same C."""
    runs = []
    for _ in range(2):
        t = InMemoryTracker()
        res = run_study(_cfg(method="simclr", batch_size=8, unlabeled_batch_size=16), t)
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
        run_study(_cfg(method=crashing_method), InMemoryTracker())
    msgs = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("trial 0 raised RuntimeError: boom: tensor 7 has the wrong shape" in m
               for m in msgs), msgs


# -- study_store ---------------------------------------------------------------------------------


def test_redact_hides_a_password_containing_a_newline():
    """When in doubt it hides more: any character may be in the password, a newline too."""
    assert redact("postgresql://postgres:pa\nss@127.0.0.1:5432/optuna") == \
        "postgresql://postgres:***@127.0.0.1:5432/optuna"


def test_time_of_a_dead_trial_without_heartbeat_is_counted(tmp_path):
    """A dead process's trial that recorded its clock but never a heartbeat still counts
    (its owner is dead); a trial with no heartbeat is not an error."""
    url = f"sqlite:///{tmp_path}/optuna.db"
    store = StudyStore("s", 0, url)
    trial = store.study.ask()
    trial.set_user_attr("owner", f"{HOST}:{_dead_pid()}")
    trial.set_user_attr("elapsed_s", 42.5)
    assert store.spent_by_dead_processes() == 42.5
    store.close()


def test_large_study_seeds_draw_valid_configurations():
    """Draws depend only on (seed, trial, parameter) for any seed: a large one must not make
    the per-parameter sub-seed overflow numpy's 32-bit seed range."""
    from scarcelab.methods.space import LogUniform, sample

    space = {"lr": LogUniform(1e-4, 1e-1)}

    def draws(seed: int) -> list[float]:
        study = optuna.create_study(sampler=TrialSeededSampler(seed))
        out = []
        for _ in range(3):
            t = study.ask()
            out.append(sample(space, t)["lr"])
            study.tell(t, 0.0)
        return out

    for seed in (5_000, 7_000, 123_456):  # seed * 1_000_003 is past 2**32
        a = draws(seed)
        assert a == draws(seed) and all(1e-4 <= v <= 1e-1 for v in a)
