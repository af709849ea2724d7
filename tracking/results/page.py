"""One suite's results page, built from the tracking store, and the index of all suites.

:func:`build_page` reads the suite's sweep (the sweep run and the run of every cell of the
spec at the chosen scale), restricts the store's runs to those cells and what they nested
(trials, retrains, contamination points, AL repetitions), computes the suite's tables with
the query layer's own views, puts the paper file's numbers beside ours and evaluates each
claim's rule (:mod:`.claims`). :func:`write_page` writes ``<out>/<suite>.md`` with its
figures as small PNGs (and the tables as CSV) under ``<out>/<suite>/``; :func:`write_index`
writes ``<out>/README.md``.

Provenance on every page, all read from the store: the command recorded by the sweep
driver, the git commit(s) recorded on the cell runs, the machine(s) each cell ran on, the
wall time (the union of the cell attempts' run intervals: a killed and resumed sweep is
counted once, idle time between invocations is not, a study run that a later attempt
continued counts up to where its own attempt ended) and the CPU time (the sum of every
attempt's ``sweep/cell_cpu_s``, failed attempts included: the rusage of the cell process
and its children, ``tracking/sweep/driver.py``).
"""

from __future__ import annotations

import io
import json
import math
import re
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from scarcelab import tags as T
from scarcelab.tracking.query.keys import BLOCK
from scarcelab.tracking.results import claims as C
from scarcelab.tracking.results.papers import PaperFile, load_paper, paper_path
from scarcelab.tracking.sweep.driver import (
    CELL_END,
    STALE_MARK,
    attempt_last_record_ms,
    result_run,
)
from scarcelab.tracking.sweep.spec import SweepSpec, load_spec

#: a page's figures stay below this (bytes): the PNGs live in the repository
PNG_LIMIT = 100_000
REPO = Path(__file__).resolve().parents[2]
STUDY_ENTRIES = ("supervised", "semi", "self")
DOCS = "docs/results"
#: the per-seed score the SSL rules test (views.TEST: the best-on-validation checkpoint's)
C_SCORE = "test_balanced_accuracy"
#: the MLflow client of the page being built: the store's, or one that answers from an
#: export (tracking/results/export.py); None: a new client of the current tracking URI
_CLIENT: ContextVar[Any] = ContextVar("scarcelab_results_client", default=None)
ORIGIN_STORE = "the tracking store"


def _client() -> Any:
    c = _CLIENT.get()
    if c is None:
        from mlflow.tracking import MlflowClient

        c = MlflowClient()
    return c


class ResultsError(ValueError):
    """A page that cannot be built (no sweep in the store, …): one line, with the fix."""


@dataclass
class Section:
    title: str
    text: str  # markdown: tables, notes
    figures: dict[str, bytes] = field(default_factory=dict)
    csv: dict[str, str] = field(default_factory=dict)


@dataclass
class Verdict:
    id: str
    claim: str
    source: str
    rule: str
    status: str
    reason: str


@dataclass
class SuitePage:
    suite: str
    spec: SweepSpec
    paper: PaperFile
    experiment: str
    uri: str
    sweep_run_id: str | None
    provenance: dict[str, str]
    counts: dict[str, int]
    sections: list[Section]
    comparisons: list[Section]
    verdicts: list[Verdict]
    rows_per_method: dict[str, int]
    missing: list[str]
    wall_s: float | None = None
    cpu_s: float | None = None
    commits: list[str] = field(default_factory=list)
    generated: str = ""
    markdown: str = ""
    #: what the page was read from, as its "Generated" line says it
    origin: str = ORIGIN_STORE
    #: the command that regenerates the page ("": ``scarcelab results <spec> [--scale]``)
    command: str = ""

    @property
    def figures(self) -> dict[str, bytes]:
        return {k: v for s in self.sections for k, v in s.figures.items()}


