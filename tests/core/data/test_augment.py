"""Batched augmentation: contracts, exactness of the deterministic parts, PIL references."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from scarcelab.data import augment as A
from scarcelab.data.augment import AUGMENTATIONS, cutout, flip_crop, to_float

NAMES = ("identity", "weak", "strong", "simclr")
RANDOM_NAMES = ("weak", "strong", "simclr")


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _batch(n: int = 32, c: int = 1, side: int = 28, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, c, side, side, generator=_gen(seed))


def test_registry_lists_the_four_entries() -> None:
    assert set(NAMES) <= set(AUGMENTATIONS.names())


def test_to_float_scales_uint8_to_unit_interval() -> None:
    x = torch.tensor([0, 51, 255], dtype=torch.uint8).view(1, 1, 1, 3)
    y = to_float(x)
    assert y.dtype == torch.float32
    assert torch.allclose(y.flatten(), torch.tensor([0.0, 0.2, 1.0]))
    assert to_float(np.zeros((2, 1, 4, 4), dtype=np.uint8)).shape == (2, 1, 4, 4)
    with pytest.raises(TypeError, match="uint8"):
        to_float(torch.zeros(1, 1, 2, 2))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("channels", [1, 3])
def test_shape_dtype_range_device(name: str, channels: int) -> None:
    x = _batch(c=channels)
    y = AUGMENTATIONS.get(name)(x, _gen(1))
    assert y.shape == x.shape
    assert y.dtype == x.dtype
    assert y.device == x.device
    assert float(y.min()) >= 0.0 and float(y.max()) <= 1.0
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("name", RANDOM_NAMES)
def test_half_precision_and_odd_sizes(name: str) -> None:
    x = torch.rand(5, 3, 32, 24, generator=_gen()).half()
    y = AUGMENTATIONS.get(name)(x, _gen(1))
    assert y.dtype == torch.float16 and y.shape == x.shape


@pytest.mark.parametrize("name", NAMES)
def test_rejects_uint8_input(name: str) -> None:
    with pytest.raises(TypeError, match="to_float"):
        AUGMENTATIONS.get(name)(torch.zeros(2, 1, 8, 8, dtype=torch.uint8), _gen())


@pytest.mark.parametrize("name", RANDOM_NAMES)
@pytest.mark.parametrize("channels", [1, 3])
def test_same_seed_same_output_other_seed_differs(name: str, channels: int) -> None:
    x = _batch(c=channels)
    fn = AUGMENTATIONS.get(name)
    a, b, other = fn(x, _gen(7)), fn(x, _gen(7)), fn(x, _gen(8))
    assert torch.equal(a, b)
    assert not torch.equal(a, other)


@pytest.mark.parametrize("name", RANDOM_NAMES)
def test_global_rng_is_neither_used_nor_advanced(name: str) -> None:
    x = _batch(c=3)
    state = torch.get_rng_state()
    AUGMENTATIONS.get(name)(x, _gen(3))
    assert torch.equal(state, torch.get_rng_state())


@pytest.mark.parametrize("name", RANDOM_NAMES)
@pytest.mark.parametrize("channels", [1, 3])
def test_randomness_is_per_sample(name: str, channels: int) -> None:
    one = torch.rand(1, channels, 28, 28, generator=_gen())
    x = one.expand(16, -1, -1, -1).contiguous()
    y = AUGMENTATIONS.get(name)(x, _gen(5))
    distinct = {tuple(row.flatten().tolist()) for row in y}
    assert len(distinct) > 8


def test_identity_returns_input_unchanged() -> None:
    x = _batch(c=3)
    y = AUGMENTATIONS.get("identity")(x, _gen())
    assert torch.equal(y, x)


# ----------------------------------------------------------------------------- flip + crop


def _reference_crop(x: torch.Tensor, dy: int, dx: int, flip: bool, pad: int) -> torch.Tensor:
    """Independent implementation: flip, reflect-pad, slice (torchvision's recipe)."""
    h, w = x.shape[-2:]
    img = x.flip(-1) if flip else x
    padded = F.pad(img, (pad, pad, pad, pad), mode="reflect")
    return padded[..., pad + dy : pad + dy + h, pad + dx : pad + dx + w]


def test_flip_crop_zero_offset_no_flip_is_the_original() -> None:
    x = _batch(n=4, c=3)
    zeros = torch.zeros(4, dtype=torch.long)
    y = flip_crop(x, zeros, zeros, torch.zeros(4, dtype=torch.bool))
    assert torch.equal(y, x)


def test_flip_crop_flip_only_mirrors_columns() -> None:
    x = torch.arange(2 * 1 * 4 * 5, dtype=torch.float32).view(2, 1, 4, 5)
    zeros = torch.zeros(2, dtype=torch.long)
    y = flip_crop(x, zeros, zeros, torch.ones(2, dtype=torch.bool))
    assert torch.equal(y, x.flip(-1))


def test_flip_crop_shift_matches_reflect_pad_reference() -> None:
    x = torch.arange(1 * 2 * 6 * 6, dtype=torch.float32).view(1, 2, 6, 6)
    # hand-made: shift down by 1 reflects row 1 into the top row (no edge repeat)
    y = flip_crop(x, torch.tensor([-1]), torch.tensor([0]), torch.tensor([False]))
    assert torch.equal(y[0, :, 0], x[0, :, 1])
    assert torch.equal(y[0, :, 1:], x[0, :, :-1])
    pad = 4
    g = _gen(11)
    x = _batch(n=24, c=3, side=32)
    dy = torch.randint(-pad, pad + 1, (24,), generator=g)
    dx = torch.randint(-pad, pad + 1, (24,), generator=g)
    flip = torch.rand(24, generator=g) < 0.5
    y = flip_crop(x, dy, dx, flip)
    for i in range(24):
        ref = _reference_crop(x[i], int(dy[i]), int(dx[i]), bool(flip[i]), pad)
        assert torch.equal(y[i], ref), i


@pytest.mark.parametrize(("side", "pad"), [(28, 4), (32, 4), (16, 2)])
def test_weak_output_is_one_of_the_admissible_crops(side: int, pad: int) -> None:
    x = _batch(n=6, c=1, side=side)
    y = AUGMENTATIONS.get("weak")(x, _gen(2))
    for i in range(6):
        candidates = [
            _reference_crop(x[i], dy, dx, flip, pad)
            for flip in (False, True)
            for dy in range(-pad, pad + 1)
            for dx in range(-pad, pad + 1)
        ]
        assert any(torch.equal(y[i], c) for c in candidates), i


def test_weak_flips_about_half_the_samples() -> None:
    # bright left half: a 4 px shift keeps the outer 8 columns on their side, a flip swaps
    x = torch.zeros(400, 1, 32, 32)
    x[..., :16] = 1.0
    y = AUGMENTATIONS.get("weak")(x, _gen(4))
    flipped = y[..., -8:].mean(dim=(1, 2, 3)) > y[..., :8].mean(dim=(1, 2, 3))
    assert 0.4 < float(flipped.float().mean()) < 0.6


# ----------------------------------------------------------------------------- cutout


def test_cutout_zeroes_one_square_per_sample() -> None:
    x = torch.ones(64, 3, 28, 28)
    y = cutout(x, _gen(9), max_frac=0.5, fill=0.0)
    assert torch.equal(y[:, :1].expand_as(y), y)  # same hole in every channel
    for img in y[:, 0]:
        rows = torch.nonzero((img == 0).any(1)).flatten()
        cols = torch.nonzero((img == 0).any(0)).flatten()
        assert rows.numel() > 0
        top, bottom, left, right = rows.min(), rows.max(), cols.min(), cols.max()
        box = img[top : bottom + 1, left : right + 1]
        assert (box == 0).all()  # a filled rectangle ...
        assert int((img == 0).sum()) == box.numel()  # ... and nothing else
        h, w = box.shape
        assert max(h, w) <= 14
        touches = top == 0 or left == 0 or bottom == 27 or right == 27
        assert h == w or touches  # square unless clipped at the border


# ----------------------------------------------------------------------------- strong ops


def test_strong_op_pool_is_channel_aware() -> None:
    grey, rgb = A.randaugment_ops(1), A.randaugment_ops(3)
    assert "color" not in grey and "color" in rgb
    expected = {
        "identity", "autocontrast", "brightness", "contrast", "equalize", "posterize",
        "rotate", "sharpness", "shear_x", "shear_y", "solarize", "translate_x", "translate_y",
    }  # fmt: skip
    assert set(grey) == expected


def test_strong_handles_an_empty_batch() -> None:
    x = torch.rand(0, 3, 28, 28)
    assert AUGMENTATIONS.get("strong")(x, _gen()).shape == x.shape


PIL_OPS = {
    "equalize": (A._equalize, 0.0),
    "autocontrast": (A._autocontrast, 1.0),
    "posterize": (A._posterize, 0.0),
    "solarize": (A._solarize, 0.0),
    "brightness": (A._brightness, 1.5),
    "contrast": (A._contrast, 1.5),
    "sharpness": (A._sharpness, 1.5),
    "color": (A._color, 1.5),
}


def _pil_reference(name: str, img: np.ndarray, m: float) -> object:
    from PIL import Image, ImageEnhance, ImageOps

    im = Image.fromarray(img)
    factor = 0.05 + 0.9 * m
    if name == "equalize":
        return ImageOps.equalize(im)
    if name == "autocontrast":
        return ImageOps.autocontrast(im)
    if name == "posterize":
        return ImageOps.posterize(im, int(min(8, 4 + np.floor(m * 5))))
    if name == "solarize":
        return ImageOps.solarize(im, m * 255)
    enhancer = {
        "brightness": ImageEnhance.Brightness,
        "contrast": ImageEnhance.Contrast,
        "sharpness": ImageEnhance.Sharpness,
        "color": ImageEnhance.Color,
    }[name]
    return enhancer(im).enhance(factor)


@pytest.mark.parametrize("name", sorted(PIL_OPS))
@pytest.mark.parametrize("channels", [1, 3])
def test_pixel_ops_match_pil(name: str, channels: int) -> None:
    """Each batched op against Pillow on uint8 images (tolerance: PIL's own rounding)."""
    pytest.importorskip("PIL")
    if name == "color" and channels == 1:
        pytest.skip("color is an RGB-only op")
    fn, tol = PIL_OPS[name]
    g = _gen(21)
    xu = torch.randint(30, 220, (6, channels, 28, 28), dtype=torch.uint8, generator=g)
    xu[0] = (xu[0].float() * 0.3 + 80).to(torch.uint8)  # narrow range: autocontrast stretches
    m = torch.rand(6, generator=g)
    ours = fn(to_float(xu), m)
    for i in range(6):
        arr = xu[i].permute(1, 2, 0).numpy()
        ref = np.asarray(_pil_reference(name, arr[..., 0] if channels == 1 else arr, float(m[i])))
        ref_t = torch.from_numpy(ref.reshape(28, 28, channels).astype(np.float32) / 255.0)
        diff = (ours[i] - ref_t.permute(2, 0, 1)).abs().max() * 255
        assert float(diff) <= tol + 1e-3, (name, i, float(diff))


def test_hue_shift_matches_torchvision() -> None:
    tvf = pytest.importorskip("torchvision.transforms.functional")
    x = _batch(n=4, c=3)
    for shift in (-0.1, 0.03, 0.1):
        ours = A._adjust_hue(x, torch.full((4,), shift))
        assert torch.allclose(ours, tvf.adjust_hue(x, shift), atol=1e-5)


def test_rotation_warp_matches_torchvision() -> None:
    tv = pytest.importorskip("torchvision.transforms.functional")
    from torchvision.transforms import InterpolationMode

    x = _batch(n=3, c=3)
    names = A.randaugment_ops(3)
    ops = torch.full((3,), names.index("rotate"))
    matrix = A._geometric_matrix(ops, torch.ones(3), names, 28, 28)  # magnitude 1: 30 degrees
    ours = A._warp(x, matrix, fill=0.5, mode="nearest")
    ref = tv.rotate(x, 30.0, InterpolationMode.NEAREST, fill=[0.5, 0.5, 0.5])
    assert torch.equal(ours, ref)


def test_identity_warp_is_exact() -> None:
    x = _batch(n=8, c=3)
    assert torch.equal(A._warp(x, torch.eye(3).expand(8, 3, 3), 0.5, "nearest"), x)


# ----------------------------------------------------------------------------- simclr


def test_simclr_grayscale_only_for_rgb() -> None:
    x = _batch(n=200, c=3)
    y = AUGMENTATIONS.get("simclr")(x, _gen(13))
    grey = ((y[:, 0] - y[:, 1]).abs().amax(dim=(1, 2)) < 1e-6) & (
        (y[:, 1] - y[:, 2]).abs().amax(dim=(1, 2)) < 1e-6
    )
    assert 0.1 < float(grey.float().mean()) < 0.3  # p = 0.2


def test_simclr_crop_keeps_content_of_a_constant_image() -> None:
    # crops and flips of a constant image are the image; only jitter can change it
    x = torch.full((50, 1, 28, 28), 0.5)
    y = AUGMENTATIONS.get("simclr")(x, _gen(1))
    flat = y.flatten(1)
    assert torch.allclose(flat.amin(1), flat.amax(1))  # each output is still constant
    unchanged = torch.isclose(flat[:, 0], torch.tensor(0.5)).float().mean()
    assert 0.05 < float(unchanged) < 0.45  # ~20% skip jitter (p = 0.8)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("name", RANDOM_NAMES)
def test_cuda_batch_with_cpu_generator_stays_on_cuda(name: str) -> None:
    x = _batch(c=3)
    y_cpu = AUGMENTATIONS.get(name)(x, _gen(3))
    y_gpu = AUGMENTATIONS.get(name)(x.cuda(), _gen(3))
    assert y_gpu.is_cuda
    # same parameters on both devices; kernels may differ by rounding only
    assert float((y_gpu.cpu() - y_cpu).abs().mean()) < 1e-2
