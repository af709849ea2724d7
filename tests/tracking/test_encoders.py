"""The encoder resolver: random, local weight files (every accepted layout), MLflow sources
through an embedded sqlite store with a real logged study, and files that try to run code."""

from __future__ import annotations

import os

import mlflow
import pytest
import torch
from torch import nn

from scarcelab.errors import ConfigError, DataError
from scarcelab.models import create_model
from scarcelab.models.classifier import ExportedClassifier
from scarcelab.models.encoder import Opaque, build_encoder, fingerprint, read_weights


def _same(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_random_is_seeded_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, info = build_encoder("random", "small_cnn", 3, seed=1)
    assert torch.equal(torch.rand(1), before)  # the global stream was not consumed
    b, _ = build_encoder("random", "small_cnn", 3, seed=1)
    c, _ = build_encoder("random", "small_cnn", 3, seed=2)
    assert _same(a, b) and not _same(a, c)
    assert info["source"] == "random" and info["fingerprint"] == fingerprint(b)


def test_local_backbone_state_dict(tmp_path):
    net = create_model("small_cnn", in_channels=3)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    torch.save(net.state_dict(), tmp_path / "w.pt")
    got, info = build_encoder(str(tmp_path / "w.pt"), "small_cnn", 3)
    assert _same(got, net) and info["format"] == "backbone"
    with pytest.raises(ConfigError, match="arch"):
        build_encoder(str(tmp_path / "w.pt"), None, 3)
    with pytest.raises(DataError, match="do not fit arch 'wrn28_2'"):
        build_encoder(str(tmp_path / "w.pt"), "wrn28_2", 3)


def test_study_checkpoint_with_pickled_probe_reads_without_unpickling(tmp_path):
    """A self-supervised study's checkpoint holds its fitted sklearn probe; the tensors load
    and the probe stays an inert placeholder."""
    import numpy as np

    from scarcelab.methods import get_method
    from scarcelab.probe import LinearProbe

    m = get_method("simclr")(create_model("small_cnn", in_channels=3), 3, {})
    rng = np.random.default_rng(0)
    probe = LinearProbe(3).fit(rng.normal(size=(30, 4)), np.arange(30) % 3,
                               rng.normal(size=(9, 4)), np.arange(9) % 3, rng)
    ckpt = {"state_dict": m.state_dict(), "probe": probe, "arch": "small_cnn",
            "in_channels": 3, "hp": {"lr": 1e-3}, "method": "simclr"}
    torch.save(ckpt, tmp_path / "best.pt")
    with pytest.raises(Exception, match="Weights only load failed"):
        torch.load(tmp_path / "best.pt", weights_only=True)  # why the placeholders exist
    obj = read_weights(tmp_path / "best.pt")
    assert isinstance(obj["probe"], Opaque)
    got, info = build_encoder(str(tmp_path / "best.pt"), None, 3)
    assert _same(got, m.backbone)
    assert info["arch"] == "small_cnn" and info["format"] == "scarcelab-checkpoint"
    with pytest.raises(ConfigError, match="3-channel"):
        build_encoder(str(tmp_path / "best.pt"), None, 1)


def test_pickled_exported_classifier(tmp_path):
    bb = create_model("small_cnn", in_channels=3)
    torch.save(ExportedClassifier(bb, nn.Linear(bb.num_features, 2), ["a", "b"]),
               tmp_path / "model.pth")
    got, info = build_encoder(str(tmp_path / "model.pth"), "small_cnn", 3)
    assert _same(got, bb) and info["format"] == "pickled-module"


def test_torchvision_imagenet_weights(tmp_path):
    from torchvision.models import resnet18

    tv = resnet18(weights=None)
    torch.save(tv.state_dict(), tmp_path / "resnet18-imagenet.pth")
    got, info = build_encoder(str(tmp_path / "resnet18-imagenet.pth"), "resnet18", 3)
    assert info["format"] == "torchvision"  # arch=resnet18 asked for the small-image stem
    assert info["skipped"] == ["net.conv1.weight", "net.fc.bias", "net.fc.weight"]
    own = got.state_dict()
    for k, v in tv.state_dict().items():
        if not k.startswith(("conv1.", "fc.")):
            assert torch.equal(own[f"net.{k}"], v), k
    with pytest.raises(DataError, match="do not fit arch 'small_cnn'"):
        build_encoder(str(tmp_path / "resnet18-imagenet.pth"), "small_cnn", 3)


class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_runs_nothing_and_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"state_dict": _Evil(str(marker)), "arch": "small_cnn"}, tmp_path / "evil.pt")
    with pytest.raises(DataError, match=r"evil\.pt"):
        build_encoder(str(tmp_path / "evil.pt"), "small_cnn", 3)
    assert not marker.exists()
    # the file really is an exploit: an unrestricted load runs it
    torch.load(tmp_path / "evil.pt", weights_only=False)
    assert marker.exists()


def test_not_a_weights_file(tmp_path):
    (tmp_path / "x.pt").write_text("hello")
    with pytest.raises(DataError, match="x.pt"):
        build_encoder(str(tmp_path / "x.pt"), "small_cnn", 3)
    with pytest.raises(ConfigError, match="no such file"):
        build_encoder(str(tmp_path / "absent.pt"), "small_cnn", 3)


