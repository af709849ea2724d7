"""CDALBench's tabular and synthetic problems against their Tables 8/9: run the grid, print
the table, optionally write it into docs/active.md.

Every cell (problem x strategy x protocol variant) is one ``run_al`` sweep — the code path
of ``scarcelab al`` — logged to an MLflow store (an embedded sqlite file by default), one
experiment per protocol variant; the table is then computed from the finished repetitions
in that store, never typed. Two worker processes by default (``--jobs``), each single
threaded, because the AL classifiers are tiny MLPs.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/al_cdalbench.py run \\
        --store sqlite:////work/out/al/cdalbench.db --reps 5 \\
        --variant one_fit_per_query=fit_per_label=0 --variant test_stop=early_stop_on=test
    .venv/bin/python bench/al_cdalbench.py table --store sqlite:////work/out/al/cdalbench.db \\
        --write-docs docs/active.md

A variant is ``name=key=value,...``: ALConfig overrides (as ``--set`` takes them) plus
``early_stop_on=test`` (the flag of ``scarcelab al --early-stop-on test``: CDALBench's
earlier test-set stopping, a leak), ``strategy.<name>=<value>`` (a strategy setting, as
``scarcelab al --set strategy.<name>=`` takes it) and ``max_candidates=N`` (candidates
drawn per query, ``scarcelab al --max-candidates``). ``--only-q`` restricts a variant to one
query size (``name@5=...``). The default protocol is the experiment ``<prefix>-default``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if TYPE_CHECKING:
    from scarcelab.active.loop import ALRunConfig

#: CDALBench's AUCs (mean +- std over their 50 runs) for the problems scarcelab has, from
#: their repository's ``results/auc_qs1.csv`` and ``results/auc_qs5.csv`` (commit 9180529c of
#: github.com/wernerth94/A-Cross-Domain-Benchmark-for-Active-Learning), the numbers of the
#: paper's Tables 8 (q = 1) and 9 (q = 5). ThreeClust is scarcelab's ``honeypot``.
PAPER: dict[tuple[str, int, str], tuple[float, float]] = {
    ("splice", 1, "random"): (0.760, 0.016), ("splice", 1, "margin"): (0.769, 0.021),
    ("splice", 5, "random"): (0.758, 0.015), ("splice", 5, "margin"): (0.765, 0.021),
    ("dna", 1, "random"): (0.774, 0.013), ("dna", 1, "margin"): (0.806, 0.013),
    ("dna", 5, "random"): (0.771, 0.013), ("dna", 5, "margin"): (0.794, 0.011),
    ("usps", 1, "random"): (0.823, 0.009), ("usps", 1, "margin"): (0.858, 0.006),
    ("usps", 5, "random"): (0.820, 0.009), ("usps", 5, "margin"): (0.855, 0.006),
    # the two USPS rows the CDALBench page lands above (docs/active.md), same files
    ("usps", 1, "coreset"): (0.767, 0.016), ("usps", 1, "typiclust"): (0.828, 0.007),
    ("usps", 5, "coreset"): (0.765, 0.015), ("usps", 5, "typiclust"): (0.757, 0.020),
    ("diverging_sine", 1, "random"): (0.933, 0.017),
    ("diverging_sine", 1, "margin"): (0.941, 0.018),
    ("diverging_sine", 5, "random"): (0.921, 0.018),
    ("diverging_sine", 5, "margin"): (0.923, 0.019),
    ("honeypot", 1, "random"): (0.721, 0.036), ("honeypot", 1, "margin"): (0.704, 0.074),
    ("honeypot", 5, "random"): (0.713, 0.034), ("honeypot", 5, "margin"): (0.697, 0.055),
}
PROBLEMS = ["splice:1", "splice:5", "usps:1", "usps:5", "honeypot:1", "honeypot:5",
            "diverging_sine:1", "diverging_sine:5"]
START, END = "<!-- {}:start -->", "<!-- {}:end -->"


def _value(v: str) -> Any:
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    return v


def _variant(text: str) -> tuple[str, int | None, dict[str, Any]]:
    name, _, rest = text.partition("=")
    name, _, q = name.partition("@")
    over = {k: _value(v) for k, v in (p.split("=", 1) for p in rest.split(",") if p)}
    return name, int(q) if q else None, over


def run_config(ds: str, q: int, strategy: str, over: dict[str, Any], reps: int
               ) -> ALRunConfig:
    """A variant's settings as ``scarcelab al`` would take them, split into the dataset
    overrides, the strategy's settings and the candidate count."""
    from scarcelab.active.loop import ALRunConfig

    over = dict(over)
    if over.pop("early_stop_on", "val") == "test":  # as `scarcelab al --early-stop-on test`
        over.setdefault("stop_on", "test")
        over.setdefault("val_fraction", 0.0)
    params = {k.removeprefix("strategy."): over.pop(k)
              for k in [k for k in over if k.startswith("strategy.")]}
    cands = over.pop("max_candidates", None)
    return ALRunConfig(strategy=strategy, dataset=ds, query_size=q, repetitions=reps,
                       overrides=over, strategy_params=params,
                       max_candidates=None if cands is None else int(cands))


