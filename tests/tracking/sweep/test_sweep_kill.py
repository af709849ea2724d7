"""A sweep driver killed outright (SIGKILL: the OOM killer, ``kill -9``, a lost terminal's
process group) takes its embedded Ray cluster with it, and the same sweep run again right
away is accepted and continues (issue 42 item 10).

Before, Ray's daemons and agents (``ray::RuntimeEnvAgent``, ``ray::DashboardAgent``,
raylet, GCS) outlived the killed driver for about a minute, and a re-run in that minute
was refused as "being run by the driver". Cells are tests/sweep_fake_cell.py, as in
tests/tracking/sweep/test_sweep_interrupt.py."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

SPEC = """\
name: killed
retries: 0
env: {{SCARCELAB_USER_FAKE_SLEEP_S: "{sleep}", SCARCELAB_USER_FAKE_CELL_PIDS: "{pids}"}}
grids:
  - entry: self
    method: simclr
    seed: 9
    set: {{sleep: 1}}
  - entry: self
    method: simclr
    seed: [0, 1]
"""

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
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _descendants(root: int) -> dict[int, str]:
    """pid -> command line of every live process below ``root``."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out: dict[int, str] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        try:
            out[pid] = (Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                        .decode(errors="replace").strip())
        except OSError:
            continue
        todo += children.get(pid, [])
    return out


def test_sigkilled_driver_takes_ray_along_and_a_rerun_is_accepted_at_once(tmp_path):
    pytest.importorskip("ray")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {REPO / 'tests/sweep_fake_cell.py'} "
                      '"$@"\n')
    python.chmod(0o755)
    pids = tmp_path / "pids"
    pids.mkdir()
    spec = tmp_path / "killed.yaml"
    spec.write_text(SPEC.format(sleep=300, pids=pids))
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(REPO)}
    env.pop("MLFLOW_RUN_ID", None)
    cmd = [sys.executable, "-c", DRIVER, str(python), str(spec)]
    with open(tmp_path / "driver.log", "w+") as log:
        p = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 300
            while not list(pids.iterdir()) and time.time() < deadline and p.poll() is None:
                time.sleep(0.5)
            assert list(pids.iterdir()), "the sleeping cell never started"
            ray_procs = _descendants(p.pid)
            p.send_signal(signal.SIGKILL)
            # dead, and not reaped yet: its parent (a supervisor, a shell script) starts the
            # sweep again before it collects the old exit status
            deadline = time.time() + 30
            while _alive(p.pid) and time.time() < deadline:
                time.sleep(0.1)
            assert not _alive(p.pid)
            killed_at = time.time()
        except BaseException:
            p.kill()
            p.wait()
            raise
    assert any("raylet" in c for c in ray_procs.values()), ray_procs  # an embedded cluster
    # the same sweep again at once (the cell no longer sleeps): accepted, the dead driver's
    # lock taken over, the sleeping cell's run closed and the cells run
    spec.write_text(SPEC.format(sleep=0, pids=pids))
    with open(tmp_path / "rerun.log", "w+") as log:
        again = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=log,
                                 stderr=subprocess.STDOUT)
        # meanwhile the killed driver's cluster goes: nothing of it is left after 10 s
        deadline = killed_at + 10
        while [q for q in ray_procs if _alive(q)] and time.time() < deadline:
            time.sleep(0.5)
        left = {q: c for q, c in ray_procs.items() if _alive(q)}
        print(f"[kill] {len(ray_procs)} processes below the driver; "
              f"{len(ray_procs) - len(left)} gone {time.time() - killed_at:.1f} s after SIGKILL")
        try:
            rc = again.wait(300)
        finally:
            if again.poll() is None:
                again.kill()
            for q in left:  # not left to the next test, whatever the outcome
                try:
                    os.kill(q, signal.SIGKILL)
                except OSError:
                    pass
        log.seek(0)
        rerun = log.read()
    p.wait()
    assert "being run by the driver" not in rerun, rerun[-2000:]
    assert rc == 0, rerun[-3000:]
    done = re.search(r"sweep killed: (\d+) cells run, (\d+) already finished, 0 failed", rerun)
    assert done and int(done[1]) + int(done[2]) == 3, rerun[-2000:]
    assert not left, f"outlived the SIGKILLed driver by 10 s: {left}"
