"""Backbones by name (the timm ``register_model`` / ``list_models`` / ``create_model`` idea).

A backbone maps images (N, C, H, W) to features (N, ``num_features``); heads belong to
methods, so one backbone serves supervised, semi- and self-supervised training alike.
"""

from __future__ import annotations

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


def list_models() -> list[str]:
    return MODELS.names()


__all__ = ["MODELS", "create_model", "list_models", "register_model"]
