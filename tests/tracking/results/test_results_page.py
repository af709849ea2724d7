"""Results-page machinery without a sweep: the specs' scales, the paper files, the page's
helpers (figure size, run nesting, wall-time union, paper lookup) and the `results`
command's errors. The pages themselves, from real smoke sweeps, are tested in
tests/tracking/results/test_results_smoke.py."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import yaml  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from scarcelab.entrypoints.cli import main  # noqa: E402
from scarcelab.tracking.query import views as V  # noqa: E402
from scarcelab.tracking.results import claims as C  # noqa: E402
from scarcelab.tracking.results import page as P  # noqa: E402
from scarcelab.tracking.results.papers import PaperError, load_paper, paper_path  # noqa: E402
from scarcelab.tracking.sweep.spec import SpecError, load_spec, parse_spec  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
SUITES = sorted((REPO / "suites").glob("*.yaml"))

GRID = """\
name: g
experiment: gx
grids:
  - entry: semi
    method: [fixmatch, pseudolabel]
    dataset: [breastmnist, pneumoniamnist]
    seed: [0, 1]
    budget_minutes: 2
  - entry: segment
    encoder: random
    steps_per_epoch: 20
    smoke: {steps_per_epoch: 2}
smoke:
  dataset: breastmnist
  seed: 0
  budget_minutes: 1
full:
  budget_minutes: 60
