"""The "Tune It or Don't Use It" Table 3: test balanced accuracy of the final retrains,
methods × datasets, with the average over datasets.

Per dataset the best method (highest mean over its retrains) is set in **bold**; every
other method whose retrains are not significantly worse than the best's by a two-sided
Welch's t-test (unequal variances; p ≥ α, α = 0.05) is set in *italics* — the paper's
and gem README's convention. A dataset's retrains are pooled over its studies (the paper
pools 3 splits × 10 runs). The average column is the mean of a method's dataset means and
is left empty unless the method has every dataset of the table.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats as sps

from scarcelab.tracking.query.frame import Tracked

SCORE = "metrics.test/balanced_accuracy"


def retrain_scores(t: Tracked) -> pd.DataFrame:
    """One row per finished retrain run: ``dataset``, ``method``, ``study_id``, ``score``."""
    r = t.role("retrain")
    cols = ["dataset", "method", "study_id", "score"]
    if r.empty or SCORE not in r:
        return pd.DataFrame(columns=cols)
    r = r[r["status"] == "FINISHED"]
    out = pd.DataFrame({"dataset": r["dataset"], "method": r["method"],
                        "study_id": r["parent_run_id"], "score": r[SCORE]})
    return out.dropna(subset=["score"]).reset_index(drop=True)


def table3(scores: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """Long table: one row per (method, dataset) with ``mean``, ``std`` (ddof=1), ``n``,
    ``best`` (bool), ``p_value`` (Welch vs the best; NaN for the best itself or with fewer
    than two runs on either side) and ``tied_with_best`` (best, or p ≥ α)."""
    cols = ["method", "dataset", "mean", "std", "n", "best", "p_value", "tied_with_best"]
    if scores.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for ds, part in scores.groupby("dataset", sort=True):
        vals = {m: g["score"].to_numpy(float) for m, g in part.groupby("method", sort=True)}
        best = max(vals, key=lambda m: (vals[m].mean(), m))
        for m, v in vals.items():
            p = np.nan
            if m != best and len(v) >= 2 and len(vals[best]) >= 2:
                p = float(sps.ttest_ind(v, vals[best], equal_var=False).pvalue)
            rows.append((m, ds, v.mean(), v.std(ddof=1) if len(v) > 1 else np.nan, len(v),
                         m == best, p, m == best or (bool(np.isfinite(p)) and p >= alpha)))
    return pd.DataFrame(rows, columns=cols)


def render_table3(long: pd.DataFrame, percent: bool = True) -> str:
    """Markdown: rows = methods, columns = datasets + Avg.; cells ``mean ± std``."""
    if long.empty:
        return "(no finished retrains)"
    k = 100.0 if percent else 1.0
    datasets = sorted(long["dataset"].unique())
    methods = sorted(long["method"].unique())
    cell = {(r.method, r.dataset): r for r in long.itertuples()}
    lines = ["| Method | " + " | ".join(datasets) + " | Avg. |",
             "|:--|" + "--:|" * (len(datasets) + 1)]
    for m in methods:
        parts = []
        means = []
        for d in datasets:
            r = cell.get((m, d))
            if r is None:
                parts.append("")
                continue
            means.append(r.mean)
            std = "" if not np.isfinite(r.std) else f" ± {k * r.std:.2f}"
            txt = f"{k * r.mean:.2f}{std}"
            parts.append(f"**{txt}**" if r.best else (f"*{txt}*" if r.tied_with_best else txt))
        avg = f"{k * float(np.mean(means)):.2f}" if len(means) == len(datasets) else ""
        lines.append(f"| {m} | " + " | ".join(parts) + f" | {avg} |")
    lines.append("")
    lines.append("**bold**: best mean per dataset; *italic*: not significantly worse than the "
                 "best (two-sided Welch's t-test over the retrains, p ≥ 0.05).")
    return "\n".join(lines)


__all__ = ["render_table3", "retrain_scores", "table3"]
