"""``al``: one active-learning sweep (strategy x dataset x query size, all repetitions), and
``al-report``: ranks and a critical-difference diagram over the tracked sweeps."""

from __future__ import annotations

import time
from typing import Any, cast

import click

from scarcelab.entrypoints._accel import ACCEL_ENTRY, accel_from, accel_options
from scarcelab.entrypoints.cli import main
from scarcelab.entrypoints.options import (
    DATASET_ENTRY,
    IDENTITY_ENTRY,
    SEED_MAX,
    DatasetName,
    Device,
    Float,
    Folder,
    Int,
    Overrides,
    Registered,
    Word,
    apply_identity,
    check_device,
    check_fields,
    data_options,
    dataset_options,
    entry_params,
    identity_options,
    verbosity,
    verbosity_options,
)

#: MLproject parameter name -> click parameter name (tests/entrypoints/test_cli.py checks
#: MLproject).
AL_ENTRY = {n: n for n in (
    "strategy", "dataset", "data_dir", "query_size", "budget", "seed_set", "repetitions",
    "seed_strategy", "seed_data", "seed_model", "max_candidates", "device", "encoder",
    "early_stop_on")} | {
    "set": "overrides", **IDENTITY_ENTRY, **ACCEL_ENTRY, **DATASET_ENTRY}


#: ``--encoder``'s default (and MLproject's): given on every ``mlflow run -e al``, so it
#: is the one value a set that is not encoded lets through
ENCODER_DEFAULT = "simclr"


def _hidden(v: Any) -> tuple[int, ...]:
    """``24x12`` -> (24, 12); ``none``/empty -> () (a linear classifier)."""
    text = str(v).strip()
    if text in ("", "none", "()"):
        return ()
    if isinstance(v, list):
        parts = [str(p) for p in v]
    else:
        parts = [p for p in text.split("x") if p]
    width = Int(1, 1_000_000)  # without default_ok, parse never gives None
    widths = tuple(cast(int, width.parse(p)) for p in parts)
    if not widths:
        raise ValueError("expected layer widths like 24x12, or none")
    return widths


