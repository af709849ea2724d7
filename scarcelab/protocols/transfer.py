"""Transfer evaluation of an encoder (Kang et al. 2022, "Benchmarking Self-Supervised
Learning on Diverse Pathology Datasets", CVPR 2023, §4): linear probing and fine-tuning.

* ``linear`` — the encoder is frozen; its features of every train and test image are
  computed once (``scarcelab.active.encoded.encode_dataset``: cached under a key of the
  images and the encoder's weights, so a second protocol run or a second machine skips the
  forward passes) and a multinomial logistic regression is fitted on the labeled part, its
  L2 penalty chosen on the validation part (:class:`~scarcelab.probe.LinearProbe`:
  random draws of ``C`` log-uniform on [1e-3, 1e3], best validation balanced accuracy; here
  run once per study, with more iterations than the per-epoch probe of ``self`` studies).
* ``finetune`` — the whole network (encoder + a new linear head) is trained with a
  supervised method (``sup``: cross-entropy) under the budgeted random search of
  ``scarcelab.protocols.search`` (its lr / weight-decay space, early stopping on validation
  balanced accuracy); every trial starts from the encoder's weights.

Splits: the labeled set is the train split minus a validation part drawn from it with the
natural class frequencies (seeded, ``scarcelab.data.splits``); by default all of train is
used (``n_labeled=all``) with 20 % held out for validation, the "full-label" setting of
Kang et al. ``label_fraction`` (e.g. 0.1) keeps that share of it — their label-efficiency
setting (Fig. 1, right) — with the *same* validation set as at 1.0, for both protocols; a
smaller ``n_labeled`` is the other way to the label-scarce variant (one or the other). The
test split is the dataset's official one and is never used for any choice.

The ``random`` encoder (same arch, seeded initialisation) is the from-scratch control.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

import scarcelab
from scarcelab import tags as T
from scarcelab.accel import Accel
from scarcelab.data import load_raw
from scarcelab.data.augment import to_float
from scarcelab.data.bundle import RawDataset, resolve_positive_class
from scarcelab.data.own import dataset_label
from scarcelab.data.splits import labeled_rest, make_split
from scarcelab.errors import ConfigError
from scarcelab.metrics import classification_metrics
from scarcelab.models.classifier import ExportedClassifier, for_export
from scarcelab.models.encoder import check_norm
from scarcelab.models.image_input import transform_of
from scarcelab.probe import LinearProbe
from scarcelab.protocols.search import AutoDevice, StudyConfig
from scarcelab.tracker import DatasetInfo, Tracker

PROTOCOLS = ("linear", "finetune")
VAL_FRACTION = 0.2


@dataclass
class ProbeConfig(AutoDevice):
    dataset: str = "pathology_crops"
    encoder: str = "random"
    protocol: str = "linear"
    data_dir: str | None = None
    arch: str = "auto"
    seed: int = 0
    n_labeled: int | str | None = "all"
    n_val: int | str | None = None  # None: VAL_FRACTION of the train split
    label_fraction: float = 1.0  # share of the labeled set kept (Kang et al.'s 10 % / 100 %)
    encoder_norm: str = "auto"  # input normalisation of the weights (models.encoder.parse_norm)
    device: str = "auto"
    # linear
    probe_trials: int = 10
    probe_max_iter: int = 1000
    # finetune (the budgeted search's settings)
    method: str = "sup"
    budget_minutes: float = 3.0
    max_epochs: int = 200
    patience: int = 20
    batch_size: int | None = None
    max_steps_per_epoch: int | None = None
    max_trials: int = 0
    overrides: dict[str, Any] = field(default_factory=dict)
    # precision and kernels (scarcelab.accel; ``auto``: per device): linear — the frozen
    # encoder's forward passes; finetune — the search's trials
    accel: Accel = field(default_factory=Accel)
    # a user's images (folder:/csv:): scarcelab.data.own.DataOptions; None otherwise
    data_options: Any = None

    def resolved_accel(self) -> Accel:
        """:attr:`accel` as the protocol runs it: the encoding's (linear; NCHW on CPU as it
        always was) or the search's epoch loop's (finetune)."""
        if self.protocol == "linear":
            from scarcelab.active.encoded import encoder_accel

            return encoder_accel(self.accel, self.resolved_device())
        from scarcelab.train import TrainConfig

        return TrainConfig(device=self.resolved_device(), accel=self.accel).resolved_accel()

    def validate(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"protocol={self.protocol!r}: valid values are "
                              f"{', '.join(PROTOCOLS)}")
        if self.probe_trials < 1 or self.probe_max_iter < 1:
            raise ConfigError("probe_trials and probe_max_iter must be >= 1")
        check_label_fraction(self.label_fraction)
        check_norm(self.encoder_norm)
        if self.label_fraction < 1 and self.n_labeled not in ("all", None, "default", ""):
            raise ConfigError(f"label_fraction={self.label_fraction} with n_labeled="
                              f"{self.n_labeled}: set the label budget one way (n_labeled=all "
                              "with a fraction, or a count with label_fraction=1)")


def check_label_fraction(f: float) -> None:
    """One rule for ``probe`` and ``segment``: a share of the labeled set, 0 excluded."""
    if not 0.0 < f <= 1.0:
        raise ConfigError(f"label_fraction must be in (0, 1], got {f}; e.g. 0.1 trains on 10 % "
                          "of the labeled images, 1.0 on all of them")


@dataclass
class ProbeResult:
    protocol: str
    test: dict[str, float]
    val_balanced_accuracy: float
    confusion: np.ndarray  # rows: true class, columns: predicted class (test split)
    class_names: list[str]
    split_hash: str
    info: dict[str, Any] = field(default_factory=dict)


def probe_split(cfg: ProbeConfig, raw: RawDataset) -> dict[str, Any]:
    """The labeled / validation split of ``raw``'s train split for ``cfg``."""
    n_val = cfg.n_val
    if n_val in (None, "default", ""):
        n_val = max(raw.num_classes, round(VAL_FRACTION * len(raw.train_y)))
    return make_split(raw, cfg.n_labeled, n_val, cfg.seed, allow_large_val=True,
                      label_fraction=cfg.label_fraction)


