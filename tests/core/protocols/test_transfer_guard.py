"""Behaviour guard of ``run_linear`` and ``run_finetune`` (recorded on the code before they
were split into helpers): the order of the tracker calls and what each one carries, the
failure path's status, and what the fine-tuning study is asked for — the parts the
end-to-end tests in ``test_transfer.py`` do not pin."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from scarcelab.accel import NAMES as ACCEL_NAMES
from scarcelab.models.encoder import build_encoder
from scarcelab.protocols.transfer import ProbeConfig, run_finetune, run_linear
from scarcelab.tracker import InMemoryTracker


class _Recording(InMemoryTracker):
    """Keeps each call's name and arguments in order, so a reordering shows."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, ...]] = []

    def start_study(self, name, tags, params, artifacts=None, dataset=None):  # type: ignore[no-untyped-def]
        # the precision and kernel settings (issue 40, recorded since): the former fp32
        # NCHW path, checked here and left out of the recorded call
        former = {"precision": "fp32", "channels_last": "off", "cudnn_benchmark": "off",
                  "fused_optimizer": "off", "tf32": "off", "compile": "off"}
        rest = {k: v for k, v in params.items() if k not in ACCEL_NAMES}
        assert {k: params[k] for k in ACCEL_NAMES} == former
        arts = dict(artifacts or {})
        if "config.json" in arts:
            arts["config.json"] = dict(arts["config.json"])
            assert arts["config.json"].pop("accel") == former
        self.calls.append(("start_study", name, list(tags.items()), rest, arts, dataset))
        super().start_study(name, tags, params, artifacts, dataset)

    def set_tags(self, tags, scope="study"):  # type: ignore[no-untyped-def]
        self.calls.append(("set_tags", dict(tags), scope))
        super().set_tags(tags, scope)

    def log_metrics(self, metrics, step, scope="trial"):  # type: ignore[no-untyped-def]
        self.calls.append(("log_metrics", list(metrics), step, scope))
        super().log_metrics(metrics, step, scope)

    def log_model(self, model, example):  # type: ignore[no-untyped-def]
        self.calls.append(("log_model", tuple(example.shape)))
        super().log_model(model, example)

    def end_study(self, status):  # type: ignore[no-untyped-def]
        self.calls.append(("end_study", status))
        super().end_study(status)


def _cfg(**kw: Any) -> ProbeConfig:
    return ProbeConfig(dataset="synthetic_tiny_rgb", device="cpu", probe_trials=1,
                       probe_max_iter=50, **kw)


TAGS = [("scarcelab.role", "probe"), ("scarcelab.family", "transfer"),
        ("scarcelab.method", "linear_probe"), ("scarcelab.dataset", "synthetic_tiny_rgb"),
        ("scarcelab.seed", "0"), ("scarcelab.split_hash", "d0b434b3e836"),
        ("scarcelab.version", "0.1.0"), ("scarcelab.arch", "small_cnn"),
        ("scarcelab.label_fraction", "1"), ("scarcelab.task", "probe"),
        ("scarcelab.protocol", "linear"), ("scarcelab.encoder", "random"),
        ("scarcelab.encoder_arch", "small_cnn"), ("scarcelab.encoder_format", "random"),
        ("scarcelab.encoder_norm", "none"), ("scarcelab.encoder_fingerprint", "f6964f1f4997dbfe"),
        ("scarcelab.encoder_method", "random")]
PARAMS = {"dataset": "synthetic_tiny_rgb", "encoder": "random", "protocol": "linear",
          "data_dir": None, "arch": "small_cnn", "seed": 0, "n_labeled": 600, "n_val": 120,
          "label_fraction": 1.0, "encoder_norm": "auto", "device": "cpu", "probe_trials": 1,
          "probe_max_iter": 50, "positive_class": None, "n_test": 150}
PHASES = [{"scarcelab.phase": "encoding 750 images with the frozen encoder (cached after "
                              "the first run)"},
          {"scarcelab.phase": "fitting the linear probe (1 L2 penalties)"}]