"""


def test_smoke_merges_like_full_with_a_grid_block_and_its_own_experiment():
    ref = parse_spec(GRID, "g.yaml")
    smoke = parse_spec(GRID, "g.yaml", smoke=True)
    full = parse_spec(GRID, "g.yaml", full=True)
    assert (ref.scale, smoke.scale, full.scale) == ("reference", "smoke", "full")
    assert (ref.experiment, smoke.experiment, full.experiment) == ("gx", "gx-smoke", "gx")
    assert len(ref.cells) == 9 and len(smoke.cells) == 3  # 2 methods x 1 x 1 + segment
    semi = [dict(c.options) for c in smoke.cells if c.entry == "semi"]
    assert {o["method"] for o in semi} == {"fixmatch", "pseudolabel"}
    assert all(o["dataset"] == "breastmnist" and o["budget_minutes"] == "1" for o in semi)
    seg = dict(next(c for c in smoke.cells if c.entry == "segment").options)
    assert seg["steps_per_epoch"] == "2"
    # the top-level smoke block does not reach a grid whose entry lacks the option: the
    # segment grid has no `dataset` axis here, so it needs its own block... and a bad key
    # in the smoke block is an error at its line
    bad = GRID.replace("  budget_minutes: 1\n", "  budget_minutes: 1\n  methd: x\n")
    with pytest.raises(SpecError, match=r"g.yaml:\d+: semi has no option 'methd'"):
        parse_spec(bad, "g.yaml", smoke=True)
    with pytest.raises(SpecError, match="choose one"):
        parse_spec(GRID, "g.yaml", smoke=True, full=True)
    own = parse_spec(GRID.replace("smoke:\n  dataset", "smoke:\n  experiment: ci\n  dataset"),
                     "g.yaml", smoke=True)
    assert own.experiment == "ci"


@pytest.mark.parametrize("path", SUITES, ids=lambda p: p.stem)
def test_each_suites_smoke_runs_every_method_of_its_reference_grid(path):
    def methods(spec):  # type: ignore[no-untyped-def]
        out = set()
        for c in spec.cells:
            o = dict(c.options)
            out.add((c.entry, o.get("method") or o.get("strategy") or o.get("encoder"),
                     o.get("protocol")))
        return out

    ref, smoke = load_spec(path), load_spec(path, smoke=True)
    assert methods(smoke) == methods(ref)
    assert smoke.experiment == f"{ref.experiment}-smoke"
    assert len(smoke.cells) <= len(ref.cells)
    paper = load_paper(paper_path(path))  # every suite has its paper file
    assert paper.suite == path.stem and paper.claims


#: Tune-It's methods (docs/tune.md; Brigato et al., IEEE Access 2022, Table 3)
TUNE_IT_METHODS = {"ce", "ole", "gradl2", "cosine", "cosine_ce", "harmonic", "fconv", "dsk",
                   "tvmf", "scattering"}


def test_reference_grids_cover_their_sources():
    """Issue 24's list: the methods / strategies / problems of each reference scale."""
    def axis(name, key):  # type: ignore[no-untyped-def]
        return {dict(c.options).get(key) for c in load_spec(REPO / "suites" / name).cells}

    assert axis("ssl_vs_ssl.yaml", "method") >= {
        "sup", "mixup", "supcon", "pseudolabel", "meanteacher", "mixmatch", "fixmatch",
        "flexmatch", "comatch", "simclr", "moco", "swav", "byol", "simsiam", "dino",
        "barlowtwins"}
    assert axis("ssl_vs_ssl.yaml", "dataset") == {"pneumoniamnist", "breastmnist"}
    assert len(axis("ssl_vs_ssl.yaml", "seed")) >= 2
    assert len({dict(c.options)["budget_minutes"]
                for c in load_spec(REPO / "suites/ssl_vs_ssl.yaml").cells}) == 1  # equal
    from conftest import CDALBENCH_STRATEGIES

    from scarcelab.active import STRATEGIES
    from scarcelab.methods import METHODS

    # every strategy the paper compares, each a registered one
    assert axis("cdalbench.yaml", "strategy") == CDALBENCH_STRATEGIES
    assert CDALBENCH_STRATEGIES <= set(STRATEGIES.names())
    assert axis("cdalbench.yaml", "dataset") >= {"splice", "usps", "honeypot",
                                                 "diverging_sine"}
    assert axis("cdalbench.yaml", "query_size") == {"1", "5"}
    assert all(int(r) >= 5 for r in axis("cdalbench.yaml", "repetitions"))
    assert len(axis("cscore.yaml", "method")) >= 4
    cs = dict(load_spec(REPO / "suites/cscore.yaml").cells[0].options)
    assert cs["ratios"] == "0,0.3,0.6" and cs["tuning"] == "once"
    assert set(cs["ood"].split(",")) == {"breastmnist", "mnist"}  # near and far
    # the 10 methods of docs/tune.md (Brigato et al.'s Table 3), each a registered method
    assert axis("tune_it.yaml", "method") == TUNE_IT_METHODS
    assert TUNE_IT_METHODS <= set(METHODS.names())
    # Kang et al.'s protocols on both encoders: probes (linear, fine-tuned; all labels and
    # 10 %), segmentation fine-tuned and frozen on all tiles and fine-tuned on 10 %
    tr = {(c.entry, o.get("encoder"), o.get("protocol"),
           o.get("n_labeled") or o.get("label_fraction"))
          for c in load_spec(REPO / "suites/pathology.yaml").cells
          for o in [dict(c.options)]}
    assert {("probe", e, p, n) for e in ("random", "@pretrain") for p in ("linear", "finetune")
            for n in ("all", "147")} | {("segment", e, p, f) for e in ("random", "@pretrain")
                                      for p, f in (("finetune", "1.0"), ("frozen", "1.0"),
                                                   ("finetune", "0.1"))} <= tr, tr


def test_dry_run_of_every_suite_and_scale():
    for path in SUITES:
        for flag in ([], ["--smoke"], ["--full"]):
            r = CliRunner().invoke(main, ["sweep", str(path), "--dry-run", *flag])
            assert r.exit_code == 0, r.output
            scale = flag[0][2:] if flag else "reference"
            assert f"({scale} scale" in r.output.splitlines()[0]


# -- paper files ---------------------------------------------------------------------------
PAPER = """\
suite: x
title: X
paper: Someone 2024
comparisons:
  - title: t
    source: s
    ours: {view: al_auc, query_size: 1}
    values:
      - {row: Random, column: Splice, value: 0.76, ours: {strategy: random, dataset: splice}}
claims:
  - {id: a, claim: c, source: s, rule: {kind: oracle_best}}
"""


