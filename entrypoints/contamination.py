"""``contamination``: one child study per (OOD source, ratio) under one parent run.

    mlflow run . -e contamination -P method=fixmatch -P dataset=pneumoniamnist \\
        -P ood=mnist -P ratios=0,0.1,0.3,0.5

The parent is the run MLflow Projects created (``MLFLOW_RUN_ID``), or a new one when run
as ``scarcelab contamination``. Children are ordinary study runs (with their trials nested
below them) tagged ``scarcelab.ood`` / ``scarcelab.ratio`` and linked to the parent by
``mlflow.parentRunId``. The parent is never the *active* fluent run, so the unchanged
study tracker can open each child as a top-level fluent run. When the sweep ends, the
parent gets the Table A1 view (``contamination_table.{csv,md}``) and the diagnostics-vs-r
plot.

A killed sweep continues when the same command runs again with shared Optuna storage
(``OPTUNA_STORAGE``), as a killed study does: the parent run of that command (tag
``scarcelab.sweep_key``, a hash of every setting of the sweep) whose owner process is dead
is reattached — under ``mlflow run`` the new run takes its children over and the old one is
closed FAILED with ``scarcelab.resumed_by`` — its finished children are kept, not run
again, and the child that was running resumes its own study record.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from scarcelab import tags as T
from scarcelab.entrypoints.cli import main
from scarcelab.entrypoints.options import (
    WHAT,
    Folder,
    GroupedCommand,
    Names,
    Ratios,
    apply_identity,
    command_entry_map,
    entry_params,
    merge_params,
    option,
    param_str,
    verbosity,
)
from scarcelab.entrypoints.study import study_config, study_options
from scarcelab.errors import ScarcelabError
from scarcelab.tracker import DatasetInfo, DelegatingTracker, Tracker

if TYPE_CHECKING:
    from scarcelab.protocols.contamination import FinishedChild
    from scarcelab.protocols.search import StudyConfig


class ChildStudyTracker(DelegatingTracker):
    """A study tracker whose run is linked to the sweep's parent run (``inner``: an
    :class:`~scarcelab.tracking.mlflow_tracker.MlflowTracker` unless given); everything
    else goes through unchanged."""

    def __init__(self, parent_run_id: str, inner: Tracker | None = None) -> None:
        if inner is None:
            from scarcelab.tracking.mlflow_tracker import MlflowTracker

            inner = MlflowTracker()
        super().__init__(inner)
        self.parent_run_id = parent_run_id

    def start_study(self, name: str, tags: dict[str, str], params: dict[str, Any],
                    artifacts: dict[str, Any], dataset: DatasetInfo | None = None) -> None:
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

        self.inner.start_study(name, {**tags, MLFLOW_PARENT_RUN_ID: self.parent_run_id},
                               params, artifacts, dataset)


def sweep_key(cfg: StudyConfig, sources: list[str], ratios: list[float], tuning: str,
              ood_dir: str | None) -> str:
    """Identifies "the same sweep command": every setting that changes what it runs (the
    rule of a study's key, ``protocols.search._study_key``)."""
    d = {k: v for k, v in dataclasses.asdict(cfg).items()
         if k not in ("storage", "study_name", "fresh_study", "device")}
    if cfg.accel.is_auto:  # settings added later, at their default: the key stays as it was
        d.pop("accel")
    blob = json.dumps({**d, "ood": sources, "ratios": ratios, "tuning": tuning,
                       "ood_dir": ood_dir}, sort_keys=True, default=str)
    return "sweep-" + hashlib.sha256(blob.encode()).hexdigest()[:16]




def _parent_name(client: Any, run_id: str, name: str) -> dict[str, str]:
    """``mlflow.runName`` for a sweep run MLflow named at random (under ``mlflow run``)."""
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

    from scarcelab.tracking.mlflow_tracker import _generated_name

    return {MLFLOW_RUN_NAME: name} if _generated_name(
        client.get_run(run_id).info.run_name) else {}


def _experiment_id(client: Any, parent_id: str | None, experiment: str | None) -> str:
    """The sweep's experiment: the one ``mlflow run`` created the parent in, else the
    named one, else MLflow's current default (so children land beside their parent)."""
    import mlflow

    if parent_id:
        return client.get_run(parent_id).info.experiment_id
    from scarcelab.tracking.experiment_kind import mark_classic

    if experiment:
        exp_id = mlflow.set_experiment(experiment).experiment_id
    else:
        from mlflow.tracking.fluent import _get_experiment_id

        exp_id = _get_experiment_id() or "0"
    mark_classic(client, exp_id)  # MLflow 3's UI opens it on the runs, not GenAI
    return exp_id


def _take_over(client: Any, exp_id: str, killed: str, parent_id: str) -> None:
    """Under ``mlflow run`` the new run continues a killed sweep: its children move under
    the new run, and the old run is closed FAILED with links both ways, so the sweep's
    history stays one tree and no RUNNING orphan is left behind."""
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

    for c in client.search_runs([exp_id], f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{killed}'",
                                max_results=5000):
        client.set_tag(c.info.run_id, MLFLOW_PARENT_RUN_ID, parent_id)
    client.set_tag(killed, T.RESUMED_BY, parent_id)
    client.set_tag(parent_id, T.RESUMED_FROM, killed)
    client.set_terminated(killed, "FAILED")


def _open_parent(client: Any, cfg: StudyConfig, exp_id: str, key: str,
                 parent_id: str | None, name: str) -> tuple[str, dict[str, FinishedChild]]:
    """The parent run and the children already finished: a killed run of this very sweep
    is continued (only with shared storage, as a study is), else a new run is created
    unless ``mlflow run`` gave one."""
    from scarcelab.tracking.contamination import finished_children, killed_sweep

    killed = killed_sweep(client, exp_id, key) if cfg.storage else None
    if killed and not parent_id:
        parent_id = killed
    elif not parent_id:
        new_id: str = client.create_run(exp_id, run_name=name).info.run_id
        parent_id = new_id
    done: dict[str, FinishedChild] = {}
    if killed:
        done = finished_children(client, killed)
        click.echo(f"[scarcelab] resuming contamination sweep run {killed} (its process "
                   f"died): {len(done)} finished child studies kept", err=True)
        if killed != parent_id:
            _take_over(client, exp_id, killed, parent_id)
    return parent_id, done


def _log_parent(client: Any, ctx: click.Context, parent_id: str, cfg: StudyConfig,
                kw: dict[str, Any], sources: list[str], ratios: list[float], key: str,
                ident: dict[str, Any], name: str) -> None:
    """Parameters and tags of the parent: the same names and values whether ``mlflow
    run`` logged the entry parameters or not, and never a parameter logged twice (a
    resumed parent has them already; MLflow rejects a changed value)."""
    from mlflow.entities import Param, RunTag
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

    from scarcelab.tracking.mlflow_tracker import OWNER

    existing = client.get_run(parent_id).data.params
    params = {"method": cfg.method, "dataset": cfg.dataset, "ood": ",".join(sources),
              "ratios": ",".join(f"{r:g}" for r in ratios), "seed": cfg.seed,
              "budget_minutes": cfg.budget_minutes, "arch": cfg.resolved_arch(),
              "diag_samples": cfg.diag_samples, "ood_dir": kw["ood_dir"],
              "tuning": kw["tuning"], "search": cfg.search, "hparams_from": cfg.hparams_source}
    merged = merge_params(existing or entry_params(ctx, CONTAMINATION_ENTRY), params)
    client.log_batch(parent_id, params=[Param(k, param_str(v)) for k, v in merged.items()
                                        if k not in existing],
                     tags=[RunTag(k, v) for k, v in {
                         T.ROLE: "contamination", T.FAMILY: "semi",
                         T.METHOD: cfg.method, T.DATASET: cfg.dataset,
                         T.OOD: ",".join(sources), T.SEED: str(cfg.seed),
                         T.RATIOS: params["ratios"], T.SWEEP_KEY: key,
                         T.OWNER: OWNER, **ident["tags"],
                         **_parent_name(client, parent_id, name),
                         **({MLFLOW_RUN_NOTE: ident["description"]}
                            if ident["description"] else {})}.items()])


class _Children:
    """The protocol's two callbacks for one sweep: a tracker for each child study to run,
    and the kept record of a child finished before the sweep was killed. They share one
    counter so the progress lines number every child of the sweep, kept or run."""

    def __init__(self, cfg: StudyConfig, parent_id: str, display: Any, user_tags: Any,
                 done: dict[str, FinishedChild], n_children: int, tuned: bool) -> None:
        self.cfg, self.parent_id, self.display = cfg, parent_id, display
        self.user_tags, self.done = user_tags, done
        self.n_children, self.tuned = n_children, tuned
        self.count = 0

    def child(self, s: str, r: float) -> Any:
        """A progress-reporting tracker linked to the parent; with ``tuning=once`` and a
        search, the first child is the tuning study at r=0."""
        from scarcelab.entrypoints._progress import ProgressTracker

        self.count += 1
        what = "tuning study (r=0)" if self.tuned and self.count == 1 else f"{s} r={r:g}"
        label = f"child {self.count}/{self.n_children}: {what}"
        self.display.line(label)
        tracker = ProgressTracker(ChildStudyTracker(self.parent_id), self.display,
                                  budget_s=self.cfg.budget_minutes * 60.0, label=label)
        apply_identity(tracker, {"tags": self.user_tags})  # children: the user's tags too
        return tracker

    def finished(self, point: str) -> FinishedChild | None:
        kept = self.done.get(point)
        if kept is not None:
            self.count += 1
            self.display.line(f"child {self.count}/{self.n_children}: {point}: finished "
                              f"before the sweep was killed (run {kept.run_id}), kept")
        return kept


def _sweep(client: Any, parent_id: str, cfg: StudyConfig, sources: list[str],
           ratios: list[float], kw: dict[str, Any], children: _Children) -> tuple[Any, Any]:
    """Runs the children, then logs the Table A1 view and the plot on the parent; the
    parent is closed FINISHED only if all of that succeeded, FAILED otherwise."""
    from scarcelab.protocols.contamination import run_contamination
    from scarcelab.tracking.contamination import contamination_table, plot_vs_ratio, to_markdown

    status = "FAILED"
    try:
        points = run_contamination(cfg, sources, ratios, children.child,
                                   ood_dir=kw["ood_dir"], tuning=kw["tuning"],
                                   finished=children.finished if children.done else None)
        table = contamination_table(parent_run_id=parent_id)
        with tempfile.TemporaryDirectory() as tmp:
            table.to_csv(Path(tmp) / "contamination_table.csv", index=False)
            (Path(tmp) / "contamination_table.md").write_text(to_markdown(table) + "\n")
            plot_vs_ratio(table, Path(tmp) / "diagnostics_vs_ratio.png")
            client.log_artifacts(parent_id, tmp)
        status = "FINISHED"
    finally:
        client.set_terminated(parent_id, status)
    return points, table


def _report(points: list[Any], table: Any, parent_id: str, cfg: StudyConfig,
            t0: float) -> None:
    """One line per point, Table A1, and the closing block naming the parent run."""
    from scarcelab.entrypoints._progress import summary_lines
    from scarcelab.tracking.contamination import to_markdown

    for p in points:
        click.echo(f"{p.source} r={p.ratio:g}: best val {p.result.best_val:.4f}, test "
                   f"{p.result.best_test.get('balanced_accuracy', float('nan')):.4f} "
                   f"(n_ood={p.contamination.get('n_ood')})")
    click.echo(to_markdown(table))

    class _Parent:
        study_run_id = parent_id

    click.echo("\n".join(summary_lines(_Parent(), "parent", time.time() - t0, [
        f"contamination sweep {cfg.method} on {cfg.dataset}: {len(points)} child studies"])))


def _run(kw: dict[str, Any], ctx: click.Context) -> None:
    level = verbosity(ctx, kw.pop("quiet"), kw.pop("verbose"))
    ident = {k: kw.pop(k) for k in ("run_name", "tags", "description")}
    t0 = time.time()
    cfg = study_config("semi", kw)
    sources: list[str] = kw["ood"]
    ratios = list(dict.fromkeys(kw["ratios"]))  # order kept, duplicates dropped
    import mlflow
    from mlflow.tracking import MlflowClient

    from scarcelab.data import provenance
    from scarcelab.entrypoints._progress import Display
    from scarcelab.protocols.search import check_data

    check_data(cfg)  # data, split, an empty ID pool: refused before the parent run exists
    from scarcelab.data.ood import SourceContext, check_sources

    # every OOD file read now: a corrupt one is refused before the tuning study runs
    check_sources(sources, SourceContext(data_dir=cfg.data_dir, ood_dir=kw["ood_dir"],
                                         id_dataset=cfg.dataset))
    provenance.reset()  # each child records its own files when it loads them
    from scarcelab.tracking.mlflow_tracker import check_tracking_server

    check_tracking_server()  # the store: one line now, before the parent run exists
    from scarcelab.tracking.store_check import open_store

    open_store()  # a new sqlite file's tables, under a lock, before the first client
    client = MlflowClient()
    key = sweep_key(cfg, sources, ratios, kw["tuning"], kw["ood_dir"])
    parent_id = os.environ.pop("MLFLOW_RUN_ID", None)
    exp_id = _experiment_id(client, parent_id, kw["experiment"])
    from scarcelab.data.own import dataset_label

    name = ident["run_name"] or f"contamination-{cfg.method}-{dataset_label(cfg.dataset)}"
    parent_id, done = _open_parent(client, cfg, exp_id, key, parent_id, name)
    mlflow.set_experiment(experiment_id=exp_id)
    _log_parent(client, ctx, parent_id, cfg, kw, sources, ratios, key, ident, name)
    display = Display(level)
    # tuning=once with a search: a tuning study at r=0 runs first (its tracker comes from
    # the same factory), then one child per point
    tuned = kw["tuning"] == "once" and cfg.search == "random" and cfg.hparams is None
    n_children = (0.0 in ratios) + len(sources) * len([r for r in ratios if r > 0]) + tuned
    children = _Children(cfg, parent_id, display, ident["tags"], done, n_children, tuned)
    points, table = _sweep(client, parent_id, cfg, sources, ratios, kw, children)
    _report(points, table, parent_id, cfg, t0)


@main.command(name="contamination", cls=GroupedCommand,
              short_help="Sweep OOD contamination ratios of the unlabeled pool.",
              help="Sweep OOD contamination ratios of the unlabeled pool for a "
              "semi-supervised method; one child study per (source, ratio).")
@study_options(dataset="pneumoniamnist", family="semi")
@option("--ood", group=WHAT, default="mnist", show_default=True, type=Names(),
              help="OOD source(s), comma-separated: mnist, digits, textures, lfw, cifar10, "
              "gaussian (far) or another MedMNIST set, e.g. breastmnist (near)")
@option("--ratios", group=WHAT, default="0,0.1,0.3,0.5", show_default=True, type=Ratios(),
              help="OOD fractions r of the contaminated pool: n_ood = round(r/(1-r)·n_id)")
@option("--ood-dir", group=WHAT, default="default", show_default=True, type=Folder(data_root=False),
              help="folder laid out like ../shared/data (ood/…, cifar10_jpg/…); default: "
              "next to the data root")
@option("--tuning", group=WHAT, default="once", show_default=True,
              type=click.Choice(["once", "per_ratio"]),
              help="once = tune at r=0 (a tuning study), then every ratio trains that "
              "configuration with the same seeds; per_ratio = a search at every ratio")
@click.pass_context
def contamination(ctx: click.Context, **kw: Any) -> None:
    try:
        _run(kw, ctx)
    except ScarcelabError as e:
        raise click.ClickException(str(e)) from e


#: MLproject parameter name -> click parameter name, from the options' declarations
#: (tests/entrypoints/test_cli.py checks MLproject)
CONTAMINATION_ENTRY = command_entry_map(contamination.params)
