"""The embedded Ray pool runs cells without Ray's memory monitor, and at the caller's
priority: not Ray's worker nice 15, and not the caller's niceness added twice
(``RAY_worker_niceness`` is an increment on the raylet's niceness, which already is the
caller's)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
REPO = Path(__file__).resolve().parents[3]

SCRIPT = """
import os, sys
os.nice(3)  # a driver started with `nice -n 3` (on top of the test runner's niceness)
from scarcelab.tracking.sweep.pool import RayPool

def niceness():
    import os
    return os.nice(0), os.environ.get("RAY_memory_monitor_refresh_ms")

pool = RayPool(jobs=1)
pool.submit("cell", niceness)
key, value, err = pool.next_done()
pool.shutdown()
print("driver", os.nice(0), "cell", value[0], "monitor", value[1], "error", err)
"""


def test_embedded_cells_run_at_the_drivers_niceness() -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_worker_niceness"}
    env["PYTHONPATH"] = str(REPO)
    p = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                       text=True, timeout=300, cwd=REPO)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    words = p.stdout.split()
    driver, cell = int(words[words.index("driver") + 1]), int(words[words.index("cell") + 1])
    assert words[words.index("error") + 1] == "None", p.stdout
    # Ray's own default would be 15 (the cell yields to every other job); os.nice(0) as the
    # increment gave the driver's niceness twice (a `nice -n 10` driver ran cells at 19)
    assert cell == driver, p.stdout
    # the workers (and the raylet they come from) run without Ray's memory monitor, which
    # killed cells for other users' memory on a shared machine
    assert words[words.index("monitor") + 1] == "0", p.stdout


# -- issue 25 item 6: a cell no node can hold is refused, not queued forever ---------------

def _node(cpu: float, gpu: float = 0.0, alive: bool = True) -> dict:  # type: ignore[type-arg]
    res = {"CPU": cpu, **({"GPU": gpu} if gpu else {})}
    return {"Alive": alive, "Resources": res}


def test_unplaceable_names_what_a_cell_asks_and_what_the_nodes_have() -> None:
    from scarcelab.tracking.sweep.pool import unplaceable

    nodes = [_node(2), _node(4, 1), _node(64, alive=False)]  # a dead node holds nothing
    assert unplaceable(nodes, 4, 1) is None and unplaceable(nodes, 2, 0) is None
    why = unplaceable(nodes, 64, 0)
    assert why == ("a cell asks for 64 CPU and 0 GPU, and no node of the Ray cluster can "
                   "hold it (2 node(s): 2 CPU 0 GPU, 4 CPU 1 GPU)")
    # enough CPUs in total (6) and a GPU somewhere, but never together on one node
    assert unplaceable([_node(2, 1), _node(4)], 3, 1) is not None
    assert "no alive node" in (unplaceable([], 1, 0) or "")


def test_embedded_pool_refuses_more_cpus_than_the_machine_before_starting_ray() -> None:
    from scarcelab.tracking.sweep.pool import RayPool, Unplaceable

    t0 = time.process_time()  # CPU: what it costs, whatever else loads the machine
    with pytest.raises(Unplaceable) as e:
        RayPool(cpus_per_task=64 * (os.cpu_count() or 1))
    assert e.value.resource == "CPU" and time.process_time() - t0 < 1.0
    assert not ray.is_initialized()


def test_a_sweep_of_cells_no_node_can_hold_fails_at_the_specs_line(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from scarcelab.tracking.sweep.driver import Driver
    from scarcelab.tracking.sweep.spec import SpecError, load_spec

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    p = tmp_path / "wide.yaml"
    p.write_text("name: wide\ncpus_per_cell: 640\ngrids:\n  - {entry: supervised, method: sup}\n")
    with pytest.raises(SpecError) as e:
        Driver(load_spec(p), echo=lambda s: None).run()
    msg = str(e.value)
    assert msg.startswith(f"{p}:2: a cell asks for 640 CPU and this machine has "), msg
    assert msg.endswith("lower cpus_per_cell or add a node that has as much"), msg
