import pytest
import torch

from scarcelab.models import create_model


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
