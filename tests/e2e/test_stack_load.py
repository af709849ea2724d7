"""Load test of the tracking stack (issue 42, "Also"): 8 studies at once against one
server, the server restarted while they train, and afterwards every trial and every epoch
accounted for.

What "accounted for" means here, per study: the finished/failed trial counts the study
reports (its return value and its run's tags) equal the FINISHED/FAILED trial runs in
MLflow and the COMPLETE/FAIL trials in its Optuna study; every trial run's per-epoch
series has each epoch once, none missing; the study's own per-epoch series counts every
trial epoch once; no run is left RUNNING; and whatever the spools held when the server
went away was delivered (late, by the delivery thread, or by a replay of a folder a study
left), leaving no spool folder behind.

Uses only the stack fixture of test_stack.py and MLflow's/Optuna's clients, so it holds
whatever object store serves the artifacts behind the server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import optuna
import pytest
from mlflow.tracking import MlflowClient
from test_stack import REPO, _runs, _wait_for, client_env, stack  # noqa: F401 - fixtures

pytestmark = pytest.mark.e2e

N_STUDIES = 8
MAX_TRIALS = 3
#: seconds the tracking server is away (stop, wait, start: its start-up comes on top)
DOWN_S = 8.0


def test_eight_studies_through_a_server_restart(stack, client_env, tmp_path, capsys):  # noqa: F811
    env, exp = client_env
    t0 = time.time()
    out = tmp_path / "out"
    out.mkdir()
    kw = {"studies": N_STUDIES, "out": str(out), "experiment": exp,
          "study_name": f"load-{uuid.uuid4().hex[:6]}", "method": "sup",
          "dataset": "synthetic_tiny", "arch": "small_cnn", "device": "cpu", "max_epochs": 2,
          "patience": 2, "batch_size": 16, "max_steps_per_epoch": 2,
          "budget_minutes": 2.0, "max_trials": MAX_TRIALS}
    worker = str(REPO / "tests" / "e2e" / "stack_load_worker.py")
    env = {**env, "PYTHONPATH": str(REPO)}
    with open(tmp_path / "load.log", "w+") as log:
        p = subprocess.Popen([sys.executable, worker, json.dumps(kw)], cwd=tmp_path, env=env,
                             stdout=log, stderr=subprocess.STDOUT)
        try:
            def under_way() -> bool:  # every study recording, some trials done
                r = _runs(exp)
                roles = r["tags.scarcelab.role"]
                return (roles == "study").sum() == N_STUDIES and (
                    (roles == "trial") & (r["status"] == "FINISHED")).sum() >= N_STUDIES // 2
            _wait_for(under_way, 150, "8 study runs and 4 finished trials")
            restart_at = time.time() - t0
            running_at_stop = p.poll() is None
            stack.stop_mlflow()
            time.sleep(DOWN_S)
            stack.start_mlflow()
            rc = p.wait(timeout=240)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        log.seek(0)
        text = log.read()
    assert rc == 0, text[-4000:]
    assert running_at_stop, "the studies had ended before the server went away: no load"
    reports = [json.loads((out / f"{i}.json").read_text()) for i in range(N_STUDIES)]

    # folders a study left because the server was away at its end: replayed, as a user would
    from scarcelab.tracking.spool import main as spool_main

    replays = [r["spool_left"] for r in reports if r.get("spool_left")]
    for folder in replays:
        assert spool_main(["replay", folder]) == 0
    capsys.readouterr()

    c = MlflowClient()
    runs = _runs(exp)
    assert "RUNNING" not in set(runs["status"]), runs[runs["status"] == "RUNNING"][
        ["run_id", "tags.scarcelab.role"]]
    studies = runs[runs["tags.scarcelab.role"] == "study"]
    trials = runs[runs["tags.scarcelab.role"] == "trial"]
    assert len(studies) == N_STUDIES and set(studies.run_id) == {r["run_id"] for r in reports}
    n_epochs = n_trials = 0
    for rep in reports:
        s = studies[studies.run_id == rep["run_id"]].iloc[0]
        assert s["status"] == "FINISHED"
        mine = trials[trials["tags.mlflow.parentRunId"] == s.run_id]
        finished = mine[mine["status"] == "FINISHED"]
        failed = mine[mine["status"] == "FAILED"]
        assert 1 <= rep["n_trials"] <= MAX_TRIALS
        assert (int(s["tags.scarcelab.n_trials"]), int(s["tags.scarcelab.n_failed"])) == (
            rep["n_trials"], rep["n_failed"])
        assert (len(finished), len(failed)) == (rep["n_trials"] - rep["n_failed"],
                                                rep["n_failed"]), rep
        numbers = list(mine["tags.scarcelab.trial"])
        assert len(numbers) == len(set(numbers)), f"study {rep['index']}: a trial twice"
        ostudy = optuna.load_study(study_name=s["tags.scarcelab.optuna_study"],
                                   storage=env["OPTUNA_STORAGE"])
        states = [t.state for t in ostudy.trials]
        assert optuna.trial.TrialState.RUNNING not in states
        assert states.count(optuna.trial.TrialState.COMPLETE) == len(finished)
        assert states.count(optuna.trial.TrialState.FAIL) == len(failed)
        assert set(numbers) == {str(t.number) for t in ostudy.trials
                                if t.state != optuna.trial.TrialState.PRUNED}
        epochs = 0
        for _, t in mine.iterrows():  # each epoch once, none missing (a failed trial's too)
            steps = [m.step for m in c.get_metric_history(t.run_id, "val/balanced_accuracy")]
            want = int(t["metrics.epochs"]) if t["status"] == "FINISHED" else len(steps)
            assert sorted(steps) == list(range(want)), (
                f"study {rep['index']} trial {t['tags.scarcelab.trial']}: epochs {steps}")
            epochs += len(steps)
        best = [m.step for m in c.get_metric_history(s.run_id, "best/val_balanced_accuracy")]
        assert sorted(best) == list(range(epochs)), (
            f"study {rep['index']}: {epochs} trial epochs, study series steps {best}")
        n_epochs += epochs
        n_trials += len(mine)
    # the spools are empty: everything held during the outage reached the server
    spool_root = env["SCARCELAB_SPOOL_DIR"]
    left = [d for d in os.listdir(spool_root)] if os.path.isdir(spool_root) else []
    assert not left, f"spool folders not delivered: {left}"
    late = int((runs.get("tags.scarcelab.spool") == "delivered_late").sum())
    assert late >= 1 or replays, "no record waited for the server: the restart missed the load"
    wall = time.time() - t0
    with capsys.disabled():
        print(f"\n[load] {N_STUDIES} studies, {n_trials} trials "
              f"({int((trials['status'] == 'FAILED').sum())} failed), {n_epochs} epochs, "
              f"server restarted at {restart_at:.0f} s for {DOWN_S:.0f} s + start-up, "
              f"{late} runs delivered late, {len(replays)} spool replays, {wall:.0f} s")
