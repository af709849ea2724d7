"""The compare report: the per-seed table read from the tracking store, the answer
(:mod:`.analysis`) as markdown and CSV, and its ``report`` run.

What is read, per cell of the grid's sweep spec: the cell's runs (tag ``scarcelab.cell``)
in its experiment; the FINISHED one is the study (the sweep driver hands each cell its run,
``tracking/sweep/driver.py``), whose validation-selected scores come from the query layer
(``Tracked.selected``: the study's last ``best/val_balanced_accuracy`` / ``best/test_*``,
or its trials' record when it has no series); its cost is what the driver measured around
the cell's process (``sweep/cell_wall_s``, ``sweep/cell_cpu_s``), summed over every attempt
for the totals. Only the grid's cells count: another sweep or a hand-run study in the same
experiment never enters the answer.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd

from scarcelab import tags as T
from scarcelab.tracking.compare.analysis import TEST, VAL, Analysis
from scarcelab.tracking.compare.grid import LABELED_ONLY, Grid, Plan, fmt_duration

#: the per-seed table's columns (per_seed.csv)
PER_SEED = ["seed", "method", "family", "status", TEST, VAL, "run_id", "split_hash",
            "budget_minutes", "wall_s", "cpu_s", "wall_s_all", "cpu_s_all", "attempts",
            "failed_attempts", "error"]


@dataclass
class Collected:
    """What the store holds about the grid's cells."""

    per_seed: pd.DataFrame
    sweep_run: str | None = None
    invocations: int = 0
    invocation_wall_s: float = float("nan")  # every invocation of the sweep, summed
    machines: list[str] = field(default_factory=list)
    commits: list[str] = field(default_factory=list)
    uri: str = ""


def collect(spec: Any, grid: Grid) -> Collected:
    """The per-seed table of ``spec``'s cells (:data:`PER_SEED`), from the current tracking
    store. A cell with no FINISHED run has status FAILED (with its last error) or NOT RUN."""
    import mlflow
    from mlflow.tracking import MlflowClient
    from mlflow.utils.mlflow_tags import MLFLOW_GIT_COMMIT

    from scarcelab.tracking.sweep.driver import CELL_CPU, CELL_WALL, INVOCATION_WALL, result_run

    client = MlflowClient()
    uri = mlflow.get_tracking_uri()
    exp = client.get_experiment_by_name(spec.experiment)
    fams = grid.families
    by_cell: dict[str, list[Any]] = {}
    out = Collected(pd.DataFrame(columns=PER_SEED), uri=uri)
    if exp is not None:
        runs = client.search_runs([exp.experiment_id], f"tags.`{T.SWEEP}` = '{spec.name}'",
                                  max_results=50_000)
        for r in runs:
            cid = r.data.tags.get(T.CELL)
            if cid:
                by_cell.setdefault(cid, []).append(r)
            elif r.data.tags.get(T.ROLE) == "sweep":
                out.sweep_run = r.info.run_id
                n = r.data.tags.get(T.SWEEP_INVOCATIONS, "0")
                out.invocations = int(n) if n.isdigit() else 0
        if out.sweep_run:
            hist = client.get_metric_history(out.sweep_run, INVOCATION_WALL)
            if hist:
                last = {m.step: m.value for m in hist}  # one value per invocation
                out.invocation_wall_s = float(sum(last.values()))
    rows, done_ids = [], []
    machines, commits = set(), set()
    for cell in spec.cells:
        opts = dict(cell.options)
        attempts = by_cell.get(cell.id, [])
        done = result_run(attempts)
        failed = [r for r in attempts if r.info.status == "FAILED"]
        last_err = ""
        if failed:
            newest = max(failed, key=lambda r: r.info.start_time or 0)
            last_err = newest.data.tags.get(T.ERROR, "")[:300]
        status = "FINISHED" if done is not None else ("FAILED" if attempts else "NOT RUN")
        for r in attempts:
            m = r.data.tags.get(f"{T.MACHINE}.cpu")
            if m:
                gpu = r.data.tags.get(f"{T.MACHINE}.gpu", "none")
                machines.add(f"{r.data.tags.get(f'{T.MACHINE}.cores', '?')} cores, {m}, "
                             f"GPU: {gpu}")
            c = r.data.tags.get(MLFLOW_GIT_COMMIT)
            if c:
                commits.add(c[:12] + ("+dirty" if c.endswith("+dirty") else ""))
        wall = cpu = np.nan
        if done is not None:
            done_ids.append(done.info.run_id)
            met = done.data.metrics
            wall = met.get(CELL_WALL, np.nan)
            if not np.isfinite(wall) and done.info.end_time:  # not run by a sweep driver
                wall = (done.info.end_time - done.info.start_time) / 1000.0
            cpu = met.get(CELL_CPU, np.nan)
        rows.append({
            "seed": int(opts["seed"]), "method": opts["method"], "family": fams[opts["method"]],
            "status": status, TEST: np.nan, VAL: np.nan,
            "run_id": done.info.run_id if done is not None else "",
            "split_hash": done.data.tags.get(T.SPLIT_HASH, "") if done is not None else "",
            "budget_minutes": float(opts["budget_minutes"]), "wall_s": wall, "cpu_s": cpu,
            "wall_s_all": float(sum(r.data.metrics.get(CELL_WALL, 0.0) for r in attempts)),
            "cpu_s_all": float(sum(r.data.metrics.get(CELL_CPU, 0.0) for r in attempts)),
            "attempts": len(attempts), "failed_attempts": len(failed),
            "error": "" if done is not None else last_err})
    df = pd.DataFrame(rows, columns=PER_SEED)
    if done_ids:
        scores = selected_scores(spec.experiment, done_ids)
        for col in (TEST, VAL):
            df[col] = df["run_id"].map(scores[col]) if col in scores else np.nan
    out.per_seed = df
    out.machines, out.commits = sorted(machines), sorted(commits)
    return out