# -- MLflow sources ------------------------------------------------------------------------
def _point_at(tmp_path, monkeypatch) -> str:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    # log_model's pip-requirement inference re-imports the model in a subprocess (~50 s on
    # a loaded 2-core machine); these tests do not read requirements.txt, so let it fall
    # back to MLflow's defaults at once
    monkeypatch.setenv("MLFLOW_REQUIREMENTS_INFERENCE_TIMEOUT", "1")
    mlflow.set_tracking_uri(uri)
    return uri


@pytest.fixture
def store(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    yield _point_at(tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def _logged_study(tmp_path_factory):  # type: ignore[no-untyped-def]
    """A real (tiny) self-supervised study logged to its own store: checkpoint and model.
    Built once for the module (a study with its model costs seconds); the tests read it,
    and the one that registers a model is the only one that writes to this store."""
    from scarcelab.protocols.search import StudyConfig, run_study
    from scarcelab.tracking.mlflow_tracker import MlflowTracker

    tmp = tmp_path_factory.mktemp("enc_study")
    with pytest.MonkeyPatch.context() as mp:
        _point_at(tmp, mp)
        tracker = MlflowTracker(experiment="enc")
        res = run_study(StudyConfig(method="simclr", dataset="synthetic_tiny_rgb",
                                    budget_minutes=1, max_epochs=1, patience=1,
                                    unlabeled_batch_size=32, max_steps_per_epoch=2,
                                    max_trials=1, arch="small_cnn", device="cpu",
                                    search="none"), tracker)
    assert res.best_checkpoint is not None
    return tmp, tracker.study_run_id, res.best_checkpoint


@pytest.fixture
def self_study(_logged_study, monkeypatch):  # type: ignore[no-untyped-def]
    """The module's logged study, with this test pointed at its store."""
    tmp, run_id, ckpt = _logged_study
    _point_at(tmp, monkeypatch)
    return run_id, ckpt


def _backbone_of(ckpt):  # type: ignore[no-untyped-def]
    net = create_model("small_cnn", in_channels=3)
    net.load_state_dict({k[len("backbone."):]: v for k, v in ckpt["state_dict"].items()
                         if k.startswith("backbone.")})
    return net


def test_runs_uri_reads_the_study_checkpoint(self_study):
    from scarcelab.tracking.encoders import resolve_encoder

    run_id, ckpt = self_study
    want = _backbone_of(ckpt)
    got, info = resolve_encoder(f"runs:/{run_id}/model", None, 3)
    assert _same(got, want)
    assert info["source"] == f"runs:/{run_id}/model" and info["run_id"] == run_id
    assert info["arch"] == "small_cnn" and info["source_method"] == "simclr"
    assert info["artifact"] == "best.pt"
    got2, _ = resolve_encoder(f"runs:/{run_id}/checkpoints/best.pt", None, 3)
    assert _same(got2, want)
    trial = mlflow.search_runs(filter_string=f"tags.`mlflow.parentRunId` = '{run_id}'",
                               search_all_experiments=True).iloc[0].run_id
    with pytest.raises(DataError, match=f"trial of study run {run_id}"):
        resolve_encoder(f"runs:/{trial}/model", None, 3)


def test_models_uri_and_the_al_loader(self_study):
    from scarcelab.tracking.encoders import resolve_encoder
    from scarcelab.tracking.encoding_cache import load_pretrained_backbone

    run_id, ckpt = self_study
    mlflow.register_model(f"runs:/{run_id}/model", "pathology-encoder")
    got, info = resolve_encoder("models:/pathology-encoder/1", None, 3)
    assert _same(got, _backbone_of(ckpt)) and info["run_id"] == run_id
    assert _same(load_pretrained_backbone(f"runs:/{run_id}/model"), _backbone_of(ckpt))
    with pytest.raises(ConfigError, match="no such registered model"):
        resolve_encoder("models:/pathology-encoder/7", None, 3)


def test_runs_uri_without_checkpoint_reads_the_model_pickle_safely(store, tmp_path):
    """A run with only a pickled model: its tensors, still without running its code."""
    from scarcelab.tracking.encoders import resolve_encoder

    bb = create_model("small_cnn", in_channels=3)
    model = ExportedClassifier(bb, nn.Linear(bb.num_features, 2), ["a", "b"])
    mlflow.set_experiment("enc")
    with mlflow.start_run(tags={"scarcelab.arch": "small_cnn"}) as run:  # MLflow 3 model
        mlflow.pytorch.log_model(model, name="model", serialization_format="pickle")
    got, info = resolve_encoder(f"runs:/{run.info.run_id}/model", None, 3)
    assert _same(got, bb) and info["format"] == "pickled-module"
    d = tmp_path / "m" / "data"  # a model folder stored as plain run artifacts
    d.mkdir(parents=True)
    torch.save(model, d / "model.pth")
    with mlflow.start_run(tags={"scarcelab.arch": "small_cnn"}) as run2:
        mlflow.log_artifacts(str(tmp_path / "m"), "weights")
    got2, _ = resolve_encoder(f"runs:/{run2.info.run_id}/weights", None, 3)
    assert _same(got2, bb)
