"""``segment``: nuclei instance segmentation with an encoder under test: how well an
encoder's features transfer to a dense pathology task (docs/pathology.md).

One training run of a HoVer-Net-style U-Net (:mod:`scarcelab.models.unet`) under a
wall-clock budget: random crops of the training tiles, validation on held-out *source
images* after every epoch (sliding window + watershed + PQ), early stopping on validation
PQ (``patience`` epochs without improvement), and the test set scored once with the
checkpoint that was best on validation. Post-processing is HoVer-Net's with its marker
threshold (0.4); ``tune_threshold`` instead picks it on validation (a short grid, for the
selected checkpoint only) before the test set is seen.

Loss (HoVer-Net; ``vqdang/hover_net`` ``models/hovernet/opt.py``: every weight 1): NP
cross-entropy + soft Dice, HV mean squared error + the mean squared error of the HV
gradients (MSGE: ∂h/∂x, ∂v/∂y by their 5 x 5 Sobel-like kernel ``h / (h² + v²)``, zero
padded, on nucleus pixels only; ``models/hovernet/utils.py::msge_loss``), and, with types,
TP cross-entropy + Dice.

Encoder protocols (Kang et al. 2022, Fig. 1: the CoNSeP column of their *linear
evaluation*, and their label-efficiency panel, which fine-tunes on fractions of CoNSeP's
labels): ``protocol=finetune`` trains encoder and decoder end to end; ``protocol=frozen``
trains the decoder and heads only — the encoder's parameters get no gradient and are not
in the optimiser, and its BatchNorm layers stay in eval mode, so the encoder is exactly
the function it was pre-trained as (HoVer-Net's own first phase, ``freeze=True`` in
``models/hovernet/net_desc.py``, also stops the gradient but lets the encoder's BatchNorm
statistics move and trains its stem; docs/pathology.md says why this differs).
``label_fraction`` keeps a seeded share of the training tiles (after the validation source
images are set aside, so every fraction is selected on the same validation tiles).
The encoder is resolved by ``scarcelab.models.encoder`` (random, any accepted weights
file: a scarcelab checkpoint, a backbone state dict, a torchvision / timm ResNet such as
ImageNet-supervised weights) — the same resolver as ``probe``.

Tracking: per epoch on the study record ``train/loss``, ``seg/val_<m>`` and
``time/elapsed_s``; at the end ``seg/<m>`` = the *test* values of the selected checkpoint
(DESIGN §4.3): ``seg/pq``, ``seg/dq``, ``seg/sq``, ``seg/aji``, ``seg/dice`` per image,
``seg/<m>_pooled`` pooled, ``seg/mpq`` (PanNuke), ``seg/mpq_conic`` (CoNIC), HoVer-Net's
``seg/f1_d``, ``seg/type_acc``, ``seg/f1_type/<type>`` (see
:mod:`scarcelab.metrics.segmentation`), and ``seg/cross/<dataset>/<m>`` for
cross-dataset test sets; overlays of predicted vs true instances as ``overlays/*.png``.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import scarcelab
from scarcelab import tags as T
from scarcelab.accel import Accel, resolve
from scarcelab.data.nuclei import (
    SEG_DATASETS,
    NucleiDataset,
    NucleiTile,
    load_nuclei,
    split_validation,
)
from scarcelab.errors import ConfigError, DataError, TrialFailed
from scarcelab.extras import need
from scarcelab.metrics.segmentation import AGGREGATIONS, SegmentationEvaluator
from scarcelab.models.classifier import for_export
from scarcelab.models.encoder import build_encoder, check_norm
from scarcelab.models.nucleus_maps import (
    MIN_AREA,
    PostProcess,
    crop_targets,
    instance_types,
    predict_tiles,
    resize_maps,
    type_map,
)
from scarcelab.models.unet import NucleusUNet
from scarcelab.protocols.search import AutoDevice
from scarcelab.protocols.transfer import check_label_fraction, encoder_tags
from scarcelab.tracker import DatasetInfo, Tracker

log = logging.getLogger(__name__)

METRICS = ("pq", "dq", "sq", "mpq", "aji", "dice")
PROTOCOLS = ("finetune", "frozen")
EDGE_GRID = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7)  # marker thresholds tried with tune_threshold


@dataclass
class SegmentConfig(AutoDevice):
    dataset: str = "consep_patches"
    data_dir: str | None = None
    encoder: str = "random"
    arch: str = "auto"
    protocol: str = "finetune"  # finetune: encoder trained too; frozen: decoder + heads only
    label_fraction: float = 1.0  # share of the training tiles (after validation) trained on
    encoder_norm: str = "auto"  # input normalisation of the weights (models.encoder.parse_norm)
    seed: int = 0
    budget_minutes: float = 5.0
    max_epochs: int = 100
    patience: int = 5
    crop: int = 96  # training crop (pixels after ``scale``)
    window: int = 256  # sliding-window size at inference (pixels after ``scale``)
    scale: float = 1.0  # resize factor applied to tiles before the network (0.5 ~ 20x)
    batch_size: int = 8
    steps_per_epoch: int = 40
    lr: float = 1e-3
    weight_decay: float = 1e-5
    val_fraction: float = 0.15  # of the training source images
    types: bool = True  # train a type head when the data has types (mPQ)
    aggregation: str = "image"  # the PQ that selects the checkpoint: per image or pooled
    tune_threshold: bool = False  # marker threshold from EDGE_GRID on validation, not 0.4
    cross_test: tuple[str, ...] = ()  # further test-only datasets (e.g. nuclei_cpm15)
    max_train_tiles: int | None = None  # caps, for smoke tests
    max_val_tiles: int | None = 32  # validation runs every epoch: keep it cheap
    max_test_tiles: int | None = None
    n_overlays: int = 4
    device: str = "auto"
    # precision and kernels (scarcelab.accel; ``auto``: per device, on CPU the NCHW fp32
    # path this protocol always ran); logged resolved as the params precision, ...
    accel: Accel = field(default_factory=Accel)

    def resolved_accel(self) -> Accel:
        return resolve(self.accel, self.resolved_device(), cpu_channels_last="off")


@dataclass
class SegmentResult:
    best_epoch: int
    epochs: int
    val: dict[str, float]
    test: dict[str, float]
    cross: dict[str, dict[str, float]] = field(default_factory=dict)
    edge_threshold: float = 0.4
    train_s: float = 0.0
    eval_s: float = 0.0
    # where each cross-test set was read from (its folder; ``synthetic`` for generated sets)
    cross_sources: dict[str, str] = field(default_factory=dict)


# -- training samples -------------------------------------------------------------------------
def random_crop(tile: NucleiTile, size: int, rng: np.random.Generator,
                min_area: int = MIN_AREA) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(image, instances, HV targets)`` of a ``size`` crop (reflect-padded if the tile
    is smaller) after a random quarter turn / flip of the whole tile. As in HoVer-Net the
    augmentation comes first and the targets of the crop are computed from the whole
    augmented tile (:func:`~scarcelab.models.nucleus_maps.crop_targets`): a nucleus cut by
    the crop border keeps its own HV values, one with under ``min_area`` visible pixels
    gets none."""
    img, inst = tile.image, tile.inst
    ph, pw = max(0, size - img.shape[0]), max(0, size - img.shape[1])
    if ph or pw:
        img = np.pad(img, ((0, ph), (0, pw), (0, 0)), mode="reflect")
        inst = np.pad(inst, ((0, ph), (0, pw)))
    k = int(rng.integers(0, 4))
    img, inst = np.rot90(img, k), np.rot90(inst, k)
    if rng.random() < 0.5:
        img, inst = img[:, ::-1], inst[:, ::-1]
    r = int(rng.integers(0, img.shape[0] - size + 1))
    c = int(rng.integers(0, img.shape[1] - size + 1))
    inst_c, hv = crop_targets(inst, r, c, size, min_area)
    return (np.ascontiguousarray(img[r:r + size, c:c + size]), np.ascontiguousarray(inst_c),
            np.ascontiguousarray(hv))