def _cell(store: str, experiment: str, ds: str, q: int, strategy: str, over: dict[str, Any],
          reps: int) -> str:
    import torch

    from scarcelab.active.loop import run_al, sweep_summary
    from scarcelab.tracking.mlflow_tracker import MlflowTracker

    torch.set_num_threads(1)
    rc = run_config(ds, q, strategy, over, reps)
    t0 = time.process_time()
    res = run_al(rc, MlflowTracker(experiment=experiment, tracking_uri=store))
    return f"[{experiment}] {sweep_summary(res)} ({time.process_time() - t0:.0f} CPU s)"


def run(a: argparse.Namespace) -> None:
    import mlflow

    mlflow.set_tracking_uri(a.store)  # create the store's schema once, before the workers
    variants = ([] if a.variants_only else [("default", None, {})]) + [
        _variant(v) for v in a.variant]
    if not variants:
        raise SystemExit("--variants-only needs at least one --variant")
    for name, _, _ in variants:
        if mlflow.get_experiment_by_name(f"{a.prefix}-{name}") is None:
            mlflow.create_experiment(f"{a.prefix}-{name}")
    done = _finished(a.store, a.prefix)
    cells = []
    for name, only_q, over in variants:
        for prob in a.problem or PROBLEMS:
            ds, q = prob.split(":")[0], int(prob.split(":")[1])
            if only_q is not None and q != only_q:
                continue
            for s in a.strategies:
                if done.get((name, ds, q, s), 0) >= a.reps:
                    continue  # already in the store (a rerun resumes)
                cells.append((a.store, f"{a.prefix}-{name}", ds, q, s, over, a.reps))
    from multiprocessing import get_context

    with get_context("spawn").Pool(a.jobs) as pool:
        for line in pool.imap_unordered(_star, cells):
            print(line, flush=True)
    table(a)


def _star(args: tuple[Any, ...]) -> str:
    return _cell(*args)


def _finished(store: str, prefix: str) -> dict[tuple[str, str, int, str], int]:
    df = _runs(store, prefix)
    if df.empty:
        return {}
    return {k: len(g) for k, g in df.groupby(["variant", "dataset", "query_size", "strategy"])}


def _runs(store: str, prefix: str) -> Any:
    """One row per finished repetition: variant, dataset, query_size, strategy, repetition,
    auc (the latest run of a repeated repetition)."""
    import mlflow
    import pandas as pd

    mlflow.set_tracking_uri(store)
    exps = [e for e in mlflow.search_experiments() if e.name.startswith(f"{prefix}-")]
    if not exps:
        return pd.DataFrame()
    df = mlflow.search_runs([e.experiment_id for e in exps],
                            "tags.`scarcelab.role` = 'al' and attributes.status = 'FINISHED'",
                            output_format="pandas")
    if df.empty:
        return df
    names = {e.experiment_id: e.name.removeprefix(f"{prefix}-") for e in exps}
    out = pd.DataFrame({
        "variant": df["experiment_id"].map(names), "dataset": df["tags.scarcelab.dataset"],
        "query_size": df["tags.scarcelab.query_size"].astype(int),
        "strategy": df["tags.scarcelab.method"],
        "repetition": df["tags.scarcelab.repetition"].astype(int),
        "auc": df["metrics.al/auc"],
        # share of the repetition's recorded fits that left a one-class classifier (runs
        # made before the metric existed: unknown)
        "collapsed": (df["metrics.al/collapsed_fits"] if "metrics.al/collapsed_fits" in df
                      else float("nan"))})
    return out.drop_duplicates(["variant", "dataset", "query_size", "strategy", "repetition"])


