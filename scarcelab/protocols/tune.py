"""The "Tune It or Don't Use It" protocol (Brigato et al., ICCV 2021 workshops, VIPriors):
every method tuned the same way by ASHA, then the best configuration retrained 10 times.

Search (gem ``scripts/hpo.py`` + ``bash_scripts/bench_*.sh``, the authors' code):

* ``lr ~ logU(1e-4, 0.1)``, ``weight_decay ~ logU(1e-5, 0.1)``, batch size from the
  dataset's set (Table 2: {10, 25, 50} for ciFAIR-10 and EuroSAT, {8, 16, 32} for the
  224-px sets), plus the method's own hyperparameters (its ``search_space``).
* Asynchronous successive halving (reduction factor η = 2) on validation balanced
  accuracy: a trial reports, after every epoch, the mean validation balanced accuracy of
  its last five epochs (gem's default metric ``accuracy_avg5``, with balanced accuracy),
  and :class:`RayASHAPruner` decides at the rungs grace·η^k whether it continues — Ray
  Tune's ``ASHAScheduler`` rule, which gem ``scripts/hpo.py`` runs: a trial stops only if
  its value is below the (1 − 1/η) quantile of the values the other trials recorded at
  that rung (Ray ``async_hyperband._Bracket.cutoff`` / ``on_result``). The pruner reads
  the trials of the shared :class:`StudyStore`, so several workers (processes or
  machines, one RDB storage and one ``study_name``) make up one asynchronous study. The
  best configuration is the trial with the highest *last* reported value over all
  trials, stopped ones included (gem ``get_best_trial(metric, "max", "last")``).
* Every trial is a tracker run; a pruned one ends ``KILLED`` with the tags
  ``scarcelab.pruned=true`` and ``scarcelab.asha_rung`` and the metric ``asha/pruned_epoch``.

Final training: the best configuration trained on train+val (``trainval``) ``n_final``
(10) times with different seeds, each for ``epochs_final`` epochs (gem ``full_train.py
--epochs-f``; the search's ``epochs`` unless the dataset or the user sets it) with no
model selection, the last epoch evaluated on the test set; one tracker run per retrain
(``scarcelab.role=retrain``) under the study, the study logging every retrain's test
balanced accuracy (``final/test_balanced_accuracy``, step = retrain index) and their mean
and sample standard deviation. Retrain ``i`` uses the seed :func:`retrain_seed` ``(seed, i)``,
so an interrupted final phase can be continued (:class:`FinalResume`): the retrains that
finished are kept, the missing indices run with exactly the seeds they would have had, and
the mean and std are recomputed over all ``n_final``.

An interrupted search is continued the same way (:class:`SearchResume`): the trials the
dead process finished, pruned or failed are rebuilt in a new Optuna study from their record
(trial ``n`` is asked as ``n`` again, so it draws the same configuration, and reports the
values it reported), the trial that was running is run again from its start with its own
seed, and the search goes on. ASHA's decisions depend only on the values recorded at each
rung, so the continued study prunes what the uninterrupted one prunes and ends with the
same best configuration and final retrains (tests/tracking/test_tune_resume.py).
In a shared storage the dead trial is instead failed as crashed and queued to run again in
its own place (:func:`slot`): same configuration, seed and record number; ASHA's cutoff
ignores crashed trials.

Preprocessing: channel normalisation with the statistics of the ``trainval`` split
(:class:`scarcelab.models.standardize.Standardized`), per-dataset augmentation (names in
``scarcelab.data.augment``). The RandomResizedCrop sets train on the *whole* image (gem
``BasicAugmentation.get_data_transforms``: ``RandomResizedCrop`` on the decoded original):
the dataset's ``whole_images`` loader stores every training image uncropped, and the
crop box is drawn in the original's pixels; evaluation uses the stored short-side resize +
centre crop (gem's test transform ``Resize`` + ``CenterCrop``).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import math
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import optuna
import torch
from optuna.trial import TrialState

import scarcelab
from scarcelab import tags as T
from scarcelab.accel import NAMES as ACCEL_NAMES
from scarcelab.accel import Accel
from scarcelab.data import DATASETS, load_raw
from scarcelab.data.augment import AUGMENTATIONS
from scarcelab.data.bundle import DatasetBundle, RawDataset, resolve_positive_class
from scarcelab.data.own import dataset_label, is_own
from scarcelab.errors import ConfigError, DataError, TrialFailed
from scarcelab.methods import get_method
from scarcelab.methods.base import Method
from scarcelab.methods.space import sample
from scarcelab.metrics import classification_metrics
from scarcelab.models import create_model
from scarcelab.models.image_input import transform_of
from scarcelab.models.standardize import Standardized, channel_stats
from scarcelab.protocols.study_store import StudyStore, TrialSeededSampler, redact
from scarcelab.tracker import DatasetInfo, Tracker
from scarcelab.train import (
    EpochReport,
    OnEpochEnd,
    SnapshotFn,
    TrainConfig,
    TrialResult,
    export_classifier,
    forward_images,
    train_trial,
)
from scarcelab.trials import COMPLETE, TrialPruned, TrialRunner, trial_seed

log = logging.getLogger("scarcelab")

REDUCTION_FACTOR = 2  # gem scripts/hpo.py --reduction-factor default
AVG_WINDOW = 5  # gem's "accuracy_avg5": mean of the last five validation evaluations


@dataclass(frozen=True)
class TuneSettings:
    """One dataset's protocol settings (paper Table 2 / gem ``bench_<dataset>.sh``).

    ``epochs_final`` is the final retraining's epoch count (gem ``full_train.py
    --epochs-f``); None = ``epochs``, gem's default for every dataset of its scripts."""

    arch: str
    epochs: int
    grace_period: int
    n_trials: int
    batch_sizes: tuple[int, ...]
    augmentation: str
    source: str = "gem bash_scripts"
    epochs_final: int | None = None

    @property
    def final_epochs(self) -> int:
        return self.epochs_final or self.epochs


SETTINGS: dict[str, TuneSettings] = {
    "cifair10": TuneSettings("wrn16_8", 500, 50, 250, (10, 25, 50), "deic_shift_hflip"),
    "eurosat": TuneSettings("resnet50_imagenet", 500, 25, 250, (10, 25, 50), "deic_shift_hvflip"),
    "cub": TuneSettings("resnet50_imagenet", 200, 10, 100, (8, 16, 32), "deic_rrc40_hflip"),
    "isic2018": TuneSettings("resnet50_imagenet", 500, 25, 100, (8, 16, 32), "deic_rrc40_hvflip"),
    "clamm": TuneSettings("resnet50_imagenet", 500, 25, 100, (8, 16, 32), "deic_rrc20"),
    # ImageNet (50/class) is in the ICCV paper but not in gem's scripts (gem dropped it):
    # the paper's Table 2 trains 200 epochs in the search, 500 in the final training,
    # with 100 trials and a grace period of 10
    "imagenet50": TuneSettings("resnet50_imagenet", 200, 10, 100, (8, 16, 32),
                               "deic_rrc10_hflip", source="paper Table 2",
                               epochs_final=500),
}
# Datasets outside the benchmark that carry a fixed validation split (tests, smoke runs).
GENERIC = TuneSettings("small_cnn", 20, 2, 20, (16, 32, 64), "weak", source="scarcelab")


