"""``tune``: one method on one benchmark dataset under the "Tune It or Don't Use It"
protocol — ASHA search, then the best configuration retrained 10× on train+val."""

from __future__ import annotations

from typing import Any

import click

from scarcelab.entrypoints._accel import ACCEL_ENTRY, accel_from, accel_options
from scarcelab.entrypoints.cli import main
from scarcelab.entrypoints.options import (
    SEED_MAX,
    Device,
    Float,
    Folder,
    Int,
    IntList,
    Overrides,
    Registered,
    RunId,
    Word,
    apply_identity,
    check_dataset,
    check_device,
    check_overrides,
    check_registered,
    data_options,
    dataset_options,
    identity_options,
    verbosity,
    verbosity_options,
)
from scarcelab.errors import ScarcelabError
from scarcelab.tracking.sweep.spec import continues_with

ARCH_DEFAULTS = ("", "default", "auto")


def check_tune(kw: dict[str, Any]) -> dict[str, Any]:
    """The checks that need the core, before any data is read (as ``study.check_study``
    for the study commands): the device exists, the method is a supervised classifier,
    dataset and arch are registered, ``--set`` values fit the method's types. Returns the
    typed overrides. With ``--resume`` the settings come from the study run: only the
    device is checked here."""
    check_device(kw["device"])
    if kw["resume"]:
        from scarcelab.data.own import DataOptions

        given = [f"--{k.replace('_', '-')}" for k in ("image_size", "channels", "fit",
                                                        "skip_bad_files", "test_fraction")
                 if kw.pop(k, None) not in (None, getattr(DataOptions(), k))]
        if given:  # the study's own options are read back from its run (tracking.tune_resume)
            raise click.BadParameter(
                f"{', '.join(given)}: tune --resume rebuilds the study's data with the "
                "dataset options its run recorded; drop "
                f"{'it' if len(given) == 1 else 'them'} (start a new study for other ones)",
                param_hint="'--resume'")
        return {}
    from scarcelab.methods import METHODS
    from scarcelab.models import MODELS

    method_cls = check_registered(METHODS, kw["method"], "'--method'")
    if method_cls.family != "supervised" or method_cls.linear_probe:
        kind = method_cls.family + (" (linear probe)" if method_cls.linear_probe else "")
        raise click.BadParameter(f"{kw['method']!r} is a {kind} method; the tune protocol "
                                 "trains supervised classifiers (scarcelab list methods)",
                                 param_hint="'--method'")
    kw["dataset"] = check_dataset(kw["dataset"])
    kw["data_options"] = data_options(kw, kw["dataset"])
    if kw["arch"] not in ARCH_DEFAULTS:
        check_registered(MODELS, kw["arch"], "'--arch'")
    return check_overrides(kw["overrides"], method_cls)


# A sweep whose tune cell was killed continues that cell's study rather than tuning and
# retraining it all again (hours of a final phase): --resume reads every setting back from
# the study run, so the cell gives only where its data is and what it runs on (and how: the
# precision settings, which a resume checks against the study's).
@continues_with("resume", carry=("data_dir", "device", *ACCEL_ENTRY))
@main.command(name="tune", short_help="Tune a method with ASHA, retrain the best 10 times.",
              help="Tune a supervised method with ASHA and retrain the best "
              "configuration 10 times (Brigato et al. 2021), e.g. --method ole "
              "--dataset cifair10.")
@click.option("--method", default="", type=Registered("method", "supervised", extra=("",)),
              help="a supervised method (ce, ole, gradl2, cosine, "
              "cosine_ce, tvmf, harmonic, fconv, dsk, scattering, ...); required unless "
              "--resume")
# the dataset is checked in check_tune (after the range checks of the other options, which
# tests/tracking/test_tune_resume.py relies on), with the same did-you-mean message
@click.option("--dataset", default="cifair10", show_default=True, type=Word(),
              help="a registered dataset or plugin with a fixed validation split, or your "
              "own images with a val/ set: folder:PATH or csv:FILE (docs/own-images.md)")
