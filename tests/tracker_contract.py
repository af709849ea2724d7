"""The contract every Tracker of the product code inherits (Optuna's
``optuna/testing/pytest_storages.py`` idea: one test class, one subclass per
implementation).

A subclass provides ``supplier`` — a fixture that yields a :class:`Supplier`: the tracker
under test, a way to read back what it kept (:class:`Seen`, from wherever it keeps it:
lists, an MLflow store, the tracker behind a wrapper) and a way to leave a study behind as
a killed process leaves it. The same calls then go through every implementation and the
same things must come out: a wrapper that drops a call (the way the contamination sweep's
``TaggingTracker`` once dropped ``log_evaluation`` and ``resume_state``, issue 23 item
21) fails here. ``tests/core/test_tracker_contract.py`` holds the subclasses and a scan of the
product code that fails when a Tracker class has none.

``EXERCISED`` names the Tracker methods these tests call; a test checks it equals the
interface, so a method added to :class:`~scarcelab.tracker.Tracker` needs a contract test
(and then every wrapper must forward it, which :class:`~scarcelab.tracker.DelegatingTracker`
does).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import optuna
import torch

from scarcelab.tracker import DatasetInfo, InMemoryTracker, ResumeState, Tracker

#: the Tracker methods the contract below calls (checked against the interface)
EXERCISED = frozenset({
    "start_study", "start_trial", "log_metrics", "log_metrics_batch", "log_checkpoint",
    "end_trial", "log_model", "end_study", "set_tags", "log_evaluation", "log_search",
    "resume_state", "mark_trials_failed", "close_orphan_trials", "log_image", "open_study"})

KEY = "study-contract-0001"


def param_str(v: Any) -> str:
    """Params as a store keeps them (``tracking.mlflow_tracker._param_value``)."""
    return v if isinstance(v, str) else json.dumps(v, default=str)


@dataclass
class SeenTrial:
    number: int
    tags: dict[str, str]
    params: dict[str, str]
    metrics: dict[str, list[tuple[int, float]]]
    status: str
    error: str | None


@dataclass
class Seen:
    """What a tracker kept, read back from where it keeps it."""

    study_tags: dict[str, str]
    study_params: dict[str, str]
    study_metrics: dict[str, list[tuple[int, float]]]
    study_status: str
    trials: list[SeenTrial]
    checkpoints: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    evaluations: list[tuple[str, int | None]] = field(default_factory=list)  # split, positive
    searched: bool = False
    model: bool = False
    artifacts: list[str] = field(default_factory=list)  # start_study's JSON files


class Supplier:
    """One implementation under test. ``persistent``: it can find a killed study again."""

    tracker: Tracker
    persistent: bool = False
    checks_model: bool = True  # False: log_model is too slow to call here (said why)

    def seen(self) -> Seen:
        raise NotImplementedError

    def kill_study(self, key: str) -> ResumeState | None:
        """Leave study ``key`` as a killed process leaves it — its record open, trials 0
        and 1 open, 12.5 s spent, three study-level epochs logged, Optuna study
        ``optuna-<key>`` — and return the state a resume must find (None if the tracker
        cannot persist a study)."""
        return None

    def orphan_statuses(self) -> dict[int, str] | None:
        """The status of the killed study's trial records (None: not persistent)."""
        return None


# -- the reference inner tracker of the wrappers ------------------------------------------


class RecordingTracker(InMemoryTracker):
    """:class:`InMemoryTracker` that also plays a persistent store's part in a resume, so
    that a wrapper in front of it is checked on the resume calls as well."""

    def __init__(self) -> None:
        super().__init__()
        self.dead: dict[str, ResumeState] = {}
        self.orphans: dict[int, str] = {}
        self.errors: dict[int, str] = {}
        self._resumed: str | None = None

    def resume_state(self, study_key: str) -> ResumeState | None:
        state = self.dead.get(study_key)
        self._resumed = study_key if state is not None else None
        return state

    def close_orphan_trials(self, completed: set[int]) -> None:
        if self._resumed is None:
            return
        for n, st in self.orphans.items():
            if st == "RUNNING":
                self.orphans[n] = "FINISHED" if n in completed else "FAILED"

    def mark_trials_failed(self, study_key: str, numbers: list[int], reason: str) -> None:
        if study_key in self.dead:
            for n in numbers:
                if self.orphans.get(n) == "RUNNING":
                    self.orphans[n], self.errors[n] = "FAILED", reason


