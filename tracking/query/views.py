"""The views: each takes a :class:`~tracking.query.frame.Tracked` and returns a DataFrame.

* :func:`leaderboard` — per study the checkpoint best on validation, its test metrics,
  aggregated per (dataset, label budget, method) over seeds.
* :func:`gains` — SSL-vs-SSL (Table 3): each method's gain over the best labeled-only
  method per dataset, with the median and worst gain across datasets.
* :func:`profile` — SSL-vs-SSL (Fig. 1): at each time t, the test score of the checkpoint
  that was best on validation by t; mean and min/max over seeds.
* :func:`significance` — "Tune It or Don't Use It" (Table 3): Welch's t-test of every
  method against the best one per dataset.
* :func:`ranks` / :func:`al_ranks` — average ranks over problems (``tracking.stats``); AL
  strategies over (dataset, query size, repetition) blocks, as ``tracking.al``.

Label budgets never mix: a "dataset" block is (dataset, n_labeled) whenever the studies
carry ``n_labeled``; the leaderboard ranks, and :func:`significance` tests, within one time
budget (``budget_minutes``) of such a block, and :func:`mixed_budgets` names the blocks that
hold several. Nor does anything else: studies of one method that
were run with different settings — any param but the seed and a few names of places
(``frame.study_settings``) — are different *variants* of it, each with its own leaderboard
row, gains row, Welch test and profile; and a seed repeated with the same settings is one
sample (the latest study is kept, and the leaderboard says which).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, cast

import numpy as np
import pandas as pd
from scipy import stats as sps

from scarcelab.tracking import stats
from scarcelab.tracking.query.frame import VAL, Tracked, study_settings
from scarcelab.tracking.query.keys import BLOCK, RANKED, block_columns
from scarcelab.tracking.query.registry import EVERY_ENTRY, SweepContext, ViewFunctions, view

TEST = "test_balanced_accuracy"
LABELED_ONLY = ("sup", "mixup", "supcon")
#: settings the leaderboard shows as columns of their own (the rest go to ``setting``)
SHOWN = ("n_val", "arch", "budget_minutes", "search")
#: per-study columns that say which variant a study is and whether it is a sample
VARIANT_COLUMNS = ["config", "setting", "variant", "kept", "duplicate_of"]


class TTestFields(Protocol):
    """The fields read from scipy's ``TtestResult``: scipy builds that class at run time
    (``_make_tuple_bunch``), so a type checker cannot see them."""

    statistic: float
    pvalue: float


def _as_set(x: Any) -> set[Any] | None:
    if x is None:
        return None
    if isinstance(x, str):
        return {s for s in x.split(",") if s}
    if isinstance(x, Iterable):
        return set(x)
    return {x}


def filter_frame(df: pd.DataFrame, family: Any = None, dataset: Any = None,
                 n_labeled: Any = None, budget_minutes: Any = None,
                 method: Any = None) -> pd.DataFrame:
    """Keep rows matching every given filter (a value, a list, or a comma-separated str)."""
    for col, want in (("family", family), ("dataset", dataset), ("method", method),
                      ("n_labeled", n_labeled), ("budget_minutes", budget_minutes)):
        allowed = _as_set(want)
        if allowed is None:
            continue
        if col not in df:
            return df.iloc[0:0]
        if col in ("n_labeled", "budget_minutes"):
            allowed = {float(a) for a in allowed}
            df = df[pd.to_numeric(df[col], errors="coerce").isin(allowed)]
        else:
            df = df[df[col].astype(str).isin({str(a) for a in allowed})]
    return df


def _block_keys(df: pd.DataFrame) -> list[str]:
    return list(BLOCK) if all(k in df and df[k].notna().any() for k in BLOCK[1:]) \
        else list(BLOCK[:1])


def per_study(t: Tracked, source: str = "auto", **filters: Any) -> pd.DataFrame:
    """One row per counted study: its reported checkpoint's validation and test metrics,
    and which variant of its method it is (:data:`VARIANT_COLUMNS`):

    * ``config`` — a digest of every setting it was run with (``frame.study_settings``);
    * ``setting`` — the settings that differ between studies of its method within some
      block, with this study's values, other than the :data:`SHOWN` ones (``"max_epochs=50,
      patience=5"``; empty when nothing differs; settings it does not have are left out),
      ``variant`` — the method's name with every such setting (``"fixmatch
      (budget_minutes=1)"``; the bare name when nothing differs): unique within a block
      and the same in every block, it is the name the cross-block views (gains, ranks,
      significance, profile) give the variant;
    * ``kept`` — whether it is the sample of its seed: of studies with the same block,
      variant and seed only the latest (start time) is kept, ``duplicate_of`` names it on
      the others. A study without a seed tag is a sample of its own."""
    sel = t.selected(source)
    for k in BLOCK:
        if k not in sel:
            sel[k] = np.nan
    sel = filter_frame(sel, **filters).reset_index(drop=True)
    return _variants(t, sel)


def _variants(t: Tracked, sel: pd.DataFrame) -> pd.DataFrame:
    """Add :data:`VARIANT_COLUMNS` (see :func:`per_study`) to the selected studies."""
    if sel.empty:
        return sel.assign(**{c: pd.Series(dtype=object) for c in VARIANT_COLUMNS})
    studies = t.studies().set_index("run_id")
    cfg = study_settings(studies.reset_index()).reindex(sel["study_id"].to_numpy())
    cfg = cfg.drop(columns=[c for c in cfg.columns if c in ("family", "method", *BLOCK)])
    filled = cfg.astype(object).where(cfg.notna(), "\x00unset")
    digest = pd.util.hash_pandas_object(filled[sorted(filled.columns)], index=False) \
        if len(filled.columns) else pd.Series(0, index=filled.index, dtype="uint64")
    config = [f"{int(h):016x}"[:12] for h in digest.to_numpy()]
    keys = pd.DataFrame({"family": sel.get("family"), "method": sel.get("method"),
                         **{k: sel[k] for k in BLOCK}})
    # per method: the settings that differ between its studies within some block (only
    # methods with two configurations in a block can have any: the common case is cheap)
    varies: dict[tuple, list[str]] = {}
    keyed = keys.reset_index(drop=True).assign(config=config)
    n_cfg = keyed.groupby(["family", "method", *BLOCK], dropna=False)["config"].nunique()
    several = {cast("tuple", k)[:2] for k, v in n_cfg.items() if v > 1}  # keys: tuples
    for m in several:
        rows = ((keyed["family"] == m[0]) | (keyed["family"].isna() & pd.isna(m[0]))) & (
            (keyed["method"] == m[1]) | (keyed["method"].isna() & pd.isna(m[1])))
        part = pd.concat([keyed.loc[rows, list(BLOCK)],
                          filled.reset_index(drop=True).loc[rows]], axis=1)
        n = part.groupby(list(BLOCK), dropna=False)[list(filled.columns)].nunique(
            dropna=False).max()
        varies[m] = sorted(n.index[n.to_numpy() > 1])
    setting, variant = [], []
    values = cfg.to_numpy(dtype=object)
    col = {c: j for j, c in enumerate(cfg.columns)}
    for i, (fam, meth) in enumerate(zip(keys["family"], keys["method"], strict=True)):
        # the settings that vary for this method, with this study's values; unset ones
        # are left out (two variants that differ in a setting cannot both have it unset,
        # so the names stay unique, and the same variant has the same name in every block)
        row = values[i]
        names = [(k, row[col[k]]) for k in varies.get((fam, meth), [])
                 if pd.notna(row[col[k]])]
        setting.append(", ".join(f"{k}={v}" for k, v in names if k not in SHOWN))
        pairs = ", ".join(f"{k}={v}" for k, v in names)
        variant.append(f"{meth} ({pairs})" if pairs else str(meth))
    out = sel.assign(config=config, setting=setting, variant=variant)
    if "search" not in out and "search" in cfg:
        out["search"] = cfg["search"].to_numpy()
    # one sample per seed: the latest study of a (block, variant, seed); the folds of a
    # --folds study (tag scarcelab.fold, "i/k") are samples of their own
    start = out["study_id"].map(studies["start_time"]) if "start_time" in studies else 0
    seed = out["seed"].astype(object).where(out["seed"].notna(), out["study_id"]) \
        if "seed" in out else out["study_id"]
    if "fold" in out:
        seed = seed.astype(str) + out["fold"].map(lambda f: f" fold {f}" if isinstance(f, str)
                                                  else "")
    order = out.assign(_start=start, _seed=seed.astype(str)).sort_values(
        "_start", kind="stable")
    grp = order.groupby([*BLOCK, "family", "method", "config", "_seed"], dropna=False,
                        sort=False)
    latest = grp["study_id"].transform("last")
    out["kept"] = (latest == order["study_id"]).reindex(out.index)
    out["duplicate_of"] = latest.where(latest != order["study_id"]).reindex(out.index)
    return out


def samples(t: Tracked, source: str = "auto", **filters: Any) -> pd.DataFrame:
    """:func:`per_study` without the repeated seeds: one row per (variant, seed)."""
    s = per_study(t, source, **filters)
    return s[s["kept"].astype(bool)].reset_index(drop=True) if len(s) else s


def _repeats(s: pd.DataFrame, keys: list[str]) -> pd.Series:
    """Per leaderboard row (``keys`` + config): which study stands for each seed that was
    run more than once (``"seed 0: kept 1a2b3c4d (latest of 2)"``), else ``""``."""
    dup = s[s["duplicate_of"].notna()] if "duplicate_of" in s else s.iloc[0:0]
    if dup.empty or "seed" not in s:
        return pd.Series(dtype=object)
    kept = s[s["study_id"].isin(set(dup["duplicate_of"]))]
    n = dup.groupby("duplicate_of").size()
    texts = kept.assign(_t=[f"seed {sd}: kept {str(k)[:8]} (latest of {int(n[k]) + 1})"
                            for sd, k in zip(kept["seed"], kept["study_id"], strict=True)])
    texts = texts.sort_values("seed", kind="stable")
    return texts.groupby([*keys, "config"], dropna=False)["_t"].agg("; ".join)


# -- figures (render imports matplotlib: only when a figure is drawn) -------------------
def _fig_leaderboard(t: Tracked, df: pd.DataFrame, filters: dict[str, Any]) -> Any:
    from scarcelab.tracking.query import render

    return render.plot_leaderboard(df)


def _fig_gains(t: Tracked, df: pd.DataFrame, filters: dict[str, Any]) -> Any:
    from scarcelab.tracking.query import render

    return render.plot_gains(df)


def _fig_profile(t: Tracked, df: pd.DataFrame, filters: dict[str, Any]) -> Any:
    from scarcelab.tracking.query import render

    return render.plot_profile(df)


def _fig_cd_study(t: Tracked, df: pd.DataFrame, filters: dict[str, Any]) -> Any:
    from scarcelab.tracking.query import render

    return render.cd_figure(study_scores(t, **filters), "methods over datasets")


def _fig_cd_al(t: Tracked, df: pd.DataFrame, filters: dict[str, Any]) -> Any:
    """None without AL runs: a CD diagram of no strategies says nothing."""
    from scarcelab.tracking.query import render

    if not len(t.role("al")):
        return None
    al_filters = {k: v for k, v in filters.items() if k != "source"}
    return render.cd_figure(al_scores(t, **al_filters), "AL strategies")


def _condense_profile(df: pd.DataFrame) -> pd.DataFrame:
    from scarcelab.tracking.query import render

    return render.condense_profile(df)


@view("leaderboard", order=10, in_report=True, entries=[EVERY_ENTRY], needs="study",
      figures={"leaderboard": _fig_leaderboard},
      note="Per study, the checkpoint best on validation balanced accuracy; its "
           "metrics averaged over seeds (std: sample std; n: distinct seeds). "
           "Studies run with different settings are different rows (setting: "
           "what else differs); a repeated seed counts once, the latest study "
           "(repeats: which was kept; n_runs: studies found).")
def leaderboard(t: Tracked, sort_by: str = f"{TEST}_mean", ascending: bool = False,
                source: str = "auto", **filters: Any) -> pd.DataFrame:
    """Mean, std (sample, ddof=1) and n over seeds of the selected checkpoint's metrics per
    (dataset, n_labeled, family, method, settings); sorted by ``sort_by`` within each
    dataset block.

    A row is one variant of a method (:func:`per_study`): the label budget, validation
    size, architecture, budget and search are columns; any other setting that differs is
    in ``setting``. ``n`` counts distinct seeds (each fold of a ``--folds`` study a seed of
    its own); ``n_runs`` the studies found; a seed run
    more than once counts once — the latest study — and ``repeats`` says which was kept.

    ``filters``: ``family``, ``dataset``, ``n_labeled``, ``budget_minutes``, ``method``.
    """
    return _leaderboard(t, sort_by, ascending, source, **filters).drop(columns="variant")


def _leaderboard(t: Tracked, sort_by: str = f"{TEST}_mean", ascending: bool = False,
                 source: str = "auto", **filters: Any) -> pd.DataFrame:
    """:func:`leaderboard` with the ``variant`` column."""
    s = per_study(t, source, **filters)
    metrics = [VAL] + sorted(c for c in s.columns if c.startswith("test_"))
    keys = block_columns("family", "method")
    for k in [*keys, *SHOWN]:
        if k not in s:
            s[k] = np.nan
    cols = [*keys, *SHOWN, "setting", "n", "n_runs", "repeats", "variant"] + [
        f"{m}_{a}" for m in metrics for a in ("mean", "std")]
    if s.empty:
        return pd.DataFrame(columns=cols)
    kept = s[s["kept"].astype(bool)]
    g = kept.groupby([*keys, "config"], dropna=False, sort=True)
    out = g[metrics].agg(["mean", "std"])
    out.columns = [f"{m}_{a}" for m, a in out.columns]
    first = g[[*SHOWN, "setting", "variant"]].first()
    out = first.join(out)
    out.insert(len(first.columns), "n", g.size())
    every = s.groupby([*keys, "config"], dropna=False, sort=True)
    out.insert(len(first.columns) + 1, "n_runs", every.size())
    out.insert(len(first.columns) + 2, "repeats",
               _repeats(s, keys).reindex(out.index).fillna("").astype(object))
    out = out.reset_index()[cols]
    out["budget_minutes"] = pd.to_numeric(out["budget_minutes"], errors="coerce").astype(float)
    if sort_by not in out:
        raise ValueError(f"cannot sort by {sort_by!r}; columns: {', '.join(out.columns)}")
    # the time budget is part of the ranked block: a 0.5-minute study is not ranked among
    # 3-minute ones (issue 43); mixed_budgets() names such blocks for a note
    out = out.sort_values([*RANKED, sort_by],
                          ascending=[True] * len(RANKED) + [ascending], kind="stable",
                          na_position="last")
    return out.reset_index(drop=True)


def mixed_budgets(df: pd.DataFrame) -> list[str]:
    """The (dataset, label budget) blocks of a leaderboard or significance frame whose
    studies ran with different time budgets, as ``"dA (n=40): 0.5, 1, 3 min"``: each is
    ranked (compared) within one time budget, and a reader is told so."""
    if df.empty or "budget_minutes" not in df:
        return []
    b = pd.to_numeric(df["budget_minutes"], errors="coerce")
    out = []
    keys = [k for k in BLOCK if k in df]
    for key, part in b.groupby([df[k] for k in keys], dropna=False, sort=True):
        vals = sorted(set(part.dropna()))
        if len(vals) + int(part.isna().any()) > 1:
            ds, nl = (key if isinstance(key, tuple) else (key,)) + (np.nan,) * (2 - len(keys))
            n_lab = cast("float", nl)  # n_labeled: a count, or NaN where unset
            where = f"{ds}" + (f" (n={int(n_lab)})" if pd.notna(n_lab) else "")
            names = [f"{v:g}" for v in vals] + (["unset"] if part.isna().any() else [])
            out.append(f"{where}: {', '.join(names)} min")
    return out


def _block_label(row: pd.Series, multi_budget: set[str]) -> str:
    if row["dataset"] in multi_budget and pd.notna(row.get("n_labeled")):
        return f"{row['dataset']} (n={int(row['n_labeled'])})"
    return str(row["dataset"])


@view("gains", order=20, in_report=True, figures={"gains": _fig_gains},
      note="Mean test balanced accuracy minus that of the best labeled-only method "
           "(sup, mixup, supcon) on each dataset; median and worst across datasets.")
def gains(t: Tracked, labeled_only: Sequence[str] = LABELED_ONLY, metric: str = TEST,
          source: str = "auto", **filters: Any) -> pd.DataFrame:
    """Rows: methods (a method run with several settings: one row per variant, named as in
    :func:`per_study`); columns: per dataset, mean ``metric`` minus the best labeled-only
    variant's mean on that dataset; then ``median_gain`` and ``worst_gain`` across
    datasets. The reference (variant, score) per dataset is in ``.attrs["reference"]``.
    Datasets with no labeled-only method are left out, with a warning."""
    lb = _leaderboard(t, source=source, **filters)
    col = f"{metric}_mean"
    if lb.empty:
        return pd.DataFrame(columns=["method", "median_gain", "worst_gain"])
    budgets = lb.groupby("dataset")["n_labeled"].nunique(dropna=True)
    multi = set(budgets[budgets > 1].index)
    lb = lb.assign(block=lb.apply(_block_label, axis=1, multi_budget=multi))
    table, reference = {}, {}
    for block, part in lb.groupby("block", sort=True):
        base = part[part["method"].isin(labeled_only)].dropna(subset=[col])
        if base.empty:
            warnings.warn(f"gains: no labeled-only method ({', '.join(labeled_only)}) on "
                          f"{block}; left out", stacklevel=2)
            continue
        # pandas-stubs take only some label types in .loc[]; idxmax gives a label of base
        best = base.loc[base[col].idxmax()]  # pyright: ignore[reportCallIssue, reportArgumentType]
        reference[block] = (best["variant"], float(best[col]))
        table[block] = part.set_index("variant")[col] - float(best[col])
    out = pd.DataFrame(table)
    if out.empty:
        return pd.DataFrame(columns=["method", "median_gain", "worst_gain"])
    out["median_gain"] = out.median(axis=1, skipna=True)
    out["worst_gain"] = out.drop(columns="median_gain").min(axis=1, skipna=True)
    out = out.sort_values("median_gain", ascending=False, kind="stable")
    out = out.rename_axis("method").reset_index()
    out.attrs["reference"] = reference
    return out


@view("significance", order=40, in_report=True,
      note="Welch's two-sided t-test of each method against the best mean per "
           "dataset, label budget and time budget; significantly_worse = p < 0.05.")
def significance(t: Tracked, metric: str = TEST, alpha: float = 0.05, source: str = "auto",
                 **filters: Any) -> pd.DataFrame:
    """Per (dataset, label budget, time budget) block, every method's per-seed ``metric``
    against the best method's (highest mean): two-sided Welch's t-test (unequal
    variances). ``p_value`` is NaN for the best itself and where either side has fewer
    than two seeds; ``significantly_worse`` is ``p_value < alpha`` (the paper sets the
    others in italics: not distinguishable from the best). A method run with several
    settings is one row per variant (``method`` is the variant's name, :func:`per_study`);
    a repeated seed is one sample. Studies of different time budgets are never tested
    against each other; a warning names the blocks that hold several."""
    s = samples(t, source, **filters)
    cols = [*RANKED, "method", "mean", "std", "n",
            "best_method", "t_statistic", "p_value", "significantly_worse"]
    if s.empty or metric not in s:
        return pd.DataFrame(columns=cols)
    # untagged studies form one block, as in leaderboard
    for k in RANKED:
        if k not in s:
            s[k] = np.nan
    s["budget_minutes"] = pd.to_numeric(s["budget_minutes"], errors="coerce").astype(float)
    rows = []
    mixed = mixed_budgets(s)
    if mixed:  # split, never compared: said once, so that a reader knows why
        warnings.warn("significance: studies of different time budgets are tested within "
                      "their own budget, never against each other: " + "; ".join(mixed),
                      stacklevel=2)
    for (ds, nl, bm), part in s.groupby(list(RANKED), dropna=False, sort=True):
        vals = {m: g[metric].dropna().to_numpy() for m, g in part.groupby("variant")}
        means = {m: v.mean() for m, v in vals.items() if len(v)}
        if not means:
            continue
        best = max(means, key=lambda m: (means[m], m))
        for m, v in vals.items():
            tstat = p = np.nan
            if m != best and len(v) >= 2 and len(vals[best]) >= 2:
                res = cast("TTestFields", sps.ttest_ind(v, vals[best], equal_var=False))
                tstat, p = float(res.statistic), float(res.pvalue)
            rows.append((ds, nl, bm, m, v.mean() if len(v) else np.nan,
                         v.std(ddof=1) if len(v) > 1 else np.nan, len(v), best, tstat, p,
                         bool(p < alpha) if np.isfinite(p) else False))
    out = pd.DataFrame(rows, columns=cols)
    return out.sort_values([*RANKED, "mean"],
                           ascending=[True] * len(RANKED) + [False],
                           kind="stable").reset_index(drop=True)


@view("profile", order=30, in_report=True, figures={"profile": _fig_profile},
      display=_condense_profile,
      display_note=" The page shows a few time points; profile.csv has all.",
      note="Score of the checkpoint best on validation by time t since the study "
           "started; mean and min/max over seeds (rows: every t on the grid).")
def profile(t: Tracked, grid: Sequence[float] | None = None, n_points: int = 60,
            metric: str = TEST, source: str = "auto", **filters: Any) -> pd.DataFrame:
    """Accuracy over time: for each (dataset, n_labeled, method) and time ``t_s`` on a grid
    (seconds since each study started; default: ``n_points`` from 0 to when the block's last
    checkpoint was evaluated), the ``metric`` of the checkpoint best on validation by then
    and that validation score (``val_*``, monotone in t), mean/min/max over the seeds. A
    value is NaN until every seed has evaluated a checkpoint, so the mean is over a fixed set
    of seeds and the validation mean stays monotone. ``method`` is the variant's name
    (:func:`per_study`); a repeated seed is one sample."""
    rec = t.record(source, tests=[metric])
    studies = samples(t, source, **filters)
    cols = block_columns("method", "t_s", "n", f"{metric}_mean", f"{metric}_min",
                         f"{metric}_max", f"{VAL}_mean", f"{VAL}_min", f"{VAL}_max")
    if studies.empty or rec.empty:
        return pd.DataFrame(columns=cols)
    if metric not in rec:
        raise ValueError(f"no {metric!r} in the checkpoint record; have "
                         f"{[c for c in rec.columns if c.startswith('test_')]}")
    rec = rec[rec["study_id"].isin(set(studies["study_id"]))].dropna(subset=["elapsed_s"])
    by_study = {sid: g for sid, g in rec.groupby("study_id", sort=False)}
    out = []
    for (ds, nl), block in studies.groupby(list(BLOCK), dropna=False, sort=True):
        ends = [by_study[s]["end_s"].max() for s in block["study_id"] if s in by_study]
        if not ends:
            continue
        ts = np.asarray(grid, dtype=float) if grid is not None else np.linspace(
            0.0, float(max(ends)), n_points)
        for m, grp in block.groupby("variant", sort=True):
            test = np.full((len(grp), len(ts)), np.nan)
            val = np.full_like(test, np.nan)
            for i, sid in enumerate(grp["study_id"]):
                r = by_study.get(sid)
                if r is None:
                    continue
                idx = np.searchsorted(r["elapsed_s"].to_numpy(), ts, side="right") - 1
                ok = idx >= 0
                test[i, ok] = r[metric].to_numpy()[idx[ok]]
                val[i, ok] = r[VAL].to_numpy()[idx[ok]]
            complete = cast("np.ndarray", ~np.isnan(val).any(axis=0))  # val is 2-D

            def agg(a: np.ndarray, fn: Any, complete: np.ndarray = complete) -> np.ndarray:
                res = np.full(a.shape[1], np.nan)
                if complete.any():
                    res[complete] = fn(a[:, complete], axis=0)
                return res

            out.append(pd.DataFrame({
                "dataset": ds, "n_labeled": nl, "method": m, "t_s": ts, "n": len(grp),
                f"{metric}_mean": agg(test, np.mean), f"{metric}_min": agg(test, np.min),
                f"{metric}_max": agg(test, np.max), f"{VAL}_mean": agg(val, np.mean),
                f"{VAL}_min": agg(val, np.min), f"{VAL}_max": agg(val, np.max)}))
    if not out:
        return pd.DataFrame(columns=cols)
    return pd.concat(out, ignore_index=True)[cols]


def study_scores(t: Tracked, metric: str = TEST, source: str = "auto",
                 **filters: Any) -> pd.DataFrame:
    """Rows: dataset blocks; columns: methods (their variants, :func:`per_study`); values:
    the leaderboard mean of ``metric``."""
    lb = _leaderboard(t, source=source, **filters)
    if lb.empty:
        return pd.DataFrame()
    lb = lb.assign(problem=lb["dataset"].astype(str) + np.where(
        lb["n_labeled"].notna(), " n=" + lb["n_labeled"].astype("Int64").astype(str), ""))
    scores = lb.pivot_table(index="problem", columns="variant", values=f"{metric}_mean",
                            aggfunc="mean")  # one leaderboard row per cell: nothing pooled
    scores.columns.name = "method"
    return scores


def al_scores(t: Tracked, metric: str = "al/auc", blocks: Sequence[str] = ("dataset",
              "query_size"), per_repetition: bool = False, **filters: Any) -> pd.DataFrame:
    """Rows: AL problems (``blocks``, plus ``repetition`` if ``per_repetition``); columns:
    strategies; values: the run's last ``metric`` (mean over repetitions otherwise)."""
    runs = t.role("al")
    if not t.include_failed:
        runs = runs[runs["status"] == "FINISHED"]
    col = f"metrics.{metric}"
    if runs.empty or col not in runs:
        return pd.DataFrame()
    runs = filter_frame(runs, **filters)
    name = runs["strategy"] if "strategy" in runs else runs.get("method")
    if name is None:
        raise ValueError("AL runs carry neither a scarcelab.strategy nor a scarcelab.method tag")
    keys = [b for b in blocks if b in runs] + (
        ["repetition"] if per_repetition and "repetition" in runs else [])
    runs = runs.assign(_strategy=name)
    scores = runs.pivot_table(index=keys, columns="_strategy", values=col, aggfunc="mean")
    scores.columns.name = "strategy"
    return scores


def _rank_table(scores: pd.DataFrame, scope: str) -> pd.DataFrame:
    """Average ranks with the Friedman test; with fewer than 2 complete blocks the test is
    not run (NaN, with a warning saying why) rather than printed as a meaningless p."""
    cols = ["scope", "method", "average_rank", "n_problems", "friedman_statistic",
            "friedman_p"]
    if scores.shape[1] < 2 or scores.dropna().empty:
        return pd.DataFrame(columns=cols)
    r = stats.average_ranks(scores)
    n = len(scores.dropna())
    if n < 2:
        warnings.warn(f"ranks ({scope}): only {n} complete block; no Friedman p-value "
                      "(it needs at least 2 blocks)", stacklevel=3)
        stat, p = np.nan, np.nan
    else:
        stat, p = stats.friedman_test(scores)
    return pd.DataFrame({"scope": scope, "method": r.index, "average_rank": r.to_numpy(),
                         "n_problems": n, "friedman_statistic": stat, "friedman_p": p})[cols]


def al_block_scores(t: Tracked, metric: str = "al/auc", **filters: Any) -> pd.DataFrame:
    """Rows: (dataset, query size, repetition) blocks; columns: strategies; values: the
    repetition's ``metric`` — CDALBench's blocks, chosen by ``tracking.al.cd_blocks`` (the
    one rank definition of ``scarcelab al-report`` and of these views)."""
    from scarcelab.tracking.al import BLOCK, cd_blocks

    scores = al_scores(t, metric, per_repetition=True, **filters)
    if scores.empty:
        return scores
    # one column level (the strategies): stack gives a Series
    long = cast("pd.Series", scores.stack()).dropna().rename("auc").reset_index()
    for key in BLOCK:  # runs without the tag form one block level
        if key not in long:
            long[key] = 0
    return cd_blocks(long[[*BLOCK, "strategy", "auc"]])


@view("ranks", order=50, in_report=True, entries=[EVERY_ENTRY],
      figures={"cd_study": _fig_cd_study, "cd_al": _fig_cd_al},
      note="Average rank (1 = best) over datasets (study) and over dataset x query size "
           "(al), with Friedman's test; CD diagrams use Wilcoxon-Holm cliques.")
def ranks(t: Tracked, metric: str = TEST, al_metric: str = "al/auc", source: str = "auto",
          **filters: Any) -> pd.DataFrame:
    """Average ranks (1 = best) of methods over dataset blocks (scope ``study``) and of AL
    strategies over (dataset, query size, repetition) blocks (scope ``al``, see
    :func:`al_block_scores`), whichever exist. Only the ``dataset`` filter applies to the
    AL runs."""
    parts = [_rank_table(study_scores(t, metric, source, **filters), "study")]
    if len(t.role("al")):  # label-budget / family filters are about studies, not AL runs
        al_filters = {k: v for k, v in filters.items() if k == "dataset"}
        parts.append(_rank_table(al_block_scores(t, al_metric, **al_filters), "al"))
    parts = [p for p in parts if len(p)]
    return pd.concat(parts, ignore_index=True) if parts else _rank_table(pd.DataFrame(), "")


def al_ranks(t: Tracked, metric: str = "al/auc", **kw: Any) -> pd.DataFrame:
    """Average ranks of AL strategies over (dataset, query size, repetition) blocks
    (:func:`al_block_scores`)."""
    return _rank_table(al_block_scores(t, metric, **kw), "al")


@view("al_ranks", order=55,
      note="Average rank (1 = best) of the AL strategies over (dataset, query size, "
           "repetition) blocks of their final AUC, with Friedman's test (CDALBench's "
           "blocks, as al-report ranks them).")
def _al_ranks_view(t: Tracked, metric: str = "al/auc", **filters: Any) -> pd.DataFrame:
    """:func:`al_ranks` as a view: only the ``dataset`` filter is about AL runs (as in
    :func:`ranks`); the study filters and ``source`` are not."""
    return al_ranks(t, metric, **{k: v for k, v in filters.items() if k == "dataset"})


#: name -> function of every registered view (read from the registry)
VIEWS = ViewFunctions()


TRANSFER_KEYS = ("encoder", "arch", "protocol", "label_fraction")


def _transfer_for_sweep(t: Tracked, ctx: SweepContext) -> pd.DataFrame:
    """The sweep's transfer table names an encoder a dependency resolved by the spec's
    reference, so its seeds are one row (:func:`transfer_view`)."""
    return transfer_view(t, ctx.refs())


def _transfer_markdown(df: pd.DataFrame) -> str:
    from scarcelab.tracking.query.render import to_markdown

    return to_markdown(df)


@view("transfer", order=80, entries=["probe", "segment"], section=False,
      markdown=_transfer_markdown, heading="Transfer", sweep_build=_transfer_for_sweep,
      note="Kang et al. (2022)'s comparison of encoders: a row per (encoder, "
           "architecture, protocol, label fraction), a column per task (probe accuracy "
           "and balanced accuracy, segmentation PQ / mPQ); means over the runs (seeds) of "
           "a cell, n_runs: how many.")
def transfer(t: Tracked, seg_metrics: Sequence[str] = ("seg/pq", "seg/mpq"),
             **filters: Any) -> pd.DataFrame:
    """Kang et al. (2022)'s comparison of encoders. A row is one (encoder source — the
    ``scarcelab.encoder`` tag: ``random``, a weights file, ``runs:/<id>/model``… —,
    architecture, protocol, label fraction), :data:`TRANSFER_KEYS`: runs that differ in
    any of them are never averaged together (an encoder probed as small_cnn and as
    resnet18 is two rows, as are 10 % and 100 % of the labels). Columns are tasks:
    ``<dataset> accuracy`` / ``balanced_accuracy`` of ``probe`` runs (their ``test/*``)
    and ``<dataset> <metric>`` for every ``seg_metrics`` key a ``segment`` run logged. The
    protocol is the run's own: ``linear`` / ``finetune`` for ``probe``, ``frozen`` /
    ``finetune`` for ``segment`` (``frozen`` is segmentation's counterpart of a linear
    probe, Kang et al. Fig. 1, but a trained decoder is not a logistic regression, so
    the two stay apart). Values are means over the runs (seeds) of a cell; ``n_runs``
    counts the runs of a row. Runs from before these tags existed have an empty ``arch``
    / ``protocol`` (segment: ``finetune``, the only protocol it had) and label fraction 1
    unless they say otherwise. Trial runs are left out (a fine-tuning study's trials carry
    its tags); only the ``dataset`` filter applies."""
    runs = t.runs
    keys = list(TRANSFER_KEYS)
    cols = [*keys, "encoder_method", "n_runs"]
    if "encoder" not in runs or runs.empty:
        return pd.DataFrame(columns=cols)
    runs = runs[runs["encoder"].notna() & (runs.get("role") != "trial")]
    if not t.include_failed:
        runs = runs[runs["status"] == "FINISHED"]
    if filters.get("dataset") is not None:
        runs = filter_frame(runs, dataset=filters["dataset"])
    cells = []
    for _, r in runs.iterrows():
        ds = r.get("dataset", "")
        arch = r.get("arch")
        frac = pd.to_numeric(r.get("label_fraction", np.nan), errors="coerce")
        key = [r["encoder"], "" if pd.isna(arch) else str(arch), "",
               1.0 if pd.isna(frac) else float(frac)]
        protocol = r.get("protocol")
        if r.get("task") == "probe":
            key[2] = "" if pd.isna(protocol) else str(protocol)
            for m in ("accuracy", "balanced_accuracy"):
                v = r.get(f"metrics.test/{m}")
                if pd.notna(v):
                    cells.append((*key, f"{ds} {m}", v, r["run_id"]))
        key[2] = "finetune" if pd.isna(protocol) else str(protocol)
        for mkey in seg_metrics:
            v = r.get(f"metrics.{mkey}")
            if pd.notna(v):
                cells.append((*key, f"{ds} {mkey}", v, r["run_id"]))
    if not cells:
        return pd.DataFrame(columns=cols)
    long = pd.DataFrame(cells, columns=[*keys, "column", "value", "run_id"])
    wide = long.pivot_table(index=keys, columns="column", values="value", aggfunc="mean")
    wide.columns.name = None
    meth = runs.get("encoder_method", pd.Series(np.nan, index=runs.index))
    first = pd.Series(meth.to_numpy(), index=runs["encoder"].to_numpy()).dropna()
    first = first[~first.index.duplicated()]
    wide.insert(0, "encoder_method",
                first.reindex(wide.index.get_level_values("encoder")).to_numpy())
    wide.insert(1, "n_runs", long.groupby(keys)["run_id"].nunique().reindex(wide.index)
                .to_numpy())
    return wide.reset_index()


def transfer_view(t: Any, refs: Iterable[str]) -> pd.DataFrame:
    """Kang et al.'s comparison (rows = encoder, columns = tasks), with an encoder that a
    dependency resolved (``runs:/<id>/model`` of a cell of this sweep) shown as the spec's
    reference (``@pretrain``), so its seeds average into one row; segment's cross-dataset
    tests (``seg/cross/<set>/pq``) are columns too. ``refs``: the cells' REFS tags (JSON
    ``{option: [reference, resolved]}``).

    In the query layer, not in tracking/results/page.py, which shows it: the sweep's
    transfer view (:func:`_transfer_for_sweep`) builds on it, and reading runs never
    imports the pages that render them (tests/project/test_layers.py)."""
    labels: dict[str, str] = {}
    for text in refs:
        for ref, value in json.loads(text or "{}").values():
            labels[value] = ref
    runs = t.runs
    if labels and "encoder" in runs:
        runs = runs.assign(encoder=runs["encoder"].replace(labels))
    if "protocol" in runs and "params.n_labeled" in runs and "task" in runs:
        # probes with all labels and with a count are separate columns, not averaged. A
        # probe run records n_labeled=all resolved to a count (e.g. 1174); its
        # label_fraction tag (the share trained on; the CLI parameter stays 1 for a
        # count) is 1 then: "all labels", the column the paper file's claims name
        probe = runs["task"].eq("probe") & runs["protocol"].notna()
        full = (pd.to_numeric(runs["label_fraction"], errors="coerce") == 1.0
                if "label_fraction" in runs else pd.Series(False, index=runs.index))
        lab = runs["params.n_labeled"].astype(str).map(
            lambda v: "all labels" if v in ("all", "", "nan", "None") else f"{v} labels")
        lab = lab.where(~full, "all labels")
        runs = runs.assign(protocol=runs["protocol"].where(
            ~probe, runs["protocol"].astype(str) + " (" + lab + ")"))
    cross = sorted(c[len("metrics."):] for c in runs.columns
                   if c.startswith("metrics.seg/cross/") and c.endswith(("/pq", "/mpq")))
    return transfer(t.with_runs(runs), seg_metrics=("seg/pq", "seg/mpq", *cross))
