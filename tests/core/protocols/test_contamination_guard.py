"""Behaviour guard of ``run_contamination``'s sweep loop (recorded on the code before it
was split into helpers), with ``run_study`` replaced by a recorder: which points run, in
which order, with which tracker tags, which are reused from a killed sweep, what each
point returns, and the messages of its argument checks. The real sweeps in
``test_contamination.py`` are too slow to cover every branch."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import scarcelab.protocols.contamination as contamination
from scarcelab.data.ood import MEDICAL_SOURCES
from scarcelab.errors import ConfigError
from scarcelab.protocols.contamination import FinishedChild, run_contamination
from scarcelab.protocols.search import StudyConfig
from scarcelab.tracker import InMemoryTracker

NEAR = sorted(MEDICAL_SOURCES)[0]


def _cfg() -> StudyConfig:
    return StudyConfig(method="fixmatch", dataset="synthetic_tiny", search="none",
                       study_name="sw", seed=3)


def test_sweep_loop_order_tags_reuse_and_results(monkeypatch, tiny_bundle):
    calls: list[tuple[Any, ...]] = []

    def fake_run_study(cfg, tracker, bundle_transform):  # type: ignore[no-untyped-def]
        if cfg.sweep_point.startswith(("clean", "gaussian")):
            out = bundle_transform(tiny_bundle)
            assert out.meta["contamination"]["source"] in ("gaussian", "clean", NEAR)
        tracker.start_study("s", {}, {}, {})
        calls.append((cfg.sweep_point, cfg.study_name, cfg.search, type(tracker).__name__,
                      dict(tracker.tags), dict(tracker.inner.study.params)))
        return f"result of {cfg.sweep_point}"

    monkeypatch.setattr(contamination, "run_study", fake_run_study)
    asked: list[tuple[str, float]] = []

    def tracker_for(source: str, r: float) -> InMemoryTracker:
        asked.append((source, r))
        return InMemoryTracker()

    reused = {f"{NEAR} r=0.5": FinishedChild("old near 0.5", {"n_ood": 7}, "run-x")}
    pts = run_contamination(_cfg(), ["gaussian", NEAR], [0.0, 0.5, 0.0], tracker_for,
                            finished=reused.get)
    assert asked == [("gaussian", 0.0), ("gaussian", 0.5)]
    base = {"scarcelab.tuning": "once", "scarcelab.hparams_source": "defaults"}
    assert [c[:5] for c in calls] == [
        ("clean r=0", "sw-clean-r=0", "none", "_ParamsAfterTransform",
         {"scarcelab.ood": "gaussian", "scarcelab.ratio": "0", "scarcelab.ood_kind": "none",
          **base}),
        ("gaussian r=0.5", "sw-gaussian-r=0.5", "none", "_ParamsAfterTransform",
         {"scarcelab.ood": "gaussian", "scarcelab.ratio": "0.5", "scarcelab.ood_kind": "far",
          **base})]
    assert [list(c[4]) for c in calls] == [["scarcelab.ood", "scarcelab.ratio",
                                            "scarcelab.ood_kind", "scarcelab.tuning",
                                            "scarcelab.hparams_source"]] * 2
    n_id = len(tiny_bundle.unlabeled_x)
    assert calls[0][5]["contamination.n_ood"] == 0
    assert calls[1][5]["contamination.n_ood"] == n_id
    assert [(p.source, p.kind, p.ratio, p.result, p.reused) for p in pts] == [
        ("gaussian", "none", 0.0, "result of clean r=0", False),
        ("gaussian", "far", 0.5, "result of gaussian r=0.5", False),
        (NEAR, "near", 0.5, "old near 0.5", True)]
    assert pts[0].contamination["n_ood"] == 0 and pts[1].contamination["n_ood"] == n_id
    assert pts[1].contamination == {k[len("contamination."):]: v for k, v in
                                    calls[1][5].items() if k.startswith("contamination.")}
    assert pts[2].contamination == {"n_ood": 7}
    assert pts[2].contamination is not reused[f"{NEAR} r=0.5"].contamination


def test_a_reused_clean_point_is_not_run_again_for_a_later_source(monkeypatch):
    points: list[str] = []

    def fake_run_study(cfg, tracker, bundle_transform):  # type: ignore[no-untyped-def]
        points.append(cfg.sweep_point)
        return cfg.sweep_point

    monkeypatch.setattr(contamination, "run_study", fake_run_study)
    done = {"clean r=0": FinishedChild("old clean", {"n_ood": 0})}
    pts = run_contamination(_cfg(), [NEAR, "gaussian"], [0.0, 0.3], lambda s, r:
                            InMemoryTracker(), finished=done.get)
    assert points == [f"{NEAR} r=0.3", "gaussian r=0.3"]
    assert [(p.source, p.kind, p.ratio, p.reused) for p in pts] == [
        (NEAR, "none", 0.0, True), (NEAR, "near", 0.3, False), ("gaussian", "far", 0.3, False)]


def test_argument_checks_keep_their_order_and_messages(monkeypatch):
    def never(*a, **kw):  # type: ignore[no-untyped-def]
        raise AssertionError("no study may start")

    monkeypatch.setattr(contamination, "run_study", never)
    make = lambda s, r: InMemoryTracker()  # noqa: E731
    with pytest.raises(ConfigError, match=r"^tuning='x': valid values are once, per_ratio$"):
        run_contamination(dataclasses.replace(_cfg(), method="sup"), [], [0.0], make,
                          tuning="x")
    with pytest.raises(ConfigError, match="^contamination sweeps need a semi-supervised "
                                          "method; 'sup' is supervised$"):
        run_contamination(dataclasses.replace(_cfg(), method="sup"), [], [0.0], make)
    with pytest.raises(ConfigError, match="^give at least one OOD source, e.g. ood=mnist$"):
        run_contamination(_cfg(), [], [0.0], make)
