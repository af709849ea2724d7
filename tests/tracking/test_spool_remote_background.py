"""A remote tracking server's writes go through the delivery thread too (issue 40 item 4).

Before, only a local store had the thread: with an ``http://`` server every metric, param and
tag write ran on the training thread (a round trip and ~28 ms of the server's CPU each).
These tests pin what the remote thread must keep: the records (merged into fewer requests,
within MLflow's limits, each metric with its own step and timestamp), their order, a bounded
queue that makes the caller wait rather than drop, an outage that spools and is delivered
later without the caller's help, refusals kept per operation, and a ``kill -9`` that loses
nothing queued. The first part uses a recording stand-in for the server; the second a real
``mlflow server`` on loopback.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from mlflow.exceptions import MlflowException, RestException

import scarcelab.tracking.spool as spool_mod
from scarcelab.tracking.spool import QUEUE_FILE, Spool, leftovers, read_journal

REPO = Path(__file__).resolve().parents[2]


class Server:
    """A remote server stand-in: records requests; ``up`` False raises what a dead server
    raises; ``gate`` holds every request; an op with ``bad`` in a tag value is refused."""

    def __init__(self) -> None:
        self.up = True
        self.got: list[dict] = []
        self.gate = threading.Event()
        self.gate.set()
        self.n = 0
        self.threads: set[str] = set()

    def __call__(self, op, ids):  # type: ignore[no-untyped-def]
        assert self.gate.wait(30), "the test never released the server"
        self.threads.add(threading.current_thread().name)
        if not self.up:
            raise MlflowException("API request failed: Max retries exceeded (Connection refused)")
        if any(v == "bad" for _, v in op.get("tags") or []):
            raise RestException({"error_code": "INVALID_PARAMETER_VALUE", "message": "no"})
        if op.get("key") and op["op"] != "create_run":
            assert op["key"] in ids, "an operation arrived before its run existed"
        self.got.append({**op, "run": ids.get(op.get("key", ""))})
        if op["op"] == "create_run":
            self.n += 1
            return f"run{self.n}"
        return None

    def batches(self, key: str | None = None) -> list[dict]:
        return [o for o in self.got if o["op"] == "log_batch"
                and (key is None or o["key"] == key)
                and o.get("tags") != [["scarcelab.spool", "delivered_late"]]]

    def metrics(self, key: str) -> list[list]:
        return [m for o in self.batches(key) for m in o.get("metrics") or []]


def _remote(tmp_path: Path, srv: Server, **kw) -> Spool:  # type: ignore[no-untyped-def]
    sp = Spool("http://127.0.0.1:9", srv, root=tmp_path / "spool", background=True, **kw)
    sp.ids["study"] = "S"
    return sp


def _metric_ops(key: str, n: int, per: int = 1, t0: int = 1000) -> list[dict]:
    return [{"op": "log_batch", "key": key,
             "metrics": [[f"m{j}", float(i * per + j), t0 + i, i] for j in range(per)]}
            for i in range(n)]


def test_remote_batches_go_out_on_the_thread_merged_one_request_per_run(tmp_path):
    """Before: each submit called the server on the caller's thread (here the gated
    server would have held the first submit for 30 s and failed it)."""
    srv = Server()
    sp = _remote(tmp_path, srv, batch_s=60.0)
    srv.gate.clear()
    ops = []
    for a, b in zip(_metric_ops("study", 20), _metric_ops("t0", 20, t0=5000), strict=True):
        ops += [a, b]
    sp.ids["t0"] = "T0"
    t0 = time.monotonic()
    for op in ops:
        sp.submit(op)
    assert time.monotonic() - t0 < 20 and srv.got == []  # none of the 40 waited
    srv.gate.set()
    t1 = time.monotonic()
    sp.drain()  # the caller waits: what the thread held goes now, not after 60 s
    assert time.monotonic() - t1 < 30
    assert srv.threads == {"scarcelab-tracking"}
    assert len(srv.batches("study")) == 1 and len(srv.batches("t0")) == 1
    assert srv.metrics("study") == [m for o in ops if o["key"] == "study" for m in o["metrics"]]
    assert srv.metrics("t0") == [m for o in ops if o["key"] == "t0" for m in o["metrics"]]
    assert sp.close(0) is None and not list((tmp_path / "spool").iterdir())


def test_held_batches_go_out_by_themselves_after_batch_s(tmp_path):
    srv = Server()
    sp = _remote(tmp_path, srv, batch_s=0.3)
    for op in _metric_ops("study", 5):
        sp.submit(op)
    end = time.time() + 30
    while not srv.got and time.time() < end:
        time.sleep(0.05)
    assert len(srv.batches("study")) == 1 and len(srv.metrics("study")) == 5
    # the queue file was cut once the thread had handed everything on
    end = time.time() + 10
    while (sp.dir / QUEUE_FILE).stat().st_size and time.time() < end:
        time.sleep(0.05)
    assert (sp.dir / QUEUE_FILE).stat().st_size == 0
    assert sp.close(0) is None


def test_merged_requests_keep_mlflows_limits_and_every_record(tmp_path):
    srv = Server()
    sp = _remote(tmp_path, srv, batch_s=60.0)
    metric_ops = _metric_ops("study", 25, per=100)  # 2,500 metrics
    for op in metric_ops:
        sp.submit(op)
    param_ops = [{"op": "log_batch", "key": "study",
                  "params": [[f"p{i}_{j}", str(j)] for j in range(10)]} for i in range(15)]
    for op in param_ops:  # 150 params
        sp.submit(op)
    for i in range(250):  # one tag written 250 times: its last value is what stays
        sp.submit({"op": "log_batch", "key": "study", "tags": [["epoch", str(i)]]})
    sp.drain()
    reqs = srv.batches("study")
    for r in reqs:
        n = {k: len(r.get(k) or []) for k in ("metrics", "params", "tags")}
        assert n["metrics"] <= 1000 and n["params"] <= 100 and n["tags"] <= 100
        assert sum(n.values()) <= 1000
    assert len(reqs) <= 5  # 3 full metric requests, then the params in two
    assert srv.metrics("study") == [m for o in metric_ops for m in o["metrics"]]
    assert [p for r in reqs for p in r.get("params") or []] == \
        [p for o in param_ops for p in o["params"]]
    tags = [t for r in reqs for t in r.get("tags") or []]
    assert tags and tags[-1] == ["epoch", "249"] and len(tags) <= 3
    assert sp.close(0) is None


def test_a_param_logged_again_with_another_value_is_not_merged_away(tmp_path):
    """MLflow refuses a changed param; merged into one request with its first value it
    would either vanish or take the whole request down."""
    srv = Server()
    sp = _remote(tmp_path, srv, batch_s=60.0)
    sp.submit({"op": "log_batch", "key": "study", "params": [["lr", "0.1"]]})
    sp.submit({"op": "log_batch", "key": "study", "params": [["lr", "0.1"]],
               "metrics": [["a", 1.0, 1, 0]]})
    sp.submit({"op": "log_batch", "key": "study", "params": [["lr", "0.2"]]})
    sp.drain()
    assert [r.get("params") for r in srv.batches("study")] == [[["lr", "0.1"]],
                                                               [["lr", "0.2"]]]
    assert sp.close(0) is None


def test_a_full_queue_makes_the_caller_wait_and_drops_nothing(tmp_path):
    srv = Server()
    sp = _remote(tmp_path, srv, batch_s=0.0, queue_max=2)
    srv.gate.clear()
    ops = _metric_ops("study", 8)
    done = threading.Event()

    def produce() -> None:
        for op in ops:
            sp.submit(op)
        done.set()

    th = threading.Thread(target=produce)
    th.start()
    time.sleep(1.0)
    assert not done.is_set()  # the queue (2) and the thread's one in hand are full
    srv.gate.set()
    th.join(30)
    assert done.is_set()
    sp.drain()
    assert srv.metrics("study") == [m for o in ops for m in o["metrics"]]
    assert sp.close(0) is None


def test_an_outage_spools_and_the_thread_delivers_later_by_itself(tmp_path, monkeypatch,
                                                                   capsys):
    monkeypatch.setattr(spool_mod, "RETRY_INTERVAL_S", 0.2)
    srv = Server()
    sp = _remote(tmp_path, srv, batch_s=0.1)
    first = _metric_ops("study", 3)
    for op in first:
        sp.submit(op)
    sp.drain()
    srv.up = False
    later = _metric_ops("study", 4, t0=2000)
    for op in later[:2]:
        sp.submit(op)
    sp.drain()  # handed on: into the spool, not lost and not waited for
    assert sp.dir is not None and len(sp.pending) == 2
    on_disk, why = read_journal(sp.dir / "journal.jsonl")
    assert why is None and [r["op"]["metrics"] for r in on_disk] == \
        [o["metrics"] for o in later[:2]]
    assert "unreachable" in capsys.readouterr().err
    sp.submit({"op": "create_run", "key": "t0", "parent": "study"})  # behind the backlog
    assert "t0" not in sp.ids
    for op in later[2:]:
        sp.submit(op)
    sp.submit({"op": "log_batch", "key": "t0", "metrics": [["x", 1.0, 3000, 0]]})
    srv.up = True
    end = time.time() + 30  # nobody calls the spool: the thread retries on its own
    while sp.pending and time.time() < end:
        time.sleep(0.05)
    assert not sp.pending and sp.ids["t0"] == "run1"
    assert srv.metrics("study") == [m for o in first + later for m in o["metrics"]]
    assert srv.metrics("t0") == [["x", 1.0, 3000, 0]]
    # the late marks follow the last record (Spool._finish, after `pending` empties):
    # wait for them too, or a loaded machine reads the server between the two
    def late() -> set:
        return {o["run"] for o in srv.got if o.get("tags") == [["scarcelab.spool",
                                                                 "delivered_late"]]}

    while late() != {"S", "run1"} and time.time() < end:
        time.sleep(0.05)
    assert late() == {"S", "run1"}
    assert sp.close(0) is None and not list((tmp_path / "spool").iterdir())


def test_a_refused_merged_request_rejects_only_the_refused_operation(tmp_path):
    srv = Server()
    sp = _remote(tmp_path, srv, batch_s=60.0)
    sp.submit({"op": "log_batch", "key": "study", "metrics": [["a", 1.0, 1, 0]]})
    sp.submit({"op": "log_batch", "key": "study", "tags": [["note", "bad"]]})
    sp.submit({"op": "log_batch", "key": "study", "metrics": [["a", 2.0, 2, 1]]})
    sp.drain()
    assert srv.metrics("study") == [["a", 1.0, 1, 0], ["a", 2.0, 2, 1]]
    rejected = [json.loads(ln) for ln in (sp.dir / "rejected.jsonl").read_text().splitlines()]
    assert [r["op"]["tags"] for r in rejected] == [[["note", "bad"]]]
    assert sp.close(0) == sp.dir  # reported at the end, with its folder


def test_the_thread_is_off_with_background_false(tmp_path):
    srv = Server()
    sp = Spool("http://127.0.0.1:9", srv, root=tmp_path / "spool")
    sp.ids["study"] = "S"
    sp.submit({"op": "log_batch", "key": "study", "metrics": [["a", 1.0, 1, 0]]})
    assert srv.metrics("study") == [["a", 1.0, 1, 0]]  # delivered before submit returned
    assert srv.threads == {threading.current_thread().name}


# -- through a real `mlflow server` on loopback ---------------------------------------------

def _free_port() -> int:
    from scarcelab.tracking.stack import free_port

    return free_port()


def _start_server(folder: Path, port: int) -> subprocess.Popen:
    import urllib.request

    env = {**os.environ, "PYTHONPATH": str(REPO), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    env.pop("MLFLOW_RUN_ID", None)
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1", "--backend-store-uri",
         f"sqlite:///{folder}/srv.db", "--artifacts-destination", str(folder / "artifacts")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
        start_new_session=True)
    end = time.time() + 240
    while time.time() < end:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc
        except OSError:
            time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError("mlflow server did not start")


def _stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):  # type: ignore[no-untyped-def]
    folder = tmp_path_factory.mktemp("mlflow-server")
    port = _free_port()
    box = {"proc": _start_server(folder, port), "folder": folder, "port": port,
           "uri": f"http://127.0.0.1:{port}"}
    yield box
    _stop_server(box["proc"])


@pytest.fixture
def remote(server, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", server["uri"])
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.setenv("SCARCELAB_SYSTEM_METRICS", "0")
    mlflow.set_tracking_uri(server["uri"])
    return server


_sleep = time.sleep


class _Clock:
    """``time`` as mlflow_tracker sees it: a counter, so two runs of the same calls record
    the same timestamps (the spool and MLflow keep the real clock)."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def time(self) -> float:
        self.now += 0.001
        return self.now

    sleep = staticmethod(_sleep)


