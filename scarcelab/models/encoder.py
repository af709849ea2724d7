"""Pretrained encoders from local files: a backbone by arch, with weights read safely.

Transfer evaluation (``probe``, ``segment``) starts from an *encoder*: a registered backbone
(``scarcelab.models``) plus weights. This module is the core half of the encoder resolver;
``tracking/encoders.py`` adds MLflow sources (``runs:/…``, ``models:/…``) on top and
hands the downloaded file back to :func:`backbone_from_file`.

Nothing is unpickled. Every file goes through ``torch.load(weights_only=True)``; a
scarcelab study checkpoint also holds non-tensor objects (the fitted linear probe of a
self-supervised study, sklearn inside it), which that loader refuses. Rather than trusting
them, :func:`read_weights` maps each such global to an inert placeholder class
(:class:`Opaque`) through ``torch.serialization.safe_globals``: the placeholder only
records what it was given, so no code named by the file ever runs, while the tensors —
the only thing an encoder needs — load as usual. A pickled whole model (what
``mlflow.pytorch.log_model(serialization_format="pickle")`` stores) reads the same way,
as a tree of placeholders whose ``_parameters`` / ``_buffers`` are real tensors
(:func:`module_state_dict`).

Accepted weight files (:func:`extract_backbone_state` tells them apart):

* a scarcelab study checkpoint (``checkpoints/best.pt``: ``state_dict`` of the method,
  ``arch``, ``in_channels``) — the backbone is the ``backbone.`` part;
* a plain backbone ``state_dict`` (as ``torch.save(backbone.state_dict(), f)`` writes it),
  or an exported classifier's (keys under ``backbone.``);
* an ImageNet-style torchvision ResNet ``state_dict`` (``conv1.weight``, ``layer1…``,
  ``fc.weight``), e.g. torchvision's ``resnet18-f37072fd.pth`` fetched on a machine with
  network access. scarcelab's resnets use the small-image stem (3x3 stride-1 ``conv1``, no
  max-pool), so every residual stage and BatchNorm loads, while the 7x7 ImageNet ``conv1``
  and the ``fc`` head cannot: they are reported in ``info["skipped"]`` and stay at their
  initialisation. Hub downloads are impossible on the project machines; this is how
  ImageNet weights enter.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from scarcelab.errors import ConfigError, DataError
from scarcelab.models import create_model

RANDOM = "random"


class Opaque:
    """Stands in for any class or function a weights file names that is not a tensor type.

    Constructed with whatever the pickle passes and given its state, it keeps both as data
    (``_args``, ``_state``) and does nothing else, so reading a file never runs its code.
    """

    _name = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> Opaque:
        obj = object.__new__(cls)
        obj.__dict__["_args"] = args
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self.__dict__["_state"] = state

    def __repr__(self) -> str:
        return f"<opaque {self._name}>"


def read_weights(path: str | os.PathLike[str]) -> Any:
    """``torch.load(path, weights_only=True)``, with foreign globals read as :class:`Opaque`.

    Raises :class:`DataError` naming the file when it is not a torch file at all.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"encoder weights {path} do not exist")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        pass  # foreign globals (or not a pickle at all): retry with placeholders below
    except Exception as e:  # noqa: BLE001 - torch's parser raises anything on garbage
        raise DataError(f"{path} is not a torch weights file ({type(e).__name__}: "
                        f"{str(e)[:200]})") from e
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        holders: list[Callable[..., Any] | tuple[Callable[..., Any], str]] = [
            (type(n.rsplit(".", 1)[-1], (Opaque,), {"_name": n}), n) for n in names]
        with torch.serialization.safe_globals(holders):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - refused globals, or not a weights file
        raise DataError(f"{path} could not be read as weights without running its code "
                        f"({type(e).__name__}: {str(e)[:300]})") from e


def _state(obj: Any) -> dict[str, Any]:
    st = obj.__dict__.get("_state") if isinstance(obj, Opaque) else None
    return st if isinstance(st, dict) else {}


def module_state_dict(obj: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """The ``state_dict`` of a pickled ``nn.Module`` read by :func:`read_weights`: parameters
    and persistent buffers of the placeholder tree, keyed as ``Module.state_dict`` keys them."""
    st = _state(obj)
    out: dict[str, torch.Tensor] = {}
    skip = st.get("_non_persistent_buffers_set") or set()
    for group in ("_parameters", "_buffers"):
        for k, v in (st.get(group) or {}).items():
            if isinstance(v, torch.Tensor) and not (group == "_buffers" and k in skip):
                out[prefix + k] = v
    for name, child in (st.get("_modules") or {}).items():
        if child is not None:
            out.update(module_state_dict(child, f"{prefix}{name}."))
    return out


def _is_state_dict(d: Any) -> bool:
    return isinstance(d, dict) and bool(d) and all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in d.items())


