"""The one trial runner (``scarcelab.trials``) on hand-written trial functions and
the in-memory tracker: every outcome branch, the run of unexpected errors, what re-raises;
and ``Tracker.open_study``'s statuses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from scarcelab.errors import ConfigError, TrialFailed
from scarcelab.tracker import DelegatingTracker, InMemoryTracker
from scarcelab.trials import (
    COMPLETE,
    FAILED,
    MAX_CONSECUTIVE_ERRORS,
    PRUNED,
    TrialOutcome,
    TrialPruned,
    TrialRunner,
    trial_seed,
)


def _raise(e: BaseException) -> Callable[[], Any]:
    def fn() -> Any:
        raise e
    return fn


class _Storage:
    """What a study store would be told: one entry per on_fail / on_prune call."""

    def __init__(self) -> None:
        self.told: list[str] = []

    def fail(self) -> None:
        self.told.append("fail")

    def prune(self, p: TrialPruned) -> None:
        self.told.append(f"prune@{p.epoch}")


def _trial(t: InMemoryTracker, runner: TrialRunner, number: int, fn: Callable[[], Any],
           store: _Storage | None = None, **kw: Any) -> TrialOutcome[Any]:
    t.start_trial(number, {}, {})
    store = store or _Storage()
    return runner.run(number, fn, on_fail=store.fail, on_prune=store.prune, **kw)


@pytest.fixture
def t() -> InMemoryTracker:
    tracker = InMemoryTracker()
    tracker.start_study("s", {}, {}, {})
    return tracker


def test_trial_seed_is_the_studys_stride() -> None:
    assert trial_seed(0, 5) == 5
    assert trial_seed(2, 3) == 2 * 100_003 + 3 == 200_009
    assert len({trial_seed(s, n) for s in range(3) for n in range(50)}) == 150


def test_a_completed_trial_returns_its_value_and_stays_open(t: InMemoryTracker) -> None:
    runner = TrialRunner(t)
    runner.errors_in_row = 2
    out = _trial(t, runner, 0, lambda: 0.75, objective=float)
    assert (out.state, out.value, out.error) == (COMPLETE, 0.75, None)
    assert t.trials[0].status == "RUNNING"  # the protocol logs its result and ends it
    assert runner.errors_in_row == 0


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_objective_fails_the_trial(t: InMemoryTracker, bad: float) -> None:
    store = _Storage()
    runner = TrialRunner(t)
    runner.errors_in_row = 1
    out = _trial(t, runner, 0, lambda: {"v": bad}, store, objective=lambda r: r["v"])
    assert out.state == FAILED and out.value is None and "non-finite" in str(out.error)
    assert t.trials[0].status == "FAILED" and "non-finite" in str(t.trials[0].error)
    assert store.told == ["fail"]
    assert runner.errors_in_row == 1  # an expected failure: neither counted nor reset


def test_a_pruned_trial_is_recorded_killed_and_resets_the_error_run(
        t: InMemoryTracker) -> None:
    store = _Storage()
    runner = TrialRunner(t)
    runner.errors_in_row = 2
    out = _trial(t, runner, 0, _raise(TrialPruned(3, "pruned by ASHA after epoch 3")), store)
    assert out.state == PRUNED and out.error == "pruned by ASHA after epoch 3"
    assert (t.trials[0].status, t.trials[0].error) == ("KILLED", "pruned by ASHA after epoch 3")
    assert store.told == ["prune@3"] and runner.errors_in_row == 0


def test_a_trial_failed_is_expected_and_does_not_touch_the_error_run(
        t: InMemoryTracker) -> None:
    store = _Storage()
    runner = TrialRunner(t)
    runner.errors_in_row = 2
    out = _trial(t, runner, 0, _raise(TrialFailed("non-finite loss (nan)")), store)
    assert (out.state, out.error) == (FAILED, "non-finite loss (nan)")
    assert (t.trials[0].status, t.trials[0].error) == ("FAILED", "non-finite loss (nan)")
    assert store.told == ["fail"] and runner.errors_in_row == 2


def test_unexpected_errors_are_recorded_until_too_many_come_in_a_row(
        t: InMemoryTracker) -> None:
    assert MAX_CONSECUTIVE_ERRORS == 3
    store = _Storage()
    runner = TrialRunner(t)
    boom = RuntimeError("boom")
    for n in range(MAX_CONSECUTIVE_ERRORS - 1):
        out = _trial(t, runner, n, _raise(boom), store)
        assert (out.state, out.error) == (FAILED, "RuntimeError: boom")
    with pytest.raises(RuntimeError, match="boom"):
        _trial(t, runner, 2, _raise(boom), store)
    assert [r.status for r in t.trials] == ["FAILED"] * 3
    assert all("RuntimeError: boom" in str(r.error) for r in t.trials)  # the traceback
    assert store.told == ["fail"] * 3


def test_only_a_completed_or_pruned_trial_breaks_the_run_of_errors(
        t: InMemoryTracker) -> None:
    runner = TrialRunner(t)
    boom = _raise(ValueError("x"))
    plan = [boom, boom, lambda: 1.0, boom, boom, _raise(TrialPruned(1)), boom, boom,
            _raise(TrialFailed("diverged"))]
    for n, fn in enumerate(plan):
        if _trial(t, runner, n, fn).state == COMPLETE:  # never three errors in a row
            t.end_trial("FINISHED")
    assert runner.errors_in_row == 2
    with pytest.raises(ValueError):  # the TrialFailed in between did not reset it
        _trial(t, runner, len(plan), boom)


def test_the_limit_is_the_runners(t: InMemoryTracker) -> None:
    runner = TrialRunner(t, max_consecutive_errors=1)
    with pytest.raises(ZeroDivisionError):
        _trial(t, runner, 0, lambda: 1 / 0)
    with pytest.raises(ValueError, match="max_consecutive_errors"):
        TrialRunner(t, max_consecutive_errors=0)


def test_no_limit_and_a_short_error_text(t: InMemoryTracker) -> None:
    """An AL sweep's policy: repetitions never stop the sweep; records keep one line."""
    runner = TrialRunner(t, fatal=(ConfigError,), max_consecutive_errors=None,
                         error_text=lambda e: f"{type(e).__name__}: {e}")
    for n in range(MAX_CONSECUTIVE_ERRORS + 2):
        assert _trial(t, runner, n, _raise(OSError("disk"))).state == FAILED
    assert runner.errors_in_row == MAX_CONSECUTIVE_ERRORS + 2
    with pytest.raises(ConfigError):
        _trial(t, runner, 99, _raise(ConfigError("bad")))
    assert [r.error for r in t.trials[-2:]] == ["OSError: disk", "ConfigError: bad"]


