"""``al``: one active-learning sweep (strategy x dataset x query size, all repetitions), and
``al-report``: ranks and a critical-difference diagram over the tracked sweeps."""

from __future__ import annotations

from typing import Any

import click

from entrypoints.cli import main
from entrypoints.options import opt_int


def _parse_set(text: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``budget=100,fitting=scratch,hidden=24x12,strategy.tau=5,encoder.epochs=50`` ->
    (config, strategy, encoder)."""
    from scarcelab.protocols.search import parse_overrides

    cfg: dict[str, Any] = {}
    strat: dict[str, Any] = {}
    enc: dict[str, Any] = {}
    for k, v in parse_overrides(text).items():
        if k == "hidden":
            v = tuple(int(h) for h in str(v).split("x") if h) if v not in ("", "none") else ()
        if k.startswith("strategy."):
            strat[k.split(".", 1)[1]] = v
        elif k.startswith("encoder."):
            enc[k.split(".", 1)[1]] = v
        else:
            cfg[k] = v
    return cfg, strat, enc


@main.command(name="al")
@click.option("--strategy", required=True, help="query strategy (scarcelab list strategies)")
@click.option("--dataset", default="splice", show_default=True,
              help="splice, dna, usps, sms, honeypot, diverging_sine, an image dataset "
              "(mnist_5k, cifar10_5k, any MedMNIST name) or encoded_<image dataset> "
              "(scarcelab list al-datasets)")
@click.option("--data-dir", default="", help="folder with the data files (default: "
              "$SCARCELAB_DATA or ~/.cache/scarcelab); synthetic sets need none")
@click.option("--query-size", default="1", show_default=True)
@click.option("--budget", default="default", show_default=True,
              help="labels to acquire after the seed set (default: the dataset's, Table 6)")
@click.option("--seed-set", default="default", show_default=True,
              help="initial labeled samples per class (default 1)")
@click.option("--repetitions", default="1", show_default=True)
@click.option("--seed-strategy", default="0", show_default=True, help="s_Ω (fixed)")
@click.option("--seed-data", default="0", show_default=True, help="s_D (+ repetition)")
@click.option("--seed-model", default="0", show_default=True, help="s_θ (+ repetition)")
@click.option("--max-candidates", default="default", show_default=True,
              help="unlabeled candidates subsampled per query (default: the strategy's)")
@click.option("--device", default="cpu", show_default=True,
              help="cpu, cuda, or auto (cuda when available); image sets want a GPU")
@click.option("--encoder", default="simclr", show_default=True,
              help="encoded_* sets: a self-supervised method to train (simclr, byol, …), or "
              "the model of a scarcelab self run (runs:/<run id>/model, models:/…)")
@click.option("--set", "overrides", default="",
              help="config overrides, e.g. 'fitting=scratch,lr=0.01,hidden=24x12,"
              "arch=small_cnn,strategy.tau=5,encoder.epochs=50,encoder.arch=resnet18'")
@click.option("--experiment", default="", help="MLflow experiment (ignored under mlflow run)")
def al_cmd(strategy: str, dataset: str, data_dir: str, query_size: str, budget: str,
           seed_set: str, repetitions: str, seed_strategy: str, seed_data: str,
           seed_model: str, max_candidates: str, device: str, encoder: str, overrides: str,
           experiment: str) -> None:
    """Run the CDALBench protocol for one strategy; one MLflow run per repetition."""
    import os

    import mlflow
    import torch

    from scarcelab.active.datasets import spec
    from scarcelab.active.loop import ALRunConfig, run_al, sweep_summary
    from tracking.mlflow_tracker import MlflowTracker

    if "OMP_NUM_THREADS" not in os.environ:
        # The AL classifiers are tiny MLPs on a few hundred samples: intra-op threads cost
        # more in synchronisation than they gain (and starve parallel sweeps).
        torch.set_num_threads(1)
    from scarcelab.errors import ScarcelabError

    try:
        cfg_over, strat_params, enc_params = _parse_set(overrides)
        if (b := opt_int(budget, "--budget")) is not None:
            cfg_over["budget"] = b
        if (s := opt_int(seed_set, "--seed-set")) is not None:
            cfg_over["seed_per_class"] = s
        rc = ALRunConfig(
            strategy=strategy, dataset=dataset, data_dir=data_dir or None,
            query_size=opt_int(query_size, "--query-size") or 1,
            repetitions=opt_int(repetitions, "--repetitions") or 1,
            seed_strategy=opt_int(seed_strategy, "--seed-strategy") or 0,
            seed_data=opt_int(seed_data, "--seed-data") or 0,
            seed_model=opt_int(seed_model, "--seed-model") or 0,
            overrides=cfg_over, strategy_params=strat_params,
            max_candidates=opt_int(max_candidates, "--max-candidates"), device=device,
            encoder=({"method": encoder, **enc_params}
                     if spec(dataset).kind == "encoded" and ":/" not in encoder else {}),
        )
        from scarcelab.active.classifier import resolve_device

        arch = rc.resolved().arch
        if arch.startswith(("resnet", "wrn")) and resolve_device(device).type == "cpu":
            click.echo(f"[scarcelab] warning: {dataset} trains a {arch} on the CPU at every AL "
                       "iteration (minutes each); pass --device auto on a GPU machine or "
                       "--set arch=small_cnn", err=True)
        ctx = None
        if spec(dataset).kind == "encoded":
            ctx = _encoded_context(rc, encoder, enc_params, experiment or None)
        tracker = MlflowTracker(experiment=experiment or None)
        res = run_al(rc, tracker, ctx)
    except ScarcelabError as e:  # bad input: a one-line error, not a traceback
        raise click.ClickException(str(e)) from e
    click.echo(sweep_summary(res))
    click.echo(f"sweep run {tracker.study_run_id}; tracking URI: {mlflow.get_tracking_uri()}")


def _encoded_context(rc: Any, encoder: str, enc_params: dict[str, Any],
                     experiment: str | None) -> Any:
    """Encoding cache on disk + MLflow, and the encoder: a method name to train here, or a
    logged scarcelab model whose backbone is used as is."""
    from scarcelab.active.datasets import default_data_dir
    from scarcelab.active.encoded import DiskEncodingCache
    from tracking.encoding_cache import MlflowEncodingCache, load_pretrained_backbone

    cache = MlflowEncodingCache(DiskEncodingCache(default_data_dir() / "encoded"), experiment)
    if ":/" not in encoder:  # a method trained here, set up in rc.encoder
        return rc.load_context(cache)
    if enc_params:
        raise click.BadParameter(f"encoder settings {sorted(enc_params)} apply to an encoder "
                                 "trained here, not to a logged model",
                                 param_hint="--set encoder.*")
    return rc.load_context(cache, load_pretrained_backbone(encoder), encoder)


@main.command(name="al-report")
@click.option("--experiment", required=True, help="experiment name(s), comma-separated")
@click.option("--tracking-uri", default="")
@click.option("--alpha", default=0.05, show_default=True)
@click.option("--log/--no-log", default=True, show_default=True,
              help="log the tables and the critical-difference diagram as a report run")
def al_report_cmd(experiment: str, tracking_uri: str, alpha: float, log: bool) -> None:
    """Ranks of strategies per dataset and query size, and a critical-difference diagram."""
    from tracking.al import al_report

    rep = al_report([e for e in experiment.split(",") if e], tracking_uri or None,
                    alpha=alpha, log=log)
    click.echo(rep.ranks.to_string())
    if rep.run_id:
        click.echo(f"report run {rep.run_id} (artifacts: al_scores.csv, al_ranks.csv, "
                   "al_cd_diagram.png)")