def _torchvision_prefix(state: dict[str, torch.Tensor]) -> str | None:
    """The key prefix under which ``state`` holds a torchvision / timm-named ResNet
    (``conv1``, ``bn1``, ``layer1.0.conv1`` …): ``""`` for torchvision's and timm's own
    files and for Lunit's released trunks, ``module.encoder_q.`` for a MoCo checkpoint,
    ``module.backbone.`` for a DINO one, and so on. scarcelab's own ResNets keep the same
    names under ``net.``; those are not a foreign layout (None)."""
    tail = "layer1.0.conv1.weight"
    for key in sorted(k for k in state if k.endswith(tail)):
        prefix = key[: -len(tail)]
        if prefix.endswith("net.") or f"{prefix}conv1.weight" not in state \
                or f"{prefix}bn1.weight" not in state:
            continue
        return prefix
    return None


def resnet_arch_of(state: dict[str, torch.Tensor], where: str) -> str:
    """The scarcelab arch that a torchvision-named ResNet state dict loads into *whole*:
    ``resnet18_imagenet`` / ``resnet50_imagenet`` for the 7x7 ImageNet stem (the stem is
    kept, so no pre-trained tensor is left behind), ``resnet18`` / ``resnet50`` for a
    3x3 small-image stem."""
    depths = tuple(1 + max((int(k.split(".")[1]) for k in state
                            if k.startswith(f"layer{i}.") and k.split(".")[1].isdigit()),
                           default=-1) for i in range(1, 5))
    bottleneck = "layer1.0.conv3.weight" in state
    known: dict[tuple[tuple[int, ...], bool], str] = {((3, 4, 6, 3), True): "resnet50",
                                                      ((2, 2, 2, 2), False): "resnet18"}
    name = known.get((depths, bottleneck))
    if name is None:
        raise ConfigError(f"{where}: a torchvision/timm ResNet with blocks {depths} "
                          f"({'bottleneck' if bottleneck else 'basic'}); scarcelab has "
                          "resnet18 and resnet50: pass such a file, or arch=<name> to load "
                          "what fits")
    stem = state["conv1.weight"].shape[-1]
    return f"{name}_imagenet" if stem == 7 else name


CONTAINERS = ("state_dict", "model", "teacher", "module", "backbone", "encoder")


