"""The one schedule horizon every ramp and the learning rate follow (issue 41).

Every schedule of a trial — the per-step cosine learning rate (``train.make_optimizer``),
the unlabeled-weight ramps of MixMatch, Mean Teacher, Pseudo-Label and DS3L
(``methods._parts.linear_rampup`` / ``sigmoid_rampup``), the EMA momentum schedules of
BYOL and DINO, SwAV's prototype freeze — reads one number, the trial's *progress* in
[0, 1]. :class:`Horizon` is where that number comes from, so that re-planning a trial's
length moves all of them together; no method keeps a step count of its own.

Two ways to plan (``TrainConfig.schedule_horizon``, ``--schedule-horizon``):

- ``epochs`` (paper-faithful): progress is ``step / (steps_per_epoch · max_epochs)``, the
  schedules of the reference implementations, planned over the whole training whether or
  not a time budget lets the trial get there.
- ``budget``: the same plan, shortened to the optimiser steps the trial's share of the
  time budget will actually buy, estimated from the trial's own measured cost per step
  (:func:`steps_that_fit`) and re-planned as it goes (:meth:`Horizon.replan`), so that
  progress reaches 1.0 when the budget ends the trial: the ramps reach their full weight
  and the learning rate its final value. Never longer than the epoch plan.
"""

from __future__ import annotations

import math
import sys

#: the values of ``TrainConfig.schedule_horizon`` / ``--schedule-horizon``
SCHEDULE_HORIZONS = ("epochs", "budget")


class Horizon:
    """A trial's planned length in optimiser steps, and the progress of any step in it.

    The plan starts as ``total_steps`` (progress ``step / total_steps``, the schedules'
    classic form). :meth:`replan` moves the end without moving the progress already
    reached: from the step it is called at, progress grows linearly from its value there
    to 1.0 at the new end. Progress is therefore continuous and never decreases (a ramp
    never drops back, the learning rate never jumps up), however often the end moves.
    """

    def __init__(self, total_steps: int) -> None:
        self.total_steps = max(1, int(total_steps))
        self._from_step = 0  # where the current plan starts ...
        self._from_fraction = 0.0  # ... and the progress it starts from

    def fraction(self, step: int) -> float:
        """Progress of ``step`` (the number of optimiser steps done before it), in [0, 1]."""
        span = self.total_steps - self._from_step
        if span <= 0 or step >= self.total_steps:  # the end is exactly 1.0, not 1 - 1e-16
            return 1.0
        f = self._from_fraction + (1.0 - self._from_fraction) * (step - self._from_step) / span
        return min(1.0, max(0.0, f))

    def replan(self, step: int, total_steps: int) -> None:
        """End the plan at ``total_steps`` (at least ``step``: the steps done stay done),
        keeping the progress of ``step``. The same end again changes nothing."""
        total_steps = max(int(step), int(total_steps))
        if total_steps == self.total_steps:
            return
        self._from_fraction = self.fraction(step)
        self._from_step = step
        self.total_steps = total_steps

    def finished(self, step: int) -> bool:
        return step >= self.total_steps


def cosine_factor(fraction: float) -> float:
    """The learning rate's multiplier at ``fraction`` of the plan: ``(1 + cos(π·f)) / 2``,
    from 1 at the start to 0 at the end (SSL-vs-SSL §4's per-step cosine decay)."""
    f = min(1.0, max(0.0, fraction))
    return 0.5 * (1.0 + math.cos(math.pi * f))


def steps_that_fit(seconds_left: float, step_s: float, eval_s: float, window: int = 0,
                   in_window: int = 0, window_cost_s: float | None = None) -> int:
    """Optimiser steps the epoch loop will still start with ``seconds_left`` of its budget.

    The loop starts a step only while more than one step and one evaluation are left
    (``train._EpochLoop._steps``): with no evaluation in between, the steps started are
    those ``k = 0, 1, ...`` with ``seconds_left − k·step_s > step_s + eval_s``, i.e.
    ``ceil((seconds_left − eval_s) / step_s) − 1`` of them (10 s left, 1 s a step,
    evaluations free: 9). With ``window`` > 0 an evaluation follows every ``window`` steps
    (an epoch, or ``eval_every_steps`` rounded up to epochs), ``in_window`` of the current
    one are done, and each costs ``window_cost_s`` (the evaluation with the logging and
    checkpointing around it; default ``eval_s``): whole windows are counted while one more
    fits, then the steps of the last, partial one.
    """
    if step_s <= 0.0 or not math.isfinite(step_s):
        raise ValueError(f"step_s must be a positive number of seconds, got {step_s}")
    if seconds_left == math.inf:  # no deadline: as many as the epoch plan asks
        return sys.maxsize
    if not seconds_left > 0.0:  # none left (or NaN)
        return 0

    def partial(t: float) -> int:  # steps started in t seconds without an evaluation
        return max(0, math.ceil((t - eval_s) / step_s - 1e-9) - 1)

    fits = partial(seconds_left)
    if window <= 0 or fits < window - in_window:  # ends before the next evaluation
        return fits
    over = eval_s if window_cost_s is None else max(window_cost_s, 0.0)
    n = window - in_window  # the current window's steps, then its evaluation
    t = seconds_left - n * step_s - over
    # window j (0-based) of the rest is whole if what is left at its start exceeds
    # window·step_s + eval_s (its last step starts); each whole one costs `per_window`
    per_window = window * step_s + over
    whole = max(0, math.ceil((t - window * step_s - eval_s) / per_window - 1e-9))
    t -= whole * per_window
    return n + whole * window + min(window - 1, partial(t))