def _study(mt, exp: str, root: Path) -> tuple[str, list[str]]:  # type: ignore[no-untyped-def]
    """One tracker's worth of calls: a study of 3 trials, 6 epochs each, with params, tags,
    per-epoch metrics of two scopes and a batch of rows."""
    t = mt.MlflowTracker(experiment=exp, spool_root=root)
    t.start_study("s", {"scarcelab.role": "study"}, {"lr": 0.1, "arch": "cnn"}, {})
    trials = []
    for n in range(3):
        t.start_trial(n, {"scarcelab.role": "trial", "scarcelab.trial": str(n)},
                      {"lr": 0.1 * (n + 1), "wd": 1e-4})
        trials.append(t.trial_run_id)
        for e in range(6):
            t.log_metrics({"val/loss": 1.0 / (e + 1 + n), "val/acc": (e + n) / 10,
                           "train/loss": 2.0 / (e + 1)}, step=e)
            t.set_tags({"scarcelab.epoch": str(e)}, scope="trial")
            t.log_metrics({"best/val_acc": (e + n) / 10}, step=n * 6 + e, scope="study")
        t.log_metrics_batch([({"diag/c": float(e * n)}, e) for e in range(4)])
        t.end_trial("FINISHED")
    t.set_tags({"scarcelab.done": "yes"})
    t.end_study("FINISHED")
    return t.study_run_id, trials


