"""A behaviour guard of ``scarcelab.active.loop.run_repetition`` (issue 26 item 1): what
one repetition returns and reports, in a few seeded set-ups that go through its branches
(query-size cut at the budget, candidate subsample, a strategy that stops early, the oracle's
sequential and stacked fits, the kept optimiser, one fit per label, test-set stopping, its
configuration and data errors), and what a sweep tells its tracker around it, recorded on
the function before it was split into named steps. The literals are that implementation's
output, not values derived from a contract: the split must reproduce them exactly.

Query times are wall-clock: only their count is recorded."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_active_loop import TINY
from test_tune_guard import Recorder

from scarcelab.active import STRATEGIES
from scarcelab.active.datasets import dataset_config, load_al_dataset
from scarcelab.active.loop import (
    ALRunConfig,
    RepetitionResult,
    make_strategy,
    run_al,
    run_repetition,
)
from scarcelab.errors import ConfigError, DataError
from tests.guard_compare import assert_same_behaviour


def _summary(r: RepetitionResult, seen: list[tuple[int, int, float]]) -> dict[str, Any]:
    return {"repetition": r.repetition, "seeds": r.seeds, "sizes": r.sizes,
            "accuracies": [round(a, 6) for a in r.accuracies],
            "query_times": len(r.query_times), "auc": round(r.auc, 6),
            "split_hash": r.split_hash, "labeled": r.labeled,
            "on_iteration": [(k, n, round(a, 6)) for k, n, a in seen]}


def _run(strategy: Any, q: int = 2, k: int = 0, s_o: int = 0, s_d: int = 0, s_t: int = 0,
         batched: bool = True, **over: Any) -> dict[str, Any]:
    cfg = dataset_config("honeypot").replace(**{**TINY, **over})
    rng_d = np.random.default_rng(s_d + k)
    data = load_al_dataset("honeypot", None, rng_d)
    seen: list[tuple[int, int, float]] = []
    r = run_repetition(data, cfg, strategy, q, k, s_o, s_d, s_t, data_rng=rng_d,
                       batched_oracle=batched,
                       on_iteration=lambda *a: seen.append(a))
    return _summary(r, seen)


class _StopsAfterOne(STRATEGIES.get("random")):  # type: ignore[misc]
    """Random for one query, then nothing: the loop must end before its budget."""

    calls = 0

    def query(self, state, q, rng):  # type: ignore[no-untyped-def]
        self.calls += 1
        return super().query(state, q, rng) if self.calls == 1 else np.empty(0, np.int64)


def _record(name: str) -> dict[str, Any]:
    if name == "margin_budget_cut":
        return _run(make_strategy("margin"), q=4, k=1, s_o=3, s_d=5, s_t=7, budget=10)
    if name == "random_subsampled":
        return _run(make_strategy("random", max_candidates=40), q=3, s_o=2)
    if name == "stops_early":
        return _run(_StopsAfterOne(), q=2)
    if name == "oracle_kept_optimizer_per_label_test_stop":
        return _run(make_strategy("oracle", {"tau": 3}), q=2, budget=4, max_epochs=3,
                    lr=0.05, first_fit_epochs=2, keep_optimizer=True, fit_per_label=True,
                    stop_on="test")
    if name in ("oracle_stacked_scratch", "oracle_sequential_scratch"):
        return _run(make_strategy("oracle", {"tau": 3}), q=2, budget=4, max_epochs=3,
                    lr=0.05, first_fit_epochs=0, keep_optimizer=False, restore_best=True,
                    drop_last=False, fitting="scratch",
                    batched=name == "oracle_stacked_scratch")
    raise KeyError(name)


EXPECTED: dict[str, dict[str, Any]] = {
    "margin_budget_cut": {
        "repetition": 1, "seeds": {"strategy": 3, "data": 6, "model": 8},
        "sizes": [2, 6, 10, 12], "accuracies": [0.6, 0.558333, 0.7, 0.666667],
        "query_times": 3, "auc": 0.619444, "split_hash": "4bcab40477b34c5e",
        "labeled": [111, 378, 93, 128, 21, 219, 178, 257, 306, 379, 322, 243],
        "on_iteration": [(1, 2, 0.6), (1, 6, 0.558333), (1, 10, 0.7), (1, 12, 0.666667)]},
    "random_subsampled": {
        "repetition": 0, "seeds": {"strategy": 2, "data": 0, "model": 0},
        "sizes": [2, 5, 8], "accuracies": [0.583333, 0.583333, 0.641667],
        "query_times": 2, "auc": 0.583333, "split_hash": "5affb0a3d0ee8a89",
        "labeled": [387, 459, 178, 439, 198, 463, 207, 118],
        "on_iteration": [(0, 2, 0.583333), (0, 5, 0.583333), (0, 8, 0.641667)]},
    "stops_early": {
        "repetition": 0, "seeds": {"strategy": 0, "data": 0, "model": 0},
        "sizes": [2, 4], "accuracies": [0.583333, 0.583333],
        "query_times": 2, "auc": 0.583333, "split_hash": "5affb0a3d0ee8a89",
        "labeled": [387, 459, 404, 303],
        "on_iteration": [(0, 2, 0.583333), (0, 4, 0.583333)]},
    "oracle_kept_optimizer_per_label_test_stop": {
        "repetition": 0, "seeds": {"strategy": 0, "data": 0, "model": 0},
        "sizes": [2, 4, 6], "accuracies": [0.566667, 0.591667, 0.716667],
        "query_times": 2, "auc": 0.579167, "split_hash": "5affb0a3d0ee8a89",
        "labeled": [387, 459, 403, 20, 308, 273],
        "on_iteration": [(0, 2, 0.566667), (0, 4, 0.591667), (0, 6, 0.716667)]},
    # the stacked and the sequential oracle fits agree, as they must
    **{name: {
        "repetition": 0, "seeds": {"strategy": 0, "data": 0, "model": 0},
        "sizes": [2, 4, 6], "accuracies": [0.708333, 0.725, 0.775],
        "query_times": 2, "auc": 0.716667, "split_hash": "5affb0a3d0ee8a89",
        "labeled": [387, 459, 305, 9, 109, 300],
        "on_iteration": [(0, 2, 0.708333), (0, 4, 0.725), (0, 6, 0.775)]}
       for name in ("oracle_stacked_scratch", "oracle_sequential_scratch")},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_repetition_is_unchanged(name: str) -> None:
    assert_same_behaviour(_record(name), EXPECTED[name])


@pytest.mark.parametrize(("over", "q", "error", "match"), [
    ({}, 0, ConfigError, r"^query_size must be >= 1, got 0$"),
    ({"val_fraction": 0.0}, 2, ConfigError, r"^val_fraction=0 leaves no validation split"),
    ({"seed_per_class": 1000}, 2, DataError,
     r"^honeypot: class 0 has \d+ pool samples, fewer than seed_per_class=1000$"),
])
def test_repetition_errors_are_unchanged(over: dict[str, Any], q: int, error: type,
                                         match: str) -> None:
    with pytest.raises(error, match=match):
        _run(make_strategy("random"), q=q, **over)


_REP_CALLS = [
    *[("log_metrics", s, "trial", ("al/test_accuracy",)) for s in (2, 5, 8)],
    *[("log_metrics", s, "trial", ("al/query_time_s",)) for s in (5, 8)],
    ("log_metrics", 0, "trial", ("al/auc", "al/collapsed_fits", "al/final_accuracy",
                                 "al/query_time_mean_s")),
    ("set_tags", "trial", ("scarcelab.split_hash",)),
    ("end_trial", "FINISHED", "")]
#: the sweep of test_sweep_around_the_repetitions_is_unchanged, repetition by repetition
REP_ACCURACIES = [[0.341667, 0.508333, 0.508333], [0.691667, 0.766667, 0.566667]]
REP_LABELED = [[83, 200, 307, 409, 419, 284, 4, 172], [33, 95, 439, 279, 334, 107, 394, 124]]
_STUDY = ("start_study",
          ("scarcelab.dataset", "scarcelab.family", "scarcelab.method", "scarcelab.query_size",
           "scarcelab.role", "scarcelab.seed_strategy"))
_TRIAL_TAGS = ("scarcelab.dataset", "scarcelab.family", "scarcelab.method",
               "scarcelab.query_size", "scarcelab.repetition", "scarcelab.role",
               "scarcelab.seed", "scarcelab.seed_data", "scarcelab.seed_model",
               "scarcelab.seed_strategy")
_TRIAL_PARAMS = ("repetition", "seed_data", "seed_model")


def test_sweep_around_the_repetitions_is_unchanged() -> None:
    tr = Recorder()
    rc = ALRunConfig("margin", "honeypot", query_size=3, repetitions=2, seed_strategy=4,
                     seed_data=10, seed_model=20, overrides=TINY)
    res = run_al(rc, tr)
    assert [c[:2] for c in tr.calls[:1]] == [_STUDY]
    assert tr.calls[1:] == [
        ("start_trial", 0, _TRIAL_TAGS, _TRIAL_PARAMS), *_REP_CALLS,
        ("start_trial", 1, _TRIAL_TAGS, _TRIAL_PARAMS), *_REP_CALLS,
        ("log_metrics", 0, "study",
         ("al/auc_mean", "al/auc_std", "al/repetitions_finished")),
        ("end_study", "FINISHED")]
    assert [_summary(r, [])["accuracies"] for r in res.repetitions] == REP_ACCURACIES
    assert [r.labeled for r in res.repetitions] == REP_LABELED
    assert res.failed == []


def test_a_repetition_config_error_fails_the_sweep_unchanged() -> None:
    tr = Recorder()
    rc = ALRunConfig("margin", "honeypot", query_size=0, repetitions=2, overrides=TINY)
    with pytest.raises(ConfigError, match="query_size must be >= 1"):
        run_al(rc, tr)
    assert tr.calls[1:] == [
        ("start_trial", 0, _TRIAL_TAGS, _TRIAL_PARAMS),
        ("end_trial", "FAILED", "configuration or data error (see the sweep)"),
        ("end_study", "FAILED")]
