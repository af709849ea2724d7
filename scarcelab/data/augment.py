"""Batched, per-sample image augmentation on tensors.

Semi- and self-supervised methods augment every unlabeled batch two or more times, so
augmentation runs on whole (N, C, H, W) float batches in [0, 1] on the training device,
with per-sample random parameters drawn as tensors: no per-image PIL loop, no Python loop
over samples. All randomness comes from an explicit ``torch.Generator`` so that a run is
reproducible from its seed and augmentation never perturbs (or depends on) the global RNG
that model initialisation and data order use.

Entries of :data:`AUGMENTATIONS` are callables ``(x, g) -> Tensor`` returning a new tensor
of the same shape, dtype and device, with values in [0, 1]:

``identity``  the input itself.
``weak``      random horizontal flip (p=0.5) and random crop with reflect padding of
              12.5% of the side (the FixMatch "weak" view).
``strong``    ``weak``, then RandAugment as in FixMatch (2 random ops per sample, each with
              a random magnitude; FixMatch paper, Table 12 ranges), then Cutout.
``simclr``    SimCLR view: random resized crop, flip, colour jitter, random grayscale.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from scarcelab.registry import Registry

Augmentation = Callable[[Tensor, torch.Generator], Tensor]

AUGMENTATIONS: Registry[Augmentation] = Registry("augmentation")

_GRAY_WEIGHTS = (0.299, 0.587, 0.114)  # ITU-R 601-2 luma, as PIL's convert("L")


# ---------------------------------------------------------------------------------------
# helpers


def to_float(x_uint8: Tensor | np.ndarray) -> Tensor:
    """uint8 images (N, C, H, W) -> float32 in [0, 1], on the input's device.

    Datasets stay uint8 in memory (4x smaller); conversion happens per batch, right
    before augmentation.
    """
    x = torch.as_tensor(x_uint8)
    if x.dtype != torch.uint8:
        raise TypeError(f"to_float expects uint8 images, got {x.dtype}")
    return x.to(torch.float32).div_(255.0)


def _check(x: Tensor) -> None:
    if not isinstance(x, Tensor) or x.ndim != 4 or not x.is_floating_point():
        got = f"{tuple(x.shape)} {x.dtype}" if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(
            f"augmentations expect float images (N, C, H, W) in [0, 1], got {got}; "
            "convert uint8 batches with scarcelab.data.augment.to_float first"
        )


def _rand(g: torch.Generator, *shape: int, device: torch.device) -> Tensor:
    """U[0, 1) drawn on the generator's device, then moved to ``device``.

    Drawing on ``g.device`` lets a CPU generator drive a GPU batch (the parameter tensors
    are tiny) and keeps results identical across devices for a CPU generator.
    """
    return torch.rand(shape, generator=g, device=g.device).to(device)


def _randint(g: torch.Generator, low: int, high: int, *shape: int, device: torch.device) -> Tensor:
    """Integers uniform in [low, high), as :func:`_rand`."""
    return torch.randint(low, high, shape, generator=g, device=g.device).to(device)


def _uniform(g: torch.Generator, low: float, high: float, n: int, device: torch.device) -> Tensor:
    return low + (high - low) * _rand(g, n, device=device)


def _as_work(x: Tensor) -> Tensor:
    """Half-precision batches are processed in float32 (grid_sample and histograms)."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _gray(x: Tensor) -> Tensor:
    """Luma (N, 1, H, W); for one channel the image itself."""
    if x.shape[1] == 1:
        return x
    w = x.new_tensor(_GRAY_WEIGHTS).view(1, 3, 1, 1)
    return (x * w).sum(1, keepdim=True)


def _select(mask: Tensor, a: Tensor | float, b: Tensor) -> Tensor:
    """``torch.where(mask, a, b)`` for finite float values, via a float mask.

    Exact (``a * 1 + b * 0 == a``) and several times faster than ``torch.where`` or
    ``masked_fill`` on large CPU tensors (measured with torch 2.14, whose bool-mask CPU
    kernels are not vectorised); the augmentations' hot paths use it instead.
    """
    m = mask.to(b.dtype)
    return a * m + b * (1.0 - m)


def _frac(x: Tensor) -> Tensor:
    """``x % 1.0`` for floats, as ``x - floor(x)`` (the float remainder kernel is slow)."""
    return x - x.floor()