@pytest.mark.parametrize("edit,words", [
    (("kind: oracle_best", "kind: nope"), "claims[0].rule.kind: unknown rule 'nope'"),
    (("kind: oracle_best}", "kind: oracle_best, bogus: 1}"), "claims[0].rule: "),
    (("view: al_auc", "view: nope"), "values[0].ours.view: 'nope'"),
    (("value: 0.76", "value: high"), "values[0].value: must be a int or float"),
    (("suite: x", "suite: y"), "suite: 'y' but the file is x.yaml"),
    (("title: X\n", ""), "needs 'title'"),
])
def test_paper_file_errors_name_the_file_and_key(tmp_path, edit, words):
    p = tmp_path / "x.yaml"
    text = PAPER.replace(*edit)
    assert text != PAPER
    p.write_text(text)
    with pytest.raises(PaperError) as e:
        load_paper(p)
    assert str(e.value).startswith(str(p)) and words in str(e.value), str(e.value)


def test_paper_values_are_those_of_the_file(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text(PAPER)
    paper = load_paper(p)
    (v,) = paper.comparisons[0].values
    assert (v.row, v.column, v.value) == ("Random", "Splice", 0.76)
    assert v.ours == {"view": "al_auc", "query_size": 1, "strategy": "random",
                      "dataset": "splice"}


def test_lookup_and_the_side_by_side_table():
    al = pd.DataFrame({"dataset": ["splice"] * 3, "query_size": [1, 1, 5],
                       "strategy": ["random"] * 3, "repetition": [0, 1, 0],
                       "auc": [0.70, 0.80, 0.5]})
    data = C.SuiteData(al=al)
    assert P.lookup({"view": "al_auc", "strategy": "random", "dataset": "splice",
                     "query_size": 1}, data) == (pytest.approx(0.75), 2)
    assert P.lookup({"view": "al_auc", "strategy": "margin", "dataset": "splice"}, data) \
        is None
    r = pd.DataFrame({"dataset": ["c"] * 2, "method": ["ce"] * 2, "study_id": "s",
                      "score": [0.5, 0.6]})
    assert P.lookup({"view": "table3", "method": "ce", "dataset": "c"},
                    C.SuiteData(retrains=r)) == (pytest.approx(0.55), 2)


# -- page helpers -------------------------------------------------------------------------
def test_small_png_stays_under_the_limit():
    fig, ax = plt.subplots(figsize=(12, 8))
    rng = np.random.default_rng(0)
    ax.imshow(rng.random((400, 600)))  # noise: the worst case for PNG compression
    data = P.small_png(fig, limit=100_000)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) <= 100_000
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    assert len(P.small_png(fig)) < 100_000


def test_descendants_and_union():
    runs = pd.DataFrame({"run_id": ["cell", "trial", "sub", "subtrial", "other", "sweep"],
                         "parent_run_id": ["sweep", "cell", "cell", "sub", "sweep", None]})
    keep = P._descendants(runs, {"cell"})
    assert list(runs["run_id"][keep]) == ["cell", "trial", "sub", "subtrial"]
    assert P._union_seconds([(0, 10), (5, 15), (20, 30), (21, 22)]) == 25


def test_results_command_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    r = CliRunner().invoke(main, ["results"])
    assert r.exit_code != 0 and "name a suite spec" in r.output
    r = CliRunner().invoke(main, ["results", str(SUITES[0]), "--smoke", "--full"])
    assert r.exit_code != 0 and "one scale at a time" in r.output
    r = CliRunner().invoke(main, ["results", str(SUITES[0]), str(SUITES[1]),
                                  "--experiment", "x"])
    assert r.exit_code != 0 and "exactly one spec" in r.output
    r = CliRunner().invoke(main, ["results", str(REPO / "suites/cdalbench.yaml")])
    assert r.exit_code == 1
    assert "no experiment 'cdalbench'" in r.output
    assert "run `scarcelab sweep" in r.output and "Traceback" not in r.output