@dataclass
class TuneConfig:
    method: str
    dataset: str = "cifair10"
    data_dir: str | None = None
    arch: str | None = None  # None = the dataset's (WRN-16-8 / ResNet-50)
    seed: int = 0
    epochs: int | None = None
    epochs_final: int | None = None  # None = the dataset's (gem --epochs-f), else epochs
    grace_period: int | None = None
    n_trials: int | None = None
    batch_sizes: tuple[int, ...] | None = None
    n_final: int = 10
    phase: str = "all"  # "all" | "search" | "final"
    max_steps_per_epoch: int | None = None
    budget_minutes: float = 0.0  # 0 = no wall-clock cap on the search
    device: str = "cpu"
    overrides: dict[str, Any] = field(default_factory=dict)
    storage: str | None = None
    study_name: str | None = None
    # precision and kernels of every trial and retrain (scarcelab.accel; ``auto``: per
    # device), logged resolved as the params precision, channels_last, ...
    accel: Accel = field(default_factory=Accel)
    # a user's images (folder:/csv:, with a val/ set): scarcelab.data.own.DataOptions
    data_options: Any = None

    def resolved_accel(self) -> Accel:
        """:attr:`accel` as the trials and retrains run it (the epoch loop's resolution)."""
        return TrainConfig(device=self.device, accel=self.accel).resolved_accel()

    def settings(self) -> TuneSettings:
        """The resolved settings. The final epoch count follows gem's ``full_train.py``:
        ``--epochs-f`` when given, else the search's epochs; a dataset's published final
        count (ImageNet: 500) applies only while the search's epochs are the published
        ones too, so ``--epochs 12`` gives a 12-epoch final training, not a 500-epoch one."""
        base = SETTINGS.get(self.dataset) or GENERIC
        epochs = self.epochs or base.epochs
        final = self.epochs_final or (base.epochs_final if self.epochs is None else None)
        s = dataclasses.replace(
            base, arch=self.arch or base.arch, epochs=epochs,
            epochs_final=final or epochs,
            grace_period=self.grace_period or base.grace_period,
            n_trials=self.n_trials or base.n_trials,
            batch_sizes=tuple(self.batch_sizes or base.batch_sizes))
        for name in ("epochs", "epochs_final", "grace_period", "n_trials"):
            if getattr(s, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(s, name)}; pass "
                                  f"--{name.replace('_', '-')}")
        if s.grace_period > s.epochs:
            raise ConfigError(f"grace_period ({s.grace_period}) exceeds epochs ({s.epochs}): "
                              "no trial could ever be pruned; lower --grace-period")
        return s


def retrain_seed(seed: int, index: int) -> int:
    """The seed of final retrain ``index`` (0-based) of a study with seed ``seed``: a pure
    function of the two, so a resumed retrain is the one the dead process would have run."""
    return seed * 1_000_003 + 7_919 * (index + 1)


# what a resume compares between the study's recorded params and the ones it resolves now:
# a difference means different data or code defaults, and mixing the retrains would be wrong
RESUME_CHECKED = ("method", "dataset", "arch", "seed", "epochs", "epochs_final", "n_final",
                  "max_steps_per_epoch", "augmentation", "train_images", "test_set",
                  "n_train", "n_val", "n_test", *ACCEL_NAMES)


@dataclass(frozen=True)
class FinalResume:
    """What an interrupted final phase left behind, as plain data (the tracking layer reads
    it from its store; the core never sees the store): the best configuration it was
    retraining, the test balanced accuracy of each retrain that finished (by index), the
    indices whose study-level ``final/test_balanced_accuracy`` is already recorded (not
    logged twice), and the study's recorded parameters, checked against the resolved ones."""

    best_params: dict[str, Any]
    done: dict[int, float] = field(default_factory=dict)
    logged: frozenset[int] = frozenset()
    recorded: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PriorTrial:
    """One trial of an interrupted search as its record holds it: ``state`` is
    ``complete``, ``pruned``, ``failed`` or ``budget`` (cut by the wall-clock cap),
    ``reports`` the (step, value) pairs it gave ASHA, ``value`` its final value (complete
    only), ``params`` its recorded parameters (text, checked against the redrawn ones)."""

    number: int
    state: str
    reports: tuple[tuple[int, float], ...] = ()
    value: float | None = None
    params: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SearchResume:
    """What an interrupted search left behind, as plain data: its finished trials (the
    one that was running is not among them: it runs again), the wall-clock time the search
    had spent (it counts against ``budget_minutes``) and the study's recorded params."""

    trials: tuple[PriorTrial, ...] = ()
    elapsed_s: float = 0.0
    recorded: dict[str, str] = field(default_factory=dict)
    shared: bool = False  # the trials live in ``TuneConfig.storage``: continue that study


# what a resumed search must agree on besides RESUME_CHECKED: the search itself
SEARCH_CHECKED = ("n_trials", "grace_period", "batch_sizes", "budget_minutes")


def _param_text(v: Any) -> str:
    """How trackers render a parameter value (``tracking.mlflow_tracker._param_value``)."""
    return v if isinstance(v, str) else json.dumps(v, default=str)


def _check_recorded(resume: FinalResume | SearchResume, params: dict[str, Any],
                    keys: tuple[str, ...] = RESUME_CHECKED) -> None:
    diff = []
    for k in keys:
        was = resume.recorded.get(f"resolved.{k}", resume.recorded.get(k))
        if was is not None and k in params and was != _param_text(params[k]):
            diff.append(f"{k}: recorded {was}, now {_param_text(params[k])}")
    if diff:
        raise ConfigError("cannot resume the study: it was run with other "
                          "settings or data than this process resolves (" + "; ".join(diff)
                          + "); point --data-dir at the data the study used")


def _check_same_images(cfg: TuneConfig, resume: FinalResume | SearchResume) -> None:
    """A study on a user's images continues only on the images it was run on: the decode
    cache key (``data.cache_key``: every file's content in order, the transform and the
    decoder's versions) the load just computed must be the one the study logged. The
    counts RESUME_CHECKED compares miss a changed file, and the options alone (read back
    from the study) miss a folder whose files changed since."""
    from scarcelab.data import provenance

    was = resume.recorded.get("data.cache_key")
    now = provenance.described().get("params", {}).get("data.cache_key")
    if was and now and was != now:
        raise ConfigError(f"cannot resume the study: the images of {cfg.dataset} are not the "
                          f"ones it was run on (data.cache_key recorded {was[:12]}…, now "
                          f"{now[:12]}…: a file was added, removed or changed, or Pillow/"
                          "pydicom has another version); restore the files the study's "
                          "data_manifest.json lists, or start a new study")


