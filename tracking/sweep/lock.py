"""Exactly one driver per sweep: a lock held in the tracking store itself.

Why the store: the drivers that may race are anywhere that reaches it (two shells on one
machine, a laptop and a CI job against one server), so a file lock or Ray's own state
would not see them all. Why an experiment: MLflow keeps experiment names unique in every
backend (a database constraint in SQLite and PostgreSQL, behind the server too), so
``create_experiment(<lock name>)`` is an atomic test-and-set that needs no new service.
Before this lock, the driver searched for a RUNNING sweep run and then created
one: two drivers started together both found none, and each ran every cell.

The lock experiment is named from the sweep's experiment id and a hash of its name, and
carries its holder (``host:pid:start``, the process's start time against pid reuse) and a
heartbeat (seconds since the epoch, rewritten every ``BEAT_S`` by a thread). A lock is
*dead* when its holder is on this host and that process is gone, or, from any host, when
its heartbeat is older than ``TTL_S`` (clocks of the machines must agree to well within
that). A dead lock is moved out of the way by renaming it *by id* — a second reclaimer
renames the same, now harmless, experiment — and then deleted; then the name is created
again, which only one contender wins. Released locks are renamed and deleted the same
way, so an active lock experiment exists only while a driver holds it (deleted ones stay
in the store's trash until ``mlflow gc``).
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
import uuid
from typing import Any

from scarcelab import tags as T

LOCK_PREFIX = ".scarcelab-sweep-lock"
#: a holder whose heartbeat is older than this is dead (seconds)
TTL_S = 120.0
#: how often the holder rewrites its heartbeat (seconds)
BEAT_S = 20.0


class SweepLocked(RuntimeError):
    """Another driver holds the sweep."""


def _start_token(pid: int) -> str:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22),
    or '' where it cannot be read: a pid reused by another process does not look alive.
    A zombie (state Z: dead, its exit status not yet collected by its parent) is '' too:
    a driver killed by a supervisor that starts the sweep again before reaping it held
    the lock as long as it stayed unreaped (issue 42 item 10)."""
    try:
        stat = open(f"/proc/{pid}/stat").read()  # noqa: SIM115 - one small read
        fields = stat.rsplit(")", 1)[1].split()
        return "" if fields[0] in ("Z", "X") else fields[19]
    except (OSError, IndexError):
        return ""


def lock_owner() -> str:
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{_start_token(pid)}"


def holder_alive(owner: str, beat: float, now: float, ttl_s: float = TTL_S) -> bool:
    """Whether the holder of a lock still lives: by its process on this host (so a crashed
    driver's lock is taken over at once), else by the age of its heartbeat."""
    host, _, rest = owner.partition(":")
    pid, _, start = rest.partition(":")
    if host == socket.gethostname() and pid.isdigit():
        mine = _start_token(int(pid))
        return bool(mine) and (not start or mine == start)
    return now - beat < ttl_s


class SweepLock:
    """``acquire()`` or raise ``SweepLocked``; ``lost`` turns true when the lock was taken
    away (the holder stalled past ``ttl_s``); ``release()`` at the end."""

    def __init__(self, client: Any, experiment_id: str, sweep: str, ttl_s: float = TTL_S,
                 beat_s: float = BEAT_S) -> None:
        self.client = client
        self.sweep = sweep
        digest = hashlib.sha256(sweep.encode()).hexdigest()[:16]
        self.name = f"{LOCK_PREFIX}:{experiment_id}:{digest}"
        self.owner = lock_owner()
        self.ttl_s, self.beat_s = ttl_s, beat_s
        self.lock_id: str | None = None
        self.lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> None:
        from mlflow.exceptions import MlflowException

        for _ in range(5):
            try:
                self.lock_id = str(self.client.create_experiment(self.name, tags={
                    T.LOCK_OWNER: self.owner, T.LOCK_HEARTBEAT: f"{time.time():.3f}",
                    T.LOCK_SWEEP: self.sweep[:5000]}))
            except MlflowException as e:
                if e.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
            else:
                self._thread = threading.Thread(target=self._beat, daemon=True,
                                                name="sweep-lock-heartbeat")
                self._thread.start()
                return
            held = self.client.get_experiment_by_name(self.name)
            if held is None:
                continue  # released between our create and our read
            owner = held.tags.get(T.LOCK_OWNER, "")
            try:
                beat = float(held.tags.get(T.LOCK_HEARTBEAT, ""))
            except ValueError:  # tags not written yet: it was created just now
                beat = (held.creation_time or 0) / 1000.0 or time.time()
            if holder_alive(owner, beat, time.time(), self.ttl_s):
                age = time.time() - beat
                raise SweepLocked(
                    f"sweep {self.sweep!r} is being run by the driver {owner or '?'} (its "
                    f"heartbeat is {age:.0f} s old); wait for it or stop it, then run the "
                    "sweep again (a dead driver's lock is taken over after "
                    f"{self.ttl_s:.0f} s)")
            self._retire(str(held.experiment_id), "reclaimed")
        raise SweepLocked(f"sweep {self.sweep!r}: could not take its lock {self.name!r} "
                          "(other drivers kept taking it); try again")

    def _retire(self, exp_id: str, why: str) -> None:
        """Rename by id, then delete: a name that a racing reclaimer already moved is left
        alone, and the lock's name is free for one new create."""
        try:
            self.client.rename_experiment(exp_id, f"{self.name}:{why}:{uuid.uuid4().hex[:12]}")
            self.client.delete_experiment(exp_id)
        except Exception:  # noqa: BLE001, S110 - moved or deleted by another driver already
            pass

    def _mine(self) -> bool:
        exp = self.client.get_experiment(self.lock_id)
        return bool(exp.name == self.name and exp.lifecycle_stage == "active"
                    and exp.tags.get(T.LOCK_OWNER) == self.owner)

    def _beat(self) -> None:
        while not self._stop.wait(self.beat_s):
            try:
                if not self._mine():
                    self.lost = True
                    return
                self.client.set_experiment_tag(self.lock_id, T.LOCK_HEARTBEAT, f"{time.time():.3f}")
            except Exception:  # noqa: BLE001, S112 - store unreachable: try again next beat
                continue

    def check(self) -> None:
        """Raise when the lock was taken over: another driver now runs the sweep."""
        if self.lost:
            raise SweepLocked(f"sweep {self.sweep!r}: this driver lost its lock (it stalled "
                              f"for more than {self.ttl_s:.0f} s and another driver took the "
                              "sweep over); stopping without starting more cells")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.lock_id is None:
            return
        try:
            if self._mine():
                self._retire(self.lock_id, "released")
        except Exception:  # noqa: BLE001, S110 - the store is gone: the lock goes stale
            pass
        self.lock_id = None
