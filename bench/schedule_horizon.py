"""How far a budgeted study's schedules get, ``--schedule-horizon epochs`` vs ``budget``
(issue 41 item 4; docs/methods.md, "Schedules and budgets").

Runs one real study per method and mode on BreastMNIST (small_cnn, CPU, one thread, a
CPU-clock budget so the machine's other load does not change how much it trains), one
trial each (``--max-trials 1``: the trial has the whole budget), and prints what the last
evaluated epoch logged: steps, ``train/rampup`` (the epoch's mean unlabeled-weight ramp,
DS3L's as λU·ramp), ``train/lr`` after the last step and its share of the trial's (sampled)
base ``lr``, and ``train/progress`` (budget mode only). No MLflow: an in-memory tracker.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/schedule_horizon.py \\
        --data-dir ../shared/data/medmnist --minutes 1 --methods mixmatch,meanteacher
"""

from __future__ import annotations

import argparse
import os


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default="../shared/data/medmnist")
    ap.add_argument("--dataset", default="breastmnist")
    ap.add_argument("--minutes", type=float, default=1.0)
    ap.add_argument("--methods", default="mixmatch,meanteacher,pseudolabel,ds3l")
    ap.add_argument("--modes", default="epochs,budget")
    ap.add_argument("--max-epochs", type=int, default=200)
    ap.add_argument("--patience", type=int, default=10**6,
                    help="default: off, so that the budget is what ends the trial")
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from scarcelab.protocols.search import StudyConfig, run_study
    from scarcelab.tracker import InMemoryTracker

    print("| method | horizon | steps | epochs | stopped | train/rampup (last epoch) | "
          "train/lr (share of base) | train/progress |")
    print("|---|---|---|---|---|---|---|---|")
    for name in a.methods.split(","):
        for mode in a.modes.split(","):
            t = InMemoryTracker()
            run_study(StudyConfig(method=name, dataset=a.dataset, data_dir=a.data_dir,
                                  budget_minutes=a.minutes, budget_clock="cpu",
                                  max_epochs=a.max_epochs, patience=a.patience,
                                  max_trials=1, arch="small_cnn",
                                  device="cpu", diag_samples=0, schedule_horizon=mode), t)
            tr = t.trials[-1]
            base_lr = float(tr.params["lr"])  # the trial's (sampled) learning rate
            lr = tr.last("train/lr")
            prog = tr.last("train/progress") if mode == "budget" else float("nan")
            steps = sum(v for _, v in tr.history("time/steps"))
            stopped = tr.tags.get("scarcelab.stopped", "")
            print(f"| {name} | {mode} | {steps:.0f} | {tr.last('epochs'):.0f} | {stopped} | "
                  f"{tr.last('train/rampup'):.4f} | {lr:.3g} ({lr / base_lr:.3f}) | "
                  f"{prog:.3f} |", flush=True)


if __name__ == "__main__":
    main()