@dataclass
class TuneResult:
    study_name: str
    n_complete: int
    n_pruned: int
    n_failed: int
    best_params: dict[str, Any]
    best_value: float
    final_test: list[float]
    kept: list[int] = field(default_factory=list)  # retrains an earlier process finished
    ran: list[int] = field(default_factory=list)  # retrains this process ran

    @property
    def mean(self) -> float:
        return float(np.mean(self.final_test)) if self.final_test else math.nan

    @property
    def std(self) -> float:
        return float(np.std(self.final_test, ddof=1)) if len(self.final_test) > 1 else 0.0


def asha_rung(epoch: int, grace: int, factor: int = REDUCTION_FACTOR) -> int:
    """The rung a trial stopping at ``epoch`` (1-based) was judged at: rung k sits at
    epoch grace·factor^k."""
    if epoch < grace:
        return -1
    return int(math.floor(math.log(epoch / grace, factor) + 1e-9))


def asha_milestones(grace: int, max_t: int, factor: int = REDUCTION_FACTOR) -> list[int]:
    """The rungs of Ray Tune's ASHA with one bracket (``_Bracket(min_t=grace, max_t,
    reduction_factor, s=0)``): grace·factor^k for k < ⌊log(max_t/grace)/log(factor)⌋ + 1."""
    n = int(np.log(max_t / grace) / np.log(factor) + 1)
    return [grace * factor**k for k in range(n)]


def _recorded(steps: list[tuple[int, float]], milestones_desc: list[int]) -> dict[int, float]:
    """The values a trial with these (step, value) reports has left at each rung in Ray's
    bookkeeping: on every report, the highest rung at or below the step that holds no value
    of this trial yet receives the reported value (``_Bracket.on_result``)."""
    rec: dict[int, float] = {}
    for step, value in steps:
        for m in milestones_desc:
            if step >= m and m not in rec:
                rec[m] = value
                break
    return rec


class RayASHAPruner(optuna.pruners.BasePruner):
    """Ray Tune's asynchronous successive halving (``ASHAScheduler``, one bracket, mode
    max) as an Optuna pruner, so that it runs on the shared :class:`StudyStore`.

    On a trial's report at step t (< ``max_t``; at ``max_t`` a Ray trial ends instead of
    being judged) that reaches a rung m it holds no value at yet, the trial is stopped iff
    its value is below ``nanpercentile(v, (1 - 1/η)·100)`` of the values ``v`` the *other*
    trials recorded at m so far (any state: Ray keeps a stopped or failed trial's value);
    with no value recorded there, it continues. Optuna's ``SuccessiveHalvingPruner``
    instead keeps only the top ``⌊n/η⌋`` (at least one) of all n values, its own included —
    with three trials at a rung only the best continues, where Ray keeps every trial at or
    above the median of the two before it."""

    def __init__(self, grace_period: int, max_t: int,
                 reduction_factor: int = REDUCTION_FACTOR) -> None:
        if grace_period < 1 or max_t < grace_period or reduction_factor < 2:
            raise ConfigError(f"ASHA needs 1 <= grace_period <= max_t and reduction_factor "
                              f">= 2, got {grace_period}, {max_t}, {reduction_factor}")
        self.grace_period, self.max_t, self.reduction_factor = (
            grace_period, max_t, reduction_factor)
        self.milestones = asha_milestones(grace_period, max_t, reduction_factor)
        self._desc = sorted(self.milestones, reverse=True)

    def rung_to_judge(self, steps: list[tuple[int, float]]) -> int | None:
        """The rung the last of these reports is judged at, or None (no new rung)."""
        if not steps or steps[-1][0] >= self.max_t:
            return None
        before = _recorded(steps[:-1], self._desc)
        step = steps[-1][0]
        return next((m for m in self._desc if step >= m and m not in before), None)

    def cutoff(self, values: list[float]) -> float | None:
        """Ray's ``_Bracket.cutoff``: the (1 − 1/η) quantile (linear interpolation)."""
        if not values:
            return None
        return float(np.nanpercentile(values, (1 - 1 / self.reduction_factor) * 100))

    def prune(self, study: optuna.study.Study, trial: optuna.trial.FrozenTrial) -> bool:
        steps = sorted(trial.intermediate_values.items())
        rung = self.rung_to_judge(steps)
        if rung is None:
            return False
        others = []
        for t in study.get_trials(deepcopy=False):
            if t.number == trial.number or not t.intermediate_values or \
                    t.user_attrs.get("crashed"):
                continue  # a crashed trial runs again (its slot): it counts once
            rec = _recorded(sorted(t.intermediate_values.items()), self._desc)
            if rung in rec:
                others.append(rec[rung])
        cut = self.cutoff(others)
        return cut is not None and bool(steps[-1][1] < cut)


def last_value(t: optuna.trial.FrozenTrial) -> float:
    """A trial's last reported value (its value when it finished)."""
    if t.state == TrialState.COMPLETE and t.value is not None:
        return float(t.value)
    if not t.intermediate_values:
        return math.nan
    return float(t.intermediate_values[max(t.intermediate_values)])


def best_trial(trials: list[optuna.trial.FrozenTrial]) -> optuna.trial.FrozenTrial | None:
    """gem's choice, ``get_best_trial(metric, "max", "last")`` over Ray's trials: the
    highest *last* reported value over every trial that was not lost — finished ones and
    ones ASHA stopped alike; NaN / infinite values skipped; among equal values the first
    trial. Failed trials (an exception, a non-finite loss, a wall-clock cut) are left out
    (Ray would still rank an errored trial by its last report): a configuration that
    crashed or diverged is not retrained."""
    cand = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
            and math.isfinite(last_value(t))]
    return max(cand, key=lambda t: (last_value(t), -t.number)) if cand else None


# -- data ---------------------------------------------------------------------------------


def _bundle(x: np.ndarray, y: np.ndarray, vx: np.ndarray, vy: np.ndarray, tx: np.ndarray,
            ty: np.ndarray, raw: RawDataset, sizes: np.ndarray | None = None
            ) -> DatasetBundle:
    meta: dict[str, Any] = {
        "name": raw.name, "num_classes": raw.num_classes, "class_names": raw.class_names,
        "resolution": list(raw.resolution), "source": raw.source, "md5": raw.md5}
    if sizes is not None:  # x holds whole images: the crops are cut from the originals
        meta["labeled_geometry"] = {"sizes": sizes, "out_size": raw.resolution[0]}
    return DatasetBundle(labeled_x=x, labeled_y=y, unlabeled_x=x[:0], val_x=vx, val_y=vy,
                         test_x=tx, test_y=ty, meta=meta)


