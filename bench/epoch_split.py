"""Where one epoch of a small medical study goes, in process, on any device (issue 40 item 3).

Trains BreastMNIST (the study's default split) with FixMatch and SimCLR at the paper's
batch sizes through ``train_trial`` — the study's own loop, with the C-Score diagnostics
for FixMatch and a best-checkpoint snapshot on every new best epoch, as the search takes
them — and splits the wall time of the evaluated epochs into

    train   the optimiser steps (batch drawing and augmentation included)
    eval    validation + test evaluation, the probe's fit excluded
    probe   the linear probe (fit and probabilities; self-supervised methods)
    diag    the C-Score diagnostics (semi-supervised methods)
    ckpt    the best-checkpoint snapshot

per evaluated epoch (ms; ``--clock cpu``: CPU ms), median over the epochs after the first
two (warm-up). On CUDA
the device is synchronised at each phase boundary so that a phase is charged its own
kernels (4 synchronisations per epoch, beside the loop's own). Tracking is not in here
(MLflow may be absent where this runs): bench/study_overhead.py measures it on a real
store. ``--code DIR`` runs another checkout's scarcelab (a "before" row); ``--set`` passes
``TrainConfig`` settings the checkout knows (e.g. ``probe_solver=torch,eval_every_steps=8``).

    OMP_NUM_THREADS=1 python bench/epoch_split.py [--device cuda] [--epochs 30]
        [--set probe_solver=torch] [--code /path/to/old/checkout]

The last line is a key=value summary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "medmnist"


def _parse_set(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in filter(None, text.split(",")):
        k, v = part.split("=", 1)
        out[k] = json.loads(v) if v[:1].isdigit() or v in ("true", "false") else v
    return out


class Phases:
    """Wall seconds per phase and epoch, the device synchronised at each boundary."""

    def __init__(self, device: str, clock: Any) -> None:
        import torch

        self.clock = clock
        self.sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
        self.cur: dict[str, float] = {}
        self.epochs: list[dict[str, float]] = []

    def timed(self, fn: Any, name: str) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            self.sync()
            t0 = self.clock()
            try:
                return fn(*a, **k)
            finally:
                self.sync()
                self.cur[name] = self.cur.get(name, 0.0) + self.clock() - t0
        return wrapper


def run(method: str, a: argparse.Namespace, settings: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    import torch

    import scarcelab.probe as probe_mod
    import scarcelab.train as train_mod
    from scarcelab.data import load_raw
    from scarcelab.data.splits import apply_split, make_split
    from scarcelab.methods import get_method
    from scarcelab.metrics.diagnostics import DiagnosticsConfig, EpochDiagnostics
    from scarcelab.models import create_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw = load_raw("breastmnist", str(a.data_dir))
    b = apply_split(raw, make_split(raw, None, None, 0, False, "auto", 1.0))
    cls = get_method(method)
    arch = a.arch or ("resnet18" if a.device.startswith("cuda") else "small_cnn")
    torch.manual_seed(0)
    m = cls(create_model(arch, in_channels=b.channels), b.num_classes, dict(cls.defaults))
    known = set(train_mod.TrainConfig.__dataclass_fields__)
    cfg = train_mod.TrainConfig(
        max_epochs=a.epochs, patience=10**9, batch_labeled=cls.batch_sizes["labeled"],
        batch_unlabeled=cls.batch_sizes["unlabeled"], device=a.device,
        class_weights="balanced", **{k: v for k, v in settings.items() if k in known})
    clock = time.process_time if a.clock == "cpu" else time.perf_counter
    ph = Phases(a.device, clock)
    saved = {}
    hooks = [(train_mod, "evaluate", "eval_all"), (train_mod, "snapshot", "ckpt")]
    for owner_name, attr in (("LinearProbe", "fit"), ("LinearProbe", "predict_proba"),
                             ("TorchLinearProbe", "fit"), ("TorchLinearProbe", "proba")):
        owner = getattr(probe_mod, owner_name, None)
        if owner is not None:
            hooks.append((owner, attr, "probe"))
    for owner, attr, name in hooks:
        saved[(owner, attr)] = getattr(owner, attr)
        setattr(owner, attr, ph.timed(getattr(owner, attr), name))
    callbacks: list[Any] = []
    if cls.family == "semi":
        diag = EpochDiagnostics(b, a.device, DiagnosticsConfig(n_unlabeled=512, seed=0))
        callbacks.append(train_mod.Diagnostics(ph.timed(diag, "diag")))
    best = [-1.0]
    marks = [clock()]

    def on_epoch(rep: Any, improved: bool, snap: Any) -> None:
        if rep.val_balanced_accuracy > best[0]:  # what the search keeps
            best[0] = rep.val_balanced_accuracy
            snap()
        ph.sync()
        now = clock()
        ph.cur["wall"] = now - marks[-1]
        ph.cur["steps"] = rep.metrics["time/steps"]
        marks.append(now)
        ph.epochs.append(ph.cur)
        ph.cur = {}

    callbacks.append(train_mod.OnEpochEnd(on_epoch))
    t0 = clock()
    try:
        train_mod.train_trial(m, b, cfg, deadline=time.time() + 3600,
                              generator=torch.Generator().manual_seed(0),
                              probe_rng=np.random.default_rng(0), callbacks=callbacks)
    finally:
        for (owner, attr), fn in saved.items():
            setattr(owner, attr, fn)
    total = clock() - t0
    rows = ph.epochs[2:] or ph.epochs
    for r in rows:
        r["eval"] = r.get("eval_all", 0.0) - r.get("probe", 0.0)
        r["train"] = r["wall"] - r.get("eval_all", 0.0) - r.get("diag", 0.0) - r.get(
            "ckpt", 0.0)
    out = {"method": method, "arch": arch, "device": a.device, "evaluations": len(ph.epochs),
           "steps_per_eval": statistics.median(r["steps"] for r in rows), "total_s": total,
           "epoch_ms": 1e3 * total / a.epochs,  # every epoch, evaluated or not
           "settings": {k: v for k, v in settings.items() if k in known}}
    for k in ("wall", "train", "eval", "probe", "diag", "ckpt"):
        out[f"{k}_ms"] = 1e3 * statistics.median(r.get(k, 0.0) for r in rows)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--arch", default="", help="default: resnet18 on cuda, small_cnn on cpu")
    ap.add_argument("--methods", default="fixmatch,simclr")
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--set", default="", help="TrainConfig settings, k=v,k=v")
    ap.add_argument("--code", type=Path, default=ROOT, help="checkout whose scarcelab runs")
    ap.add_argument("--data-dir", type=Path, default=SHARED)
    ap.add_argument("--label", default="")
    ap.add_argument("--clock", default="wall", choices=("wall", "cpu"),
                    help="cpu: this process's CPU seconds (a loaded CPU machine's wall "
                    "clock measures its neighbours)")
    a = ap.parse_args()
    sys.path.insert(0, str(a.code.resolve()))
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    settings = _parse_set(a.set)
    kv = []
    for method in a.methods.split(","):
        r = run(method, a, settings)
        print(f"{a.label or a.code.name} {method} ({r['arch']}, {r['device']}, "
              f"{r['settings']}): {r['evaluations']} evaluations, "
              f"{r['steps_per_eval']:.0f} steps each; per evaluated epoch ms: "
              + ", ".join(f"{k} {r[f'{k}_ms']:.1f}" for k in
                          ("wall", "train", "eval", "probe", "diag", "ckpt"))
              + f"; train share {r['train_ms'] / r['wall_ms']:.3f}; all {a.epochs} epochs "
              f"{r['total_s']:.1f} s ({r['epoch_ms']:.1f} ms each)", flush=True)
        kv += [f"{method}_{k}={r[k]:.1f}" for k in r if k.endswith("_ms")]
        kv.append(f"{method}_train_share={r['train_ms'] / r['wall_ms']:.3f}")
    print(f"label={a.label or a.code.name} device={a.device} " + " ".join(kv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