def seen_in_memory(t: InMemoryTracker) -> Seen:
    assert t.study is not None, "no study was started"

    def hist(rec: Any) -> dict[str, list[tuple[int, float]]]:
        out: dict[str, list[tuple[int, float]]] = {}
        for k, v, s in rec.metrics:
            out.setdefault(k, []).append((s, v))
        return out

    trials = [SeenTrial(int(r.tags.get("scarcelab.trial", r.name.split("-")[-1])),
                        dict(r.tags), {k: param_str(v) for k, v in r.params.items()}, hist(r),
                        r.status, r.error) for r in t.trials]
    return Seen(dict(t.study.tags), {k: param_str(v) for k, v in t.study.params.items()},
                hist(t.study), t.study.status, trials,
                checkpoints=["best.pt"] * len(t.checkpoints), images=sorted(t.images),
                evaluations=[(e[0], e[2]) for e in t.evaluations],
                searched=any(len(s) for s in t.searches),
                model=t.model is not None, artifacts=sorted(t.artifacts))


class RecordingSupplier(Supplier):
    """A wrapper under test in front of a :class:`RecordingTracker`."""

    persistent = True

    def __init__(self, wrap: Any) -> None:
        self.inner = RecordingTracker()
        self.tracker = wrap(self.inner)

    def seen(self) -> Seen:
        return seen_in_memory(self.inner)

    def kill_study(self, key: str) -> ResumeState | None:
        state = ResumeState(optuna_study=f"optuna-{key}", elapsed_s=12.5, global_epoch=3,
                            best_checkpoint=None)
        self.inner.dead[key] = state
        self.inner.orphans = {0: "RUNNING", 1: "RUNNING"}
        return state

    def orphan_statuses(self) -> dict[int, str] | None:
        return dict(self.inner.orphans)


# -- the calls -----------------------------------------------------------------------------


STUDY_TAGS = {"scarcelab.role": "study", "scarcelab.method": "sup",
              "scarcelab.study_key": KEY}
STUDY_PARAMS = {"lr": 0.1, "arch": "small_cnn", "n_labeled": 40, "hp": {"a": 1}}


def _trial_tags(n: int) -> dict[str, str]:
    return {**STUDY_TAGS, "scarcelab.role": "trial", "scarcelab.trial": str(n)}


def _open(t: Tracker) -> None:
    t.start_study("contract-study", dict(STUDY_TAGS), dict(STUDY_PARAMS),
                  {"config.json": {"lr": 0.1}},
                  DatasetInfo(name="synthetic_tiny", source="synthetic_tiny", digest="abc"))