# -- formatting -----------------------------------------------------------------------------
def _fmt_s(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "—"
    s = int(round(s))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s"


def rel(path: str | Path) -> str:
    """A path as the page shows it: relative to the repository when inside it."""
    p = Path(path).resolve()
    for base in (REPO, Path.cwd()):
        try:
            return p.relative_to(base).as_posix()
        except ValueError:
            continue
    return str(path)


def md_table(df: pd.DataFrame, floatfmt: str = ".4f") -> str:
    if df is None or df.empty:
        return "_(no rows)_"
    return str(df.to_markdown(index=False, floatfmt=floatfmt))


def small_png(fig: Any, limit: int = PNG_LIMIT) -> bytes:
    """A figure as a PNG under ``limit`` bytes: rendered at 90 dpi, then (if still larger)
    as a 256-colour palette image, then at smaller sizes — line plots and tables of bars
    stay legible down to a few hundred pixels."""
    import matplotlib.pyplot as plt
    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    data = buf.getvalue()
    if len(data) <= limit:
        return data
    img = Image.open(io.BytesIO(data)).convert("RGB")
    for shrink in (1.0, 0.8, 0.65, 0.5, 0.4, 0.3):
        im = img if shrink == 1.0 else img.resize(
            (max(1, int(img.width * shrink)), max(1, int(img.height * shrink))),
            Image.Resampling.LANCZOS)
        out = io.BytesIO()
        im.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(out, format="PNG",
                                                                       optimize=True)
        if out.tell() <= limit:
            return out.getvalue()
    return out.getvalue()


def png_file_small(path: Path, limit: int = PNG_LIMIT) -> bytes:
    """A PNG written by someone else's plotting function, brought under ``limit``."""
    import matplotlib.pyplot as plt

    data = path.read_bytes()
    if len(data) <= limit:
        return data
    img = plt.imread(path)
    h, w = img.shape[:2]
    fig = plt.figure(figsize=(w / 100, h / 100), dpi=100)
    fig.figimage(img, resize=False)
    return small_png(fig, limit)


# -- reading the sweep ------------------------------------------------------------------
@dataclass
class _Cells:
    sweep_run: Any
    attempts: dict[str, list[Any]]  # cell id -> its runs, newest first
    finished: dict[str, Any]  # cell id -> its FINISHED run that holds its results
    #: cell id -> the attempt that finished it: the ``finished`` run, or the continuing
    #: attempt that completed that study (where the cell last ran: its machine)
    finisher: dict[str, Any] = field(default_factory=dict)
    #: every sweep run of the sweep, newest first: one per store, so several when the page
    #: is that of slices merged from their exports (export.py::merge_exports)
    sweep_runs: list[Any] = field(default_factory=list)


def _read_sweep(client: Any, exp_id: str, spec: SweepSpec) -> _Cells:

    runs = client.search_runs([exp_id], f"tags.`{T.SWEEP}` = '{spec.name}'",
                              max_results=50_000, order_by=["attributes.start_time DESC"])
    sweeps = [r for r in runs if r.data.tags.get(T.ROLE) == "sweep"]
    sweep = sweeps[0] if sweeps else None
    ids = {c.id for c in spec.cells}
    attempts: dict[str, list[Any]] = {}
    for r in runs:
        cid = r.data.tags.get(T.CELL)
        if cid in ids:
            attempts.setdefault(cid, []).append(r)
    # a continued cell has two FINISHED attempts: the study run that holds the results
    # and, newer, the launcher of its continuation (tracking/sweep/driver.py)
    finished = {cid: r for cid, rs in attempts.items() if (r := result_run(rs)) is not None}
    finisher = {cid: next((r for r in attempts[cid] if r.info.status == "FINISHED"
                           and r.data.tags.get(T.RESUMES) == run.info.run_id), run)
                for cid, run in finished.items()}
    return _Cells(sweep, attempts, finished, finisher, sweeps)


def _descendants(runs: pd.DataFrame, roots: set[str]) -> pd.Series:
    """Which rows of ``runs`` are one of ``roots`` or nested (at any depth) under one."""
    parent = dict(zip(runs["run_id"], runs.get("parent_run_id", pd.Series(
        [None] * len(runs))), strict=True))
    memo: dict[str, bool] = {}

    def under(rid: str | None, depth: int = 0) -> bool:
        if rid is None or (isinstance(rid, float) and math.isnan(rid)) or depth > 20:
            return False
        if rid in roots:
            return True
        if rid not in memo:
            memo[rid] = under(parent.get(rid), depth + 1)
        return memo[rid]

    return runs["run_id"].map(under)


def _union_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _attempt_interval(client: Any, run: Any) -> tuple[float, float]:
    """A cell attempt's run interval (s). One that a dead driver left RUNNING was closed by
    the next driver, at takeover time in stores written before the driver bounded it: it
    ends at its last nested record instead (its start when it was only queued), so the
    hours the sweep lay dead do not count as wall time. A study run that a later attempt
    continued was re-opened by it and ends when the continuation ends: it ends where the
    driver logged that the attempt itself had ended (``sweep/cell_end_s``), and the time
    after is the continuing attempt's own interval."""
    start, end = run.info.start_time, run.info.end_time
    if STALE_MARK in run.data.tags.get(T.ERROR, ""):
        end = min(end, attempt_last_record_ms(client, run) or start)
    own_end = run.data.metrics.get(CELL_END)
    if own_end is not None:
        end = max(start, min(end, int(own_end * 1000)))
    return start / 1000, end / 1000


# -- the tables -------------------------------------------------------------------------
def protocols_as_columns(view: pd.DataFrame) -> pd.DataFrame:
    """Kang et al.'s table: a row per encoder (and architecture), a column per task *and
    protocol* (``<dataset> <protocol> <metric>``, e.g. ``pathology_crops linear (147
    labels) accuracy``, ``consep_patches finetune seg/pq``). The query view keys its rows
    on protocol and label fraction too (tracking/query/views.py::TRANSFER_KEYS); here they
    move into the column names, so nothing that differs is averaged either way and the
    paper file's claims name their columns."""
    if view.empty or "protocol" not in view:
        return view
    rows = ["encoder", "arch"]
    tasks = [c for c in view.columns
             if c not in (*rows, "protocol", "label_fraction", "encoder_method", "n_runs")]
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    meta: dict[tuple[str, str], dict[str, Any]] = {}
    for _, r in view.iterrows():
        key = (r["encoder"], r["arch"])
        proto = str(r["protocol"]) if pd.notna(r["protocol"]) else ""
        frac = r.get("label_fraction")
        # a probe's protocol names its label count already ("linear (147 labels)"); its
        # fraction of the pool would only repeat it and hide the column from the claims
        if pd.notna(frac) and float(frac) != 1.0 and not proto.endswith(" labels)"):
            proto += f" (label fraction {float(frac):g})"
        m = meta.setdefault(key, {"encoder_method": r.get("encoder_method"), "n_runs": 0})
        m["n_runs"] += int(r.get("n_runs") or 0)
        for c in tasks:
            if pd.isna(r[c]):
                continue
            ds, _, metric = str(c).partition(" ")
            name = " ".join(x for x in (ds, proto, metric) if x)
            cells.setdefault(key, {})[name] = r[c]
    out = pd.DataFrame([{"encoder": k[0], "arch": k[1], **meta[k], **cells.get(k, {})}
                        for k in meta])
    fixed = ["encoder", "arch", "encoder_method", "n_runs"]
    return out[fixed + sorted(c for c in out.columns if c not in fixed)]


def transfer_by_seed(t: Any, refs: Sequence[str]) -> pd.DataFrame:
    """The page's transfer table (:func:`protocols_as_columns` of
    :func:`~scarcelab.tracking.query.views.transfer_view`)
    computed on each seed's runs alone, long: encoder, column, seed, value. Why: the
    encoder_beats rule pairs the two encoders over the seeds they share (the pre-trained
    encoder of seed s is probed by the cells of seed s), which the averaged table hides."""
    from scarcelab.tracking.query.views import transfer_view

    cols = ["encoder", "column", "seed", "value"]
    runs = t.runs
    if runs.empty or "seed" not in runs:
        return pd.DataFrame(columns=cols)
    parts = []
    for seed in sorted(runs["seed"].dropna().unique()):
        view = protocols_as_columns(transfer_view(t.with_runs(runs[runs["seed"] == seed]),
                                                  refs))
        if view.empty:
            continue
        vals = [c for c in view.columns if c not in ("encoder", "arch", "encoder_method",
                                                     "n_runs")]
        long = view.melt(id_vars=["encoder"], value_vars=vals, var_name="column",
                         value_name="value").dropna(subset=["value"])
        parts.append(long.assign(seed=seed)[cols])
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)


def transfer_long(view: pd.DataFrame) -> pd.DataFrame:
    """The transfer view as (encoder label, task, value) rows for the bar chart. The label
    joins the encoder with the settings that keep its row apart (architecture, protocol,
    label fraction: :data:`TRANSFER_KEYS`), so two rows of one encoder are two bars and
    never one mean over what differs; only the numeric task columns are values."""
    from scarcelab.tracking.query.views import TRANSFER_KEYS

    keys = [k for k in TRANSFER_KEYS if k in view]
    parts = view[keys].astype(str).apply(
        lambda r: " · ".join(v for v in r if v and v != "nan"), axis=1)
    tasks = [c for c in view.columns if c not in (*keys, "encoder_method", "n_runs")]
    long = view.assign(row=parts.to_numpy() if len(view) else []).melt(
        id_vars=["row"], value_vars=tasks, var_name="task", value_name="value")
    long["value"] = pd.to_numeric(long["value"], errors="coerce")
    return long.dropna(subset=["value"]).rename(columns={"row": "encoder"})


def _al_long(t: Any) -> pd.DataFrame:
    cols = ["dataset", "query_size", "strategy", "repetition", "auc"]
    al = t.role("al")
    if al.empty or "metrics.al/auc" not in al:
        return pd.DataFrame(columns=cols)
    al = al[al["status"] == "FINISHED"]
    name = al["strategy"] if "strategy" in al else al["method"]
    out = pd.DataFrame({"dataset": al.get("dataset"), "query_size": al.get("query_size"),
                        "strategy": name, "repetition": al.get("repetition"),
                        "auc": al["metrics.al/auc"]}).dropna(subset=["auc"])
    for c in ("query_size", "repetition"):
        out[c] = pd.to_numeric(out[c], errors="coerce").fillna(0).astype(int)
    return out.drop_duplicates(["dataset", "query_size", "strategy", "repetition"])