@pytest.mark.parametrize("fail_fatal", [True, False])
@pytest.mark.parametrize("error", [ConfigError("bad setting"), KeyboardInterrupt()])
def test_fatal_errors_fail_the_trial_and_re_raise_at_once(
        t: InMemoryTracker, error: BaseException, fail_fatal: bool) -> None:
    store = _Storage()
    runner = TrialRunner(t)
    with pytest.raises(type(error)):
        _trial(t, runner, 0, _raise(error), store, fail_fatal=fail_fatal)
    assert t.trials[0].status == "FAILED" and type(error).__name__ in str(t.trials[0].error)
    assert store.told == (["fail"] if fail_fatal else [])
    assert runner.errors_in_row == 0  # not counted: it re-raised anyway


def test_other_base_exceptions_pass_through_untouched(t: InMemoryTracker) -> None:
    store = _Storage()
    with pytest.raises(SystemExit):
        _trial(t, TrialRunner(t), 0, _raise(SystemExit(2)), store)
    assert t.trials[0].status == "RUNNING" and store.told == []  # the study closes it


def test_everything_fatal_re_raises_even_an_expected_failure(t: InMemoryTracker) -> None:
    runner = TrialRunner(t, fatal=(BaseException,))  # the final retrains: nothing tolerated
    with pytest.raises(TrialFailed):
        _trial(t, runner, 0, _raise(TrialFailed("non-finite test predictions")))
    assert t.trials[0].status == "FAILED"
    assert "non-finite test predictions" in str(t.trials[0].error)


# -- Tracker.open_study -------------------------------------------------------------------


def test_study_context_finishes_the_record() -> None:
    t = InMemoryTracker()
    with t.open_study("s", {"scarcelab.role": "study"}, {"seed": 0}, {"config.json": {}}) as s:
        assert s is t and t.study is not None and t.study.status == "RUNNING"
    assert t.study.status == "FINISHED" and t.study.tags == {"scarcelab.role": "study"}
    assert t.artifacts == {"config.json": {}}


@pytest.mark.parametrize("error", [RuntimeError("x"), KeyboardInterrupt(), SystemExit(1)])
def test_study_context_fails_the_record_and_re_raises(error: BaseException) -> None:
    t = InMemoryTracker()
    with pytest.raises(type(error)), t.open_study("s", {}, {}, {}):
        raise error
    assert t.study is not None and t.study.status == "FAILED"


