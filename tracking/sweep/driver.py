"""Run a grid spec's cells as Ray tasks, with MLflow as the record (DESIGN §4.4).

Why Ray: it runs embedded on one machine (``ray.init()`` starts a private cluster of this
machine's cores and GPUs) and unchanged against a cluster (``--address ray://head:10001``,
KubeRay on Kubernetes), with per-task resource declarations (1 GPU per study where GPUs
exist) — no home-made queue. Why a subprocess per cell: a cell is exactly the command a
user would type (``scarcelab semi --method …``), so it is isolated (its own torch threads,
CUDA context, memory) and behaves as documented; Ray only places it.

The record:

* one *sweep* run (``scarcelab.role=sweep``, ``scarcelab.sweep=<name>``) per sweep name and
  experiment, reused by every re-run of the spec; it carries the spec, the cell counts and,
  when the grid ends, the grid's report (leaderboard, ranks, … as CSV/markdown/HTML/PNG);
* one run per cell *attempt*, created here and handed to the cell as ``MLFLOW_RUN_ID``
  (the way ``mlflow run`` hands a run to an entry point), nested under the sweep run and
  tagged ``scarcelab.sweep`` and ``scarcelab.cell`` (a hash of entry point + options).

Resuming: re-running the same spec skips every cell that has a FINISHED run, closes runs
that a dead driver left RUNNING as FAILED, and runs the rest again — with
``OPTUNA_STORAGE`` set, a study continues where the killed one stopped (the study's own
resume). A finished cell is never run twice. A failing cell is retried up to ``retries``
times (each attempt its own run, the error and the cell's output on it) and the sweep goes
on with the other cells.

Continuing a killed cell: when the cell's entry point declares that it can continue a
killed run (``tracking.sweep.spec.continues_with`` on its command: ``tune --resume``) and an
earlier attempt of the cell left a study record (a run tagged ``scarcelab.role=study``, or
a dead continuing attempt whose ``scarcelab.resumes`` names one), the next attempt runs
``<entry> --resume <that study run>`` with only the cell's declared options (``--data-dir``,
``--device``), in a new attempt run as every attempt. The entry point then records into
the study run itself, so the finished trials and retrains are kept and only what is missing
runs; the new attempt run is only the launcher (``scarcelab.role=tune_resume``, linked both
ways), which the driver ends FINISHED once the study run is. The cell's FINISHED run, the
one dependents, reports and the results page read, is the study run. A continuation that
fails is retried (``retries``) from the start, as any failed attempt, and the next
invocation starts the cell afresh too: only a continuation cut off with its driver is taken
up again. The study run is
re-opened by the continuation and ends with it, so its own end would span the time the
sweep lay dead: before continuing it, the driver logs where the dead attempt really ended
(``sweep/cell_end_s``), and a results page bounds the attempt's interval by it.

Packing (``gpus_per_cell`` below 1, ``tracking/sweep/gpu.py``): Ray places several cells on
one GPU; each cell gets its CPU share as ``OMP_NUM_THREADS``, a cap of its CUDA allocator
(applied by the cell process, ``tracking/sweep/cell.py``) and, with ``mps: true``, the CUDA
MPS daemon the driver starts. What a cell was given is on the sweep run
(``scarcelab.sweep_resources``) and in the progress output.

Dependencies (``"@<grid id>"`` option values, tracking/sweep/spec.py): a dependent cell is
submitted once the cell it depends on has a FINISHED run — from this invocation or an
earlier one — with the option set to ``runs:/<that run id>/model`` (the run the driver
created for the cell and handed to it as ``MLFLOW_RUN_ID``, which is where its study logs
its checkpoint and model). When the dependency fails for good, the dependent is recorded
FAILED (a run with ``scarcelab.error`` naming the dependency) without being started, and
the rest of the grid goes on.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from scarcelab import tags as T
from scarcelab.redaction import hide_mlflow_links
from scarcelab.tracking.sweep.spec import (
    NAME_FORBIDDEN,
    Cell,
    Continuation,
    SpecError,
    SweepSpec,
    entry_continuation,
    env_refusal,
)

#: in the error of a cell attempt that a dead driver left RUNNING (see ``_close_stale``)
STALE_MARK = "died while this cell ran"
#: in the error of a cell attempt that an interrupted driver closed (``close_started``)
INTERRUPT_MARK = "the sweep driver was interrupted"


def last_record_ms(client: Any, run: Any, depth: int = 2) -> int | None:
    """The latest start or end time (ms) of the runs nested under ``run`` down to
    ``depth`` levels (its studies or repetitions, and their trials), or None when nothing
    ran under it (a queued cell): where a cell that a dead driver left RUNNING really
    stopped. One search per parent (MLflow's filter has no ``IN`` for tags)."""
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

    exp = run.info.experiment_id
    frontier, last = [run.info.run_id], None
    for _ in range(depth):
        kids = [k for rid in frontier for k in client.search_runs(
            [exp], f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{rid}'", max_results=50_000)]
        for k in kids:
            t = max(k.info.end_time or 0, k.info.start_time or 0)
            last = t if last is None else max(last, t)
        frontier = [k.info.run_id for k in kids]
    return last


def attempt_last_record_ms(client: Any, run: Any) -> int | None:
    """:func:`last_record_ms` of a cell attempt. A continuing attempt (``scarcelab.resumes``)
    has nothing nested under it: what it ran is recorded under the study it continues, so
    its last record is the study's latest one after the attempt started (None when the
    continuation recorded nothing)."""
    study = run.data.tags.get(T.RESUMES)
    if not study:
        return last_record_ms(client, run)
    try:
        last = last_record_ms(client, client.get_run(study))
    except Exception:  # noqa: BLE001 - a deleted study: the attempt recorded nothing left
        return None
    return last if last is not None and last >= run.info.start_time else None


def result_run(runs: list[Any]) -> Any | None:
    """The FINISHED run holding a cell's results among its attempts' runs, None when none
    finished. A continuing attempt that finished (``scarcelab.resumes``) only launched the
    study it continued, which finished with it and holds the results: that study run, an
    earlier attempt of the same cell, is the one to read (the launcher itself only when no
    other attempt finished)."""
    done = [r for r in runs if r.info.status == "FINISHED"]
    own = [r for r in done if not r.data.tags.get(T.RESUMES)]
    return (own or done or [None])[0]


CELL_WALL = "sweep/cell_wall_s"  # per attempt, on its cell run
CELL_CPU = "sweep/cell_cpu_s"
CELL_RSS = "sweep/cell_max_rss_mb"
#: on an attempt's run that a later attempt continues: where the attempt itself ended (epoch
#: seconds); the continuation re-opens the run and moves its end to its own
CELL_END = "sweep/cell_end_s"
INVOCATION_WALL = "sweep/invocation_wall_s"  # on the sweep run, step = invocation
#: what a dependency option receives, by option; every other option gets a model URI
RESOLVE = {"hparams_from": "{run_id}"}
RESOLVE_DEFAULT = "runs:/{run_id}/model"
LOG_TAIL = 200_000  # bytes of a cell's output kept as its run's artifact
# The module every cell runs: the console script's command line, as ``python -m`` (no PATH
# needed), after its share of a packed GPU is applied (tracking/sweep/cell.py).
CELL_MODULE = "scarcelab.tracking.sweep.cell"
# Environment a cell takes from the driver when set there: where the data and the shared
# search state live. Credentials are NOT forwarded to a remote cluster (they would travel
# as task arguments): set them in the workers' own environment (docs/sweeps.md).
FORWARD = ("SCARCELAB_DATA", "MLFLOW_S3_ENDPOINT_URL", "OMP_NUM_THREADS")
FORWARD_EMBEDDED = ("OPTUNA_STORAGE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                    "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
                    "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")


@dataclass
class CellOutcome:
    cell: Cell
    status: str  # FINISHED | FAILED | SKIPPED
    run_id: str | None = None
    attempts: int = 0
    seconds: float = 0.0
    error: str = ""


@dataclass
class SweepResult:
    name: str
    sweep_run_id: str
    outcomes: list[CellOutcome] = field(default_factory=list)
    report_logged: bool = False
    wall_s: float = 0.0

    def count(self, status: str) -> int:
        return sum(o.status == status for o in self.outcomes)


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _fmt_s(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the cell gets SIGTERM when the Ray worker that started it dies, so a killed
    sweep leaves no training process behind to finish (and duplicate) its cell."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001, S110 - not Linux: the cell just outlives its worker
        pass


def machine() -> dict[str, str]:
    """What a results page says about the machine a cell ran on: CPU model, cores, RAM,
    GPUs (``none`` without ``nvidia-smi``). Read from /proc and ``nvidia-smi`` rather than
    torch, so a Ray worker does not import torch to describe itself."""
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = ""
    try:
        ram = f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.1f}"
    except (ValueError, OSError, AttributeError):
        pass
    gpu = "none"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=20, check=False)
        names = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
        if out.returncode == 0 and names:
            gpu = "; ".join(names)
    except (OSError, subprocess.SubprocessError):
        pass
    return {"host": socket.gethostname(), "cpu": cpu, "cores": str(os.cpu_count() or ""),
            "ram_gb": ram, "gpu": gpu}


def git_commit(cwd: str | None = None) -> str:
    """The commit of the checkout the cells run from ('' outside a git checkout), with
    ``+dirty`` when tracked files differ from it: a page names what produced its numbers."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, cwd=cwd, check=False)
        if head.returncode != 0:
            return ""
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=20, cwd=cwd,
                               check=False)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return ""


def run_cell_process(argv: list[str], env: dict[str, str], cwd: str | None,
                     python: str) -> dict[str, Any]:
    """Run one cell as ``python -m scarcelab.entrypoints.cli <argv>``; returns its exit code,
    wall time, CPU time (user + system of the cell process and the children it waited for,
    from ``wait4``'s rusage: what the cell cost, whatever else shares the machine), peak
    RSS, output (the last ``LOG_TAIL`` bytes) and the machine. Runs inside a Ray task."""
    t0 = time.time()
    full_env = {**os.environ, **env}
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen([python, "-m", CELL_MODULE, *argv], env=full_env, cwd=cwd,
                                stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0, os.SEEK_END)
        size = out.tell()
        out.seek(max(0, size - LOG_TAIL))
        text = out.read().decode("utf-8", "replace")
    return {"rc": proc.returncode, "seconds": time.time() - t0, "output": text,
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "max_rss_mb": usage.ru_maxrss / 1024.0, "machine": {**machine(), **_ray_node()}}


def _ray_node() -> dict[str, str]:
    """The Ray node a cell ran on (``ray_node``: its id), when it ran in a Ray task: on a
    cluster of nodes on one host, the host alone does not say which node."""
    try:
        import ray

        if ray.is_initialized():
            return {"ray_node": str(ray.get_runtime_context().get_node_id())}
    except Exception:  # noqa: BLE001, S110 - not in a Ray worker
        pass
    return {}


@dataclass(frozen=True)
class Identity:
    """What ``--run-name``, ``--tags`` and ``--description`` give the sweep run (the cells'
    runs keep their own names: they are the studies)."""

    run_name: str = ""
    tags: dict[str, str] = field(default_factory=dict)
    description: str = ""


class Driver:
    """One invocation of a sweep. ``echo`` receives the progress lines."""

    def __init__(self, spec: SweepSpec, address: str | None = None, jobs: int | None = None,
                 retries: int | None = None, echo: Callable[[str], None] = print,
                 cwd: str | None = None, python: str = sys.executable,
                 command: str = "", identity: Identity | None = None) -> None:
        import mlflow
        from mlflow.tracking import MlflowClient

        self.spec = spec
        self.identity = identity or Identity()
        self.address = address
        self.jobs = jobs
        self.retries = spec.retries if retries is None else retries
        self.echo = echo
        self.cwd = cwd or str(Path(__file__).resolve().parents[2])
        self.python = python
        self.uri = mlflow.get_tracking_uri()
        hide_mlflow_links(self.uri)  # MLflow's run links would show a password in it
        self.client = MlflowClient()
        self.owner = _owner()
        # what a results page quotes as "the command that ran the suite"
        self.command = command or "scarcelab sweep " + " ".join(
            [spec.path or "<spec>"] + ([f"--{spec.scale}"] if spec.scale != "reference"
                                       else []))
        self.commit = git_commit(self.cwd)
        self.invocation = 0
        self.lock: Any = None
        self.share: dict[str, str] = {}  # each cell's share of the machine (its env)
        if NAME_FORBIDDEN.search(spec.name):  # it is quoted in MLflow search filters
            raise SpecError(f"{spec.where('name')}: the sweep name {spec.name!r} holds a "
                            "quote, backtick, backslash or control character; rename it")
        for k in spec.env:  # a spec built in code is held to the parser's list too
            why = env_refusal(k)
            if why:
                raise SpecError(f"{spec.where('env')}: env: {why}")

    # -- the record -----------------------------------------------------------------------
    def _experiment_id(self) -> str:
        exp = self.client.get_experiment_by_name(self.spec.experiment)
        if exp is not None:
            return str(exp.experiment_id)
        try:
            return str(self.client.create_experiment(self.spec.experiment))
        except Exception:  # noqa: BLE001 - created concurrently: use it
            exp = self.client.get_experiment_by_name(self.spec.experiment)
            if exp is None:
                raise
            return str(exp.experiment_id)

    def _open_sweep_run(self, exp: str) -> str:
        from mlflow.utils.mlflow_tags import MLFLOW_GIT_COMMIT, MLFLOW_RUN_NAME

        runs = self.client.search_runs(
            [exp], f"tags.`{T.ROLE}` = 'sweep' and tags.`{T.SWEEP}` = '{self.spec.name}'",
            order_by=["attributes.start_time DESC"], max_results=1)
        if runs:  # RUNNING or not, its driver is gone: this one holds the sweep's lock
            run = runs[0]
            rid = run.info.run_id
            self.client.update_run(rid, status="RUNNING")
        else:
            name = self.identity.run_name or f"sweep-{self.spec.name}"
            rid = self.client.create_run(
                exp, run_name=name,
                tags={T.ROLE: "sweep", T.SWEEP: self.spec.name,
                      MLFLOW_RUN_NAME: name}).info.run_id
        self._apply_identity(rid)
        self.client.set_tag(rid, T.SWEEP_DRIVER, self.owner)
        self.client.set_tag(rid, T.SWEEP_SPEC_DIGEST, self.spec.digest)
        from mlflow.entities import RunTag

        prev = self.client.get_run(rid).data.tags.get(T.SWEEP_INVOCATIONS, "0")
        self.invocation = (int(prev) if prev.isdigit() else 0) + 1
        self.client.log_batch(rid, tags=[
            RunTag(T.SWEEP_INVOCATIONS, str(self.invocation)),
            RunTag(T.SWEEP_SCALE, self.spec.scale), RunTag(T.SWEEP_COMMAND, self.command[:5000]),
            RunTag(T.SWEEP_SPEC_PATH, self.spec.path),
            *([RunTag(MLFLOW_GIT_COMMIT, self.commit)] if self.commit else [])])
        self.client.log_text(rid, self.spec.text, f"sweep/spec-{self.spec.digest}.yaml")
        self.client.log_text(rid, "\n".join(f"{c.id}\t{c.label}" for c in self.spec.cells),
                             f"sweep/cells-{self.spec.digest}.tsv")
        return rid

    def _apply_identity(self, rid: str) -> None:
        """The user's name, tags and description on the sweep run; a resumed sweep takes
        the ones given this time (the run is found by its role and sweep tags, never by
        its name)."""
        from mlflow.entities import RunTag
        from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME, MLFLOW_RUN_NOTE

        ident = self.identity
        tags = dict(ident.tags)
        if ident.run_name:
            tags[MLFLOW_RUN_NAME] = ident.run_name
        if ident.description:
            tags[MLFLOW_RUN_NOTE] = ident.description
        if tags:
            self.client.log_batch(rid, tags=[RunTag(k, v) for k, v in tags.items()])

    def _existing(self, exp: str) -> dict[str, list[Any]]:
        runs = self.client.search_runs(
            [exp], f"tags.`{T.SWEEP}` = '{self.spec.name}'", max_results=50_000)
        by_cell: dict[str, list[Any]] = {}
        for r in runs:
            cid = r.data.tags.get(T.CELL)
            if cid:
                by_cell.setdefault(cid, []).append(r)
        return by_cell

    def _close_stale(self, runs: list[Any]) -> None:
        """RUNNING cell runs of another driver: this one holds the sweep's lock, so that
        driver is dead (on any host) and its cells died with its Ray job; close them.

        A run closed now would end now, and the hours the sweep lay dead would count as
        its wall time (a results page sums the attempts' intervals): it ends at its last
        record instead (a continuing attempt's are under the study it continues), or at
        its start when it was only queued."""
        for r in runs:
            if r.info.status != "RUNNING":
                continue
            drv = r.data.tags.get(T.SWEEP_DRIVER, "")
            if drv != self.owner:
                self.client.set_tag(r.info.run_id, T.ERROR,
                                    f"the sweep driver {drv} {STALE_MARK}; "
                                    "the cell was run again by the next sweep run")
                end = attempt_last_record_ms(self.client, r)
                self.client.set_terminated(r.info.run_id, "FAILED",
                                           end_time=end or r.info.start_time)

    def _continued_study(self, cell: Cell, runs: list[Any]) -> str | None:
        """The study run the cell's next attempt continues, None when it starts afresh:
        the entry point must declare a continuation, and the newest attempt that left a
        study record names it — its own run when the entry point tagged it a study, or the
        study a dead continuing attempt was continuing. A continuation that failed by
        itself (not with a dead or interrupted driver) is not tried again: what made it
        fail would again, so the cell starts afresh. ``runs`` are read after
        :meth:`_close_stale`, so a RUNNING run here is not a dead one (none is continued).
        Before the study run is handed on, where it ended is logged on it
        (``CELL_END``, once: the first continuation's reading is the attempt's own end)."""
        if not runs or entry_continuation(cell.entry) is None:
            return None
        by_id = {r.info.run_id: r for r in runs}

        def number(r: Any) -> tuple[int, int]:
            n = r.data.tags.get(T.SWEEP_ATTEMPT, "")
            return (int(n) if n.isdigit() else 0, r.info.start_time or 0)

        for r in sorted(runs, key=number, reverse=True):
            tags = r.data.tags
            err = tags.get(T.ERROR, "")
            if tags.get(T.RESUMES) and STALE_MARK not in err and INTERRUPT_MARK not in err \
                    and r.info.status != "RUNNING":
                return None  # that continuation failed on its own
            target = tags.get(T.RESUMES) or (r.info.run_id if tags.get(T.ROLE) == "study"
                                             else None)
            if target is None or target not in by_id:  # a study of this very cell only
                continue
            study = self.client.get_run(target)  # its status after _close_stale
            if study.data.tags.get(T.ROLE) != "study" or study.info.status in (
                    "RUNNING", "SCHEDULED", "FINISHED"):
                continue
            if CELL_END not in study.data.metrics:
                from mlflow.entities import Metric

                end = study.info.end_time or study.info.start_time
                self.client.log_batch(target, metrics=[
                    Metric(CELL_END, end / 1000.0, int(time.time() * 1000), 0)])
            return target
        return None

    def _new_cell_run(self, exp: str, sweep_run: str, cell: Cell, attempt: int,
                      resolved: dict[str, str] | None = None,
                      resumes: str | None = None) -> str:
        from mlflow.utils.mlflow_tags import (
            MLFLOW_GIT_COMMIT,
            MLFLOW_PARENT_RUN_ID,
            MLFLOW_RUN_NAME,
        )

        from scarcelab.tracking.run_views import cell_run_name

        name = cell_run_name(cell.entry, cell.options)
        tags = {T.SWEEP: self.spec.name, T.CELL: cell.id, T.CELL_LABEL: cell.label,
                T.SWEEP_DRIVER: self.owner, T.SWEEP_ATTEMPT: str(attempt),
                MLFLOW_PARENT_RUN_ID: sweep_run, MLFLOW_RUN_NAME: name}
        if self.commit:  # the study's tracker keeps a commit already there
            tags[MLFLOW_GIT_COMMIT] = self.commit
        if resolved:
            opts = dict(cell.options)
            tags[T.SWEEP_REFS] = json.dumps({k: [opts[k], v] for k, v in resolved.items()})
        if resumes:  # the entry point links it too, once it starts; a continuation that
            # dies before then must still name what it was continuing
            tags[T.RESUMES] = resumes
        return str(self.client.create_run(exp, run_name=name, tags=tags).info.run_id)

    def _cell_env(self, run_id: str, embedded: bool) -> dict[str, str]:
        env = {**self.share, **self.spec.env, "MLFLOW_RUN_ID": run_id,
               "MLFLOW_TRACKING_URI": self.uri, "PYTHONUNBUFFERED": "1"}
        names = FORWARD + (FORWARD_EMBEDDED if embedded else ())
        env.update({k: os.environ[k] for k in names if k in os.environ})
        if embedded and "PYTHONPATH" in os.environ:
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        return env

    # -- running --------------------------------------------------------------------------
    def run(self) -> SweepResult:
        """Take the sweep's lock (tracking/sweep/lock.py: exactly one driver per sweep, on
        one machine or many), run what is left, release the lock."""
        from scarcelab.tracking.sweep.lock import SweepLock

        exp = self._experiment_id()
        self.lock = SweepLock(self.client, exp, self.spec.name)
        self.lock.acquire()
        try:
            return self._run(exp)
        finally:
            self.lock.release()

    def _run(self, exp: str) -> SweepResult:
        t0 = time.time()
        sweep_run = self._open_sweep_run(exp)
        result = SweepResult(self.spec.name, sweep_run)
        existing = self._existing(exp)
        todo: list[Cell] = []
        finished: dict[str, str] = {}  # cell id -> its FINISHED run (dependencies read it)
        resume: dict[str, str] = {}  # cell id -> the study run its next attempt continues
        for cell in self.spec.cells:
            runs = existing.get(cell.id, [])
            done = result_run(runs)
            if done is not None:
                result.outcomes.append(CellOutcome(cell, "SKIPPED", done.info.run_id))
                finished[cell.id] = done.info.run_id
                continue
            self._close_stale(runs)
            study = self._continued_study(cell, runs)
            if study:
                resume[cell.id] = study
            todo.append(cell)
        self.echo(f"[sweep {self.spec.name}] {len(self.spec.cells)} cells: "
                  f"{len(self.spec.cells) - len(todo)} already finished, {len(todo)} to run "
                  + (f"({len(resume)} continuing an earlier attempt's study) " if resume
                     else "")
                  + f"(experiment {self.spec.experiment!r}, sweep run {sweep_run})")
        status = "FINISHED"
        interrupted = True  # until the schedule returns
        try:
            if todo:
                self._schedule(exp, sweep_run, todo, result,
                               {c.id: len(existing.get(c.id, [])) for c in todo}, finished,
                               resume)
        except BaseException:
            status = "FAILED"
            raise
        else:
            interrupted = False
        finally:
            result.wall_s = time.time() - t0
            failed = result.count("FAILED")
            if failed:
                status = "FAILED"
            self._finish(sweep_run, result, status, report=not interrupted)
        return result

    def _schedule(self, exp: str, sweep_run: str, todo: list[Cell], result: SweepResult,
                  earlier: dict[str, int], finished: dict[str, str],
                  resume: dict[str, str] | None = None) -> None:
        """Run ``todo`` to its end on a pool; ``earlier`` counts each cell's runs over
        re-runs (it grows here), ``finished`` holds the dependencies already done,
        ``resume`` the study run a cell's first attempt here continues."""
        pool = self._pool()
        self._apply_share(pool, sweep_run)
        from scarcelab.tracking.sweep.gpu import Mps, start_mps

        mps = Mps()
        if self.spec.mps:
            if float(getattr(pool, "gpus", 0.0)) > 0:
                mps = start_mps(self._say, embedded=not self.address)
            else:
                self._say("mps: true, but the cells take no GPU (gpus_per_cell resolved to "
                          "0): CUDA MPS is not started")
        try:
            _Schedule(self, pool, exp, sweep_run, todo, result, earlier, finished,
                      resume).run()
        finally:
            mps.stop(self._say)

    def _say(self, line: str) -> None:
        self.echo(f"[sweep {self.spec.name}] {line}")

    def _apply_share(self, pool: Any, sweep_run: str) -> None:
        """Each cell's share of the machine, from the pool's resolved resources: its
        environment (``self.share``), one progress line, and the sweep run's tag."""
        from scarcelab.tracking.sweep.gpu import share_env, slots_per_gpu, threads

        # RayPool's resolved shares; a pool that does not say (a test's stand-in) is
        # taken to hold what the spec asks, "auto" being no GPU
        cpus = float(getattr(pool, "cpus", self.spec.cpus_per_cell))
        gpus = float(getattr(pool, "gpus", 0.0 if self.spec.gpus_per_cell == "auto"
                             else self.spec.gpus_per_cell))
        fraction = self.spec.memory_fraction(gpus)
        self.share = share_env(cpus, fraction, self.spec.env, {
            k: os.environ[k] for k in FORWARD if k in os.environ})
        omp = self.share.get("OMP_NUM_THREADS") or self.spec.env.get("OMP_NUM_THREADS") \
            or os.environ.get("OMP_NUM_THREADS") or str(threads(cpus))
        info = {"cpus_per_cell": cpus, "gpus_per_cell": gpus,
                "cells_per_gpu": slots_per_gpu(gpus) if gpus else 0,
                "gpu_memory_fraction": fraction, "omp_num_threads": omp,
                "mps": self.spec.mps, "slots": pool.slots}
        gpu = (f"{gpus:g} GPU ({info['cells_per_gpu']} per GPU"
               + (f", memory capped at {fraction:g} of a GPU" if fraction else "") + ")"
               if gpus else "no GPU")
        self._say(f"each cell: {cpus:g} CPU, {gpu}, OMP_NUM_THREADS={omp}; "
                  f"{pool.slots} at once")
        try:
            self.client.set_tag(sweep_run, T.SWEEP_RESOURCES, json.dumps(info))
        except Exception as e:  # noqa: BLE001 - a description, not the record
            self._say(f"could not tag the sweep run with its resources: {e}")

    def _pool(self) -> Any:
        """The Ray pool the cells run on; a cell no node can hold is the spec's error, at
        the line that asks for too much, before anything is recorded for a cell."""
        from scarcelab.tracking.sweep.pool import RayPool, Unplaceable

        try:
            return RayPool(self.address, self.jobs, self.spec.cpus_per_cell,
                           self.spec.gpus_per_cell)
        except Unplaceable as e:
            key = "gpus_per_cell" if e.resource == "GPU" else "cpus_per_cell"
            raise SpecError(f"{self.spec.where(key)}: {e}; lower {key} or add a node that "
                            "has as much") from None

    def _log_cost(self, rid: str, out: dict[str, Any]) -> None:
        """The attempt's wall and CPU time and peak memory, and the machine it ran on, on
        its run: a results page sums them over the suite (failed attempts included: they
        were spent too)."""
        from mlflow.entities import Metric, RunTag

        ts = int(time.time() * 1000)
        metrics = [Metric(CELL_WALL, float(out["seconds"]), ts, 0)]
        if "cpu_s" in out:
            metrics += [Metric(CELL_CPU, float(out["cpu_s"]), ts, 0),
                        Metric(CELL_RSS, float(out["max_rss_mb"]), ts, 0)]
        tags = [RunTag(f"{T.MACHINE}.{k}", v) for k, v in (out.get("machine") or {}).items()]
        try:
            self.client.log_batch(rid, metrics=metrics, tags=tags)
        except Exception as e:  # noqa: BLE001 - cost is a convenience, not the record
            self.echo(f"[sweep {self.spec.name}] could not log the cost of run {rid}: {e}")

    def _status(self, rid: str) -> str:
        return str(self.client.get_run(rid).info.status)

    def _log_output(self, rid: str, text: str) -> None:
        try:
            self.client.log_text(rid, text, "sweep/cell.log")
        except Exception as e:  # noqa: BLE001 - the output is a convenience, not the record
            self.echo(f"[sweep {self.spec.name}] could not log the output of run {rid}: {e}")

    def _fail(self, rid: str, err: str) -> None:
        run = self.client.get_run(rid)
        self.client.set_tag(rid, T.ERROR, err[:5000])
        if run.info.status in ("RUNNING", "SCHEDULED"):
            self.client.set_terminated(rid, "FAILED")

    def _finish(self, sweep_run: str, result: SweepResult, status: str,
                report: bool = True) -> None:
        c = self.client
        c.set_tag(sweep_run, T.SWEEP_CELLS, str(len(self.spec.cells)))
        from mlflow.entities import Metric

        c.log_batch(sweep_run, metrics=[Metric(INVOCATION_WALL, result.wall_s,
                                               int(time.time() * 1000), self.invocation)])
        c.set_tag(sweep_run, T.SWEEP_FAILED, str(result.count("FAILED")))
        if report and result.count("FINISHED") + result.count("SKIPPED"):
            # not when interrupted: the grid is not done, and a supervisor's SIGKILL may
            # follow its SIGTERM within seconds
            try:
                result.report_logged = self._log_report(sweep_run)
            except Exception as e:  # noqa: BLE001 - the cells' runs are the record
                self.echo(f"[sweep {self.spec.name}] warning: the grid report could not be "
                          f"built: {type(e).__name__}: {e}")
        c.set_terminated(sweep_run, status)
        self.echo(f"[sweep {self.spec.name}] {status}: {result.count('FINISHED')} run, "
                  f"{result.count('SKIPPED')} already finished, {result.count('FAILED')} "
                  f"failed, in {_fmt_s(result.wall_s)} — sweep run {sweep_run}")

    def _log_report(self, sweep_run: str) -> bool:
        """The grid's report under ``report/`` on the sweep run: the views registered for
        the entry points of its cells (tracking/query/registry.py, ``entries``) — the
        leaderboard and ranks of every grid as one page of sections, and a table file of
        its own for the source study of the cells it has (contamination: Table A1; tune:
        Table 3; probe / segment: the transfer view). Each part is built on its own, so one
        that cannot be built (logged as a warning) does not lose the others. Returns
        whether any part was logged."""
        import warnings

        from scarcelab.tracking.query import load
        from scarcelab.tracking.query.registry import sweep_views

        t = load(self.spec.experiment)
        chosen = sweep_views({c.entry for c in self.spec.cells})
        pages = [v for v in chosen if v.section]
        parts: list[tuple[str, Callable[[str, Any], None]]] = []
        if pages:  # the sections page is named by its first view (the leaderboard)
            parts.append((pages[0].name, self._report_views))
        parts += [(v.name, lambda run, t, v=v: self._report_table(run, t, v))
                  for v in chosen if not v.section]
        logged = False
        for what, build in parts:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    build(sweep_run, t)
                logged = True
            except Exception as e:  # noqa: BLE001 - the cells' runs are the record
                self.echo(f"[sweep {self.spec.name}] warning: the report's {what} part could "
                          f"not be built: {type(e).__name__}: {e}")
        return logged

    def _report_views(self, sweep_run: str, t: Any) -> None:
        """The sections page (report.html, a CSV / markdown per view, the PNG figures) of
        the section views this grid reports whose runs exist."""
        from scarcelab.tracking.query import sections
        from scarcelab.tracking.query.registry import sweep_views
        from scarcelab.tracking.query.render import report_meta, write_report

        pages = [v for v in sweep_views({c.entry for c in self.spec.cells}) if v.section]
        runs = t.runs
        if "protocol" in runs and "role" in runs:
            # tune studies log their test score per retrain, not per study: their table is
            # Table 3; the leaderboard and ranks are of the other studies
            tune = set(runs.loc[(runs["role"] == "study") & (runs["protocol"] == "tune"),
                                "run_id"])
            if tune:
                keep = ~runs["run_id"].isin(tune)
                if "parent_run_id" in runs:
                    keep &= ~runs["parent_run_id"].isin(tune)
                t = t.with_runs(runs[keep])
                if not (t.runs["role"].isin(["study", "al"])).any():
                    self.echo(f"[sweep {self.spec.name}] the grid's studies are tune studies: "
                              "their leaderboard is report/table3.md")
                    return
        which = [v.name for v in pages if not v.needs or len(t.role(v.needs))]
        secs = sections(t, which)
        with tempfile.TemporaryDirectory() as d:
            paths = write_report(secs, d, title=f"sweep {self.spec.name}",
                                 meta=report_meta([self.spec.experiment], self.uri))
            for p in paths.values():
                self.client.log_artifact(sweep_run, str(p), "report")

    def _report_table(self, sweep_run: str, t: Any, view: Any) -> None:
        """A view with a file pair of its own: ``report/<name>.md`` (its markdown, under
        ``# <heading>: <sweep>`` when it has a heading) and ``report/<name>.csv``."""
        from scarcelab.tracking.query.registry import SweepContext
        from scarcelab.tracking.query.render import to_markdown

        ctx = SweepContext(self.spec.name, self.spec.experiment, self._sweep_refs)
        table = view.for_sweep(t, ctx)
        text = (view.markdown or to_markdown)(table)
        if view.heading:
            text = f"# {view.heading}: {self.spec.name}\n\n{text}\n"
        self.client.log_text(sweep_run, text, f"report/{view.name}.md")
        self.client.log_text(sweep_run, table.to_csv(index=False), f"report/{view.name}.csv")

    def _sweep_refs(self) -> list[str]:
        """The REFS tags of this sweep's cells (what each ``@reference`` resolved to)."""
        exp = self.client.get_experiment_by_name(self.spec.experiment)
        assert exp is not None  # the experiment of the sweep run being reported
        return [r.data.tags.get(T.SWEEP_REFS, "") for r in self.client.search_runs(
            [exp.experiment_id], f"tags.`{T.SWEEP}` = '{self.spec.name}'",
            max_results=50_000)]

class _Schedule:
    """One invocation's scheduling loop. Its state (what started, how often, what is done
    or failed for good, which dependents still wait) is shared by every step, so it lives
    here rather than in closures of one long method; the record and the progress lines
    go through the driver."""

    def __init__(self, drv: Driver, pool: Any, exp: str, sweep_run: str, todo: list[Cell],
                 result: SweepResult, earlier: dict[str, int],
                 finished: dict[str, str], resume: dict[str, str] | None = None) -> None:
        self.drv, self.pool, self.exp, self.sweep_run = drv, pool, exp, sweep_run
        self.resume = dict(resume or {})  # cell id -> study run its next attempt continues
        self.continuing: dict[str, str] = {}  # cell id -> the study its running attempt continues
        self.todo, self.result, self.earlier = todo, result, earlier
        self.embedded = not drv.address
        self.slots = pool.slots
        self.started: dict[str, tuple[str, float]] = {}  # cell id -> (run id, start time)
        self.attempts: dict[str, int] = {}  # this invocation's, against `retries`
        self.cells = {c.id: c for c in todo}
        self.done_runs = dict(finished)  # cell id -> FINISHED run id, grows as cells end
        self.failed: dict[str, str] = {}  # cell id -> error, for cells failed for good
        self.waiting = [c for c in todo if c.refs]  # dependents not yet submitted
        self.durations: list[float] = []  # of the attempts that finished: the ETA's mean
        self.n_total = len(drv.spec.cells)

    def run(self) -> None:
        """Start what has no dependency, then collect each ended cell until the pool is
        empty. Interrupted (Ctrl-C, SIGTERM), it closes what was running first, so a
        re-run does not take those cells for a dead driver's."""
        for cell in self.todo:
            if not cell.refs:
                self.submit(cell)
        self.release()
        try:
            while len(self.pool):
                self.collect()
        except BaseException as e:
            self.close_started(e)
            raise
        self.fail_left_waiting()

    def submit(self, cell: Cell) -> None:
        """A new run for the cell's next attempt, handed to the cell it starts with its
        dependencies resolved to their FINISHED runs."""
        drv = self.drv
        if drv.lock is not None:
            drv.lock.check()  # another driver took the sweep over: start nothing
        resolved = {k: RESOLVE.get(k, RESOLVE_DEFAULT).format(run_id=self.done_runs[dep])
                    for k, dep in cell.refs}
        self.attempts[cell.id] = self.attempts.get(cell.id, 0) + 1
        self.earlier[cell.id] = self.earlier.get(cell.id, 0) + 1  # the run's number over re-runs
        # only the first attempt continues: one that failed is retried from the start
        study = self.resume.pop(cell.id, None)
        cont = entry_continuation(cell.entry) if study else None
        rid = drv._new_cell_run(self.exp, self.sweep_run, cell, self.earlier[cell.id],
                                resolved, resumes=study if cont else None)
        self.started[cell.id] = (rid, time.time())
        if study and cont:
            argv = self.continue_argv(cell, cont, study, resolved)
            self.continuing[cell.id] = study
            drv.echo(f"[sweep {drv.spec.name}] {cell.label}: resuming the study of an "
                     f"earlier attempt, run {study} (attempt {self.earlier[cell.id]}: "
                     f"{' '.join(argv)})")
        else:
            argv = cell.argv(resolved)
            self.continuing.pop(cell.id, None)
        self.pool.submit(cell.id, run_cell_process, argv,
                         drv._cell_env(rid, self.embedded), drv.cwd if self.embedded else None,
                         drv.python)

    @staticmethod
    def continue_argv(cell: Cell, cont: Continuation, study: str,
                      resolved: dict[str, str]) -> list[str]:
        """The continuing attempt's command: the declared option naming the study run,
        and the cell's options the declaration carries (dependencies resolved)."""
        opts = {k: resolved.get(k, v) for k, v in cell.options}
        return cont.argv(cell.entry, study, opts)

    def release(self) -> None:
        """Submit the dependents whose dependencies all finished; record FAILED those
        with a dependency that failed for good (and, in turn, their dependents)."""
        drv = self.drv
        progress = True
        while progress:
            progress = False
            for cell in list(self.waiting):
                bad = [(k, d) for k, d in cell.refs if d in self.failed]
                if bad:
                    k, d = bad[0]
                    err = (f"dependency {k}={dict(cell.options)[k]} (cell "
                           f"{drv.spec.cell(d).label!r}) failed: {self.failed[d]}")[:2000]
                    self.earlier[cell.id] = self.earlier.get(cell.id, 0) + 1
                    rid = drv._new_cell_run(self.exp, self.sweep_run, cell,
                                            self.earlier[cell.id])
                    drv._fail(rid, err)
                    self.result.outcomes.append(CellOutcome(cell, "FAILED", rid, 0, 0.0, err))
                    self.failed[cell.id] = err
                    drv.echo(f"[sweep {drv.spec.name}] {cell.label}: not run, {err}")
                elif all(d in self.done_runs for _, d in cell.refs):
                    self.submit(cell)
                else:
                    continue
                self.waiting.remove(cell)
                progress = True

    def collect(self) -> None:
        """The next cell to end: its output and cost on its run, its outcome, the
        dependents it frees, a progress line."""
        drv = self.drv
        cid, out, exc = self.pool.next_done()
        key = str(cid)
        cell, (rid, t_start), attempt = self.cells[key], self.started[key], self.attempts[key]
        if exc is not None:  # the task itself broke (its worker or node died)
            out = {"rc": -1, "seconds": time.time() - t_start,
                   "output": f"the Ray task failed: {type(exc).__name__}: {exc}"}
        # a cell that ended its run FINISHED and then lost its node is done: run
        # again, it would be there twice
        study = self.continuing.pop(key, None)
        # a continuing attempt recorded into the study it continued: that run says
        # whether the cell is done, and the attempt's own run (the launcher) ends with it
        ok = (out["rc"] == 0 or exc is not None) and drv._status(study or rid) == "FINISHED"
        drv._log_output(rid, out["output"])
        drv._log_cost(rid, out)
        if study and ok:
            if drv._status(rid) in ("RUNNING", "SCHEDULED"):
                drv.client.set_terminated(rid, "FINISHED")
            rid = study
        verb = self.ended(cell, rid, attempt, out, ok)
        self.release()
        self.progress(cell, verb, out["seconds"])

    def ended(self, cell: Cell, rid: str, attempt: int, out: dict[str, Any],
              ok: bool) -> str:
        """Record how the attempt ended (retrying a failure while attempts are left);
        returns what the progress line says of it."""
        if ok:
            self.durations.append(out["seconds"])
            self.result.outcomes.append(CellOutcome(cell, "FINISHED", rid, attempt,
                                                    out["seconds"]))
            self.done_runs[cell.id] = rid
            return "finished"
        err = _last_error(out["output"], out["rc"])
        self.drv._fail(rid, err)
        if attempt <= self.drv.retries:
            verb = f"failed (attempt {attempt}), retrying: {err}"
            self.submit(cell)
            return verb
        self.result.outcomes.append(CellOutcome(cell, "FAILED", rid, attempt,
                                                out["seconds"], err))
        self.failed[cell.id] = err
        return f"FAILED after {attempt} attempt(s): {err}"

    def progress(self, cell: Cell, verb: str, seconds: float) -> None:
        """The progress line (counts, what waits, an ETA from the mean finished attempt
        over the slots) and the done / failed counts as the sweep run's metrics."""
        drv, result, pool, waiting = self.drv, self.result, self.pool, self.waiting
        done = result.count("FINISHED") + result.count("SKIPPED")
        n_failed = result.count("FAILED")
        running = pool.running
        queued = len(pool) - running
        eta = ""
        if self.durations and len(pool):
            mean = sum(self.durations) / len(self.durations)
            left = mean * (queued + len(waiting) + running / 2) / max(1, self.slots)
            eta = f" · ETA {_fmt_s(left)}"
        wait = f" · {len(waiting)} waiting on dependencies" if waiting else ""
        drv.echo(f"[sweep {drv.spec.name}] {cell.label}: {verb} "
                 f"({seconds:.0f} s) — {done}/{self.n_total} done · {running} running · "
                 f"{n_failed} failed · {queued} queued{wait}{eta}")
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        drv.client.log_batch(self.sweep_run, metrics=[
            Metric("sweep/cells_done", done, ts, done + n_failed),
            Metric("sweep/cells_failed", n_failed, ts, done + n_failed)])

    def close_started(self, e: BaseException) -> None:
        """Interrupted: fail the runs of the cells still running or queued, saying so."""
        ended = {o.cell.id for o in self.result.outcomes}
        for cid, (rid, _) in self.started.items():
            if cid not in ended and self.drv._status(rid) in ("RUNNING", "SCHEDULED"):
                self.drv._fail(rid, f"{INTERRUPT_MARK} ({type(e).__name__}) "
                               "while this cell ran; re-run the sweep to continue")

    def fail_left_waiting(self) -> None:
        """Dependents still waiting once nothing runs: cannot happen with an acyclic spec;
        never lose a cell."""
        for cell in self.waiting:
            err = "its dependencies never finished"
            self.earlier[cell.id] = self.earlier.get(cell.id, 0) + 1
            rid = self.drv._new_cell_run(self.exp, self.sweep_run, cell,
                                         self.earlier[cell.id])
            self.drv._fail(rid, err)
            self.result.outcomes.append(CellOutcome(cell, "FAILED", rid, 0, 0.0, err))


def _last_error(output: str, rc: int) -> str:
    lines = [ln.strip() for ln in output.strip().splitlines() if ln.strip()]
    tail = next((ln for ln in reversed(lines) if ln.startswith(("Error", "error"))
                 or "Error:" in ln), lines[-1] if lines else "")
    return f"exit {rc}: {tail}"[:500]


def _check_uri(uri: str) -> None:
    parts = urlsplit(uri)
    if parts.password:
        raise ValueError("the tracking URI holds a password: set MLFLOW_TRACKING_USERNAME/"
                         "MLFLOW_TRACKING_PASSWORD in the workers' environment instead of "
                         "putting it in the URI (a sweep forwards the URI to every cell)")


def run_sweep(spec: SweepSpec, address: str | None = None, jobs: int | None = None,
              retries: int | None = None, echo: Callable[[str], None] = print,
              cwd: str | None = None, command: str = "",
              identity: Identity | None = None) -> SweepResult:
    """Run (or continue) a sweep; see the module docstring."""
    drv = Driver(spec, address=address, jobs=jobs, retries=retries, echo=echo, cwd=cwd,
                 command=command, identity=identity)
    _check_uri(drv.uri)
    return drv.run()
