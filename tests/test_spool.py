"""The outage spool's queue logic with a deliverer that can be switched off: ordering,
durability on disk, run-key mapping, replay by another process, rejected operations.
(The spool against the real server is in tests/e2e/test_stack.py.)"""

from __future__ import annotations

import json

import pytest
from mlflow.exceptions import MlflowException, RestException

from tracking.spool import Spool, is_transient, leftovers, replay


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
    monkeypatch.setattr("tracking.spool.RETRY_INTERVAL_S", 0.0)


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
