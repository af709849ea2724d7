"""A U-Net-style decoder on a scarcelab backbone, with HoVer-Net's output branches.

The encoder is a registered backbone (``small_cnn``, ``resnet18``, ``resnet50``,
``wrn28_2``) cut into its resolution stages, so the *same* weights a ``self`` / ``semi`` /
``supervised`` study trained (or ``random``) can be put under a segmentation decoder —
Kang et al.'s transfer question. The decoder upsamples the deepest stage and fuses every
shallower one (U-Net skip connections, Ronneberger et al. 2015). Three 1x1 heads follow
HoVer-Net (Graham et al. 2019, §3.2): nucleus pixel (NP, 2 logits), horizontal/vertical
distances to the nucleus centre (HV, 2 channels in [-1, 1]) and, when the data has
types, nucleus type (TP, T+1 logits, 0 = background). The forward pass returns one
tensor (channels NP | HV | TP) so the exported model is an ordinary torch module.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from scarcelab.errors import ConfigError
from scarcelab.models import create_model
from scarcelab.models.classifier import normalize

# backbone class name -> function returning its stages (each a module, input to output)
_STAGES: dict[str, Callable[[nn.Module], list[nn.Module]]] = {}


def stage_splitter(class_name: str) -> Callable[[Callable[[nn.Module], list[nn.Module]]],
                                                Callable[[nn.Module], list[nn.Module]]]:
    def deco(fn: Callable[[nn.Module], list[nn.Module]]) -> Callable[[nn.Module],
                                                                      list[nn.Module]]:
        _STAGES[class_name] = fn
        return fn
    return deco


def _subs(m: nn.Module, *names: str) -> list[nn.Module]:
    """Named submodules (dotted paths), typed as modules: attribute access on a module is
    typed ``Tensor | Module`` by torch, which a type checker cannot pass on as a stage."""
    return [m.get_submodule(n) for n in names]


@stage_splitter("SmallCNN")
def _small_cnn(b: nn.Module) -> list[nn.Module]:
    # conv-bn-relu, pool, conv-bn-relu, pool, conv-bn-relu, gap, flatten
    f = list(b.get_submodule("features").children())
    return [nn.Sequential(*f[0:3]), nn.Sequential(*f[3:7]), nn.Sequential(*f[7:11])]


@stage_splitter("_TorchvisionBackbone")
def _torchvision_resnet(b: nn.Module) -> list[nn.Module]:
    # small-image stem: stride 1 until layer2
    stem = nn.Sequential(*_subs(b, "net.conv1", "net.bn1", "net.relu"))
    return [stem, *_subs(b, "net.layer1", "net.layer2", "net.layer3", "net.layer4")]


@stage_splitter("_ImageNetStemBackbone")
def _imagenet_resnet(b: nn.Module) -> list[nn.Module]:
    # ImageNet stem kept (7x7 stride 2, max-pool): strides 2, 4, 8, 16, 32
    return [nn.Sequential(*_subs(b, "net.conv1", "net.bn1", "net.relu")),
            nn.Sequential(*_subs(b, "net.maxpool", "net.layer1")),
            *_subs(b, "net.layer2", "net.layer3", "net.layer4")]


@stage_splitter("WideResNet")
def _wrn(b: nn.Module) -> list[nn.Module]:
    blocks = list(b.get_submodule("blocks").children())
    n = len(blocks) // 3
    conv, bn, act = _subs(b, "conv", "bn", "act")
    return [conv, nn.Sequential(*blocks[:n]), nn.Sequential(*blocks[n:2 * n]),
            nn.Sequential(*blocks[2 * n:], bn, act)]


def encoder_stages(backbone: nn.Module) -> nn.ModuleList:
    split = _STAGES.get(type(backbone).__name__)
    if split is None:
        raise ConfigError(f"backbone {type(backbone).__name__} has no stage split for "
                          f"segmentation; supported: {', '.join(sorted(_STAGES))}")
    return nn.ModuleList(split(backbone))


def _channels(stages: nn.ModuleList, in_channels: int) -> tuple[list[int], int]:
    """Output channels of each stage and the total stride, by one probing forward pass."""
    was = stages.training
    stages.eval()
    chans, x = [], torch.zeros(1, in_channels, 32, 32)
    with torch.no_grad():
        for s in stages:
            x = s(x)
            chans.append(x.shape[1])
    stages.train(was)
    return chans, 32 // x.shape[-1]


class _Fuse(nn.Module):
    def __init__(self, c_deep: int, c_skip: int, c_out: int) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(c_deep + c_skip, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=True),
            nn.Conv2d(c_out, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=True))

    def forward(self, deep: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        deep = F.interpolate(deep, size=skip.shape[-2:], mode="bilinear", align_corners=False)
        return self.conv(torch.cat([deep, skip], 1))


class NucleusUNet(nn.Module):
    """[0, 1] images (N, 3, H, W) -> (N, 4 + T + 1, H, W) maps; H, W multiples of
    :attr:`stride`. Channels: 0-1 NP logits, 2-3 HV (h then v), 4.. TP logits (if typed)."""

    def __init__(self, backbone: nn.Module, n_types: int = 0, in_channels: int = 3,
                 max_width: int = 64) -> None:
        super().__init__()
        self.encoder = encoder_stages(backbone)
        chans, self.stride = _channels(self.encoder, in_channels)
        self.n_types = n_types
        widths = [min(c, max_width) for c in chans]
        self.fuse = nn.ModuleList(
            _Fuse(chans[-1] if i == len(chans) - 2 else widths[i + 1], chans[i], widths[i])
            for i in range(len(chans) - 2, -1, -1))
        out = 4 + (n_types + 1 if n_types else 0)
        self.head = nn.Conv2d(widths[0], out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats, h = [], normalize(x)
        for s in self.encoder:
            h = s(h)
            feats.append(h)
        y = feats[-1]
        for fuse, skip in zip(self.fuse, reversed(feats[:-1]), strict=True):
            y = fuse(y, skip)
        y = F.interpolate(self.head(y), size=x.shape[-2:], mode="bilinear",
                          align_corners=False) if y.shape[-2:] != x.shape[-2:] else self.head(y)
        return torch.cat([y[:, :2], torch.tanh(y[:, 2:4]), y[:, 4:]], 1)


def _backbone_state(obj: object, where: str) -> dict[str, torch.Tensor]:
    """The backbone's tensors out of the usual containers: a bare state dict, one under
    ``state_dict`` / ``model`` / ``backbone``, or a method's state dict (``backbone.*``)."""
    if isinstance(obj, dict):
        for key in ("state_dict", "model", "backbone", "encoder"):
            if isinstance(obj.get(key), dict):
                return _backbone_state(obj[key], where)
        tensors = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
        if tensors:
            for prefix in ("module.backbone.", "backbone.", "encoder.", "module."):
                sub = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
                if sub:
                    return sub
            return tensors
    raise ConfigError(f"encoder={where}: no tensor state dict inside (expected a backbone "
                      "state dict, e.g. torch.save(model.backbone.state_dict(), path))")


