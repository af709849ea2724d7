"""A grid through the sweep driver on embedded Ray and the real tracking stack.

Eight tiny studies (2 methods x 2 datasets x 2 seeds) plus one cell that fails: the driver
is SIGKILLed once some cells finished, then the same command runs again. Checked through
MLflow: every grid cell has exactly one FINISHED run (no duplicate, none lost), the
killed attempts are closed FAILED, the failing cell is recorded FAILED with its error after
its retry while the others completed, and the grid's report is on the sweep run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient
from test_stack import REPO, _wait_for, client_env, stack  # noqa: F401 - fixtures

pytestmark = pytest.mark.e2e

SPEC = """\
name: {name}
experiment: {name}
retries: 1
grids:
  - entry: supervised
    method: [sup, mixup]
    dataset: [synthetic_tiny, synthetic_tiny_rgb]
    seed: [0]
    arch: small_cnn
    device: cpu
    max_epochs: 2
    patience: 2
    batch_size: 16
    max_steps_per_epoch: 3
    max_trials: 1
    budget_minutes: 2
  - entry: supervised
    method: sup
    dataset: synthetic_tiny
    set: {{no_such_hyperparameter: 1}}
    max_trials: 1
"""


def _cell_runs(client: MlflowClient, exp_id: str, name: str):  # type: ignore[no-untyped-def]
    return client.search_runs([exp_id], f"tags.`scarcelab.sweep` = '{name}'",
                              max_results=1000)


def test_sweep_grid_kill_resume_and_failing_cell(stack, client_env, tmp_path):  # noqa: F811
    env, exp = client_env
    spec = tmp_path / "grid.yaml"
    spec.write_text(SPEC.format(name=exp))
    env = {**env, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "scarcelab.entrypoints.cli", "sweep", str(spec), "--jobs", "2"]
    client = MlflowClient()

    log1 = open(tmp_path / "driver1.log", "w+")  # noqa: SIM115
    p1 = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log1, stderr=subprocess.STDOUT)
    try:
        def some_finished() -> bool:
            e = client.get_experiment_by_name(exp)
            runs = _cell_runs(client, e.experiment_id, exp)
            return sum(r.info.status == "FINISHED" and "scarcelab.cell" in r.data.tags
                       for r in runs) >= 2
        _wait_for(some_finished, 600, "two finished cells")
        os.kill(p1.pid, signal.SIGKILL)  # the driver only: Ray and the cells must follow
        p1.wait(30)
    finally:
        if p1.poll() is None:
            p1.kill()
    exp_id = client.get_experiment_by_name(exp).experiment_id
    finished_before = {r.data.tags["scarcelab.cell"] for r in _cell_runs(client, exp_id, exp)
                       if r.info.status == "FINISHED" and "scarcelab.cell" in r.data.tags}

    t0 = time.time()
    p2 = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                        timeout=1200)
    wall = time.time() - t0
    log1.seek(0)
    out = log1.read() + p2.stdout + p2.stderr
    assert p2.returncode == 1, out  # one cell fails by design
    assert f"{len(finished_before)} already finished" in p2.stderr, out

    runs = _cell_runs(client, exp_id, exp)
    cells: dict[str, list] = {}
    for r in runs:
        if "scarcelab.cell" in r.data.tags:
            cells.setdefault(r.data.tags["scarcelab.cell"], []).append(r)
    assert len(cells) == 5  # 2 methods x 2 datasets + the failing cell
    bad = [c for c, rs in cells.items()
           if "no_such_hyperparameter" in rs[0].data.tags["scarcelab.cell_label"]]
    assert len(bad) == 1
    for cid, rs in cells.items():
        statuses = [r.info.status for r in rs]
        assert "RUNNING" not in statuses, (cid, statuses)
        if cid in bad:
            assert statuses.count("FINISHED") == 0
            failed = [r for r in rs if "no_such_hyperparameter" in
                      r.data.tags.get("scarcelab.error", "")]
            assert len(failed) >= 2, [r.data.tags.get("scarcelab.error") for r in rs]
        else:
            assert statuses.count("FINISHED") == 1, (cid, statuses)  # no duplicate, none lost
            if cid in finished_before:
                assert len(rs) == 1  # a finished cell is never run again
    killed = [r for rs in cells.values() for r in rs
              if "driver" in r.data.tags.get("scarcelab.error", "")]
    assert killed, "the cells the killed driver left RUNNING are closed as FAILED"

    sweep = client.search_runs([exp_id], "tags.`scarcelab.role` = 'sweep'")
    assert len(sweep) == 1 and sweep[0].info.status == "FAILED"
    arts = {a.path for a in client.list_artifacts(sweep[0].info.run_id, "report")}
    assert {"report/leaderboard.csv", "report/report.html"} <= arts
    lb = client.download_artifacts(sweep[0].info.run_id, "report/leaderboard.csv", str(tmp_path))
    text = open(lb).read()
    assert "sup" in text and "mixup" in text and "synthetic_tiny_rgb" in text
    print(f"second driver run: {wall:.0f} s")
