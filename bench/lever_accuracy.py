"""Fixed-budget accuracy check for a lever that changes results (issue 18).

Trains the same method from the same seed on the same split with and without a lever,
for the same wall-clock budget, through ``scarcelab.train.train_trial`` (the study's own
loop), and reports the best validation balanced accuracy, the test balanced accuracy of
that checkpoint and the steps done. The two variants run *at the same time* in two
processes (one thread each), so a loaded machine slows both alike; ``--repeats`` runs the
pair for several seeds.

    .venv/bin/python bench/lever_accuracy.py --lever weak_no_grad --budget 120

Data: PneumoniaMNIST 28x28 from ../shared/data (400 labeled / rest unlabeled); the
synthetic fallback of bench/steps.py when it is absent (then accuracies mean nothing).
Last line: ``key=value`` summary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def child(a: argparse.Namespace, on: bool, seed: int) -> dict[str, float]:
    import numpy as np
    import torch

    sys.path.insert(0, str(REPO / "bench"))
    from steps import load_bundle

    from scarcelab.methods import get_method
    from scarcelab.models import create_model
    from scarcelab.train import TrainConfig, train_trial

    torch.set_num_threads(1)
    bundle, source = load_bundle()
    torch.manual_seed(seed)
    cls = get_method(a.method)
    hp = {a.lever: True} if on else {}
    m = cls(create_model(a.arch, in_channels=bundle.channels), bundle.num_classes, hp)
    cfg = TrainConfig(max_epochs=10**6, patience=10**6, max_steps_per_epoch=a.epoch_steps,
                      batch_labeled=a.bl, batch_unlabeled=a.bu)
    res = train_trial(m, bundle, cfg, deadline=time.time() + a.budget,
                      generator=torch.Generator().manual_seed(seed),
                      probe_rng=np.random.default_rng(seed))
    return {"val": res.best_val, "test": res.best_test.get("balanced_accuracy", float("nan")),
            "steps": res.steps, "epochs": res.epochs, "data": source}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--method", default="fixmatch")
    ap.add_argument("--lever", default="weak_no_grad", help="boolean hyperparameter")
    ap.add_argument("--arch", default="small_cnn")
    ap.add_argument("--budget", type=float, default=120.0, help="seconds per trial")
    ap.add_argument("--bl", type=int, default=16)
    ap.add_argument("--bu", type=int, default=112)
    ap.add_argument("--epoch-steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=2, help="seeds 0..repeats-1")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        on, seed = a.child.split(",")
        print("RESULT " + json.dumps(child(a, on == "1", int(seed))))
        return
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "PYTHONWARNINGS": "ignore"}
    base = [sys.executable, __file__, "--method", a.method, "--lever", a.lever, "--arch",
            a.arch, "--budget", str(a.budget), "--bl", str(a.bl), "--bu", str(a.bu),
            "--epoch-steps", str(a.epoch_steps)]
    out: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    print(f"{a.method}/{a.arch} lever {a.lever}: {a.budget:.0f} s per trial, batches "
          f"{a.bl}+{a.bu}+{a.bu}, load {os.getloadavg()[0]:.1f}", flush=True)
    for seed in range(a.repeats):
        procs = {k: subprocess.Popen([*base, "--child", f"{int(k == 'on')},{seed}"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env, cwd=REPO) for k in ("off", "on")}
        for k, p in procs.items():
            so, se = p.communicate()
            line = [x for x in so.splitlines() if x.startswith("RESULT ")]
            if not line:
                raise SystemExit(f"{k} seed {seed} failed: {se[-800:]}")
            r = json.loads(line[0][7:])
            out[k].append(r)
            print(f"  seed {seed} {a.lever}={k:<3} val {r['val']:.4f} test {r['test']:.4f} "
                  f"steps {r['steps']} ({r['data']})", flush=True)
    summ = {}
    for k, rs in out.items():
        for f in ("val", "test", "steps"):
            summ[f"{k}_{f}"] = statistics.mean(r[f] for r in rs)
    summ["test_delta"] = summ["on_test"] - summ["off_test"]
    summ["steps_ratio"] = summ["on_steps"] / max(summ["off_steps"], 1)
    summ["load"] = os.getloadavg()[0]
    print(" ".join(f"{k}={v:.4g}" for k, v in summ.items()))


if __name__ == "__main__":
    main()