@click.option("--data-dir", default="", type=Folder(),
              help="existing data root (default $SCARCELAB_DATA)")
@click.option("--arch", default="default", show_default=True,
              type=Registered("arch", extra=ARCH_DEFAULTS),
              help="backbone; default = the dataset's (wrn16_8 / resnet50_imagenet)")
@click.option("--seed", default="0", show_default=True, type=Int(0, SEED_MAX),
              help="seed of the search; the final retrains use their own seeds from it")
@click.option("--epochs", default="default", show_default=True,
              type=Int(1, None, default_ok=True),
              help="epochs of a search trial at most (ASHA's max_t); default = the "
              "dataset's published count")
@click.option("--epochs-final", default="default", show_default=True,
              type=Int(1, None, default_ok=True),
              help="epochs of each final retraining (gem --epochs-f); default: the "
              "dataset's published count (ImageNet: 500) while --epochs is the published "
              "one, else --epochs")
@click.option("--grace-period", default="default", show_default=True,
              type=Int(1, None, default_ok=True),
              help="epochs every ASHA trial runs before it can be stopped; default = the "
              "dataset's")
@click.option("--n-trials", default="default", show_default=True,
              type=Int(1, None, default_ok=True),
              help="configurations sampled by the search; default = the dataset's")
@click.option("--batch-sizes", default="default", show_default=True, type=IntList(1),
              help="comma-separated set searched over, e.g. 10,25,50")
@click.option("--n-final", default="10", show_default=True, type=Int(1, None),
              help="retrains of the best configuration on train+val")
@click.option("--phase", default="all", show_default=True,
              type=Word(("all", "search", "final")),
              help="search and/or final retraining (workers: search; then one: final)")
@click.option("--max-steps-per-epoch", default="default", show_default=True,
              type=Int(1, None, default_ok=True),
              help="cap on the steps of an epoch; default = no cap")
@click.option("--budget-minutes", default="0", show_default=True, type=Float(0, None),
              help="wall-clock cap on the search (0 = none); the --n-final retrains of "
              "the best configuration run after it, each shown as it finishes")
@click.option("--device", default="auto", show_default=True, type=Device(),
              help="where to train; auto = cuda when available, else cpu")
@click.option("--set", "overrides", default="", type=Overrides(),
              help="fixed hyperparameters, typed like the method's, e.g. 'lambda_ole=0.25'")
@click.option("--study-name", default="", help="workers given the same name (and "
              "$OPTUNA_STORAGE) share one ASHA study")
@click.option("--resume", default="", type=RunId(),
              help="continue this tune study run after a crash: keep its finished trials "
              "and retrains, run the missing ones (same seeds) under it, recompute its "
              "mean ± std; settings come from the run (only --data-dir and --device are "
              "taken from here)")
