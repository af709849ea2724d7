"""``tune``: one method on one benchmark dataset under the "Tune It or Don't Use It"
protocol — ASHA search, then the best configuration retrained 10× on train+val."""

from __future__ import annotations

from typing import Any

import click

from scarcelab.entrypoints.cli import main
from scarcelab.entrypoints.options import opt_int
from scarcelab.errors import ScarcelabError


def _batch_sizes(value: str) -> tuple[int, ...] | None:
    if value in ("", "default"):
        return None
    try:
        sizes = tuple(int(v) for v in value.replace(" ", "").split(",") if v)
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}",
                                 param_hint="--batch-sizes") from None
    if not sizes or min(sizes) < 1:
        raise click.BadParameter(f"batch sizes must be >= 1, got {value!r}",
                                 param_hint="--batch-sizes")
    return sizes


@main.command(name="tune", short_help="Tune a method with ASHA, retrain the best 10 times.",
              help="Tune a supervised method with ASHA and retrain the best "
              "configuration 10 times (Brigato et al. 2021), e.g. --method ole "
              "--dataset cifair10.")
@click.option("--method", required=True, help="a supervised method (ce, ole, gradl2, cosine, "
              "cosine_ce, tvmf, harmonic, fconv, dsk, scattering, ...)")
@click.option("--dataset", default="cifair10", show_default=True)
@click.option("--data-dir", default="", help="data root (default $SCARCELAB_DATA)")
@click.option("--arch", default="default", show_default=True,
              help="backbone; default = the dataset's (wrn16_8 / resnet50_imagenet)")
@click.option("--seed", default="0", show_default=True)
@click.option("--epochs", default="default", show_default=True)
@click.option("--grace-period", default="default", show_default=True)
@click.option("--n-trials", default="default", show_default=True)
@click.option("--batch-sizes", default="default", show_default=True,
              help="comma-separated set searched over, e.g. 10,25,50")
@click.option("--n-final", default="10", show_default=True,
              help="retrains of the best configuration on train+val")
@click.option("--phase", default="all", show_default=True,
              type=click.Choice(["all", "search", "final"]),
              help="search and/or final retraining (workers: search; then one: final)")
@click.option("--max-steps-per-epoch", default="default", show_default=True)
@click.option("--budget-minutes", default="0", show_default=True,
              help="wall-clock cap on the search (0 = none)")
@click.option("--device", default="cpu", show_default=True)
@click.option("--set", "overrides", default="", help="fixed hyperparameters, e.g. "
              "'lambda_ole=0.25'")
@click.option("--study-name", default="", help="workers given the same name (and "
              "$OPTUNA_STORAGE) share one ASHA study")
@click.option("--experiment", default="", help="MLflow experiment (ignored under mlflow run)")
def tune_cmd(**kw: Any) -> None:
    import os

    from scarcelab.protocols.search import parse_overrides
    from scarcelab.protocols.tune import TuneConfig, run_tune
    from scarcelab.tracking.mlflow_tracker import MlflowTracker

    try:
        device = kw["device"]
        if device == "auto":
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        cfg = TuneConfig(
            method=kw["method"], dataset=kw["dataset"], data_dir=kw["data_dir"] or None,
            arch=None if kw["arch"] in ("", "default", "auto") else kw["arch"],
            seed=opt_int(kw["seed"], "--seed") or 0,
            epochs=opt_int(kw["epochs"], "--epochs"),
            grace_period=opt_int(kw["grace_period"], "--grace-period"),
            n_trials=opt_int(kw["n_trials"], "--n-trials"),
            batch_sizes=_batch_sizes(kw["batch_sizes"]),
            n_final=opt_int(kw["n_final"], "--n-final") or 0, phase=kw["phase"],
            max_steps_per_epoch=opt_int(kw["max_steps_per_epoch"], "--max-steps-per-epoch"),
            budget_minutes=float(kw["budget_minutes"] or 0), device=device,
            overrides=parse_overrides(kw["overrides"]),
            storage=os.environ.get("OPTUNA_STORAGE") or None,
            study_name=kw["study_name"] or None)
        tracker = MlflowTracker(experiment=kw["experiment"] or None)
        res = run_tune(cfg, tracker)
    except ScarcelabError as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"study {tracker.study_run_id} ({res.study_name}): {res.n_complete} finished, "
               f"{res.n_pruned} pruned by ASHA, {res.n_failed} failed; best {res.best_params} "
               f"(val bacc avg5 {res.best_value:.4f})")
    if res.final_test:
        click.echo(f"final: test balanced accuracy {100 * res.mean:.2f} ± {100 * res.std:.2f} "
                   f"over {len(res.final_test)} retrains")