def _blend(x: Tensor, degenerate: Tensor, factor: Tensor) -> Tensor:
    """PIL ImageEnhance semantics: factor 0 -> ``degenerate``, 1 -> ``x``; clipped."""
    f = factor.view(-1, 1, 1, 1)
    return (degenerate + f * (x - degenerate)).clamp_(0.0, 1.0)


def _affine_grid(theta: Tensor, h: int, w: int) -> Tensor:
    """``F.affine_grid(theta, (N, C, h, w), align_corners=False)`` by broadcasting.

    Same result, but two fused multiply-adds per coordinate instead of a batched matmul
    with an inner dimension of 3, which is several times slower on CPU.
    """
    xs = (torch.arange(w, device=theta.device, dtype=theta.dtype) * 2 + 1) / w - 1
    ys = (torch.arange(h, device=theta.device, dtype=theta.dtype) * 2 + 1) / h - 1
    t = theta.view(-1, 6, 1, 1)
    xs, ys = xs.view(1, 1, w), ys.view(1, h, 1)
    gx = t[:, 0] * xs + t[:, 1] * ys + t[:, 2]
    gy = t[:, 3] * xs + t[:, 4] * ys + t[:, 5]
    return torch.stack((gx, gy), dim=-1)


def _reflect(idx: Tensor, size: int) -> Tensor:
    """Reflect out-of-range indices like ``F.pad(mode="reflect")`` (edge not repeated)."""
    idx = torch.where(idx < 0, -idx, idx)
    return torch.where(idx > size - 1, 2 * (size - 1) - idx, idx)


# ---------------------------------------------------------------------------------------
# flip + crop (weak)


def flip_crop(x: Tensor, dy: Tensor, dx: Tensor, flip: Tensor) -> Tensor:
    """Deterministic core of ``weak``: per-sample horizontal flip, then shift by (dy, dx).

    Equivalent to reflect-padding by ``pad`` and cropping the window whose top-left corner
    is at (pad + dy, pad + dx), but done with one gather on precomputed source indices
    instead of materialising the padded batch. ``dy``/``dx`` are int tensors (N,) with
    absolute values below the side; ``flip`` is a bool tensor (N,).
    """
    n, c, h, w = x.shape
    dev = x.device
    rows = _reflect(torch.arange(h, device=dev).view(1, h) + dy.view(n, 1).to(dev), h)
    cols = _reflect(torch.arange(w, device=dev).view(1, w) + dx.view(n, 1).to(dev), w)
    cols = torch.where(flip.view(n, 1).to(dev), w - 1 - cols, cols)  # flipped source
    index = (rows.view(n, h, 1) * w + cols.view(n, 1, w)).view(n, 1, h * w).expand(n, c, h * w)
    return x.reshape(n, c, h * w).gather(2, index).view(n, c, h, w)


def _pad_for(side: int) -> int:
    """12.5% of the side: 4 px at 32, 4 px at 28 (3.5 rounded half-even), 2 px at 16."""
    return min(round(0.125 * side), side - 1)


def _weak(x: Tensor, g: torch.Generator) -> Tensor:
    n, _, h, w = x.shape
    py, px = _pad_for(h), _pad_for(w)
    flip = _rand(g, n, device=x.device) < 0.5
    dy = _randint(g, -py, py + 1, n, device=x.device)
    dx = _randint(g, -px, px + 1, n, device=x.device)
    return flip_crop(x, dy, dx, flip)


@AUGMENTATIONS.register("identity")
def identity(x: Tensor, g: torch.Generator) -> Tensor:
    """No augmentation (evaluation, or supervised baselines without augmentation)."""
    _check(x)
    return x


@AUGMENTATIONS.register("weak")
def weak(x: Tensor, g: torch.Generator) -> Tensor:
    """Random horizontal flip (p=0.5) + random crop with reflect padding of 12.5% of the side."""
    _check(x)
    return _weak(_as_work(x), g).to(x.dtype)


# ---------------------------------------------------------------------------------------
# RandAugment ops (pixel ops on a subset of the batch; factors per sample)