def make_batch(tiles: list[NucleiTile], n: int, size: int, rng: np.random.Generator,
               typed: bool, scale: float = 1.0) -> dict[str, torch.Tensor]:
    """``scale``: the tiles' resize factor; HoVer-Net's minimum area (30 px at the data's
    own resolution) shrinks with it."""
    min_area = max(1, round(MIN_AREA * scale ** 2))
    xs, nps, hvs, tps = [], [], [], []
    for _ in range(n):
        tile = tiles[int(rng.integers(0, len(tiles)))]
        img, inst, hv = random_crop(tile, size, rng, min_area)
        # mild stain/brightness jitter: one gain per channel
        img = np.clip(img.astype(np.float32) * rng.uniform(0.9, 1.1, 3), 0, 255)
        xs.append(img.transpose(2, 0, 1) / 255.0)
        nps.append(inst > 0)
        hvs.append(hv)
        if typed:
            tps.append(type_map(inst, tile.types))
    out = {"x": torch.from_numpy(np.stack(xs)).float(),
           "np": torch.from_numpy(np.stack(nps)).long(),
           "hv": torch.from_numpy(np.stack(hvs)).float()}
    if typed:
        out["tp"] = torch.from_numpy(np.stack(tps)).long()
    return out


# -- loss -------------------------------------------------------------------------------------
def _soft_dice(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """1 - Dice per class (soft, on softmax probabilities), summed over classes."""
    p = logits.softmax(1)
    oh = F.one_hot(target, logits.shape[1]).permute(0, 3, 1, 2).float()
    inter = (p * oh).sum((0, 2, 3))
    denom = p.sum((0, 2, 3)) + oh.sum((0, 2, 3))
    return (1 - (2 * inter + 1e-3) / (denom + 1e-3)).sum()


def gradient_kernel(size: int = 5) -> torch.Tensor:
    """HoVer-Net's MSGE kernel ``k[i, j] = x / (x² + y²)`` with x = j - size // 2 (the
    column offset) and y = i - size // 2, 0 at the centre (``utils.py::get_sobel_kernel``).
    Unnormalised: on a ramp of slope s it returns 12 s for size 5 (3x3 Sobel / 8 gives s),
    so the gradient term weighs 144x what a unit-gain kernel gives."""
    r = torch.arange(size, dtype=torch.float64) - size // 2
    y, x = torch.meshgrid(r, r, indexing="ij")
    d = x * x + y * y
    return torch.where(d > 0, x / d.clamp(min=1), torch.zeros_like(d)).float()


LOSS_WEIGHTS = {"np_ce": 1.0, "np_dice": 1.0, "hv_mse": 1.0, "hv_msge": 1.0,
                "tp_ce": 1.0, "tp_dice": 1.0}  # HoVer-Net opt.py "loss": every weight 1


def hv_gradients(hv: torch.Tensor) -> torch.Tensor:
    """(∂h/∂x, ∂v/∂y) of an (N, 2, H, W) map (the MSGE term), zero padded as in
    HoVer-Net (``F.conv2d(..., padding=2)``). The derivative of h is taken along x and of v
    along y, as the paper's loss and the original TensorFlow code (``np.meshgrid``, 'xy')
    define it; the PyTorch port builds its kernel with ``torch.meshgrid`` ('ij'), which
    transposes it (see docs/pathology.md)."""
    kx = gradient_kernel(5).to(hv)[None, None]
    gx = F.conv2d(hv[:, :1], kx, padding=2)
    gy = F.conv2d(hv[:, 1:], kx.transpose(2, 3), padding=2)
    return torch.cat([gx, gy], 1)


def hovernet_loss(out: torch.Tensor, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    np_t, hv_t = batch["np"], batch["hv"]
    w = LOSS_WEIGHTS
    terms = {"np": w["np_ce"] * F.cross_entropy(out[:, :2], np_t)
             + w["np_dice"] * _soft_dice(out[:, :2], np_t)}
    hv = out[:, 2:4]
    mask = np_t[:, None].float()
    # HoVer-Net msge_loss: squared gradient error on nucleus pixels, both channels, over
    # (2 x nucleus pixels + 1e-8)
    msge = ((hv_gradients(hv) - hv_gradients(hv_t)) ** 2 * mask).sum() / (
        2 * mask.sum() + 1e-8)
    terms["hv"] = w["hv_mse"] * F.mse_loss(hv, hv_t) + w["hv_msge"] * msge
    if "tp" in batch:
        terms["tp"] = (w["tp_ce"] * F.cross_entropy(out[:, 4:], batch["tp"])
                       + w["tp_dice"] * _soft_dice(out[:, 4:], batch["tp"]))
    terms["loss"] = cast(torch.Tensor, sum(terms.values()))  # non-empty: never the 0 start
    return terms


# -- evaluation -------------------------------------------------------------------------------
def predict_set(model: nn.Module, tiles: list[NucleiTile], window: int, device: str,
                scale: float = 1.0, accel: Accel | None = None) -> list[np.ndarray]:
    """The network maps of every tile at the working ``scale`` (kept so that the
    watershed can be re-run cheaply with other thresholds); the windows of all tiles are
    batched together (:func:`~scarcelab.models.nucleus_maps.predict_tiles`), under the
    training's autocast (``accel``, resolved)."""
    with accel.autocast(device) if accel is not None else nullcontext():
        return predict_tiles(model, [rescale(t, scale).image for t in tiles], window, device)


def _pixels(tiles: list[NucleiTile]) -> int:
    return sum(int(t.inst.size) for t in tiles)


def _phase(tracker: Tracker, text: str) -> None:
    """Say which phase the study is in (tag ``scarcelab.phase``: the terminal's progress
    line, and the UI of a running study)."""
    tracker.set_tags({T.PHASE: text})


def score_maps(maps: list[np.ndarray], tiles: list[NucleiTile], post: PostProcess,
               type_names: dict[int, str] | None) -> tuple[SegmentationEvaluator,
                                                          list[np.ndarray]]:
    """The maps brought back to each tile's own size, then instances and their types
    from them, scored against the tile's true instances: post-processing and metrics run
    at the data's own resolution whatever ``scale`` the network saw."""
    ev = SegmentationEvaluator(type_names)
    preds = []
    for m, t in zip(maps, tiles, strict=True):
        m = resize_maps(m, t.inst.shape)
        inst = post(m[1], m[2:4])
        pt = instance_types(inst, m[4:]) if type_names else None
        ev.add(t.inst, inst, t.types if type_names else None, pt)
        preds.append(inst)
    return ev, preds


def _keyed(res: dict[str, float], prefix: str) -> dict[str, float]:
    return {f"{prefix}{k}": v for k, v in res.items() if not np.isnan(v)}


OVERLAY_LEGEND_PX = 16  # the white strip above the panels that names them


def overlay(tile: NucleiTile, pred: np.ndarray, title: str = "") -> np.ndarray:
    """Side by side: true instance outlines (green) | predicted outlines (magenta), under
    a legend strip that says so (and names the tile), so the PNG reads on its own."""
    from PIL import Image, ImageDraw
    find_boundaries = need("skimage.segmentation", "segment (overlays)").find_boundaries

    panels = []
    for inst, color in ((tile.inst, (0, 255, 0)), (pred, (255, 0, 255))):
        img = tile.image.copy()
        img[find_boundaries(inst, mode="inner")] = color
        panels.append(img)
    h, w = tile.image.shape[:2]
    gap = np.full((h, 4, 3), 255, np.uint8)
    body = np.concatenate([panels[0], gap, panels[1]], 1)
    strip = Image.new("RGB", (body.shape[1], OVERLAY_LEGEND_PX), (255, 255, 255))
    draw = ImageDraw.Draw(strip)
    for x, text, color in ((2, "ground truth", (0, 150, 0)),
                           (w + 6, "prediction", (200, 0, 200))):
        draw.text((x, 2), f"{text}{'  ' + title if title and x == 2 else ''}", fill=color)
    return np.concatenate([np.asarray(strip), body], 0)


def overlay_name(dataset: str, tile_name: str) -> str:
    """``overlays/consep_patches-test_10_000.png``: the dataset and the tile's own stem
    (CoNSeP test image 10, patch 000), not the split twice (``test_test_10_000``)."""
    stem = tile_name.rsplit("/", 1)[-1]
    return f"overlays/{dataset}-{stem}.png"


def rescale(tile: NucleiTile, s: float) -> NucleiTile:
    """The tile resized by ``s`` (bilinear image, nearest-neighbour instance map)."""
    if s == 1.0:
        return tile
    from PIL import Image

    h, w = (max(1, round(d * s)) for d in tile.inst.shape)
    img = np.asarray(Image.fromarray(tile.image).resize((w, h), Image.Resampling.BILINEAR))
    return NucleiTile(tile.name, img, resize_labels(tile.inst, (h, w)), tile.types,
                      tile.group)


def resize_labels(lab: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Nearest-neighbour resize of a label map to exactly ``shape``."""
    if lab.shape == shape:
        return lab
    rows = np.minimum((np.arange(shape[0]) + 0.5) * lab.shape[0] / shape[0], lab.shape[0] - 1)
    cols = np.minimum((np.arange(shape[1]) + 0.5) * lab.shape[1] / shape[1], lab.shape[1] - 1)
    return lab[rows.astype(int)][:, cols.astype(int)]


def _cap(tiles: list[NucleiTile], n: int | None, rng: np.random.Generator
         ) -> list[NucleiTile]:
    if n is None or n >= len(tiles):
        return tiles
    idx = np.sort(rng.choice(len(tiles), n, replace=False))
    return [tiles[i] for i in idx]


def label_subset(tiles: list[NucleiTile], fraction: float, seed: int) -> list[NucleiTile]:
    """The first ``max(1, round(fraction * n))`` tiles of one seeded order (its own stream,
    so the crops drawn later do not depend on the fraction), kept in their original order:
    under one seed a smaller fraction's tiles are a subset of a larger one's."""
    if fraction >= 1.0:
        return tiles
    order = np.random.default_rng([seed, 0x1AB]).permutation(len(tiles))
    keep = np.sort(order[:max(1, round(fraction * len(tiles)))])
    return [tiles[i] for i in keep]


def _validate(cfg: SegmentConfig) -> None:
    for name in (cfg.dataset, *cfg.cross_test):  # unknown names fail here, not after training
        SEG_DATASETS.get(name)
    if cfg.aggregation not in AGGREGATIONS:
        raise ConfigError(f"aggregation={cfg.aggregation!r}; use one of {AGGREGATIONS}")
    if cfg.protocol not in PROTOCOLS:
        raise ConfigError(f"protocol={cfg.protocol!r}: valid values are {', '.join(PROTOCOLS)} "
                          "(frozen trains the decoder on a fixed encoder)")
    check_label_fraction(cfg.label_fraction)
    check_norm(cfg.encoder_norm)
    for name, v in (("crop", cfg.crop), ("batch_size", cfg.batch_size),
                    ("steps_per_epoch", cfg.steps_per_epoch), ("max_epochs", cfg.max_epochs),
                    ("patience", cfg.patience)):
        if v < 1:
            raise ConfigError(f"{name} must be >= 1, got {v}")
    if not 0.1 <= cfg.scale <= 4:
        raise ConfigError(f"scale must be in [0.1, 4], got {cfg.scale}")
    if cfg.budget_minutes <= 0:
        raise ConfigError(f"budget_minutes must be > 0, got {cfg.budget_minutes}")


# -- the protocol -----------------------------------------------------------------------------
def freeze_encoder(model: NucleusUNet) -> None:
    """``protocol=frozen``: no gradient into the encoder (see the module docstring)."""
    for p in model.encoder.parameters():
        p.requires_grad_(False)


def train_mode(model: NucleusUNet, protocol: str) -> None:
    """``model.train()``, except that a frozen encoder's BatchNorm keeps its statistics."""
    model.train()
    if protocol == "frozen":
        model.encoder.eval()


EncoderFactory = Callable[[str | None], "nn.Module | tuple[nn.Module, dict[str, Any]]"]


def resolve_backbone(cfg: SegmentConfig, factory: EncoderFactory | None
                     ) -> tuple[nn.Module, dict[str, Any]]:
    """(encoder, what it is). ``arch=auto`` with a weights file: the file's own arch (a
    torchvision / timm ResNet: the one it loads into whole), as ``probe`` resolves it."""
    arch = None if cfg.arch == "auto" and cfg.encoder != "random" else cfg.resolved_arch()
    if factory is not None:
        got = factory(arch)
        backbone, info = got if isinstance(got, tuple) else (got, {})
    else:
        backbone, info = build_encoder(cfg.encoder, arch, 3, cfg.seed, norm=cfg.encoder_norm)
    info.setdefault("arch", arch or cfg.resolved_arch())
    return backbone, info


def load_cross_test(name: str, data_dir: str | None) -> NucleiDataset:
    """Cross-test set ``name``, read from the folder the user gave (issue 42 item 7: it
    was read from ``$SCARCELAB_DATA`` / ``../shared/data`` whatever ``data_dir`` said, so
    the cross-test numbers could come from other files than the ones pointed at).

    With ``data_dir``: ``data_dir/<name>`` (a folder holding the sets), else
    ``<data_dir>/../<name>`` (``data_dir`` is the training set's own folder and the
    cross-test set sits beside it), else ``data_dir`` itself, as the loader looks; never the
    default folders. Without: the loader's defaults, as for the training set."""
    if not data_dir:
        return load_nuclei(name, None)
    d = Path(data_dir).expanduser()
    folder = next((c for c in (d / name, d.parent / name) if c.is_dir()), d)
    try:
        ds = load_nuclei(name, folder)
    except DataError as e:
        if folder != d:
            raise
        raise DataError(f"cross-test set {name}: {e}. Cross-test sets are read from the "
                        f"--data-dir given ({d}): put the {name} folder in it or beside it"
                        ) from None
    log.info("cross-test set %s read from %s", name, ds.source)
    return ds


def _load_tiles(cfg: SegmentConfig) -> tuple[NucleiDataset, list[NucleiTile],
                                              list[NucleiTile], list[NucleiTile], int,
                                              np.random.Generator]:
    """(data, train, val, test, training tiles before the label fraction, the run's
    generator). The cross-test sets are read here, before training, so a missing or bad
    file fails now; the generator goes on to draw the training crops."""
    data: NucleiDataset = load_nuclei(cfg.dataset, cfg.data_dir)
    for name in cfg.cross_test:
        load_cross_test(name, cfg.data_dir)
    rng = np.random.default_rng(cfg.seed)
    train, val = split_validation(data.train, cfg.val_fraction, cfg.seed)
    n_train_pool = len(train)
    train = label_subset(train, cfg.label_fraction, cfg.seed)
    train, val = _cap(train, cfg.max_train_tiles, rng), _cap(val, cfg.max_val_tiles, rng)
    test = _cap(data.test, cfg.max_test_tiles, rng)
    return data, train, val, test, n_train_pool, rng


def _build_model(cfg: SegmentConfig, backbone: nn.Module, n_types: int, device: str,
                 arch: str, accel: Accel | None = None
                 ) -> tuple[NucleusUNet, list[nn.Parameter], torch.optim.Optimizer]:
    """The U-Net, its trainable parameters and their optimiser. Seeded again so the
    decoder's initial weights do not depend on what the data loading drew; a crop or
    window the encoder's stride does not divide is refused before any record is opened.
    ``accel`` (resolved): the weights' layout, compile and the optimiser's kernel."""
    accel = accel or cfg.resolved_accel()
    torch.manual_seed(cfg.seed)
    model = NucleusUNet(backbone, n_types=n_types).to(device)
    for name, v in (("crop", cfg.crop), ("window", cfg.window)):
        if v % model.stride:
            raise ConfigError(f"{name}={v} must be a multiple of the {arch} encoder's "
                              f"stride {model.stride}")
    if cfg.protocol == "frozen":
        freeze_encoder(model)
    accel.prepare(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(trainable, lr=cfg.lr, weight_decay=cfg.weight_decay,
                           **accel.optimizer_kwargs(torch.optim.Adam, device))
    return model, trainable, opt


def _open_study(cfg: SegmentConfig, tracker: Tracker, enc_info: dict[str, Any], arch: str,
                device: str, data: NucleiDataset, tiles: tuple[list[NucleiTile], ...],
                n_train_pool: int, n_types: int, trainable: list[nn.Parameter]) -> None:
    """The study record: the split's tile names (so a run can be re-scored on the same
    tiles) and the resolved configuration as artifacts; ``tiles`` = (train, val, test)."""
    train, val, test = tiles
    tags = {T.ROLE: "study", T.FAMILY: "segment",
            T.METHOD: "hovernet_unet", T.DATASET: cfg.dataset,
            T.SEED: str(cfg.seed), T.VERSION: scarcelab.__version__,
            **encoder_tags(cfg, enc_info, task="segment"),
            T.ARCH: arch, T.ENCODER: cfg.encoder,
            T.LABEL_FRACTION: f"{cfg.label_fraction:g}",
            T.AGGREGATION: cfg.aggregation}
    split = {"train": [t.name for t in train], "val": [t.name for t in val],
             "test": [t.name for t in test],
             "val_source_images": sorted({t.group for t in val})}
    resolved = {**dataclasses.asdict(cfg), "accel": cfg.resolved_accel().params(),
                "arch": arch, "device": device,
                "n_types": n_types, "n_train_tiles": len(train), "n_val_tiles": len(val),
                "n_test_tiles": len(test), "n_train_tiles_pool": n_train_pool,
                "n_trainable_params": sum(p.numel() for p in trainable),
                "encoder_info": enc_info}
    tracker.start_study(name=f"segment-{cfg.dataset}-{arch}-s{cfg.seed}", tags=tags,
                        params={k: v for k, v in resolved.items()
                                if k not in ("cross_test", "encoder_info", "accel")} | {
                            "cross_test": ",".join(cfg.cross_test)} | resolved["accel"],
                        artifacts={"split.json": split, "config.json": resolved},
                        dataset=DatasetInfo(cfg.dataset, data.source, data.digest()))


def run_segment(cfg: SegmentConfig, tracker: Tracker,
                backbone_factory: EncoderFactory | None = None) -> SegmentResult:
    """``backbone_factory(arch)``: the encoder (or ``(encoder, info)``) when the caller
    resolves it (the entry point resolves ``runs:/``/``models:/`` URIs through the tracking
    side, as ``probe`` does; ``arch`` None = the source's own); ``cfg.encoder`` stays the
    name the runs are tagged with."""
    _validate(cfg)
    need("skimage.segmentation", "segment (watershed post-processing)")  # before training
    device = cfg.resolved_device()
    torch.manual_seed(cfg.seed)  # before the backbone: a random encoder's init is seeded too
    backbone, enc_info = resolve_backbone(cfg, backbone_factory)  # fails fast
    arch = str(enc_info["arch"])
    data, train, val, test, n_train_pool, rng = _load_tiles(cfg)
    type_names = data.type_names if (cfg.types and data.type_names) else None
    n_types = len(type_names) if type_names else 0
    accel = cfg.resolved_accel()
    accel.apply_globals(device)
    model, trainable, opt = _build_model(cfg, backbone, n_types, device, arch, accel)
    _open_study(cfg, tracker, enc_info, arch, device, data, (train, val, test),
                n_train_pool, n_types, trainable)
    status = "FAILED"
    try:
        res = _train_and_test(cfg, tracker, model, opt, train, val, test, type_names,
                              device, rng, arch, accel)
        status = "FINISHED"
        return res
    finally:
        tracker.end_study(status)


@dataclass
class _Selected:
    """The checkpoint validation has selected so far: its value of the selecting PQ
    (``-1`` before any, so the first finite one wins), epoch, validation scores and a CPU
    copy of its weights (``None`` until an epoch's validation beat ``-1``)."""

    pq: float = -1.0
    epoch: int = -1
    state: dict[str, torch.Tensor] | None = None
    val: dict[str, float] = field(default_factory=dict)


@dataclass
class _Run:
    """One run's training and test phase. The budget covers training + per-epoch
    validation: a step is started only while it and a validation fit (at the last step's
    and validation's speed, ``step_s`` and ``val_s``), so the last epoch may be partial and
    is validated inside the budget; the first epoch always trains at least one step (a run
    needs a checkpoint). ``val_s_per_px`` (validation inference + scoring, per pixel) is
    the clock the test phase announces its estimate with."""

    cfg: SegmentConfig
    tracker: Tracker
    model: NucleusUNet
    device: str
    type_names: dict[int, str] | None
    rng: np.random.Generator
    start: float
    deadline: float
    sel: str  # the validation value that selects the checkpoint: pq or pq_pooled
    accel: Accel = field(default_factory=lambda: Accel(precision="fp32", channels_last="off"))
    step_s: float = 0.0
    val_s: float = 0.0
    val_s_per_px: float = 0.0

    def fits(self) -> bool:
        """Whether one more step and a validation fit in the budget."""
        return time.time() + self.step_s + self.val_s < self.deadline

    def score(self, tiles: list[NucleiTile], post: PostProcess,
              type_names: dict[int, str] | None) -> tuple[SegmentationEvaluator,
                                                         list[np.ndarray]]:
        """``tiles`` predicted at the run's window and scale, then scored."""
        cfg = self.cfg
        return score_maps(predict_set(self.model, tiles, cfg.window, self.device, cfg.scale,
                                      self.accel), tiles, post, type_names)

    def train(self, opt: torch.optim.Optimizer, train: list[NucleiTile],
              val: list[NucleiTile], post: PostProcess) -> tuple[_Selected, int]:
        """Epochs until ``max_epochs``, ``patience`` epochs without a better validation
        value, or the budget: the checkpoint selected and the number of epochs run."""
        cfg = self.cfg
        train_s = [rescale(t, cfg.scale) for t in train]
        best = _Selected()
        epoch, bad = 0, 0
        while epoch < cfg.max_epochs and (epoch == 0 or self.fits()):
            losses, n = self.train_epoch(opt, train_s, epoch)
            vres = self.validate(val, post)
            if vres[self.sel] > best.pq:
                best.pq, best.epoch, best.val = vres[self.sel], epoch, vres
                best.state = {k: v.detach().to("cpu", copy=True)
                              for k, v in self.model.state_dict().items()}
                bad = 0
            else:
                bad += 1
            self.log_epoch(losses, vres, n, epoch)
            epoch += 1
            if bad >= cfg.patience or n < cfg.steps_per_epoch:  # patience, or out of budget
                break
        return best, epoch

    def train_epoch(self, opt: torch.optim.Optimizer, train_s: list[NucleiTile],
                    epoch: int) -> tuple[dict[str, float], int]:
        """Up to ``steps_per_epoch`` steps, the first always (``n`` counts them): the mean
        of each loss term and ``n``. A non-finite loss fails the run (a lower lr is the
        usual fix)."""
        cfg, model = self.cfg, self.model
        train_mode(model, cfg.protocol)
        losses: dict[str, float] = {}
        n = 0
        for _ in range(cfg.steps_per_epoch):
            if n and not self.fits():
                break
            ts = time.time()
            batch = {k: v.to(self.device) for k, v in
                     make_batch(train_s, cfg.batch_size, cfg.crop, self.rng,
                                self.type_names is not None, cfg.scale).items()}
            # the forward pass under the run's autocast; HoVer-Net's loss on its fp32 output
            with self.accel.autocast(self.device):
                out = model(self.accel.images(batch["x"]))
            terms = hovernet_loss(out.float(), batch)
            if not torch.isfinite(terms["loss"]):
                raise TrialFailed(f"segment: non-finite loss at epoch {epoch}; lower lr "
                                  f"(now {cfg.lr})")
            opt.zero_grad(set_to_none=True)
            terms["loss"].backward()
            opt.step()
            for k, v in terms.items():
                losses[k] = losses.get(k, 0.0) + float(v.detach())
            n += 1
            self.step_s = time.time() - ts
        return {k: v / n for k, v in losses.items()}, n

    def validate(self, val: list[NucleiTile], post: PostProcess) -> dict[str, float]:
        """The epoch's validation scores; its duration sets the budget's and the test
        phase's clocks."""
        tv = time.time()
        ev, _ = self.score(val, post, self.type_names)
        vres = ev.result()
        self.val_s = time.time() - tv
        self.val_s_per_px = self.val_s / max(1, _pixels(val))
        return vres

    def log_epoch(self, losses: dict[str, float], vres: dict[str, float], n: int,
                  epoch: int) -> None:
        """The epoch's curves on the study record (``train/loss``, ``train/loss_<term>``,
        ``seg/val_<m>``, the clock and the steps it ran)."""
        self.tracker.log_metrics(
            {**{f"train/{'loss' if k == 'loss' else 'loss_' + k}": v
                for k, v in losses.items()},
             **_keyed({k: v for k, v in vres.items() if k in METRICS}, "seg/val_"),
             "time/elapsed_s": time.time() - self.start, "time/steps": float(n)},
            step=epoch, scope="study")

    def announce_test(self, best: _Selected, val: list[NucleiTile], test: list[NucleiTile],
                      cross_sets: list[tuple[str, list[NucleiTile]]]) -> None:
        """After the budget (it covers training + per-epoch validation): the selected
        checkpoint on the test set(s), announced with a time estimate at the validation's
        speed."""
        cfg = self.cfg
        est = self.val_s_per_px * (
            _pixels(test) + sum(_pixels(c) for _, c in cross_sets)
            + (len(EDGE_GRID) * _pixels(val) if cfg.tune_threshold else 0))
        _phase(self.tracker, f"testing epoch {best.epoch}'s checkpoint on {len(test)} "
               f"{cfg.dataset} tiles" + "".join(f" + {len(c)} {n}" for n, c in cross_sets)
               + f" (about {est:.0f} s at the validation's speed)")

    def tune_edge(self, val: list[NucleiTile], post: PostProcess) -> PostProcess:
        """``tune_threshold``: the marker threshold of EDGE_GRID with the best selecting
        value on validation for the selected checkpoint (NaN counts as -1; a tie goes to the
        one nearest HoVer-Net's), before the test set is seen."""
        cfg = self.cfg
        val_maps = predict_set(self.model, val, cfg.window, self.device, cfg.scale, self.accel)
        grid = {e: score_maps(val_maps, val, dataclasses.replace(post, edge_threshold=e),
                              self.type_names)[0].result()[self.sel] for e in EDGE_GRID}
        edge = max(EDGE_GRID, key=lambda e: (np.nan_to_num(grid[e], nan=-1.0),
                                             -abs(e - post.edge_threshold)))
        return dataclasses.replace(post, edge_threshold=edge)

    def cross_test(self, cross_sets: list[tuple[str, list[NucleiTile]]], post: PostProcess,
                   final: dict[str, float]) -> dict[str, dict[str, float]]:
        """Each cross-dataset test set, scored on its instances alone (no type names), each
        announced with its estimate; the values are added to ``final`` as
        ``seg/cross/<dataset>/<m>``."""
        cross: dict[str, dict[str, float]] = {}
        for name, ctiles in cross_sets:
            _phase(self.tracker, f"cross-test on {len(ctiles)} {name} tiles (about "
                   f"{self.val_s_per_px * _pixels(ctiles):.0f} s)")
            cev, _ = self.score(ctiles, post, None)
            cross[name] = cev.result()
            final.update(_keyed(cross[name], f"seg/cross/{name}/"))
        return cross

    def log_outputs(self, test: list[NucleiTile], preds: list[np.ndarray], best: _Selected,
                    arch: str, edge: float) -> None:
        """Overlays of the first test tiles, the selected checkpoint and the model."""
        cfg, tracker = self.cfg, self.tracker
        _phase(tracker, "logging the checkpoint, overlays and the model")
        for tile, pred in list(zip(test, preds, strict=True))[:cfg.n_overlays]:
            name = overlay_name(cfg.dataset, tile.name)
            tracker.log_image(overlay(tile, pred, tile.name), name)
            note_artifact = getattr(tracker, "note_artifact", None)
            if note_artifact is not None:
                note_artifact(name)
        tracker.log_checkpoint({"state_dict": best.state, "epoch": best.epoch,
                                "arch": arch, "n_types": self.model.n_types,
                                "edge_threshold": edge}, name="best.pt")
        # a batch of 2: MLflow marks the batch dimension Dim.AUTO, and torch.export fixes a
        # dimension whose example size is 1 (warning "0/1 specialized"), so a one-tile
        # example gave a model that takes one tile at a time
        tracker.log_model(for_export(copy.deepcopy(self.model)),
                          torch.zeros(2, 3, cfg.crop, cfg.crop))


def _train_and_test(cfg: SegmentConfig, tracker: Tracker, model: NucleusUNet,
                    opt: torch.optim.Optimizer, train: list[NucleiTile],
                    val: list[NucleiTile], test: list[NucleiTile],
                    type_names: dict[int, str] | None, device: str,
                    rng: np.random.Generator, arch: str,
                    accel: Accel | None = None) -> SegmentResult:
    """Training under the budget, then the selected checkpoint on the test set(s), every
    value on the study record. The test phase's draws (the cross-test caps) come from the
    same ``rng`` after training's, so a run's crops never depend on its cross-test sets."""
    start = time.time()
    run = _Run(cfg, tracker, model, device, type_names, rng, start,
               deadline=start + cfg.budget_minutes * 60.0,
               sel="pq" if cfg.aggregation == "image" else "pq_pooled",
               accel=accel or cfg.resolved_accel())
    post = PostProcess()
    best, epochs = run.train(opt, train, val, post)
    train_time = time.time() - start
    if best.state is None:
        raise TrialFailed("segment: the budget ended before one epoch finished; raise "
                          "budget_minutes or lower steps_per_epoch")
    model.load_state_dict(best.state)
    t_eval = time.time()
    cross_data = {name: load_cross_test(name, cfg.data_dir) for name in cfg.cross_test}
    cross_sets = [(name, _cap(ds.test, cfg.max_test_tiles, rng))
                  for name, ds in cross_data.items()]
    run.announce_test(best, val, test, cross_sets)
    edge = post.edge_threshold  # HoVer-Net's 0.4 unless tuned
    if cfg.tune_threshold:
        post = run.tune_edge(val, post)
        edge = post.edge_threshold
    ev, preds = run.score(test, post, type_names)
    test_res = ev.result()
    final = {**_keyed(test_res, "seg/"),
             "seg/val_pq_selected": best.pq, "seg/selected_epoch": best.epoch,
             "seg/edge_threshold": edge}
    cross = run.cross_test(cross_sets, post, final)
    eval_s = time.time() - t_eval
    final.update({"time/train_s": train_time, "time/eval_s": eval_s,
                  "time/elapsed_s": time.time() - start})
    tracker.log_metrics(final, step=best.epoch, scope="study")
    tracker.set_tags({T.SELECTED_EPOCH: str(best.epoch), T.EDGE_THRESHOLD: str(edge)})
    run.log_outputs(test, preds, best, arch, edge)
    return SegmentResult(best.epoch, epochs, best.val, test_res, cross, edge,
                         train_time, eval_s,
                         cross_sources={n: ds.source for n, ds in cross_data.items()})