def extract_backbone_state(obj: Any, where: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(backbone state dict, what the file says about itself) from anything
    :func:`read_weights` returned; see the module docstring for the accepted layouts."""
    meta: dict[str, Any] = {}
    if isinstance(obj, Opaque):  # a pickled whole module (an exported classifier)
        obj = module_state_dict(obj)
        meta["format"] = "pickled-module"
    if isinstance(obj, dict) and not _is_state_dict(obj):
        inner = next((k for k in CONTAINERS if _is_state_dict(obj.get(k))), None)
        if inner is not None:
            for k in ("arch", "in_channels", "method", "num_classes", "split_hash"):
                if k in obj and isinstance(obj[k], (str, int)):
                    meta[k] = obj[k]
            meta.setdefault("format", "scarcelab-checkpoint" if inner == "state_dict"
                            else f"container:{inner}")
            obj = obj[inner]
    if not _is_state_dict(obj):
        raise DataError(f"{where} holds no state dict of tensors (found {type(obj).__name__}); "
                        "expected a scarcelab checkpoint, a backbone state_dict or a "
                        "torchvision / timm ResNet state_dict")
    tv = _torchvision_prefix(obj)
    if tv is not None:  # a foreign ResNet: its own arch naming is not scarcelab's
        state = {k[len(tv):]: v for k, v in obj.items() if k.startswith(tv)}
        if "arch" in meta:
            meta["file_arch"] = meta.pop("arch")
        meta.pop("in_channels", None)
        meta["format"] = "torchvision"
        if tv:
            meta["prefix"] = tv
    elif any(k.startswith("backbone.") for k in obj):
        state = {k[len("backbone."):]: v for k, v in obj.items() if k.startswith("backbone.")}
        meta.setdefault("format", "backbone-prefixed")
    else:
        state = dict(obj)
        meta.setdefault("format", "backbone")
    return state, meta


def fingerprint(module: nn.Module) -> str:
    """sha256 (16 hex) of a module's state: identifies the weights in caches and tags."""
    h = hashlib.sha256()
    for k, v in sorted(module.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


# -- the input normalisation the weights were trained with -------------------------------------
IMAGENET_MEAN = (0.485, 0.456, 0.406)  # torchvision's and timm's ResNet weights
IMAGENET_STD = (0.229, 0.224, 0.225)
NORMS = ("auto", "imagenet", "none")


def parse_norm(spec: str, fmt: str | None) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """``encoder_norm``: ``auto`` (ImageNet statistics for a torchvision / timm file, none
    otherwise), ``imagenet``, ``none``, or ``m1,m2,m3/s1,s2,s3`` (per-channel mean / std of
    [0, 1] images, e.g. Lunit's released trunks')."""
    if spec == "none" or (spec == "auto" and fmt != "torchvision"):
        return None
    if spec in ("auto", "imagenet"):
        return IMAGENET_MEAN, IMAGENET_STD
    try:
        m, sd = spec.split("/")
        mean, std = (tuple(float(v) for v in part.split(",")) for part in (m, sd))
    except ValueError:
        mean = std = ()
    if not mean or len(mean) != len(std) or min(std) <= 0:
        raise ConfigError(f"encoder_norm={spec!r}: use auto, imagenet, none or "
                          "m1,m2,m3/s1,s2,s3 (mean / std of [0, 1] images, std > 0)")
    return mean, std


def check_norm(spec: str) -> None:
    """A malformed ``encoder_norm`` fails here, before any data or weights are read."""
    if spec not in NORMS:
        parse_norm(spec, None)


@torch.no_grad()
def fold_input_norm(net: nn.Module, mean: tuple[float, ...], std: tuple[float, ...],
                    where: str) -> None:
    """Make ``net``, fed scarcelab's fixed normalisation ((x - 0.5) / 0.5, every model
    path uses it), compute what the weights computed on ``(x - mean) / std``.

    The change of variables is affine per input channel, u = a z + b with
    a = 0.5 / std, b = (0.5 - mean) / std, so the first convolution's weights are scaled by
    ``a`` and its constant response to ``b`` is taken out of the following BatchNorm's
    running mean. That is exact away from the zero padding of the stem (the outer 3 pixels
    of a 7x7 stem's output), and in training mode BatchNorm's batch statistics absorb the
    shift anyway. Doing it in the weights, not in a wrapper, keeps every path (features,
    fine-tuning, segmentation, export) unchanged."""
    from scarcelab.models.classifier import NORM_MEAN, NORM_STD

    inner = getattr(net, "net", None)
    conv, bn = getattr(inner, "conv1", None), getattr(inner, "bn1", None)
    if not isinstance(conv, nn.Conv2d) or not isinstance(bn, nn.BatchNorm2d):
        raise ConfigError(f"{where}: encoder_norm folds into a ResNet stem (conv1 + bn1); "
                          "this encoder has none, pass encoder_norm=none")
    running_mean = bn.running_mean  # a ResNet stem's BatchNorm tracks running statistics
    assert running_mean is not None
    if len(mean) != conv.in_channels:
        raise ConfigError(f"{where}: encoder_norm has {len(mean)} channels, the encoder's "
                          f"stem takes {conv.in_channels}")
    m = torch.tensor(mean, dtype=conv.weight.dtype)
    s = torch.tensor(std, dtype=conv.weight.dtype)
    a, b = NORM_STD / s, (NORM_MEAN - m) / s
    shift = (conv.weight * b[None, :, None, None]).sum((1, 2, 3))
    conv.weight.mul_(a[None, :, None, None])
    running_mean.sub_(shift)


def load_backbone(state: dict[str, torch.Tensor], meta: dict[str, Any], arch: str | None,
                  in_channels: int | None, where: str,
                  norm: str = "auto") -> tuple[nn.Module, dict[str, Any]]:
    """Build the backbone and load ``state`` into it (strictly, except a torchvision /
    timm ResNet's ``fc`` head, and its stem when ``arch`` names a small-image ResNet).
    ``arch=None``: what the file says or, for a torchvision / timm ResNet, the arch it
    loads into whole (:func:`resnet_arch_of`). ``in_channels=None``: what the file says,
    else the first convolution's input width. ``norm``: :func:`parse_norm`."""
    foreign = meta.get("format") == "torchvision"
    file_arch = resnet_arch_of(state, where) if foreign else meta.get("arch")
    if arch and file_arch and arch != file_arch and not foreign:
        raise ConfigError(f"arch={arch!r} but {where} holds a {file_arch!r} encoder; pass "
                          f"arch={file_arch} (or auto)")
    arch = arch or file_arch
    if not arch:
        raise ConfigError(f"{where} does not say which architecture it holds; pass arch=<name> "
                          "(scarcelab list archs)")
    if in_channels is None:  # what the file says, else the first convolution's input width
        first = next((v for v in state.values() if getattr(v, "ndim", 0) == 4), None)
        in_channels = int(meta.get("in_channels", first.shape[1] if first is not None else 3))
    if meta.get("in_channels") not in (None, in_channels):
        raise ConfigError(f"{where} was trained on {meta['in_channels']}-channel images; the "
                          f"dataset has {in_channels} channels")
    net = create_model(arch, in_channels=in_channels)
    info: dict[str, Any] = {**meta, "arch": arch}
    if foreign:
        own = net.state_dict()
        state = {f"net.{k}": v for k, v in state.items()}
        usable = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
        info["skipped"] = sorted(set(state) - set(usable))
        missing = sorted(set(own) - set(usable))
        if any(not k.startswith("net.conv1.") for k in missing):
            raise DataError(f"{where}: the torchvision/timm weights do not fit arch {arch!r} "
                            f"(missing {missing[:5]}…); pass arch={file_arch} (or auto)")
        net.load_state_dict(usable, strict=False)
        if missing:  # the stem stayed at its initialisation: nothing to fold the norm into
            info["stem"] = "initialised"
            norm = "none" if norm == "auto" else norm
    else:
        try:
            net.load_state_dict(state, strict=True)
        except RuntimeError as e:
            raise DataError(f"{where}: weights do not fit arch {arch!r} with {in_channels} "
                            f"input channels: {str(e)[:400]}") from e
    stats = parse_norm(norm, meta.get("format"))
    if stats is not None:
        fold_input_norm(net, *stats, where)
    info["input_norm"] = ("none" if stats is None else "imagenet"
                          if stats == (IMAGENET_MEAN, IMAGENET_STD)
                          else f"{','.join(map(str, stats[0]))}/{','.join(map(str, stats[1]))}")
    info["fingerprint"] = fingerprint(net)
    return net.eval(), info


def backbone_from_file(path: str | os.PathLike[str], arch: str | None, in_channels: int | None,
                       source: str | None = None, norm: str = "auto"
                       ) -> tuple[nn.Module, dict[str, Any]]:
    """A backbone with the weights of a local file (any accepted layout)."""
    where = source or str(path)
    state, meta = extract_backbone_state(read_weights(path), where)
    net, info = load_backbone(state, meta, arch, in_channels, where, norm)
    return net, {"source": where, **info}


def build_encoder(spec: str, arch: str | None, in_channels: int,
                  seed: int = 0, norm: str = "auto") -> tuple[nn.Module, dict[str, Any]]:
    """``random`` (the from-scratch control, seeded) or a local weights file.

    MLflow sources (``runs:/``, ``models:/``) are resolved by ``tracking.encoders``.
    ``norm`` (``encoder_norm``): the input normalisation the file's weights expect
    (:func:`parse_norm`); a random encoder has none.
    """
    check_norm(norm)
    if spec == RANDOM:
        if not arch:
            raise ConfigError("encoder=random needs an arch (scarcelab list archs)")
        if norm not in ("auto", "none"):
            raise ConfigError(f"encoder_norm={norm!r} is for pre-trained weights; a random "
                              "encoder has none (use auto)")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            net = create_model(arch, in_channels=in_channels)
        return net, {"source": RANDOM, "arch": arch, "format": RANDOM, "input_norm": "none",
                     "fingerprint": fingerprint(net)}
    if spec.startswith(("runs:/", "models:/")):
        raise ConfigError(f"encoder={spec!r} is an MLflow URI: resolve it with "
                          "tracking.encoders.resolve_encoder")
    p = Path(spec).expanduser()
    if not p.is_file():
        raise ConfigError(f"encoder={spec!r}: no such file; valid encoders are 'random', a "
                          "weights file, runs:/<run id>/model, runs:/<run id>/checkpoints/"
                          "best.pt or models:/<name>/<version>")
    return backbone_from_file(p, arch, in_channels, source=str(p.resolve()), norm=norm)


__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "NORMS", "RANDOM", "Opaque", "backbone_from_file",
           "build_encoder", "check_norm", "extract_backbone_state", "fingerprint",
           "fold_input_norm", "load_backbone", "module_state_dict", "parse_norm",
           "read_weights", "resnet_arch_of"]