def test_transfer_chart_keeps_rows_that_differ_in_arch_protocol_or_fraction_apart():
    # the transfer view's key columns are strings (arch, protocol): the chart melts only
    # the task columns (CI once failed here: "Cannot perform reduction 'mean' with string")
    view = pd.DataFrame({
        "encoder": ["random", "random", "runs:/x/model"],
        "arch": ["small_cnn", "small_cnn", "resnet18"],
        "protocol": ["linear", "finetune", "linear"],
        "label_fraction": [1.0, 0.1, 1.0],
        "encoder_method": [np.nan, np.nan, "simclr"],
        "n_runs": [2, 2, 1],
        "breastmnist accuracy": [0.7, 0.8, np.nan],
        "consep seg/pq": [np.nan, 0.3, 0.4],
    })
    long = P.transfer_long(view)
    assert sorted(long["encoder"].unique()) == [
        "random · small_cnn · finetune · 0.1", "random · small_cnn · linear · 1.0",
        "runs:/x/model · resnet18 · linear · 1.0"]
    assert len(long) == 4 and long["value"].dtype.kind == "f"
    fig = P._bar_figure(long, "encoder", "task", "value", "t", "score")
    plt.close(fig)


def _sweep_store(tmp_path, n_cells):  # type: ignore[no-untyped-def]
    """A sqlite store for the first ``n_cells`` smoke cells of tune_it.yaml, made the
    tracking URI (the caller restores ``prev``): (spec path, spec, client, experiment, prev)."""
    import dataclasses

    import mlflow
    from mlflow.tracking import MlflowClient

    path = REPO / "suites" / "tune_it.yaml"
    spec = load_spec(path, smoke=True)
    spec = dataclasses.replace(spec, cells=spec.cells[:n_cells])
    prev = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'm.db'}")
    c = MlflowClient()
    return path, spec, c, c.create_experiment(spec.experiment), prev


def test_cells_of_a_sweep_still_running_are_counted_as_running_not_failed(tmp_path):
    """A partial page (the sweep still going): a cell whose last attempt is RUNNING is
    'running or queued'; once the sweep has ended the same run counts as failed."""
    import mlflow

    from scarcelab import tags as T

    path, spec, c, exp, prev = _sweep_store(tmp_path, 2)
    sweep = c.create_run(exp, tags={T.SWEEP: spec.name, "scarcelab.role": "sweep"})
    done = c.create_run(exp, tags={T.SWEEP: spec.name, T.CELL: spec.cells[0].id})
    c.set_terminated(done.info.run_id, "FINISHED")
    c.create_run(exp, tags={T.SWEEP: spec.name, T.CELL: spec.cells[1].id})
    try:
        page = P.build_page(path, "smoke", spec=spec)
        assert (page.counts["finished"], page.counts["running"], page.counts["failed"]) == \
            (1, 1, 0)
        assert "1 running or queued" in page.provenance["scale"]
        c.set_terminated(sweep.info.run_id, "FAILED")  # the driver is gone
        page = P.build_page(path, "smoke", spec=spec)
        assert (page.counts["running"], page.counts["failed"]) == (0, 1)
    finally:
        mlflow.set_tracking_uri(prev)


def test_transfer_protocols_become_columns_so_the_paper_claims_can_name_them():
    # the query view keys rows on protocol / label fraction (h/path); the page's table has
    # a row per encoder and a column per dataset x protocol x metric, which the pathology
    # paper file's encoder_beats rules name (CI once failed: "truth value of a Series")
    view = pd.DataFrame({
        "encoder": ["random", "random", "@pretrain", "@pretrain", "random"],
        "arch": ["small_cnn"] * 5,
        "protocol": ["linear (all labels)", "finetune (all labels)", "linear (all labels)",
                     "finetune (all labels)", "finetune"],
        "label_fraction": [1.0, 1.0, 1.0, 1.0, 0.1],
        "encoder_method": [np.nan, np.nan, "simclr", "simclr", np.nan],
        "n_runs": [1, 1, 1, 1, 1],
        "pathology_crops accuracy": [0.5, 0.6, 0.7, 0.8, np.nan],
        "consep_patches seg/pq": [np.nan, np.nan, np.nan, np.nan, 0.2],
    })
    out = P.protocols_as_columns(view)
    assert list(out["encoder"]) == ["random", "@pretrain"] and list(out["n_runs"]) == [3, 2]
    row = out.set_index("encoder")
    assert row.loc["@pretrain", "pathology_crops linear (all labels) accuracy"] == 0.7
    assert row.loc["random", "pathology_crops finetune (all labels) accuracy"] == 0.6
    assert row.loc["random", "consep_patches finetune (label fraction 0.1) seg/pq"] == 0.2
    v = C.evaluate({"kind": "encoder_beats", "better": "@pretrain", "worse": "random",
                    "columns": ["linear (all labels) accuracy",
                                "finetune (all labels) accuracy"]},
                   C.SuiteData(transfer=out))
    # the rule finds both columns (means only here: no per-seed values, so no test)
    assert v.status == C.UNTESTABLE and "means only" in v.reason, v
    assert "pathology_crops finetune (all labels) accuracy: 0.8000 vs 0.6000" in v.reason


