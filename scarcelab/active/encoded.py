"""Encoded image sets: embeddings of an image dataset from a scarcelab self-supervised
encoder, computed once and cached.

CDALBench's "encoded" domain runs AL on frozen self-supervised features with a linear
classifier (their configs: a SimCLR ResNet18 per dataset). Here the encoder is any
registered self-supervised method (``simclr``, ``byol``, ``dino``…) trained on the
dataset's *training images* (no labels), or a backbone handed in by the caller (the
tracking layer loads one from a scarcelab ``self`` run's model). Training an encoder costs
minutes to hours while an AL sweep re-reads the embeddings hundreds of times, so the
result is cached under a key that covers everything it depends on (the images, the
method, architecture, epochs, batch size, learning rate, seed, or the pretrained weights):
:class:`DiskEncodingCache` here, and an MLflow-artifact cache in ``tracking/`` that makes
one machine's encoding every machine's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from scarcelab.accel import Accel, resolve
from scarcelab.errors import ConfigError

FORMAT_VERSION = 1
#: the encoder loop's CPU layout under ``channels_last=auto``: it never converted
CPU_CHANNELS_LAST = "off"


def encoder_accel(accel: Accel | None, device: torch.device | str) -> Accel:
    """``accel`` resolved as the encoder's training and embedding run it."""
    return resolve(accel, device, cpu_channels_last=CPU_CHANNELS_LAST)


#: the encodings made before precision settings existed: a key leaves out settings equal
#: to these, so their cache entries stay valid
_FORMER = encoder_accel(None, "cpu")


@dataclass
class EncoderConfig:
    """How to obtain the encoder. ``arch="auto"``: resnet18 on a GPU, small_cnn on a CPU
    (CDALBench uses a ResNet18; on a CPU that takes hours). ``lr=None`` uses the method's
    default."""

    method: str = "simclr"
    arch: str = "auto"
    epochs: int = 30
    batch_size: int = 256
    lr: float | None = None
    seed: int = 0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EncoderConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ConfigError(f"unknown encoder setting(s) {sorted(unknown)} (set as "
                              f"encoder.<name>=…); valid: {sorted(names)}")
        types = {"epochs": int, "batch_size": int, "seed": int, "lr": float}
        kwargs: dict[str, Any] = {k: (types[k](v) if k in types and v is not None else v)
                                  for k, v in d.items()}
        return cls(**kwargs)

    def resolved_arch(self, device: torch.device) -> str:
        if self.arch != "auto":
            return self.arch
        return "resnet18" if device.type == "cuda" else "small_cnn"


@dataclass
class Encoded:
    """Embeddings of the train and test images, with how they were made."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)
    encoder_state: dict[str, torch.Tensor] | None = None


class EncodingCache(Protocol):
    """Where encodings are kept between sweeps. ``get`` returns None on a miss; ``put``
    returns a short description of where the encoding now lives (logged with the sweep)."""

    def get(self, key: str) -> tuple[Encoded, str] | None: ...

    def put(self, key: str, enc: Encoded) -> str: ...


class DiskEncodingCache:
    """``<root>/<key>.npz`` (arrays), ``<key>.json`` (meta), ``<key>.encoder.pt`` (weights)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def paths(self, key: str) -> tuple[Path, Path, Path]:
        return (self.root / f"{key}.npz", self.root / f"{key}.json",
                self.root / f"{key}.encoder.pt")

    def get(self, key: str) -> tuple[Encoded, str] | None:
        npz, meta, _ = self.paths(key)
        if not (npz.is_file() and meta.is_file()):
            return None
        from scarcelab.data.safe_read import load_npz, read_json

        fix = f"delete {npz} and {meta} (a cache of encodings) to have them computed again"
        # cached files may come from a store: read without pickles, sizes checked first
        arrays = load_npz(npz, ("x_train", "y_train", "x_test", "y_test"), fix=fix)
        return Encoded(x_train=arrays["x_train"], y_train=arrays["y_train"],
                       x_test=arrays["x_test"], y_test=arrays["y_test"],
                       meta=read_json(meta, fix=fix)), f"disk:{npz}"

    def put(self, key: str, enc: Encoded) -> str:
        self.root.mkdir(parents=True, exist_ok=True)
        npz, meta, weights = self.paths(key)
        tmp = npz.with_suffix(".tmp.npz")  # write-then-rename: a killed run leaves no half file
        np.savez(tmp, x_train=enc.x_train, y_train=enc.y_train, x_test=enc.x_test,
                 y_test=enc.y_test)
        tmp.replace(npz)
        if enc.encoder_state is not None:
            torch.save(enc.encoder_state, weights)
        meta.write_text(json.dumps(enc.meta, indent=1, sort_keys=True))
        return f"disk:{npz}"


