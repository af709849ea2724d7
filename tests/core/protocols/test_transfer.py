"""Transfer protocols (linear probe, fine-tuning) on synthetic data with the in-memory
tracker, and the ``probe`` command end to end against an embedded sqlite MLflow store."""

from __future__ import annotations

import mlflow
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from scarcelab.data import DATASETS
from scarcelab.data.bundle import RawDataset
from scarcelab.models.encoder import build_encoder
from scarcelab.protocols.transfer import (
    ProbeConfig,
    confusion_matrix,
    probe_split,
    run_finetune,
    run_linear,
)
from scarcelab.tracker import InMemoryTracker

SEPARABLE = "test_separable_rgb"


def _separable(data_dir: object = None) -> RawDataset:
    """Three classes told apart by overall brightness (dark / mid / bright) plus pixel
    noise: linearly separable in the pooled features of any conv net, even a random one."""
    rng = np.random.default_rng(0)

    def make(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = np.arange(n) % 3
        base = np.array([40.0, 128.0, 215.0])[y][:, None, None, None]
        x = base + rng.normal(0, 12, (n, 3, 8, 8))
        return np.clip(x, 0, 255).astype(np.uint8), y.astype(np.int64)

    (xtr, ytr), (xte, yte) = make(150), make(60)
    return RawDataset(name=SEPARABLE, train_x=xtr, train_y=ytr, test_x=xte, test_y=yte,
                      num_classes=3, class_names=["dark", "mid", "bright"], source="test")


if SEPARABLE not in DATASETS:
    DATASETS.register(SEPARABLE)(_separable)


def test_confusion_matrix_matches_sklearn():
    from sklearn.metrics import confusion_matrix as sk

    rng = np.random.default_rng(0)
    yt, yp = rng.integers(0, 4, 200), rng.integers(0, 4, 200)
    np.testing.assert_array_equal(confusion_matrix(yt, yp, 4), sk(yt, yp, labels=range(4)))
    assert confusion_matrix(np.array([0]), np.array([0]), 3)[1:].sum() == 0  # absent classes


def test_linear_probe_separates_a_separable_set_and_caches_features(tmp_path):
    from scarcelab.active.encoded import DiskEncodingCache

    enc, info = build_encoder("random", "small_cnn", 3, seed=0)
    cfg = ProbeConfig(dataset=SEPARABLE, encoder="random", device="cpu", probe_trials=5)
    cache = DiskEncodingCache(tmp_path / "enc")
    tr = InMemoryTracker()
    res = run_linear(cfg, enc, info, tr, cache)
    assert res.test["accuracy"] == 1.0 and res.val_balanced_accuracy == 1.0
    assert res.confusion.sum() == 60 and np.trace(res.confusion) == 60
    assert res.info["features"].startswith("computed")
    assert tr.study.tags["scarcelab.encoder"] == "random"
    assert tr.study.tags["scarcelab.protocol"] == "linear"
    assert tr.study.tags["scarcelab.task"] == "probe"
    assert tr.study.last("test/balanced_accuracy") == 1.0 and tr.study.status == "FINISHED"
    # the logged model (frozen encoder + the folded probe) predicts what the probe did
    raw = _separable()
    pred = tr.model(torch.as_tensor(raw.test_x).float() / 255).argmax(1).numpy()
    assert (pred == raw.test_y).all()
    # a second run reads the features from the cache and gets the same answer
    res2 = run_linear(cfg, enc, info, InMemoryTracker(), cache)
    assert res2.info["features"].startswith("disk:") and res2.test == res.test


def test_linear_probe_on_random_labels_is_at_chance():
    """The probe cannot score on test what is not in the features (a check on leakage):
    with labels shuffled independently of the images, test accuracy stays near 1/3."""
    base = _separable()
    rng = np.random.default_rng(1)
    raw = RawDataset(name="shuffled", train_x=base.train_x, train_y=rng.permutation(
        base.train_y), test_x=base.test_x, test_y=rng.permutation(base.test_y),
        num_classes=3, class_names=base.class_names, source="test")
    if "test_shuffled" not in DATASETS:
        DATASETS.register("test_shuffled")(lambda data_dir=None: raw)
    enc, info = build_encoder("random", "small_cnn", 3, seed=0)
    res = run_linear(ProbeConfig(dataset="test_shuffled", device="cpu", probe_trials=3), enc,
                     info, InMemoryTracker())
    assert res.test["accuracy"] < 0.6


def test_finetune_starts_every_trial_from_the_encoder_and_reports_its_checkpoint(monkeypatch):
    import scarcelab.protocols.search as search

    enc, info = build_encoder("random", "small_cnn", 3, seed=7)
    seen = []
    real_init = search.Method.__init__

    def record(self, backbone, num_classes, hp):  # type: ignore[no-untyped-def]
        seen.append({k: v.clone() for k, v in backbone.state_dict().items()})
        real_init(self, backbone, num_classes, hp)

    monkeypatch.setattr(search.Method, "__init__", record)
    cfg = ProbeConfig(dataset=SEPARABLE, encoder="random", protocol="finetune", device="cpu",
                      budget_minutes=1, max_epochs=2, patience=2, batch_size=16,
                      max_steps_per_epoch=3, max_trials=2)
    tr = InMemoryTracker()
    res = run_finetune(cfg, enc, info, tr)
    want = enc.state_dict()
    trial_inits = seen[:2]  # then the reported checkpoint's rebuild
    assert len(tr.trials) == 2 and len(trial_inits) == 2
    for s in trial_inits:
        assert all(torch.equal(s[k], want[k]) for k in want)
    assert tr.study.tags["scarcelab.encoder"] == "random"
    assert tr.study.tags["scarcelab.family"] == "transfer"
    # the test score recomputed from the exported best checkpoint is the study's own
    assert res.test["balanced_accuracy"] == pytest.approx(
        res.info["study_test"]["balanced_accuracy"])
    assert res.test["accuracy"] == pytest.approx(res.info["study_test"]["accuracy"])
    assert res.confusion.sum() == 60
    assert res.split_hash == probe_split(cfg, _separable())["hash"]


def test_bad_protocol_and_method_named():
    from scarcelab.errors import ConfigError

    enc, info = build_encoder("random", "small_cnn", 3)
    with pytest.raises(ConfigError, match="protocol='knn'"):
        run_linear(ProbeConfig(dataset=SEPARABLE, protocol="knn"), enc, info, InMemoryTracker())
    with pytest.raises(ConfigError, match="finetune method='simclr'"):
        run_finetune(ProbeConfig(dataset=SEPARABLE, protocol="finetune", method="simclr"),
                     enc, info, InMemoryTracker())


# -- the command, end to end through an embedded store -------------------------------------
@pytest.fixture
def store(store, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """conftest's store with this module's extras, as its own copy had: $SCARCELAB_DATA in
    tmp_path (nothing the probe command reads comes from the user's data folder) and a 1 s
    pip-requirement inference (below)."""
    monkeypatch.setenv("SCARCELAB_DATA", str(tmp_path / "data"))
    # log_model's pip-requirement inference re-imports the model in a subprocess (~50 s on
    # a loaded 2-core machine); these tests do not read requirements.txt, so let it fall
    # back to MLflow's defaults at once
    monkeypatch.setenv("MLFLOW_REQUIREMENTS_INFERENCE_TIMEOUT", "1")
    return store


def _probe(*args: str) -> str:
    from scarcelab.entrypoints.cli import main

    out = CliRunner().invoke(main, ["probe", "--dataset", SEPARABLE, "--device", "cpu",
                                    "--experiment", "transfer", *args])
    assert out.exit_code == 0, out.output + repr(out.exception)
    return out.output


def test_probe_command_linear_and_finetune(store, tmp_path):
    from scarcelab.tracking.query import load
    from scarcelab.tracking.query.views import transfer

    enc, _ = build_encoder("random", "small_cnn", 3, seed=5)
    weights = str(tmp_path / "enc.pt")
    torch.save(enc.state_dict(), weights)
    out = _probe("--encoder", weights, "--arch", "small_cnn", "--probe-trials", "3")
    assert "test accuracy" in out
    _probe("--encoder", "random", "--protocol", "finetune", "--max-trials", "1",
           "--max-epochs", "1", "--batch-size", "16", "--max-steps-per-epoch", "2",
           "--budget-minutes", "1")
    c = MlflowClient()
    exp = c.get_experiment_by_name("transfer").experiment_id
    runs = c.search_runs([exp], "tags.`scarcelab.task` = 'probe' and "
                         "tags.`scarcelab.role` != 'trial'")
    assert len(runs) == 2
    by = {r.data.tags["scarcelab.protocol"]: r for r in runs}
    assert by["linear"].data.tags["scarcelab.encoder"] == weights
    assert by["finetune"].data.tags["scarcelab.encoder"] == "random"
    assert by["finetune"].data.tags["scarcelab.encoder_method"] == "random"
    for r in runs:
        assert r.info.status == "FINISHED"
        m = r.data.metrics
        assert 0 <= m["test/accuracy"] <= 1 and 0 <= m["test/balanced_accuracy"] <= 1
        arts = {a.path for a in c.list_artifacts(r.info.run_id)}
        assert {"confusion_matrix.png", "confusion_matrix.json"} <= arts
    cm = mlflow.artifacts.load_dict(f"runs:/{by['linear'].info.run_id}/confusion_matrix.json")
    assert np.trace(cm["rows_true_cols_predicted"]) / 60 == pytest.approx(
        by["linear"].data.metrics["test/accuracy"])
    assert "checkpoints" in {a.path for a in c.list_artifacts(by["finetune"].info.run_id)}
    # the linear probe's model takes raw images (issue 39): from them, its own test score
    from scarcelab.data import load_raw
    from scarcelab.metrics import classification_metrics

    raw = load_raw(SEPARABLE)
    out = mlflow.pyfunc.load_model(f"runs:/{by['linear'].info.run_id}/model").predict(
        list(raw.test_x))
    assert classification_metrics(raw.test_y, out.iloc[:, 1:].to_numpy())[
        "balanced_accuracy"] == pytest.approx(by["linear"].data.metrics[
            "test/balanced_accuracy"], abs=1e-12)
    # a segment run of the same encoder (as the segment entry point tags it)
    seg = c.create_run(exp, tags={"scarcelab.role": "segment", "scarcelab.encoder": "random",
                                  "scarcelab.dataset": "consep_patches"})
    c.log_metric(seg.info.run_id, "seg/pq", 0.42)
    c.log_metric(seg.info.run_id, "seg/mpq", 0.21)
    c.set_terminated(seg.info.run_id, "FINISHED")
    assert {r.data.tags["scarcelab.label_fraction"] for r in runs} == {"1"}
    assert {r.data.tags["scarcelab.arch"] for r in runs} == {"small_cnn"}
    # the transfer view: rows = (encoder, arch, protocol, label fraction), columns = tasks
    # (trials left out); the segment run without arch / protocol tags is a row of its own
    view = transfer(load("transfer", store)).set_index(["encoder", "arch", "protocol"])
    assert set(view.index) == {(weights, "small_cnn", "linear"),
                               ("random", "small_cnn", "finetune"), ("random", "", "finetune")}
    assert (view["label_fraction"] == 1.0).all()
    seg_row = view.loc[("random", "", "finetune")]
    assert seg_row["consep_patches seg/pq"] == pytest.approx(0.42)
    assert seg_row["consep_patches seg/mpq"] == pytest.approx(0.21)
    assert seg_row["n_runs"] == 1
    assert np.isnan(view.loc[(weights, "small_cnn", "linear"), "consep_patches seg/pq"])
    assert view.loc[(weights, "small_cnn", "linear"), f"{SEPARABLE} accuracy"] == \
        pytest.approx(by["linear"].data.metrics["test/accuracy"])
    ft = view.loc[("random", "small_cnn", "finetune")]
    assert ft[f"{SEPARABLE} balanced_accuracy"] == pytest.approx(
        by["finetune"].data.metrics["test/balanced_accuracy"])
    assert ft["n_runs"] == 1 and ft["encoder_method"] == "random"


def test_probe_command_bad_encoder_is_one_line(store):
    from scarcelab.entrypoints.cli import main

    out = CliRunner().invoke(main, ["probe", "--dataset", SEPARABLE, "--encoder",
                                    "/nonexistent/w.pt"])
    assert out.exit_code != 0 and "no such file" in out.output


# -- the probe record's tags and keys (mutation sample, docs/mutation.md) ------------------
def test_encoder_tags_leave_an_unknown_arch_empty():
    from scarcelab.protocols.transfer import ProbeConfig, encoder_tags

    tags = encoder_tags(ProbeConfig(encoder="/models/enc.pt"), {})
    assert tags == {"scarcelab.task": "probe", "scarcelab.protocol": "linear",
                    "scarcelab.encoder": "/models/enc.pt", "scarcelab.encoder_arch": "",
                    "scarcelab.encoder_format": "", "scarcelab.encoder_norm": "none",
                    "scarcelab.encoder_fingerprint": "", "scarcelab.encoder_method": "unknown"}


def test_linear_probe_record_keys():
    from scarcelab.models.encoder import build_encoder
    from scarcelab.protocols.transfer import ProbeConfig, run_linear

    enc, info = build_encoder("random", "small_cnn", 3, seed=0)
    t = InMemoryTracker()
    res = run_linear(ProbeConfig(dataset="synthetic_tiny_rgb", device="cpu", probe_trials=1,
                                 probe_max_iter=50), enc, info, t)
    assert t.study.tags["scarcelab.role"] == "probe"
    assert t.study.tags["scarcelab.family"] == "transfer"
    assert t.study.tags["scarcelab.method"] == "linear_probe"
    metrics = {k: (v, s) for k, v, s in t.study.metrics}
    assert set(metrics) == {"val/balanced_accuracy", "probe/C", "time/features_s",
                            "time/fit_s", "time/elapsed_s",
                            *(f"test/{k}" for k in res.test)}
    assert {s for _, s in metrics.values()} == {0}
    assert set(res.info) == {"C", "features", "encoding_key", "time_features_s",
                             "time_fit_s", "time_s"}
    assert res.info["time_fit_s"] == metrics["time/fit_s"][0]
    assert res.info["time_features_s"] == metrics["time/features_s"][0]
    assert res.info["time_s"] == metrics["time/elapsed_s"][0]
    assert res.info["time_fit_s"] + res.info["time_features_s"] <= res.info["time_s"]


def test_label_fraction_is_a_share_of_the_labeled_set():
    """(0, 1]: 1.0 trains on every labeled image; more than all of them is a config error."""
    from scarcelab.errors import ConfigError
    from scarcelab.protocols.transfer import check_label_fraction

    for ok in (1e-3, 0.5, 1.0):
        check_label_fraction(ok)
    for bad in (0.0, -0.1, 1.0001, 1.5, 2.0):
        with pytest.raises(ConfigError, match="label_fraction"):
            check_label_fraction(bad)


SEPARABLE_BINARY = "test_separable_binary_rgb"


def _separable_binary(data_dir: object = None) -> RawDataset:
    """Two classes (healthy dark, diseased bright) told apart by brightness."""
    rng = np.random.default_rng(1)

    def make(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = np.arange(n) % 2
        base = np.array([50.0, 205.0])[y][:, None, None, None]
        x = base + rng.normal(0, 12, (n, 3, 8, 8))
        return np.clip(x, 0, 255).astype(np.uint8), y.astype(np.int64)

    (xtr, ytr), (xte, yte) = make(100), make(40)
    return RawDataset(name=SEPARABLE_BINARY, train_x=xtr, train_y=ytr, test_x=xte, test_y=yte,
                      num_classes=2, class_names=["healthy", "diseased"], source="test")


if SEPARABLE_BINARY not in DATASETS:
    DATASETS.register(SEPARABLE_BINARY)(_separable_binary)


def test_linear_probe_on_a_binary_task_records_its_positive_class():
    """A binary task's linear probe, as the studies do: its positive class (the dataset's
    default, class 1) is tagged by name and recorded in the run's configuration."""
    enc, info = build_encoder("random", "small_cnn", 3, seed=0)
    cfg = ProbeConfig(dataset=SEPARABLE_BINARY, encoder="random", device="cpu",
                      probe_trials=3)
    tr = InMemoryTracker()
    run_linear(cfg, enc, info, tr)
    assert tr.study.tags["scarcelab.positive_class"] == "diseased"
    assert tr.artifacts["config.json"]["positive_class"] == 1
