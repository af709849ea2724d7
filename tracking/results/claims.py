"""Headline claims as rules evaluated on our numbers: each gives *reproduced*, *not
reproduced* or *not testable at this scale*, with the reason in numbers.

Why rules and not prose: a verdict typed by hand is a number typed by hand. A claim in a
paper file (``suites/papers/<suite>.yaml``) names a rule kind and its parameters; the rule
states itself in words (:meth:`Rule.describe`, printed on the page next to the verdict),
says when the runs are too few to test it (a minimum number of datasets, repetitions,
retrains, …) and otherwise decides. The rules read the same tables the page shows
(:class:`SuiteData`), so a verdict can be checked by eye against them.

Two things stand between a rule and its verdict (issue 41):

* **Scale.** A claim may state what testing it needs (``needs:`` in the paper file: steps
  or epochs per trial against the paper's, completed trials per study, seeds or
  repetitions, the paper's network, its datasets or named stand-ins). :func:`check_scale`
  compares that with what the tracked runs did (:attr:`SuiteData.scale`) and, below it,
  the verdict is "not testable at this scale" with every shortfall in numbers ("0.3 % of
  the paper's steps per trial; 1 of >= 3 seeds"): a "not reproduced" from a run a
  thousand times smaller than the paper's says nothing about the paper.
* **Significance.** Every comparative rule decides by a named test from
  :mod:`scarcelab.tracking.stats`: Student's paired t over the seeds two arms share, else
  Welch's t (from the values, or from a paper's mean ± sd over n); "best" is the
  best-or-tied set (every arm not significantly below the top mean), not the top mean;
  Holm's correction where several pairs decide one claim. A claim that X is above Y is
  reproduced only when the test says so; a claim that X is the best is reproduced when
  no arm is significantly above X.

The rules run on the paper's own tables too (:func:`paper_data`, ``claims_table: true``
comparisons of the paper file): tests/tracking/results/test_results_paper_tables.py expects each
rule whose table the file holds to say "reproduced" on them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pandas as pd

from scarcelab.tracking.stats import (
    BestOrTied,
    Sample,
    TwoSample,
    best_or_tied,
    compare,
    holm,
    tost_paired,
    tost_welch,
)

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
    #: the same view computed on each seed's runs alone, long: encoder, column, seed,
    #: value (what encoder_beats pairs over shared seeds)
    transfer_runs: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: one row per finished retrain: dataset, method, study_id, score
    retrains: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: one row per (study, seed) kept by the query layer (views.samples): dataset,
    #: method, family, seed, score (test balanced accuracy of the best-on-validation
    #: checkpoint): what the SSL rules pair over shared seeds
    studies: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: what the runs did, one row per study (or AL / retrain unit): dataset, method,
    #: seed, network, steps_per_trial, epochs_per_trial, trials (completed); read by
    #: :func:`check_scale`
    scale: pd.DataFrame = field(default_factory=pd.DataFrame)


#: Summary rows (a paper's table): instead of one row per run, a frame may hold
#: ``<value>_mean``, ``<value>_sd`` and ``n`` per arm (``sd`` / ``n`` NaN where the source
#: gives none: such an arm is compared by its mean only, never called significant).
SD, N = "_sd", "n"


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


def evaluate(kind_and_params: dict[str, Any], data: SuiteData,
             needs: dict[str, Any] | None = None) -> Verdict:
    """The rule's verdict on ``data``; with ``needs`` (the claim's scale requirement), a
    decided verdict becomes "not testable at this scale" with the shortfalls when the runs
    fall short of it (a rule that cannot run at all keeps its own, more basic reason)."""
    params = {k: v for k, v in kind_and_params.items() if k != "kind"}
    verdict = RULES[kind_and_params["kind"]].evaluate(data, **params)
    if needs and verdict.status != UNTESTABLE:
        short = check_scale(needs, data)
        if short:
            return Verdict(UNTESTABLE, "below the scale the claim needs: " + "; ".join(short)
                           + (f" (paper's scale: {needs['source']})" if needs.get("source")
                              else ""))
    return verdict


# -- scale ------------------------------------------------------------------------------
#: the keys a claim's ``needs`` may have (papers.py checks them)
NEEDS_KEYS = ("source", "steps_per_trial", "epochs_per_trial", "min_share", "trials",
              "seeds", "retrains", "networks", "datasets")


def _pct(x: float) -> str:
    return f"{100 * x:.2g} %" if x < 0.1 else f"{100 * x:.0f} %"


def check_scale(needs: dict[str, Any], data: SuiteData) -> list[str]:
    """What the runs fall short of in ``needs``, one phrase each (empty: testable).

    ``steps_per_trial`` / ``epochs_per_trial``: the paper's per trial; the runs' median
    over studies must reach ``min_share`` (default 0.5) of it. ``trials``: completed
    trials of the study with fewest. ``seeds``: distinct seeds of the (dataset, method)
    with fewest (AL: repetitions of the (problem, strategy) with fewest). ``retrains``:
    final retrains of the (dataset, method) with fewest. ``networks``: the accepted
    network names. ``datasets``: our dataset name -> the paper's dataset it is or stands
    in for. A quantity the runs did not record is a shortfall too: it cannot be shown
    to be enough."""
    sc, out = data.scale, []
    share = float(needs.get("min_share", 0.5))
    for key, unit in (("steps_per_trial", "steps"), ("epochs_per_trial", "epochs")):
        if key not in needs:
            continue
        paper = float(needs[key])
        vals = pd.to_numeric(sc[key], errors="coerce").dropna() if key in sc else pd.Series()
        if vals.empty:
            out.append(f"{unit} per trial not recorded by the runs (the paper's: {paper:g})")
            continue
        med = float(vals.median())
        if med < share * paper:
            out.append(f"{_pct(med / paper)} of the paper's {unit} per trial (median {med:g}"
                       f" of {paper:g}; needs >= {_pct(share)})")
    if "trials" in needs:
        vals = pd.to_numeric(sc["trials"], errors="coerce").dropna() if "trials" in sc \
            else pd.Series()
        if vals.empty:
            out.append(f"completed trials per study not recorded (needs >= {needs['trials']})")
        elif vals.min() < needs["trials"]:
            out.append(f"{int(vals.min())} of >= {needs['trials']} completed trials in the "
                       "study with fewest")
    if "seeds" in needs:
        out += _seed_shortfall(int(needs["seeds"]), data)
    if "retrains" in needs:
        r = data.retrains
        if r.empty or "score" not in r:
            out.append(f"no retrains recorded (needs >= {needs['retrains']} per method)")
        else:
            cnt = r.groupby(["dataset", "method"]).size()
            if cnt.min() < needs["retrains"]:
                (ds, m) = cast("tuple[Any, Any]", cnt.idxmin())  # grouped by two keys
                out.append(f"{int(cnt.min())} of >= {needs['retrains']} retrains ({m} on {ds})")
    if "networks" in needs:
        nets = set(sc["network"].dropna().astype(str)) if "network" in sc else set()
        ok = {str(n) for n in needs["networks"]}
        if not nets:
            out.append(f"network not recorded (the paper's: {', '.join(sorted(ok))})")
        elif nets - ok:
            out.append(f"network {', '.join(sorted(nets - ok))}, not the paper's "
                       f"{', '.join(sorted(ok))}")
    if "datasets" in needs:
        ours = _datasets(data)
        known = {str(k) for k in needs["datasets"]}
        if not ours:
            out.append("no dataset recorded")
        elif ours - known:
            out.append(f"dataset(s) {', '.join(sorted(ours - known))}: neither the paper's nor a "
                       f"named stand-in ({', '.join(sorted(known))})")
    return out


def _datasets(data: SuiteData) -> set[str]:
    for f in (data.scale, data.studies, data.al, data.retrains, data.table_a1):
        if not f.empty and "dataset" in f:
            return set(f["dataset"].dropna().astype(str))
    return set()


def _seed_shortfall(need: int, data: SuiteData) -> list[str]:
    """Seeds of the (dataset, method) with fewest (AL: repetitions per problem and
    strategy), from the first frame that records them."""
    a = data.al
    if not a.empty and "repetition" in a:
        cnt = a.groupby(["dataset", "query_size", "strategy"])["repetition"].nunique()
        what = "repetitions"
    else:
        f = next((f for f in (data.scale, data.studies, data.table_a1)
                  if not f.empty and "seed" in f and "method" in f), None)
        if f is None:
            return [f"seeds not recorded (needs >= {need})"]
        keys = [k for k in ("dataset", "method", "source", "ratio") if k in f]
        cnt = f.groupby(keys)["seed"].nunique()
        what = "seeds"
    if cnt.empty:
        return [f"{what} not recorded (needs >= {need})"]
    if cnt.min() >= need:
        return []
    where = cnt.idxmin()
    where = " / ".join(str(x) for x in where) if isinstance(where, tuple) else str(where)
    return [f"{int(cnt.min())} of >= {need} {what} ({where})"]


# -- arms: values keyed by seed, or a paper's mean ± sd -------------------------------------
def _arms(frame: pd.DataFrame, by: list[str], arm: str, value: str,
          key: str | None) -> dict[Any, dict[str, Sample]]:
    """Per group of ``by``: arm name -> :class:`Sample`. Rows of runs (``value`` column,
    keyed by ``key`` for pairing) or summary rows (``<value>_mean``, ``_sd``, ``n``)."""
    out: dict[Any, dict[str, Sample]] = {}
    if frame.empty:
        return out
    summary = f"{value}_mean" in frame
    for g, part in frame.groupby(by, sort=True):
        g = g[0] if isinstance(g, tuple) and len(g) == 1 else g
        arms = {}
        for m, rows in part.groupby(arm, sort=True):
            if summary:
                r = rows.iloc[0]
                sd = r.get(f"{value}{SD}", np.nan)
                n = r.get(N, np.nan)
                arms[str(m)] = Sample(float(r[f"{value}_mean"]),
                                      float(sd) if pd.notna(sd) else np.nan,
                                      int(n) if pd.notna(n) else 0)
            else:
                vals = pd.to_numeric(rows[value], errors="coerce")
                arms[str(m)] = Sample.of(dict(zip(rows[key], vals, strict=True))) \
                    if key and key in rows and rows[key].notna().all() \
                    and rows[key].is_unique else Sample.of(vals.to_numpy())
        out[g] = arms
    return out


def _t(r: TwoSample, p_adj: float | None = None) -> str:
    if np.isnan(r.p):
        return f"{r.diff:+.4f}, untested ({r.n}: too few values or no spread)"
    adj = f", Holm {p_adj:.3g}" if p_adj is not None else ""
    return f"{r.diff:+.4f}, {r.test} over {r.n} p = {r.p:.3g}{adj}"


def _set_text(b: BestOrTied) -> str:
    return b.describe()


def _untested_p(p: float) -> bool:
    """A test that could not run (one value, or a paper's mean without a spread): it is
    evidence neither way, so a verdict that hinges on it is "not testable"."""
    return bool(np.isnan(p))


UNTESTED = ("a comparison the verdict hinges on could not be tested (one value per arm, or "
            "a source without spreads)")


def describe(kind_and_params: dict[str, Any]) -> str:
    params = {k: v for k, v in kind_and_params.items() if k != "kind"}
    return RULES[kind_and_params["kind"]].describe(**params)


def _f(x: float) -> str:
    return f"{x:+.4f}"


def _untestable(why: str) -> Verdict:
    return Verdict(UNTESTABLE, why)


# -- SSL-vs-SSL: per-seed study scores -------------------------------------------------------
def _labeled_only() -> tuple[str, ...]:
    from scarcelab.tracking.query.views import LABELED_ONLY

    return tuple(LABELED_ONLY)


def _study_arms(data: SuiteData) -> dict[Any, dict[str, Sample]]:
    """dataset -> method -> its scores keyed by seed (or a paper's mean ± sd over n)."""
    return _arms(data.studies, ["dataset"], "method", "score", "seed")


def _family_of(data: SuiteData) -> dict[str, str]:
    for f in (data.studies, data.leaderboard):
        if not f.empty and "family" in f and "method" in f:
            return {str(m): str(x) for m, x in zip(f["method"], f["family"], strict=True)}
    return {}


def _vs_labeled_only(arms: dict[str, Sample], method: str) -> tuple[str, TwoSample] | None:
    """``method`` against the labeled-only method of highest mean on one dataset."""
    lo = {m: v for m, v in arms.items() if m in _labeled_only()}
    if method not in arms or not lo:
        return None
    ref = max(lo, key=lambda m: (lo[m].mean, m))
    return ref, compare(arms[method], lo[ref])


NO_SEEDS = ("no per-seed study scores (the gains table has means only: no test can be run "
            "on it)")


def _gain_everywhere_text(method: str, min_datasets: int = 2, alpha: float = 0.05) -> str:
    return (f"on every dataset {method}'s test balanced accuracy is significantly above the "
            "labeled-only method (sup, mixup, supcon) of highest mean: paired t over shared "
            f"seeds (Welch without), Holm over the datasets, p < {alpha:g}; testable with >= "
            f"{min_datasets} datasets")


@rule("gain_everywhere", _gain_everywhere_text)
def _gain_everywhere(data: SuiteData, method: str, min_datasets: int = 2,
                     alpha: float = 0.05) -> Verdict:
    arms = _study_arms(data)
    if not arms:
        return _untestable(NO_SEEDS)
    rows = [(ds, *r) for ds, a in arms.items() if (r := _vs_labeled_only(a, method))]
    if not rows:
        return _untestable(f"{method} has no score beside a labeled-only method")
    if len(rows) < min_datasets:
        return _untestable(f"{method} has a gain on {len(rows)} dataset(s); the rule needs "
                           f">= {min_datasets}")
    adj = holm([r.p for _, _, r in rows])
    ok = [r.diff > 0 and p < alpha for (_, _, r), p in zip(rows, adj, strict=True)]
    listing = "; ".join(f"{ds} vs {ref}: {_t(r, p)}" for (ds, ref, r), p
                        in zip(rows, adj, strict=True))
    failed = [not o and not _untested_p(r.p) for o, (_, _, r) in zip(ok, rows, strict=True)]
    if not all(ok) and not any(failed):
        return _untestable(f"{UNTESTED}: {listing}")
    return Verdict(REPRODUCED if all(ok) else NOT_REPRODUCED,
                   f"gains of {method} ({sum(ok)} of {len(rows)} significant): {listing}")


def _most_reliable_text(method: str, families: Sequence[str] = ("semi", "self"),
                        min_datasets: int = 2, alpha: float = 0.05) -> str:
    return (f"among the {' and '.join(families)} methods, {method}'s worst-case gain over "
            "the best labeled-only method (minimum over the datasets every compared method "
            f"has) is the highest, or tied: no method of higher worst case is significantly "
            f"above {method} on the dataset of {method}'s worst case (paired t over shared "
            f"seeds, Welch without; Holm over those methods; p < {alpha:g}); testable with >= "
            f"{min_datasets} such datasets and >= 2 methods")


@rule("most_reliable_gain", _most_reliable_text)
def _most_reliable(data: SuiteData, method: str, families: Sequence[str] = ("semi", "self"),
                   min_datasets: int = 2, alpha: float = 0.05) -> Verdict:
    arms = _study_arms(data)
    if not arms:
        return _untestable(NO_SEEDS)
    fam = _family_of(data)
    cands = {m for a in arms.values() for m in a if fam.get(m) in set(families)}
    gains: dict[str, dict[Any, float]] = {m: {} for m in cands}
    for ds, a in arms.items():
        lo = [v.mean for m, v in a.items() if m in _labeled_only()]
        for m in cands & set(a):
            if lo:
                gains[m][ds] = a[m].mean - max(lo)
    if method not in gains or not gains[method]:
        return _untestable(f"{method} has no gain (not run, or no labeled-only method beside it)")
    shared = set.intersection(*(set(g) for g in gains.values() if g))
    table = {m: {d: g[d] for d in shared} for m, g in gains.items() if g}
    if len(table) < 2:
        return _untestable(f"{len(table)} {'/'.join(families)} method(s) with gains")
    if len(shared) < min_datasets:
        return _untestable(f"the compared methods share {len(shared)} dataset(s); the rule "
                           f"needs >= {min_datasets}")
    worst = {m: min(g.values()) for m, g in table.items()}
    order = sorted(worst, key=lambda m: (-worst[m], m))
    rank = order.index(method) + 1
    head = (f"worst-case gain of {method} {_f(worst[method])} (rank {rank} of {len(order)} "
            f"over {len(shared)} datasets); highest: {order[0]} {_f(worst[order[0]])}")
    above = order[:rank - 1]
    if not above:
        return Verdict(REPRODUCED, head)
    d_star = min(table[method], key=lambda d: (table[method][d], str(d)))
    tests = [compare(arms[d_star][m], arms[d_star][method]) for m in above]
    adj = holm([r.p for r in tests])
    sig = [m for m, r, p in zip(above, tests, adj, strict=True) if r.diff > 0 and p < alpha]
    listing = "; ".join(f"{m}: {_t(r, p)}" for m, r, p in zip(above, tests, adj, strict=True))
    if not sig and any(_untested_p(r.p) for r in tests):
        return _untestable(f"{head}; {UNTESTED}: on {d_star}, {listing}")
    return Verdict(NOT_REPRODUCED if sig else REPRODUCED,
                   f"{head}; on {d_star} ({method}'s worst), the methods of higher worst case "
                   f"against {method}: {listing}"
                   + (f" ({', '.join(sig)} significantly above)" if sig else " (tied)"))


def _family_beats_text(family: str = "semi", min_datasets: int = 2,
                       at_least: int | str = "all", alpha: float = 0.05) -> str:
    k = "every dataset" if at_least == "all" else f">= {at_least} datasets"
    return (f"the {family} method of highest mean test balanced accuracy is significantly "
            f"above the labeled-only method of highest mean on {k} (paired t over shared "
            f"seeds, Welch without; Holm over the datasets; p < {alpha:g}); testable with >= "
            f"{min_datasets} datasets")


@rule("family_beats_labeled_only", _family_beats_text)
def _family_beats(data: SuiteData, family: str = "semi", min_datasets: int = 2,
                  at_least: int | str = "all", alpha: float = 0.05) -> Verdict:
    arms = _study_arms(data)
    if not arms:
        return _untestable(NO_SEEDS)
    fam = _family_of(data)
    rows = []
    for ds, a in arms.items():
        part = {m: v for m, v in a.items() if fam.get(m) == family}
        if not part:
            continue
        top = max(part, key=lambda m: (part[m].mean, m))
        if (r := _vs_labeled_only(a, top)) is not None:
            rows.append((ds, top, *r))
    if len(rows) < min_datasets:
        return _untestable(f"{family} methods have gains on {len(rows)} dataset(s); the "
                           f"rule needs >= {min_datasets}")
    adj = holm([r.p for *_, r in rows])
    wins = [r.diff > 0 and p < alpha for (*_, r), p in zip(rows, adj, strict=True)]
    need = len(rows) if at_least == "all" else int(at_least)
    listing = "; ".join(f"{ds}: {top} vs {ref} {_t(r, p)}" for (ds, top, ref, r), p
                        in zip(rows, adj, strict=True))
    if sum(wins) < need <= sum(wins) + sum(_untested_p(r.p) for *_, r in rows):
        return _untestable(f"{UNTESTED}: {listing}")
    return Verdict(REPRODUCED if sum(wins) >= need else NOT_REPRODUCED,
                   f"best {family} method per dataset against the best labeled-only: {listing}"
                   f" ({sum(wins)} of {len(rows)} significantly above)")


def _untested_text(needs: str) -> str:
    return f"needs {needs}"


@rule("needs", _untested_text)
def _untested(data: SuiteData, needs: str) -> Verdict:
    return _untestable(f"the suite's grid does not test it: it needs {needs}")


# -- CDALBench: AL AUCs -----------------------------------------------------------------
def _al_arms(data: SuiteData) -> dict[Any, dict[str, Sample]]:
    """(dataset, query size) -> strategy -> its AUCs keyed by repetition (repetition k of
    every strategy shares its data and initial model, docs/active.md), or a paper's mean ±
    sd over its runs."""
    return _arms(data.al, ["dataset", "query_size"], "strategy", "auc", "repetition")


def _oracle_text(oracle: str = "oracle", min_problems: int = 2, alpha: float = 0.05) -> str:
    return (f"no strategy's AUC is significantly above {oracle}'s on any (dataset, query "
            "size) problem (paired t over shared repetitions, Welch without; Holm over every "
            f"strategy of higher mean on every problem; p < {alpha:g}); testable with >= "
            f"{min_problems} problems that ran it and another strategy")


@rule("oracle_best", _oracle_text)
def _oracle_best(data: SuiteData, oracle: str = "oracle", min_problems: int = 2,
                 alpha: float = 0.05) -> Verdict:
    arms = _al_arms(data)
    probs = {k: a for k, a in arms.items() if oracle in a and len(a) > 1}
    if not any(oracle in a for a in arms.values()):
        return _untestable(f"no finished {oracle} repetitions")
    if len(probs) < min_problems:
        return _untestable(f"{len(probs)} problem(s) with {oracle} and another strategy; "
                           f"the rule needs >= {min_problems}")
    pairs = [((ds, q), m, compare(a[m], a[oracle])) for (ds, q), a in probs.items()
             for m in a if m != oracle and a[m].mean >= a[oracle].mean]
    if not pairs:
        return Verdict(REPRODUCED, f"{oracle} has the highest mean AUC on all {len(probs)} "
                       "problems (no test needed)")
    adj = holm([r.p for *_, r in pairs])
    lines = [f"{ds} q={q}: {m} {_t(r, p)}" for ((ds, q), m, r), p in zip(pairs, adj,
                                                                      strict=True)]
    sig = [ln for ln, (_, _, r), p in zip(lines, pairs, adj, strict=True)
           if r.diff > 0 and p < alpha]
    if sig:
        return Verdict(NOT_REPRODUCED, f"significantly above {oracle} on {len(sig)} "
                       f"pair(s): " + "; ".join(sig))
    if any(r.diff > 0 and _untested_p(r.p) for *_, r in pairs):
        return _untestable(f"{UNTESTED}: " + "; ".join(lines))
    return Verdict(REPRODUCED, f"{oracle} is best or tied on all {len(probs)} problems; "
                   f"strategies of higher or equal mean, none significantly above: "
                   + "; ".join(lines))


def _winner_text(exclude: Sequence[str] = ("oracle",), min_problems: int = 2,
                 alpha: float = 0.05) -> str:
    return ("no single strategy (the oracle aside) is best or tied on every (dataset, query "
            "size) problem, among the strategies run on all of them: per problem the "
            "best-or-tied set is the top mean and every strategy not significantly below it "
            f"(paired t over shared repetitions, Welch without; Holm over the strategies; "
            f"p < {alpha:g}); testable with >= {min_problems} problems and >= 2 such "
            "strategies")


@rule("no_universal_winner", _winner_text)
def _no_universal_winner(data: SuiteData, exclude: Sequence[str] = ("oracle",),
                         min_problems: int = 2, alpha: float = 0.05) -> Verdict:
    arms = _al_arms(data)
    if not arms:
        return _untestable("no finished AL repetitions")
    common = set.intersection(*(set(a) for a in arms.values())) - set(exclude)
    if len(arms) < min_problems or len(common) < 2:
        return _untestable(f"{len(arms)} problem(s) and {len(common)} strategies run on all "
                           f"of them; the rule needs >= {min_problems} and >= 2")
    sets = {k: best_or_tied({m: a[m] for m in common}, alpha) for k, a in arms.items()}
    everywhere = sorted(set.intersection(*(set(b.tied) for b in sets.values())))
    listing = "; ".join(f"{ds} q={q}: {_set_text(b)}" for (ds, q), b in sets.items())
    # a strategy in every set only because some of its comparisons could not be run
    sure = [m for m in everywhere if not any(
        m != b.best and _untested_p(b.tests[m].p) for b in sets.values())]
    if everywhere and not sure:
        return _untestable(f"{UNTESTED}: {', '.join(everywhere)} best or tied on all "
                           f"{len(sets)} problems only by untested comparisons; {listing}")
    everywhere = sure
    if everywhere:
        return Verdict(NOT_REPRODUCED, f"{', '.join(everywhere)} best or tied on all "
                       f"{len(sets)} problems; best-or-tied sets: {listing}")
    return Verdict(REPRODUCED, f"every strategy is significantly below the best on >= 1 "
                   f"problem; best-or-tied sets: {listing}")


def _mislead_text(baseline: str = "random", runs: int = 3, min_repetitions: int = 5,
                  alpha: float = 0.05) -> str:
    return (f"on some problem, some strategy is significantly better than {baseline} over "
            f"one set of {runs} shared repetitions and significantly worse over another "
            f"(paired t over the {runs} repetitions, two-sided p < {alpha:g} with the sign "
            "of the mean difference; every subset tried, no correction: the claim is that "
            "picking the runs can produce either answer); testable with >= "
            f"{min_repetitions} shared repetitions")


def _subset_p(d: np.ndarray, runs: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean and paired-t p-value of every ``runs``-subset of the differences ``d``."""
    from scipy import stats as sps

    idx = np.array(list(itertools.combinations(range(len(d)), runs)))
    sub = d[idx]
    mean = sub.mean(axis=1)
    sd = sub.std(axis=1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = mean / (sd / math.sqrt(runs))
    p = np.where(sd > 0, 2 * sps.t.sf(np.abs(t), runs - 1), np.where(mean == 0, 1.0, 0.0))
    return mean, p


@rule("few_runs_mislead", _mislead_text)
def _few_runs_mislead(data: SuiteData, baseline: str = "random", runs: int = 3,
                      min_repetitions: int = 5, alpha: float = 0.05) -> Verdict:
    a = data.al
    if a.empty or baseline not in set(a["strategy"]) or "repetition" not in a \
            or "auc" not in a:
        return _untestable(f"no finished {baseline} repetitions (per repetition: a paper's "
                           "mean ± sd cannot show it)")
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
            mean, p = _subset_p(d, runs)
            up, down = (mean > 0) & (p < alpha), (mean < 0) & (p < alpha)
            if up.any() and down.any():
                flipped += 1
                example = example or (
                    f"e.g. {s} on {ds} q={q}: {runs}-run mean difference {mean[up].max():+.4f}"
                    f" (p = {p[up][mean[up].argmax()]:.3g}) and {mean[down].min():+.4f} "
                    f"(p = {p[down][mean[down].argmin()]:.3g})")
    if not tested:
        return _untestable(f"no strategy shares >= {min_repetitions} repetitions with "
                           f"{baseline} on a problem")
    return Verdict(REPRODUCED if flipped else NOT_REPRODUCED,
                   f"{flipped} of {tested} (problem, strategy) pairs are significantly better "
                   f"and significantly worse than {baseline} depending on the {runs} runs"
                   + (f"; {example}" if example else ""))


# -- C-Score: accuracy masking -----------------------------------------------------------
DIAGS = ("cci_final", "ple_final", "sem_drift_final", "grad_align_final")


def _masking_text(acc_tol: float = 0.03, diag_change: float = 0.25, min_ratio: float = 0.3,
                  share: float = 0.5, max_ratio: float | None = None,
                  alpha: float = 0.05) -> str:
    top = f"highest ratio r (>= {min_ratio:g}" + (f", <= {max_ratio:g})" if max_ratio
                                                   else ")")
    return (f"at each method x OOD source's {top}, the test balanced accuracy of the "
            f"best-on-validation checkpoint is within ±{acc_tol:g} of r = 0 (two one-sided "
            f"tests, the {1 - 2 * alpha:.0%} interval of the difference inside the margin: "
            "paired t over the seeds both ratios ran when >= 2 are shared, else Welch with "
            ">= 2 runs at each) while a diagnostic (CCI, PLE, Sem-Drift, Grad-Align; final "
            f"epoch) moved by >= {diag_change:.0%} of its r = 0 value. A pair is decided "
            "masked (interval inside the margin, diagnostic moved) or not masked (interval "
            "wholly outside the margin, or no diagnostic moved); an interval across the "
            "margin, or one run at a ratio, leaves it undecided. Reproduced when the masked "
            f"pairs are >= {share:.0%} of all; not reproduced when the undecided ones could "
            "not lift them there; otherwise not testable at this scale, with the seeds the "
            "observed spread would need")


@dataclass(frozen=True)
class _Flatness:
    state: str  # "flat" | "changed" | "undecided"
    text: str
    seeds_needed: int | None = None  # for "undecided": at the observed mean and spread


def _seeds_for(mean: float, unit_sd: float, tol: float, alpha: float) -> int | None:
    """The smallest n whose one-sided t bound ``|mean| + t_{1-alpha, n-1} unit_sd / sqrt(n)``
    fits inside ``tol``, if the observed mean and spread held; None when it never does."""
    if not abs(mean) < tol or not np.isfinite(unit_sd):
        return None
    from scipy import stats as sps

    for n in range(2, 1001):
        if abs(mean) + float(sps.t.ppf(1 - alpha, n - 1)) * unit_sd / math.sqrt(n) < tol:
            return n
    return None


def _flat(base: pd.DataFrame, top: pd.DataFrame, tol: float, alpha: float) -> _Flatness:
    """Whether the accuracy change top - base is inside ±tol (TOST). Rows that share a
    seed are paired (a seed's r = 0 and r > 0 studies share its clean split and labeled
    set); with fewer than 2 shared seeds, Welch over the runs; with one run, undecided."""
    acc = "best_test_bacc"
    b = pd.to_numeric(base[acc], errors="coerce")
    t = pd.to_numeric(top[acc], errors="coerce")
    level = f"{1 - 2 * alpha:.0%}"

    def decide(lo: float, hi: float, mean: float, unit_sd: float, text: str) -> _Flatness:
        if -tol < lo and hi < tol:
            return _Flatness("flat", text)
        if lo >= tol or hi <= -tol:
            return _Flatness("changed", text)
        return _Flatness("undecided", text, _seeds_for(mean, unit_sd, tol, alpha))

    if "seed" in base and "seed" in top:
        bs = pd.Series(b.to_numpy(), index=base["seed"].astype(str)).dropna()
        ts = pd.Series(t.to_numpy(), index=top["seed"].astype(str)).dropna()
        bs, ts = (s[~s.index.duplicated()] for s in (bs, ts))
        shared = sorted(set(bs.index) & set(ts.index))
        if len(shared) >= 2:
            d = (ts[shared] - bs[shared]).to_numpy()
            _, lo, hi = tost_paired(ts[shared].to_numpy(), bs[shared].to_numpy(), tol, alpha)
            return decide(lo, hi, float(d.mean()), float(d.std(ddof=1)),
                          f"accuracy {d.mean():+.4f}, paired TOST over {len(shared)} seeds, "
                          f"{level} interval [{lo:+.4f}, {hi:+.4f}]")
    bv, tv = b.dropna().to_numpy(), t.dropna().to_numpy()
    diff = float(tv.mean() - bv.mean())
    if len(bv) < 2 or len(tv) < 2:
        return _Flatness("undecided", f"accuracy {diff:+.4f} (n = {len(bv)}/{len(tv)}, "
                         "untested)")
    _, lo, hi = tost_welch(tv, bv, tol, alpha)
    unit = math.sqrt(float(bv.var(ddof=1)) + float(tv.var(ddof=1)))  # per seed and arm
    return decide(lo, hi, diff, unit, f"accuracy {diff:+.4f}, Welch TOST (n = "
                  f"{len(bv)}/{len(tv)}) {level} interval [{lo:+.4f}, {hi:+.4f}]")


@rule("accuracy_masking", _masking_text)
def _accuracy_masking(data: SuiteData, acc_tol: float = 0.03, diag_change: float = 0.25,
                      min_ratio: float = 0.3, share: float = 0.5,
                      max_ratio: float | None = None, alpha: float = 0.05) -> Verdict:
    t = data.table_a1
    if t.empty:
        return _untestable("no finished contamination studies")
    masked, not_masked, undecided, listing, needs = 0, 0, 0, [], []
    for (m, src), g in t.groupby(["method", "source"], sort=True):
        base = g[g["ratio"] == 0.0]
        dirty = g[(g["ratio"] > 0.0) & ((g["ratio"] <= max_ratio) if max_ratio else True)]
        if base.empty or dirty.empty:
            continue
        r_top = float(dirty["ratio"].max())
        top = dirty[dirty["ratio"] == r_top]
        if r_top < min_ratio:
            continue
        rel = [abs(float(v)) for d in DIAGS if f"rel_{d}" in top
               for v in [pd.to_numeric(top[f"rel_{d}"], errors="coerce").mean()]
               if pd.notna(v)]
        has_acc = [pd.to_numeric(x["best_test_bacc"], errors="coerce").notna().any()
                   for x in (base, top)]
        if not rel or not all(has_acc):
            continue
        f = _flat(base, top, acc_tol, alpha)
        moved = max(rel) >= diag_change
        if moved and f.state == "flat":
            masked, state = masked + 1, "masked"
        elif not moved or f.state == "changed":
            not_masked, state = not_masked + 1, "not masked"
        else:
            undecided, state = undecided + 1, "undecided"
            needs.append(f"{m}/{src}: " + (f"~{f.seeds_needed} seeds" if f.seeds_needed
                                           else "no seed count (|change| >= margin)"))
        listing.append(f"{m}/{src} r={r_top:g}: {f.text}, largest diagnostic change "
                       f"{max(rel):.0%} ({state})")
    pairs = masked + not_masked + undecided
    if not pairs:
        return _untestable(f"no method x source pair with r = 0, a ratio >= {min_ratio:g}"
                           + (f" and <= {max_ratio:g}" if max_ratio else "")
                           + " and finite diagnostics")
    counts = (f"{masked} of {pairs} pairs masked, {not_masked} not masked, "
              f"{undecided} undecided: ")
    if masked / pairs >= share:
        return Verdict(REPRODUCED, counts + "; ".join(listing))
    if (masked + undecided) / pairs < share:
        return Verdict(NOT_REPRODUCED, counts + "; ".join(listing))
    return Verdict(UNTESTABLE, counts + "; ".join(listing) + ". Not testable at this "
                   f"scale: the undecided pairs' {1 - 2 * alpha:.0%} intervals cross the "
                   f"±{acc_tol:g} margin; at the observed spread they would need "
                   + ", ".join(needs))


# -- Kang et al.: transfer ----------------------------------------------------------------
def _encoder_text(better: str = "@pretrain", worse: str = "random",
                  columns: Sequence[str] = (), alpha: float = 0.05) -> str:
    return (f"the encoder {better} is significantly above {worse} on every transfer column "
            f"matching: {', '.join(columns)} (paired t over the seeds both have, Welch "
            f"without; Holm over the columns; p < {alpha:g}); testable when both rows have "
            "those columns, from >= 2 seeds each")


@rule("encoder_beats", _encoder_text)
def _encoder_beats(data: SuiteData, better: str = "@pretrain", worse: str = "random",
                   columns: Sequence[str] = (), alpha: float = 0.05) -> Verdict:
    t = data.transfer
    if t.empty or "encoder" not in t:
        return _untestable("no finished probe or segment runs")
    rows = t.set_index("encoder")
    missing = [e for e in (better, worse) if e not in rows.index]
    if missing:
        return _untestable(f"no transfer row for {', '.join(missing)}")
    cells, absent = [], []

    def cell(encoder: str, c: Any) -> float:
        """One transfer cell (one row per encoder): a score, NaN where not measured."""
        return cast("float", rows.loc[encoder, c])

    for pat in columns:
        cols = [c for c in rows.columns if pat in str(c)
                and pd.notna(cell(better, c)) and pd.notna(cell(worse, c))]
        if not cols:
            absent.append(pat)
        cells += cols
    if absent:
        return _untestable(f"no column with both encoders for: {', '.join(absent)}")
    means = "; ".join(f"{c}: {float(cell(better, c)):.4f} vs {float(cell(worse, c)):.4f}"
                      for c in cells)
    tr = data.transfer_runs
    if tr.empty:
        return _untestable(f"means only (no per-seed values to test): {better} vs {worse}: "
                           f"{means}")
    arms = _arms(tr[tr["column"].isin(cells)], ["column"], "encoder", "value", "seed")
    tests = [compare(arms.get(c, {}).get(better, Sample.of([])),
                     arms.get(c, {}).get(worse, Sample.of([]))) for c in cells]
    adj = holm([r.p for r in tests])
    sig = [r.diff > 0 and p < alpha for r, p in zip(tests, adj, strict=True)]
    listing = "; ".join(f"{c}: {_t(r, p)}" for c, r, p in zip(cells, tests, adj, strict=True))
    if all(sig):
        return Verdict(REPRODUCED, f"{better} vs {worse}: {listing}")
    if any(not g and not _untested_p(r.p) for g, r in zip(sig, tests, strict=True)):
        return Verdict(NOT_REPRODUCED, f"{better} vs {worse}: {listing}")
    return _untestable(f"{UNTESTED}: {better} vs {worse}: {listing}")


# -- Tune It: retrains ---------------------------------------------------------------------
def _retrain_arms(data: SuiteData, min_runs: int) -> dict[Any, dict[str, Sample]]:
    """dataset -> method -> its final retrains (unpaired: retrains of two methods share no
    seed), or a paper's mean ± sd; methods with fewer than ``min_runs`` retrains left out
    (a paper's row without n is kept: its count is unknown, and it is never significant)."""
    arms = _arms(data.retrains, ["dataset"], "method", "score", None)
    return {ds: {m: v for m, v in a.items() if v.n >= min_runs or v.values is None}
            for ds, a in arms.items()}


def _competitive_text(baseline: str = "ce", max_better: int = 1, alpha: float = 0.05,
                      min_methods: int = 3, min_runs: int = 2) -> str:
    return (f"on every dataset at most {max_better} method(s) are significantly above "
            f"{baseline} over the final retrains (two-sided Welch t, Holm over the methods "
            f"of the dataset, p < {alpha:g}); testable with >= {min_methods} methods of >= "
            f"{min_runs} retrains each")


@rule("baseline_competitive", _competitive_text)
def _baseline_competitive(data: SuiteData, baseline: str = "ce", max_better: int = 1,
                          alpha: float = 0.05, min_methods: int = 3,
                          min_runs: int = 2) -> Verdict:
    if data.retrains.empty:
        return _untestable("no finished retrains")
    parts, ok_all, tested = [], True, 0
    for ds, vals in _retrain_arms(data, min_runs).items():
        if baseline not in vals or len(vals) < min_methods:
            continue
        tested += 1
        others = [m for m in vals if m != baseline]
        tests = [compare(vals[m], vals[baseline]) for m in others]
        adj = holm([r.p for r in tests])
        better = sorted(m for m, r, p in zip(others, tests, adj, strict=True)
                        if r.diff > 0 and p < alpha)
        tied = sorted(m for m, r in zip(others, tests, strict=True)
                      if r.diff > 0 and m not in better)
        unknown = [m for m, r in zip(others, tests, strict=True)
                   if r.diff > 0 and _untested_p(r.p)]
        if len(better) <= max_better < len(better) + len(unknown):
            return _untestable(f"{ds}: {UNTESTED} ({', '.join(sorted(unknown))} above "
                               f"{baseline} by mean)")
        ok_all &= len(better) <= max_better
        parts.append(f"{ds}: {len(better)} of {len(others)} significantly above {baseline}"
                     + (f" ({', '.join(better)})" if better else "")
                     + (f"; higher mean, not significant: {', '.join(tied)}" if tied else ""))
    if not tested:
        return _untestable(f"no dataset with {baseline} and >= {min_methods} methods of >= "
                           f"{min_runs} retrains")
    return Verdict(REPRODUCED if ok_all else NOT_REPRODUCED, "; ".join(parts))


def _best_text(method: str, dataset: str, alpha: float = 0.05, min_methods: int = 3,
               min_runs: int = 2) -> str:
    return (f"{method} is in the best-or-tied set on {dataset}: the top mean over the final "
            "retrains and every method not significantly below it (two-sided Welch t, Holm "
            f"over the methods, p < {alpha:g}); testable with >= {min_methods} methods of >= "
            f"{min_runs} retrains")


@rule("best_or_tied", _best_text)
def _best_or_tied(data: SuiteData, method: str, dataset: str, alpha: float = 0.05,
                  min_methods: int = 3, min_runs: int = 2) -> Verdict:
    vals = _retrain_arms(data, min_runs).get(dataset, {}) if not data.retrains.empty else {}
    if method not in vals or len(vals) < min_methods:
        return _untestable(f"{dataset}: {method} {'missing' if method not in vals else 'ok'}"
                           f", {len(vals)} method(s) with >= {min_runs} retrains; the rule "
                           f"needs {method} and >= {min_methods}")
    b = best_or_tied(vals, alpha)
    head = f"best: {b.best} {vals[b.best].mean:.4f}; best-or-tied set {_set_text(b)}"
    if b.best == method:
        return Verdict(REPRODUCED, f"{method} has the best mean ({vals[method].mean:.4f}); "
                       f"{head}")
    if _untested_p(b.tests[method].p):
        return _untestable(f"{head}; {method} {vals[method].mean:.4f}: {UNTESTED}")
    return Verdict(REPRODUCED if method in b.tied else NOT_REPRODUCED,
                   f"{head}; {method} {vals[method].mean:.4f}: "
                   f"{_t(b.tests[method], b.p_holm[method])}")
