"""A cheap stand-in for a cell process, for tests/tracking/sweep/test_sweep_deps.py.

The sweep driver starts ``<python> -m scarcelab.entrypoints.cli <entry> --opt value …`` with
``MLFLOW_RUN_ID`` set; the test hands the driver a ``python`` that runs this file instead,
so a cell costs an MLflow client import rather than a study. Against the real store it
records what a real cell must: the argv it got (param ``cell_argv``), for an
``--encoder runs:/<id>/model`` that the run ``<id>`` exists and is FINISHED (else it fails
like the resolver would), and it ends its run FINISHED. ``--set fail=1`` makes it fail
with an ``Error:`` line, as an entry point does; ``--set sleep=1`` makes it write its pid
under ``$SCARCELAB_USER_FAKE_CELL_PIDS`` and sleep ``$SCARCELAB_USER_FAKE_SLEEP_S`` seconds
(a cell still running when the driver is interrupted). Its variables are in the
``SCARCELAB_USER_`` namespace: a spec's ``env:`` is an allowlist and that prefix is the
user's own (tracking/sweep/spec.py).

With ``$SCARCELAB_USER_FAKE_CELL_REPORT`` set (tests/tracking/sweep/test_sweep_gpu_share.py) the
cell writes ``<that folder>/<run id>.json``: when its process started and ended (wall
clock), the share it was given (``CUDA_VISIBLE_DEVICES``, ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``,
``SCARCELAB_GPU_MEMORY_FRACTION``) and, with ``$SCARCELAB_USER_FAKE_BARRIER`` = N, how many
cells it saw alive at once: it marks itself ready and waits (at most
``$SCARCELAB_USER_FAKE_BARRIER_S`` seconds) until N cells are.
"""

from __future__ import annotations

import os
import sys

SHARE_ENV = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
             "SCARCELAB_GPU_MEMORY_FRACTION")


def main() -> int:
    import time

    t_start = time.time()
    argv = sys.argv[sys.argv.index("-m") + 2:]  # after "-m <the cell module>"
    opts = dict(zip(argv[1::2], argv[2::2], strict=True))
    if opts.get("--set") == "fail=1":
        print("Error: this cell fails on purpose (--set fail=1)", flush=True)
        return 1
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    run_id = os.environ["MLFLOW_RUN_ID"]
    if opts.get("--set") == "sleep=1":
        import time

        if os.environ.get("SCARCELAB_USER_FAKE_CELL_PIDS"):
            with open(os.path.join(os.environ["SCARCELAB_USER_FAKE_CELL_PIDS"], run_id), "w") as f:
                f.write(str(os.getpid()))
        time.sleep(float(os.environ.get("SCARCELAB_USER_FAKE_SLEEP_S", "0")))
    enc = opts.get("--encoder", "")
    if enc.startswith("runs:/"):
        dep = enc[len("runs:/"):].split("/")[0]
        status = client.get_run(dep).info.status
        if status != "FINISHED":
            print(f"Error: encoder={enc}: run {dep} is {status}", flush=True)
            return 1
        client.set_tag(run_id, "scarcelab.encoder", enc)
    client.log_param(run_id, "cell_argv", " ".join(argv))
    report = os.environ.get("SCARCELAB_USER_FAKE_CELL_REPORT")
    saw = 0
    if report:
        import glob

        n = int(os.environ.get("SCARCELAB_USER_FAKE_BARRIER", "0"))
        open(os.path.join(report, f"ready-{run_id}"), "w").close()
        end = time.time() + float(os.environ.get("SCARCELAB_USER_FAKE_BARRIER_S", "0"))
        while True:
            saw = len(glob.glob(os.path.join(report, "ready-*")))
            if saw >= n or time.time() >= end:
                break
            time.sleep(0.05)
    client.set_terminated(run_id, "FINISHED")
    if report:
        import json

        with open(os.path.join(report, f"{run_id}.json"), "w") as f:
            json.dump({"start": t_start, "end": time.time(), "saw": saw, "module": sys.argv[
                sys.argv.index("-m") + 1], "env": {k: os.environ.get(k) for k in SHARE_ENV}},
                f)
    print(f"fake cell {argv[0]} finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