def selected_scores(experiment: str, run_ids: list[str]) -> pd.DataFrame:
    """Validation and test balanced accuracy of the checkpoint each study selected on
    validation, by study run id (the query layer's own selection, docs/query.md)."""
    from scarcelab.tracking.query import load

    t = load(experiment)
    sel = t.selected()
    sel = sel[sel["study_id"].isin(set(run_ids))].set_index("study_id")
    return sel[[c for c in (TEST, VAL) if c in sel]]


# -- rendering --------------------------------------------------------------------------

def _f(x: Any, d: int = 3, sign: bool = False) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:+.{d}f}" if sign else f"{x:.{d}f}"


def _p(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return "< 0.001" if x < 0.001 else f"{x:.3f}"


def _t(x: Any) -> str:
    return fmt_duration(x) if isinstance(x, int | float) and math.isfinite(x) else "–"


def _md_table(header: list[str], rows: list[list[str]], align: str = "") -> str:
    al = align or "l" * len(header)
    sep = ["---:" if a == "r" else ":---" for a in al]
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def headline_rows(an: Analysis) -> tuple[list[str], list[list[str]]]:
    """The headline table as the report prints it (summary.csv has every digit)."""
    ci = f"{round((1 - an.alpha) * 100):g} %"
    base = an.baseline or "the best labeled-only method"
    header = ["rank", "method", "family", "verdict", "test BA (mean ± sd)", "val BA",
              "p vs best (Holm)", f"gain over {base} [{ci} CI]", "better on",
              "wall per study", "total wall", "total CPU"]
    rows = []
    records = cast(list[dict[str, Any]], an.table.to_dict("records"))
    for d in records:
        if d["verdict"] == "failed":
            rows.append(["–", f"`{d['method']}`", d["family"], "no finished study",
                         "–", "–", "–", "–", "–", "–", _t(d["wall_s_total"]),
                         _t(d["cpu_s_total"])])
            continue
        sd = d[f"{TEST}_std"]
        score = _f(d[f"{TEST}_mean"]) + (f" ± {_f(sd)}" if isinstance(sd, float)
                                         and math.isfinite(sd) else "")
        gain = "–"
        if an.baseline is not None:
            gain = _f(d["gain"], sign=True)
            if math.isfinite(d["gain_low"]):
                gain += f" [{_f(d['gain_low'], sign=True)}, {_f(d['gain_high'], sign=True)}]"
            if d["method"] == an.baseline:
                gain = "(reference)"
        name = f"**`{d['method']}`**" if d["verdict"] in ("best", "tied") else f"`{d['method']}`"
        rows.append([_cell(d["rank"]), name, d["family"], d["verdict"], score,
                     _f(d[f"{VAL}_mean"]), _p(d["p_vs_best_holm"]), gain,
                     _cell(d["wins"]) if d["method"] != an.baseline else "–",
                     _t(d["wall_s_mean"]), _t(d["wall_s_total"]), _t(d["cpu_s_total"])])
    return header, rows


def _cell(x: Any) -> str:
    """A table cell: a missing value is a dash, a whole number has no decimals."""
    if x is None or (isinstance(x, float) and math.isnan(x)) or x == "":
        return "–"
    return str(int(x)) if isinstance(x, float) and x.is_integer() else str(x)


def _answer(an: Analysis, grid: Grid, plan: Plan, col: Collected) -> list[str]:
    # method -> its row (typed plainly: a frame's .loc is typed as a frame, a series or
    # a scalar, and every use below is a scalar)
    t = cast(dict[str, dict[str, Any]], an.table.set_index("method").to_dict("index")
             if len(an.table) else {})
    n = len(an.seeds_used)
    k = len([m for m in t if t[m]["verdict"] != "failed"]) if t else 0
    ci = f"{round((1 - an.alpha) * 100):g} %"
    out = []
    if an.best is None:
        return [f"- **No answer:** {'; '.join(an.notes) or 'no study finished'}."]
    b = t[an.best]
    out.append(f"- **Best: `{an.best}`** ({b['family']}) — validation-selected test "
               f"balanced accuracy {_f(b[f'{TEST}_mean'])}"
               + (f" ± {_f(b[f'{TEST}_std'])}" if n > 1 else "")
               + f" (mean{' ± sample sd' if n > 1 else ''} over {n} seed{'s' * (n != 1)}).")
    tied = [m for m in t if t[m]["verdict"] == "tied"]
    worse = [m for m in t if t[m]["verdict"] == "worse"]
    if n >= 2:
        how = (f"paired t-test over the {n} seeds, Holm-adjusted over {k - 1} "
               f"comparison{'s' * (k - 1 != 1)}, α = {an.alpha:g}")
        out.append("- **Tied with it** (not significantly different; " + how + "): "
                   + (", ".join(f"`{m}` (p = {_p(t[m]['p_vs_best_holm'])})" for m in tied)
                      or "none") + ".")
        out.append("- **Significantly worse:** " + (", ".join(
            f"`{m}` (p = {_p(t[m]['p_vs_best_holm'])})" for m in worse) or "none") + ".")
    else:
        out.append(f"- **Tied / worse:** not tested — {n} complete seed (at least 2 are "
                   "needed for a paired test).")
    if an.baseline is not None:
        r = t[an.baseline]
        cands = [m for m in t if t[m]["family"] != LABELED_ONLY
                 and t[m]["verdict"] != "failed"]
        line = (f"- **Gain over the best labeled-only method, `{an.baseline}` "
                f"({_f(r[f'{TEST}_mean'])}):** ")
        if not cands:
            line += "no semi- or self-supervised method finished."
        else:
            c = cands[0]  # table order: the best of them
            g = t[c]
            interval = (f" [{_f(g['gain_low'], sign=True)}, {_f(g['gain_high'], sign=True)}]"
                        f" ({ci} paired t-interval over {n} seeds, better on {g['wins']} "
                        "seeds)") if math.isfinite(g["gain_low"]) else ""
            sig = ""
            if math.isfinite(g["gain_p"]):
                sig = ("; the interval excludes 0: a real gain on this data"
                       if g["gain_low"] > 0 else
                       "; the interval excludes 0: a real loss on this data"
                       if g["gain_high"] < 0 else
                       "; the interval includes 0: no gain shown on this data")
            line += f"the best semi/self method, `{c}`, {_f(g['gain'], sign=True)}{interval}{sig}."
            if an.best == an.baseline:
                line += f" No method beat `{an.baseline}` on average."
        out.append(line)
    if an.winner_run:
        uri = f"runs:/{an.winner_run}/model"
        nb = int(t[an.best]["studies"])
        out.append(f"- **Winning model:** `{uri}` — `{an.best}`, seed {an.winner_seed} (the "
                   f"highest validation score of its {nb} stud{'ies' if nb != 1 else 'y'}; "
                   "the test set chose the method, not the model). Load it with "
                   f"`mlflow.pyfunc.load_model(\"{uri}\")` or `mlflow.pytorch.load_model` "
                   "(what it takes: README, \"What is tracked\").")
    total = float(an.table["wall_s_total"].sum(skipna=True)) if len(an.table) else 0.0
    whole = (f"; the sweep ran {_t(col.invocation_wall_s)} over {col.invocations} "
             "invocation(s)") if math.isfinite(col.invocation_wall_s) else ""
    out.append(f"- **Cost:** {grid.n_cells} studies with a budget of {plan.cell_minutes:g} "
               f"min each; their cells ran {_t(total)} in all (sum of wall times, failed "
               f"attempts included){whole}.")
    return out


def markdown(an: Analysis, col: Collected, grid: Grid, plan: Plan, spec: Any,
             command: str, generated: str) -> str:
    """The report page."""
    from scarcelab.tracking.query.render import report_meta

    meta = report_meta([spec.experiment], col.uri)
    lines = [f"# Which method for `{grid.dataset}`? (scarcelab compare)", "",
             f"Generated {generated or meta['generated']} from the tracking store "
             f"`{meta['tracking URI']}`, experiment `{spec.experiment}`"
             + (f" (sweep run `{col.sweep_run}`)" if col.sweep_run else "") + ". Every "
             "number below is read from the store; regenerate with the same command and "
             "`--report-only` rather than editing it.", "", "## The answer", "",
             *_answer(an, grid, plan, col), "", "## Headline table", ""]
    header, rows = headline_rows(an)
    lines += [_md_table(header, rows, "rllllrrlrrrr"), "",
              "*test BA*: balanced accuracy on the test set of the checkpoint each study "
              "selected on its validation set (`best/test_balanced_accuracy`), over the "
              f"seeds every method finished ({', '.join(map(str, an.seeds_used)) or 'none'})."
              " *p vs best*: paired t-test against the best method, Holm-adjusted; *tied* "
              f"= p ≥ {an.alpha:g}. *gain*: mean paired difference to the best labeled-only "
              "method with its t-interval; *better on*: seeds on which the method beat it. "
              "*wall per study*: the cell's process, start to end; totals include failed "
              "attempts. Every digit: `summary.csv`.", ""]
    ps = col.per_seed
    lines += ["## Per seed", "",
              "Test balanced accuracy per seed (a seed is one labeled / validation split, "
              "the same for every method; its hash in the last column).", ""]
    if len(ps):
        methods = list(grid.methods)
        piv = ps.pivot_table(index="seed", columns="method", values=TEST, aggfunc="last"
                             ).reindex(index=list(grid.seeds), columns=methods)
        hashes = ps[ps["split_hash"] != ""].groupby("seed")["split_hash"].agg(
            lambda s: ", ".join(sorted(set(s))))
        prow = [[str(s), *[_f(piv.loc[s, m]) for m in methods], str(hashes.get(s, "–"))]
                for s in piv.index]
        lines += [_md_table(["seed", *[f"`{m}`" for m in methods], "split hash"], prow,
                            "r" * (len(methods) + 1) + "l"), ""]
        mixed = [s for s, h in hashes.items() if "," in str(h)]
        if mixed:
            lines += [f"**Warning:** seeds {', '.join(map(str, mixed))} have more than one "
                      "split across methods: their differences are not paired on the same "
                      "images.", ""]
    problems = ps[ps["status"] != "FINISHED"] if len(ps) else ps
    if len(problems) or an.seeds_dropped or an.notes:
        lines += ["## Not in the answer", ""]
        for r in problems.itertuples(index=False):
            lines.append(f"- `{r.method}` seed {r.seed}: {r.status}"
                         + (f" — {r.error}" if r.error else ""))
        if an.seeds_dropped:
            lines.append(f"- seeds {', '.join(map(str, an.seeds_dropped))}: left out of the "
                         "paired statistics (not every method finished on them).")
        lines += [f"- {n}" for n in an.notes]
        lines.append("")
    over = (ps["wall_s"] - ps["budget_minutes"] * 60.0).dropna() if len(ps) else pd.Series()
    lines += ["## How it was computed", "",
              f"- **Grid:** {len(grid.methods)} methods ({', '.join(grid.methods)}) × "
              f"{len(grid.seeds)} seeds ({', '.join(map(str, grid.seeds))}) on "
              f"`{grid.dataset}`, every study with the same options ("
              + (", ".join(f"`{k}={v}`" for k, v in grid.options.items()) or "none") + ")"
              + "".join(f"; `{m}` also " + ", ".join(f"`{k}={v}`" for k, v in o.items())
                        for m, o in grid.method_options.items()) + ".",
              f"- **Budget:** {plan.formula()}."
              + (f" Measured: a cell's wall time minus its budget was {over.mean():+.0f} s "
                 f"on average, {over.max():+.0f} s at most (the plan assumed "
                 f"{plan.overhead_s:+g} s per cell; a study that stops before its budget, "
                 "e.g. with max_trials, makes it negative)." if len(over) else ""),
              "- **Test:** each method against the best, seed by seed (the split is the "
              "seed's, shared by all methods): Student's paired t-test, two-sided, Holm's "
              "correction over the comparisons; gains as paired t-intervals. Assumptions "
              "and limits (few seeds, one test set, overlapping training sets): "
              "docs/compare.md, \"The test\".",
              "- **Machines:** " + ("; ".join(col.machines) or "not recorded") + ". **Code:** "
              + (", ".join(f"`{c}`" for c in col.commits) or "not recorded") + ".",
              f"- **Command:** `{command}`", ""]
    return "\n".join(lines)


def write(an: Analysis, col: Collected, grid: Grid, plan: Plan, spec: Any, out_dir: Path,
          command: str, generated: str = "") -> dict[str, Path]:
    """report.md, summary.csv (the headline table, every digit) and per_seed.csv under
    ``out_dir``; returns them by name."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"report.md": out_dir / "report.md", "summary.csv": out_dir / "summary.csv",
             "per_seed.csv": out_dir / "per_seed.csv"}
    paths["report.md"].write_text(markdown(an, col, grid, plan, spec, command, generated))
    an.table.to_csv(paths["summary.csv"], index=False)
    col.per_seed.to_csv(paths["per_seed.csv"], index=False)
    return paths


def log(paths: dict[str, Path], experiment: str, col: Collected, an: Analysis,
        run_name: str = "", tags: dict[str, str] | None = None,
        description: str = "") -> str:
    """The output folder as the artifacts (``report/``) of a run tagged
    ``scarcelab.role=report`` in the compare's experiment (under ``mlflow run``: the run
    MLflow Projects opened), linked to the sweep run; returns its id."""
    from scarcelab.tracking.query.report import log_report

    extra = {T.EXPERIMENTS: experiment}
    if col.sweep_run:
        extra[T.SWEEP_RUN] = col.sweep_run
    return log_report(paths, experiment, run_name=run_name or "compare-report",
                      tags={**(tags or {}), **extra}, description=description or None)


def command_line(argv: list[str]) -> str:
    return shlex.join(["scarcelab", "compare", *argv])
