"""The sweep driver's scheduling loop, in process: a fake pool that runs no Ray and no
subprocess, a real MLflow sqlite store behind a client that records every call.

What is pinned (recorded on the driver as it was when this guard was written) is the
loop's whole behaviour as its users see it: the progress lines, word for word; the
tracker calls in their order (run ids by order of appearance, timestamps left out);
what each cell is submitted with (its argv with dependencies resolved, its working
directory); the lock checks before each start. The branches: a first-try success, a
retry that then succeeds, a cell that fails every attempt, dependents released or
failed with their dependency (transitively), a task whose worker died after its run
FINISHED (done) or before (failed), an interrupt mid-loop, a lost lock at a submit,
dependents whose dependency never ends, and a cell no node can hold. The golden file
is tests/sweep_schedule_golden.json; regenerate it only when a change of behaviour is
meant (``SWEEP_GUARD_RECORD=1``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from scarcelab.tracking.sweep import driver as driver_mod
from scarcelab.tracking.sweep import pool as pool_mod
from scarcelab.tracking.sweep.driver import Driver
from scarcelab.tracking.sweep.spec import SpecError, parse_spec

GOLDEN = Path(__file__).resolve().parents[2] / "sweep_schedule_golden.json"
RECORD = os.environ.get("SWEEP_GUARD_RECORD") == "1"

SPEC = """\
name: guard
retries: 1
grids:
  - id: pre
    entry: self
    method: simclr
    seed: [0, 1]
  - entry: probe
    encoder: "@pre"
    seed: 0
  - id: bad
    entry: self
    method: simclr
    seed: 7
    set: {mode: fail}
  - id: seg
    entry: segment
    encoder: "@bad"
  - entry: probe
    encoder: "@seg"
    seed: 3
  - entry: self
    method: simclr
    seed: 8
    set: {mode: flaky}
  - entry: self
    method: simclr
    seed: 9
    set: {mode: lostnode}
  - entry: self
    method: simclr
    seed: 10
    set: {mode: broken}