def _parse_set(over: dict[str, Any], dataset: str
               ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``budget=100,fitting=scratch,hidden=24x12,strategy.tau=5,encoder.epochs=50`` ->
    (config, strategy, encoder); config values typed like the dataset's ALConfig."""
    from scarcelab.active.datasets import dataset_config

    cfg: dict[str, Any] = {}
    strat: dict[str, Any] = {}
    enc: dict[str, Any] = {}
    for k, v in over.items():
        if k.startswith("strategy."):
            strat[k.split(".", 1)[1]] = v
        elif k.startswith("encoder."):
            enc[k.split(".", 1)[1]] = v
        else:
            cfg[k] = v
    positive = {k: (lambda v: Int(1, None).parse(str(v))) for k in
                ("budget", "seed_per_class", "batch_size", "max_epochs", "patience")}
    cfg = check_fields(cfg, dataset_config(dataset), "'--set'", {
        "hidden": _hidden, **positive,
        "val_fraction": lambda v: Float(0.0, 0.9, lo_open=True).parse(str(v)),
        "lr": lambda v: Float(0.0, None, lo_open=True).parse(str(v)),
        "dropout": lambda v: Float(0.0, 0.99).parse(str(v)),
        "fitting": lambda v: Word(("scratch", "finetune")).parse(str(v)),
        "stop_on": lambda v: Word(("val", "test")).parse(str(v))})
    return cfg, strat, enc


@main.command(name="al", short_help="Run one active-learning sweep (CDALBench protocol).")
@click.option("--strategy", required=True, type=Registered("strategy"),
              help="query strategy (scarcelab list strategies)")
@click.option("--dataset", default="splice", show_default=True, type=DatasetName(al=True),
              help="splice, dna, usps, sms, honeypot, diverging_sine, an image dataset "
              "(mnist_5k, cifar10_5k, any MedMNIST name, your own folder:PATH or csv:FILE) "
              "or encoded_<image dataset> (scarcelab list al-datasets)")
@click.option("--data-dir", default="default", show_default=True, type=Folder(),
              help="existing folder with the data files (default: $SCARCELAB_DATA or "
              "~/.cache/scarcelab, then the project's shared data, announced); synthetic "
              "sets need none")
@click.option("--query-size", default="1", show_default=True, type=Int(1, None),
              help="labels acquired per AL iteration (the batch the strategy picks)")
@click.option("--budget", default="default", show_default=True,
              type=Int(1, None, default_ok=True),
              help="labels to acquire after the seed set (default: the dataset's, Table 6)")
@click.option("--seed-set", default="default", show_default=True,
              type=Int(1, None, default_ok=True),
              help="initial labeled samples per class (default 1)")
@click.option("--repetitions", default="1", show_default=True, type=Int(1, 10_000),
              help="independent repetitions (seed sets), each a child run")
@click.option("--seed-strategy", default="0", show_default=True, type=Int(0, SEED_MAX),
              help="s_Ω (fixed)")
@click.option("--seed-data", default="0", show_default=True, type=Int(0, SEED_MAX),
              help="s_D (+ repetition)")
@click.option("--seed-model", default="0", show_default=True, type=Int(0, SEED_MAX),
              help="s_θ (+ repetition)")
@click.option("--max-candidates", default="default", show_default=True,
              type=Int(1, None, default_ok=True),
              help="unlabeled candidates subsampled per query (default: the strategy's)")
@click.option("--device", default="auto", show_default=True, type=Device(),
              help="auto (cuda when available), cpu or cuda; image sets want a GPU")
@click.option("--encoder", default=ENCODER_DEFAULT, show_default=True, type=Word(),
              help="encoded_* sets: a self-supervised method to train (simclr, byol, …), or "
              "the model of a scarcelab self run (runs:/<run id>/model, models:/…)")
@click.option("--early-stop-on", default="val", show_default=True, type=Word(("val", "test")),
              help="what early stopping watches: val (the validation split) or test — "
              "CDALBench's earlier code stopped on the test loss with no validation split; "
              "test reproduces that LEAK (whole train split as pool, runs tagged "
              "scarcelab.leak) and is for comparing with their numbers only")
@click.option("--set", "overrides", default="none", show_default=True, type=Overrides(),
              help="config overrides, e.g. 'fitting=scratch,lr=0.01,hidden=24x12,"
              "arch=small_cnn,strategy.tau=5,encoder.epochs=50,encoder.arch=resnet18'")
@click.option("--experiment", default="", help="MLflow experiment (ignored under mlflow run)")
@accel_options
@dataset_options
@identity_options
@verbosity_options
@click.pass_context
def al_cmd(ctx: click.Context, strategy: str, dataset: str, data_dir: str | None,
           query_size: int, budget: int | None, seed_set: int | None, repetitions: int,
           seed_strategy: int, seed_data: int, seed_model: int, max_candidates: int | None,
           device: str, encoder: str, early_stop_on: str, overrides: dict[str, Any],
           experiment: str, quiet: bool, verbose: bool, run_name: str,
           tags: dict[str, str], description: str, **rest: Any) -> None:
    """Run the CDALBench protocol for one strategy; one MLflow run per repetition."""
    ctx.meta["scarcelab.accel"] = accel_from(rest, pop=True)
    level = verbosity(ctx, quiet, verbose)
    t0 = time.time()
    from scarcelab.errors import ScarcelabError

    opts = data_options(rest, dataset)
    try:
        _al(ctx, level, t0, strategy, dataset, data_dir, query_size, budget, seed_set,
            repetitions, seed_strategy, seed_data, seed_model, max_candidates, device,
            encoder, early_stop_on, overrides, experiment,
            {"run_name": run_name, "tags": tags, "description": description}, opts)
    except ScarcelabError as e:  # bad input: a one-line error, not a traceback
        raise click.ClickException(str(e)) from e


def _al(ctx: click.Context, level: int, t0: float, strategy: str, dataset: str,
        data_dir: str | None, query_size: int, budget: int | None, seed_set: int | None,
        repetitions: int, seed_strategy: int, seed_data: int, seed_model: int,
        max_candidates: int | None, device: str, encoder: str, early_stop_on: str,
        overrides: dict[str, Any], experiment: str, ident: dict[str, Any],
        opts: Any = None) -> None:
    import os

    import torch

    from scarcelab.active import STRATEGIES
    from scarcelab.active.datasets import spec

    check_device(device)
    STRATEGIES.get(strategy)  # an unknown name fails here, before any data is read
    if "OMP_NUM_THREADS" not in os.environ:
        # The AL classifiers are tiny MLPs on a few hundred samples: intra-op threads cost
        # more in synchronisation than they gain (and starve parallel sweeps).
        torch.set_num_threads(1)
    cfg_over, strat_params, enc_params = _parse_set(overrides, dataset)
    _check_encoder(dataset, encoder, enc_params)
    _check_strategy_settings(strategy, strat_params, max_candidates)
    _flag_overrides(cfg_over, budget, seed_set, early_stop_on)
    from scarcelab.active.loop import ALRunConfig

    rc = ALRunConfig(
        strategy=strategy, dataset=dataset, data_dir=data_dir, query_size=query_size,
        repetitions=repetitions, seed_strategy=seed_strategy, seed_data=seed_data,
        seed_model=seed_model, overrides=cfg_over, strategy_params=strat_params,
        max_candidates=max_candidates, device=device,
        encoder=({"method": encoder, **enc_params}
                 if spec(dataset).kind == "encoded" and ":/" not in encoder else {}),
        accel=ctx.meta["scarcelab.accel"],
        data_options=opts,
    )
    resolved = _warn_cpu_arch(rc, dataset, device)
    ctx_data = None
    if spec(dataset).kind == "encoded":
        ctx_data = _encoded_context(rc, encoder, enc_params, experiment or None)
    _sweep(ctx, level, t0, rc, resolved, ctx_data, experiment, ident)


def _check_encoder(dataset: str, encoder: str, enc_params: dict[str, Any]) -> None:
    """Before any data is read: ``--encoder`` names a self-supervised method (or a logged
    scarcelab model, ``runs:/``/``models:/``, resolved later), and is given only for an
    ``encoded_*`` set (issue 42 item 8: ``--encoder nosuchencoder`` on splice ran and exited
    0, the option silently ignored)."""
    from scarcelab.active.datasets import spec
    from scarcelab.entrypoints.options import _static_index
    from scarcelab.registry import did_you_mean

    if ":/" not in encoder:
        idx = _static_index("method")
        known = encoder.lower() in idx.where and idx.family(encoder) == "self"
        if not known and not idx.complete:  # a computed or plugin name: the registry decides
            from scarcelab.methods import METHODS

            known = encoder in METHODS and METHODS.get(encoder).family == "self"
        if not known:
            names = idx.names("self")
            near = did_you_mean(encoder, names)
            raise click.BadParameter(
                f"unknown encoder {encoder!r};{near}{';' if near else ''} an encoder is a "
                f"self-supervised method trained here ({', '.join(names)}) or a scarcelab "
                "model (runs:/<run id>/model, models:/<name>/<version>)",
                param_hint="'--encoder'")
    if spec(dataset).kind != "encoded" and (encoder != ENCODER_DEFAULT or enc_params):
        given = f"--encoder {encoder}" if encoder != ENCODER_DEFAULT else "--set encoder.*"
        raise click.BadParameter(
            f"{given} does not apply to {dataset}: it is not an encoded set (only "
            "encoded_<image dataset> sets train or load an encoder; scarcelab list "
            "al-datasets); leave the encoder out",
            param_hint="'--encoder'" if encoder != ENCODER_DEFAULT else "'--set'")


def _check_strategy_settings(strategy: str, strat_params: dict[str, Any],
                             max_candidates: int | None) -> None:
    """Builds the strategy once so an unknown or ill-typed ``strategy.*`` setting is a
    parameter error of ``--set`` before any data is read, not a traceback mid-sweep."""
    from scarcelab.active.loop import make_strategy

    try:
        make_strategy(strategy, strat_params, max_candidates)
    except (TypeError, ValueError) as e:  # an unknown or ill-typed strategy.* setting
        raise click.BadParameter(f"strategy settings {strat_params}: {e}",
                                 param_hint="'--set'") from None


def _flag_overrides(cfg_over: dict[str, Any], budget: int | None, seed_set: int | None,
                    early_stop_on: str) -> None:
    """Named flags win over ``--set``; the test-set leak is reachable only through its own
    flag, so a run that uses it says so on the command line."""
    if budget is not None:
        cfg_over["budget"] = budget
    if seed_set is not None:
        cfg_over["seed_per_class"] = seed_set
    if early_stop_on == "test":  # their earlier protocol: no validation split at all
        cfg_over.setdefault("stop_on", "test")
        cfg_over.setdefault("val_fraction", 0.0)
    elif cfg_over.get("stop_on") == "test":
        raise click.BadParameter("stop_on=test (the test-set leak) is set with "
                                 "--early-stop-on test, not through --set",
                                 param_hint="'--set'")


def _warn_cpu_arch(rc: Any, dataset: str, device: str) -> Any:
    """The resolved configuration; warns when an image network would train on the CPU at
    every iteration, which takes minutes each and is easy to start by mistake."""
    from scarcelab.active.classifier import resolve_device

    resolved = rc.resolved()
    arch = resolved.arch
    if arch.startswith(("resnet", "wrn")) and resolve_device(device).type == "cpu":
        click.echo(f"[scarcelab] warning: {dataset} trains a {arch} on the CPU at every AL "
                   "iteration (minutes each); pass --device auto on a GPU machine or "
                   "--set arch=small_cnn", err=True)
    return resolved


def _sweep(ctx: click.Context, level: int, t0: float, rc: Any, resolved: Any,
           ctx_data: Any, experiment: str, ident: dict[str, Any]) -> None:
    """Runs the sweep under a progress bar counting every fit of every repetition, then
    prints the closing summary."""
    import math

    from scarcelab.active.loop import run_al, sweep_summary
    from scarcelab.entrypoints._progress import CountBar, Display, ProgressTracker, summary_lines
    from scarcelab.tracking.mlflow_tracker import MlflowTracker

    repetitions = rc.repetitions
    display = Display(level)
    per_rep = 1 + math.ceil(resolved.budget / rc.query_size)
    bar = CountBar(display, repetitions * per_rep, "fits")
    tracker = ProgressTracker(MlflowTracker(experiment=experiment or None), display,
                              entry=entry_params(ctx, AL_ENTRY), kind="al")
    apply_identity(tracker, ident)
    display.start_bar(bar.status)

    def on_iteration(rep: int, n_labeled: int, acc: float) -> None:
        bar.step(text=f"repetition {rep + 1}/{repetitions}, {n_labeled} labels, "
                 f"test accuracy {acc:.4f}")
        display.line(f"  repetition {rep} labels {n_labeled}: test accuracy {acc:.4f}",
                     verbose_only=True)

    try:
        res = run_al(rc, tracker, ctx_data, on_iteration=on_iteration)
    finally:
        display.stop_bar()
    click.echo("\n".join(summary_lines(tracker, "sweep", time.time() - t0,
                                       [sweep_summary(res)])))


def _encoded_context(rc: Any, encoder: str, enc_params: dict[str, Any],
                     experiment: str | None) -> Any:
    """Encoding cache on disk + MLflow, and the encoder: a method name to train here, or a
    logged scarcelab model whose backbone is used as is."""
    from scarcelab.active.encoded import DiskEncodingCache
    from scarcelab.data.download import cache_root
    from scarcelab.tracking.encoding_cache import MlflowEncodingCache, load_pretrained_backbone

    cache = MlflowEncodingCache(DiskEncodingCache(cache_root() / "encoded"), experiment)
    if ":/" not in encoder:  # a method trained here, set up in rc.encoder
        return rc.load_context(cache)
    if enc_params:
        raise click.BadParameter(f"encoder settings {sorted(enc_params)} apply to an encoder "
                                 "trained here, not to a logged model",
                                 param_hint="--set encoder.*")
    return rc.load_context(cache, load_pretrained_backbone(encoder), encoder)


@main.command(name="al-report", short_help="Rank AL strategies; critical-difference diagram.")
@click.option("--experiment", required=True, help="experiment name(s), comma-separated")
@click.option("--tracking-uri", default="", help="default: MLFLOW_TRACKING_URI / MLflow's")
@click.option("--alpha", default=0.05, show_default=True,
              help="significance level of the Friedman and Wilcoxon-Holm tests")
@click.option("--log/--no-log", default=True, show_default=True,
              help="log the tables and the critical-difference diagram as a report run")
def al_report_cmd(experiment: str, tracking_uri: str, alpha: float, log: bool) -> None:
    """Ranks of strategies per dataset and query size, and a critical-difference diagram."""
    from scarcelab.tracking.al import al_report

    rep = al_report([e for e in experiment.split(",") if e], tracking_uri or None,
                    alpha=alpha, log=log)
    click.echo(rep.ranks.to_string())
    for note in rep.notes:
        click.echo(f"note: {note}")
    if rep.run_id:
        click.echo(f"report run {rep.run_id} (artifacts: al_scores.csv, al_ranks.csv, "
                   "al_cd_diagram.png)")