def _autocontrast(x: Tensor, m: Tensor) -> Tensor:
    lo = x.amin(dim=(2, 3), keepdim=True)
    hi = x.amax(dim=(2, 3), keepdim=True)
    scale = torch.where(hi > lo, 1.0 / (hi - lo).clamp_min(1e-6), torch.ones_like(hi))
    lo = torch.where(hi > lo, lo, torch.zeros_like(lo))
    return ((x - lo) * scale).clamp_(0.0, 1.0)


def _brightness(x: Tensor, m: Tensor) -> Tensor:
    return _blend(x, torch.zeros_like(x), 0.05 + 0.9 * m)


def _contrast(x: Tensor, m: Tensor) -> Tensor:
    mean = _gray(x).mean(dim=(1, 2, 3), keepdim=True)
    return _blend(x, mean.expand_as(x), 0.05 + 0.9 * m)


def _color(x: Tensor, m: Tensor) -> Tensor:
    return _blend(x, _gray(x).expand_as(x), 0.05 + 0.9 * m)


def _sharpness(x: Tensor, m: Tensor) -> Tensor:
    """Blend towards PIL's SMOOTH filter (border pixels kept, as PIL and torchvision do)."""
    c = x.shape[1]
    kernel = x.new_ones(3, 3)
    kernel[1, 1] = 5.0
    kernel = (kernel / kernel.sum()).expand(c, 1, 3, 3)
    smooth = x.clone()
    smooth[..., 1:-1, 1:-1] = F.conv2d(x, kernel, groups=c)
    return _blend(x, smooth, 0.05 + 0.9 * m)


def _posterize(x: Tensor, m: Tensor) -> Tensor:
    bits = (4 + (m * 5).floor()).clamp_(4, 8)  # 4..8 bits kept
    step = torch.pow(2.0, 8 - bits).view(-1, 1, 1, 1)
    q = (x * 255.0).round_()
    return ((q / step).floor_() * step).div_(255.0)


def _solarize(x: Tensor, m: Tensor) -> Tensor:
    threshold = m.view(-1, 1, 1, 1)
    return _select(x >= threshold, 1.0 - x, x)


def _equalize(x: Tensor, m: Tensor) -> Tensor:
    """Histogram equalisation per image and channel, PIL's algorithm, batched.

    256-bin histograms via one scatter_add; the look-up table follows
    ``PIL.ImageOps.equalize`` (step from all but the last non-empty bin).
    """
    n, c, h, w = x.shape
    q = (x * 255.0).round_().long().clamp_(0, 255).view(n * c, h * w)
    hist = torch.zeros(n * c, 256, dtype=torch.long, device=x.device)
    hist.scatter_add_(1, q, torch.ones_like(q))
    nonzero = hist > 0
    last = 255 - nonzero.flip(1).long().argmax(1, keepdim=True)
    step = (h * w - hist.gather(1, last)) // 255
    cum = hist.cumsum(1) - hist
    lut = ((step // 2 + cum) // step.clamp_min(1)).clamp_(0, 255)
    lut = torch.where(step > 0, lut, torch.arange(256, device=x.device).expand_as(lut))
    return lut.gather(1, q).view(n, c, h, w).to(x.dtype).div_(255.0)


def _unchanged(x: Tensor, m: Tensor) -> Tensor:
    return x


_PIXEL_OPS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "identity": _unchanged,
    "autocontrast": _autocontrast,
    "brightness": _brightness,
    "contrast": _contrast,
    "equalize": _equalize,
    "posterize": _posterize,
    "sharpness": _sharpness,
    "solarize": _solarize,
}
_RGB_PIXEL_OPS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"color": _color}
_GEOMETRIC_OPS = ("rotate", "shear_x", "shear_y", "translate_x", "translate_y")


def randaugment_ops(channels: int) -> tuple[str, ...]:
    """The op pool ``strong`` draws from; ``color`` only exists for RGB images."""
    pixel = list(_PIXEL_OPS) + (list(_RGB_PIXEL_OPS) if channels == 3 else [])
    return (*pixel, *_GEOMETRIC_OPS)


