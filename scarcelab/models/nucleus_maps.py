"""Between instance maps and network maps: HoVer-Net training targets, sliding-window
inference on whole tiles, and HoVer-Net's marker-controlled watershed back to instances.

Targets (Graham et al. 2019, §3.2; ``vqdang/hover_net`` ``models/hovernet/targets.py``
``gen_instance_hv_map``): NP = nucleus pixel; HV = each nucleus pixel's horizontal and
vertical offset from its nucleus' centre of mass, scaled to [-1, 1] separately on each side
of the centre (so a nucleus spans -1 .. 1 whatever its size). Between two touching nuclei
the maps jump from +1 to -1: that jump, a large *negative* derivative, is what separates
them after prediction. For a training crop the HV maps of a nucleus cut by the crop border
come from the *whole* nucleus (their targets are computed on the uncropped input, "based on
the original shape"), and a nucleus with fewer than ``MIN_AREA`` pixels inside the crop gets
no HV target (their ``remove_small_objects(crop_ann, min_size=30)``) while staying
foreground for NP and TP, as there.

Post-processing (``models/hovernet/post_proc.py::__proc_np_hv``, written here with scipy):
foreground = NP probability >= 0.5 minus components under 10 px; each HV map min-max
normalised to [0, 1] over the tile, differentiated by a 21 x 21 Sobel filter (h along x, v
along y), each derivative min-max normalised and inverted (1 - d), so the +1 -> -1 jump
between nuclei is near 1 and a nucleus' interior near 0; the larger of the two, zero
outside the foreground, is the boundary energy; markers = foreground where the energy is
< 0.4, holes filled, opened with a 5 x 5 ellipse, components under 10 px dropped;
instances = watershed of the (3 x 3 Gaussian-blurred) inverted energy from those markers
inside the foreground. A foreground blob that received no marker is left out, as there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from scipy import ndimage

from scarcelab.extras import need

MIN_AREA = 30  # px in the crop (HoVer-Net targets.py: remove_small_objects(..., min_size=30))


def hv_targets(inst: np.ndarray, ids: np.ndarray | None = None) -> np.ndarray:
    """(2, H, W) float32: h then v offsets to each nucleus' centre, in [-1, 1], for the
    instances ``ids`` (default: all) measured on the whole map given."""
    hv = np.zeros((2, *inst.shape), np.float32)
    objs = ndimage.find_objects(inst)
    wanted = range(1, len(objs) + 1) if ids is None else (int(i) for i in ids)
    for i in wanted:
        sl = objs[i - 1] if 0 < i <= len(objs) else None
        if sl is None:
            continue
        m = inst[sl] == i
        rr, cc = np.nonzero(m)
        for ch, coord in ((0, cc), (1, rr)):
            d = coord - coord.mean()
            neg, pos = -d[d < 0].min(initial=0.0), d[d > 0].max(initial=0.0)
            scaled = np.where(d < 0, d / max(neg, 1e-6), d / max(pos, 1e-6))
            hv[ch][sl][rr, cc] = scaled
    return hv


def crop_targets(inst: np.ndarray, r: int, c: int, size: int, min_area: int = MIN_AREA
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``(instance crop, HV crop)`` of the window ``inst[r:r+size, c:c+size]``: HV from
    each whole nucleus, none for a nucleus with under ``min_area`` pixels in the window."""
    win = inst[r:r + size, c:c + size]
    ids, n = np.unique(win, return_counts=True)
    keep = ids[(ids != 0) & (n >= min_area)]
    return win, hv_targets(inst, keep)[:, r:r + size, c:c + size]


def type_map(inst: np.ndarray, types: dict[int, int] | None) -> np.ndarray:
    """Per-pixel type (0 = background) from an instance map and its instance types."""
    if not types:
        return (inst > 0).astype(np.int64)
    lut = np.zeros(int(inst.max()) + 1, np.int64)
    for i, t in types.items():
        if i <= inst.max():
            lut[i] = t
    return lut[inst]


# -- HoVer-Net's post-processing ----------------------------------------------------------------
def _minmax(x: np.ndarray) -> np.ndarray:
    """To [0, 1] over the whole array (OpenCV NORM_MINMAX; a constant array gives 0)."""
    lo, hi = float(x.min()), float(x.max())
    return (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)


def _binomial(n: int) -> np.ndarray:
    k = np.array([1.0])
    for _ in range(n):
        k = np.convolve(k, [1.0, 1.0])
    return k


