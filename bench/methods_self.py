"""Throughput of the self-supervised zoo, and the per-epoch linear probe's share of an epoch.

For each method and backbone it times real training steps (augmentation of the two SimCLR
views, forward, backward, Adam, momentum/queue updates) on 28x28 PneumoniaMNIST from
../shared/data (random 28x28 noise when that folder is absent), then times one
``evaluate`` (embed labeled/val/test once, fit the 10-penalty probe) and reports it as a
share of one epoch (steps to see |L ∪ U| once at the benchmark batch size, plus the probe).

CPU note: resnet18 on a CPU is slow, so by default it runs fewer steps on a smaller batch
(64 instead of the paper's 256); its steps/s are for that batch, not comparable with
small_cnn's. Timings on a shared machine vary run to run; compare methods within one run.
One torch thread by default (``--threads``), so figures are per core.

    .venv/bin/python bench/methods_self.py [--steps 5] [--archs small_cnn,resnet18]

The last line is a key=value summary.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from steps import load_bundle  # noqa: E402  (bench/steps.py: same data as the step bench)

from scarcelab.data.bundle import DatasetBundle  # noqa: E402
from scarcelab.methods import Progress, get_method  # noqa: E402
from scarcelab.models import create_model  # noqa: E402
from scarcelab.train import BatchSource, TrainConfig, evaluate, steps_per_epoch  # noqa: E402

METHODS = "simclr,moco,swav,byol,simsiam,dino,barlowtwins"


def time_steps(method: str, arch: str, bundle: DatasetBundle, steps: int,
               batch: int) -> tuple[float, torch.nn.Module]:
    cls = get_method(method)
    torch.manual_seed(0)
    m = cls(create_model(arch, in_channels=bundle.channels), bundle.num_classes, {})
    from scarcelab.train import data_info

    m.on_train_start(data_info(bundle))
    src = BatchSource(bundle, cls, 0, batch, torch.device("cpu"), torch.Generator().manual_seed(0))
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    m.train()
    elapsed = 0.0
    for s in range(steps + 1):  # 1 warm-up step
        t0 = time.perf_counter()
        prog = Progress(s, steps + 1, 0)
        out = m.step(src.next(), prog)
        opt.zero_grad(set_to_none=True)
        out["loss"].backward()
        opt.step()
        m.after_optimizer_step(prog)
        if s:
            elapsed += time.perf_counter() - t0
    return steps / elapsed, m


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5, help="timed steps for small_cnn")
    ap.add_argument("--resnet-steps", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--resnet-batch", type=int, default=64)
    ap.add_argument("--archs", default="small_cnn,resnet18")
    ap.add_argument("--methods", default=METHODS)
    ap.add_argument("--probe-archs", default="small_cnn",
                    help="archs whose probe (evaluate) is timed too; resnet18's costs minutes")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1 = per-core figures, steadier on a shared machine)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    bundle, source = load_bundle()
    print(f"data: {source}  torch threads: {torch.get_num_threads()}  "
          f"labeled/val/test/unlabeled: {len(bundle.labeled_y)}/{len(bundle.val_y)}/"
          f"{len(bundle.test_y)}/{len(bundle.unlabeled_x)}")
    print(f"{'method':<12} {'arch':<10} {'batch':>5} {'steps/s':>8} {'epoch_s':>8} "
          f"{'probe_s':>8} {'probe share':>11}")
    summary = []
    worst_share = 0.0
    for arch in args.archs.split(","):
        small = arch == "small_cnn"
        batch = args.batch if small else args.resnet_batch
        steps = args.steps if small else args.resnet_steps
        for method in args.methods.split(","):
            sps, m = time_steps(method, arch, bundle, steps, batch)
            epoch_train_s = steps_per_epoch(bundle, batch, None) / sps
            probe_s = share = float("nan")
            if arch in args.probe_archs.split(","):
                t0 = time.perf_counter()
                evaluate(m, bundle, TrainConfig(), np.random.default_rng(0))
                probe_s = time.perf_counter() - t0
                share = probe_s / (epoch_train_s + probe_s)
                worst_share = max(worst_share, share)
            print(f"{method:<12} {arch:<10} {batch:>5} {sps:>8.2f} {epoch_train_s:>8.1f} "
                  f"{probe_s:>8.2f} {share:>10.1%}", flush=True)
            summary.append(f"{method}_{arch}_steps_per_s={sps:.2f}")
    print(" ".join(summary + [f"worst_probe_share={worst_share:.3f}"]))


if __name__ == "__main__":
    main()
