"""The embedded Ray pool runs cells without Ray's memory monitor, and at the caller's
priority: not Ray's worker nice 15, and not the caller's niceness added twice
(``RAY_worker_niceness`` is an increment on the raylet's niceness, which already is the
caller's)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
REPO = Path(__file__).resolve().parents[1]

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
