"""Backbones: a contract every registered arch inherits (timm's ``test_models.py`` runs its
checks over ``list_models()``), then arch-specific facts."""

from __future__ import annotations

import pytest
import torch

from scarcelab.models import create_model, list_models
from scarcelab.models.classifier import ExportedClassifier, for_export

#: archs whose ``in_channels`` is not an image's channel count, with what it is instead
FLAT_INPUT = {"mlp": "in_channels is the flattened input size (models/small.py), so it "
                     "takes (N, C*H*W) or any (N, ...) it flattens to that"}
#: side of the images the contract feeds: the smallest the ImageNet-stem ResNets (stride 32)
#: still reduce to a 1x1 map, and the CIFAR-size input the WRNs are written for
SIDE = 32


def _build(name: str, channels: int) -> torch.nn.Module:
    in_ch = channels * SIDE * SIDE if name in FLAT_INPUT else channels
    return create_model(name, in_channels=in_ch)


def _batch(n: int, channels: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, channels, SIDE, SIDE, generator=g)


@pytest.mark.parametrize("name", list_models())
@pytest.mark.parametrize("channels", [1, 3])
def test_every_backbone_builds_and_maps_images_to_num_features(name: str, channels: int) -> None:
    torch.manual_seed(0)
    m = _build(name, channels).eval()
    assert isinstance(m.num_features, int) and m.num_features > 0
    with torch.no_grad():
        out = m(_batch(3, channels))
    assert out.shape == (3, m.num_features) and out.dtype == torch.float32
    assert torch.isfinite(out).all()
    assert out.std() > 0  # not a constant map (a dead stem or head)


@pytest.mark.parametrize("name", list_models())
def test_every_backbone_is_deterministic_under_a_seed(name: str) -> None:
    """Same seed, same weights and outputs; another seed, other weights (the seed reaches
    the initialisation rather than being ignored)."""
    x = _batch(2, 3)

    def built(seed: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        torch.manual_seed(seed)
        m = _build(name, 3).eval()
        with torch.no_grad():
            return m.state_dict(), m(x)

    (s0, y0), (s0b, y0b), (s1, _) = built(0), built(0), built(1)
    assert s0.keys() == s0b.keys() and all(torch.equal(s0[k], s0b[k]) for k in s0)
    assert torch.equal(y0, y0b)
    assert any(not torch.equal(s0[k], s1[k]) for k in s0 if s0[k].is_floating_point())


@pytest.mark.parametrize("name", list_models())
def test_every_backbone_exports_as_the_classifier_a_study_logs(name: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The path every study's final model takes (``train.export_classifier`` ->
    ``safe_io.export_model`` -> the pickle-free loader): the archive loads and predicts as
    the eager model, for another batch size too (the batch dimension is dynamic)."""
    from scarcelab.tracking.safe_io import export_model, load_exported

    torch.manual_seed(0)
    backbone = _build(name, 3)
    clf = for_export(ExportedClassifier(backbone, torch.nn.Linear(backbone.num_features, 4),
                                        ["a", "b", "c", "d"]))
    path = tmp_path / "model.pt2"
    export_model(clf, _batch(2, 3), path)
    loaded = load_exported(path).module()
    for n in (2, 5):
        x = _batch(n, 3, seed=n)
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), clf(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name,feat", [("small_cnn", 128), ("resnet18", 512), ("wrn28_2", 128)])
@pytest.mark.parametrize("channels", [1, 3])
def test_backbones_on_28x28(name, feat, channels):
    torch.manual_seed(0)
    m = create_model(name, in_channels=channels).eval()
    out = m(torch.randn(2, channels, 28, 28))
    assert out.shape == (2, feat) and m.num_features == feat
    assert torch.isfinite(out).all()


def test_resnet18_small_image_stem():
    m = create_model("resnet18", in_channels=1)
    conv1 = m.net.conv1
    assert conv1.kernel_size == (3, 3) and conv1.stride == (1, 1) and conv1.in_channels == 1
    assert isinstance(m.net.maxpool, torch.nn.Identity)


def test_wrn28_2_size():
    m = create_model("wrn28_2", in_channels=3)
    n = sum(p.numel() for p in m.parameters())
    assert 1.4e6 < n < 1.5e6  # WRN-28-2 is ~1.47M parameters
