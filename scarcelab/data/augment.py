"""Batched, per-sample image augmentation on tensors.

Semi- and self-supervised methods augment every unlabeled batch two or more times, so
augmentation runs on whole (N, C, H, W) float batches in [0, 1] on the training device,
with per-sample random parameters drawn as tensors: no per-image PIL loop, no Python loop
over samples. All randomness comes from an explicit ``torch.Generator`` so that a run is
reproducible from its seed and augmentation never perturbs (or depends on) the global RNG
that model initialisation and data order use.

Each registered augmentation is a :class:`View`, split where the host meets the device:
``draw(g, n, shape)`` makes every random number a batch needs on the generator (a CPU
generator: CPU and GPU runs draw the same numbers) together with what only the host
decides (RandAugment's per-op group sizes, the crop boxes that fix an output size), and
``apply(x, params)`` is the tensor work on the device. The training loop draws the
indices and every view of a step first and moves them with one copy (:func:`upload`), so
a step waits on no transfer (docs/performance.md). Called as ``(x, g) -> Tensor`` a view
does both, for callers outside the loop.

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
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from scarcelab.registry import Registry

Augmentation = Callable[[Tensor, torch.Generator], Tensor]

AUGMENTATIONS: Registry[Augmentation] = Registry("augmentation")

_GRAY_WEIGHTS = (0.299, 0.587, 0.114)  # ITU-R 601-2 luma, as PIL's convert("L")

#: a view's host parameters: tensors drawn on the generator and plain host values
Params = dict[str, Any]


# ---------------------------------------------------------------------------------------
# one copy per step


#: pack the host parameters into one buffer even when the device is the CPU, where
#: :func:`upload` otherwise hands them over as they are: what a test sets to run the
#: CUDA code path, and count its copies, on a CPU-only machine
PACK_ON_CPU = False


def _leaves(tree: Any, out: list[Tensor]) -> Any:
    """``tree`` (dicts, lists and tuples of tensors and host values) with each tensor
    replaced by its position in ``out``."""
    if isinstance(tree, Tensor):
        out.append(tree)
        return _Leaf(len(out) - 1)
    if isinstance(tree, dict):
        return {k: _leaves(v, out) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_leaves(v, out) for v in tree)
    return tree


class _Leaf(int):
    """A tensor's position in :func:`_leaves`' list (an int type of its own, so that a
    host int in the tree is never mistaken for one)."""


def _fill(tree: Any, tensors: Sequence[Tensor]) -> Any:
    if isinstance(tree, _Leaf):
        return tensors[tree]
    if isinstance(tree, dict):
        return {k: _fill(v, tensors) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_fill(v, tensors) for v in tree)
    return tree


def _pack(tensors: Sequence[Tensor], pin: bool
          ) -> tuple[Tensor, list[tuple[int, torch.dtype, torch.Size]]]:
    """The tensors' bytes in one uint8 buffer (each at an 8-byte-aligned offset, so that
    any dtype can be viewed back in place) and where each one lies."""
    parts: list[Tensor] = []
    layout: list[tuple[int, torch.dtype, torch.Size]] = []
    off = 0
    for t in tensors:
        pad = -off % 8
        if pad:
            parts.append(torch.zeros(pad, dtype=torch.uint8))
            off += pad
        raw = t.contiguous().reshape(-1).view(torch.uint8)
        layout.append((off, t.dtype, t.shape))
        parts.append(raw)
        off += raw.numel()
    buf = torch.empty(off, dtype=torch.uint8, pin_memory=pin)
    if parts:
        torch.cat(parts, out=buf)
    return buf, layout


def upload(tree: Any, device: torch.device, pack: bool | None = None) -> Any:
    """``tree`` with its host tensors on ``device``, moved by *one* copy.

    A pageable ``.to(device)`` waits until the GPU has finished all queued work (the copy
    is synchronous for the host), so moving each of a step's ~20 random-parameter
    tensors separately stalled the CPU ~20 times per step. Here their bytes are packed
    into one pinned buffer and copied with ``non_blocking=True``: the host queues the copy
    and goes on (the caching host allocator keeps the buffer alive until the copy is
    done). The tensors come back as views of the device buffer, bit for bit. On the CPU
    nothing is copied and the tree is returned as it is (unless ``pack`` or
    :data:`PACK_ON_CPU` asks for the packed path). Host values (ints, lists, None) pass
    through unchanged."""
    if pack is None:
        pack = device.type != "cpu" or PACK_ON_CPU
    if not pack:
        return tree
    tensors: list[Tensor] = []
    skeleton = _leaves(tree, tensors)
    if any(t.device.type != "cpu" for t in tensors):  # drawn on a device generator
        return _fill(skeleton, [t.to(device) for t in tensors])
    buf, layout = _pack(tensors, pin=device.type == "cuda")
    dev = buf.to(device, non_blocking=True)
    out = []
    for off, dtype, shape in layout:
        n = math.prod(shape) * dtype.itemsize
        out.append(dev[off:off + n].view(dtype).view(shape))
    return _fill(skeleton, out)


_CONSTANTS: dict[tuple[Any, ...], Tensor] = {}


def _const(like: Tensor, values: Sequence[float]) -> Tensor:
    """``values`` as a 1-D tensor of ``like``'s dtype on its device, made once per
    (values, device, dtype): a tensor built from Python numbers on every call is a
    host-to-device copy on every call."""
    key = (tuple(values), like.device, like.dtype)
    t = _CONSTANTS.get(key)
    if t is None:
        t = torch.tensor(values, dtype=like.dtype).to(like.device)
        _CONSTANTS[key] = t
    return t


class View:
    """A registered augmentation: ``draw`` on the host, ``apply`` on the device.

    ``draw(g, n, shape, **geometry) -> params`` makes, in a fixed order, every random
    number the batch of ``n`` images of ``shape`` (C, H, W) needs, as host tensors, and
    decides on the host whatever fixes the work's shapes; ``apply(x, params)`` takes those
    params on ``x``'s device. Calling the view, ``(x, g) -> Tensor``, does both with one
    :func:`upload`. ``takes_geometry``: the view crops originals stored whole, given their
    sizes and the output side (``sizes=``, ``out_size=``)."""

    def __init__(self, draw: Callable[..., Params], apply: Callable[[Tensor, Params], Tensor],
                 doc: str, takes_geometry: bool = False) -> None:
        self._draw, self._apply = draw, apply
        self.__doc__ = doc
        self.takes_geometry = takes_geometry

    def draw(self, g: torch.Generator, n: int, shape: Sequence[int], **geometry: Any
             ) -> Params:
        if geometry and not self.takes_geometry:
            raise TypeError(f"augmentation {getattr(self, 'registered_name', '?')!r} "
                            f"takes no geometry ({sorted(geometry)})")
        return self._draw(g, n, tuple(shape), **geometry)

    def apply(self, x: Tensor, params: Params) -> Tensor:
        return self._apply(x, params)

    def __call__(self, x: Tensor, g: torch.Generator, **geometry: Any) -> Tensor:
        _check(x)
        if geometry.get("sizes") is not None:  # the boxes are drawn on the host
            geometry["sizes"] = torch.as_tensor(geometry["sizes"]).cpu()
        params = self.draw(g, x.shape[0], x.shape[1:], **geometry)
        return self.apply(x, upload(params, x.device))


def as_view(fn: Augmentation) -> View:
    """A plain ``(x, g) -> Tensor`` augmentation as a :class:`View` whose draws happen in
    ``apply`` (on the device, after the other views' draws): what a registered function
    that was never split gets."""
    if isinstance(fn, View):
        return fn
    return View(lambda g, n, shape: {"g": g}, lambda x, p: fn(x, p["g"]),
                fn.__doc__ or "", getattr(fn, "takes_geometry", False))


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


def _rand(g: torch.Generator, *shape: int) -> Tensor:
    """U[0, 1) drawn on the generator's device (the host, for a CPU generator).

    A CPU generator drives a GPU batch (the parameter tensors are tiny and travel in the
    step's one :func:`upload`) and keeps results identical across devices.
    """
    return torch.rand(shape, generator=g, device=g.device)


def _randint(g: torch.Generator, low: int, high: int, *shape: int) -> Tensor:
    """Integers uniform in [low, high), as :func:`_rand`."""
    return torch.randint(low, high, shape, generator=g, device=g.device)


def _uniform(g: torch.Generator, low: float, high: float, n: int) -> Tensor:
    return low + (high - low) * _rand(g, n)


def _as_work(x: Tensor) -> Tensor:
    """Half-precision batches are processed in float32 (grid_sample and histograms)."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _gray(x: Tensor) -> Tensor:
    """Luma (N, 1, H, W); for one channel the image itself."""
    if x.shape[1] == 1:
        return x
    w = _const(x, _GRAY_WEIGHTS).view(1, 3, 1, 1)
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


def _draw_weak(g: torch.Generator, n: int, shape: tuple[int, ...]) -> Params:
    _, h, w = shape
    py, px = _pad_for(h), _pad_for(w)
    flip = _rand(g, n) < 0.5
    dy = _randint(g, -py, py + 1, n)
    dx = _randint(g, -px, px + 1, n)
    return {"flip": flip, "dy": dy, "dx": dx}


def _weak(x: Tensor, p: Params) -> Tensor:
    return flip_crop(x, p["dy"], p["dx"], p["flip"])


def _apply_weak(x: Tensor, p: Params) -> Tensor:
    return _weak(_as_work(x), p).to(x.dtype)


identity = AUGMENTATIONS.register("identity")(View(
    lambda g, n, shape: {}, lambda x, p: x,
    "No augmentation (evaluation, or supervised baselines without augmentation)."))

weak = AUGMENTATIONS.register("weak")(View(
    _draw_weak, _apply_weak,
    "Random horizontal flip (p=0.5) + random crop with reflect padding of 12.5% of the side."))


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


_SMOOTH = (1.0, 1.0, 1.0, 1.0, 5.0, 1.0, 1.0, 1.0, 1.0)  # PIL's SMOOTH kernel, unnormalised


def _sharpness(x: Tensor, m: Tensor) -> Tensor:
    """Blend towards PIL's SMOOTH filter (border pixels kept, as PIL and torchvision do)."""
    c = x.shape[1]
    kernel = _const(x, _SMOOTH).view(3, 3)
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


def _group_ops(ops: Tensor, mags: Tensor, names: tuple[str, ...]) -> Params:
    """Host side of :func:`_apply_pixel_ops`: the samples' order grouped by op (a stable
    sort), each group's size, and the magnitudes in that order. Computed from the host
    copy of the draws: the group sizes decide the device work's shapes, and reading them
    back from the device would stall the step."""
    order = torch.argsort(ops, stable=True)
    counts = torch.bincount(ops, minlength=len(names)).tolist()
    return {"order": order, "counts": counts, "mags": mags.index_select(0, order)}


def _apply_pixel_ops(x: Tensor, groups: Params, names: tuple[str, ...]) -> Tensor:
    """Apply op ``names[ops[i]]`` with magnitude ``mags[i]`` to sample i, grouped by op
    (:func:`_group_ops`): each op runs once on its contiguous group, so the cost is that
    of one pass over the batch, not one per op.
    """
    order, counts, ms = groups["order"], groups["counts"], groups["mags"]
    xs = x.index_select(0, order)
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
    eye = signed.new_zeros(n, 3, 3)  # on the draws' device (the host, in a draw)
    eye.diagonal(dim1=1, dim2=2).fill_(1.0)

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
    to_norm = torch.diag(_const(x, (2.0 / w, 2.0 / h, 1.0)))
    from_norm = torch.diag(_const(x, (w / 2.0, h / 2.0, 1.0)))
    theta = (to_norm @ pixel_matrix.to(x.dtype) @ from_norm)[:, :2]
    grid = _affine_grid(theta.contiguous(), h, w)
    out = F.grid_sample(x - fill, grid, mode=mode, padding_mode="zeros", align_corners=False)
    return out.add_(fill).clamp_(0.0, 1.0)


def _draw_cutout(g: torch.Generator, n: int, shape: tuple[int, ...], max_frac: float
                 ) -> Params:
    _, h, w = shape
    largest = max(1, int(max_frac * min(h, w)))
    size = _randint(g, 1, largest + 1, n)
    cy = _randint(g, 0, h, n)
    cx = _randint(g, 0, w, n)
    return {"size": size, "cy": cy, "cx": cx}


def _cutout(x: Tensor, p: Params, fill: float) -> Tensor:
    n, _, h, w = x.shape
    dev = x.device
    size, cy, cx = p["size"], p["cy"], p["cx"]
    y0 = (cy - size // 2).clamp_(min=0)
    x0 = (cx - size // 2).clamp_(min=0)
    rows = torch.arange(h, device=dev).view(1, h)
    cols = torch.arange(w, device=dev).view(1, w)
    in_rows = (rows >= y0.view(n, 1)) & (rows < (y0 + size).view(n, 1))
    in_cols = (cols >= x0.view(n, 1)) & (cols < (x0 + size).view(n, 1))
    mask = in_rows.view(n, 1, h, 1) & in_cols.view(n, 1, 1, w)
    return _select(mask, fill, x)


def cutout(x: Tensor, g: torch.Generator, max_frac: float = 0.5, fill: float = 0.0) -> Tensor:
    """Fill one random square per sample (side uniform in 1..``max_frac`` * side) with ``fill``.

    The square's centre is uniform over the image and the square is clipped at the border,
    as in FixMatch's Cutout. Implemented as a broadcast mask, no loop.
    """
    _check(x)
    p = _draw_cutout(g, x.shape[0], tuple(x.shape[1:]), max_frac)
    return _cutout(x, upload(p, x.device), fill)


def _draw_strong(g: torch.Generator, n: int, shape: tuple[int, ...], n_ops: int = 2
                 ) -> Params:
    """Weak flip+crop, per round the ops and magnitudes (grouped by op on the host) and
    the composed geometric map of all rounds, Cutout: drawn in that order."""
    if n == 0:
        return {}
    c, h, w = shape
    names = randaugment_ops(c)
    crop = _draw_weak(g, n, shape)
    matrix = torch.eye(3).expand(n, 3, 3)
    rounds = []
    for _ in range(n_ops):
        ops = _randint(g, 0, len(names), n)
        mags = _rand(g, n)
        rounds.append(_group_ops(ops, mags, names))
        matrix = matrix @ _geometric_matrix(ops, mags, names, h, w)
    return {"weak": crop, "rounds": rounds, "matrix": matrix,
            "cutout": _draw_cutout(g, n, shape, max_frac=0.5)}


def _apply_strong(x: Tensor, p: Params) -> Tensor:
    if x.shape[0] == 0:
        return x.clone()
    work = _as_work(x)
    names = randaugment_ops(work.shape[1])
    out = _weak(work, p["weak"])
    for groups in p["rounds"]:
        out = _apply_pixel_ops(out, groups, names)
    out = _warp(out, p["matrix"], fill=0.5, mode="nearest")
    out = _cutout(out, p["cutout"], fill=0.5)
    return out.to(x.dtype)


strong = AUGMENTATIONS.register("strong")(View(_draw_strong, _apply_strong, """\
FixMatch's strong view: weak flip+crop, RandAugment (2 ops), Cutout.

Each sample draws 2 ops uniformly from :func:`randaugment_ops` and a magnitude uniform
over each op's range. Pixel ops run in the drawn order; the geometric ops of all rounds
are composed into one affine map and applied by a single grid_sample (nearest neighbour
as PIL's default, grey fill as FixMatch), i.e. after the pixel ops: pixel ops commute
with warps up to interpolation and fill, and one resampling instead of two is both
faster and less blurry. Cutout (grey, side up to half the image) comes last."""))


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
    n = _const(hue, (5.0, 3.0, 1.0)).view(1, 3, 1, 1)
    k = 6.0 * _frac((n + 6.0 * hue.unsqueeze(1)) / 6.0)
    ramp = torch.minimum(k, 4.0 - k).clamp_(0.0, 1.0)
    v = val.unsqueeze(1)
    return v - v * sat.unsqueeze(1) * ramp


def _adjust_hue(x: Tensor, shift: Tensor) -> Tensor:
    hue, sat, val = _rgb_to_hsv(x)
    return _hsv_to_rgb(_frac(hue + shift.view(-1, 1, 1)), sat, val)


def _random_resized_box(g: torch.Generator, n: int, h: int, w: int, tries: int = 10
                        ) -> tuple[Tensor, Tensor]:
    """Relative crop width and height for torchvision's RandomResizedCrop, vectorised.

    Scale (0.2, 1) of the area, log-uniform aspect ratio in (3/4, 4/3); like torchvision,
    up to ``tries`` candidates per sample and a clamp-to-image fallback (rarely needed).
    """
    area = _uniform(g, 0.2, 1.0, n * tries).view(tries, n)
    log_ratio = _uniform(g, math.log(3 / 4), math.log(4 / 3), n * tries).view(tries, n)
    ratio = log_ratio.exp() * (h / w)  # aspect in pixels -> in relative units
    rel_w = (area * ratio).sqrt()
    rel_h = (area / ratio).sqrt()
    ok = (rel_w <= 1.0) & (rel_h <= 1.0)
    first = ok.long().argmax(0).view(1, n)  # first valid try (0 if none)
    return (rel_w.gather(0, first).view(n).clamp(max=1.0),
            rel_h.gather(0, first).view(n).clamp(max=1.0))


def _draw_simclr(g: torch.Generator, n: int, shape: tuple[int, ...]) -> Params:
    """The crop+flip map (N, 2, 3) and the jitter factors, in float32 on the host."""
    c, h, w = shape
    rel_w, rel_h = _random_resized_box(g, n, h, w)
    cx = (2.0 * _rand(g, n) - 1.0) * (1.0 - rel_w)
    cy = (2.0 * _rand(g, n) - 1.0) * (1.0 - rel_h)
    flip = torch.where(_rand(g, n) < 0.5, -1.0, 1.0)
    theta = rel_w.new_zeros(n, 2, 3)
    theta[:, 0, 0] = rel_w * flip
    theta[:, 0, 2] = cx
    theta[:, 1, 1] = rel_h
    theta[:, 1, 2] = cy
    jitter = _rand(g, n) < 0.8
    one = torch.ones_like(rel_w)
    p = {"theta": theta,
         "brightness": torch.where(jitter, _uniform(g, 0.6, 1.4, n), one),
         "contrast": torch.where(jitter, _uniform(g, 0.6, 1.4, n), one)}
    if c == 3:
        p["saturation"] = torch.where(jitter, _uniform(g, 0.6, 1.4, n), one)
        p["hue"] = torch.where(jitter, _uniform(g, -0.1, 0.1, n), torch.zeros_like(one))
        p["grayscale"] = _rand(g, n) < 0.2
    return p


def _apply_simclr(x: Tensor, p: Params) -> Tensor:
    work = _as_work(x)
    n, c, h, w = work.shape
    grid = _affine_grid(p["theta"].to(work.dtype), h, w)
    out = F.grid_sample(work, grid, mode="bilinear", padding_mode="border", align_corners=False)
    out = _blend(out, torch.zeros_like(out), p["brightness"].to(work.dtype))
    out = _blend(out, _gray(out).mean(dim=(1, 2, 3), keepdim=True).expand_as(out),
                 p["contrast"].to(work.dtype))
    if c == 3:
        out = _blend(out, _gray(out).expand_as(out), p["saturation"].to(work.dtype))
        out = _adjust_hue(out, p["hue"].to(work.dtype))
        out = _select(p["grayscale"].view(n, 1, 1, 1), _gray(out), out)
    return out.clamp_(0.0, 1.0).to(x.dtype)


simclr = AUGMENTATIONS.register("simclr")(View(_draw_simclr, _apply_simclr, """\
A SimCLR view (CIFAR recipe): resized crop, flip, colour jitter (p=0.8), grayscale.

Crop and flip are one affine map per sample and one bilinear grid_sample back to the
input size. Jitter: brightness 0.4, contrast 0.4 and, for RGB only, saturation 0.4 and
hue 0.1 (single-channel images have no colour to jitter), applied in that fixed order
(they commute up to clipping, so a per-sample random order would change little);
samples that skip jitter get neutral factors instead of a branch. Random grayscale
(p=0.2) for RGB only. Gaussian blur is omitted, as in SimCLR's CIFAR-10 setup."""))


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
    return _apply_vflip(x, (_rand(g, x.shape[0]) < 0.5).to(x.device))


def _apply_vflip(x: Tensor, flip: Tensor) -> Tensor:
    return _select(flip.view(-1, 1, 1, 1), x.flip(2), x)


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
    target = area * _uniform(g, min_area, 1.0, n * tries).to(dev).double().view(tries, n)
    log_r = _uniform(g, math.log(RRC_RATIO[0]), math.log(RRC_RATIO[1]), n * tries).to(dev)
    ratio = log_r.double().view(tries, n).exp()
    w = (target * ratio).sqrt().round()
    h = (target / ratio).sqrt().round()
    ok = (w > 0) & (w <= wid) & (h > 0) & (h <= hgt)
    first = ok.long().argmax(0).view(1, n)
    w, h = w.gather(0, first).view(n), h.gather(0, first).view(n)
    top = (_rand(g, n).to(dev).double() * (hgt - h + 1)).floor()
    left = (_rand(g, n).to(dev).double() * (wid - w + 1)).floor()
    # fallback (torchvision): the whole image, or its centre at the nearest allowed ratio
    in_ratio = wid / hgt
    fw = torch.where(in_ratio > RRC_RATIO[1], (hgt * RRC_RATIO[1]).round(), wid)
    fh = torch.where(in_ratio < RRC_RATIO[0], (wid / RRC_RATIO[0]).round(), hgt)
    found = ok.any(0)
    w, h = torch.where(found, w, fw), torch.where(found, h, fh)
    top = torch.where(found, top, ((hgt - h) / 2).floor())
    left = torch.where(found, left, ((wid - w) / 2).floor())
    return torch.stack([top, left, h, w], 1)


def _supersample(boxes: Tensor, hw: Tensor, sh: int, sw: int, out: int) -> int:
    """:func:`crop_resize`'s default ``k``: the batch's median stored-pixels-per-output-pixel
    ratio, rounded, within 1..4 (a host decision: it sets the grid's size)."""
    _, _, h, w = boxes.double().unbind(1)
    hw = hw.double()
    factor = torch.maximum(h * sh / hw[:, 0], w * sw / hw[:, 1]).median() / out
    return int(min(4, max(1, round(float(factor)))))


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
    k = _supersample(b, hw, sh, sw, out) if supersample is None else supersample
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


def _draw_rrc(g: torch.Generator, n: int, shape: tuple[int, ...], min_area: float,
              hflip: bool, vflip: bool, sizes: Tensor | None = None,
              out_size: int | None = None) -> Params:
    """The crop boxes (drawn and placed on the host, from the originals' sizes), the flips,
    the output side and the supersampling factor: the two last set the work's shapes."""
    _, h, w = shape
    hw = torch.as_tensor(sizes) if sizes is not None else torch.tensor([[h, w]]).expand(n, 2)
    if hw.shape != (n, 2):
        raise ValueError(f"sizes must be (N, 2) = ({n}, 2) original (height, width), got "
                         f"{tuple(hw.shape)}")
    boxes = rrc_boxes(g, hw, min_area)
    out = out_size or h
    return {"boxes": boxes, "hw": hw.double(),
            "hflip": _rand(g, n) < 0.5 if hflip else None,
            "vflip": _rand(g, n) < 0.5 if vflip else None,
            "out": out, "k": _supersample(boxes, hw, h, w, out)}


def _apply_rrc(x: Tensor, p: Params) -> Tensor:
    out = crop_resize(_as_work(x), p["boxes"], p["hw"], p["out"], hflip=p["hflip"],
                      vflip=p["vflip"], supersample=p["k"])
    return out.clamp_(0.0, 1.0).to(x.dtype)


def random_resized_crop(x: Tensor, g: torch.Generator, min_area: float, hflip: bool,
                        vflip: bool = False, *, sizes: Tensor | None = None,
                        out_size: int | None = None) -> Tensor:
    """torchvision's RandomResizedCrop(out, scale=(min_area, 1), ratio=(3/4, 4/3)) and the
    optional flips, batched (:func:`rrc_boxes` + :func:`crop_resize`).

    ``sizes`` (N, 2) are the originals' (height, width) when ``x`` holds whole images
    resized to a common side (the training store of the RandomResizedCrop datasets);
    without it each image is its own original. ``out_size`` defaults to x's side."""
    return _rrc_view(min_area, hflip, vflip, "")(x, g, sizes=sizes, out_size=out_size)


def _rrc_view(min_area: float, hflip: bool, vflip: bool, doc: str) -> View:
    """A RandomResizedCrop view. ``takes_geometry``: the loop passes the originals' sizes
    and the output side when the labeled images are stored whole."""

    def draw(g: torch.Generator, n: int, shape: tuple[int, ...], sizes: Tensor | None = None,
             out_size: int | None = None) -> Params:
        return _draw_rrc(g, n, shape, min_area, hflip, vflip, sizes, out_size)

    return View(draw, _apply_rrc, doc, takes_geometry=True)


def _draw_shift_hvflip(g: torch.Generator, n: int, shape: tuple[int, ...]) -> Params:
    return {**_draw_weak(g, n, shape), "vflip": _rand(g, n) < 0.5}


deic_shift_hflip = AUGMENTATIONS.register("deic_shift_hflip")(View(
    _draw_weak, _apply_weak,
    "ciFAIR-10: shift by up to 12.5 % (4 px at 32) with reflect padding + horizontal flip."))
deic_shift_hvflip = AUGMENTATIONS.register("deic_shift_hvflip")(View(
    _draw_shift_hvflip, lambda x, p: _apply_vflip(_apply_weak(x, p), p["vflip"]),
    "EuroSAT: shift 12.5 % (8 px at 64) + horizontal and vertical flips."))
deic_rrc10_hflip = AUGMENTATIONS.register("deic_rrc10_hflip")(_rrc_view(
    0.1, hflip=True, vflip=False,
    doc="ImageNet: RandomResizedCrop with A_min = 10 % + horizontal flip."))
deic_rrc40_hflip = AUGMENTATIONS.register("deic_rrc40_hflip")(_rrc_view(
    0.4, hflip=True, vflip=False,
    doc="CUB: RandomResizedCrop with A_min = 40 % + horizontal flip."))
deic_rrc40_hvflip = AUGMENTATIONS.register("deic_rrc40_hvflip")(_rrc_view(
    0.4, hflip=True, vflip=True,
    doc="ISIC 2018: RandomResizedCrop with A_min = 40 % + horizontal and vertical flips."))
deic_rrc20 = AUGMENTATIONS.register("deic_rrc20")(_rrc_view(
    0.2, hflip=False, vflip=False,
    doc="CLaMM: RandomResizedCrop with A_min = 20 %, no flips (script orientation matters)."))


__all__ = [
    "AUGMENTATIONS",
    "PACK_ON_CPU",
    "Augmentation",
    "Params",
    "View",
    "as_view",
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
    "upload",
    "weak",
]