@click.option("--experiment", default="", help="MLflow experiment (ignored under mlflow run)")
@accel_options
@dataset_options
@identity_options
@verbosity_options
def tune_cmd(**kw: Any) -> None:
    if not kw["method"] and not kw["resume"]:
        raise click.UsageError("give --method (or --resume <study run id>)")
    overrides = check_tune(kw)
    import os

    from scarcelab.entrypoints._progress import Display, ProgressTracker
    from scarcelab.protocols.tune import TuneConfig, run_tune
    from scarcelab.tracking.mlflow_tracker import MlflowTracker
    try:
        device = kw["device"]
        if device == "auto":
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        accel = accel_from(kw)
        if kw["resume"]:
            tracker, res = _resume(kw["resume"], kw["data_dir"], device, accel)
        else:
            cfg = TuneConfig(
                method=kw["method"], dataset=kw["dataset"], data_dir=kw["data_dir"],
                arch=None if kw["arch"] in ARCH_DEFAULTS else kw["arch"],
                seed=kw["seed"], epochs=kw["epochs"], epochs_final=kw["epochs_final"],
                grace_period=kw["grace_period"],
                n_trials=kw["n_trials"], batch_sizes=kw["batch_sizes"],
                n_final=kw["n_final"], phase=kw["phase"],
                max_steps_per_epoch=kw["max_steps_per_epoch"],
                budget_minutes=kw["budget_minutes"], device=device,
                overrides=overrides,
                storage=os.environ.get("OPTUNA_STORAGE") or None,
                study_name=kw["study_name"] or None, accel=accel,
                data_options=kw["data_options"])
            # trial lines (ASHA rung of a pruned one), then one per retrain
            level = verbosity(click.get_current_context(), kw.pop("quiet"), kw.pop("verbose"))
            tracker = ProgressTracker(MlflowTracker(experiment=kw["experiment"] or None),
                                      Display(level), budget_s=cfg.budget_minutes * 60.0
                                      if cfg.budget_minutes > 0 else None, label="tune")
            apply_identity(tracker, kw)
            res = run_tune(cfg, tracker)
    except ScarcelabError as e:
        raise click.ClickException(str(e)) from e
    if kw["resume"] and res.n_complete + res.n_pruned + res.n_failed == 0:
        click.echo(f"study {tracker.study_run_id} ({res.study_name}): final retraining "
                   f"resumed; kept retrains {res.kept}, ran {res.ran}")
        click.echo(f"final: test balanced accuracy {res.mean:.4f} ± {res.std:.4f} "
                   f"over {len(res.final_test)} retrains")
        return
    best = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in sorted(res.best_params.items()))
    click.echo(f"study {tracker.study_run_id} ({res.study_name}): {res.n_complete} finished, "
               f"{res.n_pruned} pruned by ASHA, {res.n_failed} failed; best {best} "
               f"(validation balanced accuracy, mean of the last 5 epochs, "
               f"{res.best_value:.4f})")
    if res.final_test:
        click.echo(f"final: test balanced accuracy {res.mean:.4f} ± {res.std:.4f} "
                   f"over {len(res.final_test)} retrains")


def _resume(run_id: str, data_dir: str | None, device: str, accel: Any = None
            ) -> tuple[Any, Any]:
    """Continue study run ``run_id``: the rest of its search and its final retraining, or
    the retrains its final phase lacks (tracking.tune_resume). ``accel``: this command's
    precision settings; a study recorded under others is refused (RESUME_CHECKED)."""
    import sys

    from scarcelab.protocols.tune import FinalResume, TuneConfig, run_tune
    from scarcelab.tracking.mlflow_tracker import MlflowTracker
    from scarcelab.tracking.tune_resume import close_stale, read_study

    fields, prior, stale = read_study(run_id)
    if data_dir:
        fields["data_dir"] = data_dir
    cfg = TuneConfig(**fields, device=device, **({"accel": accel} if accel else {}))
    if isinstance(prior, FinalResume):
        missing = [i for i in range(cfg.n_final) if i not in prior.done]
        what = (f"the final retraining of study run {run_id} ({cfg.method} on {cfg.dataset}, "
                f"seed {cfg.seed}, best {prior.best_params}): keeping retrains "
                f"{sorted(prior.done)}, running {missing}")
    else:
        what = (f"the search of study run {run_id} ({cfg.method} on {cfg.dataset}, seed "
                f"{cfg.seed}): keeping trials {[t.number for t in prior.trials]}, running "
                f"trials {len(prior.trials)}.. and then the final retraining")
    print(f"[scarcelab] resuming {what}"
          + (f"; closing {len(stale)} stale run(s) as FAILED" if stale else ""),
          file=sys.stderr, flush=True)
    close_stale(stale)
    tracker = MlflowTracker()
    tracker.attach_study(run_id)
    return tracker, run_tune(cfg, tracker, resume=prior)
