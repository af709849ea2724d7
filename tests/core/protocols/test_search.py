import math

import numpy as np
import pytest
import torch

from scarcelab.errors import ConfigError
from scarcelab.methods import METHODS, SupervisedMethod
from scarcelab.protocols.search import StudyConfig, parse_overrides, run_study
from scarcelab.tracker import InMemoryTracker
from scarcelab.train import export_classifier


def _cfg(**kw):
    base = dict(method="sup", dataset="synthetic_tiny", budget_minutes=0.5, max_epochs=3,
                patience=2, batch_size=16, unlabeled_batch_size=32, max_steps_per_epoch=5,
                max_trials=2, arch="small_cnn", device="cpu")
    base.update(kw)
    return StudyConfig(**base)


def test_study_records_trials_best_and_checkpoint():
    t = InMemoryTracker()
    res = run_study(_cfg(), t)
    assert res.n_trials == 2 and res.n_failed == 0
    assert t.study.status == "FINISHED" and [tr.status for tr in t.trials] == ["FINISHED"] * 2
    tags = t.study.tags
    assert tags["scarcelab.role"] == "study" and tags["scarcelab.family"] == "supervised"
    assert tags["scarcelab.method"] == "sup" and tags["scarcelab.split_hash"] == res.split_hash
    assert t.trials[0].tags["scarcelab.role"] == "trial"
    assert {"lr", "weight_decay", "batch_size"} <= set(t.trials[0].params)
    assert "split.json" in t.artifacts and "config.json" in t.artifacts
    # best-so-far on the study is monotone and ends at the best trial's best epoch
    hist = [v for _, v in t.study.history("best/val_balanced_accuracy")]
    assert hist == sorted(hist) and hist[-1] == res.best_val
    per_trial = [tr.last("best/val_balanced_accuracy") for tr in t.trials]
    assert res.best_val == max(per_trial)
    best_trial = t.trials[res.best_trial]
    vals = [v for _, v in best_trial.history("val/balanced_accuracy")]
    tests = [v for _, v in best_trial.history("test/balanced_accuracy")]
    # the study's test score is that of the val-best epoch (first one on ties)
    assert res.best_test["balanced_accuracy"] == tests[int(np.argmax(vals))]
    assert t.checkpoints and t.model is not None
    assert t.study.last("best/test_balanced_accuracy") == res.best_test["balanced_accuracy"]


def test_exported_model_reproduces_checkpoint(tiny_bundle):
    t = InMemoryTracker()
    res = run_study(_cfg(max_trials=1), t)
    model = t.model
    x = torch.as_tensor(tiny_bundle.test_x).float() / 255
    pred = model(x).argmax(1).numpy()
    acc = (pred == tiny_bundle.test_y).mean()
    assert abs(acc - res.best_test["accuracy"]) < 1e-9


def test_probe_checkpoint_exports_encoder_and_probe(tiny_bundle):
    t = InMemoryTracker()
    res = run_study(_cfg(method="simclr", max_trials=1, batch_size=None), t)
    ckpt = res.best_checkpoint
    assert ckpt["probe"] is not None
    x = torch.as_tensor(tiny_bundle.test_x).float() / 255
    acc = (t.model(x).argmax(1).numpy() == tiny_bundle.test_y).mean()
    assert abs(acc - res.best_test["accuracy"]) < 1e-9
    assert t.trials[0].last("time/probe_s") > 0


class _NanOnLowLr(SupervisedMethod):
    """Diverges (NaN loss) when lr < 1e-3: half the random configurations fail."""

    search_space = METHODS.get("sup").search_space
    defaults = METHODS.get("sup").defaults

    def step(self, batch, progress):
        loss = torch.nn.functional.cross_entropy(self.logits(batch.x[0]), batch.y)
        if self.hp["lr"] < 1e-3:
            loss = loss * float("nan")
        return {"loss": loss, "loss_labeled": loss}


@pytest.fixture
def nan_method():
    METHODS.register("nan_on_low_lr")(_NanOnLowLr)
    yield "nan_on_low_lr"
    METHODS._entries.pop("nan_on_low_lr")


def test_nan_trial_recorded_failed_and_search_goes_on(nan_method):
    t = InMemoryTracker()
    res = run_study(_cfg(method=nan_method, max_trials=6), t)
    statuses = [tr.status for tr in t.trials]
    assert "FAILED" in statuses and "FINISHED" in statuses, statuses
    assert res.n_failed == statuses.count("FAILED")
    failed = [tr for tr in t.trials if tr.status == "FAILED"]
    assert all("non-finite loss" in tr.error for tr in failed)
    assert all(tr.params["lr"] < 1e-3 for tr in failed)
    assert t.study.status == "FINISHED" and not math.isnan(res.best_val)


def test_budget_is_honoured():
    import time

    t0 = time.time()
    res = run_study(_cfg(budget_minutes=0.05, max_trials=0, max_epochs=1000, patience=1000,
                         max_steps_per_epoch=None), InMemoryTracker())
    assert time.time() - t0 < 3 * 60 * 0.05 + 5  # budget + one epoch of slack + export
    assert res.n_trials >= 1


def test_transfer_search_none_uses_defaults_and_val_in_train():
    t = InMemoryTracker()
    run_study(_cfg(search="none", max_trials=5, transfer_epochs=2), t)
    assert len(t.trials) == 1
    assert t.trials[0].params["lr"] == METHODS.get("sup").defaults["lr"]
    assert t.study.tags["scarcelab.val_in_train"] == "true"
    assert t.study.params["n_labeled"] == 30


def test_family_mismatch_and_bad_overrides():
    with pytest.raises(ConfigError, match="method 'sup' is supervised, not semi.*-e supervised"):
        run_study(_cfg(family="semi"), InMemoryTracker())
    with pytest.raises(ConfigError, match=r"unknown hyperparameter\(s\) \['bogus'\]"):
        run_study(_cfg(overrides={"bogus": 1}), InMemoryTracker())
    with pytest.raises(ConfigError, match="unknown arch"):
        run_study(_cfg(arch="vgg"), InMemoryTracker())


def test_parse_overrides():
    assert parse_overrides("lambda_u=2,threshold=0.9, name=abc") == {
        "lambda_u": 2, "threshold": 0.9, "name": "abc"}
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides("oops")


def test_export_classifier_roundtrip(tiny_bundle):
    t = InMemoryTracker()
    res = run_study(_cfg(max_trials=1), t)
    from scarcelab.methods import get_method
    from scarcelab.models import create_model

    m = get_method("sup")(create_model("small_cnn", 1), 3, {})
    model = export_classifier(m, res.best_checkpoint, ["a", "b", "c"])
    x = torch.rand(4, 1, 16, 16)
    assert torch.allclose(model(x), t.model(x), atol=1e-6)
