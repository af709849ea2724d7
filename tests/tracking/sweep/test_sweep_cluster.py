"""Sweeps on a real multi-node Ray cluster reporting to one tracking stack (issue 25,
"Scale-out for real"). Run on demand, not in CI (minutes on a 2-core machine):

    SCARCELAB_CLUSTER_TESTS=1 python -m pytest -q -m cluster -s \
        tests/tracking/sweep/test_sweep_cluster.py

The cluster is built the way Ray's own tests build one (``ray.cluster_utils.Cluster``): a
head that schedules nothing (``num_cpus=0``) and worker nodes of one *logical* CPU each,
every node its own raylet and object store, started with this process's environment as a
worker's own (``OPTUNA_STORAGE`` and the stack's client variables: the driver forwards no
credentials to a cluster). The stack is ``scripts/stack start --root DIR --pg-port 0
--s3-port 0 --mlflow-port 0`` (PostgreSQL + S3 + ``mlflow server`` on loopback), or the
running one named by ``SCARCELAB_E2E_STACK``. The driver is the real one
(``tracking.sweep.driver.Driver`` with ``--address`` of the cluster); cells are real
``scarcelab supervised`` / ``tune`` commands on ``synthetic_tiny``.

What is checked: a grid spread over several nodes; a node killed while one of its cells
runs, that cell retried on another node, every cell with exactly one FINISHED run and each
of those with its one trial; eight tune workers on two nodes (a quarter CPU each) sharing
one Optuna study in PostgreSQL get exactly the asked number of trials, with every trial
run and every metric point accounted for. Numbers are printed (``-s``) for the docs.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.cluster, pytest.mark.skipif(
    os.environ.get("SCARCELAB_CLUSTER_TESTS") != "1",
    reason="multi-node Ray cluster test: set SCARCELAB_CLUSTER_TESTS=1 (minutes)")]


def _stack_env(root: str, *args: str) -> dict[str, str]:
    cmd = [sys.executable, "-m", "scarcelab.tracking.stack", *args, "--root", root]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, check=True).stdout
    env = {}
    for line in out.splitlines():
        if line.startswith("export "):
            k, _, v = line[len("export "):].partition("=")
            env[k] = shlex.split(v)[0] if v else ""
    return env


@pytest.fixture(scope="module")
def stack_env():  # type: ignore[no-untyped-def]
    ext = os.environ.get("SCARCELAB_E2E_STACK")
    if ext:
        yield _stack_env(ext, "env")
        return
    root = tempfile.mkdtemp(prefix="sl-cl-", dir="/tmp")  # short: PG socket path limit
    os.chmod(root, 0o755)  # the postgres user must traverse it
    start = [sys.executable, "-m", "scarcelab.tracking.stack", "start", "--root", root,
             "--pg-port", "0", "--s3-port", "0", "--mlflow-port", "0"]
    subprocess.run(start, cwd=REPO, timeout=600, check=True,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        yield _stack_env(root, "env")
    finally:
        subprocess.run([sys.executable, "-m", "scarcelab.tracking.stack", "stop", "--root",
                        root], cwd=REPO, timeout=300, env={**os.environ,
                                                           "PYTHONPATH": str(REPO)})
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(stack_env):  # type: ignore[no-untyped-def]
    """(cluster, {name: node}): head (no CPU) + nodes a, b, c of one logical CPU each."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    mp = pytest.MonkeyPatch()
    for k, v in {**stack_env, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
                 "RAY_memory_monitor_refresh_ms": "0",  # a shared machine: no OOM kills
                 "MLFLOW_REQUIREMENTS_INFERENCE_TIMEOUT": "1"}.items():
        mp.setenv(k, v)
    mp.delenv("MLFLOW_RUN_ID", raising=False)
    mp.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    import mlflow

    mlflow.set_tracking_uri(stack_env["MLFLOW_TRACKING_URI"])
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0,
                                                      "include_dashboard": False})
    nodes = {n: c.add_node(num_cpus=1, resources={f"node_{n}": 1}) for n in "abc"}
    c.wait_for_nodes()
    try:
        yield c, nodes
    finally:
        ray.shutdown()
        c.shutdown()
        mp.undo()


def _spec(tmp: Path, text: str) -> Any:
    from scarcelab.tracking.sweep.spec import load_spec

    p = tmp / "grid.yaml"
    p.write_text(text)
    return load_spec(p)


