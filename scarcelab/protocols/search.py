"""Budgeted random search (SSL-vs-SSL Alg. D.1) — the default way every method is tuned.

Sample a configuration from the method's search space (Optuna's RandomSampler, seeded),
train it until early stopping or ``max_epochs``, repeat until ``budget_minutes`` of wall
clock are spent. The study's answer is the checkpoint with the best validation balanced
accuracy over *all* trials and epochs, tracked as it happens (``best/*`` metrics on the
study, stepped by a global epoch counter) so an interrupted or budget-cut study still
has its best-so-far recorded. A trial that diverges is recorded as failed and the search
goes on; repeated *unexpected* errors abort, since they are bugs, not bad configurations.

``search="none"`` is the "transfer" strategy of SSL-vs-SSL App. D.2: no search, one run
with a configuration taken from elsewhere (the method's literature defaults, or — resolved
by ``tracking.hparams`` and passed in as ``StudyConfig.hparams`` — the best configuration
found on another dataset, as the paper transfers from TissueMNIST / CIFAR-10), trained on
labeled train + validation for ``transfer_epochs`` (the paper's 100; 80 for TMED-2),
stopping early after ``transfer_patience`` (20) epochs without a lower train loss. There is
no model selection: the last epoch is the answer, and validation scores are optimistic
(validation is in the training set), tagged as such.

``search="fixed"`` trains one given configuration (``StudyConfig.hparams``) with the
search's protocol (validation early stopping, best-on-validation checkpoint): what every
ratio of a contamination sweep runs once tuning is held fixed.

Budget: ``time/elapsed_s`` and the budget exclude the time spent on diagnostics
(``time/diag_s``, see ``scarcelab.train.Budget``). With shared storage the budget clock
is also written to the running Optuna trial (user attribute ``elapsed_s``, at each
heartbeat and epoch), so a study whose process was killed mid-trial resumes with the time
that trial had spent, not only the time up to its last logged epoch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna
import torch
from torch import nn

import scarcelab
from scarcelab import tags as T
from scarcelab.accel import Accel
from scarcelab.data import load_raw
from scarcelab.data.bundle import DatasetBundle, resolve_positive_class
from scarcelab.data.own import DataOptions, dataset_label
from scarcelab.data.splits import apply_split, make_split, unlabeled_count
from scarcelab.errors import ConfigError, TrialFailed
from scarcelab.methods import get_method
from scarcelab.methods.base import Method
from scarcelab.methods.space import sample
from scarcelab.metrics.diagnostics import DiagnosticsConfig, EpochDiagnostics
from scarcelab.models import create_model
from scarcelab.models.image_input import transform_of
from scarcelab.probe import PROBE_SOLVERS
from scarcelab.protocols.study_store import StudyStore, redact
from scarcelab.schedule import SCHEDULE_HORIZONS
from scarcelab.tracker import DatasetInfo, ResumeState, Tracker
from scarcelab.train import (
    BUDGET_CLOCKS,
    CLASS_WEIGHTS,
    Budget,
    Diagnostics,
    EpochCallback,
    EpochReport,
    OnEpochEnd,
    TrainConfig,
    checkpoint_to_host,
    data_info,
    export_classifier,
    train_trial,
)
from scarcelab.trials import COMPLETE, MAX_CONSECUTIVE_ERRORS, TrialRunner, trial_seed

log = logging.getLogger("scarcelab")

CHECKPOINT_MIN_INTERVAL_S = 30.0
# Seconds the search leaves at the end of the budget for the final phase (the selected
# model exported and logged, figures, the run closed): measured at 2-5 s idle and up to
# ~20 s under load for small_cnn on this 2-core machine (bench/study_overhead.py,
# docs/performance.md). At most FINAL_RESERVE_SHARE of the budget, so that a short
# budget still trains.
FINAL_RESERVE_S = 8.0
FINAL_RESERVE_SHARE = 0.1
# Start-up spent before the search (imports, data, the study record) counts against the
# budget, but never more than this share of it: a budget shorter than the start-up still
# trains.
STARTUP_MAX_SHARE = 0.5
SEARCHES = ("random", "none", "fixed")
# Transfer strategy epochs (SSL-vs-SSL App. D.2): 100, except 80 for TMED-2.
TRANSFER_EPOCHS: dict[str, int] = {"tmed2": 80}
DEFAULT_TRANSFER_EPOCHS = 100


class AutoDevice:
    """``device``/``arch`` = ``auto`` resolved one way for every protocol config (study,
    probe, segment): cuda when present; resnet18 on a GPU (the paper's backbone), small_cnn
    on CPU."""

    device: str
    arch: str

    def resolved_device(self) -> str:
        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        return self.device

    def resolved_arch(self) -> str:
        if self.arch == "auto":
            return "resnet18" if self.resolved_device().startswith("cuda") else "small_cnn"
        return self.arch


@dataclass
class StudyConfig(AutoDevice):
    method: str
    dataset: str = "breastmnist"
    family: str | None = None  # the entry point used; checked against the method's family
    data_dir: str | None = None
    arch: str = "auto"
    seed: int = 0
    budget_minutes: float = 3.0
    # what the budget counts: "wall" seconds, or this process's "cpu" seconds (reproducible
    # on a shared CPU machine; scarcelab.train.Budget)
    budget_clock: str = "wall"
    max_epochs: int = 200
    patience: int = 20
    n_labeled: int | str | None = None
    n_val: int | str | None = None
    allow_large_val: bool = False
    label_fraction: float = 1.0  # share of the labeled set kept (scarcelab.data.splits)
    search: str = "random"
    batch_size: int | None = None
    unlabeled_batch_size: int | None = None
    max_steps_per_epoch: int | None = None
    max_trials: int = 0  # 0 = until the budget is spent
    device: str = "auto"
    overrides: dict[str, Any] = field(default_factory=dict)
    # Shared Optuna storage (the stack's PostgreSQL): several workers per study, and a
    # killed study continues when the same command runs again. None = in memory.
    storage: str | None = field(
        default_factory=lambda: os.environ.get("OPTUNA_STORAGE") or None)
    # the Optuna study the workers share: None = the one named after the command's
    # settings (its key), so every worker of the same command joins one search
    study_name: str | None = None
    # a study of its own (``<key>-<time>-<pid>``) even while workers of the same command
    # run: a repeat the user asked for (``--study-name new``); not part of the key
    fresh_study: bool = False
    diag_samples: int = 512  # C-Score diagnostics subsample for semi methods; 0 = off
    # where validation comes from: auto | official | train (scarcelab.data.splits)
    val_from: str = "auto"
    # a configuration given from outside (search=none / fixed): resolved by the caller
    # (tracking.hparams for an MLflow experiment or run; a contamination sweep's tuning
    # study) — the core never looks anything up. None = the method's defaults.
    hparams: dict[str, Any] | None = None
    hparams_source: str = "defaults"  # where ``hparams`` came from, logged as a tag
    transfer_epochs: int | None = None  # search=none; None = 100 (80 for TMED-2)
    transfer_patience: int = 20  # search=none: epochs without a lower train loss
    # the labeled loss of every trial: "balanced" (inverse labeled class frequencies, the
    # probe's class_weight="balanced": SSL-vs-SSL, every method) or "none" (unweighted)
    class_weights: str = "balanced"
    # which point of a sweep this study is (e.g. "mnist r=0.3"): part of the study key, so
    # that the children of a contamination sweep are never taken for one another on resume
    sweep_point: str = ""
    # binary tasks: the class the test metrics detect (index or class name); None = the
    # dataset's own (the disease: scarcelab.data.bundle.resolve_positive_class)
    positive_class: int | str | None = None
    # a user's images (dataset folder:/csv:): decode transform, bad files, test hold-out or
    # fold (scarcelab.data.own.DataOptions); None for every other dataset
    data_options: DataOptions | None = None
    # ``time.time()`` at which the command started (entry points: the process, or the
    # ``mlflow run`` that launched it): the budget is then the command's wall time, its
    # start-up included (at most STARTUP_MAX_SHARE of it). None = the budget starts with
    # the search (library use).
    started_at: float | None = None
    # seconds kept at the end of the budget for the final phase; None = FINAL_RESERVE_S
    final_reserve_s: float | None = None
    # precision and kernels of every trial (scarcelab.accel; ``auto``: per device); logged
    # resolved as the params precision, channels_last, ... (they change the numbers)
    accel: Accel = field(default_factory=Accel)
    # self-supervised methods' per-epoch probe: "sklearn" or "torch" (on the device;
    # scarcelab.probe)
    probe_solver: str = "sklearn"
    # evaluate after an epoch only once this many steps are unevaluated (0 = every
    # epoch); patience then counts evaluations (scarcelab.train.TrainConfig)
    eval_every_steps: int = 0
    # what every trial's schedules (cosine learning rate, unlabeled-weight ramps, EMA
    # momentum) are planned over (scarcelab.schedule): "epochs" = max_epochs (the papers':
    # a budget that ends a trial early leaves them unfinished); "budget" = the steps the
    # trial's share of the budget buys (all that is left, or an even split over the trials
    # --max-trials has still to run), so that they complete. The CLI's default: budget.
    schedule_horizon: str = "epochs"

    def budget_split(self, now: float) -> tuple[float, float]:
        """(start-up seconds charged to the budget, seconds reserved for the final phase)."""
        total = self.budget_minutes * 60.0
        if self.started_at is None:
            startup = 0.0
        elif self.budget_clock == "cpu":  # the CPU this process spent before the search
            startup = time.process_time()
        else:
            startup = max(0.0, now - self.started_at)
        reserve = FINAL_RESERVE_S if self.final_reserve_s is None else self.final_reserve_s
        return (min(startup, STARTUP_MAX_SHARE * total),
                min(max(reserve, 0.0), FINAL_RESERVE_SHARE * total))

    def resolved_transfer_epochs(self) -> int:
        if self.transfer_epochs is not None:
            return int(self.transfer_epochs)
        return TRANSFER_EPOCHS.get(self.dataset, DEFAULT_TRANSFER_EPOCHS)



@dataclass
class StudyResult:
    best_val: float
    best_test: dict[str, float]
    best_trial: int
    n_trials: int
    n_failed: int
    split_hash: str
    best_checkpoint: dict[str, Any] | None
    # the selected trial ended short of its schedules: the warning, else ""
    schedule_warning: str = ""


def schedule_warning(cfg: StudyConfig, trial: int,
                     end: tuple[float, float | None, str] | None) -> str:
    """One sentence when the selected trial ended before its schedules did (issue 43: a
    0.5-minute study ended at chance and said nothing): the learning rate's cosine had not
    reached its end, or the unlabeled-loss weight its full value. "" when both finished, or
    when the trial's end is not known (a resumed study's restored checkpoint)."""
    if end is None:
        return ""
    progress, ramp, stopped = end
    short_lr = progress < 1.0 - 1e-9
    short_ramp = ramp is not None and ramp < 1.0 - 1e-9
    if not (short_lr or short_ramp):
        return ""
    parts = []
    if short_lr:
        parts.append(f"its learning-rate schedule at {progress:.0%} of its plan")
    if short_ramp:
        parts.append(f"{cfg.method}'s unlabeled-loss weight at {ramp:.0%} of its full value")
    why = {"budget": f"the {cfg.budget_minutes:g}-minute budget ran out",
           "patience": "early stopping (patience) ended it",
           "horizon": "its budget-fitted plan ended"}.get(stopped, f"it stopped ({stopped})")
    fix = ("raise --budget-minutes or lower --max-epochs" if cfg.schedule_horizon == "epochs"
           else "raise --budget-minutes")
    return (f"schedules not finished: the selected trial {trial} ended with "
            + " and ".join(parts) + f" ({why}; --schedule-horizon {cfg.schedule_horizon}); "
            f"its scores may be far from what the method reaches: {fix}")


def _validate(cfg: StudyConfig, method_cls: type[Method]) -> None:
    if cfg.family and method_cls.family != cfg.family:
        raise ConfigError(
            f"method {cfg.method!r} is {method_cls.family}, not {cfg.family}; run it with the "
            f"'{method_cls.family}' entry point (mlflow run . -e {method_cls.family} "
            f"-P method={cfg.method})"
        )
    if cfg.search not in SEARCHES:
        raise ConfigError(f"search={cfg.search!r}: valid values are {', '.join(SEARCHES)}")
    if cfg.search == "random" and cfg.hparams is not None:
        raise ConfigError(f"a given configuration (hparams_from={cfg.hparams_source}) needs "
                          "search=none (transfer) or search=fixed; search=random samples its own")
    if cfg.search == "fixed" and cfg.hparams is None:
        raise ConfigError("search=fixed trains a given configuration: pass hparams_from")
    if cfg.class_weights not in CLASS_WEIGHTS:
        raise ConfigError(f"class_weights={cfg.class_weights!r}: valid values are "
                          f"{', '.join(CLASS_WEIGHTS)}")
    if cfg.transfer_epochs is not None and cfg.transfer_epochs < 1:
        raise ConfigError(f"transfer_epochs must be >= 1, got {cfg.transfer_epochs}")
    if cfg.transfer_patience < 1:
        raise ConfigError(f"transfer_patience must be >= 1, got {cfg.transfer_patience}")
    if cfg.budget_minutes <= 0:
        raise ConfigError(f"budget_minutes must be > 0, got {cfg.budget_minutes}")
    if cfg.budget_clock not in BUDGET_CLOCKS:
        raise ConfigError(f"budget_clock={cfg.budget_clock!r}; use one of {BUDGET_CLOCKS}")
    if cfg.probe_solver not in PROBE_SOLVERS:
        raise ConfigError(f"probe_solver={cfg.probe_solver!r}: valid values are "
                          f"{', '.join(PROBE_SOLVERS)}")
    if cfg.eval_every_steps < 0:
        raise ConfigError(f"eval_every_steps must be >= 0 (0 = every epoch), got "
                          f"{cfg.eval_every_steps}")
    if cfg.schedule_horizon not in SCHEDULE_HORIZONS:
        raise ConfigError(f"schedule_horizon={cfg.schedule_horizon!r}: valid values are "
                          f"{', '.join(SCHEDULE_HORIZONS)}")
    for name in ("max_epochs", "patience"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    unknown = set(cfg.overrides) - set(method_cls.search_space) - set(method_cls.defaults)
    given = set(cfg.hparams or {}) - set(method_cls.search_space) - set(method_cls.defaults)
    if given:
        valid = sorted(set(method_cls.search_space) | set(method_cls.defaults))
        raise ConfigError(f"the configuration from {cfg.hparams_source} has hyperparameter(s) "
                          f"{sorted(given)} that {cfg.method} does not know; valid: {valid}")
    if unknown:
        valid = sorted(set(method_cls.search_space) | set(method_cls.defaults))
        raise ConfigError(f"unknown hyperparameter(s) {sorted(unknown)} for {cfg.method}; "
                          f"valid: {valid}")
    # the given values, checked before any data is loaded (sampled ones are the space's)
    method_cls.check_hparams({**method_cls.defaults, **(cfg.hparams or {}), **cfg.overrides})


def prepare_data(cfg: StudyConfig) -> tuple[DatasetBundle, dict[str, Any]]:
    raw = load_raw(cfg.dataset, cfg.data_dir, cfg.data_options)
    split = make_split(raw, cfg.n_labeled, cfg.n_val, cfg.seed, cfg.allow_large_val,
                       cfg.val_from, cfg.label_fraction)
    bundle = apply_split(raw, split)
    pos = resolve_positive_class(raw, cfg.positive_class)
    bundle.meta["positive_class"] = pos  # train.evaluate's test metrics read it
    bundle.meta["positive_class_name"] = None if pos is None else raw.class_names[pos]
    if cfg.search == "none":  # transfer: validation joins the training set
        bundle.labeled_x = np.concatenate([bundle.labeled_x, bundle.val_x])
        bundle.labeled_y = np.concatenate([bundle.labeled_y, bundle.val_y])
    return bundle, split


def check_pool(cfg: StudyConfig, method_cls: type[Method], bundle: DatasetBundle,
               split: dict[str, Any]) -> None:
    """Refuse, before any record exists, a study whose method learns from unlabeled images
    when the pool is empty: every trial would fail at its first batch (issue 39 saw 42
    failed trial runs in 15 s). One line naming the numbers and the fix."""
    if not method_cls.views or len(bundle.unlabeled_x):
        return
    what = f"{cfg.method} ({method_cls.family}) learns from unlabeled images"
    if bundle.meta.get("unlabeled") == "given":
        from scarcelab.data.own import pool_hint

        raise ConfigError(f"{what}, but the unlabeled pool of {cfg.dataset} is empty; "
                          f"{pool_hint(cfg.dataset)}, or run a supervised method")
    n_train = split["n_labeled"] + split["n_val"] * (split["val_from"] == "train")
    raise ConfigError(f"{what}, but n_labeled={split['n_labeled']}"
                      + (f" + n_val={split['n_val']}" if split["val_from"] == "train" else "")
                      + f" take all {n_train} training images of {cfg.dataset}, leaving the "
                      "unlabeled pool empty; lower --n-labeled or --n-val")


def check_data(cfg: StudyConfig) -> tuple[DatasetBundle, dict[str, Any]]:
    """What :func:`run_study` checks before it opens a record — the configuration, the
    data, the split and the unlabeled pool — for a caller that creates records of its own
    first (a contamination sweep's parent, the parent of k folds): a refusal then leaves
    no run behind."""
    method_cls = get_method(cfg.method)
    _validate(cfg, method_cls)
    bundle, split = prepare_data(cfg)
    check_pool(cfg, method_cls, bundle, split)
    return bundle, split


def _dataset_info(bundle: DatasetBundle) -> DatasetInfo:
    m = bundle.meta
    digest = hashlib.sha256(f"{m.get('md5')}:{m['split_hash']}".encode()).hexdigest()[:16]
    return DatasetInfo(name=m["name"], source=m.get("source") or m["name"], digest=digest)


def run_study(cfg: StudyConfig, tracker: Tracker,
              bundle_transform: Callable[[DatasetBundle], DatasetBundle] | None = None,
              backbone_factory: Callable[[int], nn.Module] | None = None,
              extra_tags: dict[str, str] | None = None) -> StudyResult:
    """``bundle_transform`` rewrites the split bundle before training (e.g. the
    contamination protocol adds OOD images to the unlabeled pool). ``backbone_factory(
    in_channels)`` builds each trial's initial backbone instead of a fresh ``cfg.arch``
    (fine-tuning a pretrained encoder: ``scarcelab.protocols.transfer``); it must build
    that arch. ``extra_tags`` join (and may refine) the study's tags."""
    method_cls = get_method(cfg.method)
    _validate(cfg, method_cls)
    arch = cfg.resolved_arch()
    create_model(arch, in_channels=1)  # fail fast on an unknown arch, before loading data
    device = cfg.resolved_device()
    bundle, split = prepare_data(cfg)
    check_pool(cfg, method_cls, bundle, split)  # before the transform adds OOD images
    if bundle_transform is not None:
        bundle = bundle_transform(bundle)
    diagnostics = EpochDiagnostics(bundle, device, DiagnosticsConfig(
        n_unlabeled=cfg.diag_samples, seed=cfg.seed)) if (
        method_cls.family == "semi" and cfg.diag_samples > 0) else None
    train_cfg = _train_config(cfg, method_cls, device)
    tags = _study_tags(cfg, method_cls, arch, split, bundle, extra_tags)
    resolved = _resolved_config(cfg, method_cls, arch, train_cfg, split, bundle)
    study_key = cfg.study_name or _study_key(cfg, split["hash"])
    store, resume = _open_store(cfg, tracker, study_key)
    tags[T.STUDY_KEY] = study_key
    tags[T.OPTUNA_STUDY] = store.name
    with tracker.open_study(
            name=f"{method_cls.registered_name}-{dataset_label(cfg.dataset)}-s{cfg.seed}",
            tags=tags,
            params=_study_params(cfg, resolved),
            artifacts={"split.json": split, "config.json": resolved},
            dataset=_dataset_info(bundle)):
        try:
            search = _Search(cfg, tracker, method_cls, bundle, split, train_cfg, tags, store,
                             study_key, resume, _study_budget(cfg, tracker, store, resume),
                             backbone_factory, diagnostics)
            search.run_trials()
            store.close_study()  # its search is over: the command run again repeats it
            return search.finish()
        finally:
            store.close()


def _train_config(cfg: StudyConfig, method_cls: type[Method], device: str) -> TrainConfig:
    """The trials' training: the search's protocol (validation early stopping), or the
    transfer strategy's (fixed epochs, stopping on the train loss)."""
    transfer = cfg.search == "none"
    return TrainConfig(
        max_epochs=cfg.resolved_transfer_epochs() if transfer else cfg.max_epochs,
        patience=cfg.transfer_patience if transfer else cfg.patience,
        stop_on="train_loss" if transfer else "val",
        max_steps_per_epoch=cfg.max_steps_per_epoch,
        batch_labeled=cfg.batch_size or method_cls.batch_sizes["labeled"],
        batch_unlabeled=cfg.unlabeled_batch_size or method_cls.batch_sizes["unlabeled"],
        device=device, class_weights=cfg.class_weights, accel=cfg.accel,
        probe_solver=cfg.probe_solver, eval_every_steps=cfg.eval_every_steps,
        schedule_horizon=cfg.schedule_horizon)


def _study_tags(cfg: StudyConfig, method_cls: type[Method], arch: str, split: dict[str, Any],
                bundle: DatasetBundle, extra_tags: dict[str, str] | None) -> dict[str, str]:
    """The study record's tags (its trials' too, with their role and number); the study
    key and Optuna study are added once the store is open."""
    tags = {
        T.ROLE: "study",
        T.FAMILY: method_cls.family,
        T.METHOD: method_cls.registered_name,
        T.DATASET: cfg.dataset,
        T.SEED: str(cfg.seed),
        T.SPLIT_HASH: split["hash"],
        T.VERSION: scarcelab.__version__,
        T.ARCH: arch,
        T.SEARCH: cfg.search,
        T.VAL_FROM: split["val_from"],
    }
    if cfg.search != "random":
        tags[T.HPARAMS_SOURCE] = cfg.hparams_source
    if cfg.search == "none":
        tags[T.VAL_IN_TRAIN] = "true"
    if bundle.meta.get("positive_class") is not None:
        tags[T.POSITIVE_CLASS] = str(bundle.meta["positive_class_name"])
    tags.update(extra_tags or {})
    return tags


def _resolved_config(cfg: StudyConfig, method_cls: type[Method], arch: str,
                     train_cfg: TrainConfig, split: dict[str, Any], bundle: DatasetBundle
                     ) -> dict[str, Any]:
    """``config.json``: the settings with every ``auto`` and default resolved, as run."""
    transfer = cfg.search == "none"
    resolved = {**dataclasses.asdict(cfg), "arch": arch, "device": train_cfg.device,
                "batch_size": train_cfg.batch_labeled,
                "unlabeled_batch_size": train_cfg.batch_unlabeled,
                "n_labeled": split["n_labeled"], "n_val": split["n_val"],
                "n_unlabeled": unlabeled_count(split), "n_test": len(bundle.test_y),
                "val_from": split["val_from"],
                "transfer_epochs": train_cfg.max_epochs if transfer else cfg.transfer_epochs,
                "positive_class": bundle.meta.get("positive_class"),
                "search_space": {k: d.describe() for k, d in method_cls.search_space.items()}}
    resolved["storage"] = redact(cfg.storage)  # the URI holds the DB password
    resolved["accel"] = train_cfg.resolved_accel().params()  # as the trials run
    resolved.pop("data_options")  # a user's images: the options, flat, as entered
    if cfg.data_options is not None:
        resolved.update(cfg.data_options.params())
    # a per-process timestamp, not a setting; the start-up it charged is logged as
    # time/startup_s, and the reserve actually kept is what is recorded
    resolved.pop("started_at")
    # which study it joined is the tag scarcelab.optuna_study; the flag is not a setting
    resolved.pop("fresh_study")
    resolved["final_reserve_s"] = cfg.budget_split(0.0)[1]
    return resolved


def _study_params(cfg: StudyConfig, resolved: dict[str, Any]) -> dict[str, Any]:
    """The study's params: flat, so nested settings become one param per key."""
    params = {k: v for k, v in resolved.items()
              if k not in ("overrides", "search_space", "hparams", "accel")}
    params.update(resolved["accel"])  # precision=..., channels_last=..., as the CLI names
    params.update({f"override.{k}": v for k, v in cfg.overrides.items()})
    params.update({f"hparams.{k}": v for k, v in (cfg.hparams or {}).items()})
    return params


def _study_budget(cfg: StudyConfig, tracker: Tracker, store: StudyStore,
                  resume: ResumeState | None) -> Budget:
    """The budget clock, charged with the time already spent: an earlier (killed)
    process's, and this one's start-up."""
    spent = resume.elapsed_s if resume else 0.0
    if resume is not None:  # a killed trial's time, recorded between its logged epochs
        spent = max(spent, store.spent_by_dead_processes())
    startup, reserve = cfg.budget_split(time.time())
    budget = Budget(cfg.budget_minutes * 60.0, spent_s=spent + startup, reserve_s=reserve,
                    clock=cfg.budget_clock)
    if cfg.started_at is not None:
        tracker.log_metrics({"time/startup_s": startup}, 0, scope="study")
    return budget


@dataclass
class _BestSoFar:
    """The study's answer as it is found: the checkpoint with the best validation score
    over all trials and epochs, and whether the tracker's copy of it is stale. Uploads
    are rate-limited (CHECKPOINT_MIN_INTERVAL_S) except when forced at a trial's end,
    so that a killed study loses at most that much of its best."""

    val: float = -1.0
    test: dict[str, float] = field(default_factory=dict)
    trial: int = -1
    ckpt: dict[str, Any] | None = None
    method: Method | None = None  # None with a checkpoint: restored by a resumed study
    test_proba: np.ndarray | None = None
    dirty: bool = False
    last_upload: float = 0.0
    on_host: bool = True  # the checkpoint's tensors (train.snapshot takes them on the device)

    def restore(self, resume: ResumeState) -> None:
        ck = resume.best_checkpoint
        if ck is not None:
            self.val, self.test = float(ck["val_balanced_accuracy"]), dict(
                ck.get("test_metrics", {}))
            self.trial, self.ckpt = int(ck["trial"]), ck
            self.dirty = not resume.same_record  # a new record gets its own copy
        log.warning("resuming study %s: %.0f s of the budget already spent, best val %.4f",
                    resume.optuna_study, resume.elapsed_s, self.val)

    def upload(self, tracker: Tracker, force: bool) -> None:
        """The checkpoint to the tracker if it is stale and the rate limit (or ``force``)
        lets it go; it is brought to the host then, not when it is taken."""
        if self.dirty and (force or time.time() - self.last_upload
                           >= CHECKPOINT_MIN_INTERVAL_S):
            self.to_host()
            tracker.log_checkpoint(self.ckpt)  # type: ignore[arg-type]
            self.last_upload, self.dirty = time.time(), False

    def to_host(self) -> None:
        """The checkpoint's tensors to the host (``train.snapshot`` keeps them on the
        device until then): at its upload, and when its trial ends, so that no trial's
        best weights hold device memory into the next trial."""
        if self.ckpt is not None and not self.on_host:
            self.ckpt = checkpoint_to_host(self.ckpt)
            self.on_host = True

    def series(self, elapsed: float, diag_s: float) -> dict[str, float]:
        """The study's ``best/*`` metrics at one point of the search, with its clocks."""
        return {"best/val_balanced_accuracy": self.val, "time/elapsed_s": elapsed,
                "time/diag_s": diag_s, **{f"best/test_{k}": v for k, v in self.test.items()}}


class _Search:
    """One study's trial loop and final phase, over the state they share: the budget,
    the best-so-far, the study-level epoch counter and the trial runner (which keeps the
    count of unexpected errors in a row)."""

    def __init__(self, cfg: StudyConfig, tracker: Tracker, method_cls: type[Method],
                 bundle: DatasetBundle, split: dict[str, Any], train_cfg: TrainConfig,
                 tags: dict[str, str], store: StudyStore, study_key: str,
                 resume: ResumeState | None, budget: Budget,
                 backbone_factory: Callable[[int], nn.Module] | None,
                 diagnostics: EpochDiagnostics | None) -> None:
        self.cfg, self.tracker, self.method_cls = cfg, tracker, method_cls
        self.bundle, self.split, self.train_cfg, self.tags = bundle, split, train_cfg, tags
        self.store, self.study_key, self.resume, self.budget = store, study_key, resume, budget
        self.arch = cfg.resolved_arch()
        self.backbone_factory = backbone_factory or (
            lambda c: create_model(self.arch, in_channels=c))
        self.diagnostics = diagnostics
        self.transfer = cfg.search == "none"
        self.runner = TrialRunner(tracker, max_consecutive_errors=MAX_CONSECUTIVE_ERRORS)
        self.best = _BestSoFar()
        self.global_epoch = 0
        self.last_error = ""
        # trial -> (schedule progress, unlabeled-ramp share or None, why it stopped) at
        # its end: the selected trial's says whether a budget cut its schedules short
        self.schedule_end: dict[int, tuple[float, float | None, str]] = {}
        self.next_trial_s = 0.0  # the last trial's step + evaluation: what one more costs
        self.ran = 0  # trials this worker started (the others' are in the shared study)
        if resume is not None:
            self.global_epoch = resume.global_epoch
            self.best.restore(resume)

    def run_trials(self) -> None:
        """Trials until the budget or ``max_trials`` is spent (one for a given
        configuration)."""
        cfg = self.cfg
        _reap(self.store, self.tracker, self.study_key)  # a dead trial must not hold a slot
        # a new trial must have time for at least one step and its evaluation (at the
        # last trial's speed): otherwise it would only run past the budget
        while self.budget.remaining() > self.next_trial_s and (
                cfg.max_trials <= 0 or _started(self.store) < cfg.max_trials):
            _reap(self.store, self.tracker, self.study_key)
            trial = self.store.ask(self.budget.elapsed)
            if cfg.max_trials > 0 and self.store.started_before(trial.number) >= cfg.max_trials:
                # a worker took the slot
                self.store.tell(trial, state=optuna.trial.TrialState.PRUNED)
                break
            if not self._run_trial(trial):
                break

    def _hparams(self, trial: Any) -> dict[str, Any]:
        m = self.method_cls
        if self.cfg.search == "random":
            fixed = {k: v for k, v in m.defaults.items() if k not in m.search_space}
            return {**fixed, **sample(m.search_space, trial), **self.cfg.overrides}
        # transfer / fixed: the given configuration, else the literature defaults
        return {**m.defaults, **(self.cfg.hparams or {}), **self.cfg.overrides}

    def _run_trial(self, trial: Any) -> bool:
        """Train and record one trial; False when the search must stop after it."""
        number, hp, tc = trial.number, self._hparams(trial), self.train_cfg
        self.ran += 1
        seed = trial_seed(self.cfg.seed, number)
        torch.manual_seed(seed)  # model init; batches use their own generator
        g = torch.Generator().manual_seed(seed)
        self.tracker.start_trial(number, {**self.tags, T.ROLE: "trial", T.TRIAL: str(number)},
                                 {**hp, "batch_size": tc.batch_labeled,
                                  "unlabeled_batch_size": tc.batch_unlabeled,
                                  "arch": self.arch, "trial_seed": seed})
        method = self.method_cls(self.backbone_factory(self.bundle.channels),
                                 self.bundle.num_classes, hp)
        tc = dataclasses.replace(tc, budget_share_s=self._budget_share(number))
        callbacks: list[EpochCallback] = []
        if self.diagnostics is not None:
            callbacks.append(Diagnostics(self.diagnostics))
        callbacks.append(OnEpochEnd(
            lambda rep, improved, snap: self._on_epoch(trial, hp, method, rep, snap)))
        outcome = self.runner.run(
            number, lambda: train_trial(method, self.bundle, tc, deadline=self.budget,
                                        generator=g, probe_rng=np.random.default_rng(seed),
                                        callbacks=callbacks),
            on_fail=lambda: self.store.tell(trial, state=optuna.trial.TrialState.FAIL),
            fail_fatal=False)
        # the trial's best off the device (a failed trial's earlier best epoch too), and
        # its model, kept for the export: the next trial has the device to itself
        self.best.to_host()
        if self.best.method is method:
            method.to("cpu")
        if outcome.state != COMPLETE:
            self.last_error = outcome.error or ""
            return True
        res = outcome.value
        assert res is not None
        self.next_trial_s = res.step_s + res.eval_s
        self.schedule_end[number] = (res.progress, method.unlabeled_ramp(res.progress),
                                     res.stopped)
        if res.epochs == 0:  # budget ran out before one epoch: not a real trial
            self.runner.cut("budget exhausted before the first epoch", tell=lambda: (
                self.store.tell(trial, state=optuna.trial.TrialState.PRUNED)))
            return False
        self.runner.complete(
            tell=lambda: self.store.tell(trial, res.best_val),
            metrics={"best/val_balanced_accuracy": res.best_val, "best/epoch": res.best_epoch,
                     "epochs": res.epochs,
                     **{f"best/test_{k}": v for k, v in res.best_test.items()}},
            step=res.epochs, tags={T.STOPPED: res.stopped})
        self.best.upload(self.tracker, force=True)
        return self.cfg.search == "random"  # else one run of the given configuration

    def _budget_share(self, number: int) -> float | None:
        """``schedule_horizon=budget``: the budget seconds trial ``number`` plans its
        schedules over — what is left split evenly over the trials ``max_trials`` still
        allows (this one included); None (all that is left) without a trial cap, or for the
        one run of a given configuration."""
        cfg = self.cfg
        if cfg.max_trials <= 0 or cfg.search != "random":
            return None
        left = max(1, cfg.max_trials - self.store.started_before(number))
        return self.budget.remaining() / left

    def _on_epoch(self, trial: Any, hp: dict[str, Any], method: Method, rep: EpochReport,
                  snap: Callable[[], dict[str, Any]]) -> None:
        """Each epoch: the trial's metrics, the budget clock in the storage, and the
        study's best-so-far (a new best checkpoint taken and, rate-limited, uploaded)."""
        elapsed = self.budget.elapsed()
        self.store.record_elapsed(trial, elapsed)
        self.tracker.log_metrics({**rep.metrics, "time/elapsed_s": elapsed}, rep.epoch)
        best = self.best
        # strict ">": of tied checkpoints the first one (earliest trial / epoch) wins;
        # transfer: the latest epoch is the answer
        if rep.val_balanced_accuracy > best.val or self.transfer:
            b = self.bundle
            ckpt = {**snap(), "method": self.cfg.method, "arch": self.arch, "hp": hp,
                    "trial": trial.number, "num_classes": b.num_classes,
                    "in_channels": b.channels, "split_hash": self.split["hash"],
                    "test_metrics": dict(rep.test_metrics)}
            best.val, best.test, best.trial = rep.val_balanced_accuracy, rep.test_metrics, \
                trial.number
            best.ckpt, best.method, best.test_proba = ckpt, method, rep.test_proba
            best.dirty, best.on_host = True, False
        self.tracker.log_metrics(best.series(elapsed, self.budget.excluded_s),
                                 self.global_epoch, scope="study")
        self.global_epoch += 1
        best.upload(self.tracker, force=False)

    def finish(self) -> StudyResult:
        """The study's counts and answer: the best checkpoint uploaded, exported as the
        study's model, with its figures."""
        resume, best, cfg = self.resume, self.best, self.cfg
        if resume is not None and self.global_epoch == resume.global_epoch and \
                best.ckpt is not None:
            # resumed with nothing left to train (killed after its last trial): the record
            # that owns the study now ends its best/* series with the answer it reports, the
            # restored checkpoint, which the leaderboard reads
            self.tracker.log_metrics(best.series(self.budget.elapsed(), self.budget.excluded_s),
                                     self.global_epoch, scope="study")
        counts = self.store.counts()  # the whole study: earlier (killed) runs, other workers
        n_trials, n_failed = counts["complete"] + counts["failed"], counts["failed"]
        if (best.ckpt is None and self.ran == 0 and counts["complete"] and self.store.shared
                and 0 < cfg.max_trials <= _started(self.store)):
            return self._joined_late(n_trials, n_failed)
        if best.ckpt is None:
            if n_failed and n_failed == n_trials:
                raise TrialFailed(f"all {n_trials} trials of {cfg.method} failed; last error: "
                                  f"{self.last_error}")
            raise TrialFailed(
                f"no trial of {cfg.method} completed an epoch within {cfg.budget_minutes} min; "
                "raise budget_minutes or lower max_steps_per_epoch")
        best.upload(self.tracker, force=True)
        warning = schedule_warning(self.cfg, best.trial, self.schedule_end.get(best.trial))
        if warning:  # the closing summary prints it; the description carries it
            self.tracker.set_tags({T.SCHEDULE_SHORT: warning})
        self._export(n_trials, n_failed)
        return StudyResult(best_val=best.val, best_test=best.test, best_trial=best.trial,
                           n_trials=n_trials, n_failed=n_failed, split_hash=self.split["hash"],
                           best_checkpoint=best.ckpt, schedule_warning=warning)

    def _joined_late(self, n_trials: int, n_failed: int) -> StudyResult:
        """A worker that found every trial of its shared study taken by other workers: it
        trained nothing, so its record holds no model and no ``best/*`` series (the
        study's answer is on the records of the workers that ran the trials); it ends
        with the study's counts and best validation score, and says so."""
        best = self.store.study.best_trial
        assert best.value is not None  # best_trial is a completed trial: it has a value
        msg = (f"every one of the {self.cfg.max_trials} trials of study {self.store.name} "
               "was taken by other workers: this worker trained none (the study's model is "
               "on their records)")
        log.warning(msg)
        self.tracker.set_tags({T.N_TRIALS: str(n_trials), T.N_FAILED: str(n_failed),
                               T.BEST_TRIAL: str(best.number), T.NO_TRIAL_LEFT: msg})
        return StudyResult(best_val=float(best.value), best_test={}, best_trial=best.number,
                           n_trials=n_trials, n_failed=n_failed,
                           split_hash=self.split["hash"], best_checkpoint=None)

    def _export(self, n_trials: int, n_failed: int) -> None:
        """The selected checkpoint as the study's model, its counts as tags, its figures."""
        best, bundle = self.best, self.bundle
        assert best.ckpt is not None
        if best.method is None:  # the best is the checkpoint a resumed study restored
            best.method = _method_from_checkpoint(self.method_cls, best.ckpt, bundle)
        model = export_classifier(best.method, best.ckpt, bundle.meta["class_names"])
        model.transform = transform_of(bundle)  # the logged model replays it on raw images
        example = torch.rand(2, bundle.channels, *bundle.meta["resolution"])
        self.tracker.set_tags({T.N_TRIALS: str(n_trials),
                               T.N_FAILED: str(n_failed),
                               T.BEST_TRIAL: str(best.trial)})
        self.tracker.log_model(model, example)
        _log_figures(self.tracker, model, bundle, self.store, best.test_proba)


def _log_figures(tracker: Tracker, model: torch.nn.Module, bundle: DatasetBundle,
                 store: StudyStore, proba: np.ndarray | None = None) -> None:
    """The selected checkpoint's test predictions and the search's trials, for the
    tracker's figures; a failure here costs the figures, never the study. ``proba``: the
    test probabilities recorded when that checkpoint was evaluated (the ones its
    ``best/test_*`` metrics come from); only a checkpoint restored by a resumed study,
    which has none, is run over the test set again."""
    try:
        if proba is None:
            with torch.no_grad():
                x = torch.as_tensor(bundle.test_x)
                proba = torch.cat([torch.softmax(model(x[i:i + 512].float() / 255.0), 1)
                                   for i in range(0, len(x), 512)]).numpy()
        tracker.log_evaluation(np.asarray(bundle.test_y), proba,
                               list(bundle.meta["class_names"]),
                               positive_class=bundle.meta.get("positive_class"))
        tracker.log_search(store.study.get_trials())
    except Exception as e:  # noqa: BLE001 - figures are a convenience
        log.warning("study figures skipped: %s: %s", type(e).__name__, e)


def _study_key(cfg: StudyConfig, split_hash: str) -> str:
    """Identifies "the same command": every setting that changes what the search does."""
    # started_at differs per process and the reserve is accounting: neither changes what
    # the search does, so a re-run (resume) has the same key
    d = {k: v for k, v in dataclasses.asdict(cfg).items()
         if k not in ("storage", "study_name", "fresh_study", "device", "started_at",
                      "final_reserve_s")}
    # defaults of settings added later: studies keyed before them keep their key
    if d.get("label_fraction") == 1.0:
        d.pop("label_fraction")
    if d.get("budget_clock") == "wall":
        d.pop("budget_clock")
    if cfg.accel.is_auto:  # the given settings (like device, not what they resolve to)
        d.pop("accel")
    if d.get("data_options") is None:
        d.pop("data_options", None)
    if d.get("eval_every_steps") == 0:
        d.pop("eval_every_steps")
    if d.get("probe_solver") == "sklearn":
        d.pop("probe_solver")
    if d.get("schedule_horizon") == "epochs":
        d.pop("schedule_horizon")
    blob = json.dumps({**d, "split_hash": split_hash}, sort_keys=True, default=str)
    return "study-" + hashlib.sha256(blob.encode()).hexdigest()[:16]


def _open_store(cfg: StudyConfig, tracker: Tracker, key: str
                ) -> tuple[StudyStore, ResumeState | None]:
    """In memory, or the shared storage; there, continue a killed study of the same key.

    A new worker joins the open study of its command (issue 42: two workers of one
    command used to open a study each, ``<key>-<time>-<pid>``, and trained the same
    configurations twice over, each with its own ``max_trials``): the Optuna study is named
    after the key, so workers started together share one search, its trial numbers and its
    ``max_trials``, as ``StudyStore``'s counts already assume. A study that a worker
    finished is closed (``StudyStore.close_study``): the command run again starts a repeat,
    ``<key>-r2``, ``<key>-r3``, … (docs/tracking.md §3). ``cfg.study_name`` names the study
    outright; ``cfg.fresh_study`` asks for one of its own."""
    if not cfg.storage:
        return StudyStore(key, cfg.seed), None
    resume = tracker.resume_state(key)
    if resume is not None:
        store = StudyStore(resume.optuna_study, cfg.seed, cfg.storage)
    elif cfg.study_name:
        store = StudyStore(cfg.study_name, cfg.seed, cfg.storage)
    elif cfg.fresh_study:
        store = StudyStore(f"{key}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}", cfg.seed,
                           cfg.storage)
    else:
        store = StudyStore.open_shared(key, cfg.seed, cfg.storage)
    if resume is not None:
        tracker.close_orphan_trials(store.completed_numbers())
    return store, resume


def _reap(store: StudyStore, tracker: Tracker, key: str) -> None:
    """Trials whose process died are failed in the storage and in the tracker."""
    dead = store.fail_orphans()
    if dead:
        log.warning("trials %s were left running by a dead process: marked failed", dead)
        tracker.mark_trials_failed(key, dead, "the process running this trial died")


def _started(store: StudyStore) -> int:
    c = store.counts()
    return c["complete"] + c["failed"] + c["running"]


def _method_from_checkpoint(method_cls: type[Method], ckpt: dict[str, Any],
                            bundle: DatasetBundle) -> Method:
    m = method_cls(create_model(ckpt["arch"], in_channels=ckpt["in_channels"]),
                   ckpt["num_classes"], ckpt["hp"])
    m.on_train_start(data_info(bundle))
    return m


def parse_overrides(text: str | None) -> dict[str, Any]:
    """``"lambda_u=2,threshold=0.9"`` -> ``{"lambda_u": 2.0, "threshold": 0.9}`` (JSON values)."""
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        if "=" not in part:
            raise ConfigError(f"--set expects key=value pairs separated by commas, got {part!r}")
        k, v = part.split("=", 1)
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = v.strip()
    return out