def test_linear_records_in_order_with_the_same_payloads():
    enc, info = build_encoder("random", "small_cnn", 3, seed=0)
    t = _Recording()
    res = run_linear(_cfg(), enc, info, t)
    start, *rest = t.calls
    assert start[:2] == ("start_study", "probe-linear-synthetic_tiny_rgb-s0")
    assert start[2] == TAGS
    assert start[3] == PARAMS
    assert list(start[4]) == ["split.json", "config.json"]
    resolved = start[4]["config.json"]
    assert {k: resolved[k] for k in PARAMS} == PARAMS
    assert resolved["encoder_info"] is info and resolved["overrides"] == {}
    assert start[5].name == "synthetic_tiny_rgb" and start[5].digest == "24a808c7531c679a"
    assert rest[:2] == [("set_tags", PHASES[0], "study"), ("set_tags", PHASES[1], "study")]
    assert rest[2] == ("log_metrics", ["val/balanced_accuracy", *(f"test/{k}" for k in res.test),
                                       "probe/C", "time/features_s", "time/fit_s",
                                       "time/elapsed_s"], 0, "study")
    assert rest[3] == ("set_tags", {"scarcelab.encoding_key": res.info["encoding_key"],
                                    "scarcelab.features": "computed"}, "study")
    assert rest[4:] == [("log_model", (2, 3, 16, 16)), ("end_study", "FINISHED")]
    assert res.protocol == "linear" and res.split_hash == "d0b434b3e836"
    assert res.val_balanced_accuracy == t.study.last("val/balanced_accuracy")
    assert res.info["features"] == "computed memory"
    assert res.info["C"] == pytest.approx(6.633918380418473)
    np.testing.assert_array_equal(res.confusion, np.diag([50, 50, 50]))


def test_linear_failure_ends_the_study_failed_and_raises_the_same_error(monkeypatch):
    from scarcelab import probe

    def boom(self, *a, **kw):  # type: ignore[no-untyped-def]
        raise ValueError("probe fit exploded")

    monkeypatch.setattr(probe.LinearProbe, "fit", boom)
    enc, info = build_encoder("random", "small_cnn", 3, seed=0)
    t = _Recording()
    with pytest.raises(ValueError, match="probe fit exploded"):
        run_linear(_cfg(), enc, info, t)
    assert [c[0] for c in t.calls] == ["start_study", "set_tags", "set_tags", "end_study"]
    assert t.calls[-1] == ("end_study", "FAILED")


class _FakeStudy:
    split_hash = "not-the-probe-split"


def test_finetune_asks_the_study_for_the_probe_split_and_rejects_another(monkeypatch):
    import scarcelab.protocols.search as search

    seen: dict[str, Any] = {}

    def fake(scfg, tracker, backbone_factory, extra_tags):  # type: ignore[no-untyped-def]
        seen.update(scfg=scfg, tracker=tracker, factory=backbone_factory, tags=extra_tags)
        return _FakeStudy()

    monkeypatch.setattr(search, "run_study", fake)
    enc, info = build_encoder("random", "small_cnn", 3, seed=0)
    t = InMemoryTracker()
    cfg = _cfg(protocol="finetune", budget_minutes=0.5, max_epochs=3, patience=2,
               batch_size=8, max_steps_per_epoch=4, max_trials=2, overrides={"lr": 0.1})
    with pytest.raises(RuntimeError, match="^fine-tuning split differs from the probe split$"):
        run_finetune(cfg, enc, info, t)
    s = seen["scfg"]
    assert seen["tracker"] is t
    assert (s.method, s.dataset, s.family, s.data_dir, s.arch, s.seed) == (
        "sup", "synthetic_tiny_rgb", "supervised", None, "small_cnn", 0)
    assert (s.budget_minutes, s.max_epochs, s.patience, s.batch_size, s.max_steps_per_epoch,
            s.max_trials, s.device, s.overrides) == (0.5, 3, 2, 8, 4, 2, "cpu", {"lr": 0.1})
    assert (s.n_labeled, s.n_val, s.allow_large_val, s.label_fraction, s.search,
            s.diag_samples) == (600, 120, True, 1.0, "random", 0)
    assert list(seen["tags"].items()) == [("scarcelab.family", "transfer"),
                                          ("scarcelab.label_fraction", "1"),
                                          ("scarcelab.task", "probe"),
                                          ("scarcelab.protocol", "finetune"),
                                          *[kv for kv in TAGS if kv[0].startswith(
                                              "scarcelab.encoder")]]
    # the factory hands out fresh copies of the encoder's weights and checks channels
    a, b = seen["factory"](3), seen["factory"](3)
    assert a is not b and a is not enc and a.training
    sd = enc.state_dict()
    assert all((a.state_dict()[k] == v).all() for k, v in sd.items())
    from scarcelab.errors import ConfigError

    with pytest.raises(ConfigError, match="^encoder expects 3 channels, got 1$"):
        seen["factory"](1)
