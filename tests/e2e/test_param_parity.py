"""The same tiny study started by ``mlflow run`` and by the ``scarcelab`` console script logs
the same parameter names and values (issue 16, "In the MLflow UI"): a UI filter such as
``params.arch = 'auto'`` or ``params.resolved.arch = 'small_cnn'`` finds both."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest

REPO = Path(__file__).resolve().parents[2]
# `mlflow run` in this venv (MLflow's local env manager, as the README runs it)
LOCAL = ["--env-manager", "local"]
VENV_PATH = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
BIN = Path(sys.executable).parent
SETTINGS = {"method": "sup", "dataset": "synthetic_tiny", "device": "cpu", "max_epochs": "1",
            "batch_size": "16", "max_steps_per_epoch": "2", "max_trials": "1",
            "budget_minutes": "2", "n_labeled": "30"}


def _study_params(uri: str, experiment: str) -> dict[str, str]:
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=[experiment])
    s = runs[runs["tags.scarcelab.role"] == "study"]
    assert len(s) == 1
    row = s.iloc[0]
    return {c[7:]: row[c] for c in runs.columns if c.startswith("params.") and row[c] is not None}


@pytest.mark.e2e
def test_mlflow_run_and_console_script_log_the_same_params(tmp_path) -> None:  # type: ignore[no-untyped-def]
    script = BIN / "scarcelab"
    if not script.exists():
        pytest.skip("the scarcelab console script is not installed")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**os.environ, "PATH": VENV_PATH, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(REPO)}
    env.pop("MLFLOW_RUN_ID", None)
    cmd = [str(BIN / "mlflow"), "run", str(REPO), *LOCAL, "-e", "supervised", "--experiment-name",
           "via-mlflow-run", *[a for k, v in SETTINGS.items() for a in ("-P", f"{k}={v}")]]
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    cli = [str(script), "supervised", "--experiment", "via-console-script",
           *[a for k, v in SETTINGS.items() for a in (f"--{k.replace('_', '-')}", v)]]
    p = subprocess.run(cli, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    a = _study_params(uri, "via-mlflow-run")
    b = _study_params(uri, "via-console-script")
    assert a == b
    assert a["arch"] == "auto" and a["resolved.arch"] == "small_cnn"
    assert a["data_dir"] == "default" and a["set"] == "none"


@pytest.mark.e2e
def test_bad_value_through_mlflow_run_is_the_same_one_line_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {**os.environ, "PATH": VENV_PATH, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db",
           "PYTHONPATH": str(REPO)}
    env.pop("MLFLOW_RUN_ID", None)
    cmd = [str(BIN / "mlflow"), "run", str(REPO), *LOCAL, "-e", "semi", "-P", "budget_minutes=abc"]
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode != 0
    assert "Error: Invalid value for '--budget-minutes': 'abc': not a number" in p.stderr
    assert "Traceback" not in p.stderr.split("Error: Invalid value")[0]
