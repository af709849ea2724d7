"""Continue a ``tune`` study from its MLflow record (``scarcelab tune --resume <study run
id>``): the rest of its ASHA search, then its final retraining, or only the retrains its
final phase lacks.

A final phase of 10 retrains can take hours; if its process dies, the retrains that
finished are valid results and should not be thrown away. Everything needed to continue is
on the study run: the best configuration (tag ``scarcelab.best_params``), the settings
(params), and the retrain child runs (``scarcelab.role=retrain``, ``scarcelab.retrain=i``).
This module reads them and hands the learning core plain data
(:class:`scarcelab.protocols.tune.FinalResume`): the core then runs only the missing
indices, each with the seed it would have had (:func:`~scarcelab.protocols.tune.retrain_seed`),
under the same study run, and recomputes the study's mean and std over all ``n_final``.

A study killed during its search has no ``scarcelab.best_params`` yet. Its trial runs
(``scarcelab.role=trial``) hold what Optuna held in memory: each trial's state, its
parameters and the values it reported to ASHA (``val/balanced_accuracy_avg5`` per epoch;
a report at epoch ``e`` is ASHA's step ``e + 1``). :func:`read_study` hands them over as
:class:`~scarcelab.protocols.tune.SearchResume`; the core rebuilds the study from them and
continues it. A study that kept its trials in a shared Optuna storage (``OPTUNA_STORAGE``)
is not rebuilt from MLflow — other workers' trials live there too — but continued in that
storage, where the dead trial is failed and run again in its own place (``tune.slot``).

Before anything is read, the spool folders ended processes left for this server are
delivered (``mlflow_tracker.replay_leftovers``): a record still on its way would otherwise
make a finished trial or retrain look missing, and it would run twice.

Closing stale records: a trial or retrain run left RUNNING by the dead process is closed
as FAILED (tags ``scarcelab.error``, ``scarcelab.crashed``) and run again. A study whose
owner process (``scarcelab.owner``, ``host:pid``) is still alive on this machine is
refused — two processes must not continue the same study at once.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from typing import Any

import mlflow
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from scarcelab import tags as T
from scarcelab.errors import ScarcelabError
from scarcelab.protocols.study_store import redact
from scarcelab.protocols.tune import FinalResume, PriorTrial, SearchResume, retrain_seed

log = logging.getLogger("scarcelab.tracking")

SCORE = "test/balanced_accuracy"


class ResumeError(ScarcelabError):
    """The run cannot be resumed; the message says why and what to pass instead."""


def _owner_alive(owner: str) -> bool:
    host, _, pid = owner.rpartition(":")
    return (host == socket.gethostname() and pid.isdigit() and int(pid) != os.getpid()
            and os.path.exists(f"/proc/{pid}"))


def _get_study(client: MlflowClient, run_id: str) -> Any:
    try:
        run = client.get_run(run_id)
    except MlflowException as e:
        if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise ResumeError(f"no run {run_id!r} in the tracking store "
                              f"{redact(mlflow.get_tracking_uri())}; pass the id of a tune study "
                              "run (`scarcelab.role = study`, the parent of the retrain runs)"
                              ) from None
        raise
    tags = run.data.tags
    if tags.get(T.PROTOCOL) != "tune" or tags.get(T.ROLE) != "study":
        parent = tags.get(MLFLOW_PARENT_RUN_ID)
        hint = f"; did you mean its parent, the study run {parent}?" if parent else ""
        raise ResumeError(f"run {run_id} is not a tune study run (scarcelab.role="
                          f"{tags.get(T.ROLE)!r}, scarcelab.protocol="
                          f"{tags.get(T.PROTOCOL)!r}){hint}")
    owner = tags.get(T.OWNER, "")
    if run.info.status == "RUNNING" and _owner_alive(owner):
        raise ResumeError(f"study run {run_id} is still being run by process {owner}; stop "
                          "it first (two processes must not retrain one study)")
    return run


def _fields(run: Any) -> dict[str, Any]:
    """The study's ``TuneConfig`` fields from its params (``resolved.<name>`` first: under
    ``mlflow run`` the plain name holds the raw string, e.g. ``default``)."""
    params, tags, rid = run.data.params, run.data.tags, run.info.run_id

    def raw(k: str, optional: bool = False) -> str:
        v = params.get(f"resolved.{k}", params.get(k))
        if v is None and optional:  # a setting left unset is not logged (no `null` params)
            return "null"
        if v is None:
            raise ResumeError(f"study run {rid} lacks the param {k!r}; it was not recorded by "
                              "the tune protocol and cannot be resumed")
        return v

    def as_json(k: str, optional: bool = False) -> Any:
        try:
            return json.loads(raw(k, optional))
        except json.JSONDecodeError:
            raise ResumeError(f"study run {rid}: param {k} = {raw(k)!r} is not what the tune "
                              "protocol records") from None

    def as_int(k: str, none_ok: bool = False) -> int | None:
        v = as_json(k, optional=none_ok)
        if v is None and none_ok:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            raise ResumeError(f"study run {rid}: param {k} = {raw(k)!r} is not an integer")
        return v

    overrides = {}
    for k, v in params.items():
        if k.startswith("override."):
            try:
                overrides[k[len("override."):]] = json.loads(v)
            except json.JSONDecodeError:
                overrides[k[len("override."):]] = v
    data_dir = as_json("data_dir", optional=True)
    # studies recorded before the final phase had its own epoch count retrained for
    # ``epochs`` (gem's default when --epochs-f is not given)
    has_final = "resolved.epochs_final" in params or "epochs_final" in params
    epochs_final = as_int("epochs_final", none_ok=True) if has_final else None
    dataset = tags.get(T.DATASET) or raw("dataset")
    return {"method": tags.get(T.METHOD) or raw("method"),
            "dataset": dataset,
            "arch": raw("arch"), "seed": as_int("seed"), "epochs": as_int("epochs"),
            "epochs_final": epochs_final if has_final else as_int("epochs"),
            "grace_period": as_int("grace_period"), "n_trials": as_int("n_trials"),
            "batch_sizes": tuple(as_json("batch_sizes")), "n_final": as_int("n_final"),
            "phase": raw("phase"),
            "max_steps_per_epoch": as_int("max_steps_per_epoch", none_ok=True),
            "data_dir": data_dir if isinstance(data_dir, str) and data_dir else None,
            "overrides": overrides,
            "study_name": tags.get(T.STUDY_KEY) or None,
            "data_options": _data_options(run, dataset)}


def _data_options(run: Any, dataset: str) -> Any:
    """A study on a user's images: the dataset options it was run with (``DataOptions``,
    from the params ``image_size``, ``channels``, ``fit``, ``skip_bad_files``,
    ``test_fraction`` the study logged), so that the resumed process decodes, resizes and
    holds out exactly the images the study saw; None for any other dataset. An option the
    study did not log is its default (no study records a default by leaving it out, so
    that only happens for a study older than the option)."""
    from scarcelab.data.own import DataOptions, is_own

    if not is_own(dataset):
        return None
    params, rid = run.data.params, run.info.run_id
    given: dict[str, Any] = {}
    for k in ("image_size", "channels", "fit", "skip_bad_files", "test_fraction"):
        v = params.get(f"resolved.{k}", params.get(k))
        if v is None:
            continue
        try:
            if k == "image_size":
                given[k] = None if v in ("native", "default", "null") else int(v)
            elif k == "skip_bad_files":
                if v.lower() not in ("true", "false"):
                    raise ValueError(v)
                given[k] = v.lower() == "true"
            elif k == "test_fraction":
                given[k] = float(v)
            else:
                given[k] = v
        except ValueError:
            raise ResumeError(f"study run {rid}: param {k} = {v!r} is not what the tune "
                              "protocol records") from None
    try:
        opts = DataOptions(**given)
        opts.transform()  # channels and fit checked as the command line checks them
        return opts
    except ScarcelabError as e:
        raise ResumeError(f"study run {rid}: its dataset options cannot be read back ({e})"
                          ) from None


AVG5 = "val/balanced_accuracy_avg5"


def read_study(run_id: str, client: MlflowClient | None = None
               ) -> tuple[dict[str, Any], FinalResume | SearchResume, list[str]]:
    """(the study's config fields, what it left — its search unfinished
    (:class:`SearchResume`) or its final phase (:class:`FinalResume`) — and the ids of the
    stale runs to close). Delivers left-over spools first, then reads only;
    :func:`close_stale` writes."""
    from scarcelab.tracking.mlflow_tracker import replay_leftovers

    replay_leftovers()
    client = client or MlflowClient()
    run = _get_study(client, run_id)
    if T.BEST_PARAMS in run.data.tags:
        return read_final_phase(run_id, client, run)
    fields = _fields(run)
    if fields["phase"] == "final":
        raise ResumeError(f"study run {run_id} ran only the final phase and has no best "
                          "configuration (tag scarcelab.best_params); run its search first")
    storage = run.data.params.get("resolved.storage", run.data.params.get("storage", ""))
    if storage:  # the Optuna study is there (with any other worker's trials): continue it
        here = os.environ.get("OPTUNA_STORAGE", "")
        if redact(here) != storage:
            raise ResumeError(f"study run {run_id} keeps its trials in the Optuna storage "
                              f"{storage}; set OPTUNA_STORAGE to it (now "
                              f"{redact(here) or 'unset'}) and run --resume again")
        fields["storage"] = here
    trials, stale, spent = _search_trials(client, run)
    return fields, SearchResume(trials=tuple(trials), elapsed_s=spent,
                                recorded=dict(run.data.params), shared=bool(storage)), stale


def _search_trials(client: MlflowClient, run: Any
                   ) -> tuple[list[PriorTrial], list[str], float]:
    """The finished trials of a study's search, the stale (RUNNING) ones, and the time the
    search had spent (study start to the last trial's end, in seconds)."""
    rid = run.info.run_id
    kids = client.search_runs(
        [run.info.experiment_id],
        f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{rid}' and tags.`{T.ROLE}` = 'trial'",
        max_results=50_000, order_by=["attributes.start_time ASC"])
    trials: dict[int, PriorTrial] = {}
    stale: list[str] = []
    last = run.info.start_time
    for r in kids:
        tags, number = r.data.tags, r.data.tags.get(T.TRIAL, "")
        last = max(last, r.info.end_time or r.info.start_time)
        if not number.isdigit() or tags.get(T.CRASHED) == "true":
            continue  # crashed: an earlier resume ran it again
        if _left_by_dead_process(r):
            stale.append(r.info.run_id)
            continue
        state = ("complete" if r.info.status == "FINISHED" else
                 "pruned" if tags.get(T.PRUNED) == "true" else
                 "budget" if tags.get(T.STOPPED) == "budget" else "failed")
        reports = {m.step + 1: float(m.value)
                   for m in client.get_metric_history(r.info.run_id, AVG5)}
        value = r.data.metrics.get("asha/final_value") if state == "complete" else None
        if state == "complete" and value is None:
            raise ResumeError(f"trial run {r.info.run_id} (trial {number}) finished without "
                              "asha/final_value; it was not recorded by the tune protocol")
        if int(number) in trials:
            raise ResumeError(f"study run {rid} has two finished records of trial {number} "
                              f"({r.info.run_id} and another); cannot tell which one counts")
        trials[int(number)] = PriorTrial(
            number=int(number), state=state, reports=tuple(sorted(reports.items())),
            value=None if value is None else float(value), params=dict(r.data.params))
    return [trials[n] for n in sorted(trials)], stale, max(0.0, (last - run.info.start_time)
                                                            / 1000.0)


def read_final_phase(run_id: str, client: MlflowClient | None = None, run: Any = None
                     ) -> tuple[dict[str, Any], FinalResume, list[str]]:
    """(the study's config fields, what its final phase left, the ids of the stale retrain
    runs to close). Reads only; :func:`close_stale` writes."""
    client = client or MlflowClient()
    run = run or _get_study(client, run_id)
    if T.BEST_PARAMS not in run.data.tags:
        raise ResumeError(f"study run {run_id} has no best configuration (tag "
                          "scarcelab.best_params): its search did not finish; "
                          "`tune --resume` continues it")
    fields = _fields(run)
    seed, n_final = fields["seed"], fields["n_final"]
    children = client.search_runs(
        [run.info.experiment_id],
        f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{run_id}' and tags.`{T.ROLE}` = 'retrain'",
        max_results=10_000, order_by=["attributes.start_time ASC"])
    done: dict[int, float] = {}
    stale: list[str] = []
    for r in children:
        index = r.data.tags.get(T.RETRAIN, "")
        if not index.isdigit():
            continue
        i = int(index)
        if _left_by_dead_process(r):
            stale.append(r.info.run_id)
            continue
        if r.info.status != "FINISHED" or SCORE not in r.data.metrics:
            continue  # failed or killed earlier: its index runs again
        want = retrain_seed(seed, i)
        if r.data.params.get("retrain_seed") != str(want):
            raise ResumeError(f"retrain run {r.info.run_id} (index {i}) has seed "
                              f"{r.data.params.get('retrain_seed')}, the protocol's seed for "
                              f"index {i} is {want}; refusing to mix retrains of different "
                              "seeding schemes")
        if i >= n_final:
            raise ResumeError(f"retrain run {r.info.run_id} has index {i} >= the study's "
                              f"n_final {n_final}")
        if i in done:
            log.warning("study %s has two finished retrains %d; keeping the earlier", run_id, i)
            continue
        done[i] = float(r.data.metrics[SCORE])
    logged = frozenset(m.step for m in client.get_metric_history(
        run_id, "final/test_balanced_accuracy"))
    best = json.loads(run.data.tags[T.BEST_PARAMS])
    return fields, FinalResume(best_params=best, done=done, logged=logged,
                               recorded=dict(run.data.params)), stale


def _left_by_dead_process(r: Any) -> bool:
    """A record the dead process left unfinished: still RUNNING, or closed FAILED by the
    spool replay that the resume ran first (``scarcelab.ended_by_replay``, issue 42 item 9)
    — the same trial either way, to be closed as crashed and run again."""
    return r.info.status == "RUNNING" or (
        r.info.status == "FAILED" and r.data.tags.get(T.ENDED_BY_REPLAY) == "true")


def close_stale(run_ids: list[str], client: MlflowClient | None = None) -> None:
    """Close the trial / retrain runs a dead process left RUNNING: FAILED, with the reason
    and ``scarcelab.crashed`` (a resume never counts such a record)."""
    client = client or MlflowClient()
    for rid in run_ids:
        client.set_tag(rid, T.ERROR, "the process running this trial died; the "
                       "resumed study runs it again (same number, same seed)")
        client.set_tag(rid, T.CRASHED, "true")
        client.set_terminated(rid, "FAILED")
