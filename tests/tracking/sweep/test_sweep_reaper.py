"""The watcher that takes an embedded Ray cluster down with its driver
(tracking/sweep/reaper.py, issue 42 item 10), on plain processes instead of Ray: a
"driver" starts a tree whose grandchildren it does not know about (as the raylet starts
Ray's agents), hands the tree's root to the watcher, and is killed with SIGKILL."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scarcelab.tracking.sweep import reaper

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="Linux /proc")

DRIVER = """
import subprocess, sys, time
from scarcelab.tracking.sweep import pool
# the root starts a grandchild and is then killed like Ray's GCS/raylet (fate-shared):
# the grandchild is reparented and only the watcher's record still ties it to the driver
root = subprocess.Popen(["sh", "-c", "sleep 600 & echo $!; exec sleep 600"],
                        stdout=subprocess.PIPE, text=True)
grandchild = int(root.stdout.readline())
pool._reap_with_us({root.pid})
time.sleep(2.5)  # the watcher records the tree (every POLL_S = 1 s)
print(root.pid, grandchild, pool._REAPERS[0].pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    return bool(reaper.start_time(pid))


def test_the_tree_dies_with_a_sigkilled_driver(tmp_path: Path) -> None:
    d = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True,
                         cwd=tmp_path)
    pids: list[int] = []
    try:
        pids = [int(x) for x in d.stdout.readline().split()]  # type: ignore[union-attr]
        root, grandchild, watcher = pids
        assert _alive(root) and _alive(grandchild) and _alive(watcher)
        d.send_signal(signal.SIGKILL)
        d.wait()
        deadline = time.time() + 15
        while (_alive(root) or _alive(grandchild)) and time.time() < deadline:
            time.sleep(0.1)
        # before: nothing watched them, both slept on for their 600 s
        assert not _alive(grandchild) and not _alive(root)
        deadline = time.time() + 10
        while _alive(watcher) and time.time() < deadline:
            time.sleep(0.1)
        assert not _alive(watcher), "the watcher outlived its work"
    finally:
        d.kill()
        d.wait()
        for p in pids:
            try:
                reaper.os.kill(p, signal.SIGKILL)
            except OSError:
                pass


def test_a_reused_pid_is_left_alone() -> None:
    p = subprocess.Popen(["sleep", "600"])
    try:
        token = reaper.start_time(p.pid)
        assert token
        # recorded with another start time: the process is not the one recorded
        assert reaper.kill({p.pid: str(int(token) - 1)}, grace_s=0.1) == []
        assert p.poll() is None
        assert reaper.kill({p.pid: token}, grace_s=2) == [p.pid]
        assert p.wait(5) == -signal.SIGTERM
    finally:
        p.kill()
        p.wait()


def test_the_watcher_ends_when_the_cluster_ended_in_order() -> None:
    """After an orderly ``ray.shutdown`` the recorded processes are gone: the watcher ends
    without waiting for the driver and kills nothing, and a pid of the dead cluster reused
    later is never followed."""
    import os

    p = subprocess.Popen(["sleep", "1"])
    r, w = os.pipe()
    try:
        t0 = time.time()
        assert reaper.watch({p.pid}, fd=r, poll_s=0.05) == []
        assert p.poll() is not None and time.time() - t0 < 10
        assert reaper.tree({p.pid: "1"}) == {}  # not the recorded process: not followed
    finally:
        os.close(w)
        os.close(r)
        p.kill()
        p.wait()


def test_a_new_cluster_kills_agents_whose_raylet_is_gone() -> None:
    """Second line of defence (the watcher killed along with its driver): Ray agents of this
    user whose raylet is gone are killed before the next embedded cluster starts; agents of
    a live raylet, and Ray processes that do not name their raylet, are left alone."""
    import os

    gone = subprocess.Popen(["true"])
    gone.wait()
    raylet = subprocess.Popen(["bash", "-c", "exec -a raylet sleep 600"])

    def fake(name: str, env: dict[str, str]) -> subprocess.Popen:
        e = {k: v for k, v in os.environ.items() if k != "RAY_RAYLET_PID"}
        return subprocess.Popen(["bash", "-c", f'exec -a "{name}" sleep 600'], env={**e, **env})

    orphan = fake("ray::RuntimeEnvAgent", {"RAY_RAYLET_PID": str(gone.pid)})
    kept = fake("ray::DashboardAgent", {"RAY_RAYLET_PID": str(raylet.pid)})
    unnamed = fake("ray::IDLE", {})
    procs = [raylet, orphan, kept, unnamed]
    try:
        deadline = time.time() + 10
        while not all(reaper._cmdline(p.pid).startswith((b"ray", b"raylet")) for p in procs):
            assert time.time() < deadline
            time.sleep(0.05)
        found = reaper.orphaned_agents()
        assert orphan.pid in found
        assert not {kept.pid, unnamed.pid, raylet.pid} & set(found)
        assert orphan.pid in reaper.reap_orphans()
        assert orphan.wait(5) == -signal.SIGKILL
        assert kept.poll() is None and unnamed.poll() is None
    finally:
        for p in procs:
            p.kill()
            p.wait()