def _record(run_id: str) -> dict:  # type: ignore[type-arg]
    from mlflow.tracking import MlflowClient

    c = MlflowClient()
    r = c.get_run(run_id)
    hist = {k: [(m.step, m.value, m.timestamp) for m in c.get_metric_history(run_id, k)]
            for k in sorted(r.data.metrics)}
    skip = {"scarcelab.spool_op", "scarcelab.owner", "mlflow.source.git.commit"}
    return {"status": r.info.status, "start": r.info.start_time, "end": r.info.end_time,
            "params": dict(r.data.params), "metrics": hist,
            "tags": {k: v for k, v in r.data.tags.items()
                     if k not in skip and not k.startswith("mlflow.")}}


def test_the_same_records_reach_the_server_as_without_the_thread(remote, tmp_path,
                                                                  monkeypatch):
    """Every metric (value, step, timestamp, order), param and tag of a study, and the
    runs' times and statuses, are those the synchronous path writes; with fewer requests."""
    import scarcelab.tracking.mlflow_tracker as mt

    calls: dict[str, int] = {}
    real = mt.deliver_op

    def counting(op, ids):  # type: ignore[no-untyped-def]
        calls[mode] = calls.get(mode, 0) + (op["op"] == "log_batch")
        return real(op, ids)

    monkeypatch.setattr(mt, "deliver_op", counting)
    out = {}
    for mode in ("0", "1"):
        monkeypatch.setenv("SCARCELAB_TRACKING_THREAD", mode)
        monkeypatch.setattr(mt, "time", _Clock())
        study, trials = _study(mt, f"same-{mode}-{os.getpid()}", tmp_path / f"spool{mode}")
        out[mode] = [_record(study)] + [_record(t) for t in trials]
        out[mode][0].pop("start")  # the study run is created with the client: real clock
    for a, b in zip(out["1"], out["0"], strict=True):
        assert {k: v for k, v in a.items() if v != b[k]} == {}
    assert out["0"][1]["metrics"]["val/loss"][:2] == [(0, 1.0, out["0"][1]["metrics"][
        "val/loss"][0][2]), (1, 0.5, out["0"][1]["metrics"]["val/loss"][1][2])]
    assert calls["1"] < calls["0"] / 3, calls  # merged: one request per run every 2 s
    assert not list((tmp_path / "spool1").iterdir())


