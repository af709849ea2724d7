"""One way to fan work out: a small task pool on Ray, shared by the sweep driver and
``bench/al_sweeps.py``.

Why a wrapper at all: both callers need the same three things — start Ray embedded or
join a cluster, declare per-task resources (with ``gpus="auto"`` meaning one GPU per task
where the cluster has GPUs; a fraction such as 0.125 packs 8 tasks on one GPU), and take
results back in completion order while submitting more (retries, a queue of repetitions)
— and neither should know Ray's API by heart.
Nothing here imports MLflow: the AL bench runs where only torch is installed.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import threading
from collections.abc import Callable, Hashable, Iterator
from typing import Any

#: where an embedded cluster listens: whoever reaches Ray's ports runs code as this user
#: (Ray 2.60's default token authentication aside: older versions have none, and a user
#: may turn it off); issue 42: an embedded sweep opened 6 ports on the host's address and
#: on ``::``
LOOPBACK = "127.0.0.1"


class Unplaceable(ValueError):
    """No node of the cluster can ever run one task: Ray would queue it forever.
    ``resource`` is what is short: "CPU" or "GPU"."""

    def __init__(self, msg: str, resource: str) -> None:
        super().__init__(msg)
        self.resource = resource


def unplaceable(nodes: list[dict[str, Any]], cpus: float, gpus: float) -> str | None:
    """Why a task of ``cpus`` CPUs and ``gpus`` GPUs fits on no alive node of ``nodes``
    (``ray.nodes()``' records), or None when one can hold it. Ray does not refuse such a
    task: it waits for a node that never comes, silently (``cpus_per_cell: 64``
    on 2 cores hung). The check reads the nodes alive now: an autoscaling cluster whose
    bigger nodes are not up yet must start them first."""
    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive", n.get("alive", True))]
    if any(r.get("CPU", 0.0) >= cpus and r.get("GPU", 0.0) >= gpus for r in alive):
        return None
    has = ", ".join(sorted({f"{r.get('CPU', 0):g} CPU {r.get('GPU', 0):g} GPU" for r in alive})
                    ) or "no alive node"
    return (f"a cell asks for {cpus:g} CPU and {gpus:g} GPU, and no node of the Ray cluster "
            f"can hold it ({len(alive)} node(s): {has})")


def _keep_python_sigterm(handler: Any) -> None:
    """Put back a Python SIGTERM handler that ``ray.init`` displaced. Ray installs its own
    (C++) handler, which runs the Python one and then aborts the process at exit (status
    134, the cleanup half done); the sweep command's handler turns SIGTERM into SystemExit
    so that the driver closes its runs and Ray's exit handler stops its processes."""
    if callable(handler) and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


@contextlib.contextmanager
def _loopback_node(ray: Any) -> Iterator[None]:
    """Let ``ray.init(_node_ip_address="127.0.0.1")`` keep that address. On Linux Ray
    replaces a loopback node address by the host's routable one
    (``ray._private.services.resolve_ip_for_localhost``, unless its
    ``ray_constants.ENABLE_RAY_CLUSTER`` is off — the switch it reads on macOS and Windows,
    where a one-machine cluster is the only kind) and then binds its gRPC servers to every
    interface; with the loopback address kept, GCS, raylet, object manager, workers and the
    runtime-env agent listen on 127.0.0.1 only (checked after start:
    :func:`check_loopback`). The flag is turned off only for the start of this process's
    own private cluster and put back after."""
    consts = getattr(getattr(ray, "_private", None), "ray_constants", None)
    old = getattr(consts, "ENABLE_RAY_CLUSTER", None)
    if consts is not None and old is not None:
        consts.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if consts is not None and old is not None:
            consts.ENABLE_RAY_CLUSTER = old


def embedded_init(ray: Any, **kw: Any) -> None:
    """``ray.init`` of a private cluster on this machine that listens on loopback only
    (no dashboard, which would open an HTTP port and an agent). Shared by the sweep's pool,
    the benches and the tests that start an embedded cluster."""
    kw.setdefault("address", "local")
    kw.setdefault("include_dashboard", False)
    kw["_node_ip_address"] = LOOPBACK
    kw["dashboard_host"] = LOOPBACK
    try:  # a killed earlier driver's agents, should its watcher have died with it
        from scarcelab.tracking.sweep.reaper import reap_orphans

        reap_orphans()
    except OSError:
        pass
    before = _children()
    with _loopback_node(ray):
        ray.init(**kw)
    _reap_with_us(_children() - before)
    check_loopback(ray)


def _children() -> set[int]:
    """This process's live children (Linux /proc; empty elsewhere)."""
    from scarcelab.tracking.sweep.reaper import children_map

    try:
        return set(children_map().get(os.getpid(), []))
    except OSError:
        return set()


#: the watchers of this process's embedded clusters; each holds the read end of a pipe
#: whose write end lives here until this process ends
_REAPERS: list[Any] = []


def _reap_with_us(roots: set[int]) -> None:
    """Start the watcher that kills the embedded cluster's processes (``roots``: what
    ``ray.init`` started, and everything below them) when this process dies, however it
    dies (tracking/sweep/reaper.py; issue 42 item 10: after a SIGKILL Ray's agents lived
    on for a minute). Not started where /proc is missing; a watcher that cannot start
    costs only that clean-up, never the sweep."""
    import subprocess
    import sys
    from pathlib import Path

    if not roots or not Path("/proc/self/stat").exists():
        return
    try:
        _REAPERS.append(subprocess.Popen(
            [sys.executable, "-I", "-S", str(Path(__file__).with_name("reaper.py")),
             ",".join(str(p) for p in sorted(roots))],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True))  # out of reach of signals to the driver's group
    except OSError:
        pass


def check_loopback(ray: Any) -> None:
    """Refuse an embedded cluster whose node address is not loopback (a Ray version that
    resolves it some other way): shut it down before anything runs on it."""
    node = ray.util.get_node_ip_address()
    try:
        ok = ipaddress.ip_address(node).is_loopback
    except ValueError:
        ok = node == "localhost"
    if not ok:
        ray.shutdown()
        raise RuntimeError(
            f"embedded Ray would listen on {node}, not on loopback ({ray.__version__}): a "
            "cluster without authentication on the network; run the sweep on a Ray cluster "
            "you secured (--address, docs/sweeps.md 'On a Ray cluster') or use a Ray "
            "version that keeps _node_ip_address=127.0.0.1 (2.60 does)")


class RayPool:
    """``submit(key, fn, *args)`` then ``next_done()`` -> ``(key, result, error)`` in the
    order tasks end; ``error`` is the exception a task raised (or None)."""

    def __init__(self, address: str | None = None, jobs: int | None = None,
                 cpus_per_task: float = 1.0, gpus_per_task: float | str = "auto") -> None:
        from scarcelab.extras import need

        ray = need("ray", "scarcelab sweep (cells as Ray tasks)")
        self._ray = ray
        if not address and not ray.is_initialized() and not jobs and \
                float(cpus_per_task) > (os.cpu_count() or 1):  # known before Ray starts
            raise Unplaceable(f"a cell asks for {float(cpus_per_task):g} CPU and this machine "
                              f"has {os.cpu_count()} (embedded Ray)", "CPU")
        if not ray.is_initialized():
            term = signal.getsignal(signal.SIGTERM)
            kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                  "configure_logging": False}
            if address:
                kw["address"] = address
            else:  # embedded: this machine's cores, or exactly `jobs` tasks at once
                # "local": a private cluster even where `ray start` (or another tool's
                # cluster) runs on this machine: plain ray.init() would join that one, and
                # refuse num_cpus there (a sweep failed while a cluster test ran beside it)
                kw["address"] = "local"
                kw["num_cpus"] = jobs * cpus_per_task if jobs else os.cpu_count()
                # Ray starts its workers at nice 15 (its `worker_niceness`), which keeps its
                # own daemons responsive on a cluster node but, on a user's machine, makes
                # every cell yield to any other job: a sweep then runs slower than the same
                # commands typed by hand. Embedded cells run at the caller's priority
                # (`RAY_worker_niceness` in the environment still wins). The value is an
                # *increment* on the raylet's niceness, which is the caller's (it was
                # os.nice(0) here: a driver started with `nice -n 10` ran its cells at 19).
                os.environ.setdefault("RAY_worker_niceness", "0")
                # Ray's memory monitor kills tasks when the *node* passes 95 % of its
                # memory, whoever uses it: on a shared machine other users' jobs got cells
                # killed (OutOfMemoryError, twice, then FAILED; a smoke run at
                # 21.7 of 23.5 GB). Embedded, the kernel decides what is out of memory.
                os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
            if address:
                ray.init(**kw)
            else:
                embedded_init(ray, **kw)
            _keep_python_sigterm(term)
        res = ray.cluster_resources()
        gpus = (1.0 if res.get("GPU", 0) > 0 else 0.0) if gpus_per_task == "auto" \
            else float(gpus_per_task)
        self.cpus, self.gpus = float(cpus_per_task), gpus
        nodes = ray.nodes()
        why = unplaceable(nodes, self.cpus, self.gpus)
        if why:
            short = "CPU" if all(n.get("Resources", {}).get("CPU", 0.0) < self.cpus
                                 for n in nodes) else "GPU"
            if not address:  # ours: do not leave an embedded cluster behind the error
                ray.shutdown()
            raise Unplaceable(why, short)
        # Ray counts resources to 1e-4: 10 cells of 0.1 GPU fit one GPU, although
        # 1 // 0.1 is 9 in floating point
        slots = int(res.get("CPU", 1) / self.cpus + 1e-6)
        if gpus:
            slots = min(slots, int(res.get("GPU", 0) / gpus + 1e-6))
        self.slots = max(1, slots)
        self._remote: dict[Callable[..., Any], Any] = {}
        self._pending: dict[Any, Hashable] = {}

    def submit(self, key: Hashable, fn: Callable[..., Any], *args: Any) -> None:
        if fn not in self._remote:
            self._remote[fn] = self._ray.remote(num_cpus=self.cpus, num_gpus=self.gpus,
                                                max_retries=0)(fn)
        self._pending[self._remote[fn].remote(*args)] = key

    def __len__(self) -> int:
        return len(self._pending)

    @property
    def running(self) -> int:
        return min(len(self._pending), self.slots)

    def next_done(self) -> tuple[Hashable, Any, BaseException | None]:
        if not self._pending:
            raise RuntimeError("next_done() with nothing submitted")
        ready, _ = self._ray.wait(list(self._pending), num_returns=1)
        key = self._pending.pop(ready[0])
        try:
            return key, self._ray.get(ready[0]), None
        except Exception as e:  # noqa: BLE001 - handed to the caller, who records it
            cause = getattr(e, "cause", None)
            return key, None, cause if isinstance(cause, BaseException) else e

    def cancel_pending(self) -> None:
        """Cancel every task not yet finished (queued ones never start); their
        ``next_done`` then reports a cancellation error."""
        for ref in list(self._pending):
            self._ray.cancel(ref, force=False)

    def shutdown(self) -> None:
        self._ray.shutdown()
