"""Exactly one driver per sweep (issue 25 item 7; tracking/sweep/lock.py).

Before, two ``scarcelab sweep`` of one spec started together both looked for a RUNNING
sweep run, found none, created one each and ran every cell twice. The race test forces that
interleaving (each driver process waits, just before it creates its first run, until the
other has got there too) and counts the cell runs; the lock tests check holding, release
and the takeover of a dead driver's lock, from this host (its process is gone) and from
another (its heartbeat is stale), in a real sqlite store.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def client(tmp_path):  # type: ignore[no-untyped-def]
    return MlflowClient(f"sqlite:///{tmp_path / 'm.db'}")


def _locks(client: MlflowClient) -> list[str]:
    return [e.name for e in client.search_experiments() if e.name.startswith(".scarcelab")]


def test_one_holder_then_the_next_after_release(client) -> None:  # type: ignore[no-untyped-def]
    from scarcelab.tracking.sweep.lock import SweepLock, SweepLocked

    exp = client.create_experiment("e")
    a = SweepLock(client, exp, "grid")
    a.acquire()
    b = SweepLock(client, exp, "grid")
    with pytest.raises(SweepLocked, match=r"sweep 'grid' is being run by the driver "
                       f"{socket.gethostname()}:{os.getpid()}:"):
        b.acquire()
    other = SweepLock(client, exp, "another grid")  # other sweeps are not held up
    other.acquire()
    other.release()
    a.release()
    assert _locks(client) == []  # a released lock leaves no active experiment behind
    b.acquire()
    assert _locks(client) == [b.name]
    b.release()


def _forge(client: MlflowClient, lock: object, owner: str, beat: float) -> None:
    from scarcelab import tags as T

    client.set_experiment_tag(lock.lock_id, T.LOCK_OWNER, owner)  # type: ignore[attr-defined]
    client.set_experiment_tag(lock.lock_id, T.LOCK_HEARTBEAT, str(beat))  # type: ignore[attr-defined]


def test_a_dead_drivers_lock_is_taken_over(client) -> None:  # type: ignore[no-untyped-def]
    from scarcelab.tracking.sweep.lock import SweepLock, SweepLocked

    exp = client.create_experiment("e")
    held = SweepLock(client, exp, "grid", beat_s=3600)
    held.acquire()
    # on this host, a process that has exited: taken over at once, heartbeat or not
    gone = subprocess.Popen(["true"])
    gone.wait()
    _forge(client, held, f"{socket.gethostname()}:{gone.pid}:1", time.time())
    nxt = SweepLock(client, exp, "grid")
    nxt.acquire()
    assert nxt.lock_id != held.lock_id and _locks(client) == [nxt.name]
    # another host: alive while its heartbeat is fresh, dead once it is older than the TTL
    _forge(client, nxt, "elsewhere:4242:99", time.time() - 5)
    with pytest.raises(SweepLocked, match="elsewhere:4242:99"):
        SweepLock(client, exp, "grid", ttl_s=60).acquire()
    _forge(client, nxt, "elsewhere:4242:99", time.time() - 61)
    late = SweepLock(client, exp, "grid", ttl_s=60)
    late.acquire()
    # the stale holder, were it only stalled, finds out at its next beat and stops
    assert not nxt.lost and not nxt._mine()
    nxt.lost = True  # what its heartbeat thread sets on seeing that (next test)
    with pytest.raises(SweepLocked, match="lost its lock"):
        nxt.check()
    # a second reclaimer that read the dead lock too renames that one again: harmless
    late._retire(nxt.lock_id, "reclaimed")
    assert _locks(client) == [late.name] and late._mine()
    late.release()
    assert _locks(client) == []


def test_a_killed_driver_not_yet_reaped_is_dead(client) -> None:  # type: ignore[no-untyped-def]
    """Issue 42 item 10: a driver killed with SIGKILL whose parent has not collected its exit
    status yet (a supervisor starting the sweep again first) is a zombie whose /proc entry,
    start time included, is still there; it held the lock, and the re-run was refused as
    "being run by the driver"."""
    from scarcelab.tracking.sweep.lock import SweepLock

    exp = client.create_experiment("e")
    held = SweepLock(client, exp, "grid", beat_s=3600)
    held.acquire()
    victim = subprocess.Popen(["sleep", "600"])
    try:
        start = Path(f"/proc/{victim.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        _forge(client, held, f"{socket.gethostname()}:{victim.pid}:{start}", time.time())
        victim.kill()
        deadline = time.time() + 20
        while Path(f"/proc/{victim.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.time() < deadline, "the killed process never became a zombie"
            time.sleep(0.05)
        nxt = SweepLock(client, exp, "grid")
        nxt.acquire()  # before: SweepLocked "being run by the driver <host>:<pid>:<start>"
        assert nxt.lock_id != held.lock_id and _locks(client) == [nxt.name]
        nxt.release()
    finally:
        victim.kill()
        victim.wait()


def test_the_heartbeat_keeps_the_lock_and_notices_a_takeover(client) -> None:  # type: ignore[no-untyped-def]
    from scarcelab import tags as T
    from scarcelab.tracking.sweep.lock import SweepLock

    exp = client.create_experiment("e")
    lock = SweepLock(client, exp, "grid", beat_s=0.05)
    lock.acquire()
    first = float(client.get_experiment(lock.lock_id).tags[T.LOCK_HEARTBEAT])
    deadline = time.time() + 20
    while float(client.get_experiment(lock.lock_id).tags[T.LOCK_HEARTBEAT]) == first:
        assert time.time() < deadline, "the heartbeat was never rewritten"
        time.sleep(0.05)
    _forge(client, lock, "elsewhere:1:1", time.time())  # someone else holds it now
    while not lock.lost:
        assert time.time() < deadline, "the takeover was never noticed"
        time.sleep(0.05)
    lock.release()  # not ours any more: left to its holder
    assert _locks(client) == [lock.name]


# -- two drivers started together -------------------------------------------------------------

SPEC = """\
name: race
retries: 0
grids:
  - entry: self
    method: simclr
    seed: [0, 1]
