"""Tracking costs: stack start time, per-epoch tracking overhead (server vs embedded sqlite),
1,000 metrics logged one by one vs batched vs asynchronously, and (``--part concurrent``)
the server's write throughput with concurrent studies, 1 vs N ``mlflow server`` workers.

    .venv/bin/python bench/tracking.py [--epochs 50] [--n 1000]
    .venv/bin/python bench/tracking.py --part concurrent --writers 8 --workers 1,4

Starts a private stack on free ports (timed cold, then stopped and timed warm), measures,
stops it. The last line is the summary (DESIGN §5). Numbers depend heavily on machine load:
run it on an idle machine, and compare ratios rather than absolute times.

The concurrent part starts ``--writers`` processes, each a tracker with one study and one
trial logging epochs back to back (14 trial metrics + 2 study metrics per epoch, the
supervised study's keys) for ``--seconds``, first with the delivery thread off (every
write on the training thread, as remote tracking was before issue 40), then on (batched
every 2 s; the queue is cut to ``--queue`` operations so that back-pressure shows the
sustained rate within seconds). Each writer's epochs are counted until its records are
all in the server (``flush``), so the aggregate epochs/s is what the server absorbed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
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


def writer(uri: str, mode: str, seconds: float, folder: str, index: int) -> None:
    """One concurrent study (a process of its own): wait for ``go``, log epochs for
    ``seconds``, wait until all of them are in the server, write what it did."""
    mlflow.set_tracking_uri(uri)
    d = Path(folder)
    t = MlflowTracker(experiment="bench-concurrent", spool_root=d / f"spool-{index}")
    t.start_study(f"w{index}", {"scarcelab.role": "study"}, {"writer": index}, {})
    t.start_trial(0, {"scarcelab.role": "trial"}, {"lr": 0.1})
    (d / f"ready-{index}").touch()
    while not (d / "go").exists():
        time.sleep(0.01)
    n, blocked = 0, 0.0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a = time.perf_counter()
        t.log_metrics({k: 0.5 + n * 1e-4 for k in EPOCH_KEYS}, n)
        t.log_metrics({"best/val_balanced_accuracy": 0.5, "time/elapsed_s": float(n)}, n,
                      scope="study")
        blocked += time.perf_counter() - a
        n += 1
    t.flush()  # what it logged is in the server
    total = time.perf_counter() - t0
    t.end_trial("FINISHED")
    t.end_study("FINISHED")
    (d / f"out-{index}.json").write_text(json.dumps(
        {"epochs": n, "total_s": total, "blocked_ms_per_epoch": 1e3 * blocked / max(1, n)}))


def concurrent(st: Stack, writers: int, workers: list[int], seconds: float,
               queue: int) -> dict[str, float]:
    """Aggregate epochs/s of ``writers`` concurrent studies per worker count and mode."""
    res: dict[str, float] = {}
    MlflowClient(st.state.tracking_uri).create_experiment("bench-concurrent")
    for w in workers:
        st.state.mlflow_workers = w
        st.stop_mlflow()
        st.start_mlflow()
        for mode in ("sync", "thread"):
            d = Path(tempfile.mkdtemp(prefix="sl-conc-"))
            env = {**os.environ, **st.state.client_env(), "SCARCELAB_SYSTEM_METRICS": "0",
                   "SCARCELAB_TRACKING_THREAD": "0" if mode == "sync" else "1",
                   "SCARCELAB_TRACKING_QUEUE": str(queue), "OMP_NUM_THREADS": "1"}
            procs = [subprocess.Popen(
                [sys.executable, __file__, "--writer", st.state.tracking_uri, mode,
                 str(seconds), str(d), str(i)], env=env) for i in range(writers)]
            end = time.time() + 600
            while len(list(d.glob("ready-*"))) < writers and time.time() < end:
                if any(p.poll() not in (None, 0) for p in procs):
                    raise RuntimeError("a writer failed")
                time.sleep(0.2)
            (d / "go").touch()
            for p in procs:
                if p.wait(timeout=900) != 0:
                    raise RuntimeError("a writer failed")
            outs = [json.loads((d / f"out-{i}.json").read_text()) for i in range(writers)]
            shutil.rmtree(d, ignore_errors=True)
            eps = sum(o["epochs"] for o in outs) / max(o["total_s"] for o in outs)
            blocked = sum(o["blocked_ms_per_epoch"] for o in outs) / writers
            res[f"epochs_per_s_w{w}_{mode}"] = eps
            res[f"blocked_ms_w{w}_{mode}"] = blocked
            print(f"{writers} writers, {w} server worker(s), {mode}: {eps:.1f} epochs/s in "
                  f"all, the training thread blocked {blocked:.2f} ms per epoch", flush=True)
    return res


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=50)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--part", choices=["basic", "concurrent", "all"], default="basic")
    p.add_argument("--writers", type=int, default=8)
    p.add_argument("--workers", default="1,4", help="server worker counts to compare")
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--queue", type=int, default=200)
    p.add_argument("--writer", nargs=5, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.writer:
        writer(a.writer[0], a.writer[1], float(a.writer[2]), a.writer[3], int(a.writer[4]))
        return
    root = tempfile.mkdtemp(prefix="sl-bench-", dir="/tmp")
    os.chmod(root, 0o755)
    st = Stack(root)
    st.configure(ports={k: free_port() for k in DEFAULT_PORTS})
    res: dict[str, float] = {}
    cold = warm = float("nan")
    try:
        cold = st.start()
        if a.part != "concurrent":
            st.stop()
            warm = st.start()
            print(f"stack start: cold {cold:.1f}s (initdb included), warm {warm:.1f}s")
        os.environ.update(st.state.client_env())
        if a.part in ("basic", "all"):
            sqlite = f"sqlite:///{root}/bench-mlflow.db"
            for name, uri in (("server", st.state.tracking_uri), ("sqlite", sqlite)):
                per_epoch_overhead(uri, 2)  # warm-up: tables, connections
                res[f"epoch_ms_{name}"] = 1e3 * per_epoch_overhead(uri, a.epochs)
                k = thousand_metrics(uri, a.n)
                for mode, v in k.items():
                    res[f"{mode}_s_{name}"] = v
                print(f"{name}: per-epoch tracking {res[f'epoch_ms_{name}']:.1f} ms; {a.n} "
                      "metrics: " + ", ".join(f"{m} {v:.2f}s" for m, v in k.items()))
        if a.part in ("concurrent", "all"):
            res.update(concurrent(st, a.writers, [int(w) for w in a.workers.split(",")],
                                  a.seconds, a.queue))
    finally:
        st.stop()
        shutil.rmtree(root, ignore_errors=True)
    print("scarcelab uses: one MlflowClient.log_batch per epoch and scope (through the spool; "
          "a remote server's merged per run every 2 s on the delivery thread)")
    extra = ""
    if "one_by_one_s_server" in res:
        extra = (f" batch_vs_one_by_one_server="
                 f"{res['one_by_one_s_server'] / res['batched_s_server']:.0f}")
    print(f"stack_start_cold_s={cold:.1f} stack_start_warm_s={warm:.1f} "
          + " ".join(f"{k}={v:.3g}" for k, v in res.items())
          + extra + " scarcelab_mode=log_batch")


if __name__ == "__main__":
    main()
