"""Every suite's smoke scale through the real sweep driver into one sqlite store: the
background half of tests/test_results_smoke.py.

    python tests/smoke_runner.py OUT_DIR JOBS

Why a process of its own: the five smokes are ~50 cell processes, ~18 CPU-minutes (most of
it each cell's start: imports, its MLflow run, its figures), while the rest of the test
suite runs one test at a time and leaves a core idle most of the time. conftest.py starts
this runner when the session collects the smoke test — at the start of the session, with
``JOBS=1`` beside the other tests (``2`` when the smoke test runs alone) — and the smoke
test waits for it and then checks the pages. ``OUT_DIR/status.json`` says, per suite, how
each sweep ended; ``OUT_DIR/runner.log`` has the driver's progress lines.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUITES = sorted((REPO / "suites").glob("*.yaml"))
#: the real files the five smokes read, under ../shared/data
NEEDED = ["medmnist/breastmnist.npz", "medmnist/pneumoniamnist.npz", "tabular/splice",
          "pathology_crops", "consep_patches", "nuclei_cpm15", "cifar10_jpg", "ood"]


def environment(out: Path, data: Path) -> dict[str, str]:
    """What the driver and its cells need: the store, the data, one thread per cell."""
    return {"MLFLOW_TRACKING_URI": f"sqlite:///{out / 'mlflow.db'}", "SCARCELAB_DATA": str(data),
            "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
            "MLFLOW_REQUIREMENTS_INFERENCE_TIMEOUT": "1"}


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001, S110 - not Linux: the runner outlives a killed pytest
        pass


def start(out: Path, jobs: int, data: Path) -> object:
    """Start the runner in the background (it dies with the process that started it)."""
    import subprocess

    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_RUN_ID"}
    env.update(environment(out, data))
    with open(out / "runner.out", "w") as sink:
        return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), str(out),
                                 str(jobs)], env=env, cwd=out, stdout=sink,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=_die_with_parent)


def main(out: Path, jobs: int) -> int:
    os.chdir(out)
    sys.path.insert(0, str(REPO))
    from scarcelab.tracking.sweep.driver import run_sweep
    from scarcelab.tracking.sweep.spec import load_spec

    status: dict[str, dict[str, object]] = {}
    with open(out / "runner.log", "a", buffering=1) as log:
        for path in SUITES:
            t0 = time.time()
            try:
                res = run_sweep(load_spec(path, smoke=True), jobs=jobs,
                                echo=lambda s: print(s, file=log, flush=True))
                status[path.stem] = {
                    "finished": res.count("FINISHED") + res.count("SKIPPED"),
                    "failed": [[o.cell.label, o.error] for o in res.outcomes
                               if o.status == "FAILED"], "seconds": time.time() - t0}
            except Exception:  # noqa: BLE001 - recorded for the test to report
                status[path.stem] = {"error": traceback.format_exc(), "seconds": time.time() - t0}
            (out / "status.json").write_text(json.dumps(status, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2])))