def whole_images(dataset: str, data_dir: str | None, raw: RawDataset
                 ) -> dict[str, np.ndarray] | None:
    """The dataset's whole-image training store (its loader's ``whole_images``), checked
    against ``raw`` row by row; None when the dataset has none."""
    if is_own(dataset):  # a user's images are stored at the size they train at
        return None
    fn = getattr(DATASETS.get(dataset), "whole_images", None)
    if fn is None:
        return None
    whole = fn(data_dir)
    for split, y in (("train", raw.train_y), ("val", raw.val_y)):
        if y is None or not np.array_equal(whole[f"{split}_y"], y):
            raise DataError(f"the whole-image {split} store of {dataset} does not list the "
                            "same images as its evaluation copy; delete its whole_*.npz "
                            "cache next to the images to rebuild it")
    return whole


def prepare(raw: RawDataset, whole: dict[str, np.ndarray] | None = None
            ) -> tuple[DatasetBundle, DatasetBundle, np.ndarray, np.ndarray]:
    """(search bundle: train / val, final bundle: trainval, normalisation mean, std).

    The search bundle's test slot holds the validation set (test data is never looked at
    while searching); the final bundle evaluates on ``trainval`` per epoch (cheap training
    accuracy) and the test set once, after the last epoch. With ``whole`` (the
    :func:`whole_images` store) the images trained on are the whole originals, and only
    evaluation uses the stored centre crops; the normalisation statistics come from the
    centre crops either way (gem ``compute_normalization_statistics``: ``Resize`` +
    ``CenterCrop``)."""
    if raw.val_x is None or raw.val_y is None:
        if raw.unlabeled_x is not None:  # a user's images: say where the split goes
            raise ConfigError(f"{raw.name} has no validation set; the tune protocol trains "
                              "on train + val and needs a fixed one: add val/<class>/ images "
                              "to the folder (CSV: rows with split val)")
        raise ConfigError(f"dataset {raw.name!r} has no fixed validation split; the tune "
                          "protocol needs published train/val/test splits (e.g. cifair10)")
    tv_x = np.concatenate([raw.train_x, raw.val_x])
    tv_y = np.concatenate([raw.train_y, raw.val_y])
    mean, std = channel_stats(tv_x)
    if whole is None:
        search = _bundle(raw.train_x, raw.train_y, raw.val_x, raw.val_y, raw.val_x,
                         raw.val_y, raw)
        final = _bundle(tv_x, tv_y, tv_x, tv_y, tv_x, tv_y, raw)
        return search, final, mean, std
    search = _bundle(whole["train_x"], raw.train_y, raw.val_x, raw.val_y, raw.val_x,
                     raw.val_y, raw, sizes=whole["train_hw"])
    final = _bundle(np.concatenate([whole["train_x"], whole["val_x"]]), tv_y, tv_x, tv_y,
                    tv_x, tv_y, raw, sizes=np.concatenate([whole["train_hw"],
                                                           whole["val_hw"]]))
    return search, final, mean, std


def build_method(method_cls: type[Method], arch: str, raw: RawDataset, mean: np.ndarray,
                 std: np.ndarray, hp: dict[str, Any]) -> Method:
    # Standardized reads mean and std with np.asarray: an array is the sequence it takes
    backbone = Standardized(create_model(arch, in_channels=raw.channels),
                            cast("Sequence[float]", mean), cast("Sequence[float]", std))
    return method_cls(backbone, raw.num_classes, hp)


# -- the protocol -------------------------------------------------------------------------


def _counted(store: StudyStore) -> int:
    """Trials that took a slot of ``n_trials``: finished, pruned, failed or running —
    not crashed ones and not the surplus ones a worker gave back."""
    n = 0
    for t in store.study.get_trials(deepcopy=False):
        if t.user_attrs.get("crashed") or t.user_attrs.get("surplus"):
            continue
        n += t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL,
                         TrialState.RUNNING)
    return n


def slot(t: optuna.trial.FrozenTrial | optuna.trial.Trial) -> int:
    """The place of a trial in the search: its number, unless it reruns a crashed trial
    (then the crashed trial's place, user attribute ``slot``). Configuration, seed and the
    trial's record number are functions of the slot, so a trial killed with its process
    runs again as itself and the search is the one an uninterrupted run makes."""
    attrs = t.user_attrs
    return int(attrs.get("slot", t.number))


class SlotSampler(TrialSeededSampler):
    """:class:`TrialSeededSampler` keyed on the trial's :func:`slot` instead of its
    number: a rerun of crashed trial ``k`` draws trial ``k``'s configuration."""

    def sample_independent(self, study: Any, trial: optuna.trial.FrozenTrial,
                           param_name: str, param_distribution: Any) -> Any:
        if slot(trial) != trial.number:
            trial = copy.copy(trial)  # the parent class reads only the number
            trial.number = slot(trial)
        return super().sample_independent(study, trial, param_name, param_distribution)


def _requeue_crashed(store: StudyStore) -> list[int]:
    """Queue a rerun for every crashed trial whose slot no live trial holds (shared
    storage only: a crash is a dead worker's trial). Optuna hands a queued trial to the
    next ``ask`` of any worker, once; two workers queueing the same slot at once are
    sorted out when the second copy is asked (:func:`_claim`)."""
    trials = store.study.get_trials(deepcopy=False)
    crashed = {slot(t) for t in trials if t.user_attrs.get("crashed")}
    held = {slot(t) for t in trials
            if not t.user_attrs.get("crashed") and not t.user_attrs.get("surplus")}
    for k in sorted(crashed - held):
        store.study.enqueue_trial({}, user_attrs={"slot": k, "rerun_of": k})
    return sorted(crashed - held)


def _claim(store: StudyStore, trial: optuna.trial.Trial, n_trials: int) -> int | None:
    """The slot ``trial`` takes, or None when it has none left (surplus). A fresh
    trial's slot is its number less the reruns numbered before it (a rerun takes a number
    but no new slot); a rerun's is the one it reruns, unless another live trial with a
    smaller number holds it already."""
    trials = store.study.get_trials(deepcopy=False)
    if "rerun_of" in trial.user_attrs:
        k = slot(trial)
        taken = any(t.number < trial.number and slot(t) == k and "slot" in t.user_attrs
                    and not t.user_attrs.get("crashed") and not t.user_attrs.get("surplus")
                    for t in trials)
        return None if taken else k
    k = trial.number - sum(1 for t in trials
                           if t.number < trial.number and "rerun_of" in t.user_attrs)
    if k >= n_trials:
        return None
    trial.set_user_attr("slot", k)
    return k


