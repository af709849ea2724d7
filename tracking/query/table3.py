"""The "Tune It or Don't Use It" Table 3: test balanced accuracy of the final retrains,
methods × datasets, with the average over datasets.

The ICCV paper's Table 3 reports, per method and dataset, the retrains of *one* tuning on
*one* split (10 runs); pooling 3 splits × 10 runs is the journal version's (Brigato et al.,
IEEE Access 2022; gem README "three groups of 10 runs over the three dataset splits").
So a cell holds the retrains of one study: when several studies exist for a method and
dataset (another seed, a re-run), the one with the most finished retrains is kept (the
latest of equals) and the table says how many there were; ``pool="studies"`` pools them
instead, the journal's design when the studies are its splits.

Per dataset the best method (highest mean) is set in **bold**; every other method not
significantly worse than the best (the paper's and gem README's wording) is set in
*italics*. "Worse" is a one-sided hypothesis, so the default test is Welch's one-sided
t-test (unequal variances) of H1: the method's mean is below the best's, at α = 0.05
(``alternative="two-sided"`` gives the two-sided test; the table states which). A dataset
whose runs were evaluated on a stand-in for its official test set (the run tag
``scarcelab.test_set``, e.g. CIFAR-10's test images for ciFAIR-10) is its own column,
labelled with that test set, and is never pooled with runs on another test set. The
average column is the mean of a method's dataset means and is left empty unless the method
has every column of the table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd
from scipy import stats as sps

from scarcelab.tracking.query.frame import Tracked
from scarcelab.tracking.query.registry import view

if TYPE_CHECKING:
    from scarcelab.tracking.query.views import TTestFields

SCORE = "metrics.test/balanced_accuracy"
ALTERNATIVES = {"less": "one-sided", "two-sided": "two-sided"}
POOLS = ("study", "studies")


def retrain_scores(t: Tracked) -> pd.DataFrame:
    """One row per finished retrain run: ``dataset``, ``method``, ``study_id``,
    ``test_set`` (the run's ``scarcelab.test_set`` tag; "" for runs recorded before it
    existed), ``start_time``, ``score``."""
    r = t.role("retrain")
    cols = ["dataset", "method", "study_id", "test_set", "start_time", "score"]
    if r.empty or SCORE not in r:
        return pd.DataFrame(columns=cols)
    r = r[r["status"] == "FINISHED"]
    test_set = r["test_set"].fillna("") if "test_set" in r else ""
    start = r["start_time"] if "start_time" in r else np.nan
    out = pd.DataFrame({"dataset": r["dataset"], "method": r["method"],
                        "study_id": r["parent_run_id"], "test_set": test_set,
                        "start_time": start, "score": r[SCORE]})
    return out.dropna(subset=["score"]).reset_index(drop=True)


def column_label(dataset: str, test_set: str) -> str:
    """A table column: the dataset, and the test set when it is not the official one."""
    if not isinstance(test_set, str) or test_set in ("", "official"):
        return dataset
    return f"{dataset} ({test_set} test set)"


def _one_study(part: pd.DataFrame) -> tuple[pd.DataFrame, str, int]:
    """The retrains of the study with the most of them (the latest of equals)."""
    g = part.groupby("study_id", sort=True)
    size = g.size()
    latest = (g["start_time"].max() if "start_time" in part else size * 0).fillna(0)
    order = pd.DataFrame({"n": size, "t": latest}).sort_values(["n", "t"], kind="stable")
    kept = str(order.index[-1])
    return part[part["study_id"] == kept], kept, len(size)


def table3(scores: pd.DataFrame, alpha: float = 0.05, alternative: str = "less",
           pool: str = "study") -> pd.DataFrame:
    """Long table: one row per (method, column) with ``dataset``, ``column`` (see
    :func:`column_label`), ``mean``, ``std`` (ddof=1), ``n``, ``n_studies``, ``study_id``
    (the study kept; "" when pooled), ``best``, ``p_value`` (Welch vs the best, ``alternative``
    "less": H1 mean below the best's; NaN for the best itself or with fewer than two runs on
    either side), ``tied_with_best`` (best, or p ≥ α), and the test's ``alternative`` and
    ``alpha`` (for the table's note)."""
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative={alternative!r}: valid are {sorted(ALTERNATIVES)}")
    if pool not in POOLS:
        raise ValueError(f"pool={pool!r}: 'study' (one study per cell, the ICCV paper) or "
                         "'studies' (pool them, the journal's splits)")
    cols = ["method", "dataset", "column", "mean", "std", "n", "n_studies", "study_id",
            "best", "p_value", "tied_with_best", "alternative", "alpha"]
    if scores.empty:
        return pd.DataFrame(columns=cols)
    s = scores.copy()
    s["test_set"] = s["test_set"].fillna("") if "test_set" in s else ""
    s["column"] = [column_label(d, ts) for d, ts in zip(s["dataset"], s["test_set"],
                                                        strict=True)]
    rows = []
    for col, part in s.groupby("column", sort=True):
        cells = {}
        for m, g in part.groupby("method", sort=True):
            if pool == "study":
                g, kept, n_st = _one_study(g)
            else:
                kept, n_st = "", g["study_id"].nunique()
            cells[m] = (g["score"].to_numpy(float), kept, n_st)
        best = max(cells, key=lambda m: (cells[m][0].mean(), m))
        vb = cells[best][0]
        for m, (v, kept, n_st) in cells.items():
            p = np.nan
            if m != best and len(v) >= 2 and len(vb) >= 2:
                res = cast("TTestFields", sps.ttest_ind(v, vb, equal_var=False,
                                                        alternative=alternative))
                p = float(res.pvalue)
            rows.append((m, str(part["dataset"].iloc[0]), col, v.mean(),
                         v.std(ddof=1) if len(v) > 1 else np.nan, len(v), n_st, kept,
                         m == best, p, m == best or (bool(np.isfinite(p)) and p >= alpha),
                         alternative, alpha))
    return pd.DataFrame(rows, columns=cols)


def render_table3(long: pd.DataFrame, percent: bool = True) -> str:
    """Markdown: rows = methods, columns = datasets (with their test set when it is a
    stand-in) + Avg.; cells ``mean ± std``; a note says the test, its sidedness and how
    many studies a cell was chosen from."""
    if long.empty:
        return "(no finished retrains)"
    k = 100.0 if percent else 1.0
    key = "column" if "column" in long else "dataset"
    columns = sorted(long[key].unique())
    methods = sorted(long["method"].unique())
    cell = {(r.method, getattr(r, key)): r for r in long.itertuples()}
    lines = ["| Method | " + " | ".join(columns) + " | Avg. |",
             "|:--|" + "--:|" * (len(columns) + 1)]
    for m in methods:
        parts = []
        means = []
        for d in columns:
            r = cell.get((m, d))
            if r is None:
                parts.append("")
                continue
            mean, sd = cast("float", r.mean), cast("float", r.std)
            means.append(mean)
            std = "" if not np.isfinite(sd) else f" ± {k * sd:.2f}"
            txt = f"{k * mean:.2f}{std}"
            parts.append(f"**{txt}**" if r.best else (f"*{txt}*" if r.tied_with_best else txt))
        avg = f"{k * float(np.mean(means)):.2f}" if len(means) == len(columns) else ""
        lines.append(f"| {m} | " + " | ".join(parts) + f" | {avg} |")
    lines.append("")
    alternative = long["alternative"].iloc[0] if "alternative" in long else "two-sided"
    alpha = float(long["alpha"].iloc[0]) if "alpha" in long else 0.05
    side = ("one-sided, H1: the method's mean is below the best's" if alternative == "less"
            else "two-sided")
    lines.append(f"**bold**: best mean per dataset; *italic*: not significantly worse than "
                 f"the best (Welch's t-test over the retrains, {side}; p ≥ {alpha:g}).")
    if "n_studies" in long and (long["n_studies"] > 1).any():
        many = long[long["n_studies"] > 1]
        pooled = (many["study_id"] == "").all()
        what = ("their retrains pooled" if pooled else
                "the one with the most retrains kept (the latest of equals)")
        lines.append(f"{len(many)} cell(s) had several studies ({int(many['n_studies'].max())} "
                     f"at most): {what}.")
    return "\n".join(lines)


@view("table3", order=70, entries=["tune"], section=False, markdown=render_table3,
      heading="Table 3",
      note="Tune It or Don't Use It, Table 3: per method and dataset, mean ± std of the "
           "final retrains' test balanced accuracy (one study per cell); best bold, not "
           "significantly worse than the best (Welch's one-sided t-test, p >= 0.05) italic.")
def table3_view(t: Tracked, **filters: Any) -> pd.DataFrame:
    """:func:`table3` of the retrains in ``t``; only the ``dataset`` filter applies (the
    others are about studies with a test score of their own, which tune studies lack)."""
    scores = retrain_scores(t)
    if filters.get("dataset") is not None and len(scores):
        from scarcelab.tracking.query.views import filter_frame

        scores = filter_frame(scores, dataset=filters["dataset"])
    return table3(scores)


__all__ = ["column_label", "render_table3", "retrain_scores", "table3", "table3_view"]