"""

# the real Driver, with cells run one by one in its own process (no Ray: the race is in the
# record, not in the scheduling) and a rendezvous before its first create_run
DRIVER = """
import os, sys, time
from pathlib import Path
import scarcelab.entrypoints.cli  # the command table the spec is read against
from scarcelab.tracking.sweep import pool

class InlinePool:
    def __init__(self, *a, **k):
        self.slots, self.done = 1, []
    def submit(self, key, fn, *args):
        self.done.append((key, fn(*args), None))
    def __len__(self):
        return len(self.done)
    running = 0
    def next_done(self):
        return self.done.pop(0)

pool.RayPool = InlinePool
from mlflow.tracking import MlflowClient
create_run, meet = MlflowClient.create_run, Path(sys.argv[3])
def rendezvous(self, *a, **k):
    if not getattr(rendezvous, "met", False):
        rendezvous.met = True
        (meet / str(os.getpid())).touch()
        t = time.time()
        while len(list(meet.iterdir())) < 2 and time.time() - t < 5:
            time.sleep(0.02)
    return create_run(self, *a, **k)
MlflowClient.create_run = rendezvous
from scarcelab.tracking.sweep.driver import Driver
from scarcelab.tracking.sweep.spec import load_spec
Driver._log_report = lambda self, run: False  # the grid report is not what is tested
try:
    res = Driver(load_spec(sys.argv[1]), python=sys.argv[2], echo=lambda s: None).run()
except RuntimeError as e:
    print("REFUSED", e)
    sys.exit(3)
print("RAN", res.count("FINISHED"))
"""


def test_two_drivers_started_together_run_each_cell_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = MlflowClient(uri)
    exp = c.create_experiment("race")
    spec = tmp_path / "race.yaml"
    spec.write_text(SPEC)
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {REPO / 'tests/sweep_fake_cell.py'} "
                      '"$@"\n')
    python.chmod(0o755)
    meet = tmp_path / "meet"
    meet.mkdir()
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(REPO),
           "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_RUN_ID", None)
    procs = [subprocess.Popen([sys.executable, "-c", DRIVER, str(spec), str(python), str(meet)],
                              env=env, cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    codes = sorted(p.returncode for p in procs)
    cells: dict[str, list[str]] = {}
    for r in c.search_runs([exp], "tags.`scarcelab.cell` != ''"):
        cells.setdefault(r.data.tags["scarcelab.cell"], []).append(r.info.status)
    assert len(cells) == 2
    assert all(s == ["FINISHED"] for s in cells.values()), (cells, outs)
    assert codes == [0, 3], outs
    refused = next(o for o, p in zip(outs, procs, strict=True) if p.returncode == 3)
    assert "REFUSED sweep 'race' is being run by the driver" in refused, refused
    assert _locks(c) == []
