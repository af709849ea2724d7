"""One search worker, as `scarcelab supervised` runs it, but with an explicit shared study
name (the CLI derives the name from the command). Used by tests/e2e/test_stack.py.

Usage: python tests/e2e/stack_worker.py '{"method": "sup", ..., "experiment": "e"}'
(optional "barrier": a folder; the worker waits there for a file named "go")
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

from scarcelab.protocols.search import StudyConfig, run_study
from scarcelab.tracking.mlflow_tracker import MlflowTracker

if __name__ == "__main__":
    torch.set_num_threads(1)
    kw = json.loads(sys.argv[1])
    barrier = kw.pop("barrier", None)
    if barrier:  # start together with the other workers (imports take long on a busy CPU)
        (Path(barrier) / f"ready-{os.getpid()}").touch()
        end = time.time() + 600
        while not (Path(barrier) / "go").exists() and time.time() < end:
            time.sleep(0.1)
    tracker = MlflowTracker(experiment=kw.pop("experiment"))
    res = run_study(StudyConfig(**kw), tracker)
    print(json.dumps({"run_id": tracker.study_run_id, "n_trials": res.n_trials}))
