"""How protocols report: one ``Tracker`` interface, implemented with MLflow in ``tracking/``.

The core never imports mlflow; its unit tests use :class:`InMemoryTracker`. A study is a
parent record holding trials; metrics go to the trial (per-epoch curves) or to the study
(best-so-far across all trials, which is what a budgeted search is judged on).

Wrappers (a tracker that adds tags, shows progress, links runs to a parent) derive from
:class:`DelegatingTracker`, which forwards *every* method of the interface, so a wrapper
overrides only what it changes. A wrapper written against :class:`Tracker` directly
inherits the base class's no-op optional methods and silently drops them — how the
contamination sweep's child studies once lost their figures and their resume;
``tests/core/test_tracker_contract.py`` runs one contract over every Tracker
class of the product code and fails on a new one it does not cover.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the interface only names nn.Module; importing torch costs seconds
    from torch import nn


@dataclass
class DatasetInfo:
    """What ``mlflow.log_input`` needs to identify the data without shipping it."""

    name: str
    source: str
    digest: str
    context: str = "train"


@dataclass
class ResumeState:
    """What a killed study had achieved, as its tracker recorded it."""

    optuna_study: str  # the search's study name in the shared Optuna storage
    elapsed_s: float  # wall clock already spent (counts against budget_minutes)
    global_epoch: int  # next step of the study-level best/* metrics
    best_checkpoint: dict[str, Any] | None  # best-so-far checkpoint, from the artifact store
    same_record: bool = True  # False: a new record continues it (copy the checkpoint over)


class Tracker(ABC):
    """Receives everything a study produces. Implementations must not raise on metric
    logging failures that a retry can fix; losing a metric is worse than a delay."""

    @abstractmethod
    def start_study(
        self,
        name: str,
        tags: dict[str, str],
        params: dict[str, Any],
        artifacts: dict[str, Any],
        dataset: DatasetInfo | None = None,
    ) -> None:
        """Open the study record; ``artifacts`` maps a file name to a JSON-able object."""

    @abstractmethod
    def start_trial(self, number: int, tags: dict[str, str], params: dict[str, Any]) -> None: ...

    @abstractmethod
    def log_metrics(self, metrics: dict[str, float], step: int, scope: str = "trial") -> None:
        """``scope`` is ``"trial"`` (the open trial) or ``"study"``."""

    @abstractmethod
    def log_checkpoint(self, checkpoint: dict[str, Any], name: str = "best.pt") -> None:
        """Store the study's best-so-far checkpoint under ``checkpoints/<name>``."""

    @abstractmethod
    def end_trial(self, status: str, error: str | None = None) -> None:
        """``status``: ``FINISHED`` or ``FAILED`` (then ``error`` says why)."""

    @abstractmethod
    def log_model(self, model: nn.Module, example: Any) -> None:
        """Log the final best model (a module mapping [0, 1] images to logits)."""

    @abstractmethod
    def end_study(self, status: str) -> None: ...

    @contextmanager
    def open_study(self, name: str, tags: dict[str, str], params: dict[str, Any],
                   artifacts: dict[str, Any], dataset: DatasetInfo | None = None
                   ) -> Iterator[Tracker]:
        """``with tracker.open_study(...):`` opens the study record and closes it
        FINISHED, or FAILED when anything escapes the block — ``KeyboardInterrupt``
        included, which every protocol has always recorded as FAILED. (Not ``study``:
        :class:`InMemoryTracker` keeps its study record under that name.) The record is
        closed whatever happens, and what escaped is re-raised. Built on :meth:`start_study` and
        :meth:`end_study`, so a wrapper that overrides those is honoured."""
        self.start_study(name, tags, params, artifacts, dataset)
        status = "FINISHED"
        try:
            yield self
        except BaseException:
            status = "FAILED"
            raise
        finally:
            self.end_study(status)

    def set_tags(self, tags: dict[str, str], scope: str = "study") -> None:  # noqa: B027
        """Optional: add tags after the fact (e.g. the resolved number of trials)."""

    def log_evaluation(self, y_true: Any, proba: Any, class_names: list[str],  # noqa: B027
                       split: str = "test", positive_class: int | None = None) -> None:
        """Optional: the selected checkpoint's predicted probabilities on ``split``, for
        figures (confusion matrix, ROC curve) on the study record. ``positive_class``: the
        class a binary task detects (the disease; ``scarcelab.data.bundle``), whose ROC
        curve the figure draws; None = class 1."""

    def log_search(self, trials: list[Any]) -> None:  # noqa: B027
        """Optional: the search's finished trials (Optuna ``FrozenTrial``s), for figures of
        the search (parallel coordinates, hyperparameter importance)."""

    def resume_state(self, study_key: str) -> ResumeState | None:
        """Optional: find the unfinished study ``study_key`` of a dead process and reattach
        to it (the next ``start_study`` continues that record). Trackers that cannot
        persist a study return None: the search then starts afresh."""
        return None

    def mark_trials_failed(self, study_key: str, numbers: list[int], reason: str) -> None:  # noqa: B027
        """Optional: close the records of trials a dead process left running."""

    def close_orphan_trials(self, completed: set[int]) -> None:  # noqa: B027
        """Optional, after :meth:`resume_state` reattached: close the trial records the dead
        process left open — FINISHED for trial numbers the study store holds as complete
        (the process died between the store's update and the record's), FAILED for the
        rest. Two stores cannot be updated atomically; this makes them agree again."""

    def log_image(self, image: Any, name: str) -> None:  # noqa: B027
        """Optional: store an (H, W, 3) uint8 image as the PNG artifact ``name`` (e.g.
        ``overlays/tile.png``). Trackers without an artifact store drop it."""

    def log_metrics_batch(self, rows: list[tuple[dict[str, float], int]],
                          scope: str = "trial") -> None:
        """Many ``(metrics, step)`` rows at once (a whole AL curve); stores that can batch
        override this to send one request instead of one per step."""
        for metrics, step in rows:
            self.log_metrics(metrics, step, scope)


