"""CPU-scale run of the "Tune It or Don't Use It" protocol on the ciFAIR-10 split of the
CIFAR-10 JPEGs: for each method an ASHA study, then 10 retrains of its best configuration
on train+val; prints mean ± std test balanced accuracy and Welch p-values against ``ce``.

    PYTHONPATH=. MLFLOW_TRACKING_URI=sqlite:////tmp/tune.db \\
        python -P bench/tune_cpu.py --methods ce,ole,cosine_ce,tvmf  # -P: bench/tracking.py
                                                                   # must not shadow tracking/

Budget (stated in docs/tune.md): small_cnn, 12 epochs, grace period 2, 8 trials,
batch sizes {10, 25, 50}, 10 retrains — far below the paper's WRN-16-8 / 500 epochs /
250 trials; the ranking it gives is a smoke-scale one.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from scipy import stats

from scarcelab.protocols.tune import TuneConfig, run_tune
from scarcelab.tracking.mlflow_tracker import MlflowTracker


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--methods", default="ce,ole,cosine_ce,tvmf")
    p.add_argument("--arch", default="small_cnn")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--grace", type=int, default=2)
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--n-final", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="")
    p.add_argument("--summarize", default="", help="comma-separated result JSONs of earlier "
                   "runs (e.g. one process per method): print Welch p-values and Table 3")
    p.add_argument("--stores", default="", help="comma-separated MLflow tracking URIs of "
                   "runs (finished or not): Table 3 of their finished retrains")
    a = p.parse_args()
    if a.stores:
        from_stores(a.stores.split(","))
        return
    if a.summarize:
        summarize(a.summarize.split(","))
        return
    torch.set_num_threads(a.threads)
    results: dict[str, dict] = {}
    for m in a.methods.split(","):
        t0 = time.time()
        cfg = TuneConfig(method=m, dataset="cifair10", arch=a.arch, epochs=a.epochs,
                         grace_period=a.grace, n_trials=a.trials, n_final=a.n_final)
        tracker = MlflowTracker(experiment="tune-cpu")
        r = run_tune(cfg, tracker)
        results[m] = {"scores": r.final_test, "best": r.best_params, "pruned": r.n_pruned,
                      "complete": r.n_complete, "wall_s": time.time() - t0,
                      "study_run": tracker.study_run_id}
        print(f"{m}: {100 * r.mean:.2f} ± {100 * r.std:.2f}  pruned {r.n_pruned}/"
              f"{r.n_pruned + r.n_complete}  best {r.best_params}  {time.time() - t0:.0f} s",
              flush=True)
    base = results.get("ce")
    for m, r in results.items():
        if base is not None and m != "ce":
            t = stats.ttest_ind(r["scores"], base["scores"], equal_var=False)
            r["welch_p_vs_ce"] = float(t.pvalue)
        print(m, json.dumps({k: v for k, v in r.items() if k != "scores"}), flush=True)
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(results, fh, indent=1)
    print("mean±std:", {m: (round(100 * float(np.mean(r["scores"])), 2),
                            round(100 * float(np.std(r["scores"], ddof=1)), 2))
                        for m, r in results.items()})


def from_stores(uris: list[str]) -> None:
    """Table 3 and Welch p-values vs ``ce`` from the retrain runs in MLflow stores, read
    through the query layer (``tracking.query.table3``)."""
    import pandas as pd

    from scarcelab.tracking.query.frame import load
    from scarcelab.tracking.query.table3 import render_table3, retrain_scores, table3

    sc = pd.concat([retrain_scores(load("tune-cpu", u)) for u in uris], ignore_index=True)
    long = table3(sc)
    base = sc[sc.method == "ce"]["score"].to_numpy()
    for m, g in sc.groupby("method"):
        v = g["score"].to_numpy()
        p = "" if m == "ce" or len(v) < 2 or len(base) < 2 else \
            f"  Welch p vs ce = {stats.ttest_ind(v, base, equal_var=False).pvalue:.3g}"
        sd = f"{100 * v.std(ddof=1):.2f}" if len(v) > 1 else "nan"
        print(f"{m}: {100 * v.mean():.2f} ± {sd} (n={len(v)}){p}")
    print(render_table3(long))


def summarize(paths: list[str]) -> None:
    import pandas as pd

    from scarcelab.tracking.query.table3 import render_table3, table3

    results: dict[str, dict] = {}
    for path in paths:
        with open(path) as fh:
            results.update(json.load(fh))
    base = results["ce"]["scores"]
    for m, r in results.items():
        p = "" if m == "ce" else \
            f"  Welch p vs ce = {stats.ttest_ind(r['scores'], base, equal_var=False).pvalue:.3g}"
        print(f"{m}: {100 * np.mean(r['scores']):.2f} ± {100 * np.std(r['scores'], ddof=1):.2f}"
              f"  (n={len(r['scores'])}, ASHA pruned {r['pruned']}/{r['pruned'] + r['complete']}"
              f", wall {r['wall_s']:.0f} s, best {r['best']}){p}")
    rows = [{"method": m, "dataset": "cifair10 (CIFAR-10 JPEG)", "study_id": r["study_run"],
             "score": s} for m, r in results.items() for s in r["scores"]]
    print(render_table3(table3(pd.DataFrame(rows))))


if __name__ == "__main__":
    main()
