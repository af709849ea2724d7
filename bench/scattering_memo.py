"""The scattering transform's evaluation memo (``methods/supervised/scattering.py``,
``MEMO``), measured the way a tune study uses it: several freshly built models (trials,
retrains) each evaluate the same images, with the memo off (its budget set to 0) and on,
side by side in one process. Prints wall seconds per model pass for both, their ratio, and
whether the logits agree bit for bit (they must: a hit returns the same coefficients).

    OMP_NUM_THREADS=1 nice -n 10 python bench/scattering_memo.py --images 1000 --models 3

Images: the first ``--images`` of ciFAIR-10's test set (../shared/data), else the 32×32
noise of bench/tune_steps.py's fallback (200 images).
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

from tune_steps import load  # noqa: E402  (bench/tune_steps.py: the same data and fallback)

from scarcelab.data.bundle import RawDataset  # noqa: E402
from scarcelab.methods import get_method  # noqa: E402
from scarcelab.methods.supervised.scattering import MEMO  # noqa: E402
from scarcelab.protocols.tune import build_method  # noqa: E402
from scarcelab.train import forward_device  # noqa: E402


def passes(raw: RawDataset, x: np.ndarray, mean: np.ndarray, std: np.ndarray, j: int,
           models: int, memo_bytes: int) -> tuple[list[float], list[torch.Tensor]]:
    MEMO.clear()
    MEMO.max_bytes = memo_bytes
    walls, logits = [], []
    for k in range(models):
        torch.manual_seed(k)  # a fresh model per pass, as each trial / retrain builds one
        m = build_method(get_method("scattering"), "small_cnn", raw, mean, std, {"J": j})
        m.eval()
        t0 = time.perf_counter()
        with torch.no_grad():
            logits.append(forward_device(m.logits, x, 512, torch.device("cpu")))
        walls.append(time.perf_counter() - t0)
    return walls, logits


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--models", type=int, default=3)
    ap.add_argument("--J", type=int, default=3)
    a = ap.parse_args()
    raw, _, mean, std, source = load()
    x = raw.test_x[:a.images]
    budget = MEMO.max_bytes
    print(f"data: {source}, {len(x)} images; J = {a.J}; {a.models} fresh models; "
          f"torch threads {torch.get_num_threads()}")
    off, l_off = passes(raw, x, mean, std, a.J, a.models, 0)
    on, l_on = passes(raw, x, mean, std, a.J, a.models, budget)
    same = all(torch.equal(p, q) for p, q in zip(l_off, l_on, strict=True))
    print(f"{'pass':>4} {'memo off (s)':>13} {'memo on (s)':>12}")
    for k, (p, q) in enumerate(zip(off, on, strict=True)):
        print(f"{k:>4} {p:>13.2f} {q:>12.2f}")
    print(f"memo_hits={MEMO.hits} memo_misses={MEMO.misses} memo_mb={MEMO.bytes / 2**20:.1f} "
          f"total_off_s={sum(off):.2f} total_on_s={sum(on):.2f} "
          f"ratio_off_on={sum(off) / sum(on):.2f} logits_identical={same}")


if __name__ == "__main__":
    main()