class DelegatingTracker(Tracker):
    """A tracker that passes every call on to ``inner``: the base of every wrapper.

    Each method of :class:`Tracker` — the optional ones included — is forwarded
    explicitly, with its full signature, so a wrapper overrides only what it changes and
    nothing reaches the base class's no-op defaults by accident. Attributes outside the
    interface (``study_run_id``, ``spool_left``, ``attach_study``, …) are looked up on
    ``inner`` too, so code that asks a wrapped tracker for them keeps working however
    many wrappers there are. ``tests/core/test_tracker_contract.py`` checks that this class
    defines every public method of :class:`Tracker`."""

    def __init__(self, inner: Tracker) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        # only reached for names the wrapper itself does not have
        inner = self.__dict__.get("inner")
        if inner is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(inner, name)

    def start_study(self, name: str, tags: dict[str, str], params: dict[str, Any],
                    artifacts: dict[str, Any], dataset: DatasetInfo | None = None) -> None:
        self.inner.start_study(name, tags, params, artifacts, dataset)

    def start_trial(self, number: int, tags: dict[str, str], params: dict[str, Any]) -> None:
        self.inner.start_trial(number, tags, params)

    def log_metrics(self, metrics: dict[str, float], step: int, scope: str = "trial") -> None:
        self.inner.log_metrics(metrics, step, scope)

    def log_metrics_batch(self, rows: list[tuple[dict[str, float], int]],
                          scope: str = "trial") -> None:
        self.inner.log_metrics_batch(rows, scope)

    def log_checkpoint(self, checkpoint: dict[str, Any], name: str = "best.pt") -> None:
        self.inner.log_checkpoint(checkpoint, name)

    def end_trial(self, status: str, error: str | None = None) -> None:
        self.inner.end_trial(status, error)

    def log_model(self, model: nn.Module, example: Any) -> None:
        self.inner.log_model(model, example)

    def end_study(self, status: str) -> None:
        self.inner.end_study(status)

    # not forwarded to ``inner.open_study``: that would call the inner tracker's
    # start_study and end_study, past this wrapper's overrides of them
    open_study = Tracker.open_study

    def set_tags(self, tags: dict[str, str], scope: str = "study") -> None:
        self.inner.set_tags(tags, scope)

    def log_evaluation(self, y_true: Any, proba: Any, class_names: list[str],
                       split: str = "test", positive_class: int | None = None) -> None:
        self.inner.log_evaluation(y_true, proba, class_names, split, positive_class)

    def log_search(self, trials: list[Any]) -> None:
        self.inner.log_search(trials)

    def resume_state(self, study_key: str) -> ResumeState | None:
        return self.inner.resume_state(study_key)

    def mark_trials_failed(self, study_key: str, numbers: list[int], reason: str) -> None:
        self.inner.mark_trials_failed(study_key, numbers, reason)

    def close_orphan_trials(self, completed: set[int]) -> None:
        self.inner.close_orphan_trials(completed)

    def log_image(self, image: Any, name: str) -> None:
        self.inner.log_image(image, name)