def label_fraction_tag(split: dict[str, Any]) -> str:
    """``scarcelab.label_fraction``: the share of the labeled pool (train minus validation)
    the run trained on — the configured fraction, or for an explicit ``n_labeled`` that
    count over the pool — so that the transfer view never pools different label budgets."""
    if "label_fraction" in split:
        return f"{split['label_fraction']:g}"
    pool = split["n_labeled"] + len(labeled_rest(split))
    return "1" if split["n_labeled"] == pool else f"{split['n_labeled'] / pool:.4g}"


def confusion_matrix(y_true: np.ndarray, y_pred: np.ndarray, k: int) -> np.ndarray:
    cm = np.zeros((k, k), dtype=np.int64)
    np.add.at(cm, (np.asarray(y_true), np.asarray(y_pred)), 1)
    return cm


def _dataset_info(raw: RawDataset, split: dict[str, Any]) -> DatasetInfo:
    digest = hashlib.sha256(f"{raw.md5}:{split['hash']}".encode()).hexdigest()[:16]
    return DatasetInfo(name=raw.name, source=raw.source or raw.name, digest=digest)


def encoder_tags(cfg: Any, enc_info: dict[str, Any], task: str = "probe") -> dict[str, str]:
    """The tags that let the transfer view put runs of one encoder on one row (``cfg``: a
    probe or segment config, which both have ``encoder`` and ``protocol``)."""
    tags = {T.TASK: task, T.PROTOCOL: cfg.protocol,
            T.ENCODER: cfg.encoder,
            T.ENCODER_ARCH: str(enc_info.get("arch", "")),
            T.ENCODER_FORMAT: str(enc_info.get("format", "")),
            T.ENCODER_NORM: str(enc_info.get("input_norm", "none")),
            T.ENCODER_FINGERPRINT: str(enc_info.get("fingerprint", ""))}
    if enc_info.get("skipped"):  # tensors of the file that did not fit the arch
        tags[T.ENCODER_SKIPPED] = ",".join(enc_info["skipped"])[:500]
    tags[T.ENCODER_METHOD] = str(
        enc_info.get("source_method") or enc_info.get("method")
        or ("random" if cfg.encoder == "random" else "unknown"))
    for k, tag in (("source_family", T.ENCODER_FAMILY), ("run_id", T.ENCODER_RUN_ID)):
        if enc_info.get(k):
            tags[tag] = str(enc_info[k])
    return tags


