"""Tracking costs: stack start time, per-epoch tracking overhead (server vs embedded sqlite),
and 1,000 metrics logged one by one vs batched vs asynchronously.

    .venv/bin/python bench/tracking.py [--epochs 50] [--n 1000]

Starts a private stack on free ports (timed cold, then stopped and timed warm), measures,
stops it. The last line is the summary (DESIGN §5). Numbers depend heavily on machine load:
run it on an idle machine, and compare ratios rather than absolute times.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlflow  # noqa: E402
from mlflow.entities import Metric  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from scarcelab.tracking.mlflow_tracker import MlflowTracker  # noqa: E402
from scarcelab.tracking.stack import DEFAULT_PORTS, Stack, free_port  # noqa: E402

EPOCH_KEYS = ["train/loss", "train/loss_labeled", "train/loss_unlabeled", "train/mask_rate",
              "val/balanced_accuracy", "test/balanced_accuracy", "test/accuracy", "test/auroc",
              "test/pauroc_spec90", "test/sensitivity_at_spec95", "time/epoch_s",
              "time/eval_s", "time/steps", "time/elapsed_s"]


def per_epoch_overhead(uri: str, epochs: int) -> float:
    """Seconds per epoch the tracker spends: one trial-scope and one study-scope batch."""
    mlflow.set_tracking_uri(uri)
    t = MlflowTracker(experiment=f"bench-{os.getpid()}-{time.time_ns()}")
    t.start_study("bench", {"scarcelab.role": "study"}, {"a": 1}, {})
    t.start_trial(0, {"scarcelab.role": "trial"}, {"lr": 0.1})
    t0 = time.perf_counter()
    for e in range(epochs):
        t.log_metrics({k: 0.5 + e * 1e-3 for k in EPOCH_KEYS}, e)
        t.log_metrics({"best/val_balanced_accuracy": 0.5, "time/elapsed_s": float(e)}, e,
                      scope="study")
    dt = (time.perf_counter() - t0) / epochs
    t.end_trial("FINISHED")
    t.end_study("FINISHED")
    return dt


def thousand_metrics(uri: str, n: int) -> dict[str, float]:
    mlflow.set_tracking_uri(uri)
    c = MlflowClient()
    exp = c.create_experiment(f"bench1k-{os.getpid()}-{time.time_ns()}")
    out = {}
    run = c.create_run(exp)
    t0 = time.perf_counter()
    for i in range(n):
        c.log_metric(run.info.run_id, "m", float(i), step=i)
    out["one_by_one"] = time.perf_counter() - t0
    run = c.create_run(exp)
    t0 = time.perf_counter()
    ts = int(time.time() * 1000)
    ms = [Metric("m", float(i), ts, i) for i in range(n)]
    for s in range(0, n, 1000):
        c.log_batch(run.info.run_id, metrics=ms[s:s + 1000])
    out["batched"] = time.perf_counter() - t0
    run = c.create_run(exp)
    t0 = time.perf_counter()
    for i in range(n):
        c.log_metric(run.info.run_id, "m", float(i), step=i, synchronous=False)
    mlflow.flush_async_logging()
    out["async"] = time.perf_counter() - t0
    got = len(c.get_metric_history(run.info.run_id, "m"))
    assert got == n, f"async logging delivered {got}/{n}"
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=50)
    p.add_argument("--n", type=int, default=1000)
    a = p.parse_args()
    root = tempfile.mkdtemp(prefix="sl-bench-", dir="/tmp")
    os.chmod(root, 0o755)
    st = Stack(root)
    st.configure(ports={k: free_port() for k in DEFAULT_PORTS})
    try:
        cold = st.start()
        st.stop()
        warm = st.start()
        print(f"stack start: cold {cold:.1f}s (initdb included), warm {warm:.1f}s")
        os.environ.update(st.state.client_env())
        sqlite = f"sqlite:///{root}/bench-mlflow.db"
        res = {}
        for name, uri in (("server", st.state.tracking_uri), ("sqlite", sqlite)):
            per_epoch_overhead(uri, 2)  # warm-up: tables, connections
            res[f"epoch_ms_{name}"] = 1e3 * per_epoch_overhead(uri, a.epochs)
            k = thousand_metrics(uri, a.n)
            for mode, v in k.items():
                res[f"{mode}_s_{name}"] = v
            print(f"{name}: per-epoch tracking {res[f'epoch_ms_{name}']:.1f} ms; {a.n} metrics: "
                  + ", ".join(f"{m} {v:.2f}s" for m, v in k.items()))
    finally:
        st.stop()
        shutil.rmtree(root, ignore_errors=True)
    print("scarcelab uses: one MlflowClient.log_batch per epoch and scope (through the spool)")
    ratio = res["one_by_one_s_server"] / res["batched_s_server"]
    print(f"stack_start_cold_s={cold:.1f} stack_start_warm_s={warm:.1f} "
          + " ".join(f"{k}={v:.3g}" for k, v in res.items())
          + f" batch_vs_one_by_one_server={ratio:.0f} scarcelab_mode=log_batch")


if __name__ == "__main__":
    main()