def test_probe_runs_of_n_labeled_all_and_a_count_get_the_columns_the_claims_name():
    """What probe runs record: ``n_labeled`` resolved to a count (``all`` -> 1174), the
    ``label_fraction`` tag the share trained on (1, or 147/1174 = 0.1252) and the CLI's
    ``params.label_fraction`` 1 either way. The first reference pathology page named the
    columns "linear (1174 labels)" and "linear (147 labels) (label fraction 0.1252)", so
    the paper file's "linear (all labels) accuracy" / "linear (147 labels) accuracy" rules
    found nothing and the two probe claims were 'not testable'."""
    from scarcelab.tracking.query import Tracked

    rows = []
    for enc, acc in (("random", (0.61, 0.59)), ("runs:/abc/model", (0.66, 0.64))):
        for (n, frac), a in zip((("1174", "1"), ("147", "0.1252")), acc, strict=True):
            rows.append({"run_id": f"{enc}{n}", "status": "FINISHED", "task": "probe",
                         "encoder": enc, "arch": "small_cnn", "protocol": "linear",
                         "dataset": "pathology_crops", "params.n_labeled": n,
                         "params.label_fraction": "1.0", "label_fraction": frac,
                         "metrics.test/accuracy": a, "metrics.test/balanced_accuracy": a})
    t = Tracked(pd.DataFrame(rows), None, ["0"])  # type: ignore[arg-type]
    refs = ['{"encoder": ["@pretrain", "runs:/abc/model"]}']
    out = P.protocols_as_columns(V.transfer_view(t, refs)).set_index("encoder")
    assert out.loc["@pretrain", "pathology_crops linear (all labels) accuracy"] == 0.66
    assert out.loc["random", "pathology_crops linear (147 labels) accuracy"] == 0.59
    claims = {c["id"]: c["rule"] for c in
              yaml.safe_load((REPO / "suites/papers/pathology.yaml").read_text())["claims"]}
    v = C.evaluate(claims["linear_eval"], C.SuiteData(transfer=out.reset_index()))
    # the paper file's columns are found (means only: no test without per-seed values)
    assert v.status == C.UNTESTABLE and "means only" in v.reason, v
    assert "pathology_crops linear (147 labels) accuracy: 0.6400 vs 0.5900" in v.reason


def test_transfer_by_seed_feeds_encoder_beats_a_paired_test():
    """Kang et al.'s linear-evaluation claim on three seeds: the per-seed transfer table
    pairs the pre-trained encoder of seed s with the random one of seed s."""
    from scipy import stats as sps

    from scarcelab.tracking.query import Tracked

    pre, rnd = (0.66, 0.67, 0.665), (0.61, 0.615, 0.62)
    rows = []
    for seed in range(3):
        for enc, acc in (("random", rnd[seed]), (f"runs:/abc{seed}/model", pre[seed])):
            rows.append({"run_id": f"{enc}{seed}", "status": "FINISHED", "task": "probe",
                         "encoder": enc, "arch": "small_cnn", "protocol": "linear",
                         "dataset": "pathology_crops", "seed": seed, "label_fraction": "1",
                         "params.n_labeled": "1174", "params.label_fraction": "1.0",
                         "metrics.test/accuracy": acc})
    t = Tracked(pd.DataFrame(rows), None, ["0"])  # type: ignore[arg-type]
    refs = [f'{{"encoder": ["@pretrain", "runs:/abc{s}/model"]}}' for s in range(3)]
    per_seed = P.transfer_by_seed(t, refs)
    assert len(per_seed) == 6 and set(per_seed["encoder"]) == {"@pretrain", "random"}
    data = C.SuiteData(transfer=P.protocols_as_columns(V.transfer_view(t, refs)),
                       transfer_runs=per_seed)
    v = C.evaluate({"kind": "encoder_beats", "columns": ["linear (all labels) accuracy"]},
                   data)
    assert v.status == C.REPRODUCED, v
    assert f"p = {sps.ttest_rel(pre, rnd).pvalue:.3g}" in v.reason


