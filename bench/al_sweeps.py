"""AL sweeps spread over processes: AUC mean ± std per (dataset, query size, strategy).

The same computation as ``scarcelab al`` (``scarcelab.active.loop.run_one``, so repetition
k sees the same seeds and data), without MLflow — it runs where only torch and numpy are
installed (e.g. a rented GPU box) and uses every core: each (problem, repetition) is one
task for the sweep driver's Ray pool (``tracking.sweep.pool``: every core here, or a Ray
cluster with ``--address``). Results are appended to ``--out`` (JSON lines, one per
repetition) as they finish, so a run cut short keeps what it did; ``--resume`` skips
repetitions already in the file.

    .venv/bin/python bench/al_sweeps.py --jobs 2 --reps 10 \\
        --problem honeypot:1 --problem diverging_sine:5 --strategies random margin oracle
    # image sets on a GPU: 4 processes share it
    python bench/al_sweeps.py --device cuda --jobs 4 --reps 3 --problem mnist_5k:20 \\
        --strategies random margin badge coreset

A problem is ``dataset:query_size[:key=value,...]`` with ALConfig overrides (e.g.
``cifar10_5k:200:budget=1000``); ``--encoder key=value,...`` sets the encoder of
``encoded_*`` sets (computed once in the parent, cached in ``--cache-dir``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

# Run as `python bench/al_sweeps.py`, this folder comes first on sys.path, and its
# tracking.py would shadow the repository's tracking package: put the repository first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

def _parse_kv(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in filter(None, text.split(",")):
        k, v = part.split("=", 1)
        if k == "hidden":  # hidden=24x24x12, as `scarcelab al --set` takes it
            out[k] = tuple(int(h) for h in v.split("x") if h)
            continue
        try:
            out[k] = int(v)
        except ValueError:
            try:
                out[k] = float(v)
            except ValueError:
                out[k] = v
    return out


def _problem(text: str) -> tuple[str, int, dict[str, Any]]:
    parts = text.split(":", 2)
    return parts[0], int(parts[1]), _parse_kv(parts[2]) if len(parts) > 2 else {}


_FIRST: dict[str, Any] = {}


def _load(rc: Any, args: dict[str, Any]) -> Any:
    """Per process: load the data (or read the cached encoding) once per dataset."""
    from scarcelab.active.encoded import DiskEncodingCache
    from scarcelab.active.loop import load_for_sweep

    key = json.dumps([rc.dataset, rc.overrides, args["encoder"]], sort_keys=True)
    if key not in _FIRST:
        _FIRST[key] = load_for_sweep(rc, rc.load_context(DiskEncodingCache(args["cache_dir"])))
    return _FIRST[key]


def _task(ds: str, q: int, over: dict[str, Any], strategy: str, k: int, args: dict[str, Any]
          ) -> dict[str, Any]:
    import torch

    from scarcelab.active.loop import ALRunConfig, run_one

    torch.set_num_threads(1)
    strat_params = {"tau": args["tau"]} if strategy == "oracle" else {}
    rc = ALRunConfig(strategy=strategy, dataset=ds, query_size=q, data_dir=args["data_dir"],
                     overrides=over, strategy_params=strat_params, device=args["device"],
                     encoder=args["encoder"])
    t0 = time.perf_counter()
    rep = run_one(rc, k, _load(rc, args))
    return {"dataset": ds, "query_size": q, "overrides": over, "strategy": strategy,
            "repetition": k, "auc": rep.auc, "final_accuracy": rep.accuracies[-1],
            "query_time_mean_s": float(np.mean(rep.query_times)) if rep.query_times else 0.0,
            "seconds": time.perf_counter() - t0, "labeled": len(rep.labeled)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problem", action="append", required=True)
    ap.add_argument("--strategies", nargs="+", default=["random", "margin", "badge", "coreset",
                                                        "oracle"])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="tasks at once on this machine (embedded Ray)")
    ap.add_argument("--address", default="", help="a Ray cluster (ray://head:10001) instead of "
                    "this machine; --jobs is then the cluster's")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tau", type=int, default=20, help="oracle candidates per pick")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--encoder", default="", help="encoder settings for encoded_* sets")
    ap.add_argument("--cache-dir", default=str(Path.home() / ".cache/scarcelab/encoded"))
    ap.add_argument("--out", default="bench/out/al_sweeps.jsonl")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--deadline-s", type=float, default=0.0,
                    help="stop submitting new tasks after this many seconds (0: none)")
    a = ap.parse_args()
    args = {"tau": a.tau, "data_dir": a.data_dir, "device": a.device,
            "encoder": _parse_kv(a.encoder), "cache_dir": a.cache_dir}
    problems = [_problem(p) for p in a.problem]
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done: set[str] = set()
    if a.resume and out.is_file():
        for line in out.read_text().splitlines():
            r = json.loads(line)
            done.add(json.dumps([r["dataset"], r["query_size"], r["overrides"], r["strategy"],
                                 r["repetition"]], sort_keys=True))
    # Encodings first, in the parent, so that workers only ever read the cache.
    from scarcelab.active.loop import ALRunConfig

    for ds, q, over in problems:
        if ds.startswith("encoded_"):
            t = time.perf_counter()
            data = _load(ALRunConfig("random", ds, q, a.data_dir, overrides=over,
                                     device=a.device, encoder=args["encoder"]), args)
            print(f"{ds}: {data.note} [{time.perf_counter() - t:.1f} s]", flush=True)
    # Slow strategies first: the pool's tail is then short tasks.
    order = sorted(((p, s, k) for p in problems for s in a.strategies for k in range(a.reps)),
                   key=lambda t: (t[1] != "oracle", t[2]))
    t0 = time.time()
    # The fan-out is the sweep driver's (tracking.sweep.pool: Ray, embedded on this machine
    # or a cluster with --address); each task runs in a Ray worker process, so a parent that
    # initialised CUDA (encoders) is no problem.
    from scarcelab.tracking.sweep.pool import RayPool

    gpus = (1.0 / max(1, a.jobs)) if a.device.startswith("cuda") else 0.0
    pool = RayPool(a.address or None, None if a.address else a.jobs, 1.0, gpus)
    with out.open("a") as f:
        for (ds, q, over), s, k in order:
            if json.dumps([ds, q, over, s, k], sort_keys=True) in done:
                continue
            pool.submit((ds, q, s, k), _task, ds, q, over, s, k, args)
        cancelled = 0
        stopping = False
        while len(pool):
            key, r, err = pool.next_done()
            if err is not None:
                if stopping:
                    cancelled += 1
                else:
                    print(f"FAILED {key}: {type(err).__name__}: {err}", flush=True)
                continue
            f.write(json.dumps(r) + "\n")
            f.flush()
            print(f"{r['dataset']} q={r['query_size']} {r['strategy']} rep {r['repetition']}: "
                  f"AUC {r['auc']:.4f} ({r['seconds']:.1f} s)", flush=True)
            if a.deadline_s and time.time() - t0 > a.deadline_s and not stopping:
                print("deadline reached: cancelling the tasks not yet started", flush=True)
                stopping = True
                pool.cancel_pending()
        if cancelled:
            print(f"{cancelled} tasks not run (deadline)", flush=True)
    pool.shutdown()
    summarize(out)


def summarize(path: Path) -> None:
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    groups: dict[tuple[str, int, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        key = (r["dataset"], r["query_size"], json.dumps(r["overrides"], sort_keys=True),
               r["strategy"])
        groups.setdefault(key, []).append(r)
    print("\n| dataset | q | overrides | strategy | reps | AUC mean ± std | final acc | "
          "query s | s/rep |\n|---|---|---|---|---|---|---|---|---|")
    for (ds, q, over, s), rs in sorted(groups.items()):
        au = np.array([r["auc"] for r in rs])
        sd = au.std(ddof=1) if len(au) > 1 else 0.0
        print(f"| {ds} | {q} | {over if over != '{}' else ''} | {s} | {len(rs)} | "
              f"{au.mean():.3f} ± {sd:.3f} | {np.mean([r['final_accuracy'] for r in rs]):.3f} "
              f"| {np.mean([r['query_time_mean_s'] for r in rs]):.3f} | "
              f"{np.mean([r['seconds'] for r in rs]):.1f} |")
    _ranks(rows)
    summary = [f"repetitions={len(rows)}"] + [
        f"auc_{ds}_q{q}_{s}={np.mean([r['auc'] for r in rs]):.4f}"
        for (ds, q, over, s), rs in sorted(groups.items()) if over == "{}"]
    print(" ".join(summary))


def _ranks(rows: list[dict[str, Any]]) -> None:
    """Mean ranks per problem and over every (dataset, query size, repetition) block, and a
    Friedman test over those blocks — the same views as ``scarcelab al-report``
    (``tracking.al``), when tracking is importable."""
    try:
        import pandas as pd

        from scarcelab.tracking.al import cd_blocks, rank_table
        from scarcelab.tracking.stats import friedman_test
    except ImportError as e:  # e.g. a box without MLflow: the AUC table above stands alone
        print(f"(ranks skipped: {e})")
        return
    df = pd.DataFrame(rows)
    df = df[df["overrides"].map(lambda o: not o)]  # one configuration per dataset
    if df["strategy"].nunique() < 2:
        return
    print("\nmean rank (1 = best AUC) per problem, then over all blocks:")
    print(rank_table(df).round(2).to_string())
    scores = cd_blocks(df)
    if len(scores) >= 2 and scores.shape[1] >= 3:
        stat, p = friedman_test(scores)
        print(f"Friedman over {len(scores)} blocks x {scores.shape[1]} strategies: "
              f"chi2 = {stat:.2f}, p = {p:.3g}")


if __name__ == "__main__":
    main()