# the fine-tuning search's settings: a linear probe record does not carry them
_FINETUNE_ONLY = ("overrides", "encoder_info", "method", "budget_minutes", "max_epochs",
                  "patience", "batch_size", "max_trials", "max_steps_per_epoch")


def run_linear(cfg: ProbeConfig, backbone: nn.Module, enc_info: dict[str, Any],
               tracker: Tracker, cache: Any = None) -> ProbeResult:
    """Frozen features (cached) + an L2-tuned logistic regression; one record, no trials.

    ``cache`` is an ``EncodingCache`` (``scarcelab.active.encoded``): disk here, disk +
    MLflow artifacts from the tracking side; None computes the features every time.
    """
    cfg.validate()
    t0 = time.time()
    raw = load_raw(cfg.dataset, cfg.data_dir, cfg.data_options)
    split = probe_split(cfg, raw)
    device = torch.device(cfg.resolved_device())
    pos = resolve_positive_class(raw)  # a binary task's disease class, as the studies
    _start_linear_study(cfg, raw, split, device, pos, enc_info, tracker)
    status = "FAILED"
    try:
        fit = _fit_linear(cfg, raw, split, backbone, device, pos, tracker, cache, t0)
        status = "FINISHED"
    finally:
        tracker.end_study(status)
    return fit.result(raw, split)


def _start_linear_study(cfg: ProbeConfig, raw: RawDataset, split: dict[str, Any],
                        device: torch.device, pos: int | None, enc_info: dict[str, Any],
                        tracker: Tracker) -> None:
    """Open the probe's one record with the tags the transfer view groups on and the
    resolved config (the fine-tuning settings left out of its params: they played no
    part), before any forward pass, so a crash still leaves a FAILED record."""
    arch = str(enc_info.get("arch", cfg.arch))
    tags = {T.ROLE: "probe", T.FAMILY: "transfer",
            T.METHOD: "linear_probe", T.DATASET: raw.name,
            T.SEED: str(cfg.seed), T.SPLIT_HASH: split["hash"],
            T.VERSION: scarcelab.__version__, T.ARCH: arch,
            T.LABEL_FRACTION: label_fraction_tag(split),
            **encoder_tags(cfg, enc_info)}
    if pos is not None:
        tags[T.POSITIVE_CLASS] = raw.class_names[pos]
    resolved = {**dataclasses.asdict(cfg), "arch": arch, "device": str(device),
                "positive_class": pos,
                "n_labeled": split["n_labeled"], "n_val": split["n_val"],
                "n_test": len(raw.test_y), "encoder_info": enc_info,
                "accel": cfg.resolved_accel().params()}
    resolved.pop("data_options")  # a user's images: the options, flat, as entered
    if cfg.data_options is not None:
        resolved.update(cfg.data_options.params())
    params = {k: v for k, v in resolved.items() if k not in (*_FINETUNE_ONLY, "accel")}
    params.update(resolved["accel"])  # precision=..., as the CLI names them
    tracker.start_study(name=f"probe-linear-{dataset_label(raw.name)}-s{cfg.seed}", tags=tags,
                        params=params,
                        artifacts={"split.json": split, "config.json": resolved},
                        dataset=_dataset_info(raw, split))


@dataclass
class _LinearFit:
    """What the fitted probe leaves for the protocol's result, kept apart so the result is
    built only once the record is closed."""

    probe: LinearProbe
    proba: np.ndarray
    test: dict[str, float]
    where: str
    key: str
    t_feat: float
    t_fit: float
    elapsed: float

    def result(self, raw: RawDataset, split: dict[str, Any]) -> ProbeResult:
        return ProbeResult(
            "linear", self.test, self.probe.val_balanced_accuracy,
            confusion_matrix(raw.test_y, self.proba.argmax(1), raw.num_classes),
            list(raw.class_names), split["hash"],
            {"C": self.probe.C, "features": self.where, "encoding_key": self.key,
             "time_features_s": self.t_feat, "time_fit_s": self.t_fit,
             "time_s": self.elapsed})


