"""The per-epoch linear probe: the torch solver against scikit-learn (issue 40 item 3).

For each case — real encoder features of BreastMNIST and PneumoniaMNIST (the studies'
default splits, ../shared/data) from a randomly initialised and from a briefly trained
(SimCLR, ``--train-steps`` steps) encoder, plus synthetic Gaussian blobs with 3 and 9
classes — and each probe seed, the same 10 penalties are fitted three ways:

    sklearn   the production probe (``LinearProbe``: lbfgs, tol 1e-4, warm-started path)
    exact     scikit-learn solving the same objective to its optimum (newton-cholesky,
              tol 1e-10, one fit per penalty): the reference of the objective itself
    torch     ``TorchLinearProbe`` (batched Newton, or L-BFGS past NEWTON_MAX_PARAMS)

and the chosen ``C``, the validation and the test balanced accuracy are compared (the
issue's criterion: same ``C``, |Δ| <= 1e-3). Times are the per-epoch probe's (fit and the
validation + test probabilities; process CPU seconds on the CPU, wall on CUDA), median
over the seeds; ``--dtype float32`` measures what single precision would change.

    OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python bench/probe_solver.py [--device cuda]
        [--archs small_cnn,resnet18] [--seeds 10]

The last line is a key=value summary.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scarcelab.metrics import balanced_accuracy  # noqa: E402
from scarcelab.probe import (  # noqa: E402
    LinearProbe,
    TorchLinearProbe,
    draw_penalties,
)

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "medmnist"


def real_features(dataset: str, arch: str, train_steps: int, data_dir: Path,
                  device: str) -> dict[str, dict[str, np.ndarray]]:
    """Features of the study's default split, from a random and a briefly trained
    encoder (SimCLR steps through the study's own loop)."""
    from scarcelab.data import load_raw
    from scarcelab.data.splits import apply_split, make_split
    from scarcelab.methods import get_method
    from scarcelab.models import create_model
    from scarcelab.train import Budget, TrainConfig, _EpochLoop, forward_images

    with warnings.catch_warnings():  # the study's default split (protocols.search's
        warnings.simplefilter("ignore")  # prepare_data, without importing Optuna)
        raw = load_raw(dataset, str(data_dir))
    b = apply_split(raw, make_split(raw, None, None, 0, False, "auto", 1.0))
    out = {}
    for enc, steps in (("random", 0), ("trained", train_steps)):
        torch.manual_seed(0)
        cls = get_method("simclr")
        m = cls(create_model(arch, in_channels=b.channels), b.num_classes, dict(cls.defaults))
        if steps:
            cfg = TrainConfig(max_epochs=10**6, batch_labeled=0, batch_unlabeled=128,
                              device=device)
            loop = _EpochLoop(m, b, cfg, Budget(1e9), torch.Generator().manual_seed(0),
                              np.random.default_rng(0))
            done, epoch = 0, 0
            while done < steps:
                loop.spe = min(loop.spe, steps - done)
                done += loop._steps(epoch).n
                epoch += 1
        m.eval()
        dev = torch.device(device)
        f = {k: forward_images(m.features, getattr(b, f"{k}_x"), 512, dev)
             for k in ("labeled", "val", "test")}
        out[f"{dataset}/{arch}/{enc}"] = {
            "fl": f["labeled"], "yl": b.labeled_y, "fv": f["val"], "yv": b.val_y,
            "ft": f["test"], "yt": b.test_y, "k": b.num_classes}
    return out


def blobs(k: int, d: int = 128, n: int = 450, seed: int = 0) -> dict[str, np.ndarray]:
    """Overlapping Gaussian classes (one class rarer than the others), split 1:1:2."""
    rng = np.random.default_rng(seed)
    p = np.ones(k)
    p[0] = 0.3
    y = rng.choice(k, 4 * n, p=p / p.sum())
    x = (rng.normal(0, 0.35, (k, d))[y] + rng.normal(0, 1, (4 * n, d))).astype(np.float32)
    return {"fl": x[:n], "yl": y[:n], "fv": x[n:2 * n], "yv": y[n:2 * n], "ft": x[2 * n:],
            "yt": y[2 * n:], "k": k}


def exact(c: dict[str, Any], rng: np.random.Generator, balanced: bool
          ) -> tuple[float, float, float]:
    """scikit-learn at the optimum of every penalty; the probe's selection rule."""
    from sklearn.linear_model import LogisticRegression
    from threadpoolctl import threadpool_limits

    fl, fv, ft = (c[k].astype(np.float64) for k in ("fl", "fv", "ft"))
    mean, std = fl.mean(0), fl.std(0) + 1e-6
    best, out = -1.0, (0.0, 0.0, 0.0)
    for cc in draw_penalties(rng, 10):
        clf = LogisticRegression(C=cc, tol=1e-10, max_iter=100, solver="newton-cholesky",
                                 class_weight="balanced" if balanced else None)
        with warnings.catch_warnings(), threadpool_limits(limits=1, user_api="blas"):
            warnings.simplefilter("ignore")
            clf.fit((fl - mean) / std, c["yl"])
        s = balanced_accuracy(c["yv"], clf.predict((fv - mean) / std))
        if s > best:
            best = s
            out = (float(cc), s, balanced_accuracy(c["yt"], clf.predict((ft - mean) / std)))
    return out


def run_probe(kind: str, c: dict[str, Any], seed: int, balanced: bool, device: str,
              dtype: torch.dtype) -> tuple[tuple[float, float, float], float]:
    """(C, val, test balanced accuracy) and the seconds of one per-epoch probe."""
    cpu = device == "cpu"
    clock = time.process_time if cpu else time.perf_counter
    if kind == "sklearn":
        t0 = clock()
        p: Any = LinearProbe(c["k"], balanced=balanced).fit(
            c["fl"], c["yl"], c["fv"], c["yv"], np.random.default_rng(seed))
        pv, pt = p.predict_proba(c["fv"]), p.predict_proba(c["ft"])
        dt = clock() - t0
    else:
        fl, fv, ft = (torch.as_tensor(c[k]).to(device) for k in ("fl", "fv", "ft"))
        if not cpu:
            torch.cuda.synchronize()
        t0 = clock()
        p = TorchLinearProbe(c["k"], balanced=balanced, dtype=dtype).fit(
            fl, c["yl"], fv, c["yv"], np.random.default_rng(seed))
        both = torch.cat([p.proba(fv), p.proba(ft)]).cpu().numpy()
        dt = clock() - t0
        pv, pt = both[:len(fv)], both[len(fv):]
    return (float(p.C), balanced_accuracy(c["yv"], pv.argmax(1)),
            balanced_accuracy(c["yt"], pt.argmax(1))), dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--archs", default="small_cnn")
    ap.add_argument("--datasets", default="breastmnist,pneumoniamnist")
    ap.add_argument("--data-dir", type=Path, default=SHARED)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--train-steps", type=int, default=30)
    ap.add_argument("--dtype", default="float64", choices=("float64", "float32"))
    ap.add_argument("--no-exact", action="store_true", help="skip the slow reference")
    a = ap.parse_args()
    torch.set_num_threads(1)
    dtype = getattr(torch, a.dtype)
    cases: dict[str, dict[str, Any]] = {}
    if (a.data_dir / "breastmnist.npz").exists():
        for ds in a.datasets.split(","):
            for arch in a.archs.split(","):
                cases.update(real_features(ds, arch, a.train_steps, a.data_dir, a.device))
    else:
        print(f"no real data under {a.data_dir}: synthetic cases only")
    cases["blobs3"] = blobs(3)
    cases["blobs9"] = blobs(9)
    rows = []
    for name, c in cases.items():
        real = not name.startswith("blobs")
        for seed in range(a.seeds):
            sk, t_sk = run_probe("sklearn", c, seed, True, "cpu", dtype)
            to, t_to = run_probe("torch", c, seed, True, a.device, dtype)
            ex = (float("nan"),) * 3 if a.no_exact else exact(c, np.random.default_rng(seed),
                                                              True)
            rows.append({"case": name, "real": real, "seed": seed, "sk": sk, "torch": to,
                         "exact": ex, "t_sk": t_sk, "t_torch": t_to})
        r = [x for x in rows if x["case"] == name]

        def agree(ref: str, rs: list[dict[str, Any]] = r) -> str:
            same_c = sum(x["torch"][0] == x[ref][0] for x in rs)
            dv = max(abs(x["torch"][1] - x[ref][1]) for x in rs)
            dt = max(abs(x["torch"][2] - x[ref][2]) for x in rs)
            return f"same C {same_c}/{len(rs)}, max |Δval| {dv:.4f}, max |Δtest| {dt:.4f}"

        d = c["fl"].shape[1]
        print(f"{name} (n_lab {len(c['yl'])}, d {d}, {c['k']} classes): torch vs exact: "
              f"{agree('exact')}; torch vs sklearn: {agree('sk')}; per-epoch probe "
              f"sklearn {statistics.median(x['t_sk'] for x in r) * 1e3:.1f} ms, torch "
              f"{statistics.median(x['t_torch'] for x in r) * 1e3:.1f} ms ({a.device})",
              flush=True)
    real_rows = [x for x in rows if x["real"]]

    def crit(ref: str, rs: list[dict[str, Any]]) -> int:
        return sum(x["torch"][0] == x[ref][0] and abs(x["torch"][1] - x[ref][1]) <= 1e-3
                   and abs(x["torch"][2] - x[ref][2]) <= 1e-3 for x in rs)

    ratio = [x["t_sk"] / x["t_torch"] for x in rows]
    print(f"device={a.device} dtype={a.dtype} cases={len(cases)} seeds={a.seeds} "
          f"real_meet_vs_exact={crit('exact', real_rows)}/{len(real_rows)} "
          f"real_meet_vs_sklearn={crit('sk', real_rows)}/{len(real_rows)} "
          f"all_meet_vs_exact={crit('exact', rows)}/{len(rows)} "
          f"speed_ratio_median={statistics.median(ratio):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
