"""Active-learning views over tracked runs: AUC tables, ranks, critical-difference diagram.

Every AL repetition is one run (role ``al``) carrying ``al/auc`` and the tags dataset,
query_size, method and repetition (see ``scarcelab.active.loop``). Repetition k of every
strategy shares the data seed s_D + k and the model seed s_θ + k, so the AUCs of one
repetition are paired observations: strategies are ranked within each (dataset, query
size, repetition) block and the ranks averaged over all blocks, as CDALBench's
``results/cd_diagram.py`` does; Friedman, Wilcoxon–Holm and the CD diagram use the same
blocks (:func:`cd_blocks`). The significance statistics live in ``tracking.stats``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pandas as pd

from scarcelab import tags as T
from scarcelab.redaction import redact


def al_runs(experiments: list[str], tracking_uri: str | None = None) -> pd.DataFrame:
    """One row per finished AL repetition: dataset, query_size, strategy, repetition, auc."""
    import mlflow

    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    exps = [mlflow.get_experiment_by_name(e) for e in experiments]
    missing = [n for n, e in zip(experiments, exps, strict=True) if e is None]
    if missing:
        raise ValueError(f"experiment(s) {missing} not found at "
                         f"{redact(mlflow.get_tracking_uri())}")
    df = mlflow.search_runs(
        experiment_ids=[e.experiment_id for e in exps],  # type: ignore[union-attr]
        filter_string=f"tags.`{T.ROLE}` = 'al' and attributes.status = 'FINISHED'",
        output_format="pandas")
    cols = {f"tags.{T.DATASET}": "dataset", f"tags.{T.QUERY_SIZE}": "query_size",
            f"tags.{T.METHOD}": "strategy", f"tags.{T.REPETITION}": "repetition",
            "metrics.al/auc": "auc"}
    if df.empty or not set(cols) <= set(df.columns):
        return pd.DataFrame(columns=list(cols.values()))
    out = df[list(cols)].rename(columns=cols).dropna(subset=["auc"])
    out["query_size"] = out["query_size"].astype(int)
    out["repetition"] = out["repetition"].astype(int)
    # A sweep re-run under the same seeds duplicates rows; keep the latest (runs are sorted
    # newest first by search_runs).
    return out.drop_duplicates(["dataset", "query_size", "strategy", "repetition"])


def paired_blocks(runs: pd.DataFrame) -> pd.DataFrame:
    """Rows = (dataset, query_size, repetition), columns = strategies, values = AUC; NaN
    where a strategy was not run for that block."""
    return runs.pivot_table(index=["dataset", "query_size", "repetition"], columns="strategy",
                            values="auc", aggfunc="first")


#: CDALBench's blocks for every rank statistic (their ``results/cd_diagram.py``,
#: ``prepare_df``: ``dataset_name = dataset + query_size + trial``): each (dataset, query
#: size, repetition) is one block, ranks are taken within it and averaged over all blocks.
BLOCK = ["dataset", "query_size", "repetition"]


def cd_blocks(runs: pd.DataFrame) -> pd.DataFrame:
    """The blocks of the rank statistics (average rank, Friedman, Wilcoxon–Holm, CD diagram):
    one row per (dataset, query size, repetition) that every compared strategy finished,
    over the strategies run on every (dataset, query size) problem (a strategy run on some
    problems only would shrink the comparison for all; it keeps its per-problem ranks in
    :func:`rank_table`). ``runs``: one row per repetition with dataset, query_size,
    strategy, repetition, auc (:func:`al_runs`). This is the one rank definition of the AL
    views; ``tracking.query.views.al_ranks`` uses it too."""
    n_problems = runs.groupby(["dataset", "query_size"]).ngroups
    per_strategy = runs.drop_duplicates(["strategy", "dataset", "query_size"])
    covered = per_strategy["strategy"].value_counts()
    runs = runs[runs["strategy"].isin(covered[covered == n_problems].index)]
    return paired_blocks(runs).dropna()


def rank_table(runs: pd.DataFrame, notes: list[str] | None = None) -> pd.DataFrame:
    """Mean rank (1 = best AUC) per (dataset, query_size) over its repetition blocks, and
    the row ("mean", "all"): the mean rank over every block of :func:`cd_blocks` — the
    ranks the CD diagram shows.

    Within a problem, only strategies run on it are ranked, on the repetitions all of them
    finished; a strategy missing from a problem has no rank there (NaN), nor in the
    overall row. What cannot be ranked — a problem whose strategies share no repetition,
    an overall row with no strategy run on every problem — is NaN, and the reason is
    appended to ``notes`` (any experiment gets a table, never a crash)."""
    from scarcelab.tracking.stats import average_ranks

    notes = notes if notes is not None else []
    blocks = paired_blocks(runs)
    rows = {}
    for key, sub in blocks.groupby(level=[0, 1]):
        sub = sub.droplevel([0, 1]).dropna(axis=1, how="all")
        complete = sub.dropna()
        if complete.empty:
            notes.append(f"{key[0]} q={key[1]}: its strategies ({', '.join(sub.columns)}) "
                         "share no repetition, so they cannot be ranked against each other "
                         "there (ranks compare the same repetition, i.e. the same data and "
                         "initial model)")
            rows[key] = pd.Series(float("nan"), index=sub.columns)
            continue
        rows[key] = average_ranks(complete)
    table = pd.DataFrame(rows).T
    table.index = pd.MultiIndex.from_tuples(table.index, names=["dataset", "query_size"])
    overall = cd_blocks(runs)
    if overall.shape[1] == 0 or overall.empty:
        notes.append(_why_no_overall(runs, overall))
        table.loc[("mean", "all"), :] = float("nan")
    else:
        table.loc[("mean", "all"), :] = average_ranks(overall).reindex(table.columns)
    return table


def _why_no_overall(runs: pd.DataFrame, overall: pd.DataFrame) -> str:
    """Why no strategy can be ranked over all problems, naming what each problem has."""
    have = runs.groupby(["dataset", "query_size"])["strategy"].unique()
    # grouped by two columns: each label is a (dataset, query size) pair
    problems = cast("Iterable[tuple[tuple[object, object], Any]]", have.items())
    listing = "; ".join(f"{d} q={q}: {', '.join(sorted(map(str, s)))}"
                        for (d, q), s in problems)
    if overall.shape[1] == 0:
        return ("no overall ranks, no Friedman test, no CD diagram: no strategy was run on "
                f"every (dataset, query size) problem ({listing}); run the strategies to "
                "compare on the same problems")
    return ("no overall ranks, no Friedman test, no CD diagram: the strategies run on every "
            f"problem ({', '.join(overall.columns)}) share no repetition ({listing})")


@dataclass
class ALReport:
    scores: pd.DataFrame
    ranks: pd.DataFrame
    friedman: tuple[float, float] | None
    pairwise: pd.DataFrame | None
    run_id: str | None
    #: what could not be ranked or tested, and why (one sentence each)
    notes: list[str] = field(default_factory=list)


def al_report(experiments: list[str], tracking_uri: str | None = None, alpha: float = 0.05,
              log: bool = True) -> ALReport:
    """Ranks and, with >= 3 strategies and >= 2 (dataset, query size, repetition) blocks,
    Friedman + Wilcoxon-Holm and the CD diagram; ``log`` stores them as a run (role
    ``al_report``) in the first experiment. What the runs do not allow (one strategy, no
    shared problem or repetition) is said in ``notes`` instead of failing."""
    import matplotlib

    matplotlib.use("Agg")
    import mlflow

    from scarcelab.tracking.stats import cd_diagram, friedman_test, wilcoxon_holm

    runs = al_runs(experiments, tracking_uri)
    if runs.empty:
        raise ValueError(f"no finished AL runs (tag scarcelab.role=al) in {experiments}")
    notes: list[str] = []
    ranks = rank_table(runs, notes)
    scores = cd_blocks(runs)
    fried = pw = fig = None
    if scores.shape[1] >= 3 and scores.shape[0] >= 2:
        fried = friedman_test(scores)
        pw = wilcoxon_holm(scores, alpha=alpha)
        fig = cd_diagram(scores, alpha=alpha, title=f"AL strategies, {scores.shape[0]} blocks")
    elif scores.shape[1] and not scores.empty:
        notes.append(f"no Friedman test and no CD diagram: they need >= 3 strategies run on "
                     f"every problem and >= 2 shared (dataset, query size, repetition) "
                     f"blocks; have {scores.shape[1]} ({', '.join(scores.columns)}) on "
                     f"{scores.shape[0]} block(s)")
    run_id = None
    if log:
        from mlflow import MlflowClient

        from scarcelab.tracking.experiment_kind import mark_classic

        mark_classic(MlflowClient(), mlflow.set_experiment(experiments[0]).experiment_id)
        with mlflow.start_run(run_name="al-report") as run, \
                tempfile.TemporaryDirectory() as tmp:
            mlflow.set_tags({T.ROLE: "al_report", T.FAMILY: "active"})
            for name, df in (("al_scores.csv", scores), ("al_ranks.csv", ranks),
                             ("al_pairwise.csv", pw)):
                if df is not None:
                    p = Path(tmp) / name
                    df.to_csv(p)
                    mlflow.log_artifact(str(p))
            if notes:
                mlflow.log_text("\n".join(notes) + "\n", "al_notes.txt")
            if fried is not None:
                mlflow.log_metrics({"al/friedman_stat": float(fried[0]),
                                    "al/friedman_p": float(fried[1])})
            if fig is not None:
                mlflow.log_figure(fig, "al_cd_diagram.png")
            run_id = run.info.run_id
    return ALReport(scores, ranks, fried, pw, run_id, notes)