CHILD = textwrap.dedent("""
    import os, sys, time
    from scarcelab.tracking import mlflow_tracker as mt

    root = sys.argv[1]
    real = mt.deliver_op
    held = []

    def deliver(op, ids):
        if op["op"] == "log_batch" and any(m[3] >= 2 for m in op.get("metrics") or []):
            held.append(op)
            time.sleep(3600)  # the server hangs: epochs 2.. stay queued
        return real(op, ids)

    mt.deliver_op = deliver
    t = mt.MlflowTracker(experiment="bg-remote", spool_root=root)
    t.start_study("s", {"scarcelab.role": "study"}, {"lr": 0.1}, {})
    t.start_trial(0, {"scarcelab.role": "trial", "scarcelab.trial": "0"}, {"a": 1})
    for e in range(2):
        t.log_metrics({"val_loss": 1.0 / (e + 1)}, step=e)
    t.flush()  # epochs 0 and 1 are in the server
    for e in range(2, 5):
        t.log_metrics({"val_loss": 1.0 / (e + 1)}, step=e)
    print(t.study_run_id, t.trial_run_id, flush=True)
    while not held:  # the thread sends them within 2 s, and the server hangs

        time.sleep(0.01)
    os.kill(os.getpid(), 9)
""")


def test_a_killed_process_loses_no_queued_remote_batch(remote, tmp_path):
    """kill -9 while the server holds epochs 2-4 in the thread: the next tracker started
    against the same server delivers them from queue.jsonl."""
    from mlflow.tracking import MlflowClient

    from scarcelab.tracking.mlflow_tracker import MlflowTracker

    env = {**os.environ, "PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": remote["uri"],
           "SCARCELAB_SYSTEM_METRICS": "0"}
    p = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "spool")],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == -signal.SIGKILL, p.stderr[-3000:]
    study, trial = p.stdout.split()

    def history() -> list[tuple[int, float]]:
        return sorted((m.step, m.value) for m in
                      MlflowClient().get_metric_history(trial, "val_loss"))

    assert [s for s, _ in history()] == [0, 1]
    left = leftovers(remote["uri"], tmp_path / "spool")
    assert len(left) == 1 and (left[0] / QUEUE_FILE).stat().st_size > 0
    t = MlflowTracker(experiment="bg-remote", spool_root=tmp_path / "spool")
    t.start_study("s2", {"scarcelab.role": "study"}, {}, {})  # replays what was left
    assert history() == [(e, 1.0 / (e + 1)) for e in range(5)]
    t.end_study("FINISHED")
    assert not list((tmp_path / "spool").iterdir())


