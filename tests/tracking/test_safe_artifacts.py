"""Nothing fetched from the artifact store runs code (issue 13 item 1): the resume refuses a
crafted ``best.pt`` (a pickle whose unpickling would create a marker file), checkpoints are
plain tensors with a digest recorded in the tracking store, the model is logged as ``pt2``.
Against a real (sqlite) MLflow store."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from scarcelab import tags as T
from scarcelab.tracking.mlflow_tracker import MlflowTracker
from scarcelab.tracking.safe_io import UnsafeArtifact, load_checkpoint, plain, save_checkpoint

MARKER = Path("/tmp/scarcelab-test-pwned-marker")


class Evil:
    """Unpickling this creates MARKER: what an attacker with bucket access would upload."""

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {MARKER}",))


@pytest.fixture
def store(store):  # type: ignore[no-untyped-def]
    """conftest's store with no MARKER before or after: a marker left by another test (or
    a run of this one) would read as a payload that ran."""
    MARKER.unlink(missing_ok=True)
    yield store
    MARKER.unlink(missing_ok=True)


def _dead_study_with(tmp_path: Path, key: str, payload: Path, recorded_sha: str | None) -> str:
    """A study run left RUNNING by a dead process, whose bucket now holds ``payload``."""
    c = MlflowClient()
    exp = c.create_experiment("resume")
    dead = subprocess.Popen(["true"])
    dead.wait()
    tags = {"scarcelab.role": "study", "scarcelab.study_key": key,
            "scarcelab.owner": f"{socket.gethostname()}:{dead.pid}"}
    if recorded_sha:
        tags[T.CHECKPOINT_SHA256] = recorded_sha
    run = c.create_run(exp, tags=tags)
    d = tmp_path / "upload"
    d.mkdir()
    (d / "best.pt").write_bytes(payload.read_bytes())
    c.log_artifact(run.info.run_id, str(d / "best.pt"), "checkpoints")
    return str(run.info.run_id)


@pytest.mark.parametrize("attacker_sets_tag", [False, True])
def test_crafted_checkpoint_is_refused_on_resume(store, tmp_path, capsys, attacker_sets_tag):
    evil = tmp_path / "evil.pt"
    torch.save({"state_dict": {}, "val_balanced_accuracy": 1.0, "trial": 0, "x": Evil()}, evil)
    legit = tmp_path / "legit.pt"
    legit_sha = save_checkpoint({"state_dict": {"w": torch.ones(2)}, "trial": 0,
                                 "val_balanced_accuracy": 0.5}, legit)
    # the tag is in the tracking store (not the bucket); if the attacker could set it too,
    # weights_only=True is the second wall
    sha = hashlib.sha256(evil.read_bytes()).hexdigest() if attacker_sets_tag else legit_sha
    rid = _dead_study_with(tmp_path, "k1", evil, sha)
    t = MlflowTracker(experiment="resume")
    t.experiment = "resume"
    state = t.resume_state("k1")
    assert state is not None and state.best_checkpoint is None
    assert not MARKER.exists(), "the crafted checkpoint ran code"
    assert "refusing the checkpoint" in capsys.readouterr().err
    assert "scarcelab.checkpoint_refused" in MlflowClient().get_run(rid).data.tags


def test_genuine_checkpoint_is_restored(store, tmp_path):
    ck = tmp_path / "best.pt"
    ckpt = {"state_dict": {"w": torch.arange(3.0)}, "probe": None, "trial": 2,
            "val_balanced_accuracy": np.float64(0.75), "hp": {"lr": 0.1, "t": (1, 2)}}
    sha = save_checkpoint(ckpt, ck)
    _dead_study_with(tmp_path, "k2", ck, sha)
    got = MlflowTracker(experiment="resume").resume_state("k2").best_checkpoint
    assert got is not None and got["trial"] == 2 and got["val_balanced_accuracy"] == 0.75
    assert torch.equal(got["state_dict"]["w"], torch.arange(3.0))


def test_checkpoint_without_recorded_digest_is_not_loaded(tmp_path):
    ck = tmp_path / "best.pt"
    save_checkpoint({"a": 1}, ck)
    with pytest.raises(UnsafeArtifact, match="no scarcelab.checkpoint_sha256"):
        load_checkpoint(ck, None)


def test_checkpoints_hold_only_plain_types():
    out = plain({"v": np.float32(0.5), "a": np.arange(3), "l": [np.int64(2)]})
    assert out["v"] == 0.5 and isinstance(out["v"], float)
    assert torch.equal(out["a"], torch.arange(3)) and out["l"] == [2]
    with pytest.raises(TypeError, match=r"checkpoint\['p'\] is a .*LinearProbe"):
        from scarcelab.probe import LinearProbe

        plain({"p": LinearProbe(2)})


def test_study_checkpoint_and_model_load_without_unpickling(store):
    """A real study: its best.pt loads with weights_only=True and matches the recorded
    digest; the model is a pt2 archive (no pickle) that MLflow loads with pickle disallowed."""
    from scarcelab.protocols.search import StudyConfig, run_study

    t = MlflowTracker(experiment="unit")
    run_study(StudyConfig(method="sup", dataset="synthetic_tiny", budget_minutes=0.5,
                          max_epochs=2, patience=2, batch_size=16, max_steps_per_epoch=3,
                          max_trials=1, arch="small_cnn", device="cpu"), t)
    run = MlflowClient().get_run(t.study_run_id)
    path = mlflow.artifacts.download_artifacts(f"runs:/{t.study_run_id}/checkpoints/best.pt")
    ck = load_checkpoint(path, run.data.tags[T.CHECKPOINT_SHA256])
    assert "state_dict" in ck
    model_dir = Path(mlflow.artifacts.download_artifacts(f"runs:/{t.study_run_id}/model"))
    files = {p.relative_to(model_dir).as_posix() for p in model_dir.rglob("*") if p.is_file()}
    assert "data/model.pt2" in files and not any(f.endswith(".pth") for f in files)
    os.environ["MLFLOW_ALLOW_PICKLE_DESERIALIZATION"] = "false"
    try:
        model = mlflow.pytorch.load_model(f"runs:/{t.study_run_id}/model")
    finally:
        del os.environ["MLFLOW_ALLOW_PICKLE_DESERIALIZATION"]
    from scarcelab.data import load_raw

    x = torch.as_tensor(load_raw("synthetic_tiny").test_x[:3]).float() / 255
    assert model(x).shape[0] == 3


def test_pretrained_encoder_in_pickle_format_is_read_without_unpickling(store, monkeypatch):
    """A pickle-format model (older scarcelab, or logged by hand) is read through the
    encoder resolver: tensors only, every pickled class replaced by an inert placeholder
    (tracking/encoders.py, scarcelab/models/encoder.py) — so no opt-in is needed and no code
    from the artifact store runs (a crafted pickle is tested in tests/tracking/test_encoders.py)."""
    from scarcelab.models import create_model
    from scarcelab.models.classifier import ExportedClassifier
    from scarcelab.tracking.encoding_cache import load_pretrained_backbone

    bb = create_model("small_cnn", in_channels=1)
    model = ExportedClassifier(bb, torch.nn.Linear(bb.num_features, 2), ["a", "b"])
    mlflow.set_experiment("pre")  # (an earlier test's study set another store's experiment)
    with mlflow.start_run(tags={"scarcelab.arch": "small_cnn"}) as run:  # as a study's run
        mlflow.pytorch.log_model(model, name="model", serialization_format="pickle")
    got = load_pretrained_backbone(f"runs:/{run.info.run_id}/model")
    want = bb.state_dict()
    assert set(got.state_dict()) == set(want)
    assert all(torch.equal(got.state_dict()[k], want[k]) for k in want)
