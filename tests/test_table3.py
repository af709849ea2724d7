"""The Table-3 view: Welch's t-test against a hand computation, bold/italic marking and the
average column."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from scarcelab.tracking.query.table3 import render_table3, table3


def _scores() -> pd.DataFrame:
    rows = []
    data = {("ce", "cifair10"): [0.50, 0.52, 0.54], ("ole", "cifair10"): [0.49, 0.53, 0.51],
            ("gradl2", "cifair10"): [0.30, 0.31, 0.32],
            ("ce", "eurosat"): [0.80, 0.81, 0.82], ("ole", "eurosat"): [0.90, 0.91, 0.92],
            ("gradl2", "eurosat"): [0.85, 0.86, 0.87]}
    for (m, d), v in data.items():
        rows += [{"method": m, "dataset": d, "study_id": "s", "score": s} for s in v]
    rows.append({"method": "tvmf", "dataset": "cifair10", "study_id": "s", "score": 0.4})
    return pd.DataFrame(rows)


def _welch_p(a, b):
    a, b = np.asarray(a), np.asarray(b)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    t = (a.mean() - b.mean()) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    from scipy.special import stdtr  # Student-t CDF, independent of ttest_ind
    return 2 * stdtr(df, -abs(t))


def test_welch_against_hand_formula_and_marks():
    long = table3(_scores())
    row = long[(long.method == "ole") & (long.dataset == "cifair10")].iloc[0]
    assert row.p_value == pytest.approx(_welch_p([0.49, 0.53, 0.51], [0.50, 0.52, 0.54]))
    best = long[long.best].set_index("dataset")["method"].to_dict()
    assert best == {"cifair10": "ce", "eurosat": "ole"}
    tied = set(long[long.tied_with_best & ~long.best].method + "/" +
               long[long.tied_with_best & ~long.best].dataset)
    assert "ole/cifair10" in tied and "gradl2/cifair10" not in tied
    one = long[(long.method == "tvmf")].iloc[0]
    assert np.isnan(one.p_value) and not one.tied_with_best  # one run: no test
    md = render_table3(long)
    assert "| ce | **52.00 ± 2.00** |" in md
    assert "*51.00 ± 2.00*" in md and "**91.00 ± 1.00**" in md
    gradl2 = next(line for line in md.splitlines() if line.startswith("| gradl2"))
    assert gradl2.rstrip().endswith(f"| {100 * (0.31 + 0.86) / 2:.2f} |")
    tvmf = next(line for line in md.splitlines() if line.startswith("| tvmf"))
    assert tvmf.rstrip().endswith("|  |")  # no average without every dataset