def test_an_attempt_a_dead_driver_left_counts_until_its_last_record_not_its_takeover(
        tmp_path):
    """The cdalbench page once said 5h19m: the attempts that a killed driver left RUNNING
    were closed by the next driver hours later, and their intervals spanned the dead time.
    Such an attempt now ends at its last nested record (the store's, and on the page for
    stores written before), and a queued one that never started counts nothing."""
    from types import SimpleNamespace

    import mlflow

    from scarcelab import tags as T
    from scarcelab.tracking.sweep.driver import Driver

    path, spec, c, exp, prev = _sweep_store(tmp_path, 3)
    t0 = 1_700_000_000_000
    sweep = c.create_run(exp, start_time=t0, tags={T.SWEEP: spec.name,
                                                   "scarcelab.role": "sweep"})
    cell = {T.SWEEP: spec.name, T.SWEEP_DRIVER: "dead"}
    done = c.create_run(exp, start_time=t0, tags={**cell, T.CELL: spec.cells[0].id})
    c.set_terminated(done.info.run_id, "FINISHED", end_time=t0 + 100_000)
    # the dead driver's running cell: its study ran 300 s, then everything died
    ran = c.create_run(exp, start_time=t0, tags={**cell, T.CELL: spec.cells[1].id})
    study = c.create_run(exp, start_time=t0 + 1_000,
                         tags={"mlflow.parentRunId": ran.info.run_id})
    trial = c.create_run(exp, start_time=t0 + 2_000,
                         tags={"mlflow.parentRunId": study.info.run_id})
    c.set_terminated(trial.info.run_id, "FINISHED", end_time=t0 + 300_000)
    queued = c.create_run(exp, start_time=t0, tags={**cell, T.CELL: spec.cells[2].id})
    try:
        # a store written by the old driver: closed at takeover, 4 hours later
        for r in (ran, queued):
            c.set_tag(r.info.run_id, "scarcelab.error",
                      "the sweep driver dead died while this cell ran; the cell was run "
                      "again by the next sweep run")
            c.set_terminated(r.info.run_id, "FAILED", end_time=t0 + 4 * 3600_000)
        c.set_terminated(sweep.info.run_id, "FAILED", end_time=t0 + 4 * 3600_000)
        page = P.build_page(path, "smoke", spec=spec)
        assert page.wall_s == pytest.approx(300.0)

        # the driver now closes such runs at their last record
        for r in (ran, queued):
            c.delete_tag(r.info.run_id, "scarcelab.error")
            c.update_run(r.info.run_id, status="RUNNING")
        drv = SimpleNamespace(client=c, owner="alive")
        Driver._close_stale(drv, [c.get_run(ran.info.run_id),
                                       c.get_run(queued.info.run_id)])
        assert c.get_run(ran.info.run_id).info.end_time == t0 + 300_000
        assert c.get_run(queued.info.run_id).info.end_time == t0
        assert c.get_run(ran.info.run_id).info.status == "FAILED"
    finally:
        mlflow.set_tracking_uri(prev)


def _index_page(suite: str, wall: float, status: str, scale: str = "reference"):
    from types import SimpleNamespace

    return SimpleNamespace(
        verdicts=[SimpleNamespace(id="claim1", status=status)],
        paper=SimpleNamespace(title=suite.upper()),
        commits=["0123456789abcdef"], counts={"finished": 3, "cells": 4}, wall_s=wall,
        cpu_s=2 * wall, spec=SimpleNamespace(scale=scale))


