"""The "Tune It or Don't Use It" augmentations: RandomResizedCrop with A_min, flips."""

from __future__ import annotations

import torch

from scarcelab.data.augment import AUGMENTATIONS, _vflip, random_resized_crop


def test_full_area_crop_is_identity_and_flip_is_exact():
    x = torch.rand(16, 3, 12, 12)
    g = torch.Generator().manual_seed(0)
    torch.testing.assert_close(random_resized_crop(x, g, 1.0, hflip=False), x)
    y = random_resized_crop(x, g, 1.0, hflip=True, vflip=True)
    seen = set()
    for i in range(16):
        for name, ref in (("id", x[i]), ("h", x[i].flip(2)), ("v", x[i].flip(1)),
                          ("hv", x[i].flip(1).flip(2))):
            if torch.allclose(y[i], ref, atol=1e-5):
                seen.add(name)
                break
        else:
            raise AssertionError(f"sample {i} is not a flip of its input")
    assert seen == {"id", "h", "v", "hv"}


def test_vflip_and_determinism():
    x = torch.rand(32, 13, 8, 8)  # 13 bands: EuroSAT
    y = _vflip(x, torch.Generator().manual_seed(1))
    flipped = [bool(torch.equal(y[i], x[i].flip(1))) for i in range(32)]
    assert all(flipped[i] or torch.equal(y[i], x[i]) for i in range(32))
    assert 0 < sum(flipped) < 32
    for name in ("deic_shift_hflip", "deic_shift_hvflip", "deic_rrc10_hflip",
                 "deic_rrc40_hflip", "deic_rrc40_hvflip", "deic_rrc20"):
        f = AUGMENTATIONS.get(name)
        a = f(x, torch.Generator().manual_seed(3))
        b = f(x, torch.Generator().manual_seed(3))
        assert torch.equal(a, b) and a.shape == x.shape and 0 <= a.min() and a.max() <= 1


def test_crop_scale_is_at_least_a_min():
    # a horizontal ramp: the crop's value range shows its width; with A_min = 0.4 and
    # aspect ratio >= 3/4 the crop is at least sqrt(0.4 * 3/4) ~ 0.55 of the width
    ramp = torch.linspace(0, 1, 64).view(1, 1, 1, 64).expand(200, 1, 64, 64).contiguous()
    y = random_resized_crop(ramp, torch.Generator().manual_seed(0), 0.4, hflip=False)
    span = y.amax(dim=(1, 2, 3)) - y.amin(dim=(1, 2, 3))
    assert float(span.min()) >= 0.5
    assert float(span.max()) > 0.9  # large crops happen too
    y20 = AUGMENTATIONS.get("deic_rrc20")(ramp, torch.Generator().manual_seed(0))
    assert (y20[:, :, :, 1:] >= y20[:, :, :, :-1] - 1e-6).all()  # CLaMM: never flipped
