"""Query time of BADGE and core-set on a 50,000 x 512 pool (target: < 1 s per query on CPU).

The pool is the whole candidate set (no 5,000-point subsample), the classifier a linear
layer over 512-d encoded features (CDALBench's setting for encoded data, 10 classes), so
core-set works in the 512-d space and BADGE on 10 x 512 gradient embeddings. The labeled
set has ``--labeled`` points: core-set must find every candidate's nearest labeled point, an
N x |L| x D matrix product (10 GFLOP at |L| = 400), so its time grows with |L|; BADGE's
does not. Each figure is the median of ``--repeats`` queries, as wall-clock time and as the
process's CPU time: on a shared machine (load far above the core count) the wall clock
mostly measures the neighbours, while single-threaded CPU time is what the query costs.

    .venv/bin/python bench/al_query.py [--pool 50000 --dim 512 --q 10 --threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from scarcelab.active.base import QueryState
from scarcelab.active.classifier import ALNet, TorchModelView
from scarcelab.active.loop import make_strategy


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pool", type=int, default=50_000)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--labeled", type=int, default=100,
                    help="labeled-set size: core-set's cost is one N x |L| x D GEMM")
    ap.add_argument("--q", type=int, nargs="+", default=[1, 10])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    rng = np.random.default_rng(0)
    n = args.pool + args.labeled
    x = rng.normal(size=(n, args.dim)).astype(np.float32)
    net = ALNet(args.dim, args.classes, hidden=())
    net.seeded_init(torch.Generator().manual_seed(0))
    labeled = np.arange(args.labeled)
    state = QueryState(x=x, labeled=labeled, y_labeled=labeled % args.classes,
                       candidates=np.arange(args.labeled, n), model=TorchModelView(net),
                       num_classes=args.classes)
    results: dict[str, float] = {}
    for name in ("badge", "coreset"):
        strat = make_strategy(name, max_candidates=None)
        for q in args.q:
            times, cpu = [], []
            for r in range(args.repeats):
                t0, c0 = time.perf_counter(), time.process_time()
                picked = strat.query(state, q, np.random.default_rng(r))
                times.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
                assert len(np.unique(picked)) == q
            med, med_cpu = statistics.median(times), statistics.median(cpu)
            results[f"{name}_q{q}_s"] = med
            results[f"{name}_q{q}_cpu_s"] = med_cpu
            print(f"{name:8s} q={q:3d} pool={args.pool}x{args.dim} |L|={args.labeled}: "
                  f"median wall {med:.3f} s, cpu {med_cpu:.3f} s "
                  f"(wall runs: {', '.join(f'{t:.3f}' for t in times)})")
    worst = max(v for k, v in results.items() if k.endswith("_cpu_s"))
    print(" ".join(f"{k}={v:.3f}" for k, v in results.items())
          + f" threads={args.threads} labeled={args.labeled} target_1s_cpu_met={worst < 1.0}")


if __name__ == "__main__":
    main()