def _fit_linear(cfg: ProbeConfig, raw: RawDataset, split: dict[str, Any],
                backbone: nn.Module, device: torch.device, pos: int | None,
                tracker: Tracker, cache: Any, t0: float) -> _LinearFit:
    """Encode, fit the probe on the labeled part (penalty chosen on validation), score it
    on test and log the scores, the timings and the exported model to the open record."""
    from scarcelab.active.encoded import EncoderConfig, encode_dataset

    tf = time.time()
    tracker.set_tags({T.PHASE: f"encoding {len(raw.train_y) + len(raw.test_y)} "
                      "images with the frozen encoder (cached after the first run)"})
    enc, key, where = encode_dataset(raw.name, raw.train_x, raw.train_y, raw.test_x,
                                     raw.test_y, raw.num_classes, EncoderConfig(),
                                     device, cache, pretrained=backbone,
                                     pretrained_id=cfg.encoder, accel=cfg.accel)
    t_feat = time.time() - tf
    lab = np.asarray(split["labeled"], dtype=np.int64)
    val = np.asarray(split["val"], dtype=np.int64)
    tp = time.time()
    tracker.set_tags({T.PHASE: f"fitting the linear probe ({cfg.probe_trials} "
                      "L2 penalties)"})
    probe = LinearProbe(raw.num_classes, n_trials=cfg.probe_trials,
                        max_iter=cfg.probe_max_iter).fit(
        enc.x_train[lab], raw.train_y[lab], enc.x_train[val], raw.train_y[val],
        np.random.default_rng(cfg.seed))
    t_fit = time.time() - tp
    proba = probe.predict_proba(enc.x_test)
    test = classification_metrics(raw.test_y, proba, positive_class=pos)
    elapsed = time.time() - t0
    tracker.log_metrics({"val/balanced_accuracy": probe.val_balanced_accuracy,
                         **{f"test/{k}": v for k, v in test.items()},
                         "probe/C": float(probe.C or 0.0), "time/features_s": t_feat,
                         "time/fit_s": t_fit, "time/elapsed_s": elapsed},
                        0, scope="study")
    tracker.set_tags({T.ENCODING_KEY: key,
                      T.FEATURES: "cached" if not where.startswith("computed")
                      else "computed"})
    model = for_export(ExportedClassifier(copy.deepcopy(backbone), probe.to_linear(),
                                          raw.class_names, transform_of(raw)))
    tracker.log_model(model, torch.rand(2, raw.channels, *raw.resolution))
    return _LinearFit(probe, proba, test, where, key, t_feat, t_fit, elapsed)


@torch.no_grad()
def _predict(model: nn.Module, x: np.ndarray, device: torch.device, bs: int = 512,
             accel: Accel | None = None) -> np.ndarray:
    """Class probabilities of uint8 images; under ``accel``'s autocast and input layout
    (resolved), as the study evaluated the checkpoint."""
    model.eval().to(device)
    acc = accel or Accel(precision="fp32", channels_last="off")
    with acc.autocast(device):
        out = [torch.softmax(model(acc.images(to_float(torch.as_tensor(x[i:i + bs]).to(
            device)))).float(), 1).cpu() for i in range(0, len(x), bs)]
    return torch.cat(out).numpy()


