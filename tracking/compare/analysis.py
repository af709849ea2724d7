"""The answer of ``scarcelab compare`` from its per-seed table: which methods are best or
tied, each method's gain over the best labeled-only method with a confidence interval, and
what each cost.

The design (docs/compare.md, "The test"): every method runs on the same seeds, and a seed
fixes the split (labeled and validation images, ``scarcelab.data.splits.make_split``), so
the scores are *paired* by seed: a method's difference to another, seed by seed, removes
the split's share of the variance, which on small labeled sets is the largest one
(Bouthillier et al., "Accounting for Variance in Machine Learning Benchmarks", MLSys 2021).
On the differences:

* **tied** with the best (highest mean) method: Student's paired t-test, two-sided, of each
  other method against it, with Holm's (1979) step-down correction over those k - 1
  comparisons; a method is *worse* when its adjusted p-value is below alpha, otherwise
  *tied*;
* **gain** over the best labeled-only method (the highest mean of the ``supervised``
  family): the mean paired difference with its t-interval (1 - alpha), per method and not
  adjusted for the number of methods (the tie test is).

The statistics themselves are ``tracking.stats.paired_t`` and ``tracking.stats.holm``
(shared with the rest of the query layer); this module only chooses what to compare.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from scarcelab.tracking import stats

TEST = "test_balanced_accuracy"
VAL = "val_balanced_accuracy"
LABELED_ONLY = "supervised"
#: the headline table's columns (summary.csv), in order
COLUMNS = ["rank", "method", "family", "verdict", "n_seeds", f"{TEST}_mean", f"{TEST}_std",
           f"{VAL}_mean", "p_vs_best", "p_vs_best_holm", "gain", "gain_low", "gain_high",
           "gain_p", "wins", "studies", "wall_s_mean", "wall_s_total", "cpu_s_total",
           "failed_attempts"]


@dataclass
class Analysis:
    """The headline table and what the report's answer says."""

    table: pd.DataFrame  # COLUMNS, best first; failed methods last
    scores: pd.DataFrame  # seeds (used) x methods: test balanced accuracy
    alpha: float
    best: str | None = None
    baseline: str | None = None  # the best labeled-only method
    winner_run: str | None = None  # the best method's study chosen on validation
    winner_seed: int | None = None
    seeds_used: list[int] = field(default_factory=list)
    seeds_dropped: list[int] = field(default_factory=list)
    failed_methods: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _order(means: pd.Series, vals: pd.Series) -> list[str]:
    """Methods by mean test score, then mean validation score, then name (a stable rank
    for exact ties)."""
    keys = sorted(means.index, key=lambda m: (-means[m], -np.nan_to_num(vals.get(m, np.nan),
                                                                         nan=-np.inf), m))
    return list(keys)