def _ancestors(pid: int, depth: int = 4) -> list[int]:
    out = []
    for _ in range(depth):
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        out.append(pid)
    return out


def _cells_under(raylet_pid: int, entry: str) -> list[int]:
    """Cell processes (``scarcelab.entrypoints.cli <entry>``) started by a worker of the
    node whose raylet is ``raylet_pid`` (worker processes are the raylet's children)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"scarcelab.entrypoints.cli" in cmd and entry.encode() in cmd and \
                raylet_pid in _ancestors(int(d.name)):
            found.append(int(d.name))
    return found


def _runs(client: Any, exp_name: str, flt: str = "") -> list[Any]:
    exp = client.get_experiment_by_name(exp_name)
    return client.search_runs([exp.experiment_id], flt, max_results=5000)


def test_a_grid_spreads_over_nodes_and_survives_a_killed_node(cluster, tmp_path):  # type: ignore[no-untyped-def]
    from mlflow.tracking import MlflowClient

    from scarcelab.tracking.sweep.driver import Driver

    c, nodes = cluster
    name = f"cl-grid-{uuid.uuid4().hex[:6]}"
    spec = _spec(tmp_path, f"""\
name: {name}
retries: 1
cpus_per_cell: 1
gpus_per_cell: 0
grids:
  - entry: supervised
    method: sup
    dataset: synthetic_tiny
    arch: small_cnn
    seed: [0, 1, 2, 3]
    max_trials: 1
    max_epochs: 2
    max_steps_per_epoch: 2
    budget_minutes: 4
    device: cpu
""")
    victim = nodes["c"]
    raylet = victim.all_processes["raylet"][0].process.pid
    killed: dict[str, Any] = {}

    def killer() -> None:  # the node goes while one of its cells is mid-run
        deadline = time.time() + 900
        while time.time() < deadline and not killed:
            pids = _cells_under(raylet, "supervised")
            if pids:
                time.sleep(8)  # well into the study: its run, trials and metrics exist
                if _cells_under(raylet, "supervised"):
                    killed["at"] = time.time()
                    killed["cells"] = pids
                    c.remove_node(victim, allow_graceful=False)
                    return
            time.sleep(0.5)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    lines: list[str] = []
    t0 = time.time()
    res = Driver(spec, address=c.address, echo=lines.append).run()
    wall = time.time() - t0
    t.join(timeout=5)
    print("\n".join(lines))
    assert killed, "the victim node never ran a cell"
    client = MlflowClient()
    cells = _runs(client, spec.experiment, f"tags.`scarcelab.sweep` = '{name}'")
    by_cell: dict[str, list[Any]] = {}
    for r in cells:
        if "scarcelab.cell" in r.data.tags:
            by_cell.setdefault(r.data.tags["scarcelab.cell"], []).append(r)
    assert len(by_cell) == 4 and res.count("FINISHED") == 4, lines
    finished = [r for rs in by_cell.values() for r in rs if r.info.status == "FINISHED"]
    assert len(finished) == 4  # nothing lost, nothing twice
    failed = [r for rs in by_cell.values() for r in rs if r.info.status == "FAILED"]
    assert len(failed) == 1 and "Ray task failed" in failed[0].data.tags["scarcelab.error"]
    retried = by_cell[failed[0].data.tags["scarcelab.cell"]]
    again = next(r for r in retried if r.info.status == "FINISHED")
    assert again.data.tags["scarcelab.machine.ray_node"] != victim.node_id
    used = {r.data.tags["scarcelab.machine.ray_node"] for r in finished}
    assert len(used) >= 2, used  # spread over nodes
    # each finished study has its one trial, FINISHED, nested under it
    trials = _runs(client, spec.experiment, "tags.`scarcelab.role` = 'trial'")
    for r in finished:
        mine = [x for x in trials if x.data.tags.get("mlflow.parentRunId") == r.info.run_id]
        assert [x.info.status for x in mine] == ["FINISHED"], (r.info.run_id, mine)
    names = {v.node_id: k for k, v in nodes.items()}
    print(f"CLUSTER grid: 4 cells on nodes {sorted(names.get(u, u) for u in used)}, node c "
          f"killed {killed['at'] - t0:.0f} s in while running {len(killed['cells'])} cell(s); "
          f"{len(finished)} FINISHED runs, {len(failed)} FAILED attempt retried on node "
          f"{names.get(again.data.tags['scarcelab.machine.ray_node'])}; sweep wall {wall:.0f} s")


def test_eight_workers_share_one_optuna_study_across_nodes(cluster, tmp_path):  # type: ignore[no-untyped-def]
    import optuna
    from mlflow.tracking import MlflowClient

    from scarcelab.tracking.sweep.driver import Driver

    c, nodes = cluster
    if all(n.all_processes.get("raylet") and n.all_processes["raylet"][0].process.poll()
           is None for n in nodes.values()):
        c.remove_node(nodes["c"], allow_graceful=False)  # run alone: the same two nodes
    n_trials = 16
    study = f"cl-shared-{uuid.uuid4().hex[:6]}"
    spec = _spec(tmp_path, f"""\
