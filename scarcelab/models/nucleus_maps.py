"""Between instance maps and network maps: HoVer-Net training targets, sliding-window
inference on whole tiles, and marker-controlled watershed back to instances.

Targets (Graham et al. 2019, §3.2): NP = nucleus pixel; HV = each nucleus pixel's
horizontal and vertical offset from its nucleus' centre of mass, scaled to [-1, 1]
separately on each side of the centre (so a nucleus spans -1 .. 1 whatever its size).
Between two touching nuclei the maps jump from +1 to -1: that jump, a large *negative*
derivative, is what separates them after prediction.

Post-processing (the idea of HoVer-Net §3.3, written here from the paper): foreground
= NP probability > 0.5; boundary energy = the larger of the negative parts of ∂h/∂x and
∂v/∂y (Sobel on smoothed maps), scaled to [0, 1]; markers = foreground pixels of low
energy, opened and stripped of specks; instances = watershed of the smoothed energy from
those markers within the foreground (scikit-image's ``segmentation.watershed``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy import ndimage


def hv_targets(inst: np.ndarray) -> np.ndarray:
    """(2, H, W) float32: h then v offsets to each nucleus' centre, in [-1, 1]."""
    hv = np.zeros((2, *inst.shape), np.float32)
    for i, sl in enumerate(ndimage.find_objects(inst), start=1):
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


def type_map(inst: np.ndarray, types: dict[int, int] | None) -> np.ndarray:
    """Per-pixel type (0 = background) from an instance map and its instance types."""
    if not types:
        return (inst > 0).astype(np.int64)
    lut = np.zeros(int(inst.max()) + 1, np.int64)
    for i, t in types.items():
        if i <= inst.max():
            lut[i] = t
    return lut[inst]


@dataclass
class PostProcess:
    """Thresholds of the watershed step (defaults tuned on ground-truth-derived maps of
    CoNSeP training patches, never on test data)."""

    fg_threshold: float = 0.5
    edge_threshold: float = 0.1
    smooth_sigma: float = 1.0
    min_size: int = 10
    min_marker: int = 4

    def __call__(self, fg_prob: np.ndarray, hv: np.ndarray) -> np.ndarray:
        from skimage.morphology import remove_small_objects
        from skimage.segmentation import watershed

        fg = fg_prob > self.fg_threshold
        if self.min_size > 1:
            fg = remove_small_objects(fg, max_size=self.min_size - 1)
        if not fg.any():
            return np.zeros(fg.shape, np.int32)
        h = ndimage.gaussian_filter(hv[0].astype(np.float64), self.smooth_sigma)
        v = ndimage.gaussian_filter(hv[1].astype(np.float64), self.smooth_sigma)
        edge = np.maximum(np.clip(-ndimage.sobel(h, axis=1), 0, None),
                          np.clip(-ndimage.sobel(v, axis=0), 0, None))
        top = edge[fg].max()
        edge = edge / top if top > 0 else edge
        edge[~fg] = 0
        markers = fg & (edge < self.edge_threshold)
        markers = ndimage.binary_opening(markers, iterations=1)
        if self.min_marker > 1:
            markers = remove_small_objects(markers, max_size=self.min_marker - 1)
        mlab, _ = ndimage.label(markers)
        energy = ndimage.gaussian_filter(edge, 1.0)
        out = watershed(energy, mlab, mask=fg)
        # foreground components without any marker become one instance each
        rest, n_rest = ndimage.label(fg & (out == 0))
        if n_rest:
            out = np.where(rest > 0, rest + out.max(), out)
        return out.astype(np.int32)


def instance_types(inst: np.ndarray, type_prob: np.ndarray) -> dict[int, int]:
    """Type of each predicted instance: majority vote of the per-pixel argmax over the
    nucleus types (background excluded), ties to the larger summed probability."""
    if type_prob.shape[0] < 2:
        return {int(i): 1 for i in np.unique(inst) if i}
    arg = type_prob[1:].argmax(0) + 1
    out = {}
    for i, sl in enumerate(ndimage.find_objects(inst), start=1):
        if sl is None:
            continue
        m = inst[sl] == i
        votes = np.bincount(arg[sl][m], minlength=type_prob.shape[0])[1:]
        best = np.flatnonzero(votes == votes.max())
        if len(best) > 1:
            sums = type_prob[1:, sl[0], sl[1]][:, m].sum(1)
            best = [best[np.argmax(sums[best])]]
        out[i] = int(best[0]) + 1
    return out


@torch.no_grad()
def predict_tile(model: torch.nn.Module, image: np.ndarray, window: int,
                 device: torch.device | str = "cpu", batch: int = 8) -> np.ndarray:
    """Sliding-window prediction on a whole (H, W, 3) uint8 tile: windows of up to
    ``window`` pixels (smaller for a smaller tile, rounded up to the model's ``stride``)
    at half-window steps, overlapping outputs averaged with a weight that falls towards
    each window's border (centres see the most context). Returns the maps as
    (C, H, W) float32 with NP and TP as probabilities, HV as predicted."""
    was = model.training
    model.eval()
    m = int(getattr(model, "stride", 1))
    h0, w0 = image.shape[:2]
    wh = min(window, -(-h0 // m) * m)
    ww = min(window, -(-w0 // m) * m)
    H, W = max(h0, wh), max(w0, ww)
    x = np.pad(image, ((0, H - h0), (0, W - w0), (0, 0)), mode="reflect")
    ys = sorted({*range(0, H - wh + 1, max(1, wh // 2)), H - wh})
    xs = sorted({*range(0, W - ww + 1, max(1, ww // 2)), W - ww})

    def ramp(n: int) -> np.ndarray:
        return np.minimum(np.arange(n) + 1, np.arange(n)[::-1] + 1).astype(np.float32)

    wgt = np.minimum.outer(ramp(wh), ramp(ww))
    wgt /= wgt.max()
    t = torch.from_numpy(x).permute(2, 0, 1).float().div(255.0)
    coords = [(a, b) for a in ys for b in xs]
    acc = den = None
    for s in range(0, len(coords), batch):
        cs = coords[s:s + batch]
        xb = torch.stack([t[:, a:a + wh, b:b + ww] for a, b in cs]).to(device)
        y = model(xb).float()
        n_types = y.shape[1] - 4
        y = torch.cat([y[:, :2].softmax(1), y[:, 2:4],
                       y[:, 4:].softmax(1) if n_types > 0 else y[:, 4:]], 1).cpu().numpy()
        if acc is None:
            acc = np.zeros((y.shape[1], H, W), np.float32)
            den = np.zeros((H, W), np.float32)
        for (a, b), yy in zip(cs, y, strict=True):
            acc[:, a:a + wh, b:b + ww] += yy * wgt
            den[a:a + wh, b:b + ww] += wgt
    model.train(was)
    assert acc is not None and den is not None
    return (acc / den)[:, :h0, :w0]
