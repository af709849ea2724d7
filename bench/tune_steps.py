"""Per-step cost of the "Tune It or Don't Use It" methods, and a short run showing that each
trains (its training loss falls), to size the results suite (issue 23).

For each (method, arch): the ``trainval`` split of ``cifair10`` (500 images, 32×32) with
the protocol's pieces — channel standardisation with trainval statistics
(``protocols.tune.build_method``), the dataset's augmentation (``deic_shift_hflip``), SGD
with momentum 0.9 and per-step cosine annealing (``train.make_optimizer``) at gem's default
lr 0.01 / weight decay 1e-3 (``gradl2``: its own defaults, weight decay 0), batch 25,
``scattering`` at J = 2 — and ``--steps`` optimiser steps after two warm-up steps (not
timed, not counted). Reported per step: wall and process CPU time (``time.process_time``),
and the mean training loss (the method's labeled term: CE, or the cosine loss) over the
first and the last fifth of the steps.

    OMP_NUM_THREADS=1 nice -n 10 python bench/tune_steps.py --archs small_cnn,wrn16_8 \\
        --steps 60,20 --out /tmp/tune_steps.json

Falls back to 32×32 synthetic noise (10 classes) when ../shared/data is absent; the last
line is a key=value summary.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scarcelab.data.bundle import DatasetBundle, RawDataset  # noqa: E402
from scarcelab.methods import Progress, get_method  # noqa: E402
from scarcelab.protocols.tune import build_method, prepare  # noqa: E402
from scarcelab.train import BatchSource, make_optimizer  # noqa: E402

METHODS = "ce,gradl2,cosine,harmonic,fconv,dsk,scattering"


def load() -> tuple[RawDataset, DatasetBundle, np.ndarray, np.ndarray, str]:
    from scarcelab.data import load_raw

    try:
        raw = load_raw("cifair10")
        source = "cifair10 (CIFAR-10 JPEGs, DEIC split)"
    except Exception as e:  # noqa: BLE001 - a clone without ../shared/data
        rng = np.random.default_rng(0)
        x = rng.integers(0, 255, (700, 3, 32, 32), dtype=np.uint8)
        y = np.arange(700) % 10
        raw = RawDataset(name="noise", train_x=x[:300], train_y=y[:300], val_x=x[300:500],
                         val_y=y[300:500], test_x=x[500:], test_y=y[500:], num_classes=10,
                         class_names=[str(i) for i in range(10)], source="synthetic noise")
        source = f"synthetic noise 32x32 ({e})"
    _, final, mean, std = prepare(raw)
    return raw, final, mean, std, source


def run(method: str, arch: str, steps: int, raw: RawDataset, bundle: DatasetBundle,
        mean: np.ndarray, std: np.ndarray) -> dict[str, float]:
    cls = get_method(method)
    torch.manual_seed(0)
    hp = {"J": 2} if method == "scattering" else {}
    m = build_method(cls, arch, raw, mean, std, hp)
    g = torch.Generator().manual_seed(0)
    src = BatchSource(bundle, cls, 25, 0, torch.device("cpu"), g,
                      labeled_views=("deic_shift_hflip",))
    opt, sched = make_optimizer(m, steps + 2)
    m.train()
    wall = cpu = 0.0
    losses: list[float] = []
    for s in range(steps + 2):
        w0, c0 = time.perf_counter(), time.process_time()
        batch = src.next()
        out = m.step(batch, Progress(s, steps + 2, 0))
        opt.zero_grad(set_to_none=True)
        out["loss"].backward()
        opt.step()
        sched.step()
        if s >= 2:
            wall += time.perf_counter() - w0
            cpu += time.process_time() - c0
            losses.append(float(out.get("loss_labeled", out["loss"]).detach()))
    k = max(1, steps // 5)
    return {"wall_s": wall / steps, "cpu_s": cpu / steps, "loss_first": float(np.mean(losses[:k])),
            "loss_last": float(np.mean(losses[-k:])), "steps": steps,
            "finite": bool(np.isfinite(losses).all()),
            "params": sum(p.numel() for p in m.parameters())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--methods", default=METHODS)
    ap.add_argument("--archs", default="small_cnn,wrn16_8")
    ap.add_argument("--steps", default="60,20", help="steps per arch, comma-separated")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    archs = a.archs.split(",")
    steps = [int(s) for s in a.steps.split(",")]
    if len(steps) == 1:
        steps = steps * len(archs)
    if len(steps) != len(archs):
        raise SystemExit(f"--steps: give one count or one per arch ({len(archs)}), got {a.steps}")
    raw, bundle, mean, std, source = load()
    print(f"data: {source}; {len(bundle.labeled_y)} images; torch threads "
          f"{torch.get_num_threads()}")
    print(f"{'method':<11} {'arch':<10} {'params':>9} {'steps':>5} {'wall/step':>10} "
          f"{'cpu/step':>9} {'loss first':>10} {'loss last':>9}")
    results, summary = [], []
    for arch, n in zip(archs, steps, strict=True):
        for method in a.methods.split(","):
            r = run(method, arch, n, raw, bundle, mean, std)
            r.update(method=method, arch=arch)
            results.append(r)
            print(f"{method:<11} {arch:<10} {r['params'] / 1e6:>8.2f}M {n:>5} "
                  f"{r['wall_s']:>9.3f}s {r['cpu_s']:>8.3f}s {r['loss_first']:>10.3f} "
                  f"{r['loss_last']:>9.3f}", flush=True)
            summary.append(f"{method}_{arch}_cpu_s_per_step={r['cpu_s']:.3f}")
            summary.append(f"{method}_{arch}_loss_down={r['loss_last'] < r['loss_first']}")
    if a.out:
        Path(a.out).write_text(json.dumps({"source": source, "results": results}, indent=1))
    print(" ".join(summary))


if __name__ == "__main__":
    main()
