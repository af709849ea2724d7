"""Where a search keeps its trials: in memory, or in a shared Optuna RDB storage.

With ``OPTUNA_STORAGE`` (the tracking stack's PostgreSQL, DESIGN §4.4) several worker
processes share one study, and a study whose process was killed can be continued:

* Configurations are a pure function of ``(seed, trial number, parameter)``
  (:class:`TrialSeededSampler`), so a new process never re-draws configurations already
  tried, and two workers never draw the same one (trial numbers are unique in a study).
* Every running trial carries its owner (``host:pid``) and a heartbeat (a user attribute
  refreshed every few seconds by a daemon thread). A trial whose owner is a dead process on
  this host, or whose heartbeat is older than the grace period, was orphaned by a crash:
  it is marked FAILED with ``crashed=True`` and does not count as a tried configuration.
  (Optuna's own heartbeat only runs inside ``study.optimize``; this search uses ask/tell.)
* Trial budgets (``max_trials``) count the whole study, not one process.
* The running process's budget clock (``elapsed_s``, diagnostics excluded) is written to
  its running trial with every heartbeat and every epoch, so the time a killed trial had
  spent since its last logged epoch still counts against the budget when the study is
  resumed (:meth:`StudyStore.spent_by_dead_processes`; precise to one heartbeat).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, Trial, TrialState

from scarcelab.redaction import redact  # noqa: F401 - re-exported: tune and tune_resume use it

log = logging.getLogger(__name__)

HEARTBEAT_S = float(os.environ.get("SCARCELAB_HEARTBEAT_S", "5"))
GRACE_S = float(os.environ.get("SCARCELAB_HEARTBEAT_GRACE_S", "60"))
HOST = socket.gethostname()
_ASKING = "asking:"  # study user attribute prefix: a process inside StudyStore.ask
_CLOSED = "closed_at"  # study user attribute: a worker finished it (StudyStore.close_study)


class TrialSeededSampler(optuna.samplers.BaseSampler):
    """Random search whose draw for trial ``n`` depends only on ``(seed, n, parameter)``.

    A sequential RandomSampler would restart its stream in a resumed process and propose
    the configurations of trials 0, 1, … again; seeding per trial avoids that.
    """

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)

    def infer_relative_search_space(self, study: Any, trial: FrozenTrial
                                    ) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(self, study: Any, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return {}

    def sample_independent(self, study: Any, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        sub_seed = (self.seed * 1_000_003 + trial.number * 7_919
                    + zlib.crc32(param_name.encode())) % (2**32)
        return optuna.samplers.RandomSampler(seed=sub_seed).sample_independent(
            study, trial, param_name, param_distribution)


def _open_rdb(url: str, attempts: int = 6) -> Any:
    """Optuna's RDB storage, tolerating a concurrent first start: on an empty database,
    workers started together all create Optuna's tables and stamp its schema version, and
    all but one fail on a unique constraint (seen with two workers on a fresh PostgreSQL).
    Once the winner has finished, opening again finds the schema in place."""
    import sqlalchemy.exc

    def open_() -> Any:
        return optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True})

    for attempt in range(attempts - 1):
        try:
            return open_()
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError) as e:
            wait = 0.5 * (attempt + 1) + (os.getpid() % 7) / 20.0  # de-synchronise workers
            log.info("optuna storage schema being created by another worker (%s); retrying "
                     "in %.1f s", type(e).__name__, wait)
            time.sleep(wait)
    return open_()  # the last attempt's error, if any, is the caller's


class StudyStore:
    """One Optuna study (in memory or shared) plus the crash bookkeeping above."""

    def __init__(self, name: str, seed: int, storage_url: str | None = None,
                 storage: Any = None) -> None:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.shared = bool(storage_url)
        self.storage: Any = storage
        if storage_url and storage is None:
            self.storage = _open_rdb(storage_url)
        self.study = optuna.create_study(study_name=name, storage=self.storage,
                                         direction="maximize",
                                         sampler=TrialSeededSampler(seed), load_if_exists=True)
        self.name = name
        self._beat: threading.Event | None = None

    @classmethod
    def open_shared(cls, key: str, seed: int, storage_url: str) -> StudyStore:
        """The open study of the command keyed ``key``: ``key`` itself, or the first of
        ``key-r2``, ``key-r3``, … that no worker has closed. Every worker started while it
        is open gets the same name (Optuna's ``create_study(load_if_exists=True)`` makes
        the first one, the others load it), so they share one search; a command run after
        its study finished starts the next one, a repeat."""
        storage = _open_rdb(storage_url)
        generation = 1
        while True:
            name = key if generation == 1 else f"{key}-r{generation}"
            try:
                sid = storage.get_study_id_from_name(name)
            except KeyError:
                break  # not made yet: this worker (or one beside it) makes it
            if not storage.get_study_user_attrs(sid).get(_CLOSED):
                break
            generation += 1
        return cls(name, seed, storage_url, storage=storage)

    def close_study(self) -> None:
        """Mark the study finished: a worker's search ended (its budget or ``max_trials``
        spent), so a command started from now on repeats it instead of joining it
        (:meth:`open_shared`). Workers already in it go on to their own end."""
        if self.shared:
            self.study.set_user_attr(_CLOSED, time.time())

    # -- crashed trials ------------------------------------------------------------------
    @staticmethod
    def _owner_dead(owner: str) -> bool:
        host, _, pid = owner.rpartition(":")
        if host != HOST or not pid.isdigit():
            return False
        return int(pid) != os.getpid() and not os.path.exists(f"/proc/{pid}")

    def _pending_askers(self) -> dict[str, float]:
        """Processes inside :meth:`ask` (owner -> when they entered it)."""
        return {k[len(_ASKING):]: float(v) for k, v in self.study.user_attrs.items()
                if k.startswith(_ASKING) and v}

    def _ownerless_orphan(self, started: float, pending: dict[str, float]) -> bool:
        """Whether a trial without an owner was asked by a process that died inside
        :meth:`ask` (between Optuna's ``ask`` and the owner being written: a SIGKILL there
        left trial 5 RUNNING in the e2e kill-and-resume test). Its asker is one of the
        processes that entered ``ask`` before the trial started; if every one of them is
        gone, so is its asker. A live or remote candidate leaves it to the grace period."""
        cands = [o for o, t0 in pending.items() if t0 <= started + 1e-3]
        return bool(cands) and all(self._owner_dead(o) for o in cands)

    def fail_orphans(self) -> list[int]:
        """Mark trials left RUNNING by dead processes FAILED; returns their numbers."""
        if not self.shared:
            return []
        now = time.time()
        out = []
        pending = self._pending_askers()
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            owner = str(t.user_attrs.get("owner", ""))
            # A trial another worker has just asked for has no owner/heartbeat yet (ask()
            # sets them right after): its start time stands in, so it is not taken for a
            # trial whose heartbeat stopped long ago and failed under that worker's feet.
            started = t.datetime_start.timestamp() if t.datetime_start else 0.0
            beat = float(t.user_attrs.get("heartbeat", started))
            if owner == f"{HOST}:{os.getpid()}":
                continue
            dead = (self._owner_dead(owner) if owner
                    else self._ownerless_orphan(started, pending))
            if not (dead or now - beat > GRACE_S):
                continue
            tid = self.storage.get_trial_id_from_study_id_trial_number(
                self.storage.get_study_id_from_name(self.name), t.number)
            try:
                self.storage.set_trial_user_attr(tid, "crashed", True)
                self.storage.set_trial_state_values(tid, TrialState.FAIL)
            except (RuntimeError, optuna.exceptions.UpdateFinishedTrialError):
                continue  # another worker got there first
            out.append(t.number)
        return out

    # -- counting ------------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        """Tried configurations of the whole study (crashed and surplus ones excluded)."""
        c = {"complete": 0, "failed": 0, "running": 0}
        for t in self.study.get_trials(deepcopy=False):
            if t.user_attrs.get("crashed") or t.state == TrialState.PRUNED:
                continue
            if t.state == TrialState.COMPLETE:
                c["complete"] += 1
            elif t.state == TrialState.FAIL:
                c["failed"] += 1
            elif t.state == TrialState.RUNNING:
                c["running"] += 1
        return c

    def completed_numbers(self) -> set[int]:
        return {t.number for t in self.study.get_trials(deepcopy=False,
                                                       states=(TrialState.COMPLETE,))}

    def started_before(self, number: int) -> int:
        """Counted trials with a smaller number (for a study-wide ``max_trials``)."""
        return sum(1 for t in self.study.get_trials(deepcopy=False)
                   if t.number < number and not t.user_attrs.get("crashed")
                   and t.state != TrialState.PRUNED)

    def spent_by_dead_processes(self) -> float:
        """The largest budget clock (``elapsed_s``) written by a process that is gone: a
        trial already failed as crashed, or one whose owner is dead or silent. A resumed
        study starts its clock there. Exact for the usual one process per study record; if
        several workers of one study died, the largest of their clocks is taken."""
        if not self.shared:
            return 0.0
        now = time.time()
        out = 0.0
        for t in self.study.get_trials(deepcopy=False):
            if "elapsed_s" not in t.user_attrs:
                continue
            owner = str(t.user_attrs.get("owner", ""))
            if owner == f"{HOST}:{os.getpid()}":
                continue
            beat = float(t.user_attrs.get("heartbeat", 0.0))
            silent = t.state == TrialState.RUNNING and now - beat > GRACE_S
            if t.user_attrs.get("crashed") or self._owner_dead(owner) or silent:
                out = max(out, float(t.user_attrs["elapsed_s"]))
        return out

    # -- trials --------------------------------------------------------------------------
    def ask(self, elapsed: Callable[[], float] | None = None) -> Trial:
        """A new trial; ``elapsed`` (the budget clock) is recorded with every heartbeat."""
        me = f"{HOST}:{os.getpid()}"
        if self.shared:  # a death between Optuna's ask and the owner is then traceable
            self.study.set_user_attr(_ASKING + me, time.time())
        trial = self.study.ask()
        if self.shared:
            trial.set_user_attr("owner", me)
            self.study.set_user_attr(_ASKING + me, 0.0)  # out of ask: nothing to trace
            trial.set_user_attr("heartbeat", time.time())
            if elapsed is not None:
                trial.set_user_attr("elapsed_s", float(elapsed()))
            self._start_heartbeat(trial, elapsed)
        return trial

    def record_elapsed(self, trial: Trial, elapsed_s: float) -> None:
        """The budget clock at an epoch's end (between heartbeats)."""
        if self.shared:
            try:
                trial.set_user_attr("elapsed_s", float(elapsed_s))
            except Exception as e:  # noqa: BLE001 - a DB blip: the next heartbeat writes it
                log.info("could not record elapsed time of trial %d: %s", trial.number, e)

    def _start_heartbeat(self, trial: Trial, elapsed: Callable[[], float] | None = None
                         ) -> None:
        self._stop_heartbeat()
        stop = threading.Event()
        self._beat = stop

        def beat() -> None:
            while not stop.wait(HEARTBEAT_S):
                try:
                    trial.set_user_attr("heartbeat", time.time())
                    if elapsed is not None:
                        trial.set_user_attr("elapsed_s", float(elapsed()))
                except Exception:  # noqa: BLE001 - finished or DB blip: next beat retries
                    if stop.is_set():
                        return

        threading.Thread(target=beat, name="scarcelab-heartbeat", daemon=True).start()

    def _stop_heartbeat(self) -> None:
        if self._beat is not None:
            self._beat.set()
            self._beat = None

    def tell(self, trial: Trial, value: float | None = None,
             state: TrialState | None = None) -> None:
        self._stop_heartbeat()
        if state is None:
            self.study.tell(trial, value)
        else:
            self.study.tell(trial, state=state)

    def close(self) -> None:
        self._stop_heartbeat()
