"""Comparing many methods over many problems: average ranks, Friedman, pairwise Wilcoxon
with Holm's correction, and the critical-difference (CD) diagram.

One implementation shared by the leaderboard (methods over datasets) and active learning
(strategies over dataset × query size × repetition). The input is always a *scores* frame:
rows are problems (blocks), columns are methods, higher is better. Ranks are computed
within each row (1 = best, ties get the mean of the ranks they span), as in Demšar (2006),
"Statistical Comparisons of Classifiers over Multiple Data Sets", JMLR 7.

Why Wilcoxon–Holm for the cliques rather than the Nemenyi critical difference: Benavoli,
Corani & Mangili (2016, JMLR 17) show that the mean-ranks post-hoc test makes the verdict
on a pair depend on which *other* methods are in the comparison; the pairwise signed-rank
test does not. The Nemenyi CD is still drawn as a scale bar for readers used to it.

The Friedman and Wilcoxon tests need complete blocks: rows with a missing score are dropped
with a warning rather than imputed, since imputing would invent results.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import matplotlib

matplotlib.use("Agg")  # headless: reports are rendered on servers and in CI

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from scipy import stats  # noqa: E402

__all__ = ["BestOrTied", "PairedT", "Sample", "TwoSample", "average_ranks", "best_or_tied",
           "cd_diagram", "cliques", "compare", "friedman_test", "holm", "nemenyi_cd",
           "nemenyi_pvalues", "paired_t", "tost_paired", "tost_welch", "welch_t",
           "welch_t_from_stats", "wilcoxon_holm"]


def _complete(scores: pd.DataFrame, need_methods: int = 2) -> pd.DataFrame:
    """Numeric scores with incomplete rows dropped (and said so)."""
    if not isinstance(scores, pd.DataFrame):
        raise TypeError(f"scores must be a DataFrame (rows = problems, columns = methods), "
                        f"got {type(scores).__name__}")
    df = scores.apply(pd.to_numeric, errors="coerce").astype(float)
    full = df.dropna(axis=0, how="any")
    if len(full) < len(df):
        warnings.warn(f"dropped {len(df) - len(full)} of {len(df)} problems with a missing "
                      "score: rank tests need every method scored on every problem",
                      stacklevel=3)
    if full.shape[1] < need_methods:
        raise ValueError(f"need at least {need_methods} methods (columns), got "
                         f"{full.shape[1]}: {list(full.columns)}")
    if full.empty:
        raise ValueError("no problem (row) has a score for every method")
    return full


def _row_ranks(df: pd.DataFrame) -> pd.DataFrame:
    """Rank within each row, 1 = highest score, ties averaged."""
    ranks = np.apply_along_axis(lambda r: stats.rankdata(-r, method="average"), 1,
                                df.to_numpy())
    return pd.DataFrame(ranks, index=df.index, columns=df.columns)


def average_ranks(scores: pd.DataFrame) -> pd.Series:
    """Mean rank of each method over problems (1 = best), best first."""
    df = _complete(scores, need_methods=1)
    out = _row_ranks(df).mean(axis=0).sort_values(kind="mergesort")
    out.name = "average_rank"
    return out


def friedman_test(scores: pd.DataFrame) -> tuple[float, float]:
    """Friedman's chi-square statistic (tie-corrected) and its p-value.

    Computed from the rank sums so that it also works for two methods, where
    ``scipy.stats.friedmanchisquare`` refuses; for k >= 3 it equals scipy's.
    """
    df = _complete(scores)
    n, k = df.shape
    if n < 2:
        raise ValueError(f"Friedman test needs at least 2 blocks (rows of complete scores), got "
                         f"{n}: with one block the ranks are fixed and a p-value would be "
                         "meaningless — add problems or repetitions")
    ranks = _row_ranks(df).to_numpy()
    rank_sums = ranks.sum(axis=0)
    stat = 12.0 / (n * k * (k + 1)) * float(np.sum(rank_sums**2)) - 3.0 * n * (k + 1)
    ties = 0.0
    for row in df.to_numpy():
        _, counts = np.unique(row, return_counts=True)
        ties += float(np.sum(counts**3 - counts))
    denom = 1.0 - ties / (n * k * (k * k - 1))
    if denom <= 0:  # every row entirely tied: no evidence of any difference
        return 0.0, 1.0
    stat /= denom
    return float(stat), float(stats.chi2.sf(stat, k - 1))


def holm(p: np.ndarray | Sequence[float]) -> np.ndarray:
    """Holm's (1979) step-down adjusted p-values (monotone, capped at 1): the family-wise
    error stays at most alpha over all the hypotheses, with no assumption on how the tests
    depend on each other. A NaN p-value (a test that could not be run) stays NaN and does
    not count as a hypothesis."""
    p = np.asarray(p, dtype=float)
    adj = np.full(len(p), np.nan)
    ok = np.flatnonzero(~np.isnan(p))
    m = len(ok)
    order = ok[np.argsort(p[ok], kind="mergesort")]
    running = 0.0
    for i, idx in enumerate(order):
        running = max(running, min(1.0, (m - i) * p[idx]))
        adj[idx] = running
    return adj



@dataclass(frozen=True)
class PairedT:
    """The mean of paired differences x - y with its two-sided t-interval and test."""

    n: int
    mean: float
    sd: float  # sample standard deviation of the differences (ddof 1)
    low: float  # the (1 - alpha) confidence interval of the mean difference
    high: float
    t: float
    p: float  # two-sided, H0: mean difference = 0


def paired_t(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray,
             alpha: float = 0.05) -> PairedT:
    """Student's paired t for the differences ``x - y`` (pairs with a NaN are dropped):
    mean, the t-interval ``mean ± t_{n-1, 1-alpha/2} · sd / sqrt(n)`` and the two-sided
    p-value, as ``scipy.stats.ttest_rel`` computes it. Fewer than 2 pairs give the mean
    alone (NaN elsewhere): one difference says nothing about its spread. Differences that
    are all equal (up to rounding) have no spread: all zero is no evidence (t 0, p 1), all
    equal and non-zero is certain under the model (t ±inf, p 0) and the interval is that
    value, where scipy would return NaN or a p of 1e-31 from rounding noise."""
    d = np.asarray(x, dtype=float) - np.asarray(y, dtype=float)
    d = d[~np.isnan(d)]
    n = len(d)
    if n == 0:
        return PairedT(0, np.nan, np.nan, np.nan, np.nan, np.nan, np.nan)
    mean = float(d.mean())
    if n < 2:
        return PairedT(1, mean, np.nan, np.nan, np.nan, np.nan, np.nan)
    sd = float(d.std(ddof=1))
    if not sd > 1e-12 * max(1.0, abs(mean)):  # equal up to rounding (0.9-0.8 vs 0.8-0.7)
        sd = 0.0
    if sd == 0.0:
        t = 0.0 if mean == 0.0 else float(np.sign(mean)) * np.inf
        return PairedT(n, mean, 0.0, mean, mean, t, 1.0 if mean == 0.0 else 0.0)
    se = sd / np.sqrt(n)
    t = mean / se
    half = float(stats.t.ppf(1.0 - alpha / 2.0, n - 1)) * se
    p = float(2.0 * stats.t.sf(abs(t), n - 1))
    return PairedT(n, mean, sd, mean - half, mean + half, float(t), p)


def welch_t_from_stats(mean1: float, sd1: float, n1: int, mean2: float, sd2: float,
                       n2: int) -> tuple[float, float, float]:
    """Welch's unequal-variance t-test of mean1 - mean2 from summary statistics (sample
    sds, ddof 1): ``(t, df, two-sided p)``, as ``scipy.stats.ttest_ind_from_stats(...,
    equal_var=False)``. Why from statistics: a paper gives mean ± sd over n runs, not the
    runs, and its claims must be tested the same way as ours. An arm with fewer than 2
    values has no spread: (nan, nan, nan). Two arms without spread: equal means are no
    evidence (t 0, p 1), unequal ones certain under the model (t ±inf, p 0)."""
    if n1 < 2 or n2 < 2 or not (np.isfinite(sd1) and np.isfinite(sd2)):
        return np.nan, np.nan, np.nan
    v1, v2 = sd1 * sd1 / n1, sd2 * sd2 / n2
    se2 = v1 + v2
    diff = mean1 - mean2
    if not se2 > 0:
        return (0.0, np.nan, 1.0) if diff == 0 else (float(np.sign(diff)) * np.inf, np.nan,
                                                     0.0)
    df = se2 * se2 / (v1 * v1 / (n1 - 1) + v2 * v2 / (n2 - 1))
    t = diff / np.sqrt(se2)
    return float(t), float(df), float(2.0 * stats.t.sf(abs(t), df))


def welch_t(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray
            ) -> tuple[float, float, float]:
    """Welch's t-test of mean(x) - mean(y) on the values (NaNs dropped): ``(t, df, p)``,
    two-sided, as ``scipy.stats.ttest_ind(x, y, equal_var=False)``."""
    a = np.asarray(x, dtype=float)
    b = np.asarray(y, dtype=float)
    a, b = a[~np.isnan(a)], b[~np.isnan(b)]
    sd = [float(v.std(ddof=1)) if len(v) > 1 else np.nan for v in (a, b)]
    return welch_t_from_stats(float(a.mean()) if len(a) else np.nan, sd[0], len(a),
                              float(b.mean()) if len(b) else np.nan, sd[1], len(b))


def tost_welch(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray,
               margin: float, alpha: float = 0.05) -> tuple[bool, float, float]:
    """Two one-sided Welch tests of equivalence (Schuirmann's TOST): mean(x) - mean(y) is
    within ``±margin`` at level ``alpha`` when the ``1 - 2 alpha`` Welch interval of the
    difference lies inside it. Returns (equivalent, low, high); with fewer than 2 values
    in an arm, (False, nan, nan): flatness cannot be shown from one run. Why TOST: "no
    significant change" is not evidence of no change; an interval inside the margin is."""
    a = np.asarray(x, dtype=float)
    b = np.asarray(y, dtype=float)
    a, b = a[~np.isnan(a)], b[~np.isnan(b)]
    if len(a) < 2 or len(b) < 2:
        return False, np.nan, np.nan
    diff = float(a.mean() - b.mean())
    v1, v2 = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    if v1 + v2 == 0:
        return abs(diff) < margin, diff, diff
    df = (v1 + v2) ** 2 / (v1 * v1 / (len(a) - 1) + v2 * v2 / (len(b) - 1))
    half = float(stats.t.ppf(1.0 - alpha, df)) * float(np.sqrt(v1 + v2))
    lo, hi = diff - half, diff + half
    return bool(-margin < lo and hi < margin), lo, hi


def tost_paired(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray,
                margin: float, alpha: float = 0.05) -> tuple[bool, float, float]:
    """TOST on paired values (x[i] and y[i] share a seed): the ``1 - 2 alpha`` paired-t
    interval of the mean difference x - y lies inside ``±margin``. Why paired where
    seeds are shared: a seed's data split moves both arms together, and differencing
    removes that shared part of the noise (Welch would count it twice). Fewer than 2
    pairs: (False, nan, nan), as :func:`tost_welch`."""
    r = paired_t(x, y, alpha=2.0 * alpha)
    if r.n < 2:
        return False, np.nan, np.nan
    return bool(-margin < r.low and r.high < margin), r.low, r.high


@dataclass(frozen=True)
class Sample:
    """One arm of a comparison: its values keyed by seed (or repetition, retrain), or only
    a mean ± sd over n (a paper's table). Keys let two arms be paired on the seeds they
    share."""

    mean: float
    sd: float
    n: int
    values: tuple[float, ...] | None = None
    keys: tuple[Any, ...] | None = None  # the seed of each value; None: unpaired

    @classmethod
    def of(cls, values: Mapping[Any, float] | Sequence[float] | np.ndarray) -> Sample:
        """From values; a mapping's keys are their seeds (a plain sequence pairs with
        nothing and is compared by Welch). NaNs are dropped."""
        keys = list(values.keys()) if isinstance(values, Mapping) else None
        vals = np.asarray(list(values.values()) if isinstance(values, Mapping) else values,
                          dtype=float)
        ok = ~np.isnan(vals)
        vals = vals[ok]
        return cls(float(vals.mean()) if len(vals) else np.nan,
                   float(vals.std(ddof=1)) if len(vals) > 1 else np.nan, len(vals),
                   tuple(float(v) for v in vals),
                   tuple(k for k, o in zip(keys, ok, strict=True) if o) if keys else None)

    @classmethod
    def summary(cls, mean: float, sd: float, n: int) -> Sample:
        return cls(float(mean), float(sd), int(n))


@dataclass(frozen=True)
class TwoSample:
    """A two-arm test of mean(a) - mean(b): which test ran, over how many values, and its
    two-sided p (NaN: no test possible, e.g. one value per arm)."""

    test: str  # "paired t" | "Welch t" | "none"
    n: str  # "5 shared seeds" | "3 vs 4"
    diff: float
    t: float
    p: float

    def text(self) -> str:
        p = "no p (too few values)" if np.isnan(self.p) else f"p = {self.p:.3g}"
        return f"{self.test} over {self.n}: {p}"


def compare(a: Sample, b: Sample, min_pairs: int = 2) -> TwoSample:
    """mean(a) - mean(b) tested the way the data allow: Student's paired t over the seeds
    both arms have where they share >= ``min_pairs`` (a shared seed shares its split and
    initialisation, so pairing removes that variance), else Welch's t on all values or on
    the summary statistics."""
    if a.keys is not None and b.keys is not None and a.values and b.values:
        bv = dict(zip(b.keys, b.values, strict=True))
        shared = [(v, bv[k]) for k, v in zip(a.keys, a.values, strict=True) if k in bv]
        if len(shared) >= min_pairs:
            x, y = np.array(shared, dtype=float).T
            r = paired_t(x, y)
            return TwoSample("paired t", f"{len(shared)} shared seeds", r.mean, r.t, r.p)
    t, _, p = welch_t_from_stats(a.mean, a.sd, a.n, b.mean, b.sd, b.n)
    return TwoSample("Welch t" if not np.isnan(p) else "none", f"{a.n} vs {b.n}",
                     a.mean - b.mean, t, p)


@dataclass(frozen=True)
class BestOrTied:
    """The arm with the highest mean, and the arms not significantly below it: each arm
    against the best by :func:`compare`, Holm-adjusted over those comparisons."""

    best: str
    tied: tuple[str, ...]  # the best first, then the others by mean, highest first
    tests: dict[str, TwoSample]  # arm -> its test against the best
    p_holm: dict[str, float]

    def describe(self, fmt: str = ".4f") -> str:
        rest = [f"{m} (p_holm = {self.p_holm[m]:.3g})" if not np.isnan(self.p_holm[m])
                else f"{m} (untested)" for m in self.tied[1:]]
        return "{" + ", ".join([self.best, *rest]) + "}"


def best_or_tied(arms: Mapping[str, Sample], alpha: float = 0.05) -> BestOrTied:
    """Which arms are best or tied with the best: the arm of highest mean (ties of the mean
    broken by name) and every arm whose two-sided test against it (:func:`compare`),
    Holm-adjusted over the other arms, is not significant at ``alpha``. An arm that cannot
    be tested (one value) counts as tied: there is no evidence that it is worse."""
    names = sorted(arms, key=lambda m: (-arms[m].mean, m))
    if not names:
        raise ValueError("best_or_tied: no arms")
    best = names[0]
    others = names[1:]
    tests = {m: compare(arms[best], arms[m]) for m in others}
    adj = holm([tests[m].p for m in others]) if others else np.array([])
    p_holm = {m: float(a) for m, a in zip(others, adj, strict=True)}
    tied = [best] + [m for m in others if not p_holm[m] < alpha]
    return BestOrTied(best, tuple(tied), tests, p_holm)


def wilcoxon_holm(scores: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """Every pair of methods: two-sided Wilcoxon signed-rank p-value, Holm-adjusted over
    all pairs; ``significant`` is ``p_holm < alpha``.

    A pair whose scores are identical on every problem gets p = 1 (no evidence of a
    difference) instead of scipy's error.
    """
    df = _complete(scores)
    rows = []
    for a, b in itertools.combinations(df.columns, 2):
        x, y = df[a].to_numpy(), df[b].to_numpy()
        if np.all(x == y):
            p = 1.0
        else:
            # a WilcoxonResult; scipy's decorated signature loses the type of what it returns
            p = float(cast(Any, stats.wilcoxon(x, y)).pvalue)
        rows.append((a, b, p))
    out = pd.DataFrame(rows, columns=["a", "b", "p_value"])
    out["p_holm"] = holm(out["p_value"].to_numpy()) if len(out) else []
    out["significant"] = out["p_holm"] < alpha
    return out


def nemenyi_pvalues(scores: pd.DataFrame) -> pd.DataFrame:
    """Nemenyi post-hoc p-values of every pair (Demšar 2006 §3.2.2): the difference of
    average ranks over ``sqrt(k (k + 1) / (6 N))``, times sqrt(2), against the studentized
    range with k groups and infinite degrees of freedom. Symmetric methods x methods frame,
    1 on the diagonal; a pair differs at level alpha exactly when its rank difference
    exceeds :func:`nemenyi_cd`. Equals ``scikit_posthocs.posthoc_nemenyi_friedman``
    (checked in tests)."""
    df = _complete(scores)
    n, k = df.shape
    r = _row_ranks(df).mean(axis=0).to_numpy()
    q = np.abs(r[:, None] - r[None, :]) / np.sqrt(k * (k + 1) / (6.0 * n)) * np.sqrt(2.0)
    p = stats.studentized_range.sf(q, k, np.inf)
    np.fill_diagonal(p, 1.0)
    return pd.DataFrame(np.clip(p, 0.0, 1.0), index=df.columns, columns=df.columns)


def nemenyi_cd(n_methods: int, n_problems: int, alpha: float = 0.05) -> float:
    """Nemenyi critical difference of average ranks (Demšar 2006, Eq. in §3.2.2):
    q_alpha * sqrt(k (k + 1) / (6 N)), q_alpha = studentized range quantile / sqrt(2)."""
    k, n = n_methods, n_problems
    q = stats.studentized_range.ppf(1 - alpha, k, np.inf) / np.sqrt(2.0)
    return float(q * np.sqrt(k * (k + 1) / (6.0 * n)))


def cliques(ranks: pd.Series, pairwise: pd.DataFrame) -> list[list[str]]:
    """Maximal groups of methods, contiguous in rank order, in which no pair differs
    significantly; singletons are not cliques (they need no bar)."""
    order = list(ranks.sort_values(kind="mergesort").index)
    sig = {frozenset((r.a, r.b)) for r in pairwise.itertuples() if r.significant}
    groups: list[tuple[int, int]] = []
    for i in range(len(order)):
        j = i
        while j + 1 < len(order) and not any(
                frozenset((order[m], order[j + 1])) in sig for m in range(i, j + 1)):
            j += 1
        if j > i and not any(s <= i and j <= e for s, e in groups):
            groups.append((i, j))
    return [order[s:e + 1] for s, e in groups]


def cd_diagram(scores: pd.DataFrame, alpha: float = 0.05, title: str = "") -> Figure:
    """Critical-difference diagram: average ranks on an axis (best on the left), methods
    labelled below it, thick bars joining methods not significantly different
    (Wilcoxon–Holm), the Nemenyi CD as a scale bar, the Friedman p-value in the title."""
    df = _complete(scores)
    if len(df) < 2:
        raise ValueError(f"a critical-difference diagram needs at least 2 blocks (rows of "
                         f"complete scores), got {len(df)}: no test is possible on one")
    ranks = average_ranks(df)
    pairwise = wilcoxon_holm(df, alpha)
    groups = cliques(ranks, pairwise)
    k, n = df.shape[1], df.shape[0]
    _, p_friedman = friedman_test(df)
    cd = nemenyi_cd(k, n, alpha)

    half = (k + 1) // 2
    n_bar_rows = len(groups)
    height = 1.0 + 0.18 * n_bar_rows + 0.3 + 0.28 * half  # inches, top to bottom
    fig = plt.figure(figsize=(7.5, height))
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
    ax.set_xlim(0, 1)
    ax.set_ylim(0, height)
    ax.axis("off")
    lo, hi = 1, max(k, 2)
    x0, x1 = 0.25, 0.75  # the rank axis; labels go in the margins

    def xpos(rank: float) -> float:
        return x0 + (rank - lo) / (hi - lo) * (x1 - x0)

    head = f"{title}  " if title else ""
    ax.text(0.5, height - 0.08, f"{head}(Friedman p = {p_friedman:.3g}, N = {n}, "
            f"Wilcoxon–Holm α = {alpha})", ha="center", va="top", fontsize=9)
    y_axis = height - 0.85
    ax.plot([x0, x1], [y_axis, y_axis], color="black", lw=1.2)
    for r in range(lo, hi + 1):
        ax.plot([xpos(r)] * 2, [y_axis, y_axis + 0.08], color="black", lw=1)
        ax.text(xpos(r), y_axis + 0.12, str(r), ha="center", va="bottom", fontsize=9)
    # Nemenyi CD scale bar, between the title and the axis, on the left
    if np.isfinite(cd) and cd < hi - lo:
        yc = y_axis + 0.42
        ax.plot([xpos(lo), xpos(lo + cd)], [yc, yc], color="dimgray", lw=1.2)
        for r in (lo, lo + cd):
            ax.plot([xpos(r)] * 2, [yc - 0.04, yc + 0.04], color="dimgray", lw=1)
        ax.text(xpos(lo) - 0.01, yc, f"Nemenyi CD = {cd:.2f}", ha="right", va="center",
                fontsize=8, color="dimgray")

    y_bar0 = y_axis - 0.15
    for gi, members in enumerate(groups):
        y = y_bar0 - 0.18 * gi
        ax.plot([xpos(ranks[members[0]]) - 0.005, xpos(ranks[members[-1]]) + 0.005], [y, y],
                color="black", lw=3.5, solid_capstyle="butt")
    y_lab0 = y_bar0 - 0.18 * len(groups) - 0.15
    for i, (name, r) in enumerate(ranks.items()):
        left = i < half
        row = i if left else k - 1 - i
        y = y_lab0 - 0.28 * row
        x_end = 0.2 if left else 0.8
        ax.plot([xpos(r), xpos(r), x_end], [y_axis, y, y], color="black", lw=0.8)
        ax.text(x_end - 0.01 if left else x_end + 0.01, y, f"{name} ({r:.2f})",
                ha="right" if left else "left", va="center", fontsize=9)
    return fig