def _mean_std_n(v: pd.Series) -> str:
    v = v.dropna()
    if v.empty:
        return ""
    std = f" ± {v.std(ddof=1):.4f}" if len(v) > 1 else ""
    return f"{v.mean():.4f}{std} ({len(v)})"


def _bar_figure(df: pd.DataFrame, index: str, columns: str, values: str, title: str,
                xlabel: str) -> Any:
    """One horizontal bar chart per column group: mean of ``values`` per ``index``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(df.groupby(columns, sort=True))
    n = max(1, len(groups))
    cols = min(n, 4)
    rows = int(math.ceil(n / cols))
    height = 0.28 * df[index].nunique() + 1.2
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    for ax, (key, part) in zip(axes.flat, groups, strict=False):
        g = part.groupby(index)[values].agg(["mean", "std"]).sort_values("mean")
        ax.barh(g.index.astype(str), g["mean"], xerr=g["std"].fillna(0), color="tab:blue",
                alpha=0.8)
        lo = float(np.nanmin(g["mean"] - g["std"].fillna(0)))
        ax.set_xlim(left=max(0.0, lo - 0.05))
        ax.set_title(str(key), fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.tick_params(labelsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def _num(df: pd.DataFrame, col: str) -> pd.Series:
    return pd.to_numeric(df[col], errors="coerce") if col in df else \
        pd.Series(np.nan, index=df.index)


def scale_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """What the runs did, one row per study: dataset, method, seed, network (its arch),
    trials (completed: the tune protocol's ``n_complete``, else ``n_trials - n_failed``),
    and the median over its finished trials of epochs per trial (the trial's ``epochs``
    metric; a tune trial that ran to its end: its planned ``epochs``) and of steps per
    trial (epochs x the last evaluation window's ``time/steps``: exact at the default
    one-evaluation-per-epoch cadence, an estimate otherwise). What
    :func:`.claims.check_scale` compares with a claim's ``needs``."""
    cols = ["dataset", "method", "seed", "network", "trials", "epochs_per_trial",
            "steps_per_trial"]
    if runs.empty or "role" not in runs:
        return pd.DataFrame(columns=cols)
    studies = runs[runs["role"] == "study"]
    if studies.empty:
        return pd.DataFrame(columns=cols)
    trials = runs[(runs["role"] == "trial") & (runs.get("status") == "FINISHED")]
    if len(trials):
        pruned = trials["pruned"].astype(str).eq("true") if "pruned" in trials else \
            pd.Series(False, index=trials.index)
        epochs = _num(trials, "metrics.epochs").fillna(
            _num(trials, "params.epochs").where(~pruned))
        per = pd.DataFrame({"parent": trials.get("parent_run_id"), "epochs": epochs,
                            "steps": epochs * _num(trials, "metrics.time/steps")})
        med = per.groupby("parent")[["epochs", "steps"]].median()
    else:
        med = pd.DataFrame(columns=["epochs", "steps"])
    complete = _num(studies, "n_complete").fillna(
        _num(studies, "n_trials") - _num(studies, "n_failed").fillna(0))
    ids = studies["run_id"] if "run_id" in studies else pd.Series(index=studies.index)
    return pd.DataFrame({
        "dataset": studies.get("dataset"), "method": studies.get("method"),
        "seed": studies.get("seed"), "network": studies.get("arch"), "trials": complete,
        "epochs_per_trial": ids.map(med["epochs"]).astype(float),
        "steps_per_trial": ids.map(med["steps"]).astype(float)}).reset_index(drop=True)


def _study_sections(t: Any, data: C.SuiteData, encoders_only: bool = False
                    ) -> list[Section]:
    from scarcelab.tracking.query import render, views

    out = []
    lb = views.leaderboard(t)
    data.leaderboard = lb
    smp = views.samples(t)
    if len(smp) and {"dataset", "variant", "seed", C_SCORE} <= set(smp.columns):
        data.studies = pd.DataFrame({
            "dataset": smp["dataset"], "method": smp["variant"],
            "family": smp["family"] if "family" in smp else np.nan, "seed": smp["seed"],
            "score": pd.to_numeric(smp[C_SCORE], errors="coerce")})
    keep = [c for c in (*BLOCK, "family", "method", "n",
                        "val_balanced_accuracy_mean", "test_balanced_accuracy_mean",
                        "test_balanced_accuracy_std", "test_auroc_mean") if c in lb]
    fig = render.plot_leaderboard(lb)
    out.append(Section(
        "Leaderboard",
        "Per study the checkpoint best on validation balanced accuracy, its test metrics "
        "averaged over seeds (std: sample std; n: studies); every column in "
        "`leaderboard.csv`.\n\n" + md_table(lb[keep]),
        {"leaderboard": small_png(fig)} if fig is not None else {},
        {"leaderboard": lb.to_csv(index=False)}))
    if encoders_only:
        out[0].title = "Pre-training studies (the encoders)"
        return out
    g = views.gains(t)
    data.gains = g
    ref = g.attrs.get("reference", {})
    refs = "; ".join(f"{k}: {m} {v:.4f}" for k, (m, v) in sorted(ref.items()))
    fig = render.plot_gains(g)
    out.append(Section(
        "Gains over the best labeled-only method (SSL-vs-SSL Table 3 form)",
        "Mean test balanced accuracy minus that of the best labeled-only method (sup, "
        "mixup, supcon) on each dataset; median and worst over datasets."
        + (f" Reference per dataset: {refs}." if refs else "") + "\n\n" + md_table(g),
        {"gains": small_png(fig)} if fig is not None else {}, {"gains": g.to_csv(index=False)}))
    prof = views.profile(t)
    fig = render.plot_profile(prof)
    shown = render.condense_profile(prof)
    pcols = [c for c in ("dataset", "method", "t_s", "n", "test_balanced_accuracy_mean",
                         "val_balanced_accuracy_mean") if c in shown]
    out.append(Section(
        "Accuracy over time (SSL-vs-SSL Fig. 1 form)",
        "Test balanced accuracy of the checkpoint best on validation by time t (seconds "
        "since each study started), mean over seeds; a few time points here, all in "
        "`profile.csv`.\n\n" + md_table(shown[pcols] if len(shown) else shown),
        {"profile": small_png(fig)} if fig is not None else {},
        {"profile": prof.to_csv(index=False)}))
    rk = views.ranks(t)
    figs = {}
    cd = render.cd_figure(views.study_scores(t), "methods over datasets")
    if cd is not None:
        figs["cd_methods"] = small_png(cd)
    note = "" if cd is not None else (" No critical-difference diagram: it needs >= 2 "
                                      "methods scored on >= 2 datasets.")
    out.append(Section("Ranks", "Average rank (1 = best) of the mean test balanced accuracy"
                       " over datasets, with Friedman's test." + note + "\n\n" + md_table(rk),
                       figs, {"ranks": rk.to_csv(index=False)}))
    return out


def _al_sections(t: Any, data: C.SuiteData) -> list[Section]:
    from scarcelab.tracking.al import cd_blocks, rank_table
    from scarcelab.tracking.stats import cd_diagram, friedman_test

    al = _al_long(t)
    data.al = al
    if al.empty:
        return [Section("Active learning", "_(no finished AL repetitions)_")]
    al = al.assign(problem=al["dataset"] + " q=" + al["query_size"].astype(str))
    auc = al.pivot_table(index="strategy", columns="problem", values="auc",
                         aggfunc=_mean_std_n).reset_index()
    auc.columns.name = None
    means = al.groupby("strategy")["auc"].mean()
    auc = auc.assign(_m=auc["strategy"].map(means)).sort_values("_m", ascending=False
                                                                 ).drop(columns="_m")
    fig = _bar_figure(al, "strategy", "problem", "auc", "AUC per problem (mean ± std over "
                      "repetitions)", "AUC")
    secs = [Section(
        "AUC table",
        "Area under the learning curve (`al/auc`, docs/active.md), mean ± sample std over "
        "repetitions (n in parentheses), per (dataset, query size q).\n\n" + md_table(auc),
        {"auc": small_png(fig)}, {"auc": al.to_csv(index=False)})]
    notes: list[str] = []
    ranks = rank_table(al, notes)
    ranks = ranks.T
    ranks.columns = [f"{d} q={q}" if d != "mean" else "mean (all blocks)"
                     for d, q in ranks.columns]
    ranks = ranks.rename_axis("strategy").reset_index()
    if "mean (all blocks)" in ranks:
        ranks = ranks.sort_values("mean (all blocks)", kind="stable", na_position="last")
    blocks = cd_blocks(al)
    figs, text = {}, []
    if blocks.shape[1] >= 2 and len(blocks) >= 2:
        stat, p = friedman_test(blocks)
        text.append(f"Friedman over {len(blocks)} (dataset, q, repetition) blocks and "
                    f"{blocks.shape[1]} strategies: statistic {stat:.3f}, p = {p:.3g}.")
        figs["cd_strategies"] = small_png(cd_diagram(blocks, title="AL strategies"))
    else:
        text.append("No Friedman test or CD diagram: they need >= 2 strategies run on every "
                    f"problem and >= 2 shared blocks (have {blocks.shape[1]} strategies, "
                    f"{len(blocks)} blocks).")
    text += [f"Note: {n}" for n in notes]
    secs.append(Section(
        "Ranks and critical-difference diagram",
        "Mean rank (1 = best AUC) per problem over its repetitions; the last column over "
        "every (dataset, q, repetition) block of the strategies run on all problems "
        "(CDALBench's blocks, tracking/al.py). " + " ".join(text) + "\n\n" + md_table(
            ranks, ".2f"), figs, {"ranks": ranks.to_csv(index=False)}))
    return secs


def _contamination_sections(cells: Sequence[Any], data: C.SuiteData,
                            uri: str) -> list[Section]:
    import tempfile

    from scarcelab.tracking import contamination as K

    parts = [K.load_points(parent_run_id=r.info.run_id, tracking_uri=uri, client=_client())
             for r in cells]
    parts = [p for p in parts if len(p)]
    points = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    table = K.table_a1(points)
    data.table_a1 = table
    figs = {}
    if len(table):
        with tempfile.TemporaryDirectory() as d:
            figs["diagnostics_vs_ratio"] = png_file_small(
                K.plot_vs_ratio(table, Path(d) / "p.png"))
    return [Section(
        "Contamination: the Table A1 view (C-Score)",
        "Per method x OOD source x ratio r: test / validation balanced accuracy of the "
        "best-on-validation checkpoint and the diagnostics of that trial (final / peak "
        "epoch), relative change against r = 0 in parentheses (docs/contamination.md). "
        "Tuning is held fixed across ratios (`tuning=once`).\n\n" + K.to_markdown(table),
        figs, {"table_a1": table.to_csv(index=False)})]


def _tune_sections(t: Any, data: C.SuiteData) -> list[Section]:
    from scarcelab.tracking.query.table3 import (
        ALTERNATIVES,
        render_table3,
        retrain_scores,
        table3,
    )

    scores = retrain_scores(t)
    data.retrains = scores
    long = table3(scores)
    # the test the table used (one-sided by default: "worse" is one-sided), as its legend
    # says; the page once called it two-sided above a legend that said one-sided
    side = ALTERNATIVES.get(str(long["alternative"].iloc[0]), "two-sided") \
        if len(long) and "alternative" in long else ALTERNATIVES["less"]
    figs = {}
    if len(scores):
        figs["retrains"] = small_png(_bar_figure(
            scores.assign(score=scores["score"] * 100), "method", "dataset", "score",
            "final retrains: test balanced accuracy (%)", "%"))
    return [Section(
        "Table 3 (Tune It or Don't Use It)",
        "Test balanced accuracy (%) of the final retrains of each method's best ASHA "
        "configuration, mean ± sample std; per dataset the best mean in bold, the methods "
        f"not significantly worse than it by a {side} Welch's t-test (p >= 0.05) in "
        "italics (tracking/query/table3.py; the verdicts' rules state their own test)."
        "\n\n" + render_table3(long) + "\n\n"
        + md_table(long), figs, {"table3": long.to_csv(index=False)})]


def _transfer_sections(t: Any, cells: Sequence[Any], data: C.SuiteData) -> list[Section]:
    from scarcelab.tracking.query.views import transfer_view

    # the page's table: a row per encoder, protocols in the column names (the sweep's own
    # report keeps the query view's rows keyed on protocol, tracking/sweep/driver.py)
    refs = [r.data.tags.get(T.SWEEP_REFS, "") for r in cells]
    view = protocols_as_columns(transfer_view(t, refs))
    data.transfer = view
    data.transfer_runs = transfer_by_seed(t, refs)
    figs = {}
    if len(view):
        long = transfer_long(view)
        if len(long):
            figs["transfer"] = small_png(_bar_figure(
                long, "encoder", "task", "value", "transfer: encoder per task", "score"))
    text = ""
    seg = [r for r in cells if r.data.tags.get(T.TASK) == "segment"
           or "seg/pq" in r.data.metrics]
    if seg:
        fig, lines = _pq_curves(seg, labels=_ref_labels(cells))
        if fig is not None:
            figs["segment_val_pq"] = small_png(fig)
        text = (" Segmentation training stops when validation PQ has not improved for "
                "`patience` epochs (or at the budget); the checkpoint best on validation is "
                "tested. Per run: " + "; ".join(lines) + ".")
    return [Section(
        "Transfer (Kang et al.'s comparison)",
        "Rows: encoder source (`@pretrain` = the suite's pre-trained encoder, `random` = "
        "random initialisation); columns: probe accuracies (linear, fine-tuning) and "
        "segmentation PQ / mPQ, cross-test sets included; means over the runs of a row "
        "(n_runs)." + text + "\n\n" + md_table(view), figs,
        {"transfer": view.to_csv(index=False)})]


def _ref_labels(cells: Sequence[Any]) -> dict[str, str]:

    labels = {}
    for r in cells:
        for ref, value in json.loads(r.data.tags.get(T.SWEEP_REFS) or "{}").values():
            labels[value] = ref
    return labels


def _pq_curves(runs: Sequence[Any], labels: dict[str, str]) -> tuple[Any, list[str]]:
    """Validation PQ per epoch of each segment run (``seg/val_pq``), and a sentence per run
    (epochs trained, the selected epoch): what says whether PQ had stopped moving."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    client = _client()
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    lines, drawn = [], 0
    for r in runs:
        hist = sorted(client.get_metric_history(r.info.run_id, "seg/val_pq"),
                      key=lambda m: m.step)
        enc = r.data.tags.get(T.ENCODER, "?")
        name = labels.get(enc, enc)
        sel = r.data.metrics.get("seg/selected_epoch")
        pat = r.data.params.get("patience", "")
        verdict = ""
        if hist and sel is not None and pat.isdigit():
            since = hist[-1].step - int(sel)
            verdict = (f"; stopped after {since} epochs without a better validation PQ "
                       f"(patience {pat}): PQ had stopped moving" if since >= int(pat) else
                       f"; stopped by the budget {since} epoch(s) after the best, within the "
                       f"patience of {pat}: PQ may still have been rising")
        lines.append(f"{name}: {len(hist)} epoch(s), validation PQ best at epoch "
                     f"{int(sel) if sel is not None else '?'}"
                     + (f" ({hist[-1].value:.4f} at the last)" if hist else "") + verdict)
        if hist:
            ax.plot([m.step for m in hist], [m.value for m in hist], marker=".", label=name)
            drawn += 1
    if not drawn:
        plt.close(fig)
        return None, lines
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation PQ")
    ax.set_title("segmentation: validation PQ per epoch", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig, lines


# -- paper side by side -----------------------------------------------------------------
def lookup(ours: dict[str, Any], data: C.SuiteData) -> tuple[float, int] | None:
    """Our number for a paper value's ``ours`` selector: (value, n) or None."""
    view = ours.get("view")
    if view == "al_auc":
        a = data.al
        if a.empty:
            return None
        sel = a[(a["dataset"] == ours.get("dataset")) & (a["strategy"] == ours.get("strategy"))
                & (a["query_size"] == int(ours.get("query_size", 1)))]["auc"]
    elif view == "table3":
        r = data.retrains
        if r.empty:
            return None
        sel = r[(r["dataset"] == ours.get("dataset")) & (r["method"] == ours.get("method"))
                ]["score"]
    elif view == "leaderboard":
        lb = data.leaderboard
        col = ours.get("metric", "test_balanced_accuracy_mean")
        if lb.empty or col not in lb:
            return None
        rows = lb[(lb["dataset"] == ours.get("dataset")) & (lb["method"] == ours.get("method"))]
        if rows.empty:
            return None
        return float(rows[col].iloc[0]), int(rows["n"].iloc[0])
    elif view == "transfer":
        tr = data.transfer
        if tr.empty or ours.get("column") not in tr:
            return None
        rows = tr[tr["encoder"] == ours.get("encoder")]
        if rows.empty or pd.isna(rows[ours["column"]].iloc[0]):
            return None
        return float(rows[ours["column"]].iloc[0]), int(rows["n_runs"].iloc[0])
    else:
        return None
    sel = sel.dropna()
    return (float(sel.mean()), len(sel)) if len(sel) else None


def _comparison_sections(paper: PaperFile, data: C.SuiteData) -> list[Section]:
    out = []
    for comp in paper.comparisons:
        rows = []
        for v in comp.values:
            got = lookup(v.ours, data)
            ours = None if got is None else got[0] * comp.scale
            rows.append({"row": v.row, "column": v.column, "paper": v.value,
                         "ours": ours, "n": None if got is None else got[1],
                         "ours − paper": None if ours is None else ours - v.value,
                         "note": v.note})
        df = pd.DataFrame(rows)
        if not df["note"].astype(bool).any():
            df = df.drop(columns="note")
        df["n"] = df["n"].astype("Int64")
        found = int(df["ours"].notna().sum())
        text = (f"Source: {comp.source}. Paper values as published (row and column of the "
                f"source); ours from this suite's runs (n: runs averaged). {found} of "
                f"{len(df)} values have a counterpart here."
                + (f" {comp.note}" if comp.note else "") + "\n\n" + md_table(df, ".4g"))
        out.append(Section(comp.title, text))
    return out


# -- the page ---------------------------------------------------------------------------
@dataclass
class _Sweep:
    """The store a page is read from and the sweep found in it: what every later step of
    :func:`build_page` reads, opened once so that its errors are raised before any table is
    computed."""

    spec: SweepSpec
    suite: str
    paper: PaperFile
    experiment: str
    uri: str
    client: Any
    flag: str  # the scale's command-line flag ("" at the reference scale)
    cells: _Cells
    #: the query layer's reader of the same source; None: opened from ``uri``
    reader: Any = None
    origin: str = ORIGIN_STORE


def _open_sweep(spec_path: str | Path, scale: str, experiment: str | None,
                tracking_uri: str | None, spec: SweepSpec | None,
                source: Any = None) -> _Sweep:
    """The spec, its paper file and its sweep in the store; a :class:`ResultsError` naming
    the command that would make the sweep when the store has none. ``source``: where the
    runs are read instead of the tracking URI (tracking/results/export.py: an export, or a
    store whose answers are recorded into one), with its ``client()``, ``reader()``,
    ``uri`` and ``origin``."""
    from scarcelab.tracking.query.render import _safe_uri

    if spec is None:
        spec = load_spec(spec_path, scale=scale)
    suite = Path(spec_path).stem
    paper = load_paper(paper_path(spec_path))
    exp_name = experiment or spec.experiment
    reader, origin = None, ORIGIN_STORE
    if source is None:
        import mlflow
        from mlflow.tracking import MlflowClient

        if tracking_uri:
            mlflow.set_tracking_uri(tracking_uri)
        uri = mlflow.get_tracking_uri()
        client = MlflowClient()
    else:
        uri, client, reader, origin = source.uri, source.client(), source.reader(), \
            source.origin
    exp = client.get_experiment_by_name(exp_name)
    flag = "" if scale == "reference" else f" --{scale}"
    hint = f"run `scarcelab sweep {spec_path}{flag}` first (or pass --experiment)"
    if exp is None:
        raise ResultsError(f"{suite}: no experiment {exp_name!r} at {_safe_uri(uri)}: {hint}")
    cells = _read_sweep(client, exp.experiment_id, spec)
    if cells.sweep_run is None and not cells.attempts:
        raise ResultsError(f"{suite}: experiment {exp_name!r} has no sweep {spec.name!r} at "
                           f"{scale} scale: {hint}")
    return _Sweep(spec, suite, paper, exp_name, uri, client, flag, cells, reader, origin)


def _by_entry(spec: SweepSpec, finished: dict[str, Any]) -> dict[str, list[Any]]:
    """The finished cell runs per entry kind, in the spec's cell order: which section
    builders the page needs, and the runs the contamination and transfer builders read."""
    by_entry: dict[str, list[Any]] = {}
    for c in spec.cells:
        if c.id in finished:
            by_entry.setdefault(c.entry, []).append(finished[c.id])
    return by_entry


def _cell_table(experiment: str, uri: str, finished: dict[str, Any],
                reader: Any = None) -> Any:
    """The query layer's table of the experiment, cut to the finished cells and what they
    nested: other sweeps (or loose runs) in the same experiment stay off the page.
    ``reader``: the source's reader (default: one opened on ``uri``)."""
    from scarcelab.tracking.query import load
    from scarcelab.tracking.query.frame import Tracked

    if reader is None:
        t = load(experiment, uri)
    else:
        exps = reader.experiment_ids([experiment])
        t = Tracked(None, reader, list(exps.values()), experiments=exps)
    runs = t.runs
    keep = _descendants(runs, {r.info.run_id for r in finished.values()}) if len(runs) \
        else pd.Series([], dtype=bool)
    return t.with_runs(runs[keep.to_numpy()] if len(runs) else runs)


def _sections(t: Any, by_entry: dict[str, list[Any]], data: C.SuiteData,
              uri: str) -> list[Section]:
    """The tables and figures of each entry kind the sweep finished, in the page's order;
    each builder also fills its part of ``data`` for the claims and the paper's numbers.
    The views' warnings (empty groups, all-NaN means) are silenced: the page says what is
    missing itself."""
    sections: list[Section] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transfer_suite = "probe" in by_entry or "segment" in by_entry
        if any(e in by_entry for e in STUDY_ENTRIES):
            # in a transfer suite the studies pre-train the encoders: their leaderboard
            # only (gains, profile and ranks compare methods, which they do not)
            sections += _study_sections(t, data, encoders_only=transfer_suite)
        if "al" in by_entry:
            sections += _al_sections(t, data)
        if "contamination" in by_entry:
            sections += _contamination_sections(by_entry["contamination"], data, uri)
        if "tune" in by_entry:
            sections += _tune_sections(t, data)
        if "probe" in by_entry or "segment" in by_entry:
            sections += _transfer_sections(t, by_entry.get("probe", []) +
                                           by_entry.get("segment", []), data)
    return sections


def _verdicts(paper: PaperFile, data: C.SuiteData) -> list[Verdict]:
    """Each claim of the paper file, its rule evaluated on the numbers the sections read,
    or "not testable at this scale" where the runs fall short of the claim's ``needs``."""
    verdicts = []
    for cl in paper.claims:
        v = C.evaluate(cl.rule, data, cl.needs)
        verdicts.append(Verdict(cl.id, cl.claim, cl.source, C.describe(cl.rule), v.status,
                                v.reason))
    return verdicts


def _mark_interim(verdicts: list[Verdict], counts: dict[str, int]) -> None:
    """A verdict computed while cells of the design have not finished (a design run in
    slices, a sweep still going, failed cells) says so: it is computed on the cells that
    finished, and a test looked at before its planned n is reached errs more often than
    its level (docs/results/exports/README.md, "A design in slices")."""
    done, total = counts["finished"], counts["cells"]
    if done >= total:
        return
    for v in verdicts:
        v.reason += (f" (interim: {done} of the design's {total} cells have finished; "
                     "the rest may change this verdict)")


@dataclass
class _Cost:
    """What the sweep's cell attempts cost, every attempt counted (failed ones too): the
    module docstring says how wall and CPU time are measured."""

    attempts: int
    wall: float | None  # None: no attempt has both a start and an end
    cpu: float | None  # None: no attempt recorded its CPU time
    no_cpu: int  # attempts without a CPU record


def _cost(client: Any, cells: _Cells) -> _Cost:
    from scarcelab.tracking.sweep.driver import CELL_CPU

    all_attempts = [r for rs in cells.attempts.values() for r in rs]
    ends = [_attempt_interval(client, r) for r in all_attempts
            if r.info.start_time and r.info.end_time]
    wall = _union_seconds(ends) if ends else None
    cpu_vals = [r.data.metrics.get(CELL_CPU) for r in all_attempts]
    cpu = sum(v for v in cpu_vals if v is not None) if any(v is not None for v in cpu_vals) \
        else None
    no_cpu = sum(v is None for v in cpu_vals)
    return _Cost(len(all_attempts), wall, cpu, no_cpu)


def _cell_states(spec: SweepSpec, cells: _Cells) -> tuple[dict[str, int], list[str]]:
    """How many cells finished, failed, are running or were not run, and a line for each
    cell without a finished run (its last attempt's status and error)."""
    finished = cells.finished
    sweep = cells.sweep_run
    # while the sweep runs, a cell whose last attempt is RUNNING is running or queued (the
    # driver opens every cell's run when it queues it), not failed; once the sweep has
    # ended such a run was left by a dead process and counts as failed
    live = any(r.info.status == "RUNNING" for r in cells.sweep_runs or [sweep] if r is not None)
    running = {cid for cid, rs in cells.attempts.items() if cid not in finished and live
               and rs and rs[0].info.status in ("RUNNING", "SCHEDULED")}
    n_failed = sum(1 for cid in cells.attempts if cid not in finished and cid not in running)
    counts = {"cells": len(spec.cells), "finished": len(finished), "failed": n_failed,
              "running": len(running), "not_run": len(spec.cells) - len(cells.attempts)}
    missing = []
    for c in spec.cells:
        if c.id in finished:
            continue
        rs = cells.attempts.get(c.id, [])
        err = rs[0].data.tags.get(T.ERROR, "") if rs else ""
        if c.id in running:
            missing.append(f"`{c.label}`: running or queued")
            continue
        missing.append(f"`{c.label}`: " + (f"{len(rs)} attempt(s), last {rs[0].info.status}"
                                           + (f": {err[:300]}" if err else "")
                                           if rs else "not run"))
    return counts, missing


def _machines(finished: dict[str, Any]) -> Counter[tuple[str, str, str, str, str]]:
    """The machine each finished cell ran on (cores, CPU, RAM, GPU, host; '?' where a tag
    is missing), counted."""

    return Counter(
        (r.data.tags.get(f"{T.MACHINE}.cores", "?"), r.data.tags.get(f"{T.MACHINE}.cpu", "?"),
         r.data.tags.get(f"{T.MACHINE}.ram_gb", "?"), r.data.tags.get(f"{T.MACHINE}.gpu", "?"),
         r.data.tags.get(f"{T.MACHINE}.host", "?")) for r in finished.values())


def _machine_text(machine: tuple[str, str, str, str, str], n: int) -> str:
    """One machine of the page's table. A cell whose every machine tag is missing ran in no
    attempt the driver saw to its end (a study continued by hand, outside the sweep): say
    so, rather than print a row of question marks."""
    cells = f"{n} cell{'s' * (n != 1)}"
    if all(v == "?" for v in machine):
        return f"not recorded ({cells}: no attempt of it ended under the sweep driver)"
    cores, cpu_model, ram, gpu, host = machine
    return f"{cores} cores, {cpu_model}, {ram} GB RAM, GPU: {gpu} (host {host}; {cells})"


def _short_commit(commit: str) -> str:
    """A run's git commit as the page and the index print it: 12 hex digits, keeping the
    ``+dirty`` mark, so that cells run from a modified tree at a commit stay apart from
    those run from the commit itself (without the mark the index listed one commit twice)."""
    return commit[:12] + ("+dirty" if commit.endswith("+dirty") else "")


def _provenance(src: _Sweep, spec_path: str | Path, scale: str, counts: dict[str, int],
                cost: _Cost, commits: Counter[str]) -> dict[str, str]:
    """The page's "How it was run" table, every value read from the store."""
    from scarcelab.tracking.query.render import _safe_uri
    from scarcelab.tracking.sweep.driver import INVOCATION_WALL

    machines = _machines(src.cells.finisher or src.cells.finished)
    sweep = src.cells.sweep_run
    stags = sweep.data.tags if sweep is not None else {}
    inv_wall = []
    if sweep is not None:
        inv_wall = [m.value for m in src.client.get_metric_history(sweep.info.run_id,
                                                                   INVOCATION_WALL)]
    flag = src.flag
    command = f"`{stags.get(T.SWEEP_COMMAND) or 'scarcelab sweep ' + rel(spec_path) + flag}`"
    invocations = stags.get(T.SWEEP_INVOCATIONS, "?")
    slices = sorted(src.cells.sweep_runs, key=lambda r: r.info.start_time or 0)
    if len(slices) > 1:  # slices of one design, merged from their exports
        inv_wall = [m.value for r in slices for m in src.client.get_metric_history(
            r.info.run_id, INVOCATION_WALL)]
        command = f"{len(slices)} slices, merged from their exports: " + "; ".join(
            f"`{r.data.tags.get(T.SWEEP_COMMAND, '?')}`" for r in slices)
        counted = [r.data.tags.get(T.SWEEP_INVOCATIONS, "") for r in slices]
        invocations = str(sum(int(v) for v in counted)) if all(
            v.isdigit() for v in counted) else "?"
    return {
        "command": command,
        "scale": f"{scale} ({counts['cells']} cells: {counts['finished']} finished, "
                 + (f"{counts['running']} running or queued (the sweep is still going), "
                    if counts["running"] else "")
                 + f"{counts['failed']} failed, {counts['not_run']} not run)",
        "experiment": f"`{src.experiment}` (sweep run"
                      + (f"s {', '.join(f'`{r.info.run_id}`' for r in slices)})"
                         if len(slices) > 1 else
                         f" `{sweep.info.run_id if sweep else '—'}`)"),
        "tracking store": f"`{_safe_uri(src.uri)}`",
        "git commit": ", ".join(f"`{_short_commit(k)}` "
                                f"({v} cell{'s' * (v != 1)})"
                                for k, v in commits.most_common()) or "—",
        "machine": "; ".join(_machine_text(m, n) for m, n in machines.most_common()) or "—",
        "wall time": f"{_fmt_s(cost.wall)} (the union of the {cost.attempts} cell attempts' "
                     f"run intervals; {invocations} driver invocation(s)"
                     + (f", whose logged walls sum to {_fmt_s(sum(inv_wall))}" if inv_wall
                        else "") + ")",
        "CPU time": f"{_fmt_s(cost.cpu)} (user + system of every cell attempt's process tree"
                    + (f"; {cost.no_cpu} attempt(s) without a record" if cost.no_cpu else "")
                    + ")",
    }


def _rows_per_method(spec: SweepSpec, finished: dict[str, Any]) -> dict[str, int]:
    """Finished cells per method (its encoder, method or strategy option, else its entry):
    what the smoke test checks every method reached the page by."""
    methods: Counter[str] = Counter()
    for c in spec.cells:
        o = dict(c.options)
        key = o.get("encoder") or o.get("method") or o.get("strategy") or c.entry
        if c.id in finished:
            methods[str(key)] += 1
    return dict(methods)


def build_page(spec_path: str | Path, scale: str = "reference", experiment: str | None = None,
               tracking_uri: str | None = None, spec: SweepSpec | None = None, *,
               source: Any = None, generated: str | None = None) -> SuitePage:
    """Everything a suite's page says, read from the store (see the module docstring).
    ``spec``: the spec as run when it is not the file's cells at ``scale`` (the CI smoke
    runs a subset of them, tests/smoke_runner.py). ``source``: read the runs from there
    instead (an export: tracking/results/export.py); the page is built by the same code
    either way. ``generated``: the generation time the page states (default: now).

    Raises :class:`ResultsError` when the store has no sweep of this spec at this scale."""
    src = _open_sweep(spec_path, scale, experiment, tracking_uri, spec, source)
    token = _CLIENT.set(src.client)
    try:
        return _build(src, spec_path, scale, generated)
    finally:
        _CLIENT.reset(token)


def _build(src: _Sweep, spec_path: str | Path, scale: str, generated: str | None
           ) -> SuitePage:
    finished = src.cells.finished
    by_entry = _by_entry(src.spec, finished)
    t = _cell_table(src.experiment, src.uri, finished, src.reader)
    data = C.SuiteData()
    sections = _sections(t, by_entry, data, src.uri)
    data.scale = scale_frame(t.runs)
    comparisons = _comparison_sections(src.paper, data)
    verdicts = _verdicts(src.paper, data)
    cost = _cost(src.client, src.cells)
    from mlflow.utils.mlflow_tags import MLFLOW_GIT_COMMIT

    commits = Counter(r.data.tags.get(MLFLOW_GIT_COMMIT, "unknown")
                      for r in finished.values())
    counts, missing = _cell_states(src.spec, src.cells)
    _mark_interim(verdicts, counts)
    prov = _provenance(src, spec_path, scale, counts, cost, commits)
    sweep = src.cells.sweep_run
    page = SuitePage(suite=src.suite, spec=src.spec, paper=src.paper,
                     experiment=src.experiment, uri=src.uri,
                     sweep_run_id=sweep.info.run_id if sweep else None, provenance=prov,
                     counts=counts, sections=sections, comparisons=comparisons,
                     verdicts=verdicts, rows_per_method=_rows_per_method(src.spec, finished),
                     missing=missing, wall_s=cost.wall, cpu_s=cost.cpu,
                     commits=[k for k, _ in commits.most_common()],
                     generated=generated or datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                     origin=src.origin)
    page.markdown = render_markdown(page)
    return page


SMOKE_BANNER = (
    "> **Smoke run.** Every method of the suite at a trivial size (a step or two of "
    "training, one seed): the page shows that the suite runs end to end and renders; its "
    "numbers and verdicts say nothing about the paper. The reference pages are "
    "`docs/results/<suite>.md`.")


def render_markdown(page: SuitePage) -> str:
    title = f"# {page.paper.title}: results ({page.spec.scale} scale)"
    lines = [title, ""]
    if page.spec.scale == "smoke":
        lines += [SMOKE_BANNER, ""]
    lines += [f"Source: {page.paper.paper}.", "",
              "Generated by `" + (page.command or f"scarcelab results {rel(page.spec.path)}"
                                  + ("" if page.spec.scale == "reference"
                                     else f" --{page.spec.scale}"))
              + f"` on {page.generated} from {page.origin}; every number below is "
              "read from it or, beside ours, from `"
              + rel(page.paper.path) + "` (cited per value). Regenerate "
              "rather than edit.", "", "## How it was run", "", "| | |", "|:--|:--|"]
    lines += [f"| {k} | {v} |" for k, v in page.provenance.items()]
    lines += ["", "## Verdicts", "",
              "Each headline claim of the source, tested by a rule on our numbers "
              "(tracking/results/claims.py).", "",
              "| claim | source | rule | verdict | because |", "|:--|:--|:--|:--|:--|"]
    for v in page.verdicts:
        cells = [v.claim, v.source, v.rule, f"**{v.status}**", v.reason]
        lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ")
                                       for c in cells) + " |")
    lines += [""]
    if page.missing:
        lines += ["## Cells without a finished run", ""] + [f"- {m}" for m in page.missing]
        lines += [""]
    lines += ["## Tables and figures", ""]
    for s in page.sections:
        lines += [f"### {s.title}", "", s.text, ""]
        for name in s.figures:
            lines += [f"![{name}]({page.suite}/{name}.png)", ""]
    lines += ["## Beside the paper", ""]
    for s in page.comparisons:
        lines += [f"### {s.title}", "", s.text, ""]
    if not page.comparisons:
        lines += ["No value of the source is put beside ours (see below).", ""]
    if page.paper.not_found:
        lines += ["Not put beside ours, and why:", ""]
        lines += [f"- {s}" for s in page.paper.not_found] + [""]
    return "\n".join(lines).rstrip() + "\n"


