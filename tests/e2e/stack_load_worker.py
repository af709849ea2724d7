"""Many search studies at once from one process tree, for the load test in
tests/e2e/test_stack_load.py.

Why fork: each study is its own process (its own tracker, spool and Optuna study, as
separate ``scarcelab supervised`` commands are), but importing torch, MLflow and Optuna
eight times over costs minutes of CPU on a 2-core CI machine. The parent imports once,
before any thread or connection exists, and forks one child per study.

Usage: python tests/e2e/stack_load_worker.py '{"studies": 8, "out": DIR,
"experiment": EXP, "study_name": PREFIX, <StudyConfig fields>}'
Each child writes ``DIR/<i>.json``: its study run, trial counts and any spool folder it
left; the parent exits non-zero when a child did.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import torch

from scarcelab.protocols.search import StudyConfig, run_study
from scarcelab.tracking.mlflow_tracker import MlflowTracker


def _study(i: int, kw: dict, experiment: str, prefix: str, out: Path) -> int:
    """Study ``i`` (seed ``i``, its own shared-study name) in this child process."""
    tracker = MlflowTracker(experiment=experiment)
    rec: dict = {"index": i}
    try:
        res = run_study(StudyConfig(**kw, seed=i, study_name=f"{prefix}-{i}"), tracker)
        rec.update(run_id=tracker.study_run_id, n_trials=res.n_trials, n_failed=res.n_failed,
                   spool_left=str(tracker.spool_left) if tracker.spool_left else None)
        rc = 0
    except BaseException:  # noqa: BLE001 - reported to the test, which fails on it
        rec.update(run_id=tracker.study_run_id, error=traceback.format_exc()[-3000:])
        rc = 1
    (out / f"{i}.json").write_text(json.dumps(rec))
    return rc


if __name__ == "__main__":
    torch.set_num_threads(1)
    kw = json.loads(sys.argv[1])
    n, out = int(kw.pop("studies")), Path(kw.pop("out"))
    experiment, prefix = kw.pop("experiment"), kw.pop("study_name")
    children = []
    for i in range(n):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _study(i, kw, experiment, prefix, out)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        children.append(pid)
    failed = 0
    for pid in children:
        _, status = os.waitpid(pid, 0)
        failed += os.waitstatus_to_exitcode(status) != 0
    sys.exit(1 if failed else 0)
