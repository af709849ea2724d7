"""Our scattering transform beside kymatio's ``Scattering2D`` (kymatio 0.3.0, the library gem
builds its deep hybrid networks on), on the same uniform-noise images.

kymatio is not a dependency: 0.3.0, its latest release, fails to import with SciPy ≥ 1.15
(``scipy.special.sph_harm``, used only by its 3-D part, was removed). This script stubs the
missing name in-process and imports a wheel unpacked by hand:

    pip download --no-deps kymatio==0.3.0 -d /tmp/kym && unzip -q /tmp/kym/*.whl -d /tmp/kym/src
    OMP_NUM_THREADS=1 python bench/scattering_kymatio.py --kymatio /tmp/kym/src

Our filters put x along columns (kymatio: rows), so orientation θ here is π/2 − θ there,
and second-order pairs are ordered (j1, j2, θ1, θ2) here, (j1, θ1, j2, θ2) there: kymatio's
channels are permuted onto ours before comparing (a fixed permutation, which the learned
projection after the transform absorbs). Printed: the relative L2 difference per order,
over all output pixels / away from the border pixels. The last line is a key=value summary.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import scipy.special
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scarcelab.methods.supervised.scattering import Scattering2D, n_coefficients  # noqa: E402

L = 8


def kymatio_index(j: int) -> list[int]:
    """For each of our channels, the kymatio channel holding the same coefficient."""
    def t(a: int) -> int:
        return (2 - a) % L  # the orientation under the x/y transpose

    order1 = {(jj, th): 1 + jj * L + th for jj in range(j) for th in range(L)}
    order2, k = {}, 1 + j * L
    for j1 in range(j):
        for t1 in range(L):
            for j2 in range(j1 + 1, j):
                for t2 in range(L):
                    order2[(j1, t1, j2, t2)] = k
                    k += 1
    idx = [0] + [order1[(jj, t(th))] for jj in range(j) for th in range(L)]
    idx += [order2[(j1, t(t1), j2, t(t2))] for j1 in range(j) for j2 in range(j1 + 1, j)
            for t1 in range(L) for t2 in range(L)]
    return idx


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kymatio", required=True, help="folder holding the unpacked kymatio package")
    a = ap.parse_args()
    scipy.special.sph_harm = None  # only kymatio's 3-D filter bank uses it
    sys.path.insert(0, a.kymatio)
    from kymatio.torch import Scattering2D as KymatioScattering2D

    torch.manual_seed(0)
    summary = []
    for j, n in ((2, 32), (3, 32), (3, 64)):
        x = torch.rand(4, 3, n, n)
        ours = Scattering2D(j, n, n)(x).view(4, 3, n_coefficients(j), n >> j, n >> j)
        ref = KymatioScattering2D(J=j, shape=(n, n))(x)[:, :, kymatio_index(j)]
        k1 = 1 + j * L
        parts = {"all": slice(None), "order0": slice(0, 1), "order1": slice(1, k1),
                 "order2": slice(k1, None)}
        msg = []
        for name, sl in parts.items():
            o, r = ours[:, :, sl], ref[:, :, sl]
            oi, ri = o[..., 1:-1, 1:-1], r[..., 1:-1, 1:-1]
            full = float((o - r).norm() / r.norm())
            inner = float((oi - ri).norm() / ri.norm())
            msg.append(f"{name} {full:.3f}/{inner:.3f}")
            summary.append(f"J{j}_{n}px_{name}_rel_diff={full:.3f}")
        print(f"J={j} {n}x{n} -> {3 * n_coefficients(j)} channels at {n >> j}x{n >> j}; "
              "relative L2 difference all/interior: " + ", ".join(msg))
    print(" ".join(summary))


if __name__ == "__main__":
    main()