def load_segment_backbone(spec: str, arch: str) -> nn.Module:
    """The encoder under the decoder: ``random`` (from-scratch control) or a local file
    holding the backbone's state dict (loaded with ``weights_only=True``: nothing is
    unpickled). ``runs:/`` / ``models:/`` URIs are resolved to such a file by the caller."""
    backbone = create_model(arch)
    if spec == "random":
        return backbone
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ConfigError(f"encoder={spec!r}: not 'random' and not a file; pass a local "
                          "state-dict file (runs:/ and models:/ URIs are resolved by the "
                          "entry point when it supports them)")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises several types for unsafe/corrupt files
        raise ConfigError(f"encoder={spec!r}: cannot be read with weights_only=True ({e}); "
                          "save a plain state dict of tensors") from e
    state = _backbone_state(obj, spec)
    try:
        missing, unexpected = backbone.load_state_dict(state, strict=False)
    except RuntimeError as e:  # a tensor of the wrong shape (e.g. another arch's stem)
        raise ConfigError(f"encoder={spec!r} does not fit arch={arch!r}: {e}") from None
    if missing:
        raise ConfigError(f"encoder={spec!r} does not fit arch={arch!r}: {len(missing)} "
                          f"missing tensors (e.g. {missing[:3]}); pass the arch it was "
                          "trained with")
    if unexpected and not all(k.startswith(("net.fc.", "fc.")) for k in unexpected):
        raise ConfigError(f"encoder={spec!r}: unexpected tensors for arch={arch!r} (e.g. "
                          f"{unexpected[:3]})")
    return backbone
