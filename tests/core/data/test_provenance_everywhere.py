"""Data provenance for every entry point (issue 13 item 9): the loaders of the newer data
sets record the files they read, and the MLflow tracker logs them for entry points that do
not go through the progress wrapper (probe, segment, tune)."""

from __future__ import annotations

import json

import mlflow
import pytest
from conftest import SHARED_DATA
from mlflow.tracking import MlflowClient

from scarcelab.data import provenance


def test_pathology_crops_and_nuclei_loaders_record_their_files():
    if not (SHARED_DATA / "pathology_crops").is_dir():
        pytest.skip(f"{SHARED_DATA} (the project machines' real data) is not here")
    shared_data = SHARED_DATA
    from scarcelab.data import load_raw
    from scarcelab.data.nuclei import load_nuclei

    provenance.reset()
    load_raw("pathology_crops", str(shared_data / "pathology_crops"))
    load_nuclei("nuclei_cpm15", str(shared_data / "nuclei_cpm15"))
    names = {p["path"].rsplit("/", 1)[-1] for p in provenance.used()}
    assert "consep_nucleus_crops32.npz" in names and "instance_masks.npz" in names
    assert any(n.startswith("image") and n.endswith(".png") for n in names)
    assert all(len(p["sha256"]) == 64 for p in provenance.used())
    provenance.reset()


def test_mlflow_tracker_logs_the_files_a_run_read(tmp_path, monkeypatch):
    from scarcelab.tracking.mlflow_tracker import MlflowTracker

    uri = f"sqlite:///{tmp_path}/m.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("SCARCELAB_SYSTEM_METRICS", "0")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    mlflow.set_tracking_uri(uri)
    f = tmp_path / "data.bin"
    f.write_bytes(b"scarce labels")
    provenance.reset()
    provenance.record(f, role="train")
    t = MlflowTracker(experiment="prov", spool_root=tmp_path / "spool")
    t.start_study("s", {"scarcelab.role": "study"}, {}, {})
    t.end_study("FINISHED")
    run = MlflowClient().get_run(t.study_run_id)
    assert "data.bin" in run.data.tags["scarcelab.data_files"]
    path = MlflowClient().download_artifacts(t.study_run_id, "data_files.json", str(tmp_path))
    files = json.load(open(path))["files"]
    assert files[0]["path"] == str(f.resolve()) and files[0]["roles"] == ["train"]
    assert provenance.used() == []  # the next run records its own