def sobel(x: np.ndarray, axis: int, size: int = 21) -> np.ndarray:
    """OpenCV's ``Sobel`` of odd aperture ``size`` (first derivative along ``axis``): the
    separable pair of a differenced binomial of order ``size - 2`` along ``axis`` and a
    binomial smoother of order ``size - 1`` across it, mirrored borders (BORDER_REFLECT_101
    = scipy's ``mirror``). Positive where ``x`` increases with the index."""
    if size < 3 or size % 2 == 0:
        raise ValueError(f"sobel size must be odd and >= 3, got {size}")
    deriv = -np.diff(np.r_[0.0, _binomial(size - 2), 0.0])  # -1, -18, ..., 18, 1 for 21
    out = ndimage.correlate1d(x.astype(np.float64), deriv, axis=axis, mode="mirror")
    return ndimage.correlate1d(out, _binomial(size - 1), axis=1 - axis, mode="mirror")


def ellipse(size: int) -> np.ndarray:
    """OpenCV's ``getStructuringElement(MORPH_ELLIPSE, (size, size))``."""
    r = size // 2
    out = np.zeros((size, size), bool)
    for i in range(size):
        dy = i - r
        dx = int(np.rint(r * np.sqrt(max(r * r - dy * dy, 0) / (r * r)))) if r else 0
        out[i, max(r - dx, 0):min(r + dx + 1, size)] = True
    return out


def _label(mask: Any) -> np.ndarray:
    """Connected components of ``mask`` (anything ``ndimage.label`` takes; without
    ``output`` it returns ``(labels, count)``)."""
    return cast("tuple[np.ndarray, int]", ndimage.label(mask))[0]


def _drop_small(lab: np.ndarray, min_size: int) -> np.ndarray:
    """Labels with fewer than ``min_size`` pixels set to 0 (HoVer-Net misc/utils.py)."""
    if min_size <= 1 or not lab.any():
        return lab
    small = np.bincount(lab.ravel()) < min_size
    small[0] = False
    return np.where(small[lab], 0, lab)


@dataclass
class PostProcess:
    """HoVer-Net's ``__proc_np_hv`` (defaults are theirs; ``edge_threshold`` is their
    marker threshold ``overall >= 0.4``, tunable on validation by ``segment``)."""

    fg_threshold: float = 0.5
    edge_threshold: float = 0.4
    min_size: int = 10
    sobel_size: int = 21
    open_size: int = 5
    min_marker: int = 10

    def __call__(self, fg_prob: np.ndarray, hv: np.ndarray) -> np.ndarray:
        watershed = need("skimage.segmentation", "segment (watershed)").watershed

        blb = _drop_small(_label(fg_prob >= self.fg_threshold), self.min_size) > 0
        if not blb.any():
            return np.zeros(blb.shape, np.int32)
        dh = 1.0 - _minmax(sobel(_minmax(hv[0].astype(np.float64)), 1, self.sobel_size))
        dv = 1.0 - _minmax(sobel(_minmax(hv[1].astype(np.float64)), 0, self.sobel_size))
        energy = np.where(blb, np.maximum(dh, dv), 0.0)
        blur = np.array([0.25, 0.5, 0.25])  # OpenCV's 3-tap Gaussian for sigma 0
        dist = (1.0 - energy) * blb
        dist = -ndimage.correlate1d(ndimage.correlate1d(dist, blur, 0, mode="mirror"),
                                    blur, 1, mode="mirror")
        marker = ndimage.binary_fill_holes(blb & (energy < self.edge_threshold))
        if self.open_size > 1:  # OpenCV's MORPH_OPEN: the border never erodes
            se = ellipse(self.open_size)
            marker = ndimage.binary_dilation(
                ndimage.binary_erosion(marker, se, border_value=1), se, border_value=0)
        mlab = _drop_small(_label(marker), self.min_marker)
        return watershed(dist, mlab, mask=blb).astype(np.int32)


def instance_types(inst: np.ndarray, type_prob: np.ndarray) -> dict[int, int]:
    """Type of each predicted instance as HoVer-Net's ``post_proc.process``: the most
    common per-pixel argmax over *all* channels, background included; when that is the
    background and another value occurs, the second most common (ties to the smaller id,
    their ``np.unique`` order under a stable sort). 0 = no type."""
    if type_prob.shape[0] < 2:
        return {int(i): 1 for i in np.unique(inst) if i}
    arg = type_prob.argmax(0)
    out = {}
    for i, sl in enumerate(ndimage.find_objects(inst), start=1):
        if sl is None:
            continue
        votes = np.bincount(arg[sl][inst[sl] == i], minlength=type_prob.shape[0])
        ranked = sorted(np.flatnonzero(votes).tolist(), key=lambda t: -votes[t])
        best = ranked[0]
        if best == 0 and len(ranked) > 1:
            best = ranked[1]
        out[i] = int(best)
    return out


