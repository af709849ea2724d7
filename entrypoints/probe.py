"""``probe``: transfer evaluation of an encoder — linear probe or fine-tuning
(``scarcelab.protocols.transfer``; the study recipe is in docs/pathology.md)."""

from __future__ import annotations

from typing import Any

import click

from scarcelab.entrypoints._accel import accel_from, accel_options
from scarcelab.entrypoints.cli import main
from scarcelab.entrypoints.options import (
    SEED_MAX,
    DatasetName,
    Device,
    Float,
    Folder,
    Int,
    Registered,
    apply_identity,
    data_options,
    dataset_options,
    identity_options,
    label_budget,
    opt_int,
    verbosity,
    verbosity_options,
)
from scarcelab.errors import ScarcelabError


@main.command(name="probe", help="Linear-probe or fine-tune an encoder on a labeled dataset.")
@click.option("--encoder", default="random", show_default=True,
              help="random | a weights file | runs:/<id>/model | runs:/<id>/checkpoints/"
              "best.pt | models:/<name>/<version>")
@click.option("--protocol", default="linear", show_default=True,
              type=click.Choice(["linear", "finetune"]),
              help="linear: a logistic-regression probe on frozen features; finetune: the "
              "encoder trained with a new head")
@click.option("--dataset", default="pathology_crops", show_default=True, type=DatasetName(),
              help="a registered dataset or plugin, or your own images: folder:PATH or "
              "csv:FILE (docs/own-images.md)")
@click.option("--data-dir", default="", type=Folder(),
              help="existing data root (default: $SCARCELAB_DATA or ~/.cache/scarcelab)")
@click.option("--arch", default="auto", show_default=True,
              type=Registered("arch", extra=("auto",)),
              help="auto = the encoder's own (random: resnet18 on GPU, small_cnn on CPU)")
@click.option("--seed", default="0", show_default=True, type=Int(0, SEED_MAX),
              help="seed of the split and training")
@click.option("--n-labeled", default="all", show_default=True,
              help="labeled train size; all = the train split minus validation")
@click.option("--n-val", default="default", show_default=True,
              help="validation size drawn from train (default 20 % of it)")
@click.option("--label-fraction", default="1.0", show_default=True,
              type=Float(0, 1, lo_open=True),
              help="share of the labeled set trained on (validation unchanged), e.g. 0.1; "
              "both protocols")
@click.option("--encoder-norm", default="auto", show_default=True,
              help="input normalisation the weights expect: auto (ImageNet's for a "
              "torchvision/timm file) | imagenet | none | m1,m2,m3/s1,s2,s3")
@click.option("--probe-trials", default="10", show_default=True, type=Int(1, 10**4),
              help="linear: random draws of the L2 penalty, best on validation")
@click.option("--method", default="sup", show_default=True,
              type=Registered("method", "supervised"), help="finetune: supervised method")
@click.option("--budget-minutes", default="3", show_default=True,
              type=Float(0.0, 7 * 24 * 60, lo_open=True), help="finetune search budget")
@click.option("--max-epochs", default="200", show_default=True, type=Int(1, 10**6),
              help="finetune: epochs of a trial at most")
@click.option("--patience", default="20", show_default=True, type=Int(1, 10**6),
              help="finetune: epochs without a better validation score before a trial "
              "stops")
@click.option("--batch-size", default="default", show_default=True,
              type=Int(1, 10**6, default_ok=True),
              help="finetune: labeled images per step; default = the method's own")
@click.option("--max-steps-per-epoch", default="default", show_default=True,
              type=Int(1, None, default_ok=True),
              help="finetune: cap on the steps of an epoch; default = no cap")
@click.option("--max-trials", default="0", show_default=True, type=Int(0, None),
              help="finetune: stop after this many trials (0 = until the budget is spent)")
@click.option("--device", default="auto", show_default=True, type=Device(),
              help="where to train; auto = cuda when available, else cpu")
@click.option("--set", "overrides", default="", help="finetune: fixed hyperparameters")
@click.option("--experiment", default="", help="MLflow experiment (ignored under mlflow run)")
@accel_options
@dataset_options
@identity_options
@verbosity_options
def probe_cmd(**kw: Any) -> None:
    try:
        _run(kw)
    except ScarcelabError as e:
        raise click.ClickException(str(e)) from e


