"""One trial lifecycle for every protocol: run a trial function, map what it raised to the
trial's outcome, and decide what must stop the study.

Modelled on Optuna's ``optuna/study/_optimize.py::_run_trial`` (optuna 5.0.0, lines
186-264): ``TrialPruned`` makes a PRUNED trial, any other exception a FAILED one whose
error is kept, and only a failure the caller did not choose to tolerate is re-raised once
the trial is recorded; a non-finite objective is a failure too (Optuna's
``study/_tell.py::_check_values_are_feasible``, line 68). Our own policy on top, the one
the search has always had:

- :class:`~scarcelab.errors.TrialFailed` (a diverged loss, a bad configuration the
  method itself rejects) is an expected outcome of a search: the trial fails, the
  search goes on, and it neither counts nor resets the run of unexpected errors;
- any other ``Exception`` is a bug until proven otherwise: recorded, then re-raised
  once :data:`MAX_CONSECUTIVE_ERRORS` of them come in a row (a bad configuration
  raises once; a bug raises every time);
- ``fatal`` exceptions (a :class:`~scarcelab.errors.ConfigError`, ^C) end the trial as
  FAILED and are re-raised at once: no other configuration can fix them;
- any other ``BaseException`` (``SystemExit``, ``GeneratorExit``) passes through
  untouched, as it always has: the study record's ``with tracker.open_study(...)`` closes
  it as FAILED.

A COMPLETE trial is left open, since only its protocol knows whether it counts; the
protocol then ends it through the runner, which is the one place a trial record is closed
on success or cut:

- :meth:`TrialRunner.complete`: the trial counts. The study's storage is told first (what
  the search decides on next), then the record gets its final metrics and tags and is
  closed FINISHED;
- :meth:`TrialRunner.cut`: the trial ran but must not count (the budget ended it before
  its first epoch, or before the epochs every other trial had): the storage is told
  (pruned or failed, the caller's choice), tags, the record closed KILLED with the reason.

Every protocol's trials go through here: the budgeted search (``protocols/search.py``),
Tune-It's trials and final retrains (``protocols/tune.py``) and the active-learning
repetitions (``active/loop.py``). tests/core/test_trial_runner.py checks each path.
"""

from __future__ import annotations

import logging
import math
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from scarcelab.errors import ConfigError, TrialFailed
from scarcelab.tracker import Tracker

log = logging.getLogger("scarcelab")

#: unexpected errors in a row that abort a search (they are bugs, not configurations)
MAX_CONSECUTIVE_ERRORS = 3
#: what ends the study at once: no other configuration can fix it
FATAL: tuple[type[BaseException], ...] = (ConfigError, KeyboardInterrupt)

R = TypeVar("R")

COMPLETE, PRUNED, FAILED = "complete", "pruned", "failed"


def trial_seed(seed: int, number: int) -> int:
    """The seed of trial ``number`` of a study seeded ``seed``: model init, batches and
    the probe's draws. A prime stride keeps the trials of neighbouring study seeds apart
    (seed 0's trial 100_003 is the only collision with seed 1's trial 0)."""
    return seed * 100_003 + number


class TrialPruned(Exception):  # noqa: N818 - Optuna's name for the same signal
    """Raised from a trial (its pruning callback) when the pruner stops it after
    ``epoch`` epochs; the runner records the trial as pruned (tracker status KILLED)."""

    def __init__(self, epoch: int, message: str | None = None) -> None:
        super().__init__(message or f"pruned after epoch {epoch}")
        self.epoch = epoch


@dataclass
class TrialOutcome(Generic[R]):
    """What one trial came to. ``value``: the trial function's return (COMPLETE only);
    ``error``: one line saying why it failed or was pruned."""

    state: str
    value: R | None = None
    error: str | None = None


