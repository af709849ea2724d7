"""End to end: ``mlflow run . -e semi -P dataset=folder:<path> --env-manager local`` on a
folder of real PNGs written here from PneumoniaMNIST (issue 39): the string parameter
reaches the command unchanged, the study trains on the folder's own unlabeled pool, and
``--folds`` under ``mlflow run`` makes the run MLflow created the folds' parent."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
LOCAL = ["--env-manager", "local"]
VENV_PATH = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
MLFLOW = Path(sys.executable).parent / "mlflow"
SMALL = ["-P", "budget_minutes=0.5", "-P", "max_trials=1", "-P", "max_epochs=1",
         "-P", "max_steps_per_epoch=2", "-P", "device=cpu"]


def _folder(root: Path, medmnist_dir: Path, n_lab: int, n_unl: int, n_test: int) -> None:
    d = np.load(medmnist_dir / "pneumoniamnist.npz")
    p = np.random.default_rng(1).permutation(len(d["train_labels"]))
    x, y = d["train_images"][p], d["train_labels"].reshape(-1)[p]
    names = ("normal", "pneumonia")
    for i in range(n_lab + n_unl):
        f = (root / "labeled" / names[y[i]] / f"l{i}.png" if i < n_lab
             else root / "unlabeled" / f"u{i}.png")
        f.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(x[i]).save(f)
    for k in range(n_test):
        f = root / "test" / names[int(d["test_labels"].reshape(-1)[k])] / f"t{k}.png"
        f.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(d["test_images"][k]).save(f)


def _mlflow_run(tmp_path: Path, entry: str, params: list[str]) -> str:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**os.environ, "PATH": VENV_PATH, "MLFLOW_TRACKING_URI": uri,
           "SCARCELAB_CACHE": str(tmp_path / "cache")}
    env.pop("MLFLOW_RUN_ID", None)
    cmd = [str(MLFLOW), "run", str(REPO), *LOCAL, "-e", entry, "--experiment-name", "own",
           *params, *SMALL]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    mlflow.set_tracking_uri(uri)
    return uri


@pytest.mark.e2e
def test_mlflow_run_semi_on_a_folder(medmnist_dir, tmp_path):
    root = tmp_path / "my images"  # a space: the parameter is quoted, never split
    _folder(root, medmnist_dir, 60, 120, 20)
    _mlflow_run(tmp_path, "semi", ["-P", "method=fixmatch", "-P", f"dataset=folder:{root}"])
    runs = mlflow.search_runs(experiment_names=["own"])
    s = runs[runs["tags.scarcelab.role"] == "study"].iloc[0]
    assert s["status"] == "FINISHED"
    # logged by mlflow run as it quotes it for the shell: one word, not a rewritten path
    assert shlex.split(s["params.dataset"]) == [f"folder:{root}"]
    assert s["tags.scarcelab.dataset"] == f"folder:{root.resolve()}"
    split = mlflow.artifacts.load_dict(f"runs:/{s.run_id}/split.json")
    assert split["unlabeled"] == "given" and split["n_unlabeled"] == 120
    assert split["n_test"] == 20 and split["test"] == "folder"
    assert s["params.data.n_unlabeled_images"] == "120"
    manifest = mlflow.artifacts.load_dict(f"runs:/{s.run_id}/data_manifest.json")
    pool = [f for f in manifest["files"] if f["role"] == "pool"]
    assert len(pool) == 120 and all(f["path"].startswith("unlabeled/") for f in pool)


@pytest.mark.e2e
def test_mlflow_run_folds_make_the_project_run_their_parent(medmnist_dir, tmp_path):
    root = tmp_path / "chest"
    _folder(root, medmnist_dir, 40, 0, 0)
    _mlflow_run(tmp_path, "supervised", ["-P", "method=sup", "-P", f"dataset=folder:{root}",
                                         "-P", "folds=2"])
    runs = mlflow.search_runs(experiment_names=["own"])
    parent = runs[runs["tags.scarcelab.role"] == "folds"]
    studies = runs[runs["tags.scarcelab.role"] == "study"]
    assert len(runs[runs["tags.mlflow.parentRunId"].isna()]) == 1  # only the project run
    assert len(parent) == 1 and parent.iloc[0]["params.folds"] == "2"  # mlflow run's own
    assert len(studies) == 2 and set(studies["tags.mlflow.parentRunId"]) == {parent.iloc[0].run_id}
    assert sorted(studies["tags.scarcelab.fold"]) == ["1/2", "2/2"]
    assert parent.iloc[0]["status"] == "FINISHED"
