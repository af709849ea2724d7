"""``Tracker`` on MLflow: one ``study`` run with nested ``trial`` runs (DESIGN §4.2).

Metrics go out with ``MlflowClient.log_batch`` — one request per epoch and scope, ~50x
cheaper than one ``log_metric`` call per value (see ../shared/ENV.md, "Logging cost").
Checkpoints are ``torch.save`` + ``log_artifact`` (fast); only the final model goes
through ``mlflow.pytorch.log_model`` (~10 s, once per study). Under ``mlflow run`` the
study run *is* the run MLflow Projects created (``MLFLOW_RUN_ID``), so the UI shows the
entry point's parameters and the study's results in one place.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import mlflow
import torch
from mlflow.data.http_dataset_source import HTTPDatasetSource
from mlflow.data.meta_dataset import MetaDataset
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from torch import nn

from scarcelab.tracker import DatasetInfo, Tracker

log = logging.getLogger("scarcelab.tracking")

MAX_PARAM_LEN = 6000
RETRIES = 5


def _retry(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Retry transient tracking failures with exponential backoff (0.5 s ... 8 s)."""
    delay = 0.5
    for attempt in range(RETRIES):
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - the store's errors are not typed uniformly
            if attempt == RETRIES - 1:
                raise
            log.warning("tracking call %s failed (%s); retrying in %.1fs",
                        getattr(fn, "__name__", fn), e, delay)
            time.sleep(delay)
            delay *= 2
    return None


def _param_value(v: Any) -> str:
    s = v if isinstance(v, str) else json.dumps(v, default=str)
    return s[:MAX_PARAM_LEN]


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


class MlflowTracker(Tracker):
    def __init__(self, experiment: str | None = None, tracking_uri: str | None = None) -> None:
        if tracking_uri:
            mlflow.set_tracking_uri(tracking_uri)
        self._client: MlflowClient | None = None  # created lazily: no store is touched
        self.experiment = experiment
        self.study_run_id: str | None = None
        self.trial_run_id: str | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix="scarcelab-")

    @property
    def client(self) -> MlflowClient:
        if self._client is None:
            self._client = MlflowClient()
        return self._client

    # -- runs ---------------------------------------------------------------------
    def start_study(self, name, tags, params, artifacts, dataset=None):  # type: ignore[no-untyped-def]
        if self.experiment and not os.environ.get("MLFLOW_RUN_ID"):
            mlflow.set_experiment(self.experiment)
        run = mlflow.start_run(run_name=None if os.environ.get("MLFLOW_RUN_ID") else name)
        self.study_run_id = run.info.run_id
        all_tags = dict(tags)
        commit = _git_commit()
        if commit and "mlflow.source.git.commit" not in run.data.tags:
            all_tags["mlflow.source.git.commit"] = commit
        # Under `mlflow run` the entry point's raw strings ("default", "''") are logged
        # already and params are immutable: log the resolved value beside them.
        existing = run.data.params
        new_params = [
            Param(k if k not in existing else f"resolved.{k}", _param_value(v))
            for k, v in params.items()
            if k not in existing or existing[k] != _param_value(v)
        ]
        _retry(self.client.log_batch, self.study_run_id, params=new_params,
               tags=[RunTag(k, str(v)) for k, v in all_tags.items()])
        for fname, obj in artifacts.items():
            _retry(mlflow.log_dict, obj, fname)
        if dataset is not None:
            self._log_input(dataset)

    def _log_input(self, d: DatasetInfo) -> None:
        source = HTTPDatasetSource(d.source) if "://" in d.source else HTTPDatasetSource(
            f"file://{d.source}" if d.source.startswith("/") else f"scarcelab://{d.source}")
        ds = MetaDataset(source=source, name=d.name, digest=d.digest)
        _retry(mlflow.log_input, ds, context=d.context)

    def start_trial(self, number, tags, params):  # type: ignore[no-untyped-def]
        run = mlflow.start_run(run_name=f"trial-{number}", nested=True)
        self.trial_run_id = run.info.run_id
        _retry(self.client.log_batch, self.trial_run_id,
               params=[Param(k, _param_value(v)) for k, v in params.items()],
               tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_metrics(self, metrics, step, scope="trial"):  # type: ignore[no-untyped-def]
        run_id = self.trial_run_id if scope == "trial" else self.study_run_id
        if run_id is None:
            raise RuntimeError(f"log_metrics({scope}) with no open {scope} run")
        ts = int(time.time() * 1000)
        batch = [Metric(k, float(v), ts, int(step)) for k, v in metrics.items()]
        _retry(self.client.log_batch, run_id, metrics=batch)

    def log_checkpoint(self, checkpoint, name="best.pt"):  # type: ignore[no-untyped-def]
        assert self.study_run_id is not None
        path = Path(self._tmp.name) / name
        torch.save(checkpoint, path)
        _retry(self.client.log_artifact, self.study_run_id, str(path), "checkpoints")

    def end_trial(self, status, error=None):  # type: ignore[no-untyped-def]
        if error and self.trial_run_id:
            _retry(self.client.set_tag, self.trial_run_id, "scarcelab.error", error[:5000])
        mlflow.end_run(status=status)
        self.trial_run_id = None

    def set_tags(self, tags, scope="study"):  # type: ignore[no-untyped-def]
        run_id = self.study_run_id if scope == "study" else self.trial_run_id
        if run_id:
            _retry(self.client.log_batch, run_id,
                   tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_model(self, model: nn.Module, example: Any) -> None:
        mlflow.pytorch.log_model(model, name="model", serialization_format="pickle",
                                 input_example=example.numpy())

    def end_study(self, status):  # type: ignore[no-untyped-def]
        while mlflow.active_run() is not None and mlflow.active_run().info.run_id != \
                self.study_run_id:
            mlflow.end_run(status="FAILED" if status == "FAILED" else "KILLED")
        mlflow.end_run(status=status)
        self._tmp.cleanup()
