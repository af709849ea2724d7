"""RandomResizedCrop on the original image (paper §4.2; gem ``BasicAugmentation``:
``RandomResizedCrop`` on the decoded original): the crop boxes follow torchvision's
``get_params``, the resampling is exact on a linear image, and the tune protocol's training
batches of a 224-px set reach the image edges that its stored centre crop cuts away."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from scarcelab.data import DATASETS
from scarcelab.data.augment import AUGMENTATIONS, crop_resize, rrc_boxes
from scarcelab.data.sources._deic import DEICSource, deic_loader, load_deic, load_deic_whole
from scarcelab.errors import ConfigError


def _tv_boxes(h: int, w: int, min_area: float, n: int, seed: int) -> np.ndarray:
    from torchvision.transforms import RandomResizedCrop

    torch.manual_seed(seed)
    img = torch.empty(1, h, w)
    return np.array([RandomResizedCrop.get_params(img, [min_area, 1.0], [3 / 4, 4 / 3])
                     for _ in range(n)], dtype=float)  # (top, left, h, w)


@pytest.mark.parametrize(("h", "w", "min_area"), [(375, 500, 0.4), (808, 1032, 0.2),
                                                  (350, 400, 0.1), (60, 180, 0.4)])
def test_boxes_follow_torchvision_get_params(h, w, min_area):
    """Same distribution as torchvision's sampler (an independent implementation): area
    fraction, aspect ratio and relative position by two-sample KS tests, and the rate of
    the fallback centre crop (frequent for the 3:1 image)."""
    n = 6000
    ours = rrc_boxes(torch.Generator().manual_seed(1), torch.tensor([[h, w]] * n),
                     min_area).numpy()
    ref = _tv_boxes(h, w, min_area, n, seed=2)
    for b in (ours, ref):  # integer boxes inside the image
        assert np.all(b == np.round(b)) and np.all(b[:, 2] >= 1) and np.all(b[:, 3] >= 1)
        assert np.all(b[:, 0] + b[:, 2] <= h) and np.all(b[:, 1] + b[:, 3] <= w)
        assert np.all(b[:, 0] >= 0) and np.all(b[:, 1] >= 0)

    def feats(b):
        area = b[:, 2] * b[:, 3] / (h * w)
        aspect = np.log(b[:, 3] / b[:, 2])
        cy = (b[:, 0] + b[:, 2] / 2) / h
        return area, aspect, cy

    for a, r in zip(feats(ours), feats(ref), strict=True):
        assert stats.ks_2samp(a, r).pvalue > 1e-3
    # torchvision's fallback after 10 failed tries: the centre crop, its aspect ratio
    # clamped to 3/4..4/3 (for the 3:1 image, mostly: 60 × 80 at left 50)
    fw = min(w, round(h * 4 / 3))
    fallback = np.array([(h - h) // 2, (w - fw) // 2, h, fw], float)
    rate = lambda b: np.mean(np.all(b == fallback, axis=1))  # noqa: E731
    assert abs(rate(ours) - rate(ref)) < 0.03
    drawn = ours[~np.all(ours == fallback, axis=1)]
    assert len(drawn) > 0
    assert (drawn[:, 2] * drawn[:, 3]).min() >= min_area * h * w * 0.97  # rounding only


def test_crop_resize_is_exact_on_a_linear_image():
    """A linear image is reproduced exactly by bilinear sampling, so every output pixel is
    the original's value at the centre PIL / torchvision assign it: left + (u + ½)·w/out
    (continuous coordinates, pixel i spanning [i, i + 1)); also with supersampling and
    flips. The stored image is the whole 60×90 original resized to 40×40 (aspect lost)."""
    H, W, S, out = 60, 90, 40, 16
    a, b = 0.004, 0.007  # value = a·y + b·x at continuous coordinates

    def store(side_h, side_w):
        ys = (np.arange(side_h) + 0.5) * H / side_h
        xs = (np.arange(side_w) + 0.5) * W / side_w
        return a * ys[:, None] + b * xs[None, :]

    x = torch.tensor(store(S, S), dtype=torch.float64).expand(3, 1, S, S).contiguous()
    boxes = torch.tensor([[10.0, 20.0, 30.0, 40.0], [5.0, 0.0, 50.0, 60.0],
                          [0.0, 30.0, 60.0, 45.0]])
    hw = torch.tensor([[H, W]] * 3)
    for k, flip in ((1, False), (2, False), (3, True)):
        f = torch.tensor([flip] * 3)
        y = crop_resize(x, boxes, hw, out, hflip=f, vflip=f, supersample=k)
        for i, (t, left, h, w) in enumerate(boxes.tolist()):
            u = (np.arange(out) + 0.5) / out
            yy, xx = t + u * h, left + u * w
            want = a * yy[:, None] + b * xx[None, :]
            if flip:
                want = want[::-1, ::-1]
            # away from the stored image's border (where sampling clamps to the edge)
            inner = slice(2, out - 2)
            np.testing.assert_allclose(y[i, 0].numpy()[inner, inner], want[inner, inner],
                                       atol=1e-9)


# -- through the tune protocol -------------------------------------------------------------

RED, GREEN = (255, 0, 0), (0, 255, 0)


def _fixture_source(root: Path, name: str = "rrcfix") -> DEICSource:
    """Wide 24×48 images, a red band at each end and green between: the stored 16-px
    evaluation image (short side 16, centre crop) is green only — the red is what only a
    crop of the whole original can show."""
    from PIL import Image

    folder = root / "deic" / name
    (folder / "splits").mkdir(parents=True)
    (folder / "images").mkdir()
    splits = {"train": [(f"c{c}/tr{i}", c) for c in (0, 1) for i in range(4)],
              "val": [(f"c{c}/va{i}", c) for c in (0, 1) for i in range(2)],
              "test": [(f"c{c}/te{i}", c) for c in (0, 1) for i in range(2)]}
    md5 = {}
    for s, items in splits.items():
        text = "".join(f"{n} {y}\n" for n, y in items).encode()
        (folder / "splits" / f"{s}.txt").write_bytes(text)
        md5[(name, s)] = hashlib.md5(text, usedforsecurity=False).hexdigest()
        for n, _ in items:
            a = np.zeros((24, 48, 3), np.uint8)
            a[:] = GREEN
            a[:, :8] = RED
            a[:, 40:] = RED
            p = folder / "images" / f"{n}.png"
            p.parent.mkdir(exist_ok=True)
            Image.fromarray(a).save(p)
    return DEICSource(name=name, folder=name, num_classes=2, channels=3, size=16,
                      split_base_url="http://127.0.0.1:9/unused", split_md5=md5,
                      train_side=32)


def _red(x: torch.Tensor) -> torch.Tensor:
    """Per sample: does any pixel look red (the loop's inputs are in [-1, 1])?"""
    return ((x[:, 0] > 0.8) & (x[:, 1] < -0.8)).flatten(1).any(1)


def test_whole_image_store_keeps_the_original_and_its_size(tmp_path):
    src = _fixture_source(tmp_path)
    raw = load_deic(src, tmp_path)
    assert raw.train_x.shape == (8, 3, 16, 16)
    assert not _red(torch.as_tensor(raw.train_x).float() / 127.5 - 1).any()
    whole = load_deic_whole(src, tmp_path)
    assert whole["train_x"].shape == (8, 3, 32, 32) and whole["val_x"].shape == (4, 3, 32, 32)
    assert whole["train_hw"].tolist() == [[24, 48]] * 8
    np.testing.assert_array_equal(whole["train_y"], raw.train_y)
    assert (whole["train_x"][:, :, :, 0] == np.array(RED)[:, None]).all()  # left edge kept
    assert len(list((tmp_path / "deic" / src.name).glob("whole_32_*.npz"))) == 1
    again = load_deic_whole(src, tmp_path)  # from the cache
    np.testing.assert_array_equal(again["val_x"], whole["val_x"])


def test_tune_trains_on_crops_of_the_whole_original(tmp_path, monkeypatch):
    """run_tune on a RandomResizedCrop dataset (registered as ``cub``, so the protocol
    uses CUB's settings and ``deic_rrc40_hflip``): the search's and the retrains' batches
    are 16-px crops that show the red ends of the originals; the old protocol cut them from
    the stored centre crop, which holds none."""
    from scarcelab import train as train_mod
    from scarcelab.protocols.tune import TuneConfig, run_tune
    from scarcelab.tracker import InMemoryTracker

    src = _fixture_source(tmp_path, "cub_fixture")
    DATASETS._load()
    monkeypatch.setitem(DATASETS._entries, "cub", deic_loader(src))
    seen: list[torch.Tensor] = []
    orig = train_mod.BatchSource.next

    def spy(self):
        b = orig(self)
        seen.append(b.x[0])
        return b

    monkeypatch.setattr(train_mod.BatchSource, "next", spy)
    t = InMemoryTracker()
    res = run_tune(TuneConfig(method="ce", dataset="cub", data_dir=str(tmp_path),
                              arch="small_cnn", epochs=2, grace_period=1, n_trials=1,
                              batch_sizes=(8,), max_steps_per_epoch=3, n_final=1), t)
    assert len(res.final_test) == 1
    assert all(x.shape[-2:] == (16, 16) for x in seen)  # crops at the evaluation size
    red = torch.cat([_red(x) for x in seen]).float()
    assert 0.05 < float(red.mean()) < 1.0  # some crops reach an end, some do not
    assert t.study.params["train_images"] == "whole 32px"
    assert t.study.params["augmentation"] == "deic_rrc40_hflip"


def test_a_view_that_cannot_crop_the_whole_images_is_refused():
    from scarcelab.data.bundle import DatasetBundle
    from scarcelab.methods import get_method
    from scarcelab.train import BatchSource

    x = np.zeros((4, 3, 32, 32), np.uint8)
    y = np.zeros(4, np.int64)
    b = DatasetBundle(labeled_x=x, labeled_y=y, unlabeled_x=x[:0], val_x=x, val_y=y,
                      test_x=x, test_y=y, meta={"num_classes": 2, "labeled_geometry": {
                          "sizes": np.full((4, 2), 40), "out_size": 16}})
    with pytest.raises(ConfigError, match=r"stored whole at 32 px.*\['weak'\]"):
        BatchSource(b, get_method("ce"), 2, 0, torch.device("cpu"),
                    torch.Generator().manual_seed(0), labeled_views=("weak",))
    src = BatchSource(b, get_method("ce"), 2, 0, torch.device("cpu"),
                      torch.Generator().manual_seed(0), labeled_views=("deic_rrc20",))
    assert src.next().x[0].shape == (2, 3, 16, 16)
    assert getattr(AUGMENTATIONS.get("deic_rrc20"), "takes_geometry", False)
    assert not getattr(AUGMENTATIONS.get("deic_shift_hflip"), "takes_geometry", False)