"""


class Events:
    """One ordered log of what the driver did, with run ids replaced by ``r<n>`` in the
    order they first appear (they are random)."""

    def __init__(self) -> None:
        self.log: list[Any] = []
        self.ids: dict[str, str] = {}

    def norm(self, v: Any) -> Any:
        if isinstance(v, str):
            v = re.sub(r"^/tmp/tmp[^/]+/", "<tmp>/", v)  # a report file's temporary folder
            for rid in re.findall(r"[0-9a-f]{32}", v):
                self.ids.setdefault(rid, f"r{len(self.ids)}")
                v = v.replace(rid, self.ids[rid])
            return v
        if isinstance(v, (list, tuple)):
            return [self.norm(x) for x in v]
        if isinstance(v, dict):
            return {self.norm(k): self.norm(x) for k, x in sorted(v.items())}
        if type(v).__name__ == "Metric":
            return ["Metric", v.key, v.value, v.step]
        if type(v).__name__ == "RunTag":
            return ["RunTag", v.key, self.norm(v.value)]
        if isinstance(v, (int, float, bool)) or v is None:
            return v
        return type(v).__name__

    def add(self, *what: Any) -> None:
        self.log.append(self.norm(list(what)))


class RecordingClient:
    """The real client; each call is logged before it runs (and a created run's id as it
    returns, so ids are numbered in creation order)."""

    def __init__(self, client: MlflowClient, ev: Events) -> None:
        self._c, self._ev = client, ev

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._c, name)

        def call(*args: Any, **kw: Any) -> Any:
            if name == "create_run":
                out = fn(*args, **kw)
                self._ev.add("client.create_run", out.info.run_id, kw.get("tags", {}))
                return out
            if name == "set_terminated" and "end_time" in kw:
                kw = {**kw, "end_time": "<ms>"}
            self._ev.add(f"client.{name}", list(args), kw)
            return fn(*args, **kw)

        return call


class FakeLock:
    def __init__(self, ev: Events, lose_at: int | None = None) -> None:
        self.ev, self.n, self.lose_at = ev, 0, lose_at

    def check(self) -> None:
        self.n += 1
        self.ev.add("lock.check", self.n)
        if self.lose_at is not None and self.n >= self.lose_at:
            raise RuntimeError("lock lost")


def make_pool(ev: Events, interrupt_at: int | None = None) -> type:
    """A pool class that runs each submitted cell when it is collected, first in first
    out, two slots: the cell's ``--set mode=…`` says how it ends."""
    attempts: dict[str, int] = {}

    class FakePool:
        def __init__(self, address: Any, jobs: Any, cpus: Any, gpus: Any) -> None:
            ev.add("pool.init", address, jobs, cpus, gpus)
            self.slots = 2
            self.queue: list[tuple[str, list[str], dict[str, str]]] = []
            self.n_done = 0

        def submit(self, key: str, fn: Any, argv: list[str], env: dict[str, str],
                   cwd: Any, python: str) -> None:
            ev.add("pool.submit", key, fn.__name__, argv, env["MLFLOW_RUN_ID"],
                   cwd is not None, sorted(env))
            self.queue.append((key, argv, env))

        def __len__(self) -> int:
            return len(self.queue)

        @property
        def running(self) -> int:
            return min(len(self.queue), self.slots)

        def next_done(self) -> tuple[str, Any, BaseException | None]:
            self.n_done += 1
            if interrupt_at is not None and self.n_done == interrupt_at:
                ev.add("pool.interrupt")
                raise KeyboardInterrupt
            key, argv, env = self.queue.pop(0)
            rid = env["MLFLOW_RUN_ID"]
            mode = argv[argv.index("--set") + 1] if "--set" in argv else ""
            attempts[key] = attempts.get(key, 0) + 1
            c = MlflowClient()
            ev.add("pool.done", key, mode, attempts[key])
            if mode == "mode=fail" or (mode == "mode=flaky" and attempts[key] == 1):
                return key, {"rc": 2, "seconds": 3.0, "output": "noise\nError: on purpose\n",
                             "cpu_s": 1.5, "max_rss_mb": 10.0, "machine": {"host": "h"}}, None
            if mode == "mode=lostnode":
                c.set_terminated(rid, "FINISHED")
                return key, None, ConnectionError("node died")
            if mode == "mode=broken":
                return key, None, ConnectionError("worker died")
            c.set_terminated(rid, "FINISHED")
            return key, {"rc": 0, "seconds": 60.0 * attempts[key], "output": "ok\n",
                         "machine": {"host": "h"}}, None

    return FakePool


