"""A training process started by ``mlflow run`` ends with it, so that a killed
launcher leaves no orphan training on beside the study its re-run starts.

``mlflow run`` starts the entry point as ``bash -c "<activate env> && python -m
entrypoints.cli …"``. When ``mlflow run`` is killed, that child is orphaned and trains on
to the end, while the user re-runs the command and gets a second, duplicate study next to
it. Here the child watches the ``mlflow run`` process that launched it and stops when it is
gone; its study run is then an ordinary killed study (owner dead, RUNNING), which the
re-run resumes (docs/tracking.md §4).

Two mechanisms, because the direct parent is usually the intermediate ``bash``, which
survives ``mlflow run``'s death:

* ``prctl(PR_SET_PDEATHSIG, SIGTERM)`` (Linux) — immediate when the direct parent dies;
* a daemon thread polling the ``mlflow run`` ancestor's pid (and its start time, so a
  reused pid does not count as alive) every second.

The watchdog only engages when an ``mlflow … run`` process is found among the ancestors
(``MLFLOW_RUN_ID`` alone is not enough: users also set it by hand).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1
POLL_S = float(os.environ.get("SCARCELAB_PARENT_POLL_S", "1"))


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _ppid(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (clock ticks since boot): identifies a process, not
    just its pid. None once it has exited (or is a zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


def is_mlflow_run(argv: list[str]) -> bool:
    """``mlflow run …`` as the console script (``python …/bin/mlflow run``, or the script
    itself) or as ``python -m mlflow run``."""
    return any(Path(a).name == "mlflow" and i + 1 < len(argv) and argv[i + 1] == "run"
               for i, a in enumerate(argv[:3]))


def mlflow_run_ancestor(pid: int | None = None, depth: int = 6) -> int | None:
    """The pid of the ``mlflow run`` process this one descends from, if any."""
    cur = _ppid(pid or os.getpid())
    for _ in range(depth):
        if cur <= 1:
            return None
        if is_mlflow_run(_cmdline(cur)):
            return cur
        cur = _ppid(cur)
    return None


def _stop(reason: str) -> None:
    print(f"[scarcelab] {reason}: stopping this training process (run the same command "
          "again to resume its study)", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)  # a SIGTERM handler that does not exit gets this long
    os._exit(143)


def watch(pid: int, what: str, interval: float = POLL_S) -> threading.Thread:
    """Stop this process once ``pid`` (identified with its start time) has exited."""
    born = _start_time(pid)

    def loop() -> None:
        while True:
            if born is None or _start_time(pid) != born:
                _stop(f"{what} (pid {pid}) has exited")
                return
            time.sleep(interval)

    t = threading.Thread(target=loop, name="scarcelab-parent-watch", daemon=True)
    t.start()
    return t


def _started_at(pid: int) -> float | None:
    """``time.time()`` at which process ``pid`` started (Linux: its start tick in
    /proc/<pid>/stat after the boot time in /proc/stat); None where unknown."""
    ticks = _start_time(pid)
    try:
        btime = next(int(line.split()[1]) for line in
                     Path("/proc/stat").read_text().splitlines() if line.startswith("btime"))
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError):
        return None
    return None if ticks is None else btime + int(ticks) / hz


def command_started_at() -> float:
    """When the user's command started: the ``mlflow run`` that launched this process if
    there is one (its CLI start-up, run creation and environment activation are part of
    the command), else this process. What a study's wall-clock budget counts from
    (``StudyConfig.started_at``); ``time.time()`` now where /proc cannot tell."""
    pids = [os.getpid()]
    launcher = mlflow_run_ancestor() if os.environ.get("MLFLOW_RUN_ID") else None
    if launcher is not None:
        pids.append(launcher)
    now = time.time()
    known = [t for t in (_started_at(p) for p in pids) if t is not None and t <= now]
    return min(known, default=now)


def skip_gc_at_exit() -> None:
    """Freeze the heap at interpreter exit, so the finalisation's garbage collections skip
    it: they traversed the millions of objects torch, sympy and MLflow leave (2.6-2.8 s of
    CPU per command on this 2-core machine, 9.5 s of wall time under load: 0.5-0.6 s
    frozen; bench/study_overhead.py ``final.exit.teardown``, docs/performance.md).
    Registered first, it runs after every other exit handler; refcounting still frees
    objects and runs their finalisers, only cycles left at exit are not collected."""
    import atexit
    import gc

    atexit.register(gc.freeze)


def die_with_mlflow_run() -> int | None:
    """Tie this process's life to the ``mlflow run`` that started it; returns its pid."""
    if not os.environ.get("MLFLOW_RUN_ID") or not sys.platform.startswith("linux"):
        return None
    launcher = mlflow_run_ancestor()
    if launcher is None:
        return None
    try:  # the direct parent (bash) dying: signal at once
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    watch(launcher, "the `mlflow run` that started it")
    return launcher