def _run(kw: dict[str, Any]) -> None:
    import mlflow

    from scarcelab.active.encoded import DiskEncodingCache
    from scarcelab.data import load_raw
    from scarcelab.data.download import cache_root
    from scarcelab.entrypoints.options import check_device
    from scarcelab.protocols.search import parse_overrides
    from scarcelab.protocols.transfer import ProbeConfig, run_finetune, run_linear
    from scarcelab.tracking.encoders import resolve_encoder
    from scarcelab.tracking.encoding_cache import MlflowEncodingCache
    from scarcelab.tracking.mlflow_tracker import MlflowTracker
    from scarcelab.tracking.transfer import log_probe_outcome

    check_device(kw["device"])
    opts = data_options(kw, kw["dataset"])
    cfg = ProbeConfig(
        dataset=kw["dataset"], encoder=kw["encoder"], protocol=kw["protocol"],
        data_dir=kw["data_dir"] or None, arch=kw["arch"], seed=opt_int(kw["seed"], "--seed") or 0,
        n_labeled=label_budget(kw["n_labeled"], "--n-labeled") or "all",
        n_val=label_budget(kw["n_val"], "--n-val"),
        label_fraction=kw["label_fraction"], encoder_norm=kw["encoder_norm"],
        probe_trials=kw["probe_trials"],
        method=kw["method"], budget_minutes=float(kw["budget_minutes"]),
        max_epochs=opt_int(kw["max_epochs"], "--max-epochs") or 200,
        patience=opt_int(kw["patience"], "--patience") or 20,
        batch_size=opt_int(kw["batch_size"], "--batch-size"),
        max_steps_per_epoch=opt_int(kw["max_steps_per_epoch"], "--max-steps-per-epoch"),
        max_trials=opt_int(kw["max_trials"], "--max-trials") or 0, device=kw["device"],
        overrides=parse_overrides(kw["overrides"]), accel=accel_from(kw), data_options=opts)
    cfg.validate()
    raw = load_raw(cfg.dataset, cfg.data_dir, cfg.data_options)
    arch: str | None = None if cfg.arch == "auto" else cfg.arch
    if arch is None and cfg.encoder == "random":
        arch = "resnet18" if cfg.resolved_device().startswith("cuda") else "small_cnn"
    backbone, info = resolve_encoder(cfg.encoder, arch, raw.channels, seed=cfg.seed,
                                     norm=cfg.encoder_norm)
    from scarcelab.entrypoints._progress import Display, ProgressTracker

    level = verbosity(click.get_current_context(), kw.pop("quiet"), kw.pop("verbose"))
    # finetune: trial lines and a bar over the search's budget; linear (no budget): a line
    # per phase (encoding, probe fit, model logging)
    tracker = ProgressTracker(MlflowTracker(experiment=kw["experiment"] or None),
                              Display(level), label="probe",
                              budget_s=cfg.budget_minutes * 60.0
                              if cfg.protocol == "finetune" else None)
    apply_identity(tracker, kw)
    if cfg.protocol == "linear":
        cache = MlflowEncodingCache(DiskEncodingCache(cache_root() / "encoded"),
                                    kw["experiment"] or None)
        res = run_linear(cfg, backbone, info, tracker, cache)
    else:
        res = run_finetune(cfg, backbone, info, tracker)
    assert tracker.study_run_id is not None
    log_probe_outcome(tracker.study_run_id, res, cfg.encoder)
    click.echo(f"probe {res.protocol} run {tracker.study_run_id}: encoder {cfg.encoder} "
               f"({info.get('arch')}, {info.get('format')}) on {cfg.dataset}, label "
               f"fraction {cfg.label_fraction:g}: val balanced "
               f"accuracy {res.val_balanced_accuracy:.4f}, test accuracy "
               f"{res.test['accuracy']:.4f}, test balanced accuracy "
               f"{res.test['balanced_accuracy']:.4f} ({res.info.get('time_s', 0):.1f} s)")
    from scarcelab.redaction import redact

    click.echo(f"tracking URI: {redact(mlflow.get_tracking_uri())}")
