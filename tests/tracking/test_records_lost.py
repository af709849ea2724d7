"""Records the spool could only hold in memory (its disk was full during an outage) are lost
when the process is killed; the next start, or the resume, marks the runs they belonged to
with what is gone (issue 25 item 12). Before, such a study run stayed RUNNING with part of
its trials and nothing said so.

The writer is a real process killed with SIGKILL, spooling on a real full disk (a 64 KiB
tmpfs when this runs as root; else the journal refuses records as a full disk does), into
a real sqlite MLflow store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from scarcelab import tags as T
from scarcelab.tracking.spool import LEDGER, MemoryLedger, leftovers

REPO = Path(__file__).resolve().parents[2]

# The writer: trial 0 reaches the server; then the server goes away and the spool journals
# to disk until the disk is full; trial 1's last two epochs and its end, trial 2 entirely
# and the study's best-so-far of those four epochs are held in memory only (11 records).
# Then SIGKILL.
_WRITER = r"""
import errno, os, signal, socket, sys
import mlflow
from mlflow.tracking import MlflowClient
from scarcelab.tracking import spool as sp_mod
from scarcelab.tracking.mlflow_tracker import deliver_op

root, uri, mounted = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
mlflow.set_tracking_uri(uri)
c = MlflowClient()
exp = c.create_experiment("lost")
study = c.create_run(exp, run_name="study", tags={
    "scarcelab.role": "study", "scarcelab.study_key": "k",
    "scarcelab.owner": f"{socket.gethostname()}:{os.getpid()}"}).info.run_id
print(study, flush=True)
down = [False]


def deliver(op, ids):
    if down[0]:
        raise ConnectionError("tracking server away")
    return deliver_op(op, ids)


sp = sp_mod.Spool(uri, deliver, root=root, remote=True)
sp.ids["study"] = study


def fill_disk():
    if mounted:  # a real full disk: every free block of the tmpfs taken
        with open(os.path.join(root, "filler"), "wb") as f:
            try:
                while True:
                    f.write(b"f" * 4096)
                    f.flush()
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
    else:  # no tmpfs to fill: the journal refuses records as a full disk does
        def full(op):
            raise sp_mod.DiskFull(errno.ENOSPC, "No space left on device")

        sp._append = full


pad = "x" * 5000  # larger than what is left of the journal's last page
step = [0]


def trial(n, epochs, hook_at=None):
    key = f"trial-{n}"
    sp.submit({"op": "create_run", "key": key, "parent": "study", "experiment_id": exp,
               "run_name": f"t{n}", "start_time": 1,
               "tags": {"scarcelab.role": "trial", "scarcelab.trial": str(n)}})
    for e in range(epochs):
        if e == hook_at:
            fill_disk()
        sp.submit({"op": "log_batch", "key": key, "params": [[f"pad{e}", pad]],
                   "metrics": [["val/balanced_accuracy", 0.5 + e / 10, 1, e]]})
        sp.submit({"op": "log_batch", "key": "study",
                   "metrics": [["best/val_balanced_accuracy", 0.5 + e / 10, 1, step[0]]]})
        step[0] += 1
    sp.submit({"op": "terminate", "key": key, "status": "FINISHED", "end_time": 2})