def _check_config(cfg: TuneConfig, method_cls: type[Method],
                  resume: FinalResume | SearchResume | None) -> None:
    """Refuse a configuration the protocol cannot run before any data loads."""
    if method_cls.family != "supervised" or method_cls.linear_probe:
        raise ConfigError(f"method {cfg.method!r} is {method_cls.family}"
                          f"{' (linear probe)' if method_cls.linear_probe else ''}; the tune "
                          "protocol trains supervised classifiers (scarcelab list methods)")
    if cfg.phase not in ("all", "search", "final"):
        raise ConfigError(f"phase={cfg.phase!r}: valid are 'all', 'search', 'final'")
    if cfg.n_final < 1 and (cfg.phase != "search" or resume is not None):
        raise ConfigError(f"n_final must be >= 1, got {cfg.n_final}")
    if isinstance(resume, FinalResume) and not set(resume.done) <= set(range(cfg.n_final)):
        raise ConfigError(f"finished retrains {sorted(resume.done)} lie outside the study's "
                          f"n_final = {cfg.n_final}")
    unknown = set(cfg.overrides) - set(method_cls.search_space) - set(method_cls.defaults)
    if unknown:
        valid = sorted(set(method_cls.search_space) | set(method_cls.defaults))
        raise ConfigError(f"unknown hyperparameter(s) {sorted(unknown)} for {cfg.method}; "
                          f"valid: {valid}")


def _load(cfg: TuneConfig, s: TuneSettings
          ) -> tuple[RawDataset, DatasetBundle, DatasetBundle, np.ndarray, np.ndarray]:
    """The dataset and its search and final bundles (whole images when the augmentation
    crops from the originals), with the ``trainval`` normalisation."""
    raw = load_raw(cfg.dataset, cfg.data_dir, cfg.data_options)
    crops_whole = getattr(AUGMENTATIONS.get(s.augmentation), "takes_geometry", False)
    whole = whole_images(cfg.dataset, cfg.data_dir, raw) if crops_whole else None
    return (raw, *prepare(raw, whole))


def _dataset_info(raw: RawDataset) -> DatasetInfo:
    assert raw.val_y is not None  # prepare() refuses a dataset without a validation split
    digest = f"{raw.md5 or raw.source}:{len(raw.train_y)}:{len(raw.val_y)}:{len(raw.test_y)}"
    return DatasetInfo(name=raw.name, source=raw.source or raw.name,
                       digest=hashlib.sha256(digest.encode()).hexdigest()[:16])


@contextmanager
def _closed(tracker: Tracker) -> Iterator[None]:
    """Close a study record opened already (a resumed search's): FINISHED, or FAILED when
    anything escapes. Not :meth:`Tracker.open_study`: the resumed record is reopened
    before its trials are rebuilt, and a resume its records refuse leaves it as it was."""
    status = "FINISHED"
    try:
        yield
    except BaseException:
        status = "FAILED"
        raise
    finally:
        tracker.end_study(status)


def _continue_search(cfg: TuneConfig, s: TuneSettings, method_cls: type[Method],
                     store: StudyStore, tracker: Tracker, resume: SearchResume,
                     tags: dict[str, str], params: dict[str, Any], title: str
                     ) -> dict[str, str]:
    """Reopen the dead process's study record (its params stay) and put its trials back
    into ``store``; the tags of the trials run from here on."""
    _check_recorded(resume, params, RESUME_CHECKED + SEARCH_CHECKED)
    tracker.start_study(name=title, tags=tags, params={}, artifacts={})
    kept = [t.number for t in resume.trials] if resume.shared else \
        _rebuild(store, resume, method_cls, s, cfg.overrides)
    tracker.set_tags({T.SEARCH_KEPT: ",".join(map(str, kept)),
                      T.SEARCH_RESUMED_AT: str(len(kept))})
    return {**tags, T.RESUMED: "true"}


def _phases(cfg: TuneConfig, s: TuneSettings, method_cls: type[Method], raw: RawDataset,
            search_b: DatasetBundle, final_b: DatasetBundle, mean: np.ndarray,
            std: np.ndarray, store: StudyStore, tracker: Tracker, tags: dict[str, str],
            name: str, spent: float) -> list[float]:
    """The search (what ``cfg.phase`` asks for of it), the study's counts and best trial,
    then the final retrains of that trial; their test scores."""
    deadline = time.time() - spent + cfg.budget_minutes * 60.0 \
        if cfg.budget_minutes > 0 else math.inf
    if cfg.phase in ("all", "search"):
        _Search(cfg, s, method_cls, raw, search_b, mean, std, store, tracker, tags,
                deadline).run()
    counts = _state_counts(store)
    tracker.set_tags({T.N_COMPLETE: str(counts["complete"]),
                      T.N_PRUNED: str(counts["pruned"]), T.N_FAILED: str(counts["failed"])})
    best = _best(store)
    if best is not None:
        tracker.set_tags({T.BEST_TRIAL: str(best.number),
                          T.BEST_TRIAL_STATE: best.state.name.lower(),
                          T.BEST_PARAMS: json.dumps(best.params, sort_keys=True)})
        tracker.log_metrics({"best/val_balanced_accuracy_avg5": last_value(best)}, 0,
                            scope="study")
    if cfg.phase not in ("all", "final"):
        return []
    if best is None:
        raise TrialFailed(f"study {name} has no finished or stopped trial to retrain; run "
                          "the search first (phase=search) or raise n_trials")
    return _final(cfg, s, method_cls, raw, final_b, mean, std, best.params, tracker, tags)


def run_tune(cfg: TuneConfig, tracker: Tracker,
             resume: FinalResume | SearchResume | None = None) -> TuneResult:
    """The search and/or the final retraining of ``cfg``; with a :class:`FinalResume`,
    only the final retrains it lacks, on the study record the tracker was attached to (no
    search, no Optuna study: the best configuration is ``resume.best_params``); with a
    :class:`SearchResume`, the rest of the search (its trials rebuilt, the missing ones
    run) and then the final retraining, on that record."""
    method_cls = get_method(cfg.method)
    _check_config(cfg, method_cls, resume)
    s = cfg.settings()
    create_model(s.arch, in_channels=1)  # fail fast on an unknown arch
    raw, search_b, final_b, mean, std = _load(cfg, s)
    if resume is not None:
        _check_same_images(cfg, resume)
    title = f"tune-{method_cls.registered_name}-{dataset_label(cfg.dataset)}-s{cfg.seed}"
    name = cfg.study_name or f"{title}-{time.strftime('%Y%m%dT%H%M%S')}"
    if isinstance(resume, FinalResume):
        return _resume_final(cfg, s, method_cls, raw, final_b, mean, std, name, tracker,
                             resume, train_images(search_b))
    store = StudyStore(name, cfg.seed, None if isinstance(resume, SearchResume)
                       and not resume.shared else cfg.storage)
    store.study.pruner = RayASHAPruner(s.grace_period, s.epochs)
    store.study.sampler = SlotSampler(cfg.seed)
    tags, resolved, params = _study_record(cfg, s, method_cls, raw, mean, std, name,
                                           train_images(search_b))
    if resume is not None:  # the dead process's study record, continued: params stay
        tags = _continue_search(cfg, s, method_cls, store, tracker, resume, tags, params,
                                title)
        record: AbstractContextManager[Any] = _closed(tracker)
    else:
        record = tracker.open_study(title, tags, params, {"config.json": resolved},
                                    dataset=_dataset_info(raw))
    with record:
        try:
            final = _phases(cfg, s, method_cls, raw, search_b, final_b, mean, std, store,
                            tracker, tags, name,
                            resume.elapsed_s if resume is not None else 0.0)
        finally:
            store.close()
    best = _best(store)
    counts = _state_counts(store)
    return TuneResult(study_name=name, n_complete=counts["complete"], n_pruned=counts["pruned"],
                      n_failed=counts["failed"], best_params=dict(best.params) if best else {},
                      best_value=last_value(best) if best else math.nan, final_test=final)


