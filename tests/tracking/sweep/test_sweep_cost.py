"""What a cell attempt cost, as the sweep driver records it (issue 24: a results page gives
the suite's CPU time): ``run_cell_process`` reports the CPU time of the cell process *and*
of the children it waited for (wait4's rusage), its peak RSS and the machine."""

from __future__ import annotations

import sys
import time

from scarcelab.tracking.sweep.driver import machine, run_cell_process

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


def test_cell_cpu_time_counts_the_cell_and_its_children(tmp_path):
    # the "python" the driver starts is a shell that runs a child which runs a grandchild;
    # each burns 0.4 s of CPU, so the cell cost >= 0.8 s whatever the wall clock did
    burn = tmp_path / "burn.py"
    burn.write_text(BURN.format(s=0.4))
    child = tmp_path / "child.py"
    child.write_text(f"import subprocess, sys\nsubprocess.run([sys.executable, '{burn}'])\n"
                     + BURN.format(s=0.4))
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {child}\n")
    python.chmod(0o755)
    t0 = time.time()
    out = run_cell_process(["self"], {}, str(tmp_path), str(python))
    assert out["rc"] == 0, out["output"]
    assert out["cpu_s"] >= 0.8 - 0.05
    assert out["cpu_s"] <= time.time() - t0 + 0.1 + 1.0  # two processes: <= 2 x wall
    assert out["max_rss_mb"] > 1
    assert out["machine"] == machine()


def test_machine_names_cores_ram_cpu_and_gpu():
    m = machine()
    assert int(m["cores"]) >= 1 and float(m["ram_gb"]) > 0
    assert m["cpu"] and m["gpu"] and m["host"]