trial(0, 3)
down[0] = True
trial(1, 3, hook_at=1)  # its creation and epoch 0 reach the journal, then the disk is full
trial(2, 2)
assert sp.journaled == 3, sp.journaled
print(sp.memory_only, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.fixture
def store(store, monkeypatch):  # type: ignore[no-untyped-def]
    """conftest's store with the system-metrics monitor off, as this module's own copy had:
    no monitor thread (tracking/run_views.py) logs beside the records these tests count, and
    none is left behind by a writer that is killed."""
    monkeypatch.setenv("SCARCELAB_SYSTEM_METRICS", "0")
    return store


def _killed_writer(tmp_path: Path, uri: str) -> tuple[str, Path, int]:
    """Run the writer until its SIGKILL; (study run id, spool root, records lost)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
        capture_output=True).returncode == 0
    try:
        p = subprocess.run([sys.executable, "-c", _WRITER, str(mnt), uri,
                            "0" if mounted else "1"],
                           env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == -signal.SIGKILL, p.stderr[-3000:]
        study, count = p.stdout.split("\n")[:2]
        root = tmp_path / "spool"
        # the disk stays as the dead process left it; a copy lets the test unmount it
        import shutil

        shutil.copytree(mnt, root, ignore=shutil.ignore_patterns("lock", "filler"))
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
    return study, root, int(count)


def test_records_lost_at_kill9_are_marked_on_the_next_start_and_the_resume(tmp_path, store):
    study, root, n_lost = _killed_writer(tmp_path, store)
    (folder,) = leftovers(store, root)
    ledger = MemoryLedger.read(folder)
    assert ledger is not None and ledger["records"] == n_lost  # survived the full disk
    c = MlflowClient()

    # the next start replays the dead process's spool and marks what it could not deliver
    from scarcelab.tracking.mlflow_tracker import MlflowTracker

    tracker = MlflowTracker(experiment="lost", spool_root=root)
    resume = tracker.resume_state("k")  # the resume replays before it reads anything
    assert resume is not None and tracker._resume_run == study
    assert not folder.exists()  # delivered, marked, removed

    exp = c.get_run(study).info.experiment_id
    trials = {r.data.tags["scarcelab.trial"]: r for r in c.search_runs(
        [exp], f"tags.`mlflow.parentRunId` = '{study}'")}
    assert sorted(trials) == ["0", "1"]  # trial 2 was never created: its records are gone
    t0, t1 = trials["0"], trials["1"]
    assert t0.info.status == "FINISHED" and T.RECORDS_LOST not in t0.data.tags
    # trial 1: epochs 1 and 2 and its end were held in memory only; the replay closed it
    # FAILED rather than leave it RUNNING for ever (issue 42 item 9)
    assert t1.info.status == "FAILED" and t1.data.tags["scarcelab.ended_by_replay"] == "true"
    assert [m.step for m in c.get_metric_history(t1.info.run_id, "val/balanced_accuracy")] \
        == [0]
    line = t1.data.tags[T.RECORDS_LOST]
    assert t1.data.tags["scarcelab.epochs_lost"] == "2"
    assert line.startswith("Records lost: 3 tracking record(s) of this run")
    assert "steps 1-2" in line and "left RUNNING" in line and "disk was full" in line
    assert line in t1.data.tags["mlflow.note.content"]  # and in its description

    s = c.get_run(study)
    sline = s.data.tags[T.RECORDS_LOST]
    # the study's own best-so-far of trial 1's epochs 1-2 and trial 2's epochs 0-1 (steps
    # 4-7), and trial 2: its creation and two epochs, the whole run
    assert s.data.tags["scarcelab.trials_lost"] == "1"
    assert s.data.tags["scarcelab.epochs_lost"] == "4"
    assert "4 tracking record(s) of this run (the metrics of 4 epoch(s), steps 4-7)" in sline
    assert "1 run(s) under it that were never created (trial 2: 4 record(s), the metrics " \
        "of 2 epoch(s))" in sline
    assert [m.step for m in c.get_metric_history(study, "best/val_balanced_accuracy")] == \
        [0, 1, 2, 3]
    assert sline == s.data.tags["mlflow.note.content"]
    assert n_lost == 3 + 4 + 4

    # the resumed study rewrites its description at the end: the line is kept
    tracker.start_study("study", {"scarcelab.role": "study", "scarcelab.study_key": "k"},
                        {}, {})
    tracker.end_study("FINISHED")
    s = c.get_run(study)
    assert s.info.status == "FINISHED"
    note = s.data.tags["mlflow.note.content"]
    assert note.startswith("**study**") and note.count(sline) == 1


def test_ledger_is_overwritten_in_place_and_summarises_what_memory_holds(tmp_path):
    led = MemoryLedger()
    led.create(tmp_path)
    path = tmp_path / LEDGER
    size = path.stat().st_size
    ops = [{"op": "create_run", "key": "t5", "parent": "study",
            "tags": {"scarcelab.trial": "5"}},
           {"op": "log_batch", "key": "t5", "metrics": [["a", 1.0, 0, 0], ["b", 1.0, 0, 0]]},
           {"op": "log_batch", "key": "t5", "metrics": [["a", 1.0, 0, 1]]},
           {"op": "terminate", "key": "t5", "status": "FINISHED", "end_time": 1}]
    for op in ops:
        led.count(op)
    got = json.loads(path.read_bytes())
    assert path.stat().st_size == size  # never grows: a full disk can take it
    assert got["records"] == 4 and got["runs"]["t5"]["steps"] == [0, 1]
    assert got["runs"]["t5"]["ops"] == {"create_run": 1, "log_batch": 2, "terminate": 1}
    for op in ops:  # delivered after all: nothing is lost
        led.count(op, -1)
    assert MemoryLedger.read(tmp_path) is None
    for i in range(400):  # more runs than the page holds: the total survives
        led.count({"op": "log_batch", "key": f"trial-{i}", "metrics": [["a", 1.0, 0, i]]})
    got = json.loads(path.read_bytes())
    assert got["records"] == 400 and got.get("truncated") and path.stat().st_size == size
