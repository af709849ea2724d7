"""A local store's tracking batches go out on a delivery thread (issue 28 §1).

Before, every ``log_batch`` into a sqlite store ran on the training thread (8 ms each,
a thousand per short-trial study). These tests pin what the thread must keep: the order of
every record, runs closed when ``end_trial`` returns, a refused write raised on the
caller's thread, and a process crash losing nothing that was submitted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from scarcelab.tracking.spool import Spool, TrackingWriteError, leftovers


class Recorder:
    """A store that records what it got, can be held (``gate``) and can refuse one op."""

    def __init__(self) -> None:
        self.got: list[tuple[str, str | None, int]] = []  # (op, key, seq)
        self.gate = threading.Event()
        self.gate.set()
        self.refuse: int | None = None
        self.threads: set[str] = set()

    def __call__(self, op, ids):  # type: ignore[no-untyped-def]
        assert self.gate.wait(10), "the test never released the store"
        self.threads.add(threading.current_thread().name)
        seq = int(op.get("seq", -1))
        if seq == self.refuse:
            raise ValueError(f"bad batch {seq}")
        self.got.append((op["op"], op.get("key"), seq))
        return f"run-{op['key']}" if op["op"] == "create_run" else None


def _local(tmp_path: Path, store: Recorder) -> Spool:
    sp = Spool("sqlite:///x.db", store, root=tmp_path / "spool", background=True)
    sp.ids["study"] = "run-study"
    return sp


def test_batches_do_not_wait_for_a_slow_store(tmp_path):
    """The old local path called the store on the caller's thread: with the store held,
    ``submit`` would not return (here: it would wait 10 s and fail)."""
    store = Recorder()
    sp = _local(tmp_path, store)
    store.gate.clear()  # the store hangs
    for i in range(5):
        sp.submit({"op": "log_batch", "key": "study", "metrics": [["m", 1.0, 1, i]], "seq": i})
    assert store.got == []  # five submits returned while the store delivered nothing
    store.gate.set()
    sp.drain()
    assert [g[2] for g in store.got] == [0, 1, 2, 3, 4]
    assert store.threads == {"scarcelab-tracking"}
    assert sp.close(0) is None


def test_every_other_operation_waits_for_the_queue_and_keeps_the_order(tmp_path):
    store = Recorder()
    sp = _local(tmp_path, store)
    seq = 0
    expect = []
    for trial in range(3):
        key = f"t{trial}"
        ops = [{"op": "create_run", "key": key, "parent": "study"},
               *({"op": "log_batch", "key": key, "metrics": [["m", 0.5, 1, e]]}
                 for e in range(4)),
               {"op": "note_append", "key": key, "line": "x"},
               {"op": "terminate", "key": key, "status": "FINISHED", "end_time": 1}]
        for op in ops:
            sp.submit({**op, "seq": seq})
            expect.append((op["op"], key, seq))
            seq += 1
            if op["op"] in ("create_run", "terminate"):
                # returned only after it and everything before it was delivered
                assert store.got == expect
    sp.submit({"op": "log_batch", "key": "study", "metrics": [], "seq": seq})
    expect.append(("log_batch", "study", seq))
    assert sp.close(0) is None
    assert store.got == expect
    assert sp.ids["t2"] == "run-t2"
    assert not (tmp_path / "spool").exists() or not list((tmp_path / "spool").iterdir())


def test_a_refused_batch_is_raised_at_the_next_call_and_nothing_after_it_is_lost(tmp_path):
    store = Recorder()
    store.refuse = 1
    sp = _local(tmp_path, store)
    store.gate.clear()  # the refusal happens after the three submits returned
    sp.submit({"op": "log_batch", "key": "study", "metrics": [], "seq": 0})
    sp.submit({"op": "log_batch", "key": "study", "metrics": [], "seq": 1})
    sp.submit({"op": "log_batch", "key": "study", "metrics": [], "seq": 2})
    store.gate.set()
    with pytest.raises(TrackingWriteError, match=r"refused a queued log_batch of run 'study'"
                       r".*ValueError: bad batch 1"):
        sp.submit({"op": "terminate", "key": "study", "status": "FAILED", "end_time": 1,
                   "seq": 3})
    # the operation of the call that raised went out too, after everything before it
    assert [g[2] for g in store.got] == [0, 2, 3]
    sp.submit({"op": "log_batch", "key": "study", "metrics": [], "seq": 4})  # raised once
    assert sp.close(0) is None
    assert [g[2] for g in store.got] == [0, 2, 3, 4]


def test_a_refusal_found_at_the_close_is_raised_there(tmp_path):
    store = Recorder()
    store.refuse = 0
    sp = _local(tmp_path, store)
    store.gate.clear()
    sp.submit({"op": "log_batch", "key": "study", "metrics": [], "seq": 0})
    store.gate.set()
    with pytest.raises(TrackingWriteError, match="bad batch 0"):
        sp.close(0)


def test_the_journal_holds_only_what_is_not_delivered(tmp_path):
    """Queued batches are journaled before the thread sends them; the journal is cut back
    when the queue drains, so a long study's journal does not grow."""
    from scarcelab.tracking.spool import QUEUE_FILE, read_journal

    store = Recorder()
    sp = _local(tmp_path, store)
    store.gate.clear()
    for i in range(3):
        sp.submit({"op": "log_batch", "key": "study", "metrics": [["m", 1.0, 1, i]], "seq": i})
    assert sp.dir is not None
    records, why = read_journal(sp.dir / QUEUE_FILE)
    assert why is None and [r["op"]["seq"] for r in records] == [0, 1, 2]
    state = json.loads((sp.dir / "state.json").read_text())
    assert state["ids"] == {"study": "run-study"} and state["pid"] == os.getpid()
    store.gate.set()
    sp.drain()
    assert (sp.dir / QUEUE_FILE).stat().st_size == 0
    sp.submit({"op": "create_run", "key": "t0", "parent": "study", "seq": 3})
    # a run created after the folder exists is in its state at once (a replay needs its id)
    assert json.loads((sp.dir / "state.json").read_text())["ids"]["t0"] == "run-t0"
    folder = sp.dir
    assert sp.close(0) is None and not folder.exists()