def write_page(page: SuitePage, out_dir: str | Path) -> Path:
    """``<out>/<suite>.md`` and ``<out>/<suite>/*.png|*.csv`` (the folder is replaced, so a
    figure that is no longer drawn does not linger)."""
    import shutil

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    folder = out / page.suite
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir()
    for s in page.sections:
        for name, data in s.figures.items():
            (folder / f"{name}.png").write_bytes(data)
        for name, text in s.csv.items():
            (folder / f"{name}.csv").write_text(text)
    path = out / f"{page.suite}.md"
    path.write_text(page.markdown)
    return path


def _summary(verdicts: Sequence[Verdict]) -> str:
    n = Counter(v.status for v in verdicts)
    return ", ".join(f"{n[s]} {s}" for s in C.STATUSES if n[s]) or "no claims"


#: marks an index row carried over from the previous index (see :func:`write_index`)
CARRIED = "†"


def _previous_rows(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The page rows of an index written before (suite -> its line) and, per suite, when
    the row was computed: the date of that index, or for a row it had itself carried, the
    date its footnote gave (so a row carried twice keeps its first date). Nothing if there
    is no such file."""
    if not path.is_file():
        return {}, {}
    text = path.read_text(encoding="utf-8", errors="replace")
    when = re.search(r" on (\d{4}-\d\d-\d\d \d\d:\d\d UTC) from ", text)
    rows, dates = {}, {}
    for line in text.splitlines():
        m = re.match(r"\| \[([^\]]+)\]\(\1\.md\)", line)
        if m:
            rows[m.group(1)] = line
            dates[m.group(1)] = when.group(1) if when else "an earlier run"
        f = re.match(rf"{CARRIED} (.+?): .*?; the rows? (?:is|are) the ones? the index of "
                     r"(.+?) gave", line)
        if f:
            for suite in f.group(1).split(", "):
                dates[suite] = f.group(2)
    return rows, dates


def write_index(entries: Sequence[tuple[str, SuitePage | str]], out_dir: str | Path,
                scale: str = "reference", source: str = "the tracking store") -> Path:
    """``<out>/README.md``: one row per suite (a page, or why there is none).

    A suite with no sweep in this store keeps the row the previous index gave its page,
    marked :data:`CARRIED`: suites are run on different machines into different stores
    (a 2-hour suite fits one machine's session, five do not), and its page, which this
    command leaves as it was, still holds what that row summarises. The row is the earlier
    command's output, moved, never rebuilt or edited, and its footnote keeps the date the
    row was computed however often it is carried. ``source``: where the pages came from,
    as the header says it (the store, or the exports)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    previous, row_dates = _previous_rows(out / "README.md")
    carried: dict[str, list[str]] = {}  # date the row was computed -> suites
    lines = [f"# Results of the suites ({scale} scale)", ""]
    if scale == "smoke":
        lines += [SMOKE_BANNER, ""]
    flag = "" if scale == "reference" else f" --{scale}"
    lines += [f"Generated by `scarcelab results --index{flag}`"
              f" on {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')} from {source}; each "
              "page says how its suite was run and why each verdict is what it is.", "",
              "| suite | source | headline verdicts | wall | CPU | commit | cells |",
              "|:--|:--|:--|--:|--:|:--|:--|"]
    for suite, entry in entries:
        if isinstance(entry, str):
            row = previous.get(suite)
            if row is not None and (out / f"{suite}.md").is_file():
                if f"| [{suite}]({suite}.md) {CARRIED} |" not in row:
                    row = row.replace(f"| [{suite}]({suite}.md) |",
                                      f"| [{suite}]({suite}.md) {CARRIED} |", 1)
                lines.append(row)
                carried.setdefault(row_dates.get(suite, "an earlier run"), []).append(suite)
            else:
                lines.append(f"| {suite} | | {entry} | | | | |")
            continue
        p = entry
        interim = " (interim)" if p.counts["finished"] < p.counts["cells"] else ""
        heads = "; ".join(f"{v.id}: **{v.status}**{interim}" for v in p.verdicts)
        commit = ", ".join(f"`{_short_commit(c)}`" for c in p.commits) or "—"
        lines.append(f"| [{suite}]({suite}.md) | {p.paper.title} | {heads} "
                     f"({_summary(p.verdicts)}) | {_fmt_s(p.wall_s)} | {_fmt_s(p.cpu_s)} | "
                     f"{commit} | {p.counts['finished']}/{p.counts['cells']} finished"
                     + (f" ({p.spec.scale} scale)" if p.spec.scale != scale else "") + " |")
    for when, suites in carried.items():
        many = len(suites) > 1
        row, gen = (("rows are the ones", "pages, which were generated from the stores of "
                     "those runs and are left as they were") if many else
                    ("row is the one", "page, which was generated from the store of that "
                     "run and is left as it was"))
        lines += ["", f"{CARRIED} {', '.join(suites)}: no sweep of {'them' if many else 'it'}"
                  f" in {source}; the {row} the index of {when} gave the {gen}."]
    path = out / "README.md"
    path.write_text("\n".join(lines) + "\n")
    return path
