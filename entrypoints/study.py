"""``supervised`` / ``semi`` / ``self``: one budgeted study of one method."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from entrypoints.cli import main
from entrypoints.options import bool_option, label_budget, opt_int
from scarcelab.errors import ScarcelabError


def study_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option("--method", required=True, help="registered method (scarcelab list methods)"),
        click.option("--dataset", default="breastmnist", show_default=True),
        click.option("--data-dir", default="", help="folder with <dataset>.npz "
                     "(default: $SCARCELAB_DATA or ~/.cache/scarcelab; downloaded if missing)"),
        click.option("--arch", default="auto", show_default=True,
                     help="backbone; auto = resnet18 on GPU, small_cnn on CPU"),
        click.option("--seed", default="0", show_default=True),
        click.option("--budget-minutes", default="3", show_default=True),
        click.option("--max-epochs", default="200", show_default=True),
        click.option("--patience", default="20", show_default=True),
        click.option("--n-labeled", default="default", show_default=True,
                     help="labeled train size (int), 'all', or the dataset default"),
        click.option("--n-val", default="default", show_default=True,
                     help="validation size; defaults to n_labeled and may not exceed it"),
        click.option("--allow-large-val", default="false", show_default=True),
        click.option("--search", default="random", show_default=True,
                     help="random = budgeted random search; none = literature defaults"),
        click.option("--batch-size", default="default", show_default=True),
        click.option("--unlabeled-batch-size", default="default", show_default=True),
        click.option("--max-steps-per-epoch", default="default", show_default=True),
        click.option("--max-trials", default="0", show_default=True,
                     help="stop after this many trials (0 = until the budget is spent)"),
        click.option("--device", default="auto", show_default=True),
        click.option("--set", "overrides", default="",
                     help="fixed hyperparameters, e.g. 'lambda_u=1,threshold=0.9'"),
        click.option("--experiment", default="", help="MLflow experiment (ignored under "
                     "mlflow run, which chooses it)"),
        click.option("--diag-samples", default="512", show_default=True,
                     help="unlabeled subsample for the per-epoch C-Score diagnostics of "
                     "semi-supervised runs (0 = off)"),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def study_config(family: str, kw: dict[str, Any]) -> Any:
    """The ``StudyConfig`` for parsed ``study_options`` (shared by every study command)."""
    from scarcelab.protocols.search import StudyConfig, parse_overrides

    return StudyConfig(
        method=kw["method"], dataset=kw["dataset"], family=family,
        data_dir=kw["data_dir"] or None, arch=kw["arch"],
        seed=opt_int(kw["seed"], "--seed") or 0,
        budget_minutes=float(kw["budget_minutes"]),
        max_epochs=opt_int(kw["max_epochs"], "--max-epochs") or 200,
        patience=opt_int(kw["patience"], "--patience") or 20,
        n_labeled=label_budget(kw["n_labeled"], "--n-labeled"),
        n_val=label_budget(kw["n_val"], "--n-val"),
        allow_large_val=bool_option(kw["allow_large_val"]), search=kw["search"],
        batch_size=opt_int(kw["batch_size"], "--batch-size"),
        unlabeled_batch_size=opt_int(kw["unlabeled_batch_size"], "--unlabeled-batch-size"),
        max_steps_per_epoch=opt_int(kw["max_steps_per_epoch"], "--max-steps-per-epoch"),
        max_trials=opt_int(kw["max_trials"], "--max-trials") or 0,
        device=kw["device"], overrides=parse_overrides(kw["overrides"]),
        diag_samples=opt_int(kw["diag_samples"], "--diag-samples") or 0,
    )


def _run(family: str, kw: dict[str, Any]) -> None:
    from scarcelab.protocols.search import run_study
    from tracking.mlflow_tracker import MlflowTracker, check_tracking_server

    cfg = study_config(family, kw)
    check_tracking_server()  # a dead server: one clear line now, not a traceback later
    tracker = MlflowTracker(experiment=kw["experiment"] or None)
    res = run_study(cfg, tracker)
    click.echo(
        f"study {tracker.study_run_id}: {res.n_trials} trials ({res.n_failed} failed), best "
        f"val balanced accuracy {res.best_val:.4f} (trial {res.best_trial}), test balanced "
        f"accuracy of that checkpoint {res.best_test.get('balanced_accuracy', float('nan')):.4f}"
    )
    import mlflow

    click.echo(f"tracking URI: {mlflow.get_tracking_uri()}  —  browse with: "
               f"mlflow ui --backend-store-uri {mlflow.get_tracking_uri()}")
    if tracker.spool_left is not None:  # trained, but the record is not complete: say so
        raise ScarcelabError(
            f"the tracking records of study run {tracker.study_run_id} were not all delivered; "
            f"deliver them with `python -m tracking.spool replay {tracker.spool_left}`")


def _family_command(family: str, default_method: str) -> None:
    @main.command(name=family, help=f"Run a budgeted {family} study (e.g. --method "
                  f"{default_method}).")
    @study_options
    def cmd(**kw: Any) -> None:
        try:
            _run(family, kw)
        except ScarcelabError as e:
            raise click.ClickException(str(e)) from e


for _family, _default in (("supervised", "sup"), ("semi", "fixmatch"), ("self", "simclr")):
    _family_command(_family, _default)


