"""Training throughput and overhead shares (issue: foundation, DESIGN §5).

For each (method, arch) it times real training steps on 28x28 PneumoniaMNIST batches
(synthetic 28x28 noise when ../shared/data is absent) with the paper's batch sizes, and
splits a step into: data + augmentation (sampling, uint8->float, views), compute
(forward, backward, optimiser), and tracking (the per-epoch ``log_batch`` calls of a
real MLflow sqlite store, amortised over the steps of one epoch). Target: data +
augmentation + tracking <= 10% of step time.

    .venv/bin/python bench/steps.py [--steps 20] [--archs small_cnn,resnet18]

The last line is a key=value summary.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scarcelab.data.bundle import DatasetBundle  # noqa: E402
from scarcelab.methods import Progress, get_method  # noqa: E402
from scarcelab.models import create_model  # noqa: E402
from scarcelab.train import BatchSource, steps_per_epoch  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "medmnist"


def load_bundle() -> tuple[DatasetBundle, str]:
    from scarcelab.data import load_raw
    from scarcelab.data.splits import apply_split, make_split

    if (SHARED / "pneumoniamnist.npz").exists():
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            raw = load_raw("pneumoniamnist", SHARED)
        return apply_split(raw, make_split(raw, 400, 400, 0)), "pneumoniamnist"
    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, (4708, 1, 28, 28), dtype=np.uint8)
    y = rng.integers(0, 2, 4708)
    b = DatasetBundle(x[:400], y[:400], x[800:], x[400:800], y[400:800], x[:624], y[:624],
                      meta={"num_classes": 2, "name": "noise"})
    return b, "synthetic-noise-28x28"


def tracking_cost_per_epoch(n_metrics: int, reps: int = 20) -> float:
    """Seconds for one epoch's tracking: one trial log_batch + one study log_batch."""
    from scarcelab.tracking.mlflow_tracker import MlflowTracker

    with tempfile.TemporaryDirectory() as d:
        cwd = os.getcwd()
        os.chdir(d)
        try:
            import mlflow

            mlflow.set_tracking_uri(f"sqlite:///{d}/mlflow.db")
            tr = MlflowTracker(experiment="bench")
            tr.start_study("bench", {"scarcelab.role": "study"}, {"a": 1}, {})
            tr.start_trial(0, {"scarcelab.role": "trial"}, {"lr": 1e-3})
            metrics = {f"m/{i}": float(i) for i in range(n_metrics)}
            tr.log_metrics(metrics, 0)  # warm-up
            t0 = time.perf_counter()
            for s in range(1, reps + 1):
                tr.log_metrics(metrics, s)
                tr.log_metrics({"best/val_balanced_accuracy": 0.5, "time/elapsed_s": 1.0}, s,
                               scope="study")
            per_epoch = (time.perf_counter() - t0) / reps
            tr.end_trial("FINISHED")
            tr.end_study("FINISHED")
        finally:
            os.chdir(cwd)
    return per_epoch


def bench(method: str, arch: str, bundle: DatasetBundle, steps: int) -> dict[str, float]:
    cls = get_method(method)
    torch.manual_seed(0)
    m = cls(create_model(arch, in_channels=bundle.channels), bundle.num_classes, {})
    g = torch.Generator().manual_seed(0)
    src = BatchSource(bundle, cls, cls.batch_sizes["labeled"], cls.batch_sizes["unlabeled"],
                      torch.device("cpu"), g)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    m.train()
    t_data = t_comp = 0.0
    for s in range(steps + 2):  # 2 warm-up steps
        t0 = time.perf_counter()
        batch = src.next()
        t1 = time.perf_counter()
        out = m.step(batch, Progress(s, steps, 0))
        opt.zero_grad(set_to_none=True)
        out["loss"].backward()
        opt.step()
        m.after_optimizer_step(Progress(s, steps, 0))
        t2 = time.perf_counter()
        if s >= 2:
            t_data += t1 - t0
            t_comp += t2 - t1
    spe = steps_per_epoch(bundle, src.samples_per_step, None)
    return {"data_s": t_data / steps, "compute_s": t_comp / steps, "steps_per_epoch": spe,
            "batch": src.samples_per_step}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--archs", default="small_cnn,resnet18")
    ap.add_argument("--methods", default="fixmatch,simclr")
    args = ap.parse_args()
    bundle, source = load_bundle()
    track = tracking_cost_per_epoch(n_metrics=16)
    print(f"data: {source}  torch threads: {torch.get_num_threads()}  "
          f"tracking per epoch (sqlite, 2 log_batch calls): {track * 1000:.1f} ms")
    print(f"{'method':<10} {'arch':<10} {'batch':>5} {'steps/s':>8} {'data+aug':>9} "
          f"{'tracking':>9} {'overhead':>9}")
    worst = 0.0
    summary = []
    for arch in args.archs.split(","):
        for method in args.methods.split(","):
            steps = args.steps if arch == "small_cnn" else max(2, args.steps // 4)
            r = bench(method, arch, bundle, steps)
            step_s = r["data_s"] + r["compute_s"] + track / r["steps_per_epoch"]
            data_share = r["data_s"] / step_s
            track_share = track / r["steps_per_epoch"] / step_s
            worst = max(worst, data_share + track_share)
            print(f"{method:<10} {arch:<10} {r['batch']:>5} {1 / step_s:>8.2f} "
                  f"{data_share:>8.1%} {track_share:>8.1%} {data_share + track_share:>8.1%}")
            summary.append(f"{method}_{arch}_steps_per_s={1 / step_s:.2f}")
    print(" ".join(summary + [f"worst_overhead_share={worst:.3f}",
                              f"target_met={worst <= 0.10}"]))


if __name__ == "__main__":
    main()
