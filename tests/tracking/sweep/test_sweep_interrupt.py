"""A sweep cut off by SIGTERM (a supervisor, ``kill``, the end of a CI job) and run again
continues (issue 24): the interrupted driver closes the runs of the cells it was running as
FAILED, ends its sweep run FAILED and exits 143 with its Ray workers (and so the cells) gone;
the next ``scarcelab sweep`` of the same spec skips the finished cells and runs the rest.

Before, SIGTERM killed the driver outright: the sweep run and the running cells' runs stayed
RUNNING until the next invocation closed them, and Ray's daemons outlived the driver.
Cells are tests/sweep_fake_cell.py (the driver's ``python`` is a wrapper), so a cell costs
an MLflow client import, not a study."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

REPO = Path(__file__).resolve().parents[3]

SPEC = """\
name: cut
retries: 0
env: {{SCARCELAB_USER_FAKE_SLEEP_S: "{sleep}", SCARCELAB_USER_FAKE_CELL_PIDS: "{pids}"}}
grids:
  - entry: self
    method: simclr
    seed: [0, 1]
  - entry: self
    method: simclr
    seed: 9
    set: {{sleep: 1}}
"""

# the real `scarcelab sweep` command (its SIGTERM handling included), with the driver's
# cell interpreter pointed at the stand-in cell
DRIVER = """
import sys
from scarcelab.tracking.sweep import driver
init = driver.Driver.__init__
def patched(self, *a, **k):
    k["python"] = sys.argv[1]
    init(self, *a, **k)
driver.Driver.__init__ = patched
from scarcelab.entrypoints.cli import main
main(["sweep", sys.argv[2], "--jobs", "1"])
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")


def test_sigterm_closes_the_running_cells_and_a_rerun_continues(tmp_path, monkeypatch):
    pytest.importorskip("ray")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {REPO / 'tests/sweep_fake_cell.py'} "
                      '"$@"\n')
    python.chmod(0o755)
    pids = tmp_path / "pids"
    pids.mkdir()
    spec = tmp_path / "cut.yaml"
    spec.write_text(SPEC.format(sleep=300, pids=pids))
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(REPO)}
    env.pop("MLFLOW_RUN_ID", None)
    with open(tmp_path / "driver.log", "w+") as log:
        p = subprocess.Popen([sys.executable, "-c", DRIVER, str(python), str(spec)],
                             env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 300
            while not list(pids.iterdir()) and time.time() < deadline and p.poll() is None:
                time.sleep(0.5)
            sleeping = list(pids.iterdir())
            assert sleeping, "the sleeping cell never started"
            cell_pid = int(sleeping[0].read_text())
            p.send_signal(signal.SIGTERM)
            rc = p.wait(120)
        finally:
            if p.poll() is None:
                p.kill()
        log.seek(0)
        out = log.read()
    assert rc == 128 + signal.SIGTERM, out
    deadline = time.time() + 30
    while _alive(cell_pid) and time.time() < deadline:
        time.sleep(0.5)
    assert not _alive(cell_pid), "the running cell outlived its interrupted driver"

    mlflow.set_tracking_uri(uri)
    c = MlflowClient()
    exp = c.get_experiment_by_name("cut").experiment_id
    runs = c.search_runs([exp], "tags.`scarcelab.sweep` = 'cut'")
    sweep = [r for r in runs if r.data.tags.get("scarcelab.role") == "sweep"]
    assert len(sweep) == 1 and sweep[0].info.status == "FAILED", out
    cut = [r for r in runs if r.info.run_id == sleeping[0].name]
    assert cut and cut[0].info.status == "FAILED"
    assert "interrupted (SystemExit)" in cut[0].data.tags["scarcelab.error"]
    assert not [r for r in runs if r.info.status == "RUNNING"]
    finished_before = sum(r.info.status == "FINISHED" for r in runs)

    # the same cells (a new sleep time is the spec's env, not a cell option): continue
    spec.write_text(SPEC.format(sleep=0, pids=pids))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    from scarcelab.tracking.sweep.driver import Driver
    from scarcelab.tracking.sweep.spec import load_spec

    lines: list[str] = []
    res = Driver(load_spec(spec), jobs=1, echo=lines.append, python=str(python)).run()
    assert f"3 cells: {finished_before} already finished" in lines[0]
    assert res.count("FAILED") == 0 and res.count("FINISHED") == 3 - finished_before
    runs = c.search_runs([exp], "tags.`scarcelab.cell` != ''")
    by_cell: dict[str, list[str]] = {}
    for r in runs:
        by_cell.setdefault(r.data.tags["scarcelab.cell"], []).append(r.info.status)
    assert len(by_cell) == 3 and all(s.count("FINISHED") == 1 for s in by_cell.values())
