"""End to end: ``mlflow run . -e probe`` as a user types it, on the real pathology_crops
set (../shared/data), read back through MLflow: tags, test metrics, confusion matrix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest

from tests.conftest import SHARED_DATA

REPO = Path(__file__).resolve().parents[2]
# `mlflow run` in this venv (MLflow's local env manager, as the README runs it)
LOCAL = ["--env-manager", "local"]
VENV_PATH = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
MLFLOW = Path(sys.executable).parent / "mlflow"


@pytest.mark.e2e
def test_mlflow_run_probe_linear_pathology_crops(tmp_path):
    if not (SHARED_DATA / "pathology_crops").exists():
        pytest.skip("../shared/data/pathology_crops is only on the project machines")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**os.environ, "PATH": VENV_PATH, "MLFLOW_TRACKING_URI": uri,
           "SCARCELAB_DATA": str(tmp_path / "d")}
    env.pop("MLFLOW_RUN_ID", None)
    cmd = [str(MLFLOW), "run", str(REPO), *LOCAL, "-e", "probe", "--experiment-name", "e2e",
           "-P", "encoder=random", "-P", "protocol=linear", "-P", "probe_trials=3",
           "-P", "device=cpu"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["e2e"],
                              filter_string="tags.`scarcelab.task` = 'probe'")
    assert len(runs) == 1
    r = runs.iloc[0]
    assert r["status"] == "FINISHED" and r["tags.scarcelab.encoder"] == "random"
    assert r["tags.scarcelab.dataset"] == "pathology_crops"
    assert r["params.protocol"] == "linear"  # logged by mlflow run itself
    assert 0.25 < r["metrics.test/accuracy"] <= 1.0  # 4 balanced test classes: above chance
    arts = {a.path for a in mlflow.MlflowClient().list_artifacts(r.run_id)}
    assert {"confusion_matrix.png", "split.json", "config.json"} <= arts