@dataclass
class _Record:
    name: str
    tags: dict[str, str]
    params: dict[str, Any]
    metrics: list[tuple[str, float, int]] = field(default_factory=list)
    status: str = "RUNNING"
    error: str | None = None

    def history(self, key: str) -> list[tuple[int, float]]:
        return [(s, v) for k, v, s in self.metrics if k == key]

    def last(self, key: str) -> float | None:
        h = self.history(key)
        return h[-1][1] if h else None


class InMemoryTracker(Tracker):
    """Keeps everything in lists: the reference implementation for tests. It records the
    optional calls too (evaluations, searches, images), so that a test can see that a
    protocol — or a wrapper in between — did not drop them; it cannot persist a study
    across processes, so :meth:`resume_state` stays None."""

    def __init__(self) -> None:
        self.study: _Record | None = None
        self.trials: list[_Record] = []
        self.artifacts: dict[str, Any] = {}
        self.checkpoints: list[dict[str, Any]] = []
        self.model: nn.Module | None = None
        self.dataset: DatasetInfo | None = None
        self.images: dict[str, Any] = {}
        # (split, class names, positive class, number of samples) per log_evaluation
        self.evaluations: list[tuple[str, list[str], int | None, int]] = []
        self.searches: list[list[Any]] = []
        self._open_trial: _Record | None = None

    def start_study(self, name: str, tags: dict[str, str], params: dict[str, Any],
                    artifacts: dict[str, Any], dataset: DatasetInfo | None = None) -> None:
        self.study = _Record(name, dict(tags), dict(params))
        self.artifacts.update(artifacts)
        self.dataset = dataset

    def start_trial(self, number: int, tags: dict[str, str], params: dict[str, Any]) -> None:
        if self._open_trial is not None:
            raise RuntimeError("start_trial while a trial is open")
        self._open_trial = _Record(f"trial-{number}", dict(tags), dict(params))
        self.trials.append(self._open_trial)

    def log_metrics(self, metrics: dict[str, float], step: int, scope: str = "trial") -> None:
        rec = self._open_trial if scope == "trial" else self.study
        if rec is None:
            raise RuntimeError(f"log_metrics({scope}) with no open {scope}")
        rec.metrics += [(k, float(v), int(step)) for k, v in metrics.items()]

    def log_checkpoint(self, checkpoint: dict[str, Any], name: str = "best.pt") -> None:
        self.checkpoints.append(checkpoint)

    def end_trial(self, status: str, error: str | None = None) -> None:
        assert self._open_trial is not None
        self._open_trial.status, self._open_trial.error = status, error
        self._open_trial = None

    def log_model(self, model: nn.Module, example: Any) -> None:
        self.model = model

    def log_image(self, image: Any, name: str) -> None:
        self.images[name] = image

    def log_evaluation(self, y_true: Any, proba: Any, class_names: list[str],
                       split: str = "test", positive_class: int | None = None) -> None:
        self.evaluations.append((split, list(class_names), positive_class, len(y_true)))

    def log_search(self, trials: list[Any]) -> None:
        self.searches.append(list(trials))

    def end_study(self, status: str) -> None:
        assert self.study is not None
        self.study.status = status

    def set_tags(self, tags: dict[str, str], scope: str = "study") -> None:
        rec = self.study if scope == "study" else self._open_trial
        if rec is not None:
            rec.tags.update(tags)
