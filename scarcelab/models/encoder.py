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
from pathlib import Path
from typing import Any

import torch
from torch import nn

from scarcelab.errors import ConfigError, DataError
from scarcelab.models import create_model

RANDOM = "random"
_TORCHVISION_RESNET_KEYS = ("conv1.weight", "bn1.weight", "layer1.0.conv1.weight")


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
        holders = [(type(n.rsplit(".", 1)[-1], (Opaque,), {"_name": n}), n) for n in names]
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


def extract_backbone_state(obj: Any, where: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(backbone state dict, what the file says about itself) from anything
    :func:`read_weights` returned; see the module docstring for the accepted layouts."""
    meta: dict[str, Any] = {}
    if isinstance(obj, Opaque):  # a pickled whole module (an exported classifier)
        obj = module_state_dict(obj)
        meta["format"] = "pickled-module"
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        for k in ("arch", "in_channels", "method", "num_classes", "split_hash"):
            if k in obj and isinstance(obj[k], (str, int)):
                meta[k] = obj[k]
        meta.setdefault("format", "scarcelab-checkpoint")
        obj = obj["state_dict"]
    if not _is_state_dict(obj):
        raise DataError(f"{where} holds no state dict of tensors (found {type(obj).__name__}); "
                        "expected a scarcelab checkpoint, a backbone state_dict or an "
                        "ImageNet-style torchvision ResNet state_dict")
    if any(k.startswith("backbone.") for k in obj):
        state = {k[len("backbone."):]: v for k, v in obj.items() if k.startswith("backbone.")}
        meta.setdefault("format", "backbone-prefixed")
    elif all(k in obj for k in _TORCHVISION_RESNET_KEYS):
        state = {f"net.{k}": v for k, v in obj.items()}
        meta["format"] = "torchvision-imagenet"
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


def load_backbone(state: dict[str, torch.Tensor], meta: dict[str, Any], arch: str | None,
                  in_channels: int | None, where: str) -> tuple[nn.Module, dict[str, Any]]:
    """Build the backbone and load ``state`` into it (strictly, except the documented
    ImageNet stem/head for torchvision files). ``in_channels=None``: what the file says,
    else the first convolution's input width."""
    file_arch = meta.get("arch")
    if arch and file_arch and arch != file_arch:
        raise ConfigError(f"arch={arch!r} but {where} holds a {file_arch!r} encoder; pass "
                          f"arch={file_arch} (or auto)")
    arch = file_arch or arch
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
    info: dict[str, Any] = {"arch": arch, **meta}
    if meta.get("format") == "torchvision-imagenet":
        own = net.state_dict()
        usable = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
        info["skipped"] = sorted(set(state) - set(usable))
        missing = sorted(set(own) - set(usable))
        if any(not k.startswith("net.conv1.") for k in missing):
            raise DataError(f"{where}: torchvision weights do not fit arch {arch!r} (missing "
                            f"{missing[:5]}…); use resnet18 / resnet50 to match the file")
        net.load_state_dict(usable, strict=False)
    else:
        try:
            net.load_state_dict(state, strict=True)
        except RuntimeError as e:
            raise DataError(f"{where}: weights do not fit arch {arch!r} with {in_channels} "
                            f"input channels: {str(e)[:400]}") from e
    info["fingerprint"] = fingerprint(net)
    return net.eval(), info


def backbone_from_file(path: str | os.PathLike[str], arch: str | None, in_channels: int | None,
                       source: str | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """A backbone with the weights of a local file (any accepted layout)."""
    where = source or str(path)
    state, meta = extract_backbone_state(read_weights(path), where)
    net, info = load_backbone(state, meta, arch, in_channels, where)
    return net, {"source": where, **info}


def build_encoder(spec: str, arch: str | None, in_channels: int,
                  seed: int = 0) -> tuple[nn.Module, dict[str, Any]]:
    """``random`` (the from-scratch control, seeded) or a local weights file.

    MLflow sources (``runs:/``, ``models:/``) are resolved by ``tracking.encoders``.
    """
    if spec == RANDOM:
        if not arch:
            raise ConfigError("encoder=random needs an arch (scarcelab list archs)")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            net = create_model(arch, in_channels=in_channels)
        return net, {"source": RANDOM, "arch": arch, "format": RANDOM,
                     "fingerprint": fingerprint(net)}
    if spec.startswith(("runs:/", "models:/")):
        raise ConfigError(f"encoder={spec!r} is an MLflow URI: resolve it with "
                          "tracking.encoders.resolve_encoder")
    p = Path(spec).expanduser()
    if not p.is_file():
        raise ConfigError(f"encoder={spec!r}: no such file; valid encoders are 'random', a "
                          "weights file, runs:/<run id>/model, runs:/<run id>/checkpoints/"
                          "best.pt or models:/<name>/<version>")
    return backbone_from_file(p, arch, in_channels, source=str(p.resolve()))


__all__ = ["RANDOM", "Opaque", "backbone_from_file", "build_encoder", "extract_backbone_state",
           "fingerprint", "load_backbone", "module_state_dict", "read_weights"]
