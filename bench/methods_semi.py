"""Training speed of the supervised and semi-supervised method zoo (issue 4).

Times real training steps (sampling + augmentation + forward/backward + optimiser +
post-step hooks) on 28x28 PneumoniaMNIST (synthetic 28x28 noise when ../shared/data is
absent), CPU, per method and backbone. small_cnn uses each method's paper batch sizes
(SSL-vs-SSL App. F.1: 64 labeled, 448 or 64 unlabeled, supcon 256). resnet18 on a CPU
takes tens of seconds per step at those sizes, so by default its batches are divided by
``--resnet-divisor`` (8: e.g. 8/56 instead of 64/448) and it runs ``--resnet-steps``
steps; the printed table states the batch used. Methods differ in forward passes per
step (fixmatch 3 views, comatch 4 + memory, ds3l a second-order meta step), which is
what the ratios against ``sup`` show.

    .venv/bin/python bench/methods_semi.py [--steps 5] [--archs small_cnn,resnet18]

The last line is a key=value summary (steps/s per method and arch).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from steps import load_bundle  # noqa: E402  (bench/steps.py: same data as the step bench)

from scarcelab.data.bundle import DatasetBundle  # noqa: E402
from scarcelab.methods import Progress, get_method  # noqa: E402
from scarcelab.models import create_model  # noqa: E402
from scarcelab.train import BatchSource, data_info  # noqa: E402

METHODS = ("sup,mixup,supcon,pseudolabel,meanteacher,mixmatch,fixmatch,flexmatch,comatch,"
           "softmatch,ds3l")


def time_steps(method: str, arch: str, bundle: DatasetBundle, steps: int, divisor: int
               ) -> tuple[float, int, int]:
    """Seconds per training step after one warm-up step, and the batch sizes used."""
    cls = get_method(method)
    bl = max(2, cls.batch_sizes["labeled"] // divisor) if cls.batch_sizes["labeled"] else 0
    bu = max(2, cls.batch_sizes["unlabeled"] // divisor) if cls.batch_sizes["unlabeled"] else 0
    torch.manual_seed(0)
    m = cls(create_model(arch, in_channels=bundle.channels), bundle.num_classes, {})
    m.on_train_start(data_info(bundle))
    src = BatchSource(bundle, cls, bl, bu, torch.device("cpu"), torch.Generator().manual_seed(0))
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    m.train()
    t0 = 0.0
    for s in range(steps + 1):
        if s == 1:
            t0 = time.perf_counter()
        prog = Progress(s, 1000, 0)
        out = m.step(src.next(), prog)
        opt.zero_grad(set_to_none=True)
        out["loss"].backward()
        opt.step()
        m.after_optimizer_step(prog)
    return (time.perf_counter() - t0) / steps, src.bl, src.bu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5, help="timed steps per method (small_cnn)")
    ap.add_argument("--resnet-steps", type=int, default=2)
    ap.add_argument("--resnet-divisor", type=int, default=8,
                    help="divide the paper batch sizes by this for resnet18")
    ap.add_argument("--archs", default="small_cnn,resnet18")
    ap.add_argument("--methods", default=METHODS)
    args = ap.parse_args()
    bundle, source = load_bundle()
    print(f"data: {source} 28x28  device: cpu  torch threads: {torch.get_num_threads()}")
    print(f"{'method':<12} {'arch':<10} {'batch L/U':>10} {'steps/s':>8} {'s/step':>8} "
          f"{'vs sup':>7}")
    summary: list[str] = []
    for arch in args.archs.split(","):
        resnet = arch != "small_cnn"
        steps = args.resnet_steps if resnet else args.steps
        divisor = args.resnet_divisor if resnet else 1
        sup_rate = None
        for method in args.methods.split(","):
            sec, bl, bu = time_steps(method, arch, bundle, steps, divisor)
            rate = 1.0 / sec
            if method == "sup":
                sup_rate = rate
            ratio = f"{sup_rate / rate:>6.1f}x" if sup_rate else "      -"
            print(f"{method:<12} {arch:<10} {f'{bl}/{bu}':>10} {rate:>8.2f} {sec:>8.3f} "
                  f"{ratio}", flush=True)
            summary.append(f"{method}_{arch}_steps_per_s={rate:.3f}")
    print(" ".join(summary))


if __name__ == "__main__":
    main()
