"""The outage spool's queue logic with a deliverer that can be switched off: ordering,
durability on disk, run-key mapping, replay by another process, rejected operations.
(The spool against the real server is in tests/e2e/test_stack.py.)"""

from __future__ import annotations

import json

import pytest
from mlflow.exceptions import MlflowException, RestException

from scarcelab.tracking.spool import Spool, is_transient, leftovers, replay


class Server:
    """Records delivered operations; ``up`` False raises what a dead server raises."""

    def __init__(self) -> None:
        self.up = True
        self.got: list[dict] = []
        self.n = 0

    def __call__(self, op, ids):  # type: ignore[no-untyped-def]
        if not self.up:
            raise MlflowException("API request failed: Max retries exceeded (Connection refused)")
        if op.get("bad"):
            raise RestException({"error_code": "INVALID_PARAMETER_VALUE", "message": "no"})
        if op.get("key") and op["op"] != "create_run":
            assert op["key"] in ids, "an operation arrived before its run existed"
        self.got.append({**op, "run": ids.get(op.get("key", ""))})
        if op["op"] == "create_run":
            self.n += 1
            return f"run{self.n}"
        return None


@pytest.fixture(autouse=True)
def fast(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr("scarcelab.tracking.spool.RETRY_INTERVAL_S", 0.0)


def test_outage_keeps_order_and_maps_runs_created_meanwhile(tmp_path):
    srv = Server()
    sp = Spool("http://x", srv, root=tmp_path)
    sp.ids["study"] = "S"
    sp.submit({"op": "log_batch", "key": "study", "metrics": [["a", 1.0, 0, 0]]})
    assert sp.dir is None  # nothing spooled while the server answers
    srv.up = False
    sp.submit({"op": "create_run", "key": "t0", "parent": "study"})
    ck = tmp_path / "best.pt"
    ck.write_bytes(b"v1")
    sp.submit({"op": "log_artifact", "key": "study", "path": str(ck), "name": "best.pt"})
    ck.write_bytes(b"v2")  # the caller overwrites its file: the spool kept a copy of v1
    sp.submit({"op": "log_batch", "key": "t0", "metrics": [["a", 2.0, 0, 1]]})
    assert len(sp.pending) == 3 and sp.dir is not None
    assert len((sp.dir / "journal.jsonl").read_text().splitlines()) == 3
    assert not sp.flush(force=True)
    srv.up = True
    assert sp.flush(force=True)
    kinds = [(o["op"], o.get("run")) for o in srv.got]
    assert kinds[:4] == [("log_batch", "S"), ("create_run", None), ("log_artifact", "S"),
                         ("log_batch", "run1")]
    late = {o["run"] for o in srv.got[4:] if o.get("tags") == [["scarcelab.spool",
                                                                 "delivered_late"]]}
    assert late == {"S", "run1"}
    assert sp.dir is None and not list(tmp_path.glob("*/journal.jsonl"))  # cleaned up


def test_spooled_copy_is_the_content_at_submit_time(tmp_path):
    srv = Server()
    srv.up = False
    sp = Spool("http://x", srv, root=tmp_path)
    sp.ids["study"] = "S"
    ck = tmp_path / "best.pt"
    ck.write_bytes(b"v1")
    sp.submit({"op": "log_artifact", "key": "study", "path": str(ck), "name": "best.pt"})
    ck.write_bytes(b"v2")
    op = sp.pending[0]
    assert op["path"] != str(ck) and open(op["path"], "rb").read() == b"v1"


def test_left_over_spool_is_replayed_by_a_new_process(tmp_path):
    srv = Server()
    srv.up = False
    sp = Spool("http://x", srv, root=tmp_path)
    sp.ids["study"] = "S"
    sp.submit({"op": "log_batch", "key": "study", "metrics": [["a", 1.0, 0, 0]]})
    sp.submit({"op": "terminate", "key": "study", "status": "FINISHED", "end_time": 1})
    left = sp.close(timeout_s=0.0)
    assert left is not None and (left / "state.json").exists()
    state = json.loads((left / "state.json").read_text())
    state["pid"] = 999_999_999  # as if written by a process that has ended
    (left / "state.json").write_text(json.dumps(state))
    assert leftovers("http://x", tmp_path) == [left]
    assert leftovers("http://other", tmp_path) == []
    srv2 = Server()
    assert replay(left, srv2)
    assert [o["op"] for o in srv2.got] == ["log_batch", "terminate", "log_batch"]
    assert srv2.got[-1]["tags"] == [["scarcelab.spool", "delivered_late"]]
    assert not left.exists()


def test_rejected_operation_is_kept_not_retried_forever(tmp_path):
    srv = Server()
    sp = Spool("http://x", srv, root=tmp_path)
    sp.ids["study"] = "S"
    sp.submit({"op": "log_batch", "key": "study", "bad": True})
    sp.submit({"op": "log_batch", "key": "study", "metrics": []})
    assert not sp.pending and len(srv.got) == 1
    rej = sp.dir / "rejected.jsonl"
    assert "INVALID_PARAMETER_VALUE" in rej.read_text()
    assert sp.close(0.0) == sp.dir  # reported at the end, with its folder


def test_transient_classification():
    assert is_transient(MlflowException("Max retries exceeded with url (Connection refused)"))
    assert is_transient(ConnectionError("refused"))
    assert not is_transient(RestException({"error_code": "INVALID_PARAMETER_VALUE",
                                           "message": "bad"}))
    assert not is_transient(ValueError("bug"))


# -- crash safety (issue 13 item 3) and error classification (issue 16) -------------------

import errno  # noqa: E402
import http.server  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST  # noqa: E402

import scarcelab.tracking.spool as spool_mod  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def _dead(folder: Path) -> None:
    """Make ``folder`` look like the spool of a process that has ended."""
    st = json.loads((folder / "state.json").read_text())
    st["pid"] = 999_999_999
    (folder / "state.json").write_text(json.dumps(st))


def _outage_spool(tmp_path, n: int) -> Path:
    srv = Server()
    srv.up = False
    sp = Spool("http://x", srv, root=tmp_path / "spool")
    sp.ids["study"] = "S"
    for i in range(n):
        sp.submit({"op": "log_batch", "key": "study", "metrics": [["a", float(i), 0, i]]})
    left = sp.close(timeout_s=0.0)
    assert left is not None
    _dead(left)
    return left


def test_torn_tail_is_skipped_and_everything_before_it_delivered(tmp_path):
    left = _outage_spool(tmp_path, 3)
    with open(left / "journal.jsonl", "ab") as f:  # a crash / full disk mid-record
        f.write(b'{"seq": 3, "id": "x", "op": {"op": "log_batch", "key": "stu')
    srv = Server()
    assert replay(left, srv)
    values = [o["metrics"][0][1] for o in srv.got if o.get("metrics")]
    assert values == [0.0, 1.0, 2.0]
    tags = dict(srv.got[-1]["tags"])
    assert tags["scarcelab.spool"] == "delivered_late"
    assert "torn record at line 4" in tags["scarcelab.spool_skipped"]  # visible on the run


def test_corrupt_record_stops_delivery_at_it(tmp_path):
    left = _outage_spool(tmp_path, 3)
    lines = (left / "journal.jsonl").read_text().splitlines(keepends=True)
    lines[1] = lines[1].replace('"a", 1.0', '"a", 9.0')  # a flipped byte: checksum fails
    (left / "journal.jsonl").write_text("".join(lines))
    srv = Server()
    assert replay(left, srv)
    assert [o["metrics"][0][1] for o in srv.got if o.get("metrics")] == [0.0]
    assert "corrupt record at line 2" in dict(srv.got[-1]["tags"])["scarcelab.spool_skipped"]


def test_a_spool_is_never_replayed_by_two_processes_at_once(tmp_path):
    left = _outage_spool(tmp_path, 2)
    holder = Spool("", Server())
    assert holder._try_lock(left)  # another process is delivering it
    srv = Server()
    assert not replay(left, srv) and srv.got == []
    assert leftovers("http://x", tmp_path / "spool") == [left]
    holder.release()
    assert replay(left, srv) and len([o for o in srv.got if o.get("metrics")]) == 2


def test_disk_full_keeps_the_journal_valid_and_the_records_in_memory(tmp_path, capsys):
    """A small tmpfs (root) or, failing that, a simulated ENOSPC from os.write."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(mnt)],
        capture_output=True).returncode == 0
    real_write = os.write
    try:
        srv = Server()
        srv.up = False
        sp = Spool("http://x", srv, root=mnt)
        sp.ids["study"] = "S"
        if not mounted:
            calls = {"n": 0}

            def full_after_5(fd, data):  # type: ignore[no-untyped-def]
                calls["n"] += 1
                if calls["n"] > 5:
                    real_write(fd, data[: len(data) // 2])  # a torn write, then the error
                    raise OSError(errno.ENOSPC, "No space left on device")
                return real_write(fd, data)
            spool_mod.os.write = full_after_5  # type: ignore[assignment]
        pad = "x" * 900
        for i in range(40):  # ~40 KiB of records: more than the 16 KiB disk
            sp.submit({"op": "log_batch", "key": "study",
                       "params": [[f"p{i}", pad]], "metrics": [["a", float(i), 0, i]]})
        assert sp.memory_only > 0 and len(sp.pending) == 40
        err = capsys.readouterr().err
        assert "disk full" in err and "kept in memory only" in err
        on_disk, why = spool_mod.read_journal(sp.dir / "journal.jsonl")
        assert why is None and len(on_disk) == sp.journaled > 0  # a clean prefix
        # a process that dies now leaves a replayable prefix ...
        copy = tmp_path / "copy"
        shutil.copytree(sp.dir, copy, ignore=shutil.ignore_patterns("lock"))
        _dead(copy)
        srv2 = Server()
        assert replay(copy, srv2)
        assert [o["metrics"][0][1] for o in srv2.got if o.get("metrics")] == \
            [float(i) for i in range(len(on_disk))]
        # ... and this one, still alive, delivers everything once the server is back
        srv.up = True
        assert sp.flush(force=True)
        assert [o["metrics"][0][1] for o in srv.got if o.get("metrics")] == \
            [float(i) for i in range(40)]
    finally:
        spool_mod.os.write = real_write  # type: ignore[assignment]
        if mounted:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


# Delivery against a real (sqlite) MLflow store, the process killed with SIGKILL mid-replay.
_REPLAY_AND_DIE = """
import os, signal, sys, time
import mlflow
from scarcelab.tracking import mlflow_tracker as mt
from scarcelab.tracking.spool import replay
mlflow.set_tracking_uri(sys.argv[2])
mode = sys.argv[3]
go = sys.argv[4] if len(sys.argv) > 4 else None
if go:
    while not os.path.exists(go):
        time.sleep(0.01)

def deliver(op, ids):
    out = mt.deliver_op(op, ids)
    if mode == "die-after-create" and op["op"] == "create_run":
        os.kill(os.getpid(), signal.SIGKILL)  # delivered, not yet recorded as delivered
    if mode == "slow":
        time.sleep(0.4)
    return out
print("ok" if replay(sys.argv[1], deliver) else "not")
"""


def _real_store_spool(tmp_path):  # type: ignore[no-untyped-def]
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    exp = MlflowClient().create_experiment("spool")
    srv = Server()
    srv.up = False
    sp = Spool("http://x", srv, root=tmp_path / "spool")
    sp.submit({"op": "create_run", "key": "t0", "parent": None, "experiment_id": exp,
               "run_name": "t0", "start_time": 1, "tags": {"scarcelab.role": "trial"}})
    for i in range(3):
        sp.submit({"op": "log_batch", "key": "t0", "metrics": [["m", float(i), 5, i]]})
    sp.submit({"op": "terminate", "key": "t0", "status": "FINISHED", "end_time": 9})
    left = sp.close(0.0)
    st = json.loads((left / "state.json").read_text())
    st.update(pid=999_999_999, tracking_uri=uri)
    (left / "state.json").write_text(json.dumps(st))
    return uri, exp, left


def _runs_in(exp):  # type: ignore[no-untyped-def]
    from mlflow.tracking import MlflowClient

    return MlflowClient().search_runs([exp])


def test_kill9_during_replay_then_replay_again_delivers_each_record_once(tmp_path):
    from mlflow.tracking import MlflowClient

    from scarcelab.tracking.mlflow_tracker import deliver_op

    uri, exp, left = _real_store_spool(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-c", _REPLAY_AND_DIE, str(left), uri,
                        "die-after-create"], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    assert len(_runs_in(exp)) == 1  # the run was created before the kill
    # the next start (or `python -m scarcelab.tracking.spool replay`)
    assert replay(left, deliver_op)
    runs = _runs_in(exp)
    assert len(runs) == 1, "the run the killed replay created was created again"
    r = runs[0]
    assert r.info.status == "FINISHED"
    hist = MlflowClient().get_metric_history(r.info.run_id, "m")
    assert sorted((m.step, m.value) for m in hist) == [(0, 0.0), (1, 1.0), (2, 2.0)]
    assert not left.exists()


def test_two_replays_started_together_create_one_run(tmp_path):
    from mlflow.tracking import MlflowClient

    uri, exp, left = _real_store_spool(tmp_path)
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", _REPLAY_AND_DIE, str(left), uri, "slow",
                               str(go)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    time.sleep(8)  # both have imported MLflow and wait for the go
    go.touch()
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-1500:] for o in outs]
    assert sorted(o[0].strip() for o in outs) == ["not", "ok"]  # one delivered, one stood by
    runs = _runs_in(exp)
    assert len(runs) == 1
    hist = MlflowClient().get_metric_history(runs[0].info.run_id, "m")
    assert len(hist) == 3


# -- issue 16: classification by type and HTTP status, spool only for remote stores ------

class _Fixed(http.server.BaseHTTPRequestHandler):
    status = 404
    body = b"<html>run 5003a9500 not found (code 500 in the id)</html>"

    def do_GET(self) -> None:  # noqa: N802
        self.send_response(self.status)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *a) -> None:  # type: ignore[no-untyped-def]
        pass


def _error_from(status: int, monkeypatch) -> BaseException:  # type: ignore[no-untyped-def]
    from mlflow.tracking import MlflowClient

    handler = type("H", (_Fixed,), {"status": status})
    srv = http.server.HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    try:
        MlflowClient(f"http://127.0.0.1:{srv.server_port}").get_run("5003a9500")
    except Exception as e:  # noqa: BLE001
        return e
    finally:
        srv.shutdown()
    raise AssertionError("no error")


def test_a_404_mentioning_500_is_a_rejection_not_an_outage(monkeypatch):
    e = _error_from(404, monkeypatch)
    assert "500" in str(e)
    assert not is_transient(e)
    assert not is_transient(MlflowException("Run '9f500c' not found",
                                            error_code=RESOURCE_DOES_NOT_EXIST))
    assert not is_transient(MlflowException("Connection string 'x' is invalid",
                                            error_code=RESOURCE_DOES_NOT_EXIST))


def test_outages_are_recognised_by_type_and_status(monkeypatch):
    assert is_transient(_error_from(503, monkeypatch))
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with pytest.raises(MlflowException) as dead:
        MlflowClient("http://127.0.0.1:9").get_run("abc")  # nothing listens on port 9
    assert is_transient(dead.value)
    assert not is_transient(OSError(errno.ENOENT, "no such file"))  # a local bug


def test_spool_is_only_for_remote_tracking_stores(tmp_path):
    def down(op, ids):  # type: ignore[no-untyped-def]
        raise ConnectionError("database is locked")

    local = Spool("sqlite:///x.db", down, root=tmp_path)
    with pytest.raises(ConnectionError):
        local.submit({"op": "log_batch", "key": "study", "metrics": []})
    assert local.dir is None and not list(tmp_path.iterdir())
    remote = Spool("https://mlflow.example.org", down, root=tmp_path)
    remote.submit({"op": "log_batch", "key": "study", "metrics": []})
    assert remote.dir is not None and len(remote.pending) == 1


# -- issue 25 item 11: `spool replay` of a delivered, missing or foreign folder ----------------

def test_replay_command_answers_every_folder_in_one_line(tmp_path, capsys):
    """Before: a FileNotFoundError / JSONDecodeError traceback from reading state.json."""
    from scarcelab.tracking.spool import main

    uri, exp, left = _real_store_spool(tmp_path)
    assert main(["replay", str(left)]) == 0  # delivers, then removes the folder
    out = capsys.readouterr().out
    assert out.strip() == f"{left}: delivered"
    assert len(_runs_in(exp)) == 1
    # the same command again (the folder is gone: it was delivered): not an error
    assert main(["replay", str(left)]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "nothing to deliver" in out and str(left) in out
    assert len(_runs_in(exp)) == 1  # nothing delivered twice

    empty = tmp_path / "empty"
    empty.mkdir()
    orphan = tmp_path / "orphan"
    orphan.mkdir()
    (orphan / "journal.jsonl").write_text("")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "state.json").write_text("{not json")
    afile = tmp_path / "afile"
    afile.write_text("x")
    for path, code, words in ((empty, 2, "is not a spool folder"),
                              (orphan, 2, "no state.json"),
                              (broken, 1, "cannot be read"),
                              (afile, 2, "is not a folder")):
        assert main(["replay", str(path)]) == code, path
        cap = capsys.readouterr()
        lines = [ln for ln in (cap.out + cap.err).splitlines() if ln.strip()]
        assert len(lines) == 1 and words in lines[0] and str(path) in lines[0], lines
        assert lines[0].startswith("Error: ")
    assert broken.exists() and (broken / "state.json").read_text() == "{not json"
    # several folders: each answered, the worst status wins
    assert main(["replay", str(tmp_path / "gone"), str(broken)]) == 1


def test_state_json_is_owner_only_whatever_the_umask(tmp_path):
    """issue 42: state.json holds the tracking URI, password included, while records wait
    for delivery; it was written 0644 (0666 under umask 0)."""
    import os
    import stat

    srv = Server()
    srv.up = False
    old = os.umask(0)  # the loosest umask a user can have
    try:
        sp = Spool("http://admin:s3cret@x", srv, root=tmp_path)
        sp.ids["study"] = "S"
        sp.submit({"op": "log_batch", "key": "study", "metrics": [["a", 1.0, 0, 0]]})
        assert sp.dir is not None
        state = sp.dir / "state.json"
        assert "s3cret" in state.read_text()  # what the mode protects
        assert stat.S_IMODE(state.stat().st_mode) == 0o600
        assert stat.S_IMODE(sp.dir.stat().st_mode) == 0o700
        sp.submit({"op": "log_batch", "key": "study", "metrics": [["a", 2.0, 0, 1]]})
        sp._write_state()  # rewritten (a delivery, a new run id): still 0600
        assert stat.S_IMODE(state.stat().st_mode) == 0o600
    finally:
        os.umask(old)
        sp.close(timeout_s=0.0)