def _frozen_trials() -> list[Any]:
    study = optuna.create_study(direction="maximize",
                                sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(lambda tr: tr.suggest_float("lr", 1e-3, 1.0, log=True)
                   + tr.suggest_float("wd", 0.0, 1.0), n_trials=4)
    return study.get_trials()


class TrackerContract:
    """Inherit, set ``tracker_class`` (what the product scan counts as covered) and
    define the ``supplier`` fixture."""

    tracker_class: ClassVar[type]

    def test_study_with_trials_tags_and_statuses_is_recorded(self, supplier: Supplier) -> None:
        t = supplier.tracker
        _open(t)
        t.start_trial(0, _trial_tags(0), {"lr": 0.1, "trial_seed": 7})
        t.log_metrics({"val/balanced_accuracy": 0.5, "time/elapsed_s": 1.0}, 0)
        t.log_metrics({"val/balanced_accuracy": 0.75, "time/elapsed_s": 2.0}, 1)
        t.log_metrics({"best/val_balanced_accuracy": 0.75, "time/elapsed_s": 2.0}, 0,
                      scope="study")
        t.set_tags({"scarcelab.stopped": "patience"}, scope="trial")
        t.end_trial("FINISHED")
        t.start_trial(1, _trial_tags(1), {"lr": 0.01, "trial_seed": 8})
        t.log_metrics({"val/balanced_accuracy": 0.25, "time/elapsed_s": 3.0}, 0)
        t.end_trial("FAILED", "diverged: loss is nan")
        t.set_tags({"scarcelab.n_trials": "2"})
        t.end_study("FINISHED")
        s = supplier.seen()
        assert {**s.study_tags, **STUDY_TAGS, "scarcelab.n_trials": "2"} == s.study_tags
        want = {k: param_str(v) for k, v in STUDY_PARAMS.items()}
        assert {k: s.study_params.get(k) for k in want} == want
        assert s.study_metrics["best/val_balanced_accuracy"] == [(0, 0.75)]
        assert s.study_status == "FINISHED"
        assert "config.json" in s.artifacts
        t0, t1 = sorted(s.trials, key=lambda x: x.number)
        assert t0.metrics["val/balanced_accuracy"] == [(0, 0.5), (1, 0.75)]
        assert t0.metrics["time/elapsed_s"] == [(0, 1.0), (1, 2.0)]
        assert t0.tags["scarcelab.trial"] == "0" and t0.tags["scarcelab.stopped"] == "patience"
        assert t0.params["trial_seed"] == "7" and t1.params["lr"] == "0.01"
        assert (t0.status, t1.status) == ("FINISHED", "FAILED")
        assert t1.error is not None and "diverged" in t1.error

    def test_study_context_records_the_study_and_fails_it_on_an_exception(
            self, supplier: Supplier) -> None:
        t = supplier.tracker
        try:
            with t.open_study("contract-study", dict(STUDY_TAGS), dict(STUDY_PARAMS),
                         {"config.json": {"lr": 0.1}}) as opened:
                assert opened is t
                t.log_metrics({"best/val_balanced_accuracy": 0.5}, 0, scope="study")
                raise RuntimeError("the study's body failed")
        except RuntimeError as e:
            assert "body failed" in str(e)  # re-raised, unchanged
        else:
            raise AssertionError("the exception was swallowed")
        s = supplier.seen()
        assert {**s.study_tags, **STUDY_TAGS} == s.study_tags
        assert s.study_metrics["best/val_balanced_accuracy"] == [(0, 0.5)]
        assert s.study_status == "FAILED"

    def test_metrics_batch_equals_the_rows(self, supplier: Supplier) -> None:
        t = supplier.tracker
        _open(t)
        t.start_trial(0, _trial_tags(0), {})
        t.log_metrics_batch([({"al/test_accuracy": 0.5}, 10), ({"al/test_accuracy": 0.625},
                                                                 20)])
        t.end_trial("FINISHED")
        t.log_metrics_batch([({"al/auc_mean": 0.5, "al/auc_std": 0.125}, 0)], scope="study")
        t.end_study("FINISHED")
        s = supplier.seen()
        assert s.trials[0].metrics["al/test_accuracy"] == [(10, 0.5), (20, 0.625)]
        assert s.study_metrics["al/auc_mean"] == [(0, 0.5)]
        assert s.study_metrics["al/auc_std"] == [(0, 0.125)]

    def test_checkpoint_image_evaluation_search_and_model_reach_the_store(
            self, supplier: Supplier) -> None:
        t = supplier.tracker
        _open(t)
        t.start_trial(0, _trial_tags(0), {})
        t.log_metrics({"val/balanced_accuracy": 0.5, "time/elapsed_s": 1.0}, 0)
        t.end_trial("FINISHED")
        t.log_checkpoint({"state": {"w": torch.zeros(2)}, "val_balanced_accuracy": 0.5,
                          "trial": 0, "hp": {"lr": 0.1}})
        t.log_image(np.zeros((4, 5, 3), dtype=np.uint8), "overlays/tile0.png")
        y = np.array([0, 1, 0, 1, 1, 0])
        proba = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7], [0.5, 0.5],
                          [0.8, 0.2]])
        t.log_evaluation(y, proba, ["malignant", "benign"], positive_class=0)
        t.log_search(_frozen_trials())
        if supplier.checks_model:
            t.log_model(torch.nn.Linear(2, 2), torch.rand(1, 2))
        t.end_study("FINISHED")
        s = supplier.seen()
        assert s.checkpoints == ["best.pt"]
        assert s.images == ["overlays/tile0.png"]
        assert s.evaluations == [("test", 0)]
        assert s.searched
        assert s.model == supplier.checks_model

    def test_resume_finds_a_killed_study_and_closes_its_open_trials(
            self, supplier: Supplier) -> None:
        expected = supplier.kill_study(KEY)
        t = supplier.tracker
        state = t.resume_state(KEY)
        if not supplier.persistent:
            assert expected is None and state is None
            t.close_orphan_trials({0})  # nothing to close: must not raise
            return
        assert state is not None and expected is not None
        assert (state.optuna_study, state.elapsed_s, state.global_epoch) == (
            expected.optuna_study, expected.elapsed_s, expected.global_epoch)
        assert state.best_checkpoint is None  # the killed study had not uploaded one
        assert t.resume_state("study-no-such-key") is None
        t.resume_state(KEY)
        t.close_orphan_trials({0})  # Optuna holds trial 0 as complete, trial 1 not
        assert supplier.orphan_statuses() == {0: "FINISHED", 1: "FAILED"}

    def test_trials_of_a_dead_process_are_marked_failed(self, supplier: Supplier) -> None:
        supplier.kill_study(KEY)
        t = supplier.tracker
        t.mark_trials_failed(KEY, [1], "the process running this trial died")
        if not supplier.persistent:
            return
        assert supplier.orphan_statuses() == {0: "RUNNING", 1: "FAILED"}
