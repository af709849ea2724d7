"""Behaviours of scarcelab/protocols/segment.py that the seeded mutation sample
(docs/mutation.md) showed tests/test_segment.py did not check. Expected values are
hand-derived from the documented contract and HoVer-Net (Graham et al. 2019); everything
runs on tiny synthetic tensors / tiles on the CPU, without the shared data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from scarcelab.data.nuclei import NucleiDataset, NucleiTile
from scarcelab.models.nucleus_maps import PostProcess, hv_targets
from scarcelab.protocols import segment as seg


def test_hv_gradients_follow_the_input_dtype():
    """The gradient kernel is cast to the maps' dtype/device, so float64 maps work and give
    the hand value: a ramp of slope 0.1 has gradient 12 x 0.1 (HoVer-Net's 5 x 5 kernel)
    away from the zero-padded edge."""
    h, w = 8, 9
    ramp = torch.arange(w, dtype=torch.float64).mul(0.1).expand(1, 1, h, w)
    hv = torch.cat([ramp, torch.arange(h, dtype=torch.float64).mul(0.1)
                    .view(1, 1, h, 1).expand(1, 1, h, w)], 1)
    g = seg.hv_gradients(hv)
    assert g.dtype == torch.float64 and g.shape == (1, 2, h, w)
    assert torch.allclose(g[:, :, 2:-2, 2:-2], torch.tensor(1.2, dtype=torch.float64))


def _touching_pair() -> np.ndarray:
    inst = np.zeros((30, 40), np.int32)
    inst[5:20, 5:18] = 1
    inst[5:20, 18:31] = 2
    return inst


def test_score_maps_reads_the_np_channel_and_returns_instances_at_tile_size():
    """Maps are (NP background, NP foreground, H, V, types...): the watershed takes the
    foreground probability m[1] and the HV maps m[2:4]; the maps are resized to the
    tile's own shape before post-processing. Perfect maps made at half resolution (every
    pixel of the tile doubled) must therefore give PQ 1 and instances equal to the true
    map."""
    small = _touching_pair()
    big = np.kron(small, np.ones((2, 2), np.int32))  # the tile at full resolution
    fg = (small > 0).astype(np.float64)
    m = np.concatenate([(1 - fg)[None], fg[None], hv_targets(small)])
    tile = NucleiTile("t", np.zeros((*big.shape, 3), np.uint8), big, None, "g")
    ev, preds = seg.score_maps([m], [tile], PostProcess(), None)
    assert preds[0].shape == big.shape
    assert ev.result()["pq"] == pytest.approx(1.0)
    # the same instances as the truth, up to relabelling
    pairs = set(zip(big.ravel().tolist(), preds[0].ravel().tolist(), strict=True))
    assert len(pairs) == 3 and len({p for _, p in pairs}) == 3


def _synthetic_nuclei(name: str | None = None, data_dir: str | None = None) -> NucleiDataset:
    """Four source images for training/validation and one for test, 32 x 32 each, with
    two dark square 'nuclei' on a bright background (typed 1 and 2)."""
    rng = np.random.default_rng(0)

    def tile(i: int, group: str) -> NucleiTile:
        inst = np.zeros((32, 32), np.int32)
        r, c = 3 + i % 5, 4 + (2 * i) % 7
        inst[r:r + 9, c:c + 9] = 1
        inst[r + 14:r + 23, c + 12:c + 21] = 2
        img = np.full((32, 32, 3), 220, np.uint8)
        img[inst > 0] = (80, 40, 120)
        img = np.clip(img + rng.integers(-10, 10, img.shape), 0, 255).astype(np.uint8)
        return NucleiTile(f"{group}/{i}", img, inst, {1: 1, 2: 2}, group)

    train = [tile(i, f"g{i % 4}") for i in range(8)]
    test = [tile(8 + i, "gt") for i in range(2)]
    return NucleiDataset("synthetic_nuclei", train, test, {1: "a", 2: "b"}, "synthetic")


def test_segment_result_fields_match_what_the_run_logged(monkeypatch):
    """SegmentResult's fields are, in order, best_epoch, epochs, val, test, cross,
    edge_threshold, train_s, eval_s: the marker threshold is HoVer-Net's 0.4 (no
    tuning asked; also tagged on the run) and the two times are the ones logged."""
    from scarcelab.tracker import InMemoryTracker

    monkeypatch.setattr(seg, "load_nuclei", _synthetic_nuclei)
    # the protocol checks names in the registry before any work: the stand-in is registered
    monkeypatch.setitem(seg.SEG_DATASETS._entries, "synthetic_nuclei", _synthetic_nuclei)
    cfg = seg.SegmentConfig(dataset="synthetic_nuclei", max_epochs=1, steps_per_epoch=1,
                            batch_size=2, crop=32, window=32, scale=1.0, lr=0.0,
                            n_overlays=0, device="cpu", arch="small_cnn")
    tr = InMemoryTracker()
    res = seg.run_segment(cfg, tr)
    assert (res.best_epoch, res.epochs, res.cross) == (0, 1, {})
    assert res.edge_threshold == 0.4
    assert str(res.edge_threshold) == tr.study.tags["scarcelab.edge_threshold"]
    assert tr.study.history("seg/edge_threshold") == [(0, res.edge_threshold)]
    assert tr.study.history("time/train_s") == [(0, res.train_s)]
    assert tr.study.history("time/eval_s") == [(0, res.eval_s)]
    assert res.eval_s > 0 and res.train_s > 0