@pytest.fixture(scope="module")
def empty_db(tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    """An empty store with its schema made once: each test starts from a copy (creating
    the schema is most of a test's time)."""
    db = tmp_path_factory.mktemp("sched") / "empty.db"
    MlflowClient(f"sqlite:///{db}").search_experiments()
    return db


@pytest.fixture
def store(tmp_path, monkeypatch, empty_db):  # type: ignore[no-untyped-def]
    shutil.copy(empty_db, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    for k in ("OPTUNA_STORAGE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
              "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "SCARCELAB_DATA",
              "MLFLOW_S3_ENDPOINT_URL", "OMP_NUM_THREADS", "PYTHONPATH"):
        monkeypatch.delenv(k, raising=False)
    mlflow.set_tracking_uri(uri)
    # one instant for every clock reading: the progress lines quote durations
    monkeypatch.setattr(driver_mod, "time", SimpleNamespace(time=lambda: 1_000_000.0))
    yield uri
    mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI", ""))


def _driver(ev: Events, spec_text: str, lock: FakeLock | None) -> tuple[Driver, list[str]]:
    lines: list[str] = []
    drv = Driver(parse_spec(spec_text, "guard.yaml"), jobs=2, echo=lines.append,
                 python="py", command="scarcelab sweep guard.yaml")
    drv.commit = ""  # the checkout's state and the process id are not the loop's
    drv.owner = "host:1"
    drv.client = RecordingClient(drv.client, ev)  # type: ignore[assignment]
    drv.lock = lock
    return drv, lines


def _check(name: str, got: dict[str, Any]) -> None:
    data = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    if RECORD:
        data[name] = got
        GOLDEN.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    assert got == json.loads(json.dumps(data[name]))


def test_the_whole_loop_retries_releases_and_reports_as_recorded(store, monkeypatch):  # type: ignore[no-untyped-def]
    ev = Events()
    drv, lines = _driver(ev, SPEC, FakeLock(ev))
    monkeypatch.setattr(pool_mod, "RayPool", make_pool(ev))
    res = drv._run(drv._experiment_id())
    outcomes = [[o.cell.label, o.status, ev.norm(o.run_id), o.attempts, o.seconds > 0,
                 o.error] for o in res.outcomes]
    _check("whole", {"lines": [ev.norm(ln) for ln in lines], "events": ev.log,
                     "outcomes": outcomes})


def test_an_interrupt_closes_the_running_cells_as_recorded(store, monkeypatch):  # type: ignore[no-untyped-def]
    ev = Events()
    drv, lines = _driver(ev, SPEC, FakeLock(ev))
    monkeypatch.setattr(pool_mod, "RayPool", make_pool(ev, interrupt_at=4))
    with pytest.raises(KeyboardInterrupt):
        drv._run(drv._experiment_id())
    _check("interrupt", {"lines": [ev.norm(ln) for ln in lines], "events": ev.log})


@pytest.mark.parametrize("lose_at", [5, 8])  # among the first submits; at a retry
def test_a_lost_lock_at_a_submit_stops_the_loop_as_recorded(store, monkeypatch, lose_at):  # type: ignore[no-untyped-def]
    ev = Events()
    drv, lines = _driver(ev, SPEC, FakeLock(ev, lose_at=lose_at))
    monkeypatch.setattr(pool_mod, "RayPool", make_pool(ev))
    with pytest.raises(RuntimeError, match="lock lost"):
        drv._run(drv._experiment_id())
    _check(f"lost_lock_{lose_at}", {"lines": [ev.norm(ln) for ln in lines], "events": ev.log})


def test_dependents_whose_dependency_never_ends_are_failed_as_recorded(store, monkeypatch):  # type: ignore[no-untyped-def]
    """Not reachable from an acyclic spec through ``run``: the loop is handed dependents
    without their dependency, which then never finishes nor fails."""
    ev = Events()
    drv, lines = _driver(ev, SPEC, None)
    monkeypatch.setattr(pool_mod, "RayPool", make_pool(ev))
    exp = drv._experiment_id()
    sweep_run = drv._open_sweep_run(exp)
    from scarcelab.tracking.sweep.driver import SweepResult

    res = SweepResult("guard", sweep_run)
    todo = [c for c in drv.spec.cells if c.entry != "self" or "seed=0" in c.label]
    earlier = {c.id: 0 for c in todo}
    drv._schedule(exp, sweep_run, todo, res, earlier, {})
    outcomes = [[o.cell.label, o.status, ev.norm(o.run_id), o.attempts, o.error]
                for o in res.outcomes]
    _check("never", {"lines": [ev.norm(ln) for ln in lines], "events": ev.log,
                     "outcomes": outcomes, "earlier": sorted(earlier.values())})


def test_a_cell_no_node_can_hold_is_a_spec_error_at_its_line(store, monkeypatch):  # type: ignore[no-untyped-def]
    def refuse(*a: Any) -> None:
        raise pool_mod.Unplaceable("a cell asks for 9 GPU and no node has them", "GPU")

    spec = SPEC.replace("retries: 1\n", "retries: 1\ngpus_per_cell: 9\n")
    ev = Events()
    drv, lines = _driver(ev, spec, None)
    monkeypatch.setattr(pool_mod, "RayPool", refuse)
    with pytest.raises(SpecError) as e:
        drv._run(drv._experiment_id())
    assert str(e.value) == ("guard.yaml:3: a cell asks for 9 GPU and no node has them; "
                            "lower gpus_per_cell or add a node that has as much")
    assert e.value.__cause__ is None and e.value.__suppress_context__
    _check("unplaceable", {"lines": [ev.norm(ln) for ln in lines], "events": ev.log})
