"""The embedded Ray cluster dies with the process that started it, however that process
ends (issue 42 item 10).

Why: ``ray.init()`` starts GCS and the raylet so that the kernel kills them when their
parent dies (Ray's fate sharing, ``PR_SET_PDEATHSIG``), but the processes *they* start do
not follow: a sweep driver killed with SIGKILL (``kill -9``, the OOM killer) left
``ray::RuntimeEnvAgent`` and ``ray::DashboardAgent`` alive for about a minute (each polls
for its raylet, then waits on the dead GCS before it exits), and Ray workers likewise.
A dying process cannot clean up after itself, so a watcher outside it does: this file,
run as its own small process (standard library only, ``python -I -S reaper.py``) in a
session of its own (a signal to the driver's process group does not reach it).

Protocol: argv[1] is the comma-separated pids of the processes ``ray.init`` started (the
roots). The watcher's stdin is the read end of a pipe whose only writer is the driver;
every ``POLL_S`` it records the roots and all their descendants with their start times,
forgetting those that ended (it exits when none is left: after an orderly
``ray.shutdown``). When the pipe reaches end of file — the driver is gone,
whichever way — it sends SIGTERM to every recorded process still alive with the same
start time (a pid reused since is left alone), and SIGKILL to those still there
``GRACE_S`` later. Pids are followed with their start times, so a pid reused by an
unrelated process is never signalled. Should the watcher die with the driver (a kill of
every process of the user), the next embedded cluster kills Ray agents whose raylet is
gone before it starts (:func:`reap_orphans`).
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

#: seconds between two records of the cluster's process tree
POLL_S = 1.0
#: seconds between SIGTERM and SIGKILL
GRACE_S = 3.0


def start_time(pid: int) -> str:
    """``/proc/<pid>/stat`` field 22 (start time since boot), '' when gone or a zombie."""
    try:
        rest = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()  # noqa: SIM115
    except (OSError, IndexError):
        return ""
    return "" if rest[0] in ("Z", "X") else rest[19]


def children_map() -> dict[int, list[int]]:
    """parent pid -> child pids of every process visible in /proc."""
    out: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                ppid = int(open(f"/proc/{name}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            out.setdefault(ppid, []).append(int(name))
    return out


def tree(known: dict[int, str]) -> dict[int, str]:
    """The live processes among ``known`` (pid -> start time; one whose pid now has another
    start time is not followed: that pid was reused) and below them: pid -> start time."""
    kids = children_map()
    seen: dict[int, str] = {}
    todo = [p for p, t in known.items() if start_time(p) == t]
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        token = start_time(pid)
        if token:
            seen[pid] = token
            todo += kids.get(pid, [])
    return seen


def kill(recorded: dict[int, str], grace_s: float = GRACE_S) -> list[int]:
    """SIGTERM, then SIGKILL after ``grace_s``, to each recorded process that is still the
    same process; returns the pids signalled."""
    hit = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        live = [p for p, t in recorded.items() if start_time(p) == t]
        if not live:
            break
        for p in live:
            try:
                os.kill(p, sig)
            except OSError:
                continue
            if sig == signal.SIGTERM:
                hit.append(p)
        end = time.time() + grace_s
        while sig == signal.SIGTERM and time.time() < end and any(
                start_time(p) == recorded[p] for p in live):
            time.sleep(0.1)
    return hit


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _ppid(pid: int) -> int:
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])  # noqa: SIM115
    except (OSError, IndexError, ValueError):
        return 0


def orphaned_agents() -> list[int]:
    """This user's Ray processes (``ray::…``) whose raylet (``$RAY_RAYLET_PID`` in their
    environment: Ray's agents) is gone: the leftovers of a cluster whose driver and
    watcher were both killed, waiting up to a minute on a dead GCS. A live raylet's agents,
    another user's, and Ray processes without that variable are never included."""
    uid, out = os.getuid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid or \
                    not _cmdline(pid).startswith(b"ray::"):
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = {k: val for k, _, val in (v.partition(b"=")
                                                 for v in f.read().split(b"\0") if v)}
        except OSError:
            continue
        raylet = env.get(b"RAY_RAYLET_PID", b"")
        if not raylet.isdigit() or any(b"raylet" in _cmdline(p) and start_time(p) for p in (
                int(raylet), _ppid(pid))):
            continue  # its raylet lives (by the variable, or as its parent: a pid
            # namespace of its own, such as a container's, numbers the variable otherwise)
        out.append(pid)
    return out


def reap_orphans() -> list[int]:
    """Kill :func:`orphaned_agents` (SIGKILL: their cluster is gone, they hold nothing to
    save); the next embedded cluster calls this before it starts."""
    hit = []
    for pid in orphaned_agents():
        try:
            os.kill(pid, signal.SIGKILL)
            hit.append(pid)
        except OSError:
            continue
    return hit


def watch(roots: set[int], fd: int = 0, poll_s: float = POLL_S) -> list[int]:
    """Record the tree below ``roots`` until ``fd`` ends, then kill what is left of it;
    returns the pids signalled. Ends at once, killing nothing, when everything recorded
    has ended (an orderly ``ray.shutdown``)."""
    recorded = tree({p: start_time(p) for p in roots})
    while True:
        recorded = {p: t for p, t in recorded.items() if start_time(p) == t}
        if not recorded:
            return []
        recorded.update(tree(recorded))
        ready, _, _ = select.select([fd], [], [], poll_s)
        if ready and not os.read(fd, 4096):
            return kill(recorded)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a ^C at the terminal is for the driver
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    watch({int(p) for p in sys.argv[1].split(",") if p})