def train_images(search: DatasetBundle) -> str:
    """What the training crops are cut from, for the record: ``whole <side>px`` (the
    originals, stored whole) or ``stored <side>px`` (the stored evaluation image)."""
    kind = "whole" if "labeled_geometry" in search.meta else "stored"
    return f"{kind} {search.labeled_x.shape[-1]}px"


def _study_record(cfg: TuneConfig, s: TuneSettings, method_cls: type[Method], raw: RawDataset,
                  mean: np.ndarray, std: np.ndarray, name: str, images: str
                  ) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
    """The study's tags, its resolved configuration (``config.json``) and its params. The
    data's ``notes`` (e.g. ``test_set``: a stand-in for the official test set) become tags
    of the study and of every trial and retrain, so a table built from them says so."""
    assert raw.val_y is not None  # prepare() refuses a dataset without a validation split
    notes = {"test_set": "official", **raw.notes}
    tags = {T.ROLE: "study", T.PROTOCOL: "tune",
            T.FAMILY: "supervised", T.METHOD: method_cls.registered_name,
            T.DATASET: cfg.dataset, T.SEED: str(cfg.seed),
            T.VERSION: scarcelab.__version__, T.ARCH: s.arch,
            T.SEARCH: "asha", T.STUDY_KEY: name,
            T.OPTUNA_STUDY: name, T.TUNE_PHASE: cfg.phase,
            **{T.note(k): v for k, v in notes.items()}}
    resolved = {**dataclasses.asdict(cfg), **dataclasses.asdict(s),
                "accel": cfg.resolved_accel().params(),
                "train_images": images, "test_set": notes["test_set"],
                "storage": redact(cfg.storage), "norm_mean": mean.round(5).tolist(),
                "norm_std": std.round(5).tolist(), "n_train": len(raw.train_y),
                "n_val": len(raw.val_y), "n_test": len(raw.test_y),
                "search_space": {k: d.describe() for k, d in method_cls.search_space.items()}}
    resolved.pop("data_options")  # a user's images: the options, flat, as entered
    if cfg.data_options is not None:
        resolved.update(cfg.data_options.params())
    params = {k: v for k, v in resolved.items()
              if k not in ("overrides", "search_space", "norm_mean", "norm_std", "accel")}
    params.update(resolved["accel"])  # precision=..., channels_last=..., as the CLI names
    params.update({f"override.{k}": v for k, v in cfg.overrides.items()})
    return tags, resolved, params


def _resume_final(cfg: TuneConfig, s: TuneSettings, method_cls: type[Method], raw: RawDataset,
                  bundle: DatasetBundle, mean: np.ndarray, std: np.ndarray, name: str,
                  tracker: Tracker, resume: FinalResume, images: str) -> TuneResult:
    """Continue an interrupted final phase on its own study record: nothing but the
    missing retrains runs; the record's params and ``config.json`` stay as they were."""
    tags, _, params = _study_record(cfg, s, method_cls, raw, mean, std, name, images)
    _check_recorded(resume, params)
    missing = [i for i in range(cfg.n_final) if i not in resume.done]
    title = f"tune-{method_cls.registered_name}-{dataset_label(cfg.dataset)}-s{cfg.seed}"
    with tracker.open_study(title, tags, {}, {}):
        tracker.set_tags({T.FINAL_KEPT: ",".join(map(str, sorted(resume.done))),
                          T.FINAL_RESUMED: ",".join(map(str, missing))})
        final = _final(cfg, s, method_cls, raw, bundle, mean, std, resume.best_params,
                       tracker, tags, done=resume.done, logged=resume.logged)
    return TuneResult(study_name=name, n_complete=0, n_pruned=0, n_failed=0,
                      best_params=dict(resume.best_params), best_value=math.nan,
                      final_test=final, kept=sorted(resume.done), ran=missing)


def _state_counts(store: StudyStore) -> dict[str, int]:
    c = {"complete": 0, "pruned": 0, "failed": 0}
    for t in store.study.get_trials(deepcopy=False):
        if t.user_attrs.get("crashed") or t.user_attrs.get("surplus"):
            continue
        key = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned",
               TrialState.FAIL: "failed"}.get(t.state)
        if key:
            c[key] += 1
    return c


def _best(store: StudyStore) -> optuna.trial.FrozenTrial | None:
    return best_trial(store.study.get_trials(deepcopy=False))


def _hp(method_cls: type[Method], params: dict[str, Any], overrides: dict[str, Any]
        ) -> dict[str, Any]:
    fixed = {k: v for k, v in method_cls.defaults.items() if k not in method_cls.search_space}
    return {**fixed, **{k: v for k, v in params.items() if k != "batch_size"}, **overrides}


def _draw(trial: optuna.trial.Trial, method_cls: type[Method], s: TuneSettings
          ) -> dict[str, Any]:
    """Trial ``trial``'s configuration: a function of (seed, trial number) only
    (:class:`~scarcelab.protocols.study_store.TrialSeededSampler`)."""
    params = sample(method_cls.search_space, trial)
    params["batch_size"] = trial.suggest_categorical("batch_size", list(s.batch_sizes))
    return params