name: {study}
retries: 0
cpus_per_cell: 0.25
gpus_per_cell: 0
grids:
  - entry: tune
    method: ce
    dataset: synthetic_tiny
    arch: small_cnn
    seed: [0, 1, 2, 3, 4, 5, 6, 7]
    epochs: 2
    grace_period: 1
    n_trials: {n_trials}
    batch_sizes: "10"
    max_steps_per_epoch: 2
    phase: search
    study_name: {study}
    device: cpu
""")
    lines: list[str] = []
    t0 = time.time()
    res = Driver(spec, address=c.address, echo=lines.append).run()
    wall = time.time() - t0
    print("\n".join(lines))
    assert res.count("FINISHED") == 8, lines
    client = MlflowClient()
    cells = [r for r in _runs(client, spec.experiment, f"tags.`scarcelab.sweep` = '{study}'")
             if "scarcelab.cell" in r.data.tags]
    assert len(cells) == 8 and {r.info.status for r in cells} == {"FINISHED"}
    used = {r.data.tags["scarcelab.machine.ray_node"] for r in cells}
    spans = sorted((r.info.start_time, r.info.end_time) for r in cells)
    overlap = max(sum(s <= t < e for s, e in spans) for t, _ in spans)
    # the study in PostgreSQL: exactly the asked number of trials, none left running
    st = optuna.load_study(study_name=study, storage=os.environ["OPTUNA_STORAGE"])
    # a worker that asked after the last slot was taken records a "surplus" trial and stops
    counted = [t for t in st.trials if not t.user_attrs.get("surplus")]
    surplus = len(st.trials) - len(counted)
    states = [t.state.name for t in counted]
    assert len(states) == n_trials, states
    assert not {"RUNNING", "WAITING"} & set(states), states
    # MLflow: one trial run per Optuna trial, under the eight workers' runs
    ids = {r.info.run_id for r in cells}
    trials = [r for r in _runs(client, spec.experiment, "tags.`scarcelab.role` = 'trial'")
              if r.data.tags.get("mlflow.parentRunId") in ids]
    numbers = sorted(int(r.data.tags["scarcelab.trial"]) for r in trials)
    assert numbers == sorted(t.number for t in counted), numbers
    # every metric point: per trial, each per-epoch series has one point per epoch (no
    # gap, no duplicate step), as many as the epochs Optuna saw reported for that trial
    points = 0
    by_number = {t.number: t for t in counted}
    for r in trials:
        t = by_number[int(r.data.tags["scarcelab.trial"])]
        reported = len(t.intermediate_values)
        for key in r.data.metrics:
            hist = client.get_metric_history(r.info.run_id, key)
            steps = [m.step for m in hist]
            assert len(steps) == len(set(steps)), (r.info.run_id, key, steps)
            points += len(hist)
        if reported:  # tune reports its avg5 series to Optuna, epoch by epoch
            n = len(client.get_metric_history(r.info.run_id, "val/balanced_accuracy_avg5"))
            assert n == reported, (r.info.run_id, n, reported)
    per_state = {s: states.count(s) for s in sorted(set(states))}
    names = {v.node_id: k for k, v in nodes.items()}
    print(f"CLUSTER shared study: 8 tune workers (0.25 CPU each) on nodes "
          f"{sorted(names.get(u, u) for u in used)}, at most {overlap} running at once; "
          f"Optuna trials {len(states)} "
          f"(asked {n_trials}) {per_state} + {surplus} surplus; MLflow trial runs "
          f"{len(trials)}; metric points "
          f"{points}; sweep wall {wall:.0f} s")
    assert len(used) == 2
