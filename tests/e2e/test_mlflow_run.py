"""End to end: ``mlflow run . -e semi -P method=fixmatch --env-manager local`` as the
README has users type it (in the checkout's venv: MLflow's local env manager, no env of
its own; issue 27 item 6), on the real BreastMNIST copy, then everything read back through
MLflow: the study, its trials, metric histories, the split, the checkpoint and the model.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

REPO = Path(__file__).resolve().parents[2]
# `mlflow run` in this venv (MLflow's local env manager, as the README runs it)
LOCAL = ["--env-manager", "local"]
VENV_PATH = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
MLFLOW = Path(sys.executable).parent / "mlflow"


@pytest.mark.e2e
def test_mlflow_run_semi_fixmatch_breastmnist(medmnist_dir, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**os.environ, "PATH": VENV_PATH, "MLFLOW_TRACKING_URI": uri,
           "SCARCELAB_DATA": str(medmnist_dir)}
    env.pop("MLFLOW_RUN_ID", None)
    cmd = [str(MLFLOW), "run", str(REPO), *LOCAL, "-e", "semi", "--experiment-name", "e2e",
           "-P", "method=fixmatch", "-P", "budget_minutes=0.4", "-P", "max_trials=2",
           "-P", "max_epochs=3", "-P", "n_labeled=60"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "best val balanced accuracy" in proc.stdout

    mlflow.set_tracking_uri(uri)
    c = MlflowClient()
    runs = mlflow.search_runs(experiment_names=["e2e"])
    study = runs[runs["tags.scarcelab.role"] == "study"]
    trials = runs[runs["tags.scarcelab.role"] == "trial"]
    assert len(study) == 1 and len(trials) >= 1
    s = study.iloc[0]
    assert s["status"] == "FINISHED"
    assert s["tags.scarcelab.method"] == "fixmatch" and s["tags.scarcelab.family"] == "semi"
    assert s["tags.scarcelab.dataset"] == "breastmnist"
    assert s["params.method"] == "fixmatch"  # logged by mlflow run itself
    assert s["params.resolved.n_val"] == "60"  # n_val defaults to n_labeled
    assert set(trials["tags.mlflow.parentRunId"]) == {s.run_id}
    assert 0.0 <= s["metrics.best/val_balanced_accuracy"] <= 1.0
    # best/test is the test score of the val-best epoch, found in that trial's history
    best_trial = trials[trials["tags.scarcelab.trial"] == s["tags.scarcelab.best_trial"]]
    tid = best_trial.iloc[0].run_id
    val = c.get_metric_history(tid, "val/balanced_accuracy")
    test = c.get_metric_history(tid, "test/balanced_accuracy")
    i = int(np.argmax([m.value for m in val]))
    assert s["metrics.best/val_balanced_accuracy"] == pytest.approx(val[i].value)
    assert s["metrics.best/test_balanced_accuracy"] == pytest.approx(test[i].value)
    split = mlflow.artifacts.load_dict(f"runs:/{s.run_id}/split.json")
    assert len(split["labeled"]) == 60 and split["hash"] == s["tags.scarcelab.split_hash"]
    ckpt = torch.load(mlflow.artifacts.download_artifacts(
        f"runs:/{s.run_id}/checkpoints/best.pt"), weights_only=False)
    assert ckpt["method"] == "fixmatch" and ckpt["split_hash"] == split["hash"]
    model = mlflow.pytorch.load_model(f"runs:/{s.run_id}/model")
    data = np.load(medmnist_dir / "breastmnist.npz")
    x = torch.as_tensor(data["test_images"]).float().unsqueeze(1) / 255
    acc = (model(x).argmax(1).numpy() == data["test_labels"].reshape(-1)).mean()
    assert acc == pytest.approx(s["metrics.best/test_accuracy"])
    # the same model from raw files (issue 39): PNGs of the test images, 28 px and 64 px
    from PIL import Image

    pngs = []
    for i, im in enumerate(data["test_images"]):
        pngs.append(str(tmp_path / f"t{i}.png"))
        Image.fromarray(im).save(pngs[-1])
    raw_model = mlflow.pyfunc.load_model(f"runs:/{s.run_id}/model")
    pred = raw_model.predict(pngs).iloc[:, 1:].to_numpy().argmax(1)
    assert (pred == data["test_labels"].reshape(-1)).mean() == pytest.approx(
        s["metrics.best/test_accuracy"])
    big = np.stack([np.asarray(Image.fromarray(im).resize((64, 64))) for im in
                    data["test_images"][:8]])[:, None]
    assert len(raw_model.predict(big)) == 8  # the bare network's guard refused 64 px
    inputs = c.get_run(s.run_id).inputs.dataset_inputs
    assert inputs and inputs[0].dataset.name == "breastmnist"