def test_an_index_row_of_another_scale_says_its_scale(tmp_path):
    """docs/results holds the reference pages and, for CDALBench, its --claims page (issue
    41 item 5): that row says so, the reference rows and the title do not change."""
    text = P.write_index([("a", _index_page("a", 60, "reproduced")),
                          ("b", _index_page("b", 60, "reproduced", "claims"))],
                         tmp_path).read_text()
    rows = {ln.split("|")[1].strip(): ln for ln in text.splitlines() if ln.startswith("| [")}
    assert rows["[b](b.md)"].endswith("| 3/4 finished (claims scale) |")
    assert rows["[a](a.md)"].endswith("| 3/4 finished |")
    assert text.startswith("# Results of the suites (reference scale)")
    # 3 of 4 cells: the verdict is interim, and the row says so (a finished design not)
    assert "claim1: **reproduced** (interim)" in rows["[a](a.md)"]
    done = _index_page("c", 60, "reproduced")
    done.counts = {"finished": 4, "cells": 4}
    row = next(ln for ln in P.write_index([("c", done)], tmp_path).read_text().splitlines()
               if ln.startswith("| [c]"))
    assert "claim1: **reproduced** (" in row and "interim" not in row


def test_an_index_row_keeps_the_dirty_mark_of_its_commits(tmp_path):
    """Two slices run at one commit, one from a modified tree: the page lists
    `c+dirty` and `c`; the index row printed both as `c`, one commit twice."""
    page = _index_page("a", 60, "reproduced")
    page.commits = ["0123456789abcdef+dirty", "0123456789abcdef"]
    row = next(ln for ln in P.write_index([("a", page)], tmp_path).read_text().splitlines()
               if ln.startswith("| [a]"))
    assert "| `0123456789ab+dirty`, `0123456789ab` |" in row


def test_the_index_keeps_the_row_of_a_suite_whose_sweep_this_store_lacks(tmp_path):
    # suites run on different machines into different stores: an index written from a
    # store with only suite b must not lose suite a's row (its page is still there)
    first = P.write_index([("a", _index_page("a", 3600, "reproduced")),
                           ("b", _index_page("b", 60, "not reproduced"))], tmp_path)
    a_row = next(ln for ln in first.read_text().splitlines() if ln.startswith("| [a]"))
    first_when = "2026-01-02 03:04 UTC"  # as if written long ago
    first.write_text(re.sub(r" on \S+ \S+ UTC from", f" on {first_when} from",
                            first.read_text(), count=1))
    assert "| 1h00m |" in a_row
    (tmp_path / "a.md").write_text("# page a\n")  # write_index writes no pages itself
    for _ in range(2):  # carried twice: still one mark, the same numbers
        text = P.write_index([("a", "no reference-scale sweep in the store"),
                              ("b", _index_page("b", 120, "reproduced")),
                              ("c", "no reference-scale sweep in the store")],
                             tmp_path).read_text()
        rows = {ln.split("|")[1].strip(): ln for ln in text.splitlines()
                if ln.startswith("| ") and not ln.startswith("| suite")}
        assert rows[f"[a](a.md) {P.CARRIED}"] == a_row.replace(
            "| [a](a.md) |", f"| [a](a.md) {P.CARRIED} |")
        assert "| 2m00s |" in rows["[b](b.md)"]  # b is rebuilt from its new page
        assert "no reference-scale sweep" in rows["c"]  # no page, no earlier row: said so
        # carried twice, the footnote still dates the row by the index that computed it
        assert f"{P.CARRIED} a: no sweep of it in the tracking store; the row is the one " \
            f"the index of {first_when} gave the page" in text
    # a suite whose page is gone is not carried: the row would link nothing
    (tmp_path / "a.md").unlink()
    text = P.write_index([("a", "no sweep here")], tmp_path).read_text()
    assert "| a | | no sweep here |" in text and P.CARRIED not in text