def analyse(per_seed: pd.DataFrame, families: dict[str, str], alpha: float = 0.05
            ) -> Analysis:
    """The answer from ``per_seed``: one row per finished study with ``method``, ``seed``,
    :data:`TEST`, :data:`VAL`, ``run_id`` and the cost columns ``wall_s`` / ``cpu_s``
    (optional ``wall_s_all`` / ``cpu_s_all`` / ``failed_attempts``: every attempt's cost,
    failed ones included). Rows without a test score (a cell that did not finish) count
    only in the costs. ``families`` gives every method of the grid (those with no finished
    study are reported as failed).

    Paired statistics need complete blocks: the seeds on which every method with a finished
    study has one (the others are listed in ``seeds_dropped``; imputing them would invent
    results). With fewer than 2 such seeds nothing is tested."""
    methods = list(families)
    ok = per_seed.dropna(subset=[TEST]) if len(per_seed) else per_seed
    present = [m for m in methods if len(ok) and (ok["method"] == m).any()]
    failed = [m for m in methods if m not in present]
    an = Analysis(pd.DataFrame(columns=COLUMNS), pd.DataFrame(), alpha, failed_methods=failed)
    if not present:
        an.notes.append("no study finished: nothing to compare")
        an.table = _failed_rows(an.table, failed, families, per_seed)
        return an
    wide = ok.pivot_table(index="seed", columns="method", values=TEST, aggfunc="last")
    wide = wide.reindex(columns=present)
    complete = wide.dropna(axis=0, how="any")
    an.seeds_used = [int(s) for s in complete.index]
    an.seeds_dropped = [int(s) for s in wide.index if s not in complete.index]
    an.scores = complete
    if complete.empty:  # each method finished on other seeds: nothing can be paired
        an.notes.append("no seed has a finished study of every method: nothing is compared "
                        "(re-run the same command to finish the missing studies)")
        rows = [{"method": m, "family": families[m], "verdict": "untested", "n_seeds": 0,
                 f"{TEST}_mean": wide[m].mean(), "studies": int((ok["method"] == m).sum()),
                 "wall_s_total": _total(per_seed[per_seed["method"] == m], "wall_s"),
                 "cpu_s_total": _total(per_seed[per_seed["method"] == m], "cpu_s")}
                for m in present]
        an.table = _failed_rows(pd.DataFrame(rows, columns=COLUMNS), failed, families,
                                per_seed)
        return an
    vwide = ok.pivot_table(index="seed", columns="method", values=VAL, aggfunc="last"
                           ).reindex(index=complete.index, columns=present)
    means, vals = complete.mean(axis=0), vwide.mean(axis=0)
    order = _order(means, vals)
    an.best = order[0]
    base = [m for m in order if families[m] == LABELED_ONLY]
    an.baseline = base[0] if base else None
    n = len(complete)
    if n < 2:
        an.notes.append(f"{n} seed with every method finished: no interval and no test "
                        "(they need at least 2)")
    # the tie test: every other method against the best, Holm over those comparisons
    p_best = {m: np.nan for m in present}
    if an.best is not None and n >= 2:
        for m in order[1:]:
            p_best[m] = stats.paired_t(complete[an.best].to_numpy(),
                                       complete[m].to_numpy(), alpha).p
    others = order[1:]
    adj = dict(zip(others, stats.holm([p_best[m] for m in others]), strict=True)) \
        if others else {}
    rows = []
    for rank, m in enumerate(order, 1):
        g = stats.paired_t(complete[m].to_numpy(), complete[an.baseline].to_numpy(), alpha) \
            if an.baseline is not None else None
        if m == an.best:
            verdict = "best"
        elif n < 2 or np.isnan(adj.get(m, np.nan)):
            verdict = "untested"
        else:
            verdict = "worse" if adj[m] < alpha else "tied"
        mine = ok[ok["method"] == m]
        every = per_seed[per_seed["method"] == m]  # unfinished cells cost time too
        diffs = (complete[m] - complete[an.baseline]).to_numpy() if an.baseline else []
        rows.append({
            "rank": rank, "method": m, "family": families[m], "verdict": verdict,
            "n_seeds": n, f"{TEST}_mean": means[m],
            f"{TEST}_std": complete[m].std(ddof=1) if n > 1 else np.nan,
            f"{VAL}_mean": vals.get(m, np.nan),
            "p_vs_best": p_best.get(m, np.nan), "p_vs_best_holm": adj.get(m, np.nan),
            "gain": g.mean if g else np.nan, "gain_low": g.low if g else np.nan,
            "gain_high": g.high if g else np.nan, "gain_p": g.p if g else np.nan,
            "wins": f"{int(np.sum(np.asarray(diffs) > 0))}/{n}" if an.baseline else "",
            "studies": len(mine),
            "wall_s_mean": _mean(mine, "wall_s"), "wall_s_total": _total(every, "wall_s"),
            "cpu_s_total": _total(every, "cpu_s"),
            "failed_attempts": int(every["failed_attempts"].sum())
            if "failed_attempts" in every else 0,
        })
    table = pd.DataFrame(rows, columns=COLUMNS)
    an.table = _failed_rows(table, failed, families, per_seed)
    if an.best is not None:
        an.winner_run, an.winner_seed = _winner(ok, an.best)
    return an


def _mean(df: pd.DataFrame, col: str) -> float:
    return float(df[col].mean()) if col in df and df[col].notna().any() else np.nan


def _total(df: pd.DataFrame, col: str) -> float:
    """Every attempt's cost when the table has it (``<col>_all``), else the studies'."""
    c = f"{col}_all" if f"{col}_all" in df else col
    return float(df[c].sum()) if c in df and df[c].notna().any() else np.nan


def _failed_rows(table: pd.DataFrame, failed: list[str], families: dict[str, str],
                 per_seed: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for m in failed:
        mine = per_seed[per_seed["method"] == m] if len(per_seed) else per_seed
        rows.append({"method": m, "family": families[m], "verdict": "failed",
                     "n_seeds": 0, "studies": 0,
                     "wall_s_total": _total(mine, "wall_s") if len(mine) else np.nan,
                     "cpu_s_total": _total(mine, "cpu_s") if len(mine) else np.nan,
                     "failed_attempts": int(mine["failed_attempts"].sum())
                     if len(mine) and "failed_attempts" in mine else 0})
    if not rows:
        return table.reset_index(drop=True)
    extra = pd.DataFrame(rows, columns=COLUMNS)
    return pd.concat([table, extra], ignore_index=True) if len(table) else extra


def _winner(ok: pd.DataFrame, method: str) -> tuple[str | None, int | None]:
    """The best method's study to deploy: the one with the highest *validation* score
    (the test set chose the method; it must not also choose the model), the lowest seed
    on a tie."""
    mine = ok[ok["method"] == method].copy()
    if mine.empty:
        return None, None
    mine["_v"] = mine[VAL].fillna(-np.inf)
    row = mine.sort_values(["_v", "seed"], ascending=[False, True], kind="stable").iloc[0]
    return str(row["run_id"]), int(row["seed"])
