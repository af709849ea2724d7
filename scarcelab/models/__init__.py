"""Backbones by name (the timm ``register_model`` / ``list_models`` / ``create_model`` idea).

A backbone maps images (N, C, H, W) to features (N, ``num_features``); heads belong to
methods, so one backbone serves supervised, semi- and self-supervised training alike.
"""

from __future__ import annotations

from typing import cast

from torch import nn

from scarcelab.registry import PACKAGES, Registry

MODELS: Registry = Registry("arch", PACKAGES["arch"])
register_model = MODELS.register


def create_model(name: str, in_channels: int = 3, **kwargs: object) -> nn.Module:
    """Build backbone ``name``; the result has an int attribute ``num_features``."""
    model = MODELS.get(name)(in_channels=in_channels, **kwargs)
    if not isinstance(getattr(model, "num_features", None), int):
        raise TypeError(f"backbone {name!r} must expose an int attribute num_features")
    return model


def num_features(backbone: nn.Module) -> int:
    """``backbone.num_features``, the width of its features (every backbone exposes it as an
    int; :func:`create_model` checks that), typed as the int it is."""
    return cast(int, backbone.num_features)


def list_models() -> list[str]:
    return MODELS.names()


__all__ = ["MODELS", "create_model", "list_models", "num_features", "register_model"]
