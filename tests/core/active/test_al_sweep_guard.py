"""A behaviour guard of ``scarcelab.active.loop.run_al`` around its repetitions: the branches
the repetition guard does not reach (a repetition that fails and the sweep goes on, a sweep
whose every repetition failed, the test-set leak tag) and the exact study record it opens.
Repetitions are replaced by a fixed result, so only the sweep's own code runs; the
literals were recorded on the function before it was split into named steps."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from test_active_loop import TINY
from test_tune_guard import Recorder

from scarcelab.accel import NAMES as ACCEL_NAMES
from scarcelab.active import loop
from scarcelab.active.loop import ALRunConfig, RepetitionResult, run_al


def _fake_run_one(fail: set[int]) -> Any:
    def run_one(rc: ALRunConfig, k: int, first: Any, strategy: Any = None,
                on_iteration: Any = None) -> RepetitionResult:
        if k in fail:
            raise ValueError(f"boom {k}")
        return RepetitionResult(k, {"strategy": 0, "data": k, "model": k}, [2, 4, 6],
                                [0.5 + k / 10, 0.6, 0.7], [0.25, 0.75], 0.55 + k / 10,
                                f"hash{k}", [1, 2, 3, 4, 5, 6])
    return run_one


def _digest(d: dict[str, Any]) -> str:
    return hashlib.sha256(repr(sorted(d.items())).encode()).hexdigest()[:16]


def _sweep(monkeypatch: pytest.MonkeyPatch, fail: set[int], reps: int = 3,
           **over: Any) -> tuple[Recorder, Any]:
    monkeypatch.setattr(loop, "run_one", _fake_run_one(fail))
    tr = Recorder()
    rc = ALRunConfig("margin", "honeypot", query_size=2, repetitions=reps, seed_strategy=1,
                     seed_data=3, seed_model=5, overrides={**TINY, **over})
    try:
        return tr, run_al(rc, tr)
    except RuntimeError as e:
        return tr, e


def test_a_failing_repetition_is_recorded_and_the_sweep_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tr, res = _sweep(monkeypatch, {1})
    assert res.failed == [(1, "ValueError: boom 1")]
    assert [r.repetition for r in res.repetitions] == [0, 2]
    assert [(t.name, t.status, t.error) for t in tr.trials] == [
        ("trial-0", "FINISHED", None), ("trial-1", "FAILED", "ValueError: boom 1"),
        ("trial-2", "FINISHED", None)]
    assert tr.trials[0].metrics == [
        ("al/test_accuracy", 0.5, 2), ("al/test_accuracy", 0.6, 4),
        ("al/test_accuracy", 0.7, 6), ("al/query_time_s", 0.25, 4),
        ("al/query_time_s", 0.75, 6), ("al/auc", 0.55, 0),
        ("al/query_time_mean_s", 0.5, 0), ("al/final_accuracy", 0.7, 0),
        ("al/collapsed_fits", 0.0, 0)]
    assert tr.trials[2].tags["scarcelab.split_hash"] == "hash2"
    assert tr.trials[2].tags["scarcelab.seed"] == "5"
    assert tr.trials[2].params == {"repetition": 2, "seed_data": 5, "seed_model": 7}
    assert [(k, round(v, 6), s) for k, v, s in tr.study.metrics] == [
        ("al/auc_mean", 0.65, 0), ("al/auc_std", 0.141421, 0),
        ("al/repetitions_finished", 2.0, 0)]
    assert tr.study.status == "FINISHED"
    assert tr.study.name == "al-honeypot-margin-q2"
    assert tr.study.tags == {
        "scarcelab.family": "active", "scarcelab.method": "margin",
        "scarcelab.dataset": "honeypot", "scarcelab.query_size": "2",
        "scarcelab.seed_strategy": "1", "scarcelab.role": "al_sweep"}
    # the precision and kernel params, logged since the recording (issue 40): the former
    # fp32 path, kept apart so that the recorded digest stays that of the recording
    assert {k: tr.study.params[k] for k in ACCEL_NAMES} == {
        "precision": "fp32", "channels_last": "off", "cudnn_benchmark": "off",
        "fused_optimizer": "off", "tf32": "off", "compile": "off"}
    assert _digest({k: v for k, v in tr.study.params.items() if k not in ACCEL_NAMES}
                   ) == STUDY_PARAMS_DIGEST
    assert tr.artifacts["al_config.json"] == {**tr.study.params, "note": ""}
    assert (tr.dataset.name, tr.dataset.source, tr.dataset.digest) == (
        "honeypot", "synthetic:honeypot", "regenerated-per-repetition")


STUDY_PARAMS_DIGEST = "38f972dd493ae1ca"  # repr of the sorted params, al.* included


def test_one_finished_repetition_has_no_spread_and_the_leak_is_tagged(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tr, res = _sweep(monkeypatch, {0}, reps=2, stop_on="test")
    assert res.failed == [(0, "ValueError: boom 0")]
    assert [(k, round(v, 6), s) for k, v, s in tr.study.metrics] == [
        ("al/auc_mean", 0.65, 0), ("al/auc_std", 0.0, 0), ("al/repetitions_finished", 1.0, 0)]
    leak = "test-set early stopping (CDALBench's earlier code)"
    assert tr.study.tags["scarcelab.leak"] == leak
    assert all(t.tags["scarcelab.leak"] == leak for t in tr.trials)


def test_a_sweep_whose_every_repetition_failed_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    tr, err = _sweep(monkeypatch, {0, 1}, reps=2)
    assert isinstance(err, RuntimeError)
    assert str(err) == ("all 2 repetitions failed: [(0, 'ValueError: boom 0'), "
                        "(1, 'ValueError: boom 1')]")
    assert tr.calls[1:] == [
        ("start_trial", 0, *tr.calls[1][2:]), ("end_trial", "FAILED", "ValueError: boom 0"),
        ("start_trial", 1, *tr.calls[1][2:]), ("end_trial", "FAILED", "ValueError: boom 1"),
        ("end_study", "FAILED")]