class TrialRunner:
    """Runs the trials of one study on ``tracker`` and keeps the count of unexpected
    errors in a row across them. The trial record is opened by the caller
    (``tracker.start_trial``); the runner closes it on every outcome but COMPLETE."""

    def __init__(self, tracker: Tracker, *, fatal: tuple[type[BaseException], ...] = FATAL,
                 max_consecutive_errors: int | None = MAX_CONSECUTIVE_ERRORS,
                 error_text: Callable[[BaseException], str] | None = None) -> None:
        """``max_consecutive_errors=None``: unexpected errors never stop the study (an
        active-learning sweep's repetitions are independent). ``error_text(exc)``: what
        the trial record keeps of a fatal or unexpected error; None = its traceback."""
        if max_consecutive_errors is not None and max_consecutive_errors < 1:
            raise ValueError(f"max_consecutive_errors must be >= 1 or None, got "
                             f"{max_consecutive_errors}")
        self.tracker = tracker
        self.fatal = fatal
        self.max_consecutive_errors = max_consecutive_errors
        self.error_text = error_text
        self.errors_in_row = 0

    def _text(self, e: BaseException, limit: int) -> str:
        return traceback.format_exc(limit=limit) if self.error_text is None \
            else self.error_text(e)

    def run(self, number: int, fn: Callable[[], R], *,
            on_fail: Callable[[], None] | None = None,
            on_prune: Callable[[TrialPruned], None] | None = None,
            fail_fatal: bool = True,
            objective: Callable[[R], float] | None = None) -> TrialOutcome[R]:
        """Run trial ``number``'s ``fn``. ``on_fail`` records a failure in the study's
        storage before the trial record is closed (``fail_fatal=False``: not for a fatal
        one); ``on_prune`` records a pruning (metrics, tags) before it is closed as
        KILLED. ``objective(value)``, if given, must be finite, or the trial fails."""
        try:
            value = fn()
        except self.fatal as e:  # first: a caller may make any outcome fatal
            if fail_fatal and on_fail is not None:
                on_fail()
            self.tracker.end_trial("FAILED", self._text(e, limit=3))
            raise
        except TrialPruned as p:
            self.errors_in_row = 0
            if on_prune is not None:
                on_prune(p)
            self.tracker.end_trial("KILLED", str(p))
            return TrialOutcome(PRUNED, error=str(p))
        except TrialFailed as e:
            return self._failed(number, str(e), on_fail)
        except Exception as e:  # noqa: BLE001 - recorded, then re-raised if systematic
            if on_fail is not None:
                on_fail()
            self.tracker.end_trial("FAILED", self._text(e, limit=5))
            self.errors_in_row += 1
            log.error("trial %d raised %s: %s", number, type(e).__name__, e)
            limit = self.max_consecutive_errors
            if limit is not None and self.errors_in_row >= limit:
                raise
            return TrialOutcome(FAILED, error=f"{type(e).__name__}: {e}")
        if objective is not None:
            score = objective(value)
            if not math.isfinite(score):
                return self._failed(number, f"non-finite objective ({score})", on_fail)
        self.errors_in_row = 0
        return TrialOutcome(COMPLETE, value=value)

    def _failed(self, number: int, error: str, on_fail: Callable[[], None] | None
                ) -> TrialOutcome[R]:
        if on_fail is not None:
            on_fail()
        self.tracker.end_trial("FAILED", error)
        log.warning("trial %d failed: %s", number, error)
        return TrialOutcome(FAILED, error=error)

    def complete(self, *, tell: Callable[[], None] | None = None,
                 metrics: Mapping[str, float] | None = None, step: int = 0,
                 rows: Sequence[tuple[dict[str, float], int]] = (),
                 tags: Mapping[str, str] | None = None) -> None:
        """End a COMPLETE trial that counts: ``tell()`` records its value in the study's
        storage, then ``metrics`` (at ``step``) and ``rows`` (``(metrics, step)`` pairs,
        sent as one batch) and ``tags`` go to the trial record, which is closed FINISHED.
        The storage comes first: a process killed before the record closes leaves a trial
        the search already counts and the reaper closes."""
        if tell is not None:
            tell()
        if metrics:
            self.tracker.log_metrics(dict(metrics), step, scope="trial")
        if rows:
            self.tracker.log_metrics_batch(list(rows), scope="trial")
        if tags:
            self.tracker.set_tags(dict(tags), scope="trial")
        self.tracker.end_trial("FINISHED")

    def cut(self, reason: str, *, tell: Callable[[], None] | None = None,
            tags: Mapping[str, str] | None = None) -> None:
        """End a COMPLETE trial that must not count (``reason``: why, kept on the record):
        ``tell()`` records it in the study's storage as the caller decides (pruned, or
        failed so that it is never the best), ``tags`` go to the record, closed KILLED."""
        if tell is not None:
            tell()
        if tags:
            self.tracker.set_tags(dict(tags), scope="trial")
        self.tracker.end_trial("KILLED", reason)
        log.warning("trial cut: %s", reason)