def resize_maps(maps: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """(C, h, w) network maps bilinearly resized to ``shape``: post-processing runs at the
    tile's own resolution, where HoVer-Net's pixel sizes (Sobel 21, 10 px, 5 px) belong."""
    if maps.shape[1:] == tuple(shape):
        return maps
    t = torch.from_numpy(np.ascontiguousarray(maps))[None].float()
    return torch.nn.functional.interpolate(t, size=tuple(shape), mode="bilinear",
                                           align_corners=False)[0].numpy()


def _ramp(n: int) -> np.ndarray:
    return np.minimum(np.arange(n) + 1, np.arange(n)[::-1] + 1).astype(np.float32)


@dataclass
class _TileWindows:
    """One tile laid out for sliding-window inference (see :func:`predict_tiles`)."""

    pixels: torch.Tensor  # (3, H, W) float in [0, 1], reflect-padded to at least a window
    h0: int
    w0: int
    wh: int
    ww: int
    coords: list[tuple[int, int]]
    weight: np.ndarray
    acc: np.ndarray | None = None
    den: np.ndarray | None = None

    @classmethod
    def of(cls, image: np.ndarray, window: int, stride: int) -> _TileWindows:
        h0, w0 = image.shape[:2]
        wh = min(window, -(-h0 // stride) * stride)
        ww = min(window, -(-w0 // stride) * stride)
        H, W = max(h0, wh), max(w0, ww)
        x = np.pad(image, ((0, H - h0), (0, W - w0), (0, 0)), mode="reflect")
        ys = sorted({*range(0, H - wh + 1, max(1, wh // 2)), H - wh})
        xs = sorted({*range(0, W - ww + 1, max(1, ww // 2)), W - ww})
        wgt = np.minimum.outer(_ramp(wh), _ramp(ww))
        wgt /= wgt.max()
        t = torch.from_numpy(np.ascontiguousarray(x)).permute(2, 0, 1).float().div(255.0)
        return cls(t, h0, w0, wh, ww, [(a, b) for a in ys for b in xs], wgt)

    def add(self, a: int, b: int, y: np.ndarray) -> None:
        if self.acc is None:
            self.acc = np.zeros((y.shape[0], *self.pixels.shape[1:]), np.float32)
            self.den = np.zeros(self.pixels.shape[1:], np.float32)
        assert self.den is not None
        self.acc[:, a:a + self.wh, b:b + self.ww] += y * self.weight
        self.den[a:a + self.wh, b:b + self.ww] += self.weight

    def maps(self) -> np.ndarray:
        assert self.acc is not None and self.den is not None
        return (self.acc / self.den)[:, :self.h0, :self.w0]


@torch.no_grad()
def predict_tiles(model: torch.nn.Module, images: list[np.ndarray], window: int,
                  device: torch.device | str = "cpu", batch: int = 16) -> list[np.ndarray]:
    """Sliding-window prediction on whole (H, W, 3) uint8 tiles: windows of up to
    ``window`` pixels (smaller for a smaller tile, rounded up to the model's ``stride``)
    at half-window steps, overlapping outputs averaged with a weight that falls towards
    each window's border (centres see the most context). Returns each tile's maps as
    (C, H, W) float32 with NP and TP as probabilities, HV as predicted.

    The windows of *all* tiles go through the network in batches of ``batch`` windows
    of one size (a tile no larger than the window is one window, so batching per tile
    alone left CoNSeP's 256 x 256 test patches at one window per forward pass). The
    model is in eval mode, so a window's output does not depend on its batch mates; the
    maps equal tile-by-tile inference up to float rounding (tests/core/protocols/test_segment.py).
    On this 2-core CPU the batch size made no measurable difference (a forward pass of
    a 256 x 256 window is ~0.2-0.25 s of CPU at batch 1 and 8, docs/performance.md);
    on a GPU one-window forward passes leave it idle (not measured here)."""
    was = model.training
    model.eval()
    stride = int(getattr(model, "stride", 1))
    tiles = [_TileWindows.of(img, window, stride) for img in images]
    by_shape: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    for k, t in enumerate(tiles):
        by_shape.setdefault((t.wh, t.ww), []).extend((k, a, b) for a, b in t.coords)
    for (wh, ww), todo in by_shape.items():
        for s in range(0, len(todo), batch):
            chunk = todo[s:s + batch]
            xb = torch.stack([tiles[k].pixels[:, a:a + wh, b:b + ww]
                              for k, a, b in chunk]).to(device)
            y = model(xb).float()
            n_types = y.shape[1] - 4
            y = torch.cat([y[:, :2].softmax(1), y[:, 2:4],
                           y[:, 4:].softmax(1) if n_types > 0 else y[:, 4:]], 1).cpu().numpy()
            for (k, a, b), yy in zip(chunk, y, strict=True):
                tiles[k].add(a, b, yy)
    model.train(was)
    return [t.maps() for t in tiles]


def predict_tile(model: torch.nn.Module, image: np.ndarray, window: int,
                 device: torch.device | str = "cpu", batch: int = 8) -> np.ndarray:
    """:func:`predict_tiles` of one tile."""
    return predict_tiles(model, [image], window, device, batch)[0]