def test_a_server_outage_mid_study_is_spooled_and_delivered(remote, tmp_path, monkeypatch):
    """The server dies mid-trial and comes back: the thread spools what it could not send
    (the caller never waits on it) and delivers it once the server answers again."""
    from mlflow.tracking import MlflowClient

    import scarcelab.tracking.mlflow_tracker as mt

    monkeypatch.setattr(spool_mod, "RETRY_INTERVAL_S", 0.5)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    t = mt.MlflowTracker(experiment=f"outage-{os.getpid()}", spool_root=tmp_path / "spool")
    t.start_study("s", {"scarcelab.role": "study"}, {}, {})
    t.start_trial(0, {"scarcelab.role": "trial", "scarcelab.trial": "0"}, {"a": 1})
    trial = t.trial_run_id
    t.log_metrics({"val_loss": 1.0}, step=0)
    t.flush()
    _stop_server(remote["proc"])
    try:
        for e in range(1, 4):
            t.log_metrics({"val_loss": 1.0 / (e + 1)}, step=e)
        t.flush()  # handed on to the spool
        assert t.spool is not None and len(t.spool.pending) >= 1
        t.end_trial("FINISHED")  # spooled behind the backlog
    finally:
        remote["proc"] = _start_server(remote["folder"], remote["port"])
    end = time.time() + 60  # the thread delivers on its own
    while t.spool.pending and time.time() < end:
        time.sleep(0.2)
    assert not t.spool.pending
    c = MlflowClient()
    assert sorted((m.step, m.value) for m in c.get_metric_history(trial, "val_loss")) == \
        [(e, 1.0 / (e + 1)) for e in range(4)]
    run = c.get_run(trial)
    assert run.info.status == "FINISHED" and run.data.tags["scarcelab.spool"] == \
        "delivered_late"
    t.end_study("FINISHED")
    assert t.spool_left is None and not list((tmp_path / "spool").iterdir())
