"""End to end: ``mlflow run . -e segment`` as a user types it, on the real CoNSeP patches
(a tiny budget), read back through MLflow: test metrics, per-epoch validation, overlays."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

REPO = Path(__file__).resolve().parents[2]
# `mlflow run` in this venv (MLflow's local env manager, as the README runs it)
LOCAL = ["--env-manager", "local"]
VENV_PATH = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
MLFLOW = Path(sys.executable).parent / "mlflow"
SHARED = Path(os.environ.get("SCARCELAB_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.mark.e2e
def test_mlflow_run_segment_consep_patches(tmp_path):
    if not (SHARED / "consep_patches").exists():
        pytest.skip("../shared/data/consep_patches absent")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**os.environ, "PATH": VENV_PATH, "MLFLOW_TRACKING_URI": uri,
           "SCARCELAB_SHARED_DATA": str(SHARED)}
    env.pop("MLFLOW_RUN_ID", None)
    cmd = [str(MLFLOW), "run", str(REPO), *LOCAL, "-e", "segment", "--experiment-name", "e2e-seg",
           "-P", "max_epochs=2", "-P", "steps_per_epoch=2", "-P", "batch_size=2",
           "-P", "crop=32", "-P", "window=64", "-P", "scale=0.25", "-P", "max_train_tiles=4",
           "-P", "max_val_tiles=2", "-P", "max_test_tiles=3", "-P", "device=cpu"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "test PQ" in proc.stdout
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["e2e-seg"])
    assert len(runs) == 1
    run = runs.iloc[0]
    assert run["status"] == "FINISHED" and run["params.encoder"] == "random"
    assert 0.0 <= run["metrics.seg/pq"] <= 1.0 and 0.0 <= run["metrics.seg/mpq"] <= 1.0
    c = MlflowClient()
    assert len(c.get_metric_history(run.run_id, "seg/val_pq")) == 2
    assert len(c.list_artifacts(run.run_id, "overlays")) == 3