def _apply_pixel_ops(x: Tensor, ops: Tensor, mags: Tensor, names: tuple[str, ...]) -> Tensor:
    """Apply op ``names[ops[i]]`` with magnitude ``mags[i]`` to sample i, grouped by op.

    One sort and one counts transfer per round, then each op runs once on its contiguous
    group: the cost is that of one pass over the batch, not one per op.
    """
    order = torch.argsort(ops, stable=True)
    counts = torch.bincount(ops, minlength=len(names)).tolist()
    xs = x.index_select(0, order)
    ms = mags.index_select(0, order)
    chunks: list[Tensor] = []
    start = 0
    table = {**_PIXEL_OPS, **_RGB_PIXEL_OPS}
    for name, count in zip(names, counts, strict=True):
        if count:
            fn = table.get(name, _unchanged)  # geometric ops are applied later, in one warp
            chunks.append(fn(xs[start : start + count], ms[start : start + count]))
        start += count
    return torch.empty_like(x).index_copy_(0, order, torch.cat(chunks))


def _geometric_matrix(ops: Tensor, mags: Tensor, names: tuple[str, ...], h: int, w: int) -> Tensor:
    """Per-sample 3x3 inverse map (output -> input pixel offsets from the centre).

    The op is the identity for samples whose op is not geometric. Signed magnitudes:
    rotate +-30 degrees, shear +-0.3, translate +-30% of the side (FixMatch, Table 12).
    """
    n = ops.shape[0]
    signed = 2.0 * mags - 1.0
    eye = torch.eye(3, device=ops.device).expand(n, 3, 3).clone()

    def sel(name: str) -> Tensor:
        return torch.where(ops == names.index(name), signed, torch.zeros_like(signed))

    angle = sel("rotate") * math.radians(30.0)
    cos, sin = torch.cos(angle), torch.sin(angle)
    rot = eye.clone()
    rot[:, 0, 0], rot[:, 0, 1], rot[:, 1, 0], rot[:, 1, 1] = cos, -sin, sin, cos
    shear = eye.clone()
    shear[:, 0, 1] = sel("shear_x") * 0.3
    shear[:, 1, 0] = sel("shear_y") * 0.3
    shift = eye.clone()
    shift[:, 0, 2] = sel("translate_x") * 0.3 * w
    shift[:, 1, 2] = sel("translate_y") * 0.3 * h
    return rot @ shear @ shift  # at most one factor differs from the identity


def _warp(x: Tensor, pixel_matrix: Tensor, fill: float, mode: str) -> Tensor:
    """Apply per-sample inverse maps given in centred pixel units with one grid_sample.

    Pixel units are converted to grid_sample's normalised coordinates so rotations stay
    rotations on non-square images. Outside pixels get ``fill``.
    """
    n, _, h, w = x.shape
    to_norm = torch.diag(x.new_tensor([2.0 / w, 2.0 / h, 1.0]))
    from_norm = torch.diag(x.new_tensor([w / 2.0, h / 2.0, 1.0]))
    theta = (to_norm @ pixel_matrix.to(x.dtype) @ from_norm)[:, :2]
    grid = _affine_grid(theta.contiguous(), h, w)
    out = F.grid_sample(x - fill, grid, mode=mode, padding_mode="zeros", align_corners=False)
    return out.add_(fill).clamp_(0.0, 1.0)


