"""Schedules that fit the work a trial does (issue 41, item 4).

A budget that ends a trial after a few epochs used to leave every schedule planned over
``max_epochs``: MixMatch trained with a few per cent of its unlabeled weight and the
learning rate never decayed. Under ``schedule_horizon=budget`` the one :class:`Horizon`
that the cosine learning rate and every ramp read is re-planned to the steps the trial's
share of the budget buys, so a budgeted short trial ends at its full unlabeled weight and
its final learning rate. Driven by a fake clock (every step costs STEP_S, every
evaluation EVAL_S): no timing of the real machine is asserted.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

import scarcelab.protocols.search as search_mod
import scarcelab.train as train_mod
from scarcelab.methods import get_method
from scarcelab.methods._parts import linear_rampup, sigmoid_rampup
from scarcelab.methods.base import Batch, Progress
from scarcelab.models import create_model
from scarcelab.schedule import Horizon, cosine_factor, steps_that_fit

STEP_S, EVAL_S = 1.0, 0.5
#: every method whose unlabeled weight is ramped up (grep ramp in scarcelab/methods)
RAMPED = ("mixmatch", "meanteacher", "pseudolabel", "ds3l")


# -- the mechanics, by hand ------------------------------------------------------------------

def test_horizon_progress_and_ramps_by_hand() -> None:
    h = Horizon(100)
    assert [h.fraction(s) for s in (0, 20, 50, 100, 150)] == [0.0, 0.2, 0.5, 1.0, 1.0]
    # re-planned at step 20 to end at step 60: 0.2 there, then linear to 1.0 at 60
    h.replan(20, 60)
    assert h.fraction(20) == pytest.approx(0.2)
    assert h.fraction(40) == pytest.approx(0.2 + 0.8 * 20 / 40)  # 0.6
    assert h.fraction(60) == 1.0 and h.finished(60) and not h.finished(59)
    # a second re-plan keeps progress continuous and never lowers it
    h.replan(40, 140)
    assert h.fraction(40) == pytest.approx(0.6)
    assert h.fraction(90) == pytest.approx(0.6 + 0.4 * 50 / 100)  # 0.8
    # the ramps (MixMatch / Pseudo-Label / Mean Teacher: linear over warmup = 0.4 of the
    # plan; DS3L: Laine & Aila's exp(-5 (1 - t)^2) over the whole plan)
    assert [linear_rampup(f, 0.4) for f in (0.0, 0.1, 0.2, 0.4, 0.9)] == \
        pytest.approx([0.0, 0.25, 0.5, 1.0, 1.0])
    assert sigmoid_rampup(0.5, 1.0) == pytest.approx(math.exp(-1.25))  # 0.2865
    assert sigmoid_rampup(1.0, 1.0) == pytest.approx(1.0)
    # the learning rate's cosine: 1 -> 0.5 -> 0
    assert [cosine_factor(f) for f in (0.0, 0.5, 1.0)] == pytest.approx([1.0, 0.5, 0.0])
    # the steps the epoch loop still starts: while more than a step and an evaluation
    # are left (10 s, 1 s a step: at 10, 9, ..., 2 s left = 9 steps)
    assert steps_that_fit(10.0, 1.0, 0.0) == 9
    assert steps_that_fit(10.5, 1.0, 0.0) == 10
    assert steps_that_fit(10.0, 1.0, 2.0) == 7
    assert steps_that_fit(0.5, 1.0, 0.0) == 0
    # an evaluation of 0.5 s after every 2 steps: 10 → 9 → 8, eval 7.5 → 6.5 → 5.5, eval
    # 5 → 4 → 3, eval 2.5 → 1.5 (then 1.5 is not > 1 + 0.5): 7 steps
    assert steps_that_fit(10.0, 1.0, 0.5, window=2) == 7
    # one step of the window already done: 9, eval 8.5 → 7.5 → 6.5, eval 6 → 5 → 4,
    # eval 3.5 → 2.5 → 1.5: 7; evaluations costing 1.5 s with their logging: 6
    assert steps_that_fit(10.0, 1.0, 0.5, window=2, in_window=1) == 7
    assert steps_that_fit(10.0, 1.0, 0.5, window=2, window_cost_s=1.5) == 6
    assert steps_that_fit(math.inf, 1.0, 0.0) > 10**9
    with pytest.raises(ValueError, match="step_s"):
        steps_that_fit(10.0, 0.0, 0.0)


def test_a_methods_ramp_reads_the_shared_horizon() -> None:
    """MixMatch's λU ramp follows the Horizon it is handed (the epoch loop's, the one its
    learning rate follows), not a step count of its own."""
    def _batch(m: Any) -> Batch:  # a fixed tiny batch of the method's views
        g = torch.Generator().manual_seed(0)
        x, u = torch.rand(6, 1, 16, 16, generator=g), torch.rand(12, 1, 16, 16, generator=g)
        return Batch(x=[x for _ in m.labeled_views], y=torch.arange(6) % 3,
                     u=[u for _ in m.views], u_index=torch.arange(12))

    torch.manual_seed(0)
    cls = get_method("mixmatch")
    m = cls(create_model("small_cnn", in_channels=1), 3, dict(cls.defaults))
    h = Horizon(1000)
    assert float(m.step(_batch(m), Progress(100, 1000, 0, h))["rampup"]) == \
        pytest.approx(0.25)  # 0.1 of the plan / warmup 0.4
    h.replan(100, 300)  # the budget buys 200 more steps
    # step 200: 0.1 + 0.9 * 100 / 200 = 0.55 of the plan: past the warm-up
    assert float(m.step(_batch(m), Progress(200, 1000, 0, h))["rampup"]) == 1.0
    assert Progress(150, 1000, 0, h).fraction == pytest.approx(0.1 + 0.9 * 50 / 200)
    assert Progress(150, 1000, 0).fraction == 0.15  # no horizon: step / total_steps


# -- a budgeted short trial, on a fake clock ------------------------------------------------

class FakeClock:
    """``time`` of the training loop: moved only by the steps and evaluations."""

    def __init__(self) -> None:
        self.t = 1_000_000.0

    def time(self) -> float:
        return self.t

    perf_counter = time


@pytest.fixture
def clock(monkeypatch):  # type: ignore[no-untyped-def]
    """A fake clock; ``clock.steps`` records per optimiser step (progress, the method's
    unlabeled-weight ramp, the learning rate after the step, the one the step used)."""
    c = FakeClock()
    monkeypatch.setattr(train_mod, "time", c)
    monkeypatch.setattr(search_mod, "time", c)
    step, ev = train_mod.optimizer_step, train_mod.evaluate
    c.steps = []  # type: ignore[attr-defined]

    def timed_step(method, opt, sched, batch, progress, *a):  # type: ignore[no-untyped-def]
        c.t += STEP_S
        used = opt.param_groups[0]["lr"]
        out = step(method, opt, sched, batch, progress, *a)
        ramp = float(out["rampup"]) if "rampup" in out else math.nan
        c.steps.append((progress.fraction, ramp, sched.get_last_lr()[0], used))  # type: ignore[attr-defined]
        return out

    def timed_eval(*a: Any, **k: Any) -> Any:
        c.t += EVAL_S
        return ev(*a, **k)

    monkeypatch.setattr(train_mod, "optimizer_step", timed_step)
    monkeypatch.setattr(train_mod, "evaluate", timed_eval)
    return c


def _trial(name: str, bundle: Any, horizon: str, budget_s: float = 30.0,
           **cfg: Any) -> tuple[Any, Any, list[dict[str, float]]]:
    """One trial of ``name`` planned for 200 epochs of 2 steps, under ``budget_s``."""
    torch.manual_seed(0)
    cls = get_method(name)
    m = cls(create_model("small_cnn", in_channels=1), bundle.num_classes, dict(cls.defaults))
    reports: list[dict[str, float]] = []
    budget = train_mod.Budget(budget_s)
    res = train_mod.train_trial(
        m, bundle, train_mod.TrainConfig(**{
            "max_epochs": 200, "patience": 10**6, "max_steps_per_epoch": 2,
            "batch_labeled": 8, "batch_unlabeled": 16, "schedule_horizon": horizon, **cfg}),
        deadline=budget, generator=torch.Generator().manual_seed(0),
        probe_rng=np.random.default_rng(0),
        callbacks=[train_mod.OnEpochEnd(lambda rep, imp, snap: reports.append(rep.metrics))])
    return res, budget, reports


@pytest.mark.parametrize("name", RAMPED)
def test_a_budgeted_short_trial_ends_at_full_unlabeled_weight_and_final_lr(
        name, clock, tiny_bundle) -> None:  # type: ignore[no-untyped-def]
    lam = float(get_method(name).defaults["lambda_u"]) if name == "ds3l" else 1.0
    res, budget, reports = _trial(name, tiny_bundle, "budget")
    fraction, ramp, lr, used = clock.steps[-1]
    base_lr = float(get_method(name).defaults["lr"])
    # ~20 steps of the 400 planned: the plan was shortened to them, and completed; planned
    # over all the budget, the trial runs until the budget check stops it
    assert 15 <= res.steps <= 25 and res.stopped == "budget"
    assert reports[-1]["train/progress"] == 1.0
    assert reports[-1]["train/horizon_steps"] == res.steps
    assert reports[-1]["train/lr"] == 0.0  # the cosine's final value, after the last step
    assert used <= 0.05 * base_lr  # the last step trained at the end of the decay
    # exact on this clock: 4 calibration steps on the 400-step plan (progress 0.01), then
    # one plan, right from the first estimate, ending with the trial's last step
    n = res.steps
    assert fraction == pytest.approx(0.01 + 0.99 * (n - 1 - 4) / (n - 4))
    if name == "ds3l":  # exp(-5 (1 - t)^2) at the last step's t = 1 - 1/steps or so
        assert ramp / lam >= 0.95
    else:
        assert ramp == 1.0
    # ramps and the learning rate moved together, monotonically, from where they start
    fr = [f for f, *_ in clock.steps]
    assert fr == sorted(fr) and fr[0] == 0.0
    lrs = [x for _, _, x, _ in clock.steps]
    assert lrs == sorted(lrs, reverse=True) and lrs[0] <= base_lr
    assert budget.elapsed() <= 30.0  # and within the budget


@pytest.mark.parametrize("name", RAMPED)
def test_the_paper_faithful_plan_leaves_a_short_trial_unfinished(
        name, clock, tiny_bundle) -> None:  # type: ignore[no-untyped-def]
    """``epochs`` (the papers' plan, over max_epochs): the same short trial never gets
    far into its ramps or its learning-rate decay — what budget mode is for."""
    res, _, reports = _trial(name, tiny_bundle, "epochs")
    fraction, ramp, lr, _ = clock.steps[-1]
    base_lr = float(get_method(name).defaults["lr"])
    assert fraction == pytest.approx((res.steps - 1) / 400)
    assert fraction < 0.1 and lr > 0.95 * base_lr and res.stopped == "budget"
    assert "train/progress" not in reports[-1]  # epochs mode logs what it always did


def test_a_trials_share_of_the_budget_ends_its_plan_and_the_trial(clock, tiny_bundle
                                                                  ) -> None:  # type: ignore[no-untyped-def]
    """Planned over a 10-second share of a 30-second budget (a search splitting it over
    its trials), the trial completes its schedules in that share and stops, leaving the
    rest of the budget to the next trial."""
    res, budget, reports = _trial("mixmatch", tiny_bundle, "budget", budget_share_s=10.0)
    assert res.stopped == "horizon" and res.steps <= 9
    assert clock.steps[-1][1] == 1.0 and reports[-1]["train/progress"] == 1.0
    assert reports[-1]["train/lr"] == 0.0
    assert budget.remaining() >= 19.0


def test_budget_mode_keeps_the_epoch_plan_when_the_budget_allows_it(clock, tiny_bundle
                                                                    ) -> None:  # type: ignore[no-untyped-def]
    """A budget longer than the training: the same schedule, step for step, as epochs."""
    curves = []
    for horizon in ("epochs", "budget"):
        clock.steps.clear()
        res, _, _ = _trial("pseudolabel", tiny_bundle, horizon, budget_s=10**6, max_epochs=3)
        assert res.stopped == "max_epochs" and res.steps == 6
        curves.append(list(clock.steps))
    assert curves[0] == curves[1]


def test_an_unknown_horizon_is_one_clear_error(tiny_bundle) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="schedule_horizon='steps'"):
        train_mod.train_trial(get_method("sup")(create_model("small_cnn", in_channels=1), 3,
                                                dict(get_method("sup").defaults)),
                              tiny_bundle, train_mod.TrainConfig(schedule_horizon="steps"),
                              deadline=1e18, generator=torch.Generator(),
                              probe_rng=np.random.default_rng(0))


# -- the option: declared, logged, reaching every trial ---------------------------------------

def _cfg(**kw: Any) -> Any:
    base = dict(method="mixmatch", dataset="synthetic_tiny", budget_minutes=1.0,
                max_epochs=200, patience=10**6, batch_size=8, unlabeled_batch_size=16,
                max_steps_per_epoch=2, max_trials=2, arch="small_cnn", device="cpu",
                diag_samples=0, final_reserve_s=0.0)
    base.update(kw)
    return search_mod.StudyConfig(**base)


def test_a_budgeted_study_logs_the_option_and_completes_each_trials_schedules(clock) -> None:  # type: ignore[no-untyped-def]
    """Two trials share a 60-second budget: each plans over its half and ends at full
    unlabeled weight and the cosine's final learning rate; the option is a study param."""
    from scarcelab.tracker import InMemoryTracker

    t = InMemoryTracker()
    res = search_mod.run_study(_cfg(schedule_horizon="budget"), t)
    assert res.n_trials == 2 and t.study.params["schedule_horizon"] == "budget"
    for trial in t.trials:
        assert trial.last("train/progress") == 1.0 and trial.last("train/lr") == 0.0
        assert trial.tags["scarcelab.stopped"] in ("horizon", "budget")
    ramps = [r for _, r, *_ in clock.steps]
    assert ramps.count(1.0) >= 2 and clock.steps[-1][1] == 1.0
    key = search_mod._study_key
    assert key(_cfg(schedule_horizon="budget"), "h") != key(_cfg(), "h")
    with pytest.raises(search_mod.ConfigError, match="schedule_horizon='auto'"):
        search_mod.run_study(_cfg(schedule_horizon="auto"), InMemoryTracker())


def test_the_cli_defaults_to_budget_and_mlproject_agrees(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """User commands plan schedules over the budget unless told ``epochs``; the paper
    suites pin ``epochs``; MLproject declares the same default."""
    from pathlib import Path

    import yaml
    from click.testing import CliRunner

    from scarcelab.entrypoints import study
    from scarcelab.entrypoints.cli import main

    seen: dict[str, Any] = {}
    monkeypatch.setattr(study, "_run", lambda family, kw, ctx: seen.update(
        cfg=study.study_config(family, kw)))
    for args, want in (([], "budget"), (["--schedule-horizon", "epochs"], "epochs")):
        res = CliRunner().invoke(main, ["semi", "--method", "mixmatch", *args])
        assert res.exit_code == 0, res.output
        assert seen["cfg"].schedule_horizon == want
    res = CliRunner().invoke(main, ["semi", "--method", "mixmatch",
                                    "--schedule-horizon", "steps"])
    assert res.exit_code != 0 and "--schedule-horizon" in res.output
    repo = Path(__file__).resolve().parents[2]
    project = yaml.safe_load((repo / "MLproject").read_text())["entry_points"]
    for entry in ("supervised", "semi", "self", "contamination"):
        assert project[entry]["parameters"]["schedule_horizon"]["default"] == "budget"
    for suite in ("ssl_vs_ssl", "cscore"):
        grids = yaml.safe_load((repo / "suites" / f"{suite}.yaml").read_text())["grids"]
        assert all(g.get("schedule_horizon") == "epochs" for g in grids), suite