def test_study_context_goes_through_a_wrappers_overrides() -> None:
    class Tagging(DelegatingTracker):
        def start_study(self, name: str, tags: dict[str, str], params: dict[str, Any],
                        artifacts: dict[str, Any], dataset: Any = None) -> None:
            super().start_study(name, {**tags, "extra": "1"}, params, artifacts, dataset)

        def end_study(self, status: str) -> None:
            super().end_study(f"{status}!")

    inner = InMemoryTracker()
    with Tagging(inner).open_study("s", {"a": "b"}, {}, {}):
        pass
    assert inner.study is not None
    assert inner.study.tags == {"a": "b", "extra": "1"} and inner.study.status == "FINISHED!"


# --- the success and cut paths: every protocol ends its trials here (issue 44 item 4) ---


class _Order(InMemoryTracker):
    """An in-memory tracker that also keeps the order of the calls that end a trial."""

    def __init__(self, calls: list[str]) -> None:
        super().__init__()
        self.calls = calls

    def log_metrics(self, metrics: dict[str, float], step: int, scope: str = "trial") -> None:
        self.calls.append(f"metrics@{step}:{scope}:{','.join(sorted(metrics))}")
        super().log_metrics(metrics, step, scope)

    def set_tags(self, tags: dict[str, str], scope: str = "study") -> None:
        self.calls.append(f"tags:{scope}:{','.join(sorted(tags))}")
        super().set_tags(tags, scope)

    def end_trial(self, status: str, error: str | None = None) -> None:
        self.calls.append(f"end:{status}")
        super().end_trial(status, error)


def _ordered() -> tuple[_Order, list[str]]:
    calls: list[str] = []
    tracker = _Order(calls)
    tracker.start_study("s", {}, {}, {})
    return tracker, calls


def test_complete_tells_the_storage_first_then_records_and_finishes() -> None:
    t, calls = _ordered()
    runner = TrialRunner(t)
    out = _trial(t, runner, 0, lambda: 0.5, objective=float)
    assert out.state == COMPLETE and t.trials[0].status == "RUNNING"
    runner.complete(tell=lambda: calls.append("tell"), metrics={"best/val": 0.5, "epochs": 3},
                    step=3, rows=[({"al/acc": 0.1}, 1), ({"al/acc": 0.2}, 2)],
                    tags={"stopped": "max_epochs"})
    assert calls == ["tell", "metrics@3:trial:best/val,epochs", "metrics@1:trial:al/acc",
                     "metrics@2:trial:al/acc", "tags:trial:stopped", "end:FINISHED"]
    rec = t.trials[0]
    assert (rec.status, rec.error, rec.tags) == ("FINISHED", None, {"stopped": "max_epochs"})
    assert rec.history("al/acc") == [(1, 0.1), (2, 0.2)]
    assert rec.last("best/val") == 0.5


def test_complete_with_nothing_to_record_only_finishes() -> None:
    t, calls = _ordered()
    runner = TrialRunner(t)
    _trial(t, runner, 0, lambda: 1)
    runner.complete()
    assert calls == ["end:FINISHED"] and t.trials[0].status == "FINISHED"


def test_cut_tells_the_storage_tags_and_closes_killed_with_the_reason() -> None:
    t, calls = _ordered()
    runner = TrialRunner(t)
    _trial(t, runner, 0, lambda: 1)
    runner.cut("budget exhausted before the first epoch", tell=lambda: calls.append("tell"),
               tags={"stopped": "budget"})
    assert calls == ["tell", "tags:trial:stopped", "end:KILLED"]
    rec = t.trials[0]
    assert (rec.status, rec.error) == ("KILLED", "budget exhausted before the first epoch")


def test_a_trial_record_is_closed_only_by_the_runner() -> None:
    """One lifecycle: no protocol of the product closes a trial record itself (the calls
    that remain are the runner's and the trackers' own delegations)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    allowed = {"scarcelab/trials.py", "scarcelab/tracker.py", "tracking/mlflow_tracker.py",
               "entrypoints/_progress.py"}
    found = []
    for folder in ("scarcelab", "tracking", "entrypoints"):
        for path in (root / folder).rglob("*.py"):
            rel = path.relative_to(root).as_posix()
            if rel.startswith(("scarcelab/tracking/", "scarcelab/entrypoints/")):
                continue  # the symlinks to the two top-level folders
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "end_trial" and rel not in allowed):
                    found.append(f"{rel}:{node.lineno}")
    assert found == [], f"trial records closed outside scarcelab/trials.py: {found}"