def test_without_background_a_local_store_is_still_called_at_once(tmp_path):
    store = Recorder()
    sp = Spool("sqlite:///x.db", store, root=tmp_path / "spool")
    sp.ids["study"] = "run-study"
    sp.submit({"op": "log_batch", "key": "study", "metrics": [], "seq": 0})
    assert store.got == [("log_batch", "study", 0)]
    assert threading.current_thread().name in store.threads


# -- through MLflow and a real sqlite store ---------------------------------------------------

CHILD = textwrap.dedent("""
    import os, sys, time
    import mlflow
    from scarcelab.tracking import mlflow_tracker as mt

    root, mode = sys.argv[1], sys.argv[2]
    real = mt.deliver_op
    held = []

    def deliver(op, ids):
        if mode == "kill" and op["op"] == "log_batch" and op.get("metrics") and \\
                op["metrics"][0][3] >= 2:
            held.append(op)
            time.sleep(3600)  # the store hangs: epochs 2.. stay queued
        return real(op, ids)

    mt.deliver_op = deliver
    t = mt.MlflowTracker(experiment="bg", spool_root=root)
    t.start_study("s", {"scarcelab.role": "study"}, {"lr": 0.1}, {})
    t.start_trial(0, {"scarcelab.role": "trial", "scarcelab.trial": "0"}, {"a": 1})
    for e in range(5):
        t.log_metrics({"val_loss": 1.0 / (e + 1), "val_acc": e / 10}, step=e)
    print(t.study_run_id, t.trial_run_id, flush=True)
    if mode == "kill":
        while not held:
            time.sleep(0.01)
        os.kill(os.getpid(), 9)
    # mode "exit": the process ends without end_trial / end_study
""")


def _child(tmp_path: Path, mode: str) -> tuple[str, str]:
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db",
           "SCARCELAB_SYSTEM_METRICS": "0"}
    p = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "spool"), mode],
                       capture_output=True, text=True, env=env, timeout=300)
    if mode == "kill":
        assert p.returncode == -signal.SIGKILL, p.stderr[-3000:]
    else:
        assert p.returncode == 0, p.stderr[-3000:]
    study, trial = p.stdout.split()
    return study, trial


def _history(trial: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    return sorted((m.step, m.value) for m in MlflowClient().get_metric_history(trial,
                                                                                "val_loss"))


def test_a_killed_process_loses_no_queued_batch(tmp_path):
    """kill -9 while the store holds epochs 2-4 in the queue: the next tracker started
    against the same store delivers them from the journal."""
    import mlflow

    from scarcelab.tracking.mlflow_tracker import MlflowTracker

    study, trial = _child(tmp_path, "kill")
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    assert [s for s, _ in _history(trial)] == [0, 1]  # what reached the store before
    assert len(leftovers(mlflow.get_tracking_uri(), tmp_path / "spool")) == 1
    t = MlflowTracker(experiment="bg", spool_root=tmp_path / "spool")
    t.start_study("s2", {"scarcelab.role": "study"}, {}, {})  # replays what was left
    assert _history(trial) == [(e, 1.0 / (e + 1)) for e in range(5)]
    t.end_study("FINISHED")
    assert not list((tmp_path / "spool").iterdir())


def test_a_process_that_ends_without_closing_still_delivers(tmp_path):
    import mlflow

    study, trial = _child(tmp_path, "exit")
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    assert _history(trial) == [(e, 1.0 / (e + 1)) for e in range(5)]
    assert not list((tmp_path / "spool").iterdir())