def cutout(x: Tensor, g: torch.Generator, max_frac: float = 0.5, fill: float = 0.0) -> Tensor:
    """Fill one random square per sample (side uniform in 1..``max_frac`` * side) with ``fill``.

    The square's centre is uniform over the image and the square is clipped at the border,
    as in FixMatch's Cutout. Implemented as a broadcast mask, no loop.
    """
    _check(x)
    n, _, h, w = x.shape
    dev = x.device
    largest = max(1, int(max_frac * min(h, w)))
    size = _randint(g, 1, largest + 1, n, device=dev)
    cy = _randint(g, 0, h, n, device=dev)
    cx = _randint(g, 0, w, n, device=dev)
    y0 = (cy - size // 2).clamp_(min=0)
    x0 = (cx - size // 2).clamp_(min=0)
    rows = torch.arange(h, device=dev).view(1, h)
    cols = torch.arange(w, device=dev).view(1, w)
    in_rows = (rows >= y0.view(n, 1)) & (rows < (y0 + size).view(n, 1))
    in_cols = (cols >= x0.view(n, 1)) & (cols < (x0 + size).view(n, 1))
    mask = in_rows.view(n, 1, h, 1) & in_cols.view(n, 1, 1, w)
    return _select(mask, fill, x)


@AUGMENTATIONS.register("strong")
def strong(x: Tensor, g: torch.Generator, n_ops: int = 2) -> Tensor:
    """FixMatch's strong view: weak flip+crop, RandAugment (``n_ops`` ops), Cutout.

    Each sample draws ``n_ops`` ops uniformly from :func:`randaugment_ops` and a magnitude
    uniform over each op's range. Pixel ops run in the drawn order; the geometric ops of
    all rounds are composed into one affine map and applied by a single grid_sample
    (nearest neighbour as PIL's default, grey fill as FixMatch), i.e. after the pixel
    ops: pixel ops commute
    with warps up to interpolation and fill, and one resampling instead of two is both
    faster and less blurry. Cutout (grey, side up to half the image) comes last.
    """
    _check(x)
    if x.shape[0] == 0:
        return x.clone()
    work = _as_work(x)
    n, c, h, w = work.shape
    dev = work.device
    names = randaugment_ops(c)
    out = _weak(work, g)
    matrix = torch.eye(3, device=dev).expand(n, 3, 3)
    for _ in range(n_ops):
        ops = _randint(g, 0, len(names), n, device=dev)
        mags = _rand(g, n, device=dev)
        out = _apply_pixel_ops(out, ops, mags, names)
        matrix = matrix @ _geometric_matrix(ops, mags, names, h, w)
    out = _warp(out, matrix, fill=0.5, mode="nearest")
    out = cutout(out, g, max_frac=0.5, fill=0.5)
    return out.to(x.dtype)


# ---------------------------------------------------------------------------------------
# SimCLR


def _rgb_to_hsv(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(N, 3, H, W) RGB -> hue in [0, 1), saturation, value (each (N, H, W)).

    Branch-free: the sector is chosen with float masks. Grey pixels (max == min) get
    hue 0 and saturation 0, so their hue never matters on the way back.
    """
    r, g, b = x.unbind(1)
    maxc = torch.maximum(torch.maximum(r, g), b)
    minc = torch.minimum(torch.minimum(r, g), b)
    delta = maxc - minc
    inv = 1.0 / delta.clamp_min(1e-12)
    sat = delta / maxc.clamp_min(1e-12)
    is_r = (maxc == r).to(x.dtype)
    is_g = (maxc == g).to(x.dtype) * (1.0 - is_r)
    is_b = 1.0 - is_r - is_g
    sector = is_r * ((g - b) * inv) + is_g * (2.0 + (b - r) * inv) + is_b * (4.0 + (r - g) * inv)
    return _frac(sector / 6.0), sat, maxc


def _hsv_to_rgb(hue: Tensor, sat: Tensor, val: Tensor) -> Tensor:
    """Inverse of :func:`_rgb_to_hsv`, branch-free.

    Closed form f(n) = V - V S clip(min(k, 4 - k), 0, 1) with k = (n + 6 H) mod 6 and
    n = 5, 3, 1 for R, G, B, instead of selecting one of six sectors per pixel.
    """
    n = hue.new_tensor([5.0, 3.0, 1.0]).view(1, 3, 1, 1)
    k = 6.0 * _frac((n + 6.0 * hue.unsqueeze(1)) / 6.0)
    ramp = torch.minimum(k, 4.0 - k).clamp_(0.0, 1.0)
    v = val.unsqueeze(1)
    return v - v * sat.unsqueeze(1) * ramp


def _adjust_hue(x: Tensor, shift: Tensor) -> Tensor:
    hue, sat, val = _rgb_to_hsv(x)
    return _hsv_to_rgb(_frac(hue + shift.view(-1, 1, 1)), sat, val)


def _random_resized_box(
    g: torch.Generator, n: int, h: int, w: int, device: torch.device, tries: int = 10
) -> tuple[Tensor, Tensor]:
    """Relative crop width and height for torchvision's RandomResizedCrop, vectorised.

    Scale (0.2, 1) of the area, log-uniform aspect ratio in (3/4, 4/3); like torchvision,
    up to ``tries`` candidates per sample and a clamp-to-image fallback (rarely needed).
    """
    area = _uniform(g, 0.2, 1.0, n * tries, device).view(tries, n)
    log_ratio = _uniform(g, math.log(3 / 4), math.log(4 / 3), n * tries, device).view(tries, n)
    ratio = log_ratio.exp() * (h / w)  # aspect in pixels -> in relative units
    rel_w = (area * ratio).sqrt()
    rel_h = (area / ratio).sqrt()
    ok = (rel_w <= 1.0) & (rel_h <= 1.0)
    first = ok.long().argmax(0)  # first valid try (0 if none)
    pick = torch.arange(n, device=device)
    return rel_w[first, pick].clamp(max=1.0), rel_h[first, pick].clamp(max=1.0)


@AUGMENTATIONS.register("simclr")
def simclr(x: Tensor, g: torch.Generator) -> Tensor:
    """A SimCLR view (CIFAR recipe): resized crop, flip, colour jitter (p=0.8), grayscale.

    Crop and flip are one affine map per sample and one bilinear grid_sample back to the
    input size. Jitter: brightness 0.4, contrast 0.4 and, for RGB only, saturation 0.4 and
    hue 0.1 (single-channel images have no colour to jitter), applied in that fixed order
    (they commute up to clipping, so a per-sample random order would change little);
    samples that skip jitter get neutral factors instead of a branch. Random grayscale
    (p=0.2) for RGB only. Gaussian blur is omitted, as in SimCLR's CIFAR-10 setup.
    """
    _check(x)
    work = _as_work(x)
    n, c, h, w = work.shape
    dev = work.device
    rel_w, rel_h = _random_resized_box(g, n, h, w, dev)
    cx = (2.0 * _rand(g, n, device=dev) - 1.0) * (1.0 - rel_w)
    cy = (2.0 * _rand(g, n, device=dev) - 1.0) * (1.0 - rel_h)
    flip = torch.where(_rand(g, n, device=dev) < 0.5, -1.0, 1.0)
    theta = torch.zeros(n, 2, 3, device=dev, dtype=work.dtype)
    theta[:, 0, 0] = rel_w * flip
    theta[:, 0, 2] = cx
    theta[:, 1, 1] = rel_h
    theta[:, 1, 2] = cy
    grid = _affine_grid(theta, h, w)
    out = F.grid_sample(work, grid, mode="bilinear", padding_mode="border", align_corners=False)

    jitter = _rand(g, n, device=dev) < 0.8
    one = torch.ones(n, device=dev, dtype=work.dtype)
    brightness = torch.where(jitter, _uniform(g, 0.6, 1.4, n, dev), one)
    contrast = torch.where(jitter, _uniform(g, 0.6, 1.4, n, dev), one)
    out = _blend(out, torch.zeros_like(out), brightness)
    out = _blend(out, _gray(out).mean(dim=(1, 2, 3), keepdim=True).expand_as(out), contrast)
    if c == 3:
        saturation = torch.where(jitter, _uniform(g, 0.6, 1.4, n, dev), one)
        hue = torch.where(jitter, _uniform(g, -0.1, 0.1, n, dev), torch.zeros_like(one))
        out = _blend(out, _gray(out).expand_as(out), saturation)
        out = _adjust_hue(out, hue)
        grayscale = (_rand(g, n, device=dev) < 0.2).view(n, 1, 1, 1)
        out = _select(grayscale, _gray(out), out)
    return out.clamp_(0.0, 1.0).to(x.dtype)



# ---------------------------------------------------------------------------------------
# "Tune It or Don't Use It" (Brigato et al. 2021) per-dataset training augmentations,
# as the benchmark's reference code (gem ``BasicAugmentation.get_data_transforms`` with the
# flags of ``bash_scripts/bench_*.sh``): a random shift of 12.5 % of the side with reflect
# padding plus flips for the small fixed-resolution sets, RandomResizedCrop with a minimum
# area fraction A_min (aspect ratio 3/4..4/3) to 224 px for the others — in gem on the
# decoded *original* image, here on the whole image stored uncropped at a fixed side with
# its original size beside it (``scarcelab.data.sources._deic.load_deic_whole``).

RRC_RATIO = (3.0 / 4.0, 4.0 / 3.0)  # torchvision's default, which gem keeps


def _vflip(x: Tensor, g: torch.Generator) -> Tensor:
    flip = (_rand(g, x.shape[0], device=x.device) < 0.5).view(-1, 1, 1, 1)
    return _select(flip, x.flip(2), x)


def rrc_boxes(g: torch.Generator, hw: Tensor, min_area: float, tries: int = 10
              ) -> Tensor:
    """torchvision's ``RandomResizedCrop.get_params(scale=(min_area, 1), ratio=(3/4, 4/3))``
    for a batch of images of sizes ``hw`` (N, 2: height, width, in the original's pixels),
    vectorised over samples and tries: per try a target area ``U(min_area, 1)·H·W`` and a
    log-uniform aspect ratio give an integer box (Python's round, as torchvision); the
    first try that fits wins, placed uniformly at an integer offset; with none, the centre
    crop of the aspect ratio clamped to the range. Returns (N, 4) float: top, left, h, w."""
    n = hw.shape[0]
    dev = hw.device
    hgt, wid = hw[:, 0].double(), hw[:, 1].double()
    area = (hgt * wid).view(1, n)
    target = area * _uniform(g, min_area, 1.0, n * tries, dev).double().view(tries, n)
    log_r = _uniform(g, math.log(RRC_RATIO[0]), math.log(RRC_RATIO[1]), n * tries, dev)
    ratio = log_r.double().view(tries, n).exp()
    w = (target * ratio).sqrt().round()
    h = (target / ratio).sqrt().round()
    ok = (w > 0) & (w <= wid) & (h > 0) & (h <= hgt)
    first = ok.long().argmax(0)
    pick = torch.arange(n, device=dev)
    w, h = w[first, pick], h[first, pick]
    top = (_rand(g, n, device=dev).double() * (hgt - h + 1)).floor()
    left = (_rand(g, n, device=dev).double() * (wid - w + 1)).floor()
    # fallback (torchvision): the whole image, or its centre at the nearest allowed ratio
    in_ratio = wid / hgt
    fw = torch.where(in_ratio > RRC_RATIO[1], (hgt * RRC_RATIO[1]).round(), wid)
    fh = torch.where(in_ratio < RRC_RATIO[0], (wid / RRC_RATIO[0]).round(), hgt)
    found = ok.any(0)
    w, h = torch.where(found, w, fw), torch.where(found, h, fh)
    top = torch.where(found, top, ((hgt - h) / 2).floor())
    left = torch.where(found, left, ((wid - w) / 2).floor())
    return torch.stack([top, left, h, w], 1)


def crop_resize(x: Tensor, boxes: Tensor, hw: Tensor, out: int, hflip: Tensor | None = None,
                vflip: Tensor | None = None, supersample: int | None = None) -> Tensor:
    """Deterministic core of the RandomResizedCrop views: the ``boxes`` (N, 4: top, left,
    h, w in the original's pixels of size ``hw``) of the stored images ``x`` (the whole
    original resized to x's H×W, aspect not kept) resized to ``out``², optionally flipped.

    One bilinear ``grid_sample`` whose output pixel centres sit where torchvision / PIL put
    them (``left + (u + ½)·w/out`` in the original). Crops that shrink are first sampled
    ``k``× finer and averaged over k×k blocks, a stand-in for the antialiasing of PIL's
    bilinear resize when it shrinks an image (``k`` = ``supersample``; default: the
    batch's median stored-pixels-per-output-pixel ratio, rounded, within 1..4 — of the
    batch-wide choices the closest to PIL on real tiles, docs/tune.md)."""
    n, _, sh, sw = x.shape
    dev = x.device
    hw = hw.to(dev, torch.float64)
    b = boxes.to(dev, torch.float64)
    top, left, h, w = b.unbind(1)
    if supersample is None:
        factor = torch.maximum(h * sh / hw[:, 0], w * sw / hw[:, 1]).median() / out
        supersample = int(min(4, max(1, round(float(factor)))))
    k = supersample
    fx = torch.ones(n, dtype=torch.float64, device=dev)
    fy = fx.clone()
    if hflip is not None:
        fx = torch.where(hflip.to(dev), -fx, fx)
    if vflip is not None:
        fy = torch.where(vflip.to(dev), -fy, fy)
    theta = torch.zeros(n, 2, 3, dtype=torch.float64, device=dev)
    theta[:, 0, 0] = w / hw[:, 1] * fx
    theta[:, 0, 2] = (2 * left + w) / hw[:, 1] - 1
    theta[:, 1, 1] = h / hw[:, 0] * fy
    theta[:, 1, 2] = (2 * top + h) / hw[:, 0] - 1
    grid = _affine_grid(theta, out * k, out * k).to(x.dtype)
    y = F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
    return F.avg_pool2d(y, k) if k > 1 else y


def random_resized_crop(x: Tensor, g: torch.Generator, min_area: float, hflip: bool,
                        vflip: bool = False, *, sizes: Tensor | None = None,
                        out_size: int | None = None) -> Tensor:
    """torchvision's RandomResizedCrop(out, scale=(min_area, 1), ratio=(3/4, 4/3)) and the
    optional flips, batched (:func:`rrc_boxes` + :func:`crop_resize`).

    ``sizes`` (N, 2) are the originals' (height, width) when ``x`` holds whole images
    resized to a common side (the training store of the RandomResizedCrop datasets);
    without it each image is its own original. ``out_size`` defaults to x's side."""
    _check(x)
    work = _as_work(x)
    n, _, h, w = work.shape
    dev = work.device
    hw = (torch.as_tensor(sizes).to(dev) if sizes is not None
          else torch.tensor([[h, w]], device=dev).expand(n, 2))
    if hw.shape != (n, 2):
        raise ValueError(f"sizes must be (N, 2) = ({n}, 2) original (height, width), got "
                         f"{tuple(hw.shape)}")
    boxes = rrc_boxes(g, hw, min_area)
    fh = _rand(g, n, device=dev) < 0.5 if hflip else None
    fv = _rand(g, n, device=dev) < 0.5 if vflip else None
    out = crop_resize(work, boxes, hw, out_size or h, hflip=fh, vflip=fv)
    return out.clamp_(0.0, 1.0).to(x.dtype)


def _rrc_view(min_area: float, hflip: bool, vflip: bool = False) -> Augmentation:
    """A registered RandomResizedCrop view. ``takes_geometry``: the loop passes the
    originals' sizes and the output side when the labeled images are stored whole."""

    def view(x: Tensor, g: torch.Generator, sizes: Tensor | None = None,
             out_size: int | None = None) -> Tensor:
        return random_resized_crop(x, g, min_area, hflip, vflip, sizes=sizes,
                                   out_size=out_size)

    view.takes_geometry = True  # type: ignore[attr-defined]
    return view


@AUGMENTATIONS.register("deic_shift_hflip")
def deic_shift_hflip(x: Tensor, g: torch.Generator) -> Tensor:
    """ciFAIR-10: shift by up to 12.5 % (4 px at 32) with reflect padding + horizontal flip."""
    return weak(x, g)


@AUGMENTATIONS.register("deic_shift_hvflip")
def deic_shift_hvflip(x: Tensor, g: torch.Generator) -> Tensor:
    """EuroSAT: shift 12.5 % (8 px at 64) + horizontal and vertical flips."""
    return _vflip(weak(x, g), g)


deic_rrc10_hflip = AUGMENTATIONS.register("deic_rrc10_hflip")(_rrc_view(0.1, hflip=True))
deic_rrc10_hflip.__doc__ = "ImageNet: RandomResizedCrop with A_min = 10 % + horizontal flip."
deic_rrc40_hflip = AUGMENTATIONS.register("deic_rrc40_hflip")(_rrc_view(0.4, hflip=True))
deic_rrc40_hflip.__doc__ = "CUB: RandomResizedCrop with A_min = 40 % + horizontal flip."
deic_rrc40_hvflip = AUGMENTATIONS.register("deic_rrc40_hvflip")(
    _rrc_view(0.4, hflip=True, vflip=True))
deic_rrc40_hvflip.__doc__ = ("ISIC 2018: RandomResizedCrop with A_min = 40 % + horizontal "
                             "and vertical flips.")
deic_rrc20 = AUGMENTATIONS.register("deic_rrc20")(_rrc_view(0.2, hflip=False))
deic_rrc20.__doc__ = ("CLaMM: RandomResizedCrop with A_min = 20 %, no flips (script "
                      "orientation matters).")


__all__ = [
    "AUGMENTATIONS",
    "Augmentation",
    "crop_resize",
    "cutout",
    "flip_crop",
    "identity",
    "randaugment_ops",
    "random_resized_crop",
    "rrc_boxes",
    "simclr",
    "strong",
    "to_float",
    "weak",
]