def test_scale_frame_reads_what_the_studies_and_their_trials_did():
    """Issue 41: an SSL-vs-SSL study ran 1 trial of 42 (FixMatch) to 726 (sup) steps on a
    small CNN. The page's scale frame reads that from the runs (trials' ``epochs`` x their
    last window's ``time/steps``, studies' trial counts, arch, seed) and the claim's
    ``needs`` turns it into 'not testable at this scale' with the shortfalls."""
    runs = pd.DataFrame([
        {"run_id": "s1", "role": "study", "dataset": "breastmnist", "method": "sup",
         "seed": 0, "arch": "small_cnn", "n_trials": "1", "n_failed": "0"},
        {"run_id": "s2", "role": "study", "dataset": "breastmnist", "method": "fixmatch",
         "seed": 0, "arch": "small_cnn", "n_trials": "2", "n_failed": "1"},
        {"run_id": "t1", "role": "trial", "status": "FINISHED", "parent_run_id": "s1",
         "metrics.epochs": 6.0, "metrics.time/steps": 121.0},
        {"run_id": "t2", "role": "trial", "status": "FINISHED", "parent_run_id": "s2",
         "metrics.epochs": 2.0, "metrics.time/steps": 21.0},
        {"run_id": "t3", "role": "trial", "status": "FAILED", "parent_run_id": "s2",
         "metrics.epochs": 9.0, "metrics.time/steps": 99.0},
        # a tune trial that ran to its end has no epochs metric: its planned epochs count
        {"run_id": "s3", "role": "study", "dataset": "cifair10", "method": "ce", "seed": 0,
         "arch": "small_cnn", "n_complete": "5"},
        {"run_id": "t4", "role": "trial", "status": "FINISHED", "parent_run_id": "s3",
         "params.epochs": "12", "pruned": "false"},
        {"run_id": "t5", "role": "trial", "status": "FINISHED", "parent_run_id": "s3",
         "params.epochs": "12", "pruned": "true"},
    ])
    sc = P.scale_frame(runs).set_index("method")
    assert sc.loc["sup", "steps_per_trial"] == 726 and sc.loc["fixmatch", "steps_per_trial"] == 42
    assert (sc.loc["sup", "trials"], sc.loc["fixmatch", "trials"], sc.loc["ce", "trials"]) \
        == (1, 1, 5)
    assert sc.loc["ce", "epochs_per_trial"] == 12 and sc.loc["sup", "network"] == "small_cnn"
    claim = next(c for c in load_paper(REPO / "suites/papers/ssl_vs_ssl.yaml").claims
                 if c.id == "semi_beats_labeled_only")
    short = "; ".join(C.check_scale(claim.needs, C.SuiteData(scale=P.scale_frame(runs))))
    # median of 726, 42 and NaN (ce: no steps recorded) = 384 steps = 1.1 % of 35000
    assert "1.1 % of the paper's steps per trial (median 384 of 35000" in short
    assert "1 of >= 3 completed trials" in short and "1 of >= 3 seeds" in short
    assert "network small_cnn, not the paper's resnet18" in short


def test_page_verdicts_apply_each_claims_needs():
    """_verdicts passes a claim's ``needs``: CDALBench's oracle claim needs 10
    repetitions; on 3 the rule would decide, the page says not testable and why."""
    claim = next(c for c in load_paper(REPO / "suites/papers/cdalbench.yaml").claims
                 if c.id == "oracle_bound")
    al = pd.DataFrame([(ds, 1, s, k, v + 0.01 * k) for ds in ("splice", "usps")
                       for s, v in (("oracle", 0.9), ("margin", 0.8)) for k in range(3)],
                      columns=["dataset", "query_size", "strategy", "repetition", "auc"])
    assert C.evaluate(claim.rule, C.SuiteData(al=al)).status == C.REPRODUCED
    paper = type("Paper", (), {"claims": [claim]})()
    v = P._verdicts(paper, C.SuiteData(al=al))[0]  # type: ignore[arg-type]
    assert v.status == C.UNTESTABLE
    assert "3 of >= 10 repetitions (splice / 1 / margin)" in v.reason