def render(df: Any, store: str) -> str:
    """The markdown table: our AUC mean +- sample std (repetitions) per protocol variant,
    the paper's value, and the default protocol's difference to it."""
    variants = ["default"] + sorted(v for v in df["variant"].unique() if v != "default")
    head = ("| problem | strategy | CDALBench | " + " | ".join(variants)
            + " | default − paper |\n|" + "---|" * (4 + len(variants)))
    lines = [head]
    keys = sorted({(d, q, s) for d, q, s in zip(df["dataset"], df["query_size"],
                                               df["strategy"], strict=True)},
                  key=lambda k: (PROBLEMS.index(f"{k[0]}:{k[1]}") if f"{k[0]}:{k[1]}"
                                 in PROBLEMS else 99, k))
    within = 0
    for ds, q, s in keys:
        paper = PAPER.get((ds, q, s))
        cells = []
        diff = ""
        for v in variants:
            a = df[(df["variant"] == v) & (df["dataset"] == ds) & (df["query_size"] == q)
                   & (df["strategy"] == s)]["auc"].to_numpy()
            if not len(a):
                cells.append("")
                continue
            sd = a.std(ddof=1) if len(a) > 1 else 0.0
            c = (df[(df["variant"] == v) & (df["dataset"] == ds) & (df["query_size"] == q)
                    & (df["strategy"] == s)]["collapsed"].to_numpy(dtype=float)
                 if "collapsed" in df else [])
            known = [x for x in c if x == x]  # NaN: a run from before the metric
            mean_c = sum(known) / len(known) if known else 0.0
            cells.append(f"{a.mean():.3f} ± {sd:.3f} ({len(a)})"
                         + (f" ⊘{mean_c:.0f}" if mean_c >= 0.5 else ""))
            if v == "default" and paper:
                d = a.mean() - paper[0]
                within += abs(d) <= 0.02
                diff = f"{d:+.3f}"
        ref = f"{paper[0]:.3f} ± {paper[1]:.3f}" if paper else "—"
        lines.append(f"| {ds} q={q} | {s} | {ref} | " + " | ".join(cells) + f" | {diff} |")
    n = sum(1 for k in keys if k in PAPER)
    lines.append(f"\n{within} of {n} default-protocol cells within ±0.02 of the paper. "
                 f"Generated by `bench/al_cdalbench.py table` from the runs in `{store}` "
                 f"(AUC mean ± sample std, repetitions in parentheses; ⊘n: on average n "
                 f"fits per repetition left a one-class classifier, `al/collapsed_fits`; "
                 f"CDALBench: their `results/auc_qs1.csv` / `auc_qs5.csv`, 50 runs).")
    return "\n".join(lines)


def table(a: argparse.Namespace) -> None:
    df = _runs(a.store, a.prefix)
    if df.empty:
        raise SystemExit(f"no finished AL repetitions under {a.prefix}-* in {a.store}")
    text = render(df, a.store)
    print(text)
    if a.write_docs:
        doc = Path(a.write_docs)
        body = doc.read_text()
        start, end = START.format(a.marker), END.format(a.marker)
        if start not in body or end not in body:
            raise SystemExit(f"{doc}: the markers {start} / {end} are missing; add them where "
                             "the table belongs")
        pre, rest = body.split(start, 1)
        post = rest.split(end, 1)[1]
        doc.write_text(f"{pre}{start}\n{text}\n{end}{post}")
        print(f"wrote the table into {doc}")
    n = len(df)
    print(f"repetitions={n} variants={df['variant'].nunique()} "
          f"cells={df.groupby(['variant', 'dataset', 'query_size', 'strategy']).ngroups}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "table"):
        p = sub.add_parser(name)
        p.add_argument("--store", default="sqlite:///bench/out/cdalbench.db")
        p.add_argument("--prefix", default="cdalbench")
        p.add_argument("--write-docs", default="")
        p.add_argument("--marker", default="cdalbench-table",
                       help="the table goes between <!-- MARKER:start --> and "
                            "<!-- MARKER:end --> of --write-docs")
    r = sub.choices["run"]
    r.add_argument("--problem", action="append", help="dataset:q (default: all eight)")
    r.add_argument("--strategies", nargs="+", default=["random", "margin"])
    r.add_argument("--reps", type=int, default=5)
    r.add_argument("--jobs", type=int, default=2)
    r.add_argument("--variant", action="append", default=[])
    r.add_argument("--variants-only", action="store_true",
                   help="run only the --variant protocols, not the default one (its cells "
                        "are on the results page already)")
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    (run if a.cmd == "run" else table)(a)


if __name__ == "__main__":
    main()