def _rebuild(store: StudyStore, resume: SearchResume, method_cls: type[Method],
             s: TuneSettings, overrides: dict[str, Any]) -> list[int]:
    """Put an interrupted search's trials back into ``store`` (a new, in-memory study) as
    they ended: trial ``n`` is asked as trial ``n``, so the sampler draws its configuration
    again (checked against the recorded one), and it reports the values it reported. The
    pruner is not asked: these decisions were taken. Returns the trial numbers kept; the
    search then continues with the next number, as the dead process would have."""
    prior = sorted(resume.trials, key=lambda t: t.number)
    if [t.number for t in prior] != list(range(len(prior))):
        raise ConfigError(f"cannot resume the search: its records hold trials "
                          f"{[t.number for t in prior]}, not 0..{len(prior) - 1}; a trial "
                          "record is missing (its tracking records were lost?), so the "
                          "study cannot be continued as it would have run")
    for p in prior:
        trial = store.ask()
        assert trial.number == p.number, (trial.number, p.number)
        trial.set_user_attr("slot", p.number)
        params = _draw(trial, method_cls, s)
        diff = {k: (p.params[k], _param_text(v)) for k, v in params.items()
                if k in p.params and k not in overrides and p.params[k] != _param_text(v)}
        if diff:
            raise ConfigError(f"cannot resume the search: trial {p.number} was recorded "
                              f"with {diff} (recorded, redrawn); the study was run with "
                              "another seed or search space")
        for step, value in p.reports:
            trial.report(value, step)
        if p.state == "complete":
            store.tell(trial, p.value)
        elif p.state == "pruned":
            store.tell(trial, state=TrialState.PRUNED)
        else:
            if p.state == "budget":
                trial.set_user_attr("budget_cut", len(p.reports))
            store.tell(trial, state=TrialState.FAIL)
    return [t.number for t in prior]


@dataclass(frozen=True)
class _TrainvalEpochs:
    """A final retrain's end of epoch as an ``EpochCallback``: its train metrics and its
    score on train+val (the set it trains on, in the validation slot), no model selection.
    """

    tracker: Tracker

    def on_epoch_end(self, report: EpochReport, improved: bool,
                     snapshot: SnapshotFn) -> None:
        self.tracker.log_metrics({**{k: v for k, v in report.metrics.items()
                                     if not k.startswith(("test/", "val/"))},
                                  "trainval/balanced_accuracy": report.val_balanced_accuracy},
                                 report.epoch)


class _Search:
    """One search's trial loop, over what its trials share: the study's storage, the
    tracker and the trial runner, which maps what a trial raised to its outcome (ASHA's
    stop: PRUNED; a TrialFailed or another error: FAILED) and re-raises the third
    unexpected error in a row."""

    def __init__(self, cfg: TuneConfig, s: TuneSettings, method_cls: type[Method],
                 raw: RawDataset, bundle: DatasetBundle, mean: np.ndarray, std: np.ndarray,
                 store: StudyStore, tracker: Tracker, tags: dict[str, str],
                 deadline: float) -> None:
        self.cfg, self.s, self.method_cls, self.raw, self.bundle = cfg, s, method_cls, raw, bundle
        self.mean, self.std, self.store, self.tracker = mean, std, store, tracker
        self.tags, self.deadline = tags, deadline
        self.runner = TrialRunner(tracker)

    def run(self) -> None:
        """Trials until ``n_trials`` slots are taken (by any worker of a shared study),
        the wall-clock cap is reached, or a trial is cut by it."""
        store = self.store
        while _counted(store) < self.s.n_trials and time.time() < self.deadline:
            self._reap()
            trial = store.ask()
            place = _claim(store, trial, self.s.n_trials)
            if place is None:
                trial.set_user_attr("surplus", True)  # another worker took the last slot
                store.tell(trial, state=TrialState.FAIL)
                if "rerun_of" in trial.user_attrs:
                    continue  # a second copy of a rerun: other slots may still be open
                break
            if not self._run_trial(trial, place):
                break

    def _reap(self) -> None:
        """A dead process's running trials fail; in a shared storage the crashed ones are
        queued to run again, each as itself (:func:`slot`)."""
        fails = self.store.fail_orphans()
        if fails:
            log.warning("trials %s were left running by a dead process: marked failed", fails)
        if self.store.shared:
            again = _requeue_crashed(self.store)
            if again:
                log.warning("crashed trial(s) %s run again, each as itself", again)

    def _run_trial(self, trial: optuna.trial.Trial, place: int) -> bool:
        """Train and record trial ``trial`` in slot ``place``; False when the search must
        stop after it (the wall-clock cap cut it)."""
        s, cfg = self.s, self.cfg
        params = _draw(trial, self.method_cls, s)
        hp = _hp(self.method_cls, params, cfg.overrides)
        seed_n = trial_seed(cfg.seed, place)
        torch.manual_seed(seed_n)
        g = torch.Generator().manual_seed(seed_n)
        self.tracker.start_trial(place, {**self.tags, T.ROLE: "trial", T.TRIAL: str(place)},
                                 {**hp, "batch_size": params["batch_size"], "arch": s.arch,
                                  "trial_seed": seed_n, "epochs": s.epochs})
        history: list[float] = []
        train_cfg = TrainConfig(max_epochs=s.epochs, patience=10**9,
                                max_steps_per_epoch=cfg.max_steps_per_epoch,
                                batch_labeled=int(params["batch_size"]), device=cfg.device,
                                labeled_views=(s.augmentation,), accel=cfg.accel)

        def fit() -> TrialResult:
            method = build_method(self.method_cls, s.arch, self.raw, self.mean, self.std, hp)
            return train_trial(method, self.bundle, train_cfg, deadline=self.deadline,
                               generator=g, probe_rng=np.random.default_rng(seed_n),
                               callbacks=[OnEpochEnd(
                                   lambda rep, improved, snap: self._on_epoch(
                                       trial, history, rep))])

        # the objective is what Optuna is told: a NaN one fails the trial in both records
        # (Optuna's study/_tell.py feasibility check would fail it there alone)
        outcome = self.runner.run(
            trial.number, fit,
            on_fail=lambda: self.store.tell(trial, state=TrialState.FAIL),
            on_prune=lambda p: self._pruned(trial, p),
            objective=lambda res: _objective(history))
        if outcome.state != COMPLETE:
            return True
        assert outcome.value is not None
        return self._finished(trial, history, outcome.value)

    def _on_epoch(self, trial: optuna.trial.Trial, history: list[float],
                  rep: EpochReport) -> None:
        """Each epoch: the trial's metrics and its ASHA report, the mean of its last
        :data:`AVG_WINDOW` validation balanced accuracies; the pruner may stop it here."""
        history.append(rep.val_balanced_accuracy)
        avg = _objective(history)
        metrics = {k: v for k, v in rep.metrics.items() if not k.startswith("test/")}
        metrics["val/balanced_accuracy_avg5"] = avg
        self.tracker.log_metrics(metrics, rep.epoch)
        trial.report(avg, rep.epoch + 1)
        if trial.should_prune():
            raise TrialPruned(rep.epoch + 1, f"pruned by ASHA after epoch {rep.epoch + 1}")

    def _pruned(self, trial: optuna.trial.Trial, p: TrialPruned) -> None:
        rung = asha_rung(p.epoch, self.s.grace_period)
        self.store.tell(trial, state=TrialState.PRUNED)
        self.tracker.log_metrics({"asha/pruned_epoch": p.epoch, "asha/rung": rung}, p.epoch,
                                 scope="trial")
        self.tracker.set_tags({T.PRUNED: "true", T.ASHA_RUNG: str(rung),
                               T.STOPPED: "asha"}, scope="trial")

    def _finished(self, trial: optuna.trial.Trial, history: list[float],
                  res: TrialResult) -> bool:
        """Record a trial that ran to its end (or was cut by the wall-clock cap, which
        makes it incomparable with the others: failed, and the search stops)."""
        if res.stopped == "budget" and res.epochs < self.s.epochs:
            trial.set_user_attr("budget_cut", res.epochs)
            self.runner.cut(f"budget_minutes ran out after {res.epochs} epochs",
                            tell=lambda: self.store.tell(trial, state=TrialState.FAIL),
                            tags={T.STOPPED: "budget"})
            return False
        value = _objective(history)
        self.runner.complete(
            tell=lambda: self.store.tell(trial, value),
            metrics={"asha/final_value": value,
                     "asha/rung": asha_rung(res.epochs, self.s.grace_period)},
            step=res.epochs, tags={T.PRUNED: "false", T.STOPPED: res.stopped})
        return True