def encoding_key(train_x: np.ndarray, test_x: np.ndarray, cfg: EncoderConfig, arch: str,
                 pretrained: nn.Module | None = None, pretrained_id: str = "",
                 accel: Accel | None = None, unlabeled_x: np.ndarray | None = None) -> str:
    """The cache key of an encoding. ``accel`` (resolved): the precision and kernels it
    is made with, part of the key unless they are the former fp32 path (whose keys stay
    as they were): a bf16 encoder's embeddings are not the fp32 one's. ``unlabeled_x``: a
    real pool the encoder also trains on (part of the key when it does)."""
    h = hashlib.sha256(f"scarcelab-encoding-v{FORMAT_VERSION}".encode())
    if accel is not None and accel != _FORMER:
        h.update(json.dumps(accel.params(), sort_keys=True).encode())
    for a in (train_x, test_x):
        h.update(str(a.shape).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    if unlabeled_x is not None and pretrained is None:  # trained on them too: part of the key
        h.update(f"unlabeled{unlabeled_x.shape}".encode())
        h.update(np.ascontiguousarray(unlabeled_x).tobytes())
    if pretrained is not None:
        h.update(pretrained_id.encode())
        for k, v in sorted(pretrained.state_dict().items()):
            h.update(k.encode())
            h.update(v.detach().cpu().contiguous().numpy().tobytes())
    else:
        h.update(json.dumps({**dataclasses.asdict(cfg), "arch": arch}, sort_keys=True).encode())
    return h.hexdigest()[:20]


def train_encoder(images: np.ndarray, num_classes: int, cfg: EncoderConfig,
                  device: torch.device, accel: Accel | None = None
                  ) -> tuple[nn.Module, dict[str, float]]:
    """Train ``cfg.method`` on uint8 images (N, C, H, W) for ``cfg.epochs`` epochs and return
    its backbone. All randomness comes from ``cfg.seed``; the global RNG is forked, not
    consumed. ``accel``: precision and kernels (``auto`` per device; on CPU fp32 and the
    NCHW layout this loop always had)."""
    from scarcelab.data.augment import AUGMENTATIONS, to_float
    from scarcelab.methods import METHODS, Batch, Progress
    from scarcelab.methods.base import DataInfo
    from scarcelab.models import create_model
    from scarcelab.models.classifier import normalize
    from scarcelab.train import make_optimizer, optimizer_step

    cls = METHODS.get(cfg.method)
    if cls.family != "self":
        raise ConfigError(f"encoder.method={cfg.method!r} is a {cls.family} method; the "
                          f"encoder must be self-supervised (scarcelab list methods)")
    arch = cfg.resolved_arch(device)
    gen = torch.Generator().manual_seed(cfg.seed)
    hp = {} if cfg.lr is None else {"lr": cfg.lr}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        method = cls(create_model(arch, in_channels=images.shape[1]), num_classes, hp)
    acc = encoder_accel(accel, device)
    acc.apply_globals(device)
    method.to(device).train()
    acc.prepare(method, compiled=method.backbone)
    n = len(images)
    method.on_train_start(DataInfo(0, n, num_classes, [0] * num_classes))
    views = [AUGMENTATIONS.get(v) for v in cls.views]
    bs = min(cfg.batch_size, n)
    spe = max(1, n // bs)
    total = spe * cfg.epochs
    opt, sched = make_optimizer(method, total, accel=acc)
    x = torch.as_tensor(images).to(device)
    t0, step, last = time.perf_counter(), 0, float("nan")
    loss: torch.Tensor | None = None
    for epoch in range(cfg.epochs):
        perm = torch.randperm(n, generator=gen)
        for s in range(spe):
            idx = perm[s * bs:(s + 1) * bs].to(device)
            u = to_float(x[idx])
            batch = acc.batch(Batch(x=[], y=torch.empty(0, dtype=torch.long, device=device),
                                    u=[normalize(aug(u, gen)) for aug in views], u_index=idx))
            progress = Progress(step=step, total_steps=total, epoch=epoch)
            loss = optimizer_step(method, opt, sched, batch, progress, acc)["loss"]
            step += 1
        assert loss is not None  # spe >= 1: every epoch takes at least one step
        last = float(loss.detach())
    stats = {"encoder_train_s": time.perf_counter() - t0, "encoder_steps": float(step),
             "encoder_final_loss": last}
    return method.backbone.eval(), stats


@torch.no_grad()
def embed_images(backbone: nn.Module, images: np.ndarray, device: torch.device,
                 batch_size: int = 512, accel: Accel | None = None) -> np.ndarray:
    """Backbone features of uint8 images, float32 (N, F), in evaluation mode (under
    ``accel``'s autocast and input layout, resolved as the encoder loop resolves it)."""
    from scarcelab.train import forward_images

    backbone.eval().to(device)
    return forward_images(backbone, images, batch_size, device,
                          encoder_accel(accel, device)).astype(np.float32)


def encode_dataset(name: str, train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray,
                   test_y: np.ndarray, num_classes: int, cfg: EncoderConfig,
                   device: torch.device, cache: EncodingCache | None,
                   pretrained: nn.Module | None = None, pretrained_id: str = "",
                   accel: Accel | None = None, unlabeled_x: np.ndarray | None = None
                   ) -> tuple[Encoded, str, str]:
    """Embeddings of a dataset's images, from the cache when the key matches.

    ``unlabeled_x``: a real unlabeled pool (a user's ``unlabeled/`` images), which the
    encoder trained here learns from too — the self-supervised step is where images
    without labels help an AL sweep, whose queries need labels to reveal.

    Returns (encoded, key, where): ``where`` says where the encoding came from or now
    lives (``disk:…``, ``mlflow-run:…``), prefixed ``computed `` when it was made here.
    ``accel``: the precision and kernels of the encoder's training and of the embedding
    (``auto``: per device), part of the key when they are not the former fp32 path.
    """
    acc = encoder_accel(accel, device)
    arch = "pretrained" if pretrained is not None else cfg.resolved_arch(device)
    key = encoding_key(train_x, test_x, cfg, arch, pretrained, pretrained_id, acc,
                       unlabeled_x=unlabeled_x)
    if cache is not None and (hit := cache.get(key)) is not None:
        return hit[0], key, hit[1]
    if pretrained is not None:
        backbone, stats = pretrained, {}
        desc: dict[str, Any] = {"encoder": "pretrained", "source": pretrained_id}
    else:
        images = train_x if unlabeled_x is None or not len(unlabeled_x) else \
            np.concatenate([train_x, np.asarray(unlabeled_x)])
        backbone, stats = train_encoder(images, num_classes, cfg, device, acc)
        desc = {"encoder": cfg.method, **dataclasses.asdict(cfg), "arch": arch}
    t0 = time.perf_counter()
    f_train = embed_images(backbone, train_x, device, accel=acc)
    f_test = embed_images(backbone, test_x, device, accel=acc)
    enc = Encoded(f_train, train_y.astype(np.int64), f_test, test_y.astype(np.int64),
                  meta={**desc, **stats, "dataset": name, "key": key, "device": str(device),
                        **({"accel": acc.params()} if acc != _FORMER else {}),
                        "embed_s": time.perf_counter() - t0,
                        "dim": int(f_train.shape[1]), "format_version": FORMAT_VERSION},
                  encoder_state={k: v.detach().cpu() for k, v in backbone.state_dict().items()})
    where = cache.put(key, enc) if cache is not None else "memory"
    return enc, key, f"computed {where}"
