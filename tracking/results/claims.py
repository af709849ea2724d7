"""Headline claims as rules evaluated on our numbers: each gives *reproduced*, *not
reproduced* or *not testable at this scale*, with the reason in numbers.

Why rules and not prose: a verdict typed by hand is a number typed by hand. A claim in a
paper file (``suites/papers/<suite>.yaml``) names a rule kind and its parameters; the rule
states itself in words (:meth:`Rule.describe`, printed on the page next to the verdict),
says when the runs are too few to test it (a minimum number of datasets, repetitions,
retrains, …) and otherwise decides. The rules read the same tables the page shows
(:class:`SuiteData`), so a verdict can be checked by eye against them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as sps

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
UNTESTABLE = "not testable at this scale"
STATUSES = (REPRODUCED, NOT_REPRODUCED, UNTESTABLE)


@dataclass
class SuiteData:
    """The tables of one suite's runs that the rules (and the page) read. Empty frames
    where the suite has no such cells."""

    leaderboard: pd.DataFrame = field(default_factory=pd.DataFrame)
    gains: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: one row per finished AL repetition: dataset, query_size, strategy, repetition, auc
    al: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: C-Score Table A1 (tracking.contamination.table_a1)
    table_a1: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: the transfer view, encoder references as the spec writes them (@pretrain)
    transfer: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: one row per finished retrain: dataset, method, study_id, score
    retrains: pd.DataFrame = field(default_factory=pd.DataFrame)


@dataclass(frozen=True)
class Verdict:
    status: str
    reason: str


@dataclass(frozen=True)
class Rule:
    describe: Callable[..., str]
    evaluate: Callable[..., Verdict]


RULES: dict[str, Rule] = {}


def rule(name: str, describe: Callable[..., str]) -> Callable[[Callable[..., Verdict]],
                                                              Callable[..., Verdict]]:
    def deco(fn: Callable[..., Verdict]) -> Callable[..., Verdict]:
        RULES[name] = Rule(describe, fn)
        return fn
    return deco


def evaluate(kind_and_params: dict[str, Any], data: SuiteData) -> Verdict:
    params = {k: v for k, v in kind_and_params.items() if k != "kind"}
    return RULES[kind_and_params["kind"]].evaluate(data, **params)


def describe(kind_and_params: dict[str, Any]) -> str:
    params = {k: v for k, v in kind_and_params.items() if k != "kind"}
    return RULES[kind_and_params["kind"]].describe(**params)


def _f(x: float) -> str:
    return f"{x:+.4f}"


def _untestable(why: str) -> Verdict:
    return Verdict(UNTESTABLE, why)


# -- SSL-vs-SSL: the gains table --------------------------------------------------------
def _gain_columns(g: pd.DataFrame) -> list[str]:
    return [c for c in g.columns if c not in ("method", "median_gain", "worst_gain")]


def _gains_of(data: SuiteData, method: str) -> pd.Series | None:
    g = data.gains
    if g.empty or "method" not in g or method not in set(g["method"]):
        return None
    row = g.set_index("method").loc[method, _gain_columns(g)]
    return pd.to_numeric(row, errors="coerce").dropna()


def _gain_everywhere_text(method: str, min_datasets: int = 2) -> str:
    return (f"{method}'s mean test balanced accuracy minus the best labeled-only method's "
            f"(sup, mixup, supcon) is > 0 on every dataset; testable with >= {min_datasets} "
            "datasets")


@rule("gain_everywhere", _gain_everywhere_text)
def _gain_everywhere(data: SuiteData, method: str, min_datasets: int = 2) -> Verdict:
    vals = _gains_of(data, method)
    if vals is None:
        return _untestable(f"{method} has no row in the gains table (not in the grid, not "
                           "finished, or no labeled-only baseline finished)")
    if len(vals) < min_datasets:
        return _untestable(f"{method} has a gain on {len(vals)} dataset(s); the rule needs "
                           f">= {min_datasets}")
    listing = ", ".join(f"{k} {_f(v)}" for k, v in vals.items())
    ok = bool((vals > 0).all())
    return Verdict(REPRODUCED if ok else NOT_REPRODUCED, f"gains of {method}: {listing}")


def _family_of(data: SuiteData) -> dict[str, str]:
    lb = data.leaderboard
    if lb.empty or "family" not in lb:
        return {}
    return {str(m): str(f) for m, f in zip(lb["method"], lb["family"], strict=True)}


def _most_reliable_text(method: str, families: Sequence[str] = ("semi", "self"),
                        min_datasets: int = 2) -> str:
    return (f"among the {' and '.join(families)} methods, {method} has the highest "
            "worst-case gain over the best labeled-only method (the minimum over datasets, "
            f"on the datasets every compared method has); testable with >= {min_datasets} "
            "such datasets and >= 2 methods")


@rule("most_reliable_gain", _most_reliable_text)
def _most_reliable(data: SuiteData, method: str, families: Sequence[str] = ("semi", "self"),
                   min_datasets: int = 2) -> Verdict:
    fam = _family_of(data)
    g = data.gains
    if _gains_of(data, method) is None:
        return _untestable(f"{method} has no row in the gains table")
    cand = g[g["method"].map(lambda m: fam.get(str(m)) in set(families))].set_index("method")
    cols = _gain_columns(g)
    table = cand[cols].apply(pd.to_numeric, errors="coerce").dropna(axis=1, how="any")
    if len(table) < 2:
        return _untestable(f"{len(table)} {'/'.join(families)} method(s) in the gains table")
    if table.shape[1] < min_datasets:
        return _untestable(f"the compared methods share {table.shape[1]} dataset(s); the "
                           f"rule needs >= {min_datasets}")
    worst = table.min(axis=1).sort_values(ascending=False, kind="stable")
    top = worst.iloc[0]
    rank = int((worst > worst[method]).sum()) + 1
    ok = bool(math.isclose(worst[method], top) or worst[method] >= top)
    return Verdict(REPRODUCED if ok else NOT_REPRODUCED,
                   f"worst-case gain of {method} {_f(worst[method])} (rank {rank} of "
                   f"{len(worst)} over {table.shape[1]} datasets); highest: {worst.index[0]} "
                   f"{_f(top)}")


def _family_beats_text(family: str = "semi", min_datasets: int = 2,
                       at_least: int | str = "all") -> str:
    k = "every dataset" if at_least == "all" else f">= {at_least} datasets"
    return (f"the best {family} method's mean test balanced accuracy is above the best "
            f"labeled-only method's on {k}; testable with >= {min_datasets} datasets")


@rule("family_beats_labeled_only", _family_beats_text)
def _family_beats(data: SuiteData, family: str = "semi", min_datasets: int = 2,
                  at_least: int | str = "all") -> Verdict:
    fam = _family_of(data)
    g = data.gains
    if g.empty:
        return _untestable("no gains table (no labeled-only baseline finished)")
    part = g[g["method"].map(lambda m: fam.get(str(m)) == family)].set_index("method")
    cols = [c for c in _gain_columns(g) if part[c].notna().any()] if len(part) else []
    if len(cols) < min_datasets:
        return _untestable(f"{family} methods have gains on {len(cols)} dataset(s); the "
                           f"rule needs >= {min_datasets}")
    best = {c: (part[c].idxmax(), float(part[c].max())) for c in cols}
    wins = sum(v > 0 for _, v in best.values())
    need = len(cols) if at_least == "all" else int(at_least)
    listing = ", ".join(f"{c}: {m} {_f(v)}" for c, (m, v) in best.items())
    return Verdict(REPRODUCED if wins >= need else NOT_REPRODUCED,
                   f"best {family} gain per dataset: {listing} ({wins} of {len(cols)} > 0)")


def _untested_text(needs: str) -> str:
    return f"needs {needs}"


@rule("needs", _untested_text)
def _untested(data: SuiteData, needs: str) -> Verdict:
    return _untestable(f"the suite's grid does not test it: it needs {needs}")


# -- CDALBench: AL AUCs -----------------------------------------------------------------
def _al_means(data: SuiteData) -> pd.DataFrame:
    a = data.al
    if a.empty:
        return pd.DataFrame()
    return a.pivot_table(index=["dataset", "query_size"], columns="strategy", values="auc",
                         aggfunc="mean")


def _oracle_text(oracle: str = "oracle", min_problems: int = 2) -> str:
    return (f"{oracle} has the highest mean AUC of all strategies on every (dataset, query "
            f"size) problem; testable with >= {min_problems} problems that ran it and "
            "another strategy")


@rule("oracle_best", _oracle_text)
def _oracle_best(data: SuiteData, oracle: str = "oracle", min_problems: int = 2) -> Verdict:
    m = _al_means(data)
    if m.empty or oracle not in m:
        return _untestable(f"no finished {oracle} repetitions")
    probs = m[m[oracle].notna() & (m.drop(columns=oracle).notna().sum(axis=1) > 0)]
    if len(probs) < min_problems:
        return _untestable(f"{len(probs)} problem(s) with {oracle} and another strategy; "
                           f"the rule needs >= {min_problems}")
    losses = []
    for key, row in probs.iterrows():
        others = row.drop(oracle).dropna()
        if others.max() >= row[oracle]:
            losses.append(f"{key[0]} q={key[1]}: {others.idxmax()} {others.max():.4f} >= "
                          f"{oracle} {row[oracle]:.4f}")
    if losses:
        return Verdict(NOT_REPRODUCED, f"{oracle} is not the best on {len(losses)} of "
                       f"{len(probs)} problems: " + "; ".join(losses))
    return Verdict(REPRODUCED, f"{oracle} has the best mean AUC on all {len(probs)} problems")


def _winner_text(exclude: Sequence[str] = ("oracle",), min_problems: int = 2) -> str:
    return ("no single strategy (the oracle aside) has the best mean AUC on every (dataset, "
            "query size) problem, among the strategies run on all of them; testable with >= "
            f"{min_problems} problems and >= 2 such strategies")


@rule("no_universal_winner", _winner_text)
def _no_universal_winner(data: SuiteData, exclude: Sequence[str] = ("oracle",),
                         min_problems: int = 2) -> Verdict:
    m = _al_means(data)
    if m.empty:
        return _untestable("no finished AL repetitions")
    m = m.drop(columns=[c for c in exclude if c in m]).dropna(axis=1, how="any")
    if len(m) < min_problems or m.shape[1] < 2:
        return _untestable(f"{len(m)} problem(s) and {m.shape[1]} strategies run on all of "
                           f"them; the rule needs >= {min_problems} and >= 2")
    winners = m.idxmax(axis=1)
    listing = ", ".join(f"{d} q={q}: {w}" for (d, q), w in winners.items())
    ok = winners.nunique() > 1
    return Verdict(REPRODUCED if ok else NOT_REPRODUCED,
                   f"best per problem: {listing} ({winners.nunique()} distinct)")


def _mislead_text(baseline: str = "random", runs: int = 3, min_repetitions: int = 5) -> str:
    return (f"on some problem, some strategy's mean AUC minus {baseline}'s over one set of "
            f"{runs} shared repetitions is > 0 and over another set of {runs} is < 0 (the "
            f"sign of a {runs}-run comparison depends on the runs); a weaker test than the "
            "paper's 'significantly better and significantly worse'; testable with >= "
            f"{min_repetitions} shared repetitions")


@rule("few_runs_mislead", _mislead_text)
def _few_runs_mislead(data: SuiteData, baseline: str = "random", runs: int = 3,
                      min_repetitions: int = 5) -> Verdict:
    a = data.al
    if a.empty or baseline not in set(a["strategy"]):
        return _untestable(f"no finished {baseline} repetitions")
    tested = flipped = 0
    example = ""
    for (ds, q), part in a.groupby(["dataset", "query_size"]):
        wide = part.pivot_table(index="repetition", columns="strategy", values="auc",
                                aggfunc="mean")
        if baseline not in wide:
            continue
        for s in wide.columns.drop(baseline):
            d = (wide[s] - wide[baseline]).dropna().to_numpy()
            if len(d) < min_repetitions:
                continue
            tested += 1
            means = [float(np.mean(c)) for c in itertools.combinations(d, runs)]
            if max(means) > 0 > min(means):
                flipped += 1
                example = example or (f"e.g. {s} on {ds} q={q}: {runs}-run mean difference "
                                      f"from {min(means):+.4f} to {max(means):+.4f}")
    if not tested:
        return _untestable(f"no strategy shares >= {min_repetitions} repetitions with "
                           f"{baseline} on a problem")
    ok = flipped > 0
    return Verdict(REPRODUCED if ok else NOT_REPRODUCED,
                   f"{flipped} of {tested} (problem, strategy) pairs flip sign"
                   + (f"; {example}" if example else ""))


# -- C-Score: accuracy masking -----------------------------------------------------------
DIAGS = ("cci_final", "ple_final", "sem_drift_final", "grad_align_final")


def _masking_text(acc_tol: float = 0.02, diag_change: float = 0.25, min_ratio: float = 0.3,
                  share: float = 0.5) -> str:
    return (f"at each method x OOD source's highest ratio r (>= {min_ratio:g}), the test "
            f"balanced accuracy of the best-on-validation checkpoint is within {acc_tol:g} of "
            f"r = 0 while a diagnostic (CCI, PLE, Sem-Drift, Grad-Align; final epoch) moved "
            f"by >= {diag_change:.0%} of its r = 0 value; reproduced when that holds for >= "
            f"{share:.0%} of the pairs")


@rule("accuracy_masking", _masking_text)
def _accuracy_masking(data: SuiteData, acc_tol: float = 0.02, diag_change: float = 0.25,
                      min_ratio: float = 0.3, share: float = 0.5) -> Verdict:
    t = data.table_a1
    if t.empty:
        return _untestable("no finished contamination studies")
    pairs, masked, listing = 0, 0, []
    for (m, src), g in t.groupby(["method", "source"], sort=True):
        base = g[g["ratio"] == 0.0]
        top = g[g["ratio"] > 0.0].sort_values("ratio").tail(1)
        if base.empty or top.empty or float(top["ratio"].iloc[0]) < min_ratio:
            continue
        rel = [abs(float(top[f"rel_{d}"].iloc[0])) for d in DIAGS
               if pd.notna(top[f"rel_{d}"].iloc[0])]
        acc = float(top["best_test_bacc"].iloc[0]) - float(base["best_test_bacc"].iloc[0])
        if not rel or not math.isfinite(acc):
            continue
        pairs += 1
        hit = abs(acc) <= acc_tol and max(rel) >= diag_change
        masked += hit
        listing.append(f"{m}/{src} r={float(top['ratio'].iloc[0]):g}: accuracy {acc:+.4f}, "
                       f"largest diagnostic change {max(rel):.0%}"
                       + (" (masked)" if hit else ""))
    if not pairs:
        return _untestable(f"no method x source pair with r = 0, a ratio >= {min_ratio:g} "
                           "and finite diagnostics")
    ok = masked / pairs >= share
    return Verdict(REPRODUCED if ok else NOT_REPRODUCED,
                   f"{masked} of {pairs} pairs masked: " + "; ".join(listing))


# -- Kang et al.: transfer ----------------------------------------------------------------
def _encoder_text(better: str = "@pretrain", worse: str = "random",
                  columns: Sequence[str] = ()) -> str:
    return (f"the encoder {better}'s mean is above {worse}'s on every transfer column "
            f"matching: {', '.join(columns)}; testable when both rows have those columns")


@rule("encoder_beats", _encoder_text)
def _encoder_beats(data: SuiteData, better: str = "@pretrain", worse: str = "random",
                   columns: Sequence[str] = ()) -> Verdict:
    t = data.transfer
    if t.empty or "encoder" not in t:
        return _untestable("no finished probe or segment runs")
    rows = t.set_index("encoder")
    missing = [e for e in (better, worse) if e not in rows.index]
    if missing:
        return _untestable(f"no transfer row for {', '.join(missing)}")
    cells, lost, absent = [], [], []
    for pat in columns:
        cols = [c for c in rows.columns if pat in str(c)
                and pd.notna(rows.loc[better, c]) and pd.notna(rows.loc[worse, c])]
        if not cols:
            absent.append(pat)
        for c in cols:
            b, w = float(rows.loc[better, c]), float(rows.loc[worse, c])
            cells.append(f"{c}: {b:.4f} vs {w:.4f}")
            if not b > w:
                lost.append(c)
    if absent:
        return _untestable(f"no column with both encoders for: {', '.join(absent)}")
    return Verdict(NOT_REPRODUCED if lost else REPRODUCED,
                   f"{better} vs {worse}: " + "; ".join(cells))


# -- Tune It: retrains ---------------------------------------------------------------------
def _welch(a: np.ndarray, b: np.ndarray) -> float:
    return float(sps.ttest_ind(a, b, equal_var=False).pvalue)


def _competitive_text(baseline: str = "ce", max_better: int = 1, alpha: float = 0.05,
                      min_methods: int = 3, min_runs: int = 2) -> str:
    return (f"on every dataset at most {max_better} method(s) beat {baseline} significantly "
            f"(higher mean over the final retrains, two-sided Welch p < {alpha:g}); testable "
            f"with >= {min_methods} methods of >= {min_runs} retrains each")


@rule("baseline_competitive", _competitive_text)
def _baseline_competitive(data: SuiteData, baseline: str = "ce", max_better: int = 1,
                          alpha: float = 0.05, min_methods: int = 3,
                          min_runs: int = 2) -> Verdict:
    r = data.retrains
    if r.empty:
        return _untestable("no finished retrains")
    parts, ok_all, tested = [], True, 0
    for ds, part in r.groupby("dataset", sort=True):
        vals = {m: g["score"].to_numpy(float) for m, g in part.groupby("method")}
        vals = {m: v for m, v in vals.items() if len(v) >= min_runs}
        if baseline not in vals or len(vals) < min_methods:
            continue
        tested += 1
        b = vals[baseline]
        better = [m for m, v in vals.items() if m != baseline and v.mean() > b.mean()
                  and _welch(v, b) < alpha]
        ok_all &= len(better) <= max_better
        parts.append(f"{ds}: {len(better)} of {len(vals) - 1} significantly better than "
                     f"{baseline}" + (f" ({', '.join(sorted(better))})" if better else ""))
    if not tested:
        return _untestable(f"no dataset with {baseline} and >= {min_methods} methods of >= "
                           f"{min_runs} retrains")
    return Verdict(REPRODUCED if ok_all else NOT_REPRODUCED, "; ".join(parts))


def _best_text(method: str, dataset: str, alpha: float = 0.05, min_methods: int = 3,
               min_runs: int = 2) -> str:
    return (f"{method} has the best mean on {dataset} over the final retrains, or is not "
            f"significantly worse than the best (two-sided Welch p >= {alpha:g}); testable "
            f"with >= {min_methods} methods of >= {min_runs} retrains")


@rule("best_or_tied", _best_text)
def _best_or_tied(data: SuiteData, method: str, dataset: str, alpha: float = 0.05,
                  min_methods: int = 3, min_runs: int = 2) -> Verdict:
    r = data.retrains
    part = r[r["dataset"] == dataset] if not r.empty else r
    vals = {m: g["score"].to_numpy(float) for m, g in part.groupby("method")} if len(part) \
        else {}
    vals = {m: v for m, v in vals.items() if len(v) >= min_runs}
    if method not in vals or len(vals) < min_methods:
        return _untestable(f"{dataset}: {method} {'missing' if method not in vals else 'ok'}"
                           f", {len(vals)} method(s) with >= {min_runs} retrains; the rule "
                           f"needs {method} and >= {min_methods}")
    best = max(vals, key=lambda m: (vals[m].mean(), m))
    if best == method:
        return Verdict(REPRODUCED, f"{method} has the best mean ({vals[method].mean():.4f})")
    p = _welch(vals[method], vals[best])
    return Verdict(REPRODUCED if p >= alpha else NOT_REPRODUCED,
                   f"best: {best} {vals[best].mean():.4f}; {method} {vals[method].mean():.4f}"
                   f", Welch p = {p:.3g}")
