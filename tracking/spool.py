"""A durable, ordered queue of MLflow operations: training never waits on a tracking server.

Every tracker call becomes one small operation (create a run, log a batch, upload a file,
log the model, end a run). It is sent at once; if the server does not answer, it and every
later operation go to a spool folder on local disk (``journal.jsonl`` + copies of the files)
in order, and delivery is retried every few seconds — by the delivery thread (below), or
without one from the training loop itself (the loop calls the tracker once per epoch
anyway); either way one thread at a time delivers, which keeps the order. Runs created
during an outage get a local key first and their real id when the ``create_run`` is
delivered; later operations name runs by key.

If the process ends before everything is delivered, the folder stays, its path is printed,
and ``python -m scarcelab.tracking.spool replay DIR`` (or the next tracker started against the same
server) delivers it; runs completed that way are tagged ``scarcelab.spool=delivered_late``.
Operations the server *rejects* (HTTP 4xx: a bug, not an outage) are written to
``rejected.jsonl`` and reported, not retried forever — but never dropped silently.

Crash safety:

* The journal is append-only JSON lines, one record per operation, each with a sequence
  number, an operation id and a SHA-256 of its content. A record is written with a single
  ``write`` on an ``O_APPEND`` descriptor and fsynced; a failed write (disk full) is cut
  back off the file. A torn or corrupt tail (a crash or full disk mid-line) is detected on
  load and skipped: everything before it is delivered, the rest is reported.
* Only plain JSON is ever read back: nothing in a spool folder is unpickled.
* One process at a time owns a folder: the writer holds ``fcntl.flock(LOCK_EX)`` on
  ``lock`` for its lifetime, and a replay takes the same lock (non-blocking) or leaves the
  folder to whoever holds it — two replays, or two workers auto-replaying at start, never
  deliver the same folder twice.
* Delivery is idempotent: every operation carries an id (``_id``); the deliverer looks a
  journaled ``create_run`` / ``log_model`` up by that id before creating it again (a crash
  between a delivery and the ``state.json`` update re-sends exactly that operation; metrics,
  params, tags, artifacts and status updates are idempotent in MLflow's stores already).
* If the disk is full, later records are kept in memory only (and said so); the on-disk
  journal stays a clean prefix that a replay can trust.

Errors are classified by type and HTTP status, never by searching the message text, and the
outage spool is used only for remote tracking stores (``http(s)://``, ``databricks``): a
local store (``sqlite:``, a folder) has no outage to wait out.

A local store is still slow: one 8-metric ``log_batch`` into sqlite costs 7-8 ms of CPU in
MLflow and SQLAlchemy (docs/performance.md, "Study wall time"), and a short-trial study
makes a thousand of them; a remote server costs a round trip and ~28 ms of its CPU per
write. With ``background=True`` (what the MLflow tracker uses, ``SCARCELAB_TRACKING_THREAD=0``
turns it off) metric, parameter and tag batches are handed to one delivery thread, in
order, and the training thread goes on; every other operation (creating or ending a run,
files, the model) first waits until the thread has delivered everything before it, then
runs on the caller's thread as before, so a run is complete and closed (or spooled) when
its ``end_trial`` returns. The queue is bounded (``SCARCELAB_TRACKING_QUEUE`` operations):
when it is full the caller waits, nothing is dropped. Each queued batch is first appended
to the folder's ``queue.jsonl`` (without fsync: a process crash — ``kill -9``, an OOM kill
— leaves it in the page cache, and the next start against the same store replays it; an
operating-system crash can lose the last queued batches). The queue file is cut back to
empty whenever the thread has handed on everything in it.

For a remote server the thread also *batches*: the batches of one run that arrive within
``SCARCELAB_TRACKING_BATCH_S`` (2 s) of the first go out as one ``log_batch`` (within
MLflow's limits of 1000 metrics, 100 params and 100 tags per request; a full batch goes at
once), so a study makes one request per run every 2 s instead of one per epoch and scope.
Merging keeps every record: metrics keep their own step and timestamp (set when they were
logged), a tag written twice in one batch keeps its last value (what two requests would
leave), and a parameter logged again with another value starts a new request (MLflow then
refuses it as it would have). When a merged request fails because the server is away, its
operations (unmerged, in order) go to the outage spool exactly as a synchronous call's
would, and the thread retries the backlog every ``SCARCELAB_SPOOL_RETRY_S``; a merged
request the server refuses is sent again one operation at a time, so only the refused
operation lands in ``rejected.jsonl``. A write a local store refuses is raised on the
caller's thread at its next tracker call (or at the close), naming the operation.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import hashlib
import json
import logging
import os
import queue
import shutil
import socket
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scarcelab import tags as T
from scarcelab.redaction import hide_mlflow_links, redact

log = logging.getLogger("scarcelab.tracking")

RETRY_INTERVAL_S = float(os.environ.get("SCARCELAB_SPOOL_RETRY_S", "5"))
DEFAULT_ROOT = Path(os.environ.get("SCARCELAB_SPOOL_DIR")
                    or Path.home() / ".cache" / "scarcelab" / "spool")
REMOTE_SCHEMES = ("http://", "https://", "databricks")
# What a local store's delivery thread may take: batches of metrics, params and tags (and a
# description line). Each is independent of the caller's next step; every other operation
# creates, closes or uploads something the caller (or a reader) relies on at once.
BACKGROUND_OPS = frozenset({"log_batch", "note_append"})
_STOP = {"op": "__stop__"}
_FLUSH = {"op": "__flush__"}  # the caller waits: send what is held now
#: a remote server's batches of one run are held this long (from the first) and sent as one
BATCH_S = float(os.environ.get("SCARCELAB_TRACKING_BATCH_S", "2"))
#: operations the delivery thread may have waiting; past it the caller waits (never drops)
QUEUE_MAX = int(os.environ.get("SCARCELAB_TRACKING_QUEUE", "10000"))
#: what the delivery thread has not handed on yet (no fsync; replayed after a crash)
QUEUE_FILE = "queue.jsonl"
#: MLflow's log_batch limits (mlflow.utils.validation: MAX_METRICS_PER_BATCH,
#: MAX_PARAMS_TAGS_PER_BATCH, MAX_ENTITIES_PER_BATCH), and a request size well inside its
#: 1 MB MAX_BATCH_LOG_REQUEST_SIZE
BATCH_LIMITS = {"metrics": 1000, "params": 100, "tags": 100}
BATCH_ENTITIES = 1000
BATCH_BYTES = 500_000


def is_remote(tracking_uri: str) -> bool:
    """A tracking store behind a network (the only kind that has outages to spool through)."""
    return tracking_uri.strip().lower().startswith(REMOTE_SCHEMES)


def _chain(e: BaseException) -> list[BaseException]:
    """``e`` and the exceptions it was raised from or while handling (MLflow's REST client
    re-raises connection errors as a plain ``MlflowException`` inside the ``except``)."""
    out: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and cur not in out and len(out) < 10:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def _network_failure(x: BaseException) -> bool:
    if isinstance(x, (ConnectionError, TimeoutError, socket.timeout, socket.gaierror)):
        return True
    try:
        import requests

        if isinstance(x, (requests.exceptions.ConnectionError, requests.exceptions.Timeout,
                          requests.exceptions.ChunkedEncodingError,
                          requests.exceptions.RetryError)):
            return True
    except ImportError:  # pragma: no cover - mlflow depends on requests
        pass
    try:
        import urllib3.exceptions as u3

        if isinstance(x, (u3.MaxRetryError, u3.NewConnectionError, u3.ProtocolError,
                          u3.TimeoutError)):
            return True
    except ImportError:  # pragma: no cover
        pass
    try:
        import botocore.exceptions as bce

        if isinstance(x, (bce.EndpointConnectionError, bce.ConnectionClosedError,
                          bce.ReadTimeoutError, bce.ConnectTimeoutError)):
            return True
    except ImportError:  # pragma: no cover - boto3 is only needed with an S3 store
        pass
    return False


def http_status(e: BaseException) -> int | None:
    """The HTTP status an error stands for, from its type's own fields (not its text)."""
    from mlflow.exceptions import MlflowException

    if isinstance(e, MlflowException):  # RestException included: its error_code
        return int(e.get_http_status_code())
    resp = getattr(e, "response", None)
    if isinstance(resp, dict):  # botocore.exceptions.ClientError
        code = resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return int(code) if code else None
    code = getattr(resp, "status_code", None)  # requests.HTTPError
    return int(code) if isinstance(code, int) else None