def run_finetune(cfg: ProbeConfig, backbone: nn.Module, enc_info: dict[str, Any],
                 tracker: Tracker) -> ProbeResult:
    """The budgeted search of a supervised method, every trial starting from the encoder.

    The study's own records (trials, ``best/*``, checkpoint, model) are the search's; this
    adds the encoder tags and returns the test scores and confusion matrix of the
    checkpoint best on validation (the one the study reports).
    """
    from scarcelab.methods import get_method
    from scarcelab.protocols.search import run_study

    cfg.validate()
    method_cls = get_method(cfg.method)
    if method_cls.family != "supervised" or method_cls.linear_probe:
        raise ConfigError(f"finetune method={cfg.method!r}: pick a supervised method with a "
                          "classifier head (sup, mixup)")
    t0 = time.time()
    raw = load_raw(cfg.dataset, cfg.data_dir, cfg.data_options)
    split = probe_split(cfg, raw)
    scfg = _finetune_study_config(cfg, split, str(enc_info.get("arch", cfg.arch)))
    factory = _encoder_factory(backbone, raw.channels)
    res = run_study(scfg, tracker, backbone_factory=factory,
                    extra_tags={T.FAMILY: "transfer",
                                T.LABEL_FRACTION: label_fraction_tag(split),
                                **encoder_tags(cfg, enc_info)})
    if res.split_hash != split["hash"]:  # same builder, same seed: a mismatch is a bug
        raise RuntimeError("fine-tuning split differs from the probe split")
    ckpt = res.best_checkpoint
    assert ckpt is not None
    proba, test = _score_checkpoint(method_cls, ckpt, raw, split, scfg)
    return ProbeResult(
        "finetune", test, res.best_val,
        confusion_matrix(raw.test_y, proba.argmax(1), raw.num_classes), list(raw.class_names),
        split["hash"], {"n_trials": res.n_trials, "n_failed": res.n_failed,
                        "best_trial": res.best_trial, "hp": ckpt.get("hp"),
                        "time_s": time.time() - t0,
                        "study_test": res.best_test})


def _finetune_study_config(cfg: ProbeConfig, split: dict[str, Any], arch: str) -> StudyConfig:
    """The search's config for the probe's split: the labeled pool before the label
    fraction and the same validation count, so that the study's own split builder, with
    the same seed, draws the very split the linear probe used."""
    return StudyConfig(method=cfg.method, dataset=cfg.dataset, family="supervised",
                       data_dir=cfg.data_dir, arch=arch, seed=cfg.seed,
                       budget_minutes=cfg.budget_minutes, max_epochs=cfg.max_epochs,
                       patience=cfg.patience,
                       n_labeled=split.get("n_labeled_pool", split["n_labeled"]),
                       n_val=split["n_val"], allow_large_val=True,
                       label_fraction=cfg.label_fraction, search="random",
                       batch_size=cfg.batch_size, max_steps_per_epoch=cfg.max_steps_per_epoch,
                       max_trials=cfg.max_trials, device=cfg.device, overrides=cfg.overrides,
                       diag_samples=0, accel=cfg.accel, data_options=cfg.data_options)


def _encoder_factory(backbone: nn.Module, channels: int) -> Callable[[int], nn.Module]:
    """A backbone factory for the search that hands every trial a fresh copy of the
    encoder's weights (taken once, on the CPU, before any trial can train them)."""
    initial = copy.deepcopy(backbone).cpu()

    def factory(in_channels: int) -> nn.Module:
        if in_channels != channels:
            raise ConfigError(f"encoder expects {channels} channels, got {in_channels}")
        return copy.deepcopy(initial).train()

    return factory


def _score_checkpoint(method_cls: Any, ckpt: dict[str, Any], raw: RawDataset,
                      split: dict[str, Any],
                      scfg: StudyConfig) -> tuple[np.ndarray, dict[str, float]]:
    """Test probabilities and scores of the study's best checkpoint, recomputed here for
    the confusion matrix the study does not return."""
    from scarcelab.data.splits import apply_split
    from scarcelab.protocols.search import _method_from_checkpoint
    from scarcelab.train import TrainConfig, export_classifier

    bundle = apply_split(raw, split)
    model = export_classifier(_method_from_checkpoint(method_cls, ckpt, bundle), ckpt,
                              raw.class_names)
    device = scfg.resolved_device()
    proba = _predict(model, raw.test_x, torch.device(device),
                     accel=TrainConfig(device=device, accel=scfg.accel).resolved_accel())
    # the study's own test metrics used the dataset's positive class: the same here
    test = classification_metrics(raw.test_y, proba, positive_class=resolve_positive_class(raw))
    return proba, test


__all__ = ["PROTOCOLS", "ProbeConfig", "ProbeResult", "check_label_fraction", "confusion_matrix",
           "encoder_tags", "label_fraction_tag", "probe_split", "run_finetune", "run_linear"]