def _objective(history: list[float]) -> float:
    """A trial's value for Optuna: the mean validation balanced accuracy of its last
    :data:`AVG_WINDOW` epochs (the same smoothing as its ASHA reports)."""
    return float(np.mean(history[-AVG_WINDOW:]))


def _retrain_error(e: BaseException) -> str:
    return traceback.format_exc(limit=5)


class _Final:
    """The final phase: retrains of the best configuration on ``trainval``. Whatever a
    retrain raises fails its record and ends the phase (a retrain is not a trial of a
    search: there is no other configuration to try)."""

    def __init__(self, cfg: TuneConfig, s: TuneSettings, method_cls: type[Method],
                 raw: RawDataset, bundle: DatasetBundle, mean: np.ndarray, std: np.ndarray,
                 params: dict[str, Any], tracker: Tracker, tags: dict[str, str]) -> None:
        self.cfg, self.s, self.method_cls, self.raw, self.bundle = cfg, s, method_cls, raw, bundle
        self.mean, self.std, self.tracker, self.tags = mean, std, tracker, tags
        self.hp = _hp(method_cls, params, cfg.overrides)
        self.batch = int(params.get("batch_size", s.batch_sizes[0]))
        self.runner = TrialRunner(tracker, fatal=(BaseException,), max_consecutive_errors=None,
                                  error_text=_retrain_error)

    def run(self, done: dict[int, float] | None, logged: frozenset[int]) -> list[float]:
        """Retrains ``0 .. n_final-1`` except those in ``done``; their scores in order."""
        tracker, n = self.tracker, self.cfg.n_final
        scores: dict[int, float] = dict(done or {})
        extra_tags = {T.RESUMED: "true"} if done is not None else {}
        for i in range(n):
            if i in scores:
                if i not in logged:  # finished, but the dead process had not recorded it yet
                    tracker.log_metrics({"final/test_balanced_accuracy": scores[i]}, i,
                                        scope="study")
                continue
            scores[i] = self._retrain(i, extra_tags)
        ordered = [scores[i] for i in range(n)]
        arr = np.asarray(ordered)
        tracker.log_metrics({"final/test_balanced_accuracy_mean": float(arr.mean()),
                             "final/test_balanced_accuracy_std":
                                 float(arr.std(ddof=1)) if len(arr) > 1 else 0.0,
                             "final/n_runs": float(len(arr))}, 0, scope="study")
        return ordered

    def _retrain(self, i: int, extra_tags: dict[str, str]) -> float:
        """Retrain ``i`` with its own seed; its test balanced accuracy (retrain 0 also
        exports the model)."""
        s, cfg, tracker, raw = self.s, self.cfg, self.tracker, self.raw
        seed = retrain_seed(cfg.seed, i)
        torch.manual_seed(seed)
        g = torch.Generator().manual_seed(seed)
        tracker.start_trial(i, {**self.tags, T.ROLE: "retrain", T.RETRAIN: str(i), **extra_tags},
                            {**self.hp, "batch_size": self.batch, "arch": s.arch,
                             "retrain_seed": seed, "epochs": s.final_epochs,
                             "train_split": "trainval"})
        method = build_method(self.method_cls, s.arch, raw, self.mean, self.std, self.hp)
        train_cfg = TrainConfig(max_epochs=s.final_epochs, patience=10**9,
                                max_steps_per_epoch=cfg.max_steps_per_epoch,
                                batch_labeled=self.batch, device=cfg.device,
                                labeled_views=(s.augmentation,), accel=cfg.accel)
        outcome = self.runner.run(i, lambda: self._fit_and_test(method, train_cfg, g, seed))
        assert outcome.value is not None  # anything else was raised
        res, test = outcome.value
        self.runner.complete(metrics={f"test/{k}": v for k, v in test.items()},
                             step=res.epochs)
        score = float(test["balanced_accuracy"])
        tracker.log_metrics({"final/test_balanced_accuracy": score}, i, scope="study")
        if i == 0:
            ckpt = {"state_dict": {k: v.detach().cpu() for k, v in method.state_dict().items()},
                    "probe": None}
            model = export_classifier(method, ckpt, raw.class_names)
            model.transform = transform_of(self.bundle)  # replayed on raw images
            tracker.log_model(model, torch.rand(2, raw.channels, *raw.resolution))
        return score

    def _fit_and_test(self, method: Method, train_cfg: TrainConfig, g: torch.Generator,
                      seed: int) -> tuple[TrialResult, dict[str, float]]:
        """Train for the final epoch count, no model selection; the last epoch on the
        test set."""
        res = train_trial(method, self.bundle, train_cfg, deadline=math.inf, generator=g,
                          probe_rng=np.random.default_rng(seed),
                          callbacks=[_TrainvalEpochs(self.tracker)])
        method.eval()
        logits = forward_images(method.logits, self.raw.test_x, 512,
                                torch.device(self.cfg.device), train_cfg.resolved_accel())
        if not np.isfinite(logits).all():
            raise TrialFailed("non-finite test predictions")
        probs = torch.softmax(torch.as_tensor(logits), 1).numpy()
        test = classification_metrics(self.raw.test_y, probs,  # binary: the disease class
                                      positive_class=resolve_positive_class(self.raw))
        return res, test


def _final(cfg: TuneConfig, s: TuneSettings, method_cls: type[Method], raw: RawDataset,
           bundle: DatasetBundle, mean: np.ndarray, std: np.ndarray, params: dict[str, Any],
           tracker: Tracker, tags: dict[str, str], done: dict[int, float] | None = None,
           logged: frozenset[int] = frozenset()) -> list[float]:
    """Retrains ``0 .. n_final-1`` of the best configuration, except those in ``done``
    (index -> test balanced accuracy of a retrain an earlier process finished)."""
    return _Final(cfg, s, method_cls, raw, bundle, mean, std, params, tracker,
                  tags).run(done, logged)