def is_transient(e: BaseException) -> bool:
    """An outage (no connection, a timeout, HTTP 5xx / 408 / 429) rather than a request the
    server rejects (4xx) or a bug here. Decided by exception type and HTTP status only: a
    message that happens to contain "500" or "Connection" (a run id, a path) means nothing."""
    chain = _chain(e)
    if any(_network_failure(x) for x in chain):
        return True
    status = http_status(e)
    if status is not None:
        return status >= 500 or status in (408, 429)
    return False


def _digest(seq: int, op_id: str, op: dict[str, Any]) -> str:
    blob = json.dumps([seq, op_id, op], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def read_journal(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """Valid records in order, and why reading stopped early (None: the whole file).

    A record is valid when it parses, its checksum matches and its sequence number is the
    next one; the first invalid record and everything after it are not trusted (a torn
    write is the tail of an append-only file)."""
    if not path.exists():
        return [], None
    raw = path.read_bytes()
    out: list[dict[str, Any]] = []
    lines = raw.split(b"\n")
    for i, line in enumerate(lines):
        if not line.strip():
            if i == len(lines) - 1:
                break
            continue
        if i == len(lines) - 1:  # no newline: the write did not complete
            return out, f"torn record at line {i + 1} (no end of line)"
        rec = _valid_record(line, len(out))
        if rec is None:
            return out, f"corrupt record at line {i + 1}"
        out.append(rec)
    return out, None


def _valid_record(line: bytes, seq: int) -> dict[str, Any] | None:
    """The record on ``line`` when it parses, its checksum matches and its sequence number
    is ``seq``; else None."""
    try:
        rec = json.loads(line)
        ok = rec["seq"] == seq and rec["sum"] == _digest(rec["seq"], rec["id"], rec["op"])
    except (ValueError, KeyError, TypeError):
        return None
    return rec if ok else None


# -- records held in memory only (a full disk) --------------------------------------------------
LEDGER = "memory_only.json"
LEDGER_BYTES = 4096  # one page, overwritten in place: a full disk still takes it


def _ranges(steps: list[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``"1-3, 7"``: epoch numbers in a sentence."""
    spans: list[list[int]] = []
    for s in sorted(set(steps)):
        if spans and spans[-1][1] == s - 1:
            spans[-1][1] = s
        else:
            spans.append([s, s])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


class MemoryLedger:
    """What the spool holds in memory only (its disk was full), summarised per run in a
    file of fixed size overwritten in place (``memory_only.json``).

    Records kept in memory are lost if the process dies before the server is back
    (``kill -9``, an OOM kill, a reboot), and the run they belong to stays RUNNING with
    part of its trials. What they were must survive on a disk that is full: the file is
    written at its full size when the spool folder is created (while there is room) and
    later only overwritten with ``pwrite`` into the blocks it already owns, which takes no
    free space (ext4, xfs, tmpfs; a copy-on-write file system may still refuse it, and
    the loss is then only printed). The next process that replays the folder reads it
    and marks the runs with what is gone (:func:`lost_marks`)."""

    def __init__(self) -> None:
        self.runs: dict[str, dict[str, Any]] = {}
        self.records = 0
        self.path: Path | None = None

    def create(self, folder: Path) -> None:
        path = folder / LEDGER
        try:
            fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
            try:
                blank = b"{}".ljust(LEDGER_BYTES - 1) + b"\n"
                if os.write(fd, blank) != len(blank):
                    raise OSError(errno.ENOSPC, "short write")
                os.fsync(fd)  # its blocks are allocated now, not at the first overwrite
            finally:
                os.close(fd)
            self.path = path
        except OSError as e:
            path.unlink(missing_ok=True)
            log.warning("spool %s: no room for %s (%s): records the disk cannot take later "
                        "would be lost without a trace on disk", folder, LEDGER, e)

    def count(self, op: dict[str, Any], sign: int = 1) -> None:
        """``op`` is now held in memory only (``sign`` 1) or was delivered (-1)."""
        key = str(op.get("key") or "?")
        run = self.runs.setdefault(key, {"ops": {}, "steps": {}})
        kind = str(op["op"])
        run["ops"][kind] = run["ops"].get(kind, 0) + sign
        if kind == "create_run" and sign > 0:
            tags = op.get("tags") or {}
            run.update(parent=op.get("parent"), trial=tags.get(T.TRIAL),
                       retrain=tags.get(T.RETRAIN))
        for m in op.get("metrics") or []:
            step = str(int(m[3]))
            run["steps"][step] = run["steps"].get(step, 0) + sign
        run["ops"] = {k: v for k, v in run["ops"].items() if v > 0}
        run["steps"] = {k: v for k, v in run["steps"].items() if v > 0}
        if not run["ops"]:
            del self.runs[key]
        self.records += sign
        self._write()

    def summary(self) -> dict[str, Any]:
        runs = {k: {"ops": v["ops"], "steps": sorted(map(int, v["steps"])),
                    **{f: v[f] for f in ("parent", "trial", "retrain")
                       if v.get(f) is not None}}
                for k, v in self.runs.items()}
        out: dict[str, Any] = {"owner": f"{socket.gethostname()}:{os.getpid()}",
                               "records": self.records, "runs": runs}
        if len(json.dumps(out)) >= LEDGER_BYTES:  # many epochs: counts instead of lists
            for r in runs.values():
                r["n_steps"] = len(r.pop("steps"))
        if len(json.dumps(out)) >= LEDGER_BYTES:  # many runs: the total only
            out = {"owner": out["owner"], "records": self.records, "runs": {},
                   "truncated": True}
        return out

    def _write(self) -> None:
        if self.path is None:
            return
        blob = json.dumps(self.summary()).encode().ljust(LEDGER_BYTES - 1) + b"\n"
        try:
            fd = os.open(self.path, os.O_WRONLY)
            try:
                os.pwrite(fd, blob, 0)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            log.warning("could not update %s (%s)", self.path, e)

    @staticmethod
    def read(folder: Path) -> dict[str, Any] | None:
        """The writer's summary if it held records in memory only, else None."""
        try:
            st = json.loads((folder / LEDGER).read_bytes())
            return st if isinstance(st, dict) and int(st.get("records", 0)) > 0 else None
        except (OSError, ValueError, TypeError):
            return None


def lost_marks(lost: dict[str, Any], ids: dict[str, str]) -> list[dict[str, Any]]:
    """The operations that mark each existing run whose records a dead process lost: the
    tag ``scarcelab.records_lost`` (one line, also appended to the run's description) and,
    where they can be counted, ``scarcelab.epochs_lost`` (epochs whose metrics are gone)
    and, on a parent, ``scarcelab.trials_lost`` (child runs never created: their whole
    record is gone, counted with their epochs)."""
    why = (f"lost when its process ({lost.get('owner', '?')}) died while the tracking "
           "server was away and the spool's disk was full (held in memory only)")
    lines: dict[str, list[str]] = {}
    tags: dict[str, dict[str, str]] = {}
    unborn: dict[str, dict[str, Any]] = {}
    for key, r in sorted((lost.get("runs") or {}).items()):
        ops: dict[str, int] = r.get("ops", {})
        n = sum(ops.values())
        steps = r.get("steps")
        n_steps = len(steps) if steps is not None else int(r.get("n_steps", 0))
        if ops.get("create_run"):  # the run itself was never created
            p = unborn.setdefault(r.get("parent") or "study",
                                  {"names": [], "records": 0, "epochs": 0})
            p["names"].append(f"trial {r['trial']}" if r.get("trial") is not None else
                              f"retrain {r['retrain']}" if r.get("retrain") is not None
                              else key)
            p["records"] += n
            p["epochs"] += n_steps
            continue
        parts = []
        if n_steps:
            parts.append(f"the metrics of {n_steps} epoch(s)"
                         + (f", steps {_ranges(steps)}" if steps else ""))
            tags.setdefault(key, {})[T.EPOCHS_LOST] = str(n_steps)
        if ops.get("terminate"):
            parts.append("its end: it was left RUNNING")
        lines.setdefault(key, []).append(
            f"{n} tracking record(s) of this run" + (f" ({'; '.join(parts)})" if parts
                                                     else ""))
    for parent, p in unborn.items():
        lines.setdefault(parent, []).append(
            f"{len(p['names'])} run(s) under it that were never created ("
            + ", ".join(p["names"]) + f": {p['records']} record(s)"
            + (f", the metrics of {p['epochs']} epoch(s)" if p["epochs"] else "") + ")")
        tags.setdefault(parent, {})[T.TRIALS_LOST] = str(len(p["names"]))
    if lost.get("truncated"):
        lines.setdefault("study", []).append(f"{lost.get('records')} tracking record(s)")
    out: list[dict[str, Any]] = []
    for key, parts in lines.items():
        if key not in ids:  # its run was never created either: counted on its parent
            continue
        line = "Records lost: " + "; ".join(parts) + f", {why}."
        t = {T.RECORDS_LOST: line, **tags.get(key, {})}
        out.append({"op": "log_batch", "key": key, "tags": [[k, v] for k, v in t.items()]})
        out.append({"op": "note_append", "key": key, "line": line})
    return out


class DiskFull(OSError):
    """The journal could not take a record (ENOSPC / EDQUOT)."""


class _Chunk:
    """``log_batch`` operations of one run that go out as one request: within MLflow's
    limits, a tag written twice kept at its last value (the state two requests would leave)
    and a parameter logged again with the same value kept once. A parameter logged again
    with another value does not fit: it goes in the next request, where MLflow refuses it
    exactly as it would have refused the second of two requests."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.parts: list[dict[str, Any]] = []
        self.metrics: list[Any] = []
        self.params: dict[str, str] = {}
        self.tags: dict[str, str] = {}
        self.bytes = 0

    def _sizes(self, op: dict[str, Any]) -> tuple[int, int, int, int]:
        params = {k for k, _ in op.get("params") or []} - set(self.params)
        tags = {k for k, _ in op.get("tags") or []} - set(self.tags)
        return (len(self.metrics) + len(op.get("metrics") or []),
                len(self.params) + len(params), len(self.tags) + len(tags),
                self.bytes + len(json.dumps(op, default=str)))

    def fits(self, op: dict[str, Any]) -> bool:
        if not self.parts:
            return True  # alone it is what the caller asked for (the client splits it)
        if any(self.params.get(k, v) != v for k, v in op.get("params") or []):
            return False
        m, p, t, size = self._sizes(op)
        return (m <= BATCH_LIMITS["metrics"] and p <= BATCH_LIMITS["params"]
                and t <= BATCH_LIMITS["tags"] and m + p + t <= BATCH_ENTITIES
                and size <= BATCH_BYTES)

    def full(self) -> bool:
        m, p, t = len(self.metrics), len(self.params), len(self.tags)
        return (m >= BATCH_LIMITS["metrics"] or p >= BATCH_LIMITS["params"]
                or t >= BATCH_LIMITS["tags"] or m + p + t >= BATCH_ENTITIES
                or self.bytes >= BATCH_BYTES)

    def add(self, op: dict[str, Any]) -> None:
        self.parts.append(op)
        self.bytes += len(json.dumps(op, default=str))
        self.metrics += op.get("metrics") or []
        for k, v in op.get("params") or []:
            self.params[k] = v
        for k, v in op.get("tags") or []:
            self.tags[k] = v

    def op(self) -> dict[str, Any]:
        """The request: the operation itself when it is alone."""
        if len(self.parts) == 1:
            return self.parts[0]
        out: dict[str, Any] = {"op": "log_batch", "key": self.key, "_id": uuid.uuid4().hex}
        for name, items in (("metrics", self.metrics),
                            ("params", [[k, v] for k, v in self.params.items()]),
                            ("tags", [[k, v] for k, v in self.tags.items()])):
            if items:
                out[name] = items
        return out


class _Held:
    """What the delivery thread holds to send together (a remote server's batches): per
    run, its chunks in order. Runs are independent records, so runs go out one after the
    other; within a run the order of its operations is kept."""

    def __init__(self) -> None:
        self.runs: dict[str, list[_Chunk]] = {}
        self.n = 0
        self.since = 0.0  # monotonic time of the first operation held

    def __len__(self) -> int:
        return self.n

    def add(self, op: dict[str, Any]) -> bool:
        """Hold ``op``; True when a request is full (send now)."""
        if not self.n:
            self.since = time.monotonic()
        chunks = self.runs.setdefault(str(op.get("key")), [])
        if not chunks or not chunks[-1].fits(op):
            chunks.append(_Chunk(str(op.get("key"))))
        chunks[-1].add(op)
        self.n += 1
        return len(chunks) > 1 or chunks[-1].full()

    def take(self) -> list[_Chunk]:
        out = [c for chunks in self.runs.values() for c in chunks]
        self.runs, self.n = {}, 0
        return out


class Spool:
    """Send-or-spool for one tracking URI. ``deliver(op, ids)`` does the real MLflow call."""

    def __init__(self, tracking_uri: str, deliver: Callable[[dict[str, Any], dict[str, str]],
                                                             str | None],
                 root: Path | None = None, folder: Path | None = None,
                 remote: bool | None = None, background: bool = False,
                 batch_s: float | None = None, queue_max: int | None = None) -> None:
        self.tracking_uri = tracking_uri
        self._deliver = deliver
        self.remote = is_remote(tracking_uri) if remote is None else remote
        self.root = Path(root or DEFAULT_ROOT)
        self.dir: Path | None = folder
        self.ids: dict[str, str] = {}
        self.pending: list[dict[str, Any]] = []
        self.delivered = 0  # journal records already delivered
        self.journaled = 0  # journal records on disk
        self.memory_only = 0  # records the disk would not take (kept in memory only)
        self.skipped: str | None = None  # a torn/corrupt tail found on load
        self.last_attempt = 0.0
        self.late_keys: set[str] = set()
        self.ledger = MemoryLedger()  # what memory holds that the disk would not take
        self.lost: dict[str, Any] | None = None  # a dead writer's ledger, found on load
        self._lock_fd: int | None = None
        self._bg: queue.Queue[dict[str, Any]] | None = None  # the delivery thread's queue
        self._bg_thread: threading.Thread | None = None
        self._bg_error: tuple[dict[str, Any], BaseException] | None = None
        # a remote server's batches are held and merged; a local store's go one by one
        self._batch_s = (BATCH_S if self.remote else 0.0) if batch_s is None else batch_s
        self._queue_max = QUEUE_MAX if queue_max is None else queue_max
        self._mu = threading.RLock()  # the backlog, the journal, ids: one thread at a time
        self._qlock = threading.Lock()  # appending to queue.jsonl + queueing vs. cutting it
        self._journal_fd: int | None = None  # queue.jsonl
        self._qseq = 0  # records in queue.jsonl
        self._journal_off = False  # queue.jsonl failed (disk full): memory only
        if folder is not None:
            self._load()
        elif background:
            self._start_background()

    # -- persistence -----------------------------------------------------------------------
    def _ensure_dir(self) -> Path:
        if self.dir is None:
            name = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
            self.dir = self.root / name
            self.root.mkdir(parents=True, exist_ok=True)
            self.dir.mkdir(mode=0o700)  # its records and state are the user's alone
            (self.dir / "files").mkdir(exist_ok=True)
            if not self._try_lock(self.dir):  # a fresh folder: nobody else knows it yet
                raise RuntimeError(f"could not lock new spool folder {self.dir}")
            self._write_state()
            self.ledger.create(self.dir)
        return self.dir

    def _try_lock(self, d: Path) -> bool:
        """Own ``d`` (exclusive, held until :meth:`release`); False if another process does."""
        fd = os.open(d / "lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._lock_fd = fd
        return True

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor drops the flock
            self._lock_fd = None

    def _write_state(self) -> None:
        assert self.dir is not None
        tmp = self.dir / f"state.json.{os.getpid()}.tmp"
        blob = json.dumps({"tracking_uri": self.tracking_uri, "ids": self.ids,
                           "delivered": self.delivered, "pid": os.getpid(),
                           "memory_only": self.memory_only}).encode()
        try:
            # owner-only (issue 42): the tracking URI may carry a password
            # (http://user:pw@host) and the file waits on disk until delivery. Created
            # 0600 whatever the umask, and set again in case a stale .tmp of this pid was
            # left with other bits (O_CREAT keeps an existing file's mode).
            fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
            try:
                os.fchmod(fd, 0o600)
                view = memoryview(blob)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            tmp.replace(self.dir / "state.json")
        except OSError as e:  # disk full: the old state stays valid (delivery is idempotent)
            tmp.unlink(missing_ok=True)
            log.warning("could not update %s/state.json (%s)", self.dir, e)

    def _load(self) -> None:
        assert self.dir is not None
        st = json.loads((self.dir / "state.json").read_text())
        self.tracking_uri = st["tracking_uri"]
        self.remote = is_remote(self.tracking_uri)
        self.ids = st["ids"]
        self.delivered = int(st["delivered"])
        records, self.skipped = read_journal(self.dir / "journal.jsonl")
        # what the writer's delivery thread had not handed on: after the outage backlog
        # (it came later); some of it may have been delivered or spooled already, and
        # re-sending a batch is idempotent. ``delivered`` counts through both files: a
        # replay appends to neither.
        queued, why = read_journal(self.dir / QUEUE_FILE)
        if why:
            self.skipped = "; ".join(x for x in (self.skipped, f"{QUEUE_FILE}: {why}") if x)
        records += queued
        self.journaled = len(records)
        self.pending = [{**r["op"], "_id": r["id"]} for r in records[self.delivered:]]
        self.lost = MemoryLedger.read(self.dir)
        lost = max(int(st.get("memory_only", 0)), int((self.lost or {}).get("records", 0)))
        if self.skipped or lost:
            log.error("spool %s: %s%s; the %d valid records before it are delivered", self.dir,
                      self.skipped or "", f"; {lost} records never reached the disk (it was "
                      "full)" if lost else "", len(records))

    def _append(self, op: dict[str, Any]) -> dict[str, Any]:
        """Journal ``op`` (and snapshot its files); raises :class:`DiskFull` leaving the
        journal as it was."""
        d = self._ensure_dir()
        copied: list[Path] = []
        try:
            for field in ("path", "example_path"):  # snapshot: the caller may overwrite them
                if op.get(field) and not str(op[field]).startswith(str(d)):
                    dst = d / "files" / f"{self.journaled:06d}-{Path(op[field]).name}"
                    copied.append(dst)
                    shutil.copyfile(op[field], dst)
                    op = {**op, field: str(dst)}
            body = {k: v for k, v in op.items() if k != "_id"}
            rec = {"seq": self.journaled, "id": op["_id"], "op": body,
                   "sum": _digest(self.journaled, op["_id"], body)}
            line = (json.dumps(rec) + "\n").encode()
            fd = os.open(d / "journal.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                size = os.fstat(fd).st_size
                try:
                    n = os.write(fd, line)
                    if n != len(line):
                        raise OSError(errno.ENOSPC, "short write to the spool journal")
                    os.fsync(fd)
                except OSError:
                    try:
                        os.ftruncate(fd, size)  # no torn record left behind
                    except OSError:
                        pass
                    raise
            finally:
                os.close(fd)
        except OSError as e:
            for p in copied:
                p.unlink(missing_ok=True)
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFull(e.errno, f"spool disk full: {e}") from e
            raise
        self.journaled += 1
        return op

    def _keep(self, op: dict[str, Any]) -> None:
        """Queue ``op`` behind the backlog: on disk, or in memory once the disk is full."""
        if self.memory_only == 0:
            try:
                self.pending.append(self._append(op))
                return
            except DiskFull as e:
                msg = (f"{e}: from now on tracking records are kept in memory only and are "
                       "lost if this process dies before the server is back; the journal in "
                       f"{self.dir} holds everything before this point")
                log.error(msg)
                print(f"[scarcelab] {msg}", file=sys.stderr, flush=True)
        self.memory_only += 1
        self.pending.append(op)
        self.ledger.count(op)
        self._write_state()

    # -- sending ---------------------------------------------------------------------------
    def _send(self, op: dict[str, Any], journaled: bool) -> None:
        new_id = self._deliver({**op, "_replay": journaled}, self.ids)
        if op["op"] == "create_run" and new_id:
            self.ids[op["key"]] = new_id

    def submit(self, op: dict[str, Any]) -> None:
        """Deliver now, or keep in order behind what is already waiting."""
        op = {**op, "_id": op.get("_id") or uuid.uuid4().hex}
        if self._bg is not None:
            if op["op"] in BACKGROUND_OPS:
                self._enqueue(op)
            else:  # after everything before it, on this thread
                self._wait_background()
                with self._mu:
                    self._submit_now(op)
            self._raise_background_error()
            return
        self._submit_now(op)

    def _submit_now(self, op: dict[str, Any]) -> None:
        if not self.remote:  # a local store: nothing to wait out, errors are real
            self._send(op, journaled=False)
            if op["op"] == "create_run" and self.dir is not None:
                self._write_state()  # a replay after a crash must know the new run
            return
        if not self.pending:
            try:
                self._send(op, journaled=False)
                return
            except Exception as e:  # noqa: BLE001 - classified just below
                if not is_transient(e):
                    self._reject(op, e)
                    return
                self._outage([op], e)
                return
        self._keep(op)
        self.flush()

    def _outage(self, ops: list[dict[str, Any]], e: BaseException) -> None:
        """The server did not answer: ``ops`` start the backlog on disk, said once."""
        for op in ops:
            self._keep(op)
        self.last_attempt = time.time()
        self._write_state()
        msg = (f"tracking server {redact(self.tracking_uri)} unreachable ({type(e).__name__}); "
               f"training goes on, records are spooled to {self.dir}")
        log.warning(msg)
        print(f"[scarcelab] {msg}", file=sys.stderr, flush=True)

    def _reject(self, op: dict[str, Any], e: BaseException) -> None:
        d = self._ensure_dir()
        with open(d / "rejected.jsonl", "a") as f:
            f.write(json.dumps({"op": op, "error": f"{type(e).__name__}: {e}"[:2000]}) + "\n")
        log.error("tracking server rejected %s (%s); kept in %s", op["op"], e, d)

    def flush(self, force: bool = False) -> bool:
        """Try to deliver the backlog (at most every RETRY_INTERVAL_S unless ``force``);
        True when nothing is left. With a delivery thread, the thread retries the backlog:
        called from another thread this only says whether anything is left."""
        if not self.pending:
            return True
        if self._bg is not None and threading.current_thread() is not self._bg_thread:
            return False
        if not force and time.time() - self.last_attempt < RETRY_INTERVAL_S:
            return False
        self.last_attempt = time.time()
        while self.pending:
            op = self.pending[0]
            on_disk = self.delivered < self.journaled
            try:
                self._send(op, journaled=True)
            except Exception as e:  # noqa: BLE001
                if is_transient(e):
                    self._write_state()
                    return False
                self._reject(op, e)
            self.pending.pop(0)
            if on_disk:
                self.delivered += 1
            else:
                self.memory_only -= 1
                self.ledger.count(op, -1)
            if op.get("key"):
                self.late_keys.add(op["key"])
            self._write_state()
        print(f"[scarcelab] tracking server back: spooled records delivered from {self.dir}",
              file=sys.stderr, flush=True)
        return self._finish()

    def _finish(self) -> bool:
        """All delivered: mark the runs that got records late (and those that lost some),
        then drop the folder. False when the marks could not be sent (folder kept)."""
        tags = [[T.SPOOL, "delivered_late"]]
        if self.skipped:  # the loss is visible where the results are read, not only in a log
            tags.append([T.SPOOL_SKIPPED, self.skipped])
        for key in sorted(self.late_keys):
            if key in self.ids:
                try:
                    self._send({"op": "log_batch", "key": key, "_id": uuid.uuid4().hex,
                                "tags": tags}, journaled=False)
                except Exception:  # noqa: BLE001 - a tag is not worth keeping the spool for
                    pass
        self.late_keys.clear()
        if self.lost and not self._mark_lost():
            return False  # kept: the next replay marks them (the marks are idempotent)
        if self.dir is not None and not (self.dir / "rejected.jsonl").exists():
            if self._bg is not None:
                # the delivery thread's queue.jsonl lives here (open, under the lock): only
                # the delivered backlog goes
                # the state first: a crash in between re-sends the backlog (idempotent)
                # rather than skipping queued records
                self.delivered = self.journaled = 0
                self._write_state()
                (self.dir / "journal.jsonl").unlink(missing_ok=True)
                shutil.rmtree(self.dir / "files", ignore_errors=True)
                (self.dir / "files").mkdir(exist_ok=True)
                return True
            shutil.rmtree(self.dir, ignore_errors=True)
            self.release()
            self.dir = None
            self.delivered = self.journaled = 0
        return True

    def _mark_lost(self) -> bool:
        """Mark the runs whose records the dead writer held in memory only: otherwise such
        a run stays RUNNING with part of its trials and nothing says so.
        False when the server failed meanwhile (the folder is kept for the next try)."""
        assert self.lost is not None
        marks = lost_marks(self.lost, self.ids)
        try:
            for op in marks:
                self._send({**op, "_id": uuid.uuid4().hex}, journaled=False)
        except Exception as e:  # noqa: BLE001 - transient or not, the folder is kept
            log.warning("could not mark the runs that lost records (%s); kept in %s", e,
                        self.dir)
            return False
        n = int(self.lost.get("records", 0))
        msg = (f"spool {self.dir}: {n} tracking record(s) held in memory only were lost "
               f"when process {self.lost.get('owner', '?')} died; "
               f"{len(marks) // 2} run(s) marked (tag {T.RECORDS_LOST})")
        log.error(msg)
        print(f"[scarcelab] {msg}", file=sys.stderr, flush=True)
        self.lost = None
        return True

    # -- the delivery thread ----------------------------------------------------------------
    def _start_background(self) -> None:
        self._bg = queue.Queue(maxsize=max(1, self._queue_max))
        ref = weakref.ref(self)
        self._bg_thread = threading.Thread(
            target=_deliver_in_background, args=(ref, self._bg, self._batch_s,
                                                 self.remote and self._batch_s > 0),
            name="scarcelab-tracking", daemon=True)
        self._bg_thread.start()
        _LIVE.add(self)

    def _enqueue(self, op: dict[str, Any]) -> None:
        """Journal ``op`` in ``queue.jsonl`` and hand it to the thread; waits while the
        queue is full (back-pressure: nothing is dropped)."""
        assert self._bg is not None
        with self._qlock:  # the thread cuts the file only when all of it was handed on
            self._journal_queued(op)
            self._bg.put(op)

    def _journal_queued(self, op: dict[str, Any]) -> None:
        """Append ``op`` to ``queue.jsonl`` (one ``write``, no fsync) so that a process
        crash before its delivery leaves it for the next start to replay."""
        if self._journal_off:
            return
        try:
            if self._journal_fd is None:
                d = self._ensure_dir()
                self._journal_fd = os.open(d / QUEUE_FILE,
                                           os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            body = {k: v for k, v in op.items() if k != "_id"}
            rec = {"seq": self._qseq, "id": op["_id"], "op": body,
                   "sum": _digest(self._qseq, op["_id"], body)}
            line = (json.dumps(rec) + "\n").encode()
            size = os.fstat(self._journal_fd).st_size
            if os.write(self._journal_fd, line) != len(line):
                os.ftruncate(self._journal_fd, size)
                raise OSError(errno.ENOSPC, "short write to the spool journal")
            self._qseq += 1
        except OSError as e:
            self._journal_off = True
            msg = (f"tracking journal {self.dir} failed ({e}): queued tracking records are "
                   "now kept in memory only until delivered (lost if this process is killed "
                   "before that)")
            log.error(msg)
            print(f"[scarcelab] {msg}", file=sys.stderr, flush=True)

    def _cut_queue_file(self, blocking: bool = True) -> None:
        """Empty ``queue.jsonl`` once everything in it was handed on (delivered, or in the
        outage journal). From the caller after the queue drained, or from the thread when
        it is idle (it then skips the cut while the caller is queueing)."""
        if self._journal_fd is None or not self._qseq:
            return
        if not self._qlock.acquire(blocking=blocking):
            return
        try:
            q = self._bg
            if q is not None:
                with q.mutex:
                    if q.unfinished_tasks:
                        return
            os.ftruncate(self._journal_fd, 0)
            self._qseq = 0
        except OSError as e:  # a replay re-sends delivered batches: idempotent
            log.warning("could not reset the tracking journal in %s (%s)", self.dir, e)
        finally:
            self._qlock.release()

    def _wait_background(self) -> None:
        """Block until the delivery thread has handed on everything queued so far (sent it
        or, for a server that is away, spooled it), then cut ``queue.jsonl`` back to empty
        (it only holds what is not handed on yet)."""
        if self._bg is None:
            return
        self._bg.put(_FLUSH)  # what the thread holds for a batch goes now
        self._bg.join()
        self._cut_queue_file()

    def _bg_deliver(self, chunks: list[_Chunk]) -> None:
        """The thread sends what it held: one request per chunk, in order. A remote
        server's outage spools the chunk's operations (in order, unmerged) like a
        synchronous call's; a refusal of a merged request is sorted out one by one."""
        with self._mu:
            for chunk in chunks:
                if not self.remote:
                    for op in chunk.parts:
                        try:
                            self._send(op, journaled=False)
                        except Exception as e:  # noqa: BLE001 - raised on the caller's thread
                            log.error("tracking store refused %s of %s: %s", op["op"],
                                      op.get("key"), e)
                            if self._bg_error is None:
                                self._bg_error = (op, e)
                    continue
                if self.pending:  # behind the backlog, on disk
                    for op in chunk.parts:
                        self._keep(op)
                    continue
                try:
                    self._send(chunk.op(), journaled=False)
                except Exception as e:  # noqa: BLE001 - classified just below
                    if is_transient(e):
                        self._outage(chunk.parts, e)
                    elif len(chunk.parts) > 1:
                        for op in chunk.parts:  # only the refused one is rejected
                            self._submit_now(op)
                    else:
                        self._reject(chunk.parts[0], e)

    def _raise_background_error(self) -> None:
        if self._bg_error is None:
            return
        op, e = self._bg_error
        self._bg_error = None
        raise TrackingWriteError(
            f"tracking store {redact(self.tracking_uri)} refused a queued {op['op']} of run "
            f"{op.get('key')!r} ({type(e).__name__}: {str(e)[:500]}); the records queued "
            "after it were still delivered") from e

    def drain(self) -> None:
        """Everything submitted so far is in the store when this returns (the delivery
        thread is idle; for a server that is away: in the spool); raises what a local
        store refused meanwhile."""
        self._wait_background()
        self._raise_background_error()

    def _stop_background(self) -> None:
        """Stop the thread once it has handed everything on. The folder goes when nothing
        is left in it to deliver (an outage backlog and rejected operations stay, with the
        lock, for :meth:`close`)."""
        if self._bg is None:
            return
        self._wait_background()
        self._bg.put(_STOP)
        if self._bg_thread is not None:
            self._bg_thread.join()
        self._bg = self._bg_thread = None
        _LIVE.discard(self)
        if self._journal_fd is not None:
            os.close(self._journal_fd)
            self._journal_fd = None
        if self.dir is None:
            return
        if self.pending or (self.dir / "rejected.jsonl").exists():
            (self.dir / QUEUE_FILE).unlink(missing_ok=True)  # all of it was handed on
            return
        shutil.rmtree(self.dir, ignore_errors=True)  # everything went out
        self.dir = None
        self.release()

    def close(self, timeout_s: float) -> Path | None:
        """Keep trying for ``timeout_s``; return the spool folder if anything is left."""
        if self._bg is not None:
            self._stop_background()
            if not self.remote:
                self._raise_background_error()
                return None
            self._raise_background_error()
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
            if self.memory_only:
                msg = (f"{self.memory_only} tracking records never reached the disk (it was "
                       "full) and are lost with this process")
                log.error(msg)
                print(f"[scarcelab] {msg}", file=sys.stderr, flush=True)
            self.release()
            return self.dir
        left = self.dir if self.dir is not None and (self.dir / "rejected.jsonl").exists() \
            else None
        self.release()
        return left


class TrackingWriteError(RuntimeError):
    """A tracking store refused a batch that the delivery thread was sending (a local
    store's refusal; a remote server's goes to ``rejected.jsonl``), or the thread could not
    spool it."""


def _deliver_in_background(ref: weakref.ref[Spool], q: queue.Queue[dict[str, Any]],
                           batch_s: float, merge: bool) -> None:
    """The delivery thread: send the queued operations in order. With ``merge`` (a remote
    server) the batches of each run are held up to ``batch_s`` from the first one, or until
    a request is full or the caller waits, and go out together; a ``note_append`` goes
    after what came before it. While an outage backlog waits, it is retried every
    ``RETRY_INTERVAL_S`` even when nothing new comes. A delivery error is kept for the
    caller's thread; nothing queued after it is dropped."""
    held = _Held()
    while True:
        timeout: float | None = None
        if len(held):
            timeout = max(0.0, held.since + batch_s - time.monotonic())
        else:
            sp = ref()
            if sp is None:
                return
            if sp.pending:  # a backlog: its next retry is due then
                timeout = max(0.05, sp.last_attempt + RETRY_INTERVAL_S - time.time())
            del sp
        op: dict[str, Any] | None = None
        if timeout != 0.0 or not len(held):  # held past its time: send before taking more
            try:
                op = q.get(timeout=timeout)
            except queue.Empty:
                op = None
        sp = ref()
        if sp is None:
            return
        try:
            _step(sp, q, held, op, merge)
        except Exception as e:  # noqa: BLE001 - the thread must outlive it (callers join)
            log.error("tracking delivery thread: %s", e)
            if sp._bg_error is None:
                sp._bg_error = ({"op": "delivery", "key": None}, e)
        finally:
            del sp
        if op is _STOP:
            return


def _step(sp: Spool, q: queue.Queue[dict[str, Any]], held: _Held,
          op: dict[str, Any] | None, merge: bool) -> None:
    """One wake-up of the delivery thread: ``op`` arrived (None: a timeout)."""
    def send_held() -> None:
        n = len(held)
        if not n:
            return
        try:
            sp._bg_deliver(held.take())
        except Exception as e:  # noqa: BLE001 - e.g. the spool's disk: raised on the caller
            log.error("tracking delivery thread: %s", e)
            if sp._bg_error is None:
                sp._bg_error = ({"op": "log_batch", "key": None}, e)
        finally:
            for _ in range(n):
                q.task_done()

    if op is None:  # held long enough, or the backlog's retry is due
        if len(held):
            send_held()
        elif sp.pending:
            with sp._mu:
                sp.flush()
        sp._cut_queue_file(blocking=False)
        return
    if op is _STOP or op is _FLUSH:
        try:
            send_held()
        finally:
            q.task_done()
        return
    if not merge or op["op"] != "log_batch":
        send_held()  # what came before it goes first
        held.add(op)
        send_held()
        if merge:
            sp._cut_queue_file(blocking=False)
        return
    if held.add(op):
        send_held()


# Spools whose delivery thread runs. A process that ends without closing its tracker (an
# uncaught error before end_study) still delivers what it queued: atexit handlers run
# before daemon threads are stopped.
_LIVE: weakref.WeakSet[Spool] = weakref.WeakSet()


@atexit.register
def _drain_at_exit() -> None:
    for sp in list(_LIVE):
        if sp._bg is not None:
            try:
                sp._stop_background()
            except Exception as e:  # noqa: BLE001 - at exit: say it, do not mask the exit
                log.error("tracking records could not be delivered at exit: %s", e)


def _owner_alive(st: dict[str, Any]) -> bool:
    pid = int(st.get("pid", 0))
    return pid > 0 and pid != os.getpid() and Path(f"/proc/{pid}").exists()


def leftovers(tracking_uri: str, root: Path | None = None) -> list[Path]:
    """Spool folders of dead processes for this server (to replay on the next start)."""
    base = Path(root or DEFAULT_ROOT)
    out = []
    for d in sorted(base.glob("*/state.json")):
        try:
            st = json.loads(d.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if st.get("tracking_uri") == tracking_uri and not _owner_alive(st) and (
                (d.parent / "journal.jsonl").exists() or (d.parent / QUEUE_FILE).exists()):
            out.append(d.parent)
    return out


def replay(folder: Path, deliver: Callable[[dict[str, Any], dict[str, str]], str | None],
           ids_out: dict[str, str] | None = None) -> bool:
    """Deliver a left-over spool under its lock; True when everything went out (or another
    process had already delivered it). A folder another process holds is left alone.
    ``ids_out`` receives the run ids of the folder's runs once delivered (those created
    during the outage get theirs here)."""
    folder = Path(folder)
    sp = Spool("", deliver)
    try:
        locked = sp._try_lock(folder)
    except FileNotFoundError:
        return True  # delivered and removed by another replay meanwhile
    if not locked:
        print(f"[scarcelab] spool {folder} is being delivered by another process; left to it",
              file=sys.stderr, flush=True)
        return False
    try:
        if not (folder / "state.json").exists():
            return True  # another replay finished it between our look and our lock
        sp.dir = folder
        sp._load()
        sp.late_keys = {op["key"] for op in sp.pending if op.get("key")}
        try:
            return sp._finish() if not sp.pending else sp.flush(force=True)
        finally:
            if ids_out is not None:
                ids_out.update(sp.ids)
    finally:
        sp.release()


def _replay_target(d: Path) -> tuple[str | None, int]:
    """(the tracking URI of spool folder ``d``, 0) when it can be replayed, else (None,
    exit status) after one line saying why: a folder that is gone is usually one that was
    delivered (a delivered spool is removed), which is not an error; a path that is not a
    spool folder, or one whose state cannot be read, is."""
    if not d.exists():
        print(f"{d}: nothing to deliver: no such folder (a spool folder is removed once "
              "everything in it is delivered; check the path if you expected records there)")
        return None, 0
    if not d.is_dir():
        print(f"Error: {d} is not a folder; pass a spool folder (the path the study printed, "
              f"under {DEFAULT_ROOT})", file=sys.stderr)
        return None, 2
    state = d / "state.json"
    if not state.exists():
        what = ("has a journal but no state.json: it cannot be delivered (the run ids are in "
                "state.json)") if (d / "journal.jsonl").exists() or (d / QUEUE_FILE).exists() \
            else "is not a spool folder (no state.json, no journal.jsonl)"
        print(f"Error: {d} {what}; pass the folder the study printed, under {DEFAULT_ROOT}",
              file=sys.stderr)
        return None, 2
    try:
        uri = json.loads(state.read_text())["tracking_uri"]
        if not isinstance(uri, str):
            raise TypeError("tracking_uri is not a string")
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"Error: {state} cannot be read ({type(e).__name__}: {e}); the folder is "
              "left as it is", file=sys.stderr)
        return None, 1
    return uri, 0


def main(argv: list[str] | None = None) -> int:
    """``python -m scarcelab.tracking.spool replay DIR...``: deliver spools left by ended
    processes. Exit status 0 when every folder was delivered (or was already gone), 1 when
    something is left, 2 for a path that is not a spool folder."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m scarcelab.tracking.spool")
    p.add_argument("action", choices=["replay"])
    p.add_argument("dirs", nargs="+")
    a = p.parse_args(argv)
    status = 0
    for d in map(Path, a.dirs):
        uri, code = _replay_target(d)
        if uri is None:
            status = max(status, code)
            continue
        import mlflow

        from scarcelab.tracking.mlflow_tracker import replay_folder

        mlflow.set_tracking_uri(uri)
        hide_mlflow_links(uri)  # closing a run prints its link, with the URI's password
        try:
            done = replay_folder(d)
        except Exception as e:  # noqa: BLE001 - one line per folder, the others still go
            print(f"Error: {d}: replay failed ({type(e).__name__}: {str(e)[:300]}); the folder "
                  "is kept and can be replayed again", file=sys.stderr)
            status = max(status, 1)
            continue
        rejected = d / "rejected.jsonl"
        note = ""
        if rejected.exists():
            n = sum(1 for line in rejected.read_text().splitlines() if line.strip())
            note = f"; {n} operation(s) the server rejected are kept in {rejected}"
        print(f"{d}: {'delivered' if done else 'not (fully) delivered: see the messages above'}"
              f"{note}")
        status = max(status, 0 if done else 1)
    return status


if __name__ == "__main__":
    sys.exit(main())
