"""``Tracker`` on MLflow: one ``study`` run with nested ``trial`` runs (DESIGN §4.2).

Metrics go out with ``MlflowClient.log_batch`` — one request per epoch and scope, ~50x
cheaper than one ``log_metric`` call per value (see ../shared/ENV.md, "Logging cost"; the
numbers for this stack are in docs/tracking.md). Checkpoints are ``torch.save`` of plain
tensors + ``log_artifact`` (fast) with their SHA-256 as a run tag; only the final model is
logged as an MLflow model (once per study): an image classifier as the raw-image model of
``tracking/pyfunc_model.py`` (pt2 network + its preprocessing), anything else through
``mlflow.pytorch.log_model``, both in the ``pt2`` format. Nothing read
back from a store is unpickled (tracking/safe_io.py, docs/threat-model.md). Under
``mlflow run`` the study run *is* the run MLflow Projects
created (``MLFLOW_RUN_ID``), so the UI shows the entry point's parameters and the study's
results in one place.

Everything after the study run exists goes through a :class:`~tracking.spool.Spool`: if
the tracking server is down, training goes on and the records wait on local disk, in
order, until it is back (or are printed as a folder to replay). Metric, parameter and tag
batches go out on the spool's delivery thread (batched every 2 s for a remote server), so
the training thread does not wait for the store (``SCARCELAB_TRACKING_THREAD=0``: it
does). The client API is used throughout instead of MLflow's fluent "active run" stack,
because an operation that must wait in a spool cannot depend on process-global state.

Resuming (``resume_state``): the study run carries ``scarcelab.study_key`` and its owner
(``host:pid``); a RUNNING study run of the same key whose owner is dead (or one a spool
replay closed FAILED, tag ``scarcelab.ended_by_replay``, made RUNNING again) is reattached, its
best checkpoint downloaded from the artifact store (and loaded only if its digest matches
the recorded one) and its spent time read back.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import mlflow
import torch
from mlflow.data.http_dataset_source import HTTPDatasetSource
from mlflow.data.meta_dataset import MetaDataset
from mlflow.entities import DatasetInput, InputTag, Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import (
    MLFLOW_DATASET_CONTEXT,
    MLFLOW_GIT_COMMIT,
    MLFLOW_PARENT_RUN_ID,
    MLFLOW_RUN_NAME,
    MLFLOW_RUN_NOTE,
)
from torch import nn

from scarcelab import tags as T
from scarcelab.errors import ScarcelabError
from scarcelab.models.classifier import ExportedClassifier
from scarcelab.models.image_input import InputSpec
from scarcelab.redaction import hide_mlflow_links, redact
from scarcelab.tracker import DatasetInfo, ResumeState, Tracker
from scarcelab.tracking import experiment_kind, pyfunc_model
from scarcelab.tracking.run_views import RunViews
from scarcelab.tracking.safe_io import (
    UnsafeArtifact,
    check_exported,
    export_model,
    load_checkpoint,
    load_exported,
    save_checkpoint,
)
from scarcelab.tracking.spool import (
    Spool,
    is_remote,
    is_transient,
    leftovers,
    replay,
)
from scarcelab.tracking.spool import _owner_alive as _spool_owner_alive

log = logging.getLogger("scarcelab.tracking")

MAX_PARAM_LEN = 6000
RETRIES = 5
FLUSH_TIMEOUT_S = float(os.environ.get("SCARCELAB_SPOOL_FLUSH_S", "60"))
OWNER = f"{socket.gethostname()}:{os.getpid()}"

# A dead server must cost seconds, not MLflow's default ~2 minutes of backoff per call:
# the spool retries later anyway. Users can still override these.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")  # int only
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")


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


def _find_by_op_id(client: MlflowClient, experiment_id: str, op_id: str) -> str | None:
    """The run an earlier delivery of this spooled ``create_run`` made, if any."""
    runs = client.search_runs([experiment_id], f"tags.`{T.SPOOL_OP}` = '{op_id}'",
                              max_results=1)
    return str(runs[0].info.run_id) if runs else None


def deliver_op(op: dict[str, Any], ids: dict[str, str]) -> str | None:
    """Perform one spooled operation against the current tracking URI; ``ids`` maps the
    tracker's run keys to run ids (a run created during an outage gets its id here).

    Idempotent for a re-sent operation (``_replay``): a run or model that an earlier
    delivery of the same operation (``_id``) created is found by its tag, not made twice."""
    client = MlflowClient()
    kind = op["op"]
    op_id = op.get("_id")
    if kind == "create_run":
        tags = dict(op["tags"])
        if op.get("parent"):
            tags[MLFLOW_PARENT_RUN_ID] = ids[op["parent"]]
        if op_id:
            tags[T.SPOOL_OP] = op_id
            if op.get("_replay"):
                found = _find_by_op_id(client, op["experiment_id"], op_id)
                if found:
                    return found
        run = client.create_run(op["experiment_id"], start_time=op["start_time"], tags=tags,
                                run_name=op["run_name"])
        return str(run.info.run_id)
    run_id = ids[op["key"]]
    if kind == "log_batch":
        client.log_batch(run_id,
                         metrics=[Metric(k, v, ts, s) for k, v, ts, s in op.get("metrics", [])],
                         params=[Param(k, v) for k, v in op.get("params", [])],
                         tags=[RunTag(k, v) for k, v in op.get("tags", [])])
    elif kind == "log_artifact":
        if op.get("name") and Path(op["path"]).name != op["name"]:
            # a spooled copy has a numbered name; the artifact keeps the one asked for
            with tempfile.TemporaryDirectory() as d:
                dst = Path(d) / op["name"]
                shutil.copyfile(op["path"], dst)
                client.log_artifact(run_id, str(dst), op.get("artifact_path"))
        else:
            client.log_artifact(run_id, op["path"], op.get("artifact_path"))
    elif kind == "log_model":
        _deliver_model(client, op, run_id)
    elif kind == "register_model":
        # registered from the run's logged model; the registry keeps the lineage
        mlflow.register_model(f"runs:/{run_id}/model", op["name"])
    elif kind == "terminate":
        client.set_terminated(run_id, op["status"], end_time=op["end_time"])
    elif kind == "note_append":  # idempotent: a line already in the description stays one
        note = client.get_run(run_id).data.tags.get(MLFLOW_RUN_NOTE, "")
        if op["line"] not in note:
            client.set_tag(run_id, MLFLOW_RUN_NOTE, f"{note}\n\n{op['line']}" if note
                           else op["line"])
    else:
        raise ValueError(f"unknown spool operation {kind!r}")
    return None


def _deliver_model(client: MlflowClient, op: dict[str, Any], run_id: str) -> None:
    """Log the exported model in MLflow's ``pt2`` format (no pickle: DESIGN §4.4); an
    image classifier (``spec`` in the op) as the raw-image model of
    ``tracking/pyfunc_model.py``, from the spooled archive as it is."""
    exp_id = client.get_run(run_id).info.experiment_id
    op_id = op.get("_id")
    if op_id and op.get("_replay"):
        done = mlflow.search_logged_models(
            experiment_ids=[exp_id], output_format="list",
            filter_string=f"tags.`{T.SPOOL_OP}` = '{op_id}'")
        if done:
            return
    if op.get("spec"):
        check_exported(op["path"])  # copied into the model unread: checked, not loaded
        _log_classifier(Path(op["path"]), InputSpec.from_json(op["spec"]), run_id, exp_id,
                        op.get("metadata") or None, {T.SPOOL_OP: op_id} if op_id else None)
        return
    module = load_exported(op["path"]).module()
    example = torch.load(op["example_path"], map_location="cpu", weights_only=True)
    _log_pt2(module, example, run_id, exp_id, op.get("metadata") or None,
             {T.SPOOL_OP: op_id} if op_id else None)


def model_requirements() -> list[str]:
    """The pip requirements of a logged pt2 model, pinned to this environment.

    Given to MLflow instead of letting it infer them: inference starts a second Python that
    imports MLflow and torch and loads the model to see what it imports — 38-43 s of the
    77 s the README's study spent "logging the selected model" on this 2-core machine
    under load (bench/study_overhead.py, docs/performance.md). Loading a pt2 model needs
    torch, and MLflow's pyfunc loader numpy, pandas and cloudpickle (mlflow itself is
    added by MLflow): the list that inference found here, minus tqdm, a transitive import
    nothing of the model needs."""
    from importlib.metadata import PackageNotFoundError, version

    from mlflow.pytorch import get_default_pip_requirements
    from packaging.version import Version

    out = list(get_default_pip_requirements())  # torch, cloudpickle
    have = {r.split("==")[0].lower() for r in out}
    for dist in ("numpy", "pandas"):
        if dist not in have:
            try:
                out.append(f"{dist}=={Version(version(dist)).public}")
            except PackageNotFoundError:
                out.append(dist)
    return out


def _log_pt2(module: nn.Module, example: torch.Tensor, run_id: str, experiment_id: str,
             metadata: dict[str, Any] | None, tags: dict[str, str] | None) -> None:
    # the logged-model entity is created in the *current* experiment, and `runs:/<id>/model`
    # is looked up in the run's experiment: make them the same
    from mlflow.pytorch import log_model

    mlflow.set_experiment(experiment_id=experiment_id)
    log_model(module, name="model", serialization_format="pt2",
              input_example=example.numpy(), run_id=run_id, metadata=metadata, tags=tags,
              pip_requirements=model_requirements())


def _log_classifier(network: Path, spec: InputSpec, run_id: str, experiment_id: str,
                    metadata: dict[str, Any] | None, tags: dict[str, str] | None) -> None:
    """An image classifier's model: the exported network plus its preprocessing, so that
    ``mlflow.pyfunc`` predicts on raw images (``tracking/pyfunc_model.py``)."""
    mlflow.set_experiment(experiment_id=experiment_id)  # as in _log_pt2
    pyfunc_model.log_model(network, spec, run_id,
                           pyfunc_model.requirements(model_requirements()), metadata, tags)


def _classifier_spec(model: nn.Module, example: torch.Tensor) -> InputSpec | None:
    """The raw-image contract of an image classifier; None for any other module (a
    segmentation network, a test's stand-in), which is logged as the bare network."""
    if isinstance(model, ExportedClassifier) and example.ndim == 4:
        return InputSpec.of(model, example)
    return None


_GENERATED_NAME = re.compile(r"^[a-z]+-[a-z]+-\d{1,4}$")


def _generated_name(run_name: str | None) -> bool:
    """Whether a run name is MLflow's random one (``agreeable-swan-628``: adjective, noun,
    number; ``mlflow.utils.name_utils``), i.e. nobody chose it."""
    return not run_name or bool(_GENERATED_NAME.match(run_name))


def _experiment_id(name: str | None) -> str:
    """The experiment a new study goes to: ``name``, else MLflow's env vars, else Default."""
    client = MlflowClient()
    name = name or os.environ.get("MLFLOW_EXPERIMENT_NAME")
    if name:
        exp = client.get_experiment_by_name(name)
        if exp:
            return str(exp.experiment_id)
        try:
            return str(client.create_experiment(name, tags=experiment_kind.creation_tags()))
        except MlflowException as e:
            # Two workers starting together both saw no experiment; the second create loses
            # the race. The experiment now exists: use it.
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
            log.info("experiment %s was created concurrently (%s)", name, e.error_code)
            return str(exp.experiment_id)
    return os.environ.get("MLFLOW_EXPERIMENT_ID") or "0"


def current_experiment_id(client: MlflowClient, name: str | None) -> str:
    """The experiment of the run ``mlflow run`` created (``MLFLOW_RUN_ID``), else
    :func:`_experiment_id`'s: where this process's records go."""
    if os.environ.get("MLFLOW_RUN_ID"):
        return str(client.get_run(os.environ["MLFLOW_RUN_ID"]).info.experiment_id)
    return _experiment_id(name)


def _export_failed(tracker: Any, e: BaseException) -> None:
    """The study's results stand without the model: say so on the run and the terminal."""
    msg = (f"the final model could not be exported with torch.export ({type(e).__name__}: "
           f"{str(e)[:300]}); it is not logged (the best checkpoint is). A pickled "
           "model is not logged instead: it would run code when loaded")
    log.error(msg)
    print(f"[scarcelab] {msg}", file=sys.stderr, flush=True)
    tracker._submit({"op": "log_batch", "key": "study",
                     "tags": [[T.MODEL_EXPORT_ERROR, msg[:5000]]]})


def replay_folder(folder: Path) -> bool:
    """Deliver a spool folder (``tracking.spool.replay``) and then, if its writer has
    ended, close the runs it left RUNNING (:func:`close_left_running`). True when
    everything was delivered."""
    try:
        st = json.loads((Path(folder) / "state.json").read_text())
    except (OSError, ValueError):
        st = None  # gone (delivered meanwhile) or unreadable: replay says which
    ids: dict[str, str] = {}
    done = replay(folder, deliver_op, ids)
    if done and isinstance(st, dict) and not _spool_owner_alive(st):
        close_left_running(ids, int(st.get("pid", 0)))
    return done


def close_left_running(ids: dict[str, str], pid: int) -> list[str]:
    """The runs of a dead writer's spool that are still RUNNING once its records are
    delivered, closed FAILED with tag ``scarcelab.ended_by_replay`` and the reason in
    ``scarcelab.error`` (if none is there); returns their ids. Issue 42 item 9: a study
    killed during an outage stayed RUNNING with its trial after the replay — for ever,
    unless the same command was resumed, which now reopens such a study run
    (:meth:`MlflowTracker.resume_state`). Runs whose end was delivered are left as they
    are. Best effort: a run that cannot be closed now is left to the resume."""
    client = MlflowClient()
    writer = f"{socket.gethostname()}:{pid}"
    reason = (f"the process that wrote this run ({writer}) ended before closing it; its "
              "spooled records were delivered by a replay")
    closed = []
    for key in sorted(ids, key=lambda k: k != "study"):
        try:
            run = client.get_run(ids[key])
            owner = run.data.tags.get(T.OWNER, "")
            if run.info.status != "RUNNING" or (owner and owner != writer):
                continue  # ended, or taken over by another process (a resume) since
            tags = [RunTag(T.ENDED_BY_REPLAY, "true")]
            if T.ERROR not in run.data.tags:
                tags.append(RunTag(T.ERROR, reason))
            client.log_batch(ids[key], tags=tags)
            client.set_terminated(ids[key], "FAILED")
            closed.append(ids[key])
        except Exception as e:  # noqa: BLE001 - the resume closes what is left
            log.warning("could not close run %s left RUNNING: %s", ids[key], e)
    if closed:
        print(f"[scarcelab] closed FAILED {len(closed)} run(s) that their ended process "
              f"left RUNNING (tag {T.ENDED_BY_REPLAY}): {', '.join(closed)}", file=sys.stderr,
              flush=True)
    return closed


def replay_leftovers(uri: str | None = None, root: Path | None = None) -> None:
    """Deliver the spool folders that ended processes left for this server, and mark the
    runs whose records they held in memory only (``tracking.spool.lost_marks``). Done on
    every start and, before anything is read, on every resume: a resumed study must see
    the records that were still on their way, or it would redo finished trials."""
    uri = uri or mlflow.get_tracking_uri()
    for d in leftovers(uri, root):
        try:
            ok = replay_folder(d)
        except Exception as e:  # noqa: BLE001 - a broken old spool must not stop a study
            ok = False
            log.warning("could not replay %s: %s", d, e)
        print(f"[scarcelab] spool {d} left by an ended process: "
              f"{'delivered' if ok else 'still pending'}", file=sys.stderr, flush=True)


LOST_TAGS = (T.RECORDS_LOST, T.TRIALS_LOST, T.EPOCHS_LOST)


class TrackingUnavailable(ScarcelabError):
    """The remote tracking server does not answer (or refuses us) at the start of a command."""


def check_tracking_server(uri: str | None = None) -> None:
    """Refuse, in one line and before any data is loaded, to start against a remote tracking
    server that does not answer.

    The spool keeps a study going through an outage *after* its run exists; a study that
    cannot even create its run (or look up the one it should resume) would otherwise end in
    a traceback minutes later, or silently duplicate a study it could not see. Local stores
    (``sqlite:``, a folder) need no check."""
    uri = uri or mlflow.get_tracking_uri()
    from scarcelab.tracking.store_check import check_store

    check_store(uri)  # a scheme, driver, database server, sqlite path or disk that fails
    if not is_remote(uri):
        return
    try:
        MlflowClient(uri).search_experiments(max_results=1)
    except Exception as e:  # noqa: BLE001 - classified below, reported in one line
        from scarcelab.tracking.spool import http_status

        status = http_status(e) if not is_transient(e) else None
        why = (f"refused the request (HTTP {status}: check MLFLOW_TRACKING_USERNAME / "
               "MLFLOW_TRACKING_PASSWORD)" if status in (401, 403) else
               f"does not answer ({type(e).__name__})" if is_transient(e) else
               f"failed ({type(e).__name__}: {str(e).splitlines()[0][:200]})")
        raise TrackingUnavailable(
            f"tracking server {redact(uri)} {why}; nothing was started. Start it (scripts/stack "
            "start), or point MLFLOW_TRACKING_URI elsewhere (unset: a local sqlite store)."
            + _waiting_spools(uri)) from None


def _waiting_spools(uri: str) -> str:
    """What the refusal adds when earlier studies left records for this server (issue 42
    item 9: it said nothing, and the user had to find the spool folders): the exact replay
    command for them, to run once the server is back."""
    try:
        left = leftovers(uri)
    except OSError:
        return ""
    if not left:
        return ""
    return (f" Records of earlier studies wait for it in {len(left)} spool folder"
            f"{'s' if len(left) > 1 else ''}: once it is back, deliver them with `python -m "
            f"scarcelab.tracking.spool replay {' '.join(shlex.quote(str(d)) for d in left)}` "
            "(the next study against it does it too).")


class MlflowTracker(RunViews, Tracker):
    def __init__(self, experiment: str | None = None, tracking_uri: str | None = None,
                 spool_root: Path | None = None) -> None:
        if tracking_uri:
            mlflow.set_tracking_uri(tracking_uri)
        hide_mlflow_links(mlflow.get_tracking_uri())  # its run links would show a password
        self._client: MlflowClient | None = None  # created lazily: no store is touched
        self.experiment = experiment
        self.study_run_id: str | None = None
        self.trial_run_id: str | None = None
        self._trial_key: str | None = None
        self._trial_number, self._trial_text = -1, ""  # the open trial's, for its description
        self._resume_run: str | None = None
        self._attach_run: str | None = None  # attach_study: continue this very run
        self._orphans: list[Any] = []  # trial runs a dead process left RUNNING (resume)
        self._spool_root = spool_root
        self._lost_line: str | None = None  # the continued run lost records: say so again
        self.spool: Spool | None = None
        self.spool_left: Path | None = None  # set when end_study could not deliver
        self._tmp = tempfile.TemporaryDirectory(prefix="scarcelab-")
        self._n = 0
        self._label: dict[str, Any] = {"run_name": None, "tags": {}, "description": None}

    def set_identity(self, run_name: str | None = None, tags: dict[str, str] | None = None,
                     description: str | None = None) -> None:
        """The user's name, tags and description for the next study run (``--run-name``,
        ``--tags``, ``--description``); the name also prefixes its trial runs."""
        self._label = {"run_name": run_name or None, "tags": dict(tags or {}),
                       "description": description or None}

    @property
    def client(self) -> MlflowClient:
        if self._client is None:
            from scarcelab.tracking.store_check import open_store

            open_store()  # one line, not MLflow's traceback; a new sqlite file's tables
            self._client = MlflowClient()  # made under a lock (studies started together)
        return self._client

    # -- resume ---------------------------------------------------------------------------
    def _study_runs(self, key: str, role: str, extra: str = "", status: str = "RUNNING"
                    ) -> list[Any]:
        exp = current_experiment_id(self.client, self.experiment)
        flt = (f"tags.`{T.STUDY_KEY}` = '{key}' and tags.`{T.ROLE}` = '{role}' "
               f"and attributes.status = '{status}'{extra}")
        return list(_retry(self.client.search_runs, [exp], flt, max_results=1000,
                           order_by=["attributes.start_time DESC"]))

    @staticmethod
    def _owner_dead(owner: str) -> bool:
        host, _, pid = owner.rpartition(":")
        return host == socket.gethostname() and pid.isdigit() and \
            int(pid) != os.getpid() and not os.path.exists(f"/proc/{pid}")

    def resume_state(self, study_key: str) -> ResumeState | None:
        mine = os.environ.get("MLFLOW_RUN_ID")
        self._replay_leftovers(mlflow.get_tracking_uri())  # what the dead one still had
        # a dead study's run is RUNNING, or FAILED by the replay of its spool (which closes
        # what a dead writer left RUNNING): either is continued
        ended = f" and tags.`{T.ENDED_BY_REPLAY}` = 'true'"
        for run in sorted(self._study_runs(study_key, "study") + self._study_runs(
                study_key, "study", ended, status="FAILED"),
                key=lambda r: -r.info.start_time):
            if run.info.run_id == mine or not self._owner_dead(
                    run.data.tags.get(T.OWNER, "")):
                continue
            rid = run.info.run_id
            ckpt = self._restore_checkpoint(run)
            hist = self.client.get_metric_history(rid, "best/val_balanced_accuracy")
            elapsed = self.client.get_metric_history(rid, "time/elapsed_s")
            self._resume_run = rid
            # Its process is dead, so none of its trials can still be running; they are
            # closed by close_orphan_trials once the search has the Optuna states.
            under = f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{rid}'"
            self._orphans = list(_retry(
                self.client.search_runs, [run.info.experiment_id],
                f"{under} and attributes.status = 'RUNNING'")) + list(_retry(
                self.client.search_runs, [run.info.experiment_id],
                f"{under} and attributes.status = 'FAILED'{ended}"))
            print(f"[scarcelab] resuming study run {rid} (its process "
                  f"{run.data.tags.get(T.OWNER)} died)", file=sys.stderr, flush=True)
            return ResumeState(
                optuna_study=run.data.tags.get(T.OPTUNA_STUDY, study_key),
                elapsed_s=max((m.value for m in elapsed), default=0.0),
                global_epoch=max((m.step for m in hist), default=-1) + 1,
                best_checkpoint=ckpt, same_record=not mine)
        return None

    def _restore_checkpoint(self, run: Any) -> dict[str, Any] | None:
        """The dead study's best checkpoint — only if its digest is the one it recorded
        (``scarcelab.checkpoint_sha256``), and read with ``weights_only=True``. A file that
        fails either check is refused loudly and the study continues without it."""
        from mlflow.artifacts import download_artifacts

        rid = run.info.run_id
        try:
            path = download_artifacts(
                run_id=rid, artifact_path="checkpoints/best.pt", dst_path=self._tmp.name)
        except Exception as e:  # noqa: BLE001 - no checkpoint yet is a normal case
            log.info("no checkpoint to restore from run %s (%s)", rid, e)
            return None
        try:
            return load_checkpoint(path, run.data.tags.get(T.CHECKPOINT_SHA256))
        except UnsafeArtifact as e:
            msg = (f"refusing the checkpoint of study run {rid}: {e}. The study continues "
                   "without its best-so-far checkpoint (nothing from the file was loaded).")
            log.error(msg)
            print(f"[scarcelab] {msg}", file=sys.stderr, flush=True)
            _retry(self.client.set_tag, rid, T.CHECKPOINT_REFUSED, str(e)[:5000])
            return None

    def close_orphan_trials(self, completed: set[int]) -> None:
        self.flush()  # direct client calls below: after what is queued
        for t in self._orphans:
            number = t.data.tags.get(T.TRIAL, "")
            if number.isdigit() and int(number) in completed:
                _retry(self.client.set_tag, t.info.run_id, T.RECONCILED,
                       "the process died after Optuna recorded this trial as complete and "
                       "before this run was closed; closed as FINISHED on resume")
                _retry(self.client.set_terminated, t.info.run_id, "FINISHED")
            else:
                _retry(self.client.set_tag, t.info.run_id, T.ERROR,
                       "the process running this trial died")
                _retry(self.client.set_terminated, t.info.run_id, "FAILED")
        self._orphans = []

    def mark_trials_failed(self, study_key: str, numbers: list[int], reason: str) -> None:
        wanted = {str(n) for n in numbers}
        self.flush()
        for run in self._study_runs(study_key, "trial"):
            if run.data.tags.get(T.TRIAL) in wanted:
                _retry(self.client.set_tag, run.info.run_id, T.ERROR, reason)
                _retry(self.client.set_terminated, run.info.run_id, "FAILED")

    def _take_over(self, dead: str, new: str) -> None:
        """The run ``new`` continues study run ``dead`` (``mlflow run`` made a new run for
        the re-run): ``new`` gets ``dead``'s study-level series (``best/*``, ``time/*``,
        every step, with their timestamps; the resumed search logs its next epochs after
        them), and ``dead``'s trial runs move under ``new`` (tag ``scarcelab.moved_from``).
        Otherwise a study resumed with nothing left to train had no ``best/*`` of its own
        and was missing from the leaderboard, and every view that groups trials by their
        parent saw them under a FAILED run. Per-process system metrics
        stay where they were measured."""
        old = _retry(self.client.get_run, dead)
        batch: list[Metric] = []
        for key in sorted(old.data.metrics):
            if key.startswith("system/"):
                continue
            for m in _retry(self.client.get_metric_history, dead, key):
                batch.append(Metric(key, m.value, m.timestamp, m.step))
        for i in range(0, len(batch), 1000):  # MLflow's per-request metric limit
            _retry(self.client.log_batch, new, metrics=batch[i:i + 1000])
        kids = _retry(self.client.search_runs, [old.info.experiment_id],
                      f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{dead}'", max_results=50_000)
        for kid in kids:
            _retry(self.client.log_batch, kid.info.run_id, tags=[
                RunTag(MLFLOW_PARENT_RUN_ID, new), RunTag(T.MOVED_FROM, dead)])
        if batch or kids:
            log.info("study run %s continues %s: %d metric points and %d trial runs moved",
                     new, dead, len(batch), len(kids))

    def _carry_lost(self, continued: str, all_tags: dict[str, Any], moved: bool) -> None:
        """A continued study run that lost records (marked by the spool replay)
        keeps saying so: its description is rewritten at the end of the study, so
        the line is appended again then (``end_study``); a new run that takes the study
        over gets the tags too."""
        tags = _retry(self.client.get_run, continued).data.tags
        line = tags.get(T.RECORDS_LOST)
        if not line:
            return
        self._lost_line = line if not moved else f"Study run `{continued}`: {line}"
        if moved:
            all_tags.update({k: tags[k] for k in LOST_TAGS if k in tags})
            all_tags[T.RECORDS_LOST] = self._lost_line
        print(f"[scarcelab] study run {continued}: {line}", file=sys.stderr, flush=True)

    def attach_study(self, run_id: str) -> None:
        """Make the next ``start_study`` continue the existing study run ``run_id`` (its
        new trial runs become its children), even under ``mlflow run``: the run MLflow
        Projects created for this process is then only a launcher, tagged
        ``scarcelab.role=tune_resume`` and linked both ways (``scarcelab.resumes`` /
        ``scarcelab.resumed_by``). Used to continue a study's final retraining
        (``tracking.tune_resume``), whose results belong on the study they complete."""
        self._attach_run = run_id

    # -- runs ---------------------------------------------------------------------------
    def start_study(self, name: str, tags: dict[str, str], params: dict[str, Any],
                    artifacts: dict[str, Any], dataset: DatasetInfo | None = None) -> None:
        if T.DATA_FILES not in tags:  # entry points without the progress wrapper
            from scarcelab.data import provenance

            files = provenance.used()
            provenance.reset()  # the next run of this process records its own files
            if files:
                artifacts = {**artifacts, "data_files.json": {"files": files}}
                tags = {**tags, T.DATA_FILES: provenance.summary(files)}
        from mlflow.tracking.context.registry import resolve_tags

        name = self._label["run_name"] or name
        tags = {**self._label["tags"], **tags}
        if self._label["description"]:
            self._rv()["user_description"] = self._label["description"]
        project_run = os.environ.get("MLFLOW_RUN_ID")
        launcher = None
        if self._attach_run:
            run = _retry(self.client.get_run, self._attach_run)
            if project_run and project_run != self._attach_run:
                launcher = project_run
        elif project_run:
            run = _retry(self.client.get_run, project_run)
        elif self._resume_run:
            run = _retry(self.client.get_run, self._resume_run)
            self._reopen(run)
        else:
            exp = _experiment_id(self.experiment)
            run = _retry(self.client.create_run, exp, tags=resolve_tags({}), run_name=name)
        study_run_id: str = run.info.run_id
        self.study_run_id = study_run_id
        self._experiment_id = run.info.experiment_id
        # Default, a sweep's or a user-made experiment: open on the runs in MLflow 3's UI
        experiment_kind.mark_classic(self.client, self._experiment_id)
        all_tags = {**tags, T.OWNER: OWNER}
        if (project_run and run.info.run_id == project_run and not self._resume_run
                and (self._label["run_name"] or _generated_name(run.info.run_name))):
            # `mlflow run` named it at random (agreeable-swan-628): the CLI's name instead;
            # a name given with `mlflow run --run-name` is kept
            all_tags[MLFLOW_RUN_NAME] = name
        commit = _git_commit()
        if commit and MLFLOW_GIT_COMMIT not in run.data.tags:
            all_tags[MLFLOW_GIT_COMMIT] = commit
        if launcher:
            all_tags[T.RESUMED_BY] = launcher
            _retry(self.client.log_batch, launcher, tags=[
                RunTag(T.ROLE, "tune_resume"),
                RunTag(T.RESUMES, self.study_run_id),
                RunTag(MLFLOW_RUN_NOTE, "Continues the final retraining of study run "
                       f"`{self.study_run_id}`; its retrain runs and results are there.")])
        continued = self._attach_run or self._resume_run
        if continued:
            self._carry_lost(continued, all_tags, moved=continued != self.study_run_id)
        if project_run and self._resume_run:  # a new run continues the dead one
            all_tags[T.RESUMED_FROM] = self._resume_run
            self._take_over(self._resume_run, project_run)
            _retry(self.client.set_tag, self._resume_run, T.RESUMED_BY, project_run)
            _retry(self.client.set_terminated, self._resume_run, "FAILED")
        # Under `mlflow run` the entry point's raw strings ("default", "''") are logged
        # already and params are immutable: log the resolved value beside them.
        existing = run.data.params
        new_params = [
            Param(k if k not in existing else f"resolved.{k}", _param_value(v))
            for k, v in params.items()
            if (k not in existing or existing[k] != _param_value(v))
            # an empty value says nothing (storage=''); an unset one beside the entry
            # parameter that already says "default" neither (resolved.data_dir=null). A
            # plain None stays ("null"): tune_resume reads every setting back from the run
            and v != "" and not (v is None and k in existing)
        ]
        new_params = [p for p in new_params if existing.get(p.key) in (None, p.value)]
        _retry(self.client.log_batch, self.study_run_id, params=new_params,
               tags=[RunTag(k, str(v)) for k, v in all_tags.items()])
        for fname, obj in artifacts.items():
            _retry(self.client.log_dict, self.study_run_id, obj, fname)
        if dataset is not None:
            self._log_input(dataset)
        uri = mlflow.get_tracking_uri()
        self.spool = Spool(uri, deliver_op, root=self._spool_root,
                           background=os.environ.get("SCARCELAB_TRACKING_THREAD", "1") != "0")
        self.spool.ids["study"] = self.study_run_id
        self._replay_leftovers(uri)
        self._rv_start(name, tags, params)

    def _replay_leftovers(self, uri: str) -> None:
        replay_leftovers(uri, self._spool_root)

    def _reopen(self, run: Any) -> None:
        """A dead study run that a spool replay closed FAILED is continued: RUNNING again,
        without the replay's reason (its orphaned trials are closed by
        :meth:`close_orphan_trials`)."""
        if run.info.status == "RUNNING" or run.data.tags.get(T.ENDED_BY_REPLAY) != "true":
            return
        rid = run.info.run_id
        _retry(self.client.update_run, rid, status="RUNNING")
        for key in (T.ENDED_BY_REPLAY, T.ERROR):
            if key in run.data.tags:
                _retry(self.client.delete_tag, rid, key)

    def _log_input(self, d: DatasetInfo) -> None:
        source = HTTPDatasetSource(d.source) if "://" in d.source else HTTPDatasetSource(
            f"file://{d.source}" if d.source.startswith("/") else f"scarcelab://{d.source}")
        ds = MetaDataset(source=source, name=d.name, digest=d.digest)
        inp = DatasetInput(ds._to_mlflow_entity(), tags=[InputTag(MLFLOW_DATASET_CONTEXT,
                                                                  d.context)])
        _retry(self.client.log_inputs, self.study_run_id, datasets=[inp])

    def _submit(self, op: dict[str, Any]) -> None:
        assert self.spool is not None, "start_study first"
        self.spool.submit(op)
        self.spool.flush()  # retries the backlog at most every few seconds

    def flush(self) -> None:
        """Wait until every record submitted so far is in the store (its batches go out
        on a delivery thread, ``tracking.spool``, and a remote server's are held up to 2 s
        to go out together) — or, while a remote server is away, in the spool; a no-op
        before ``start_study``. Call it before reading this study's records back from the
        store in-process."""
        if self.spool is not None:
            self.spool.drain()

    def start_trial(self, number: int, tags: dict[str, str], params: dict[str, Any]) -> None:
        from mlflow.tracking.context.registry import resolve_tags

        self._n += 1
        key = f"trial-{number}-{self._n}"
        role = str(tags.get(T.ROLE, "trial"))
        run_name = self.trial_run_name(number, role)
        self._trial_key = key
        self._trial_number = number
        self._trial_text = self.trial_description(number, role, params)
        self._submit({"op": "create_run", "key": key, "parent": "study",
                      "experiment_id": self._experiment_id, "run_name": run_name,
                      "start_time": int(time.time() * 1000),
                      # tags go with the creation: a run killed right after it is still
                      # findable (and closable) by its study key and trial number
                      "tags": {**resolve_tags({}), MLFLOW_RUN_NAME: run_name,
                               MLFLOW_RUN_NOTE: self._trial_text,
                               **{k: str(v) for k, v in tags.items()}}})
        self._submit({"op": "log_batch", "key": key,
                      "params": [[k, _param_value(v)] for k, v in params.items()]})
        assert self.spool is not None
        self.trial_run_id = self.spool.ids.get(key)  # None while the server is away

    def _key(self, scope: str) -> str:
        if scope == "trial":
            if self._trial_key is None:
                raise RuntimeError("log_metrics(trial) with no open trial run")
            return self._trial_key
        if self.study_run_id is None:
            raise RuntimeError("log_metrics(study) with no open study run")
        return "study"

    def log_metrics(self, metrics: dict[str, float], step: int, scope: str = "trial") -> None:
        key = self._key(scope)
        self._rv_metrics(metrics, step, scope)
        ts = int(time.time() * 1000)
        self._submit({"op": "log_batch", "key": key,
                      "metrics": [[k, float(v), ts, int(step)] for k, v in metrics.items()]})

    def log_metrics_batch(self, rows: list[tuple[dict[str, float], int]],
                          scope: str = "trial") -> None:
        key = self._key(scope)
        for metrics, step in rows:
            self._rv_metrics(metrics, step, scope)
        ts = int(time.time() * 1000)
        batch = [[k, float(v), ts, int(step)] for metrics, step in rows
                 for k, v in metrics.items()]
        for s in range(0, len(batch), 1000):  # MLflow's per-request metric limit
            self._submit({"op": "log_batch", "key": key, "metrics": batch[s:s + 1000]})

    def log_checkpoint(self, checkpoint: dict[str, Any], name: str = "best.pt") -> None:
        path = Path(self._tmp.name) / name
        digest = save_checkpoint(checkpoint, path)  # plain tensors/types only
        self._submit({"op": "log_artifact", "key": "study", "path": str(path),
                      "artifact_path": "checkpoints", "name": name})
        # after the upload: a crash in between leaves a digest that does not match, and the
        # resume then refuses the file instead of trusting it
        self._submit({"op": "log_batch", "key": "study", "tags": [[T.CHECKPOINT_SHA256, digest]]})

    def log_image(self, image: Any, name: str) -> None:
        from PIL import Image

        path = Path(self._tmp.name) / f"img-{uuid.uuid4().hex[:8]}.png"
        Image.fromarray(image).save(path)
        parent = str(Path(name).parent)
        self._submit({"op": "log_artifact", "key": "study", "path": str(path),
                      "artifact_path": None if parent == "." else parent,
                      "name": Path(name).name})

    def end_trial(self, status: str, error: str | None = None) -> None:
        if self._trial_key is None:
            return
        outcome = [[MLFLOW_RUN_NOTE, self._trial_text + "\n\n"
                    + self.trial_outcome(self._trial_number, status)]]
        self._submit({"op": "log_batch", "key": self._trial_key,
                      "tags": ([[T.ERROR, error[:5000]]] if error else []) + outcome})
        self._submit({"op": "terminate", "key": self._trial_key, "status": status,
                      "end_time": int(time.time() * 1000)})
        self._trial_key = self.trial_run_id = None

    def set_tags(self, tags: dict[str, str], scope: str = "study") -> None:
        key = self._trial_key if scope == "trial" else ("study" if self.study_run_id else None)
        self._rv_tags(tags, scope)
        if key:
            self._submit({"op": "log_batch", "key": key,
                          "tags": [[k, str(v)] for k, v in tags.items()]})

    def log_model(self, model: nn.Module, example: Any) -> None:
        d = Path(self._tmp.name) / uuid.uuid4().hex[:8]
        d.mkdir()
        example = example.detach().cpu().contiguous()
        metadata = {T.MODEL_FORMAT: "pt2"}
        assert self.spool is not None and self.study_run_id is not None, "start_study first"
        spec = _classifier_spec(model, example)
        if spec is not None:
            # one torch.export, here where the model is a live object; the archive goes
            # into the model folder as it is (locally, or through the spool when remote)
            try:
                export_model(model, example, d / "model.pt2")
            except Exception as e:  # noqa: BLE001 - the study's results stand without it
                _export_failed(self, e)
                return
            if self.spool.remote:
                self._submit({"op": "log_model", "key": "study", "path": str(d / "model.pt2"),
                              "spec": spec.to_json(), "metadata": metadata})
            else:
                self.spool.drain()
                _log_classifier(d / "model.pt2", spec, self.study_run_id,
                                self._experiment_id, metadata, None)
            self._rv()["model_logged"] = True
            return
        if not self.spool.remote:
            # A local store has no outage to wait out, so nothing goes through the spool:
            # MLflow exports the live model itself. Exporting it here first and reading
            # the archive back (what the spool needs) would be a second torch.export of
            # the same model plus a load.
            self.spool.drain()
            try:
                _log_pt2(model.eval(), example, self.study_run_id, self._experiment_id,
                         metadata, None)
                self._rv()["model_logged"] = True
                return
            except Exception as e:  # noqa: BLE001 - an export failure is reported below
                try:  # was it the export? then the study stands without the model
                    export_model(model, example, d / "model.pt2")
                except Exception:  # noqa: BLE001
                    _export_failed(self, e)
                    return
                raise
        # exported here, where the model is a live object: the spool then holds a pt2
        # archive (JSON graph + raw tensors) and a tensor, never a pickled module
        try:
            export_model(model, example, d / "model.pt2")
        except Exception as e:  # noqa: BLE001 - the study's results stand without the model
            _export_failed(self, e)
            return
        torch.save(example, d / "example.pt")
        self._submit({"op": "log_model", "key": "study", "path": str(d / "model.pt2"),
                      "example_path": str(d / "example.pt"), "metadata": metadata})
        self._rv()["model_logged"] = True

    def end_study(self, status: str) -> None:
        if self._trial_key is not None:  # a trial interrupted by an exception
            self.end_trial("FAILED" if status == "FAILED" else "KILLED")
        if self.spool is not None and self.study_run_id is not None:
            self._rv_finish(status)
            if self._lost_line:  # after the description _rv_finish wrote
                self._submit({"op": "note_append", "key": "study", "line": self._lost_line})
            self._submit({"op": "terminate", "key": "study", "status": status,
                          "end_time": int(time.time() * 1000)})
            self.spool_left = self.spool.close(FLUSH_TIMEOUT_S)
            if self.spool_left is not None:
                msg = (f"tracking server {redact(self.spool.tracking_uri)} did not take every "
                       f"record of study run {self.study_run_id} before exit: they are kept in "
                       f"{self.spool_left}; deliver them with "
                       "`python -m scarcelab.tracking.spool replay "
                       f"{self.spool_left}` (the next study against this server does it too). "
                       "The run stays RUNNING until then and is tagged "
                       "scarcelab.spool=delivered_late when delivered.")
                log.error(msg)
                print(f"[scarcelab] {msg}", file=sys.stderr, flush=True)
        self._tmp.cleanup()
