"""``segment``: nuclei instance segmentation with an encoder under test: how well an
encoder's features transfer to a dense pathology task (docs/pathology.md).

    scarcelab segment --dataset consep_patches --encoder random --budget-minutes 5
    mlflow run . -e segment -P encoder=/path/backbone.pt -P cross_test=nuclei_cpm15
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from scarcelab.entrypoints._accel import accel_from, accel_options
from scarcelab.entrypoints.cli import main
from scarcelab.entrypoints.options import (
    SEED_MAX,
    Bool,
    Device,
    Float,
    Folder,
    Int,
    Names,
    Registered,
    Word,
    apply_identity,
    check_device,
    check_registered,
    identity_options,
    verbosity,
    verbosity_options,
)
from scarcelab.errors import ScarcelabError

BIG = 10**6


@main.command(name="segment", short_help="Nuclei instance segmentation with an encoder (PQ, mPQ).",
              help="Train and test a nuclei instance segmenter (PQ, mPQ, "
              "AJI, Dice) on an encoder: random init, a weights file (a backbone state dict, "
              "a scarcelab checkpoint, a torchvision / timm ResNet such as ImageNet "
              "weights), or a scarcelab run (runs:/<id>/model, models:/<name>/<version>); "
              "the encoder fine-tuned or frozen, on all or a fraction of the labels.")
@click.option("--dataset", default="consep_patches", show_default=True,
              type=Registered("segmentation dataset"),
              help="consep_patches | nuclei_cpm15 | consep (the .mat release; needs --data-dir)")
@click.option("--data-dir", default="", type=Folder(),
              help="the dataset's existing folder (default: "
              "$SCARCELAB_DATA/<dataset> or ../shared/data/<dataset>); --cross-test sets "
              "are then read from it too: <data-dir>/<set>, or <set> beside it")
@click.option("--encoder", default="random", show_default=True,
              help="random | a weights file | runs:/<id>/model | models:/<name>/<version>")
@click.option("--arch", default="auto", show_default=True,
              type=Registered("arch", extra=("auto",)),
              help="backbone; auto = the encoder's own (random: resnet18 on GPU, small_cnn "
              "on CPU; a torchvision/timm ResNet file: the arch it loads into whole)")
@click.option("--protocol", default="finetune", show_default=True,
              type=Word(("finetune", "frozen")),
              help="finetune: encoder and decoder trained; frozen: decoder and heads only "
              "(Kang et al.'s linear-evaluation counterpart)")
@click.option("--label-fraction", default="1.0", show_default=True,
              type=Float(0, 1, lo_open=True),
              help="share of the training tiles used (after validation is set aside), e.g. 0.1")
@click.option("--encoder-norm", default="auto", show_default=True,
              help="input normalisation the weights expect: auto (ImageNet's for a "
              "torchvision/timm file) | imagenet | none | m1,m2,m3/s1,s2,s3")
@click.option("--seed", default="0", show_default=True, type=Int(0, SEED_MAX),
              help="seed of the tile draws and training")
@click.option("--budget-minutes", default="5", show_default=True, type=Float(0, None, lo_open=True),
              help="wall clock for training + per-epoch validation; the selected "
              "checkpoint's test (and --cross-test) evaluation and the model logging run "
              "after it, each shown with a time estimate")
@click.option("--max-epochs", default="100", show_default=True, type=Int(1, BIG),
              help="epochs at most; --patience and the budget end training sooner")
@click.option("--patience", default="5", show_default=True, type=Int(1, BIG),
              help="epochs without a better validation PQ before stopping")
@click.option("--steps-per-epoch", default="40", show_default=True, type=Int(1, BIG),
              help="training steps between two validations")
@click.option("--batch-size", default="8", show_default=True, type=Int(1, 4096),
              help="training crops per step")
@click.option("--crop", default="96", show_default=True, type=Int(8, BIG),
              help="training crop (pixels)")
@click.option("--window", default="256", show_default=True, type=Int(8, BIG),
              help="sliding-window size at inference (pixels)")
@click.option("--scale", default="1.0", show_default=True, type=Float(0.1, 4),
              help="resize tiles by this factor first (0.5: CoNSeP's 40x seen at ~20x; "
              "4x less compute)")
@click.option("--lr", default="0.001", show_default=True, type=Float(0, 10, lo_open=True),
              help="learning rate")
@click.option("--types", default="true", show_default=True, type=Bool(),
              help="train a nucleus-type head (mPQ) when the dataset has types")
@click.option("--aggregation", default="image", show_default=True,
              type=Word(("image", "pooled")),
              help="which validation PQ selects the checkpoint: image (mean over tiles, "
              "HoVer-Net's, the headline seg/pq) or pooled (seg/pq_pooled); both are logged")
@click.option("--tune-threshold", default="false", show_default=True, type=Bool(),
              help="choose the watershed marker threshold on validation instead of "
              "HoVer-Net's 0.4")
@click.option("--cross-test", default="", type=Names(allow_empty=True, unique=True),
              help="comma-separated test-only datasets, e.g. nuclei_cpm15 (checked, and "
              "read, before training)")
@click.option("--max-val-tiles", default="32", show_default=True,
              type=Int(1, None, default_ok=True),
              help="validation tiles drawn (validation runs every epoch: kept cheap); "
              "default = all")
@click.option("--max-train-tiles", default="default", show_default=True,
              type=Int(1, None, default_ok=True),
              help="training tiles drawn; default = all (a cap is for quick tries)")
@click.option("--max-test-tiles", default="default", show_default=True,
              type=Int(1, None, default_ok=True),
              help="test tiles scored; default = all (a cap is for quick tries)")
@click.option("--device", default="auto", show_default=True, type=Device(),
              help="where to train; auto = cuda when available, else cpu")
@click.option("--experiment", default="", help="MLflow experiment (ignored under mlflow run)")
@accel_options
@identity_options
@verbosity_options
def segment(**kw: Any) -> None:
    from scarcelab.data.nuclei import SEG_DATASETS

    # every dataset name before any work: a bad --cross-test used to fail after training
    check_registered(SEG_DATASETS, kw["dataset"], "'--dataset'")
    for name in kw["cross_test"]:
        check_registered(SEG_DATASETS, name, "'--cross-test'")
    check_device(kw["device"])
    from scarcelab.entrypoints._progress import Display, ProgressTracker
    from scarcelab.protocols.segment import SegmentConfig, run_segment
    from scarcelab.tracking.mlflow_tracker import MlflowTracker

    level = verbosity(click.get_current_context(), kw.pop("quiet"), kw.pop("verbose"))

    cfg = SegmentConfig(
        dataset=kw["dataset"], data_dir=kw["data_dir"] or None, encoder=kw["encoder"],
        arch=kw["arch"], protocol=kw["protocol"], label_fraction=kw["label_fraction"],
        encoder_norm=kw["encoder_norm"], seed=kw["seed"], budget_minutes=kw["budget_minutes"],
        max_epochs=kw["max_epochs"], patience=kw["patience"],
        steps_per_epoch=kw["steps_per_epoch"], batch_size=kw["batch_size"], crop=kw["crop"],
        window=kw["window"], scale=kw["scale"], lr=kw["lr"], types=kw["types"],
        aggregation=kw["aggregation"], tune_threshold=kw["tune_threshold"],
        cross_test=tuple(kw["cross_test"]),
        max_val_tiles=kw["max_val_tiles"], max_train_tiles=kw["max_train_tiles"],
        max_test_tiles=kw["max_test_tiles"], device=kw["device"], accel=accel_from(kw))
    tracker = ProgressTracker(MlflowTracker(experiment=kw["experiment"] or None),
                              Display(level), budget_s=cfg.budget_minutes * 60.0,
                              label="segment")
    apply_identity(tracker, kw)
    factory: Callable[[str | None], Any] | None = None
    if cfg.encoder.startswith(("runs:/", "models:/")):
        from scarcelab.tracking.encoders import resolve_encoder

        def from_run(arch: str | None) -> Any:  # the same resolver as `probe`: no unpickling
            return resolve_encoder(cfg.encoder, arch, 3, seed=cfg.seed, norm=cfg.encoder_norm)

        factory = from_run
    try:
        res = run_segment(cfg, tracker, backbone_factory=factory)
    except ScarcelabError as e:
        raise click.ClickException(str(e)) from e
    t = res.test
    msg = (f"segment {tracker.study_run_id}: epoch {res.best_epoch} selected (of "
           f"{res.epochs}); test PQ {t['pq']:.4f} (DQ {t['dq']:.4f}, SQ {t['sq']:.4f})")
    if "mpq" in t:
        msg += f", mPQ {t['mpq']:.4f}"
    msg += (f", AJI {t['aji']:.4f}, Dice {t['dice']:.4f} (per image; pooled PQ "
            f"{t['pq_pooled']:.4f}")
    msg += f", CoNIC mPQ {t['mpq_conic']:.4f})" if "mpq_conic" in t else ")"
    msg += f" [{cfg.protocol}, label fraction {cfg.label_fraction:g}]"
    for name, r in res.cross.items():  # and which files the numbers come from
        msg += f"; {name} PQ {r['pq']:.4f} (read from {res.cross_sources.get(name, '?')})"
    click.echo(msg)
