"""A durable, ordered queue of MLflow operations: training never waits on a tracking server.

Every tracker call becomes one small operation (create a run, log a batch, upload a file,
log the model, end a run). It is sent at once; if the server does not answer, it and every
later operation go to a spool folder on local disk (``journal.jsonl`` + copies of the files)
in order, and delivery is retried every few seconds from the training loop itself (no
thread: the loop calls the tracker once per epoch anyway, and a single writer keeps the
order trivially correct). Runs created during an outage get a local key first and their
real id when the ``create_run`` is delivered; later operations name runs by key.

If the process ends before everything is delivered, the folder stays, its path is printed,
and ``python -m tracking.spool replay DIR`` (or the next tracker started against the same
server) delivers it; runs completed that way are tagged ``scarcelab.spool=delivered_late``.
Operations the server *rejects* (HTTP 4xx: a bug, not an outage) are written to
``rejected.jsonl`` and reported, not retried forever — but never dropped silently.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("scarcelab.tracking")

RETRY_INTERVAL_S = float(os.environ.get("SCARCELAB_SPOOL_RETRY_S", "5"))
DEFAULT_ROOT = Path(os.environ.get("SCARCELAB_SPOOL_DIR")
                    or Path.home() / ".cache" / "scarcelab" / "spool")


def is_transient(e: BaseException) -> bool:
    """An outage (connection refused, timeout, 5xx) rather than a request the server rejects."""
    from mlflow.exceptions import MlflowException, RestException

    if isinstance(e, RestException):
        code = getattr(e, "get_http_status_code", lambda: 500)()
        return code >= 500 or code in (408, 429)
    if isinstance(e, MlflowException):
        text = str(e)
        if any(s in text for s in ("Max retries", "Connection", "connection", "timed out",
                                   "Timeout", "503", "502", "500", "504", "429")):
            return True
        return e.get_http_status_code() >= 500 if hasattr(e, "get_http_status_code") else True
    return isinstance(e, (OSError, TimeoutError)) or type(e).__module__.startswith(
        ("requests", "urllib3", "botocore", "boto3"))


class Spool:
    """Send-or-spool for one tracking URI. ``deliver(op)`` does the real MLflow call."""

    def __init__(self, tracking_uri: str, deliver: Callable[[dict[str, Any], dict[str, str]],
                                                             str | None],
                 root: Path | None = None, folder: Path | None = None) -> None:
        self.tracking_uri = tracking_uri
        self._deliver = deliver
        self.root = Path(root or DEFAULT_ROOT)
        self.dir: Path | None = folder
        self.ids: dict[str, str] = {}
        self.pending: list[dict[str, Any]] = []
        self.delivered = 0  # journal lines already delivered
        self.last_attempt = 0.0
        self.late_keys: set[str] = set()
        if folder is not None:
            self._load()

    # -- persistence -----------------------------------------------------------------------
    def _ensure_dir(self) -> Path:
        if self.dir is None:
            name = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
            self.dir = self.root / name
            (self.dir / "files").mkdir(parents=True, exist_ok=True)
            self._write_state()
        return self.dir

    def _write_state(self) -> None:
        assert self.dir is not None
        tmp = self.dir / "state.json.tmp"
        tmp.write_text(json.dumps({"tracking_uri": self.tracking_uri, "ids": self.ids,
                                   "delivered": self.delivered, "pid": os.getpid()}))
        tmp.replace(self.dir / "state.json")

    def _load(self) -> None:
        assert self.dir is not None
        st = json.loads((self.dir / "state.json").read_text())
        self.tracking_uri = st["tracking_uri"]
        self.ids = st["ids"]
        self.delivered = st["delivered"]
        lines = (self.dir / "journal.jsonl").read_text().splitlines() \
            if (self.dir / "journal.jsonl").exists() else []
        self.pending = [json.loads(x) for x in lines[self.delivered:] if x.strip()]

    def _append(self, op: dict[str, Any]) -> None:
        d = self._ensure_dir()
        for field in ("path", "example_path"):  # snapshot files: the caller may overwrite them
            if op.get(field) and not str(op[field]).startswith(str(d)):
                dst = d / "files" / f"{len(self.pending) + self.delivered:06d}-" \
                    f"{Path(op[field]).name}"
                shutil.copy2(op[field], dst)
                op = {**op, field: str(dst)}
        with open(d / "journal.jsonl", "a") as f:
            f.write(json.dumps(op) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.pending.append(op)

    # -- sending ---------------------------------------------------------------------------
    def _send(self, op: dict[str, Any]) -> None:
        new_id = self._deliver(op, self.ids)
        if op["op"] == "create_run" and new_id:
            self.ids[op["key"]] = new_id

    def submit(self, op: dict[str, Any]) -> None:
        """Deliver now, or keep in order behind what is already waiting."""
        if not self.pending:
            try:
                self._send(op)
                return
            except Exception as e:  # noqa: BLE001 - classified just below
                if not is_transient(e):
                    self._reject(op, e)
                    return
                self._append(op)
                self.last_attempt = time.time()
                self._write_state()
                msg = (f"tracking server {self.tracking_uri} unreachable ({type(e).__name__}); "
                       f"training goes on, records are spooled to {self.dir}")
                log.warning(msg)
                print(f"[scarcelab] {msg}", file=sys.stderr, flush=True)
                return
        self._append(op)
        self.flush()

    def _reject(self, op: dict[str, Any], e: BaseException) -> None:
        d = self._ensure_dir()
        with open(d / "rejected.jsonl", "a") as f:
            f.write(json.dumps({"op": op, "error": f"{type(e).__name__}: {e}"[:2000]}) + "\n")
        log.error("tracking server rejected %s (%s); kept in %s", op["op"], e, d)

    def flush(self, force: bool = False) -> bool:
        """Try to deliver the backlog (at most every RETRY_INTERVAL_S unless ``force``);
        True when nothing is left."""
        if not self.pending:
            return True
        if not force and time.time() - self.last_attempt < RETRY_INTERVAL_S:
            return False
        self.last_attempt = time.time()
        while self.pending:
            op = self.pending[0]
            try:
                self._send(op)
            except Exception as e:  # noqa: BLE001
                if is_transient(e):
                    self._write_state()
                    return False
                self._reject(op, e)
            self.pending.pop(0)
            self.delivered += 1
            if op.get("key"):
                self.late_keys.add(op["key"])
            self._write_state()
        print(f"[scarcelab] tracking server back: spooled records delivered from {self.dir}",
              file=sys.stderr, flush=True)
        self._finish()
        return True

    def _finish(self) -> None:
        """All delivered: mark the runs that got records late, then drop the folder."""
        for key in sorted(self.late_keys):
            if key in self.ids:
                try:
                    self._send({"op": "log_batch", "key": key,
                                "tags": [["scarcelab.spool", "delivered_late"]]})
                except Exception:  # noqa: BLE001 - a tag is not worth keeping the spool for
                    pass
        self.late_keys.clear()
        if self.dir is not None and not (self.dir / "rejected.jsonl").exists():
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
            self.delivered = 0

    def close(self, timeout_s: float) -> Path | None:
        """Keep trying for ``timeout_s``; return the spool folder if anything is left."""
        end = time.time() + timeout_s
        while self.pending:
            if self.flush(force=True):
                break
            if time.time() >= end:
                break
            time.sleep(min(RETRY_INTERVAL_S, max(0.0, end - time.time())))
        if self.pending:
            assert self.dir is not None
            self._write_state()
            return self.dir
        return self.dir if self.dir is not None and (self.dir / "rejected.jsonl").exists() \
            else None


def leftovers(tracking_uri: str, root: Path | None = None) -> list[Path]:
    """Spool folders of dead processes for this server (to replay on the next start)."""
    base = Path(root or DEFAULT_ROOT)
    out = []
    for d in sorted(base.glob("*/state.json")):
        try:
            st = json.loads(d.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        pid = int(st.get("pid", 0))
        alive = pid > 0 and Path(f"/proc/{pid}").exists() and pid != os.getpid()
        if st.get("tracking_uri") == tracking_uri and not alive and \
                (d.parent / "journal.jsonl").exists():
            out.append(d.parent)
    return out


def replay(folder: Path, deliver: Callable[[dict[str, Any], dict[str, str]], str | None]
           ) -> bool:
    """Deliver a left-over spool; True when everything went out."""
    sp = Spool("", deliver, folder=Path(folder))
    sp.late_keys = {op["key"] for op in sp.pending if op.get("key")}
    if not sp.pending:
        sp._finish()
        return True
    return sp.flush(force=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m tracking.spool replay DIR...`` — deliver spools left by ended processes."""
    import argparse

    from tracking.mlflow_tracker import deliver_op

    p = argparse.ArgumentParser(prog="python -m tracking.spool")
    p.add_argument("action", choices=["replay"])
    p.add_argument("dirs", nargs="+")
    a = p.parse_args(argv)
    ok = True
    for d in a.dirs:
        st = json.loads((Path(d) / "state.json").read_text())
        import mlflow

        mlflow.set_tracking_uri(st["tracking_uri"])
        done = replay(Path(d), deliver_op)
        print(f"{d}: {'delivered' if done else 'server still unreachable'}")
        ok &= done
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
