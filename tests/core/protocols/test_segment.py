"""Nuclei segmentation: loaders (shared data + a CoNSeP .mat fixture), HV targets, the
watershed on ground-truth-derived maps, sliding-window stitching, type vote, encoder
loading, the HoVer-Net loss on hand-computable cases, and a tiny ``segment`` run through
the CLI into a real sqlite MLflow store."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch import nn

from scarcelab.data.nuclei import NucleiDataset, NucleiTile
from scarcelab.errors import ConfigError, DataError
from scarcelab.metrics.segmentation import evaluate
from scarcelab.models.nucleus_maps import (
    MIN_AREA,
    PostProcess,
    crop_targets,
    ellipse,
    hv_targets,
    instance_types,
    predict_tile,
    sobel,
    type_map,
)
from scarcelab.protocols import segment as seg

REPO = Path(__file__).resolve().parents[3]
SHARED = Path(os.environ.get("SCARCELAB_SHARED_DATA", REPO.parent / "shared" / "data"))


def _need(folder: str) -> Path:
    if not (SHARED / folder).exists():
        pytest.skip(f"{SHARED / folder} absent (../shared/data exists on project machines)")
    return SHARED / folder


# -- loaders ---------------------------------------------------------------------------------
def test_consep_patches_loader_shapes_types_and_split():
    from scarcelab.data.nuclei import load_nuclei, split_validation

    d = load_nuclei("consep_patches", _need("consep_patches"))
    assert (len(d.train), len(d.test)) == (432, 224)
    assert d.type_names == {1: "other", 2: "inflammatory", 3: "epithelial",
                            4: "spindle-shaped"}
    groups_tr, groups_te = {t.group for t in d.train}, {t.group for t in d.test}
    assert (len(groups_tr), len(groups_te)) == (27, 14) and not groups_tr & groups_te
    n_by_type = np.zeros(5, int)
    for t in (*d.train, *d.test):
        assert t.image.shape == (256, 256, 3) and t.image.dtype == np.uint8
        ids = set(np.unique(t.inst).tolist()) - {0}
        assert ids == set(t.types) == set(range(1, len(ids) + 1))
        n_by_type += np.bincount(list(t.types.values()), minlength=5)
    # MANIFEST.md: 28,546 nuclei, 1,090 / 6,386 / 10,453 / 10,617 by type
    assert n_by_type[1:].tolist() == [1090, 6386, 10453, 10617]
    tr, va = split_validation(d.train, 0.15, seed=0)
    assert {t.group for t in tr}.isdisjoint({t.group for t in va})
    assert len(tr) + len(va) == 432 and len({t.group for t in va}) == 4
    assert [t.name for t in split_validation(d.train, 0.15, seed=0)[1]] == [t.name for t in va]


def test_cpm15_loader_fixed_split_no_types():
    from scarcelab.data.nuclei import load_nuclei
    from scarcelab.data.nuclei.cpm15 import TEST_TILES

    d = load_nuclei("nuclei_cpm15", _need("nuclei_cpm15"))
    assert [t.name for t in d.test] == list(TEST_TILES) and len(d.train) == 10
    assert d.type_names is None and all(t.types is None for t in d.train)
    for t in d.test:
        assert t.image.shape[2] == 3 and t.image.shape[:2] == t.inst.shape  # RGBA -> RGB
        assert 68 <= t.inst.max() <= 351


def test_missing_shared_data_names_the_fix(tmp_path):
    from scarcelab.data.nuclei import load_nuclei

    with pytest.raises(DataError, match="pass data_dir"):
        load_nuclei("consep_patches", tmp_path)


def _write_consep_release(root: Path, with_inst_type: bool = True) -> dict[str, np.ndarray]:
    from PIL import Image
    from scipy.io import savemat

    rng = np.random.default_rng(0)
    made = {}
    for split, names in (("Train", ["train_1", "train_2"]), ("Test", ["test_1"])):
        (root / split / "Images").mkdir(parents=True)
        (root / split / "Labels").mkdir(parents=True)
        for name in names:
            inst = np.zeros((40, 48), np.int32)
            types7 = [1, 4, 6]  # other, malignant epithelium, muscle
            tmap = np.zeros_like(inst)
            for i, (r, c) in enumerate(((2, 2), (15, 20), (28, 30)), start=1):
                inst[r:r + 8, c:c + 9] = i
                tmap[r:r + 8, c:c + 9] = types7[i - 1]
            rgba = rng.integers(0, 255, (40, 48, 4), dtype=np.uint8)
            Image.fromarray(rgba, "RGBA").save(root / split / "Images" / f"{name}.png")
            mat = {"inst_map": inst.astype(np.float64), "type_map": tmap.astype(np.float64)}
            if with_inst_type:
                mat["inst_type"] = np.array(types7, np.float64).reshape(-1, 1)
            savemat(root / split / "Labels" / f"{name}.mat", mat)
            made[f"{split.lower()}/{name}"] = rgba
    return made


@pytest.mark.parametrize("with_inst_type", [True, False])
def test_consep_mat_release_loader_merges_seven_types_into_four(tmp_path, with_inst_type):
    from scarcelab.data.nuclei import load_nuclei
    from scarcelab.data.nuclei.consep_mat import load_consep_release

    made = _write_consep_release(tmp_path, with_inst_type)
    d = load_nuclei("consep", tmp_path)
    assert [t.name for t in d.train] == ["train/train_1", "train/train_2"]
    assert [t.name for t in d.test] == ["test/test_1"]
    t = d.train[0]
    assert t.image.shape == (40, 48, 3)
    assert np.array_equal(t.image, made["train/train_1"][..., :3])
    assert t.inst.dtype == np.int32 and t.inst.max() == 3
    assert t.types == {1: 1, 2: 3, 3: 4}  # 1 other, 4 -> epithelial, 6 -> spindle
    assert d.type_names[3] == "epithelial"
    seven = load_consep_release(tmp_path, merge_types=False)
    assert seven.train[0].types == {1: 1, 2: 4, 3: 6} and len(seven.type_names) == 7


def test_consep_mat_loader_errors(tmp_path):
    from scipy.io import savemat

    from scarcelab.data.nuclei import load_nuclei
    from scarcelab.data.nuclei.consep_mat import read_consep_mat

    with pytest.raises(DataError, match="data_dir"):
        load_nuclei("consep")
    savemat(tmp_path / "x.mat", {"something": np.zeros((2, 2))})
    with pytest.raises(DataError, match="no 'inst_map'"):
        read_consep_mat(tmp_path / "x.mat")
    savemat(tmp_path / "y.mat", {"inst_map": np.ones((2, 2)), "inst_type": np.array([[9]])})
    with pytest.raises(DataError, match="outside CoNSeP"):
        read_consep_mat(tmp_path / "y.mat")
    with pytest.raises(DataError, match="no .png images"):
        load_nuclei("consep", tmp_path)


# -- targets and post-processing -------------------------------------------------------------
def test_hv_targets_hand_case():
    inst = np.zeros((5, 7), np.int32)
    inst[2, 1:6] = 1  # a horizontal bar: centre at column 3
    inst[0:3, 6] = 2  # a vertical bar: centre at row 1
    hv = hv_targets(inst)
    assert hv[0, 2, 1:6].tolist() == [-1.0, -0.5, 0.0, 0.5, 1.0]
    assert hv[1, 2, 1:6].tolist() == [0.0] * 5
    assert hv[1, 0:3, 6].tolist() == [-1.0, 0.0, 1.0] and hv[0, 0:3, 6].tolist() == [0.0] * 3
    assert not hv[:, inst == 0].any()
    assert type_map(inst, {1: 3, 2: 2})[2, 1] == 3 and type_map(inst, {1: 3, 2: 2})[0, 6] == 2


def test_watershed_separates_touching_nuclei_from_gt_maps():
    inst = np.zeros((30, 40), np.int32)
    inst[5:20, 5:18] = 1
    inst[5:20, 18:31] = 2  # touching along a vertical line, same size
    out = PostProcess()((inst > 0).astype(float), hv_targets(inst))
    assert evaluate([inst], [out])["pq"] == pytest.approx(1.0)
    # without the HV maps (all zero) the two are one segment: IoU 0.5 with each, no match
    assert evaluate([inst], [PostProcess()((inst > 0).astype(float),
                                           np.zeros((2, 30, 40))) ])["pq"] == 0.0


def test_watershed_recovers_real_consep_instances_from_gt_maps():
    from scarcelab.data.nuclei import load_nuclei

    d = load_nuclei("consep_patches", _need("consep_patches"))
    tiles = d.test[::28]  # 8 test patches
    preds = [PostProcess()((t.inst > 0).astype(float), hv_targets(t.inst)) for t in tiles]
    r = evaluate([t.inst for t in tiles], preds)
    # measured with HoVer-Net's post-processing: PQ 0.874, DQ 0.915, AJI 0.851, Dice 0.985
    # (502 true nuclei -> 441): small nuclei whose marker the 5x5 opening or the 10 px
    # minimum removes are dropped, as HoVer-Net drops marker-less blobs
    assert r["pq"] > 0.86 and r["dq"] > 0.9 and r["aji"] > 0.84 and r["dice"] > 0.98


def test_postprocess_defaults_are_hovernets():
    """post_proc.py::__proc_np_hv: NP >= 0.5, blobs and markers under 10 px dropped,
    Sobel aperture 21, marker threshold 0.4, 5 x 5 elliptical opening."""
    p = PostProcess()
    assert (p.fg_threshold, p.min_size, p.sobel_size, p.edge_threshold, p.open_size,
            p.min_marker) == (0.5, 10, 21, 0.4, 5, 10)
    # OpenCV's getStructuringElement(MORPH_ELLIPSE, (5, 5))
    assert ellipse(5).astype(int).tolist() == [[0, 0, 1, 0, 0], [1, 1, 1, 1, 1],
                                               [1, 1, 1, 1, 1], [1, 1, 1, 1, 1],
                                               [0, 0, 1, 0, 0]]


def test_sobel_matches_scipy_at_3_and_opencvs_kernel_at_21():
    from scipy import ndimage

    x = np.random.default_rng(0).normal(size=(30, 40))
    for axis in (0, 1):
        np.testing.assert_allclose(sobel(x, axis, 3), ndimage.sobel(x, axis, mode="mirror"),
                                   atol=1e-12)
    imp = np.zeros((41, 41))
    imp[20, 20] = 1.0
    k = sobel(imp, 1, 21)[10:31, 10:31][::-1, ::-1]  # correlation of an impulse: the kernel
    # OpenCV getDerivKernels(1, 0, 21): derivative -1, -18, -152, -798, ...; smoothing
    # the binomial C(20, i)
    from math import comb

    np.testing.assert_allclose(k[10, :5] / comb(20, 10), [-1, -18, -152, -798, -2907])
    np.testing.assert_allclose(k[:, 20] / k[10, 20], [comb(20, i) / comb(20, 10)
                                                      for i in range(21)])
    ramp = np.tile(np.arange(40.0), (30, 1))
    assert (sobel(ramp, 1, 21)[:, 12:-12] > 0).all()  # increasing along x -> positive


def test_postprocess_drops_a_blob_without_marker():
    """A 4 x 4 blob passes the 10 px blob minimum, but the 5 x 5 opening leaves it no
    marker: HoVer-Net's watershed never floods it (the old code kept it)."""
    inst = np.zeros((30, 30), np.int32)
    inst[3:7, 3:7] = 1
    inst[12:26, 12:26] = 2  # a big blob with a marker
    out = PostProcess()((inst > 0).astype(float), hv_targets(inst))
    assert out[3:7, 3:7].max() == 0
    assert len(np.unique(out[12:26, 12:26])) == 1 and out[19, 19] > 0
    # HV maps with no structure (constant) leave no marker anywhere: min-max
    # normalisation of a constant gives 0, so the energy is 1 on every blob
    assert not PostProcess()((inst > 0).astype(float), np.zeros((2, 30, 30))).any()


def test_instance_types_vote_counts_background_then_takes_the_second():
    """HoVer-Net post_proc.process: argmax over all channels, background included; a
    background majority falls back to the second most common; ties to the smaller id."""
    inst = np.zeros((4, 12), np.int32)
    inst[:, :3], inst[:, 3:6], inst[:, 6:9], inst[:, 9:] = 1, 2, 3, 4
    prob = np.zeros((3, 4, 12))  # background, type 1, type 2
    prob[0] = 0.5
    prob[1, :1, :3] = 0.9  # nucleus 1: 9 background, 3 type-1 pixels -> type 1
    prob[2, :, 3:6] = 0.9  # nucleus 2: all type 2
    prob[1, :2, 6:9] = 0.6  # nucleus 3: 6 type-1 and 6 type-2 pixels: tie -> type 1,
    prob[2, 2:, 6:9] = 0.99  # though type 2 has the larger summed probability
    # nucleus 4: background everywhere -> no type (0)
    assert instance_types(inst, prob) == {1: 1, 2: 2, 3: 1, 4: 0}


class _Pointwise(nn.Module):
    """A per-pixel function of the image: sliding-window stitching must reproduce it."""

    stride = 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.sum(1, keepdim=True)
        return torch.cat([torch.zeros_like(s), s, torch.tanh(s), -torch.tanh(s)], 1)


def test_sliding_window_stitching_is_exact_for_a_pointwise_model():
    img = np.random.default_rng(0).integers(0, 255, (70, 90, 3), dtype=np.uint8)
    out = predict_tile(_Pointwise(), img, window=32)
    s = torch.from_numpy(img).float().div(255).sum(-1)
    assert out.shape == (4, 70, 90)
    np.testing.assert_allclose(out[1], torch.sigmoid(s).numpy(), atol=1e-5)
    np.testing.assert_allclose(out[2], torch.tanh(s).numpy(), atol=1e-5)


# -- model and encoder loading ---------------------------------------------------------------
@pytest.mark.parametrize(("arch", "stride"), [("small_cnn", 4), ("resnet18", 8),
                                              ("wrn28_2", 4)])
def test_unet_output_layout(arch, stride):
    from scarcelab.models.unet import NucleusUNet, load_segment_backbone

    torch.manual_seed(0)
    m = NucleusUNet(load_segment_backbone("random", arch), n_types=4)
    assert m.stride == stride
    y = m(torch.rand(2, 3, 32, 32))
    assert y.shape == (2, 4 + 5, 32, 32) and y[:, 2:4].abs().max() <= 1
    assert NucleusUNet(load_segment_backbone("random", arch))(torch.rand(1, 3, 32, 32)
                                                            ).shape[1] == 4


def test_load_segment_backbone_from_state_dict_files(tmp_path):
    from scarcelab.models import create_model
    from scarcelab.models.unet import load_segment_backbone

    torch.manual_seed(1)
    src = create_model("small_cnn")
    torch.save(src.state_dict(), tmp_path / "bare.pt")
    # a method's checkpoint layout: backbone.* (+ a head) under "state_dict"
    method_sd = {**{f"backbone.{k}": v for k, v in src.state_dict().items()},
                 "head.weight": torch.zeros(2, 128)}
    torch.save({"state_dict": method_sd, "epoch": 3}, tmp_path / "method.pt")
    for f in ("bare.pt", "method.pt"):
        got = load_segment_backbone(str(tmp_path / f), "small_cnn")
        for (k, a), b in zip(src.state_dict().items(), got.state_dict().values(), strict=True):
            assert torch.equal(a, b), k
    with pytest.raises(ConfigError, match="does not fit arch"):
        load_segment_backbone(str(tmp_path / "bare.pt"), "resnet18")
    bad = {k: torch.zeros(1) if k == "features.0.weight" else v
           for k, v in src.state_dict().items()}  # right names, a wrong shape
    torch.save(bad, tmp_path / "bad_shape.pt")
    with pytest.raises(ConfigError, match="does not fit arch"):
        load_segment_backbone(str(tmp_path / "bad_shape.pt"), "small_cnn")
    with pytest.raises(ConfigError, match="not 'random' and not a file"):
        load_segment_backbone(str(tmp_path / "nope.pt"), "small_cnn")
    torch.save(src, tmp_path / "pickled.pt")  # a whole pickled module: refused, not unpickled
    with pytest.raises(ConfigError, match="weights_only=True"):
        load_segment_backbone(str(tmp_path / "pickled.pt"), "small_cnn")


# -- loss ------------------------------------------------------------------------------------
def test_gradient_kernel_is_hovernets_5x5_with_gain_12():
    from scarcelab.protocols.segment import gradient_kernel, hv_gradients

    k = gradient_kernel(5)
    for i in range(5):
        for j in range(5):
            x, y = j - 2, i - 2
            assert k[i, j].item() == pytest.approx(x / (x * x + y * y) if x or y else 0.0)
    # a ramp of slope 0.1 along x in h (and along y in v): 1.2 inside, 2 px from the border
    ramp = torch.arange(12).float().mul(0.1).expand(1, 1, 12, 12)
    g = hv_gradients(torch.cat([ramp, ramp.transpose(2, 3)], 1))
    assert torch.allclose(g[:, :, 2:-2, 2:-2], torch.tensor(1.2), atol=1e-5)
    # h differentiated along x only: a ramp along y in h has no gradient inside
    g = hv_gradients(torch.cat([ramp.transpose(2, 3), ramp], 1))
    assert torch.allclose(g[:, :, 2:-2, 2:-2], torch.tensor(0.0), atol=1e-6)


def test_hovernet_loss_both_hv_terms_on_a_hand_built_map():
    """Target h = 0.1 x, v = 0.1 y on a 12 x 12 tile, prediction 0, nucleus pixels = the
    interior 2 px from the border (where the zero padding does not reach).
    MSE = mean over both channels of (0.1 x)^2 = 0.01 * (0^2 + ... + 11^2) / 12 = 0.42167.
    MSGE = mean over interior pixels and channels of (12 * 0.1)^2 = 1.44. Weight 1 each
    (HoVer-Net opt.py): 1.86167. The old 3x3 unit-gain kernel with weight 2 gave
    0.42167 + 2 * 0.01 = 0.44167."""
    from scarcelab.protocols.segment import hovernet_loss

    n, h, w = 1, 12, 12
    ramp = torch.arange(w).float().mul(0.1).expand(n, 1, h, w)
    hv_t = torch.cat([ramp, ramp.transpose(2, 3)], 1)
    np_t = torch.zeros(n, h, w, dtype=torch.long)
    np_t[:, 2:-2, 2:-2] = 1
    out = torch.zeros(n, 4, h, w)
    out[:, 1] = torch.where(np_t.bool(), 50.0, -50.0)  # confident, correct NP
    terms = hovernet_loss(out, {"np": np_t, "hv": hv_t})
    assert terms["hv"].item() == pytest.approx(0.01 * 506 / 12 + 1.44, rel=1e-5)
    assert terms["np"].item() == pytest.approx(0.0, abs=1e-4)  # CE ~ 0, soft Dice ~ 0
    assert terms["loss"].item() == pytest.approx(terms["np"].item() + terms["hv"].item())
    # a constant target has no gradient: only the MSE remains
    terms = hovernet_loss(out, {"np": np_t, "hv": torch.full((n, 2, h, w), 0.5)})
    # zero padding makes the constant map's border pixels jump; the interior mask is 2 px
    # away from it, so the MSGE is exactly 0
    assert terms["hv"].item() == pytest.approx(0.25, abs=1e-6)


# -- training targets --------------------------------------------------------------------------
def test_crop_targets_use_the_whole_nucleus_and_drop_small_remnants():
    inst = np.zeros((12, 20), np.int32)
    inst[2:9, 2:11] = 1  # 7 x 9 nucleus, centre column 6
    inst[2:9, 14:20] = 2  # 7 x 6 nucleus, columns 14..19
    win, hv = crop_targets(inst, 0, 6, 10, min_area=30)  # columns 6..15
    assert np.array_equal(win, inst[0:10, 6:16])
    # nucleus 1: columns 6..10 visible (35 px >= 30): h from the whole nucleus, 0 .. 1
    np.testing.assert_allclose(hv[0, 5, 0:5], [0.0, 0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(hv[:, 2:9, 0:5], hv_targets(inst)[:, 2:9, 6:11])
    # nucleus 2: columns 14, 15 visible (14 px < 30): no HV target, still foreground
    assert not hv[:, :, 8:10].any() and (win[2:9, 8:10] == 2).all()
    # the old rule (targets of the crop itself) would have re-centred nucleus 1
    assert hv_targets(win)[0, 5, 0] == -1.0


def test_training_batches_carry_whole_nucleus_hv_targets():
    """One disk of radius 20 in a 64 x 64 tile, 16 px crops: with targets from the whole
    nucleus most crops see only part of [-1, 1]; with targets of the crop (the old code)
    every crop inside the disk spans all of it."""
    from scarcelab.data.nuclei import NucleiTile
    from scarcelab.protocols.segment import make_batch

    yy, xx = np.mgrid[:64, :64]
    inst = ((yy - 32) ** 2 + (xx - 32) ** 2 <= 400).astype(np.int32)
    tile = NucleiTile("t", np.full((64, 64, 3), 128, np.uint8), inst, {1: 1}, "g")
    b = make_batch([tile], 32, 16, np.random.default_rng(0), typed=False)
    full = hv_targets(inst)
    spans = [(float(hv[0][m].min()), float(hv[0][m].max())) for hv, m in
             zip(b["hv"].numpy(), b["np"].numpy().astype(bool), strict=True) if m.sum() >= 30]
    assert len(spans) > 10
    assert sum(lo > -0.9 or hi < 0.9 for lo, hi in spans) >= len(spans) // 2
    vals = set(np.round(full[0][inst > 0], 5).tolist()) | {0.0}
    assert set(np.round(b["hv"][:, 0].numpy().ravel(), 5).tolist()) <= vals | {
        -v for v in vals}  # every value is a whole-disk value (flips negate h or swap h/v)
    assert MIN_AREA == 30


# -- the entry point, end to end -------------------------------------------------------------
def test_segment_cli_tiny_run_into_sqlite_mlflow(tmp_path, monkeypatch):
    import mlflow

    from scarcelab.entrypoints.cli import main

    _need("consep_patches")
    _need("nuclei_cpm15")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.chdir(tmp_path)
    mlflow.set_tracking_uri(uri)
    r = CliRunner().invoke(main, [
        "segment", "--dataset", "consep_patches", "--data-dir", str(SHARED / "consep_patches"),
        "--experiment", "seg", "--max-epochs", "2", "--steps-per-epoch", "2",
        "--batch-size", "2", "--crop", "32", "--window", "64", "--scale", "0.25",
        "--max-train-tiles", "4", "--max-val-tiles", "2", "--max-test-tiles", "2",
        "--patience", "5", "--cross-test", "nuclei_cpm15", "--device", "cpu",
        "--arch", "small_cnn"])
    assert r.exit_code == 0, r.output
    assert "test PQ" in r.output and "mPQ" in r.output and "nuclei_cpm15 PQ" in r.output
    runs = mlflow.search_runs(experiment_names=["seg"])
    assert len(runs) == 1
    run = runs.iloc[0]
    assert run["status"] == "FINISHED" and run["tags.scarcelab.family"] == "segment"
    assert run["tags.scarcelab.encoder"] == "random"
    assert run["tags.scarcelab.phase"] == "done"  # the phases after the budget are over
    c = mlflow.MlflowClient()
    assert [m.step for m in c.get_metric_history(run.run_id, "seg/val_pq")] == [0, 1]
    for key in ("seg/pq", "seg/dq", "seg/sq", "seg/mpq", "seg/aji", "seg/dice",
                "seg/pq_pooled", "seg/aji_pooled", "seg/mpq_conic",
                "seg/cross/nuclei_cpm15/pq_pooled", "time/train_s"):
        assert f"metrics.{key}" in runs.columns, key
        assert 0 <= run[f"metrics.{key}"] or key.startswith("time/")
    # the test values are logged once, at the selected epoch
    hist = c.get_metric_history(run.run_id, "seg/pq")
    assert len(hist) == 1 and hist[0].step == int(run["metrics.seg/selected_epoch"])
    arts = {a.path for a in c.list_artifacts(run.run_id, "overlays")}
    assert len(arts) == 2 and all(a.endswith(".png") for a in arts)
    assert {a.path for a in c.list_artifacts(run.run_id, "checkpoints")} == {
        "checkpoints/best.pt"}
    ckpt = torch.load(mlflow.artifacts.download_artifacts(
        run_id=run.run_id, artifact_path="checkpoints/best.pt", dst_path=str(tmp_path)),
        weights_only=True)
    assert ckpt["n_types"] == 4 and ckpt["arch"] == "small_cnn"


def test_segment_cli_rejects_bad_options(tmp_path):
    from scarcelab.entrypoints.cli import main

    r = CliRunner().invoke(main, ["segment", "--aggregation", "median", "--encoder",
                                  str(tmp_path / "missing.pt")])
    assert r.exit_code != 0
    assert "encoder=" in r.output or "aggregation" in r.output


@pytest.mark.parametrize(("aggregation", "tune"), [("image", False), ("pooled", True)])
def test_protocol_early_stops_on_validation_pq_and_tests_the_selected_checkpoint(aggregation,
                                                                                 tune):
    """lr = 0: the network never changes, so validation PQ never improves after epoch 0 and
    patience 1 stops the run after epoch 1; the test values belong to epoch 0. The marker
    threshold is HoVer-Net's 0.4 unless ``tune_threshold`` picks one on validation."""
    from scarcelab.protocols.segment import EDGE_GRID, SegmentConfig, run_segment
    from scarcelab.tracker import InMemoryTracker

    _need("consep_patches")
    cfg = SegmentConfig(max_epochs=5, patience=1, lr=0.0, steps_per_epoch=1, batch_size=2,
                        crop=32, window=64, scale=0.25, max_train_tiles=3, max_val_tiles=2,
                        max_test_tiles=2, n_overlays=1, device="cpu", arch="small_cnn",
                        data_dir=str(SHARED / "consep_patches"), aggregation=aggregation,
                        tune_threshold=tune)
    tr = InMemoryTracker()
    res = run_segment(cfg, tr)
    assert (res.epochs, res.best_epoch) == (2, 0)
    assert tr.study.tags["scarcelab.aggregation"] == aggregation
    sel = "pq" if aggregation == "image" else "pq_pooled"
    assert tr.study.history("seg/val_pq_selected") == [(0, res.val[sel])]
    assert (res.edge_threshold in EDGE_GRID) if tune else res.edge_threshold == 0.4
    assert tr.study.history("seg/edge_threshold") == [(0, res.edge_threshold)]
    assert [s for s, _ in tr.study.history("seg/val_pq")] == [0, 1]
    assert tr.study.history("seg/pq") == [(0, res.test["pq"])]
    assert tr.study.status == "FINISHED" and tr.study.tags["scarcelab.family"] == "segment"
    assert list(tr.images) == ["overlays/consep_patches-" + tr.artifacts["split.json"]
                               ["test"][0].split("/")[1] + ".png"]
    img = next(iter(tr.images.values()))
    from scarcelab.protocols.segment import OVERLAY_LEGEND_PX

    assert img.dtype == np.uint8 and img.shape == (256 + OVERLAY_LEGEND_PX, 2 * 256 + 4, 3)
    legend = img[:OVERLAY_LEGEND_PX]  # the legend strip: green and magenta text on white
    assert ((legend[..., 1] > 100) & (legend[..., 0] < 50)).any()
    assert ((legend[..., 0] > 150) & (legend[..., 1] < 50)).any()
    assert set(tr.checkpoints[0]["state_dict"]) == set(tr.model.state_dict())


def test_protocol_rejects_bad_config_before_training():
    from scarcelab.protocols.segment import SegmentConfig, run_segment
    from scarcelab.tracker import InMemoryTracker

    with pytest.raises(ConfigError, match="aggregation"):
        run_segment(SegmentConfig(aggregation="median"), InMemoryTracker())
    with pytest.raises(ConfigError, match="multiple of"):
        run_segment(SegmentConfig(crop=30, arch="small_cnn", device="cpu",
                                  data_dir=str(_need("consep_patches"))), InMemoryTracker())


def test_protocol_is_deterministic_under_a_seed():
    """Same seed, same everything: identical weights (the random encoder's init included)."""
    from scarcelab.protocols.segment import SegmentConfig, run_segment
    from scarcelab.tracker import InMemoryTracker

    _need("consep_patches")
    cfg = SegmentConfig(max_epochs=1, lr=0.0, steps_per_epoch=1, batch_size=2, crop=32,
                        window=64, scale=0.25, max_train_tiles=3, max_val_tiles=1,
                        max_test_tiles=1, n_overlays=0, device="cpu", arch="small_cnn",
                        data_dir=str(SHARED / "consep_patches"))
    states = []
    for _ in range(2):
        tr = InMemoryTracker()
        torch.manual_seed(np.random.default_rng().integers(1 << 30))  # disturb global RNG
        run_segment(cfg, tr)
        states.append(tr.checkpoints[0]["state_dict"])
    for k, v in states[0].items():
        assert torch.equal(v, states[1][k]), k


def test_segment_resolves_mlflow_encoders_through_the_probe_resolver(monkeypatch):
    """``--encoder runs:/…`` goes through tracking.encoders.resolve_encoder (the same
    pickle-free resolver as ``probe``) and the runs stay tagged with the URI."""
    from click.testing import CliRunner

    import scarcelab.protocols.segment as seg
    import scarcelab.tracking.encoders as enc
    from scarcelab.entrypoints.cli import main
    from scarcelab.errors import ConfigError
    from scarcelab.models import create_model

    seen: dict = {}

    def fake_resolve(spec, arch, in_channels, seed=0, norm="auto"):  # type: ignore[no-untyped-def]
        seen["resolve"] = (spec, arch, in_channels, norm)
        return create_model(arch), {"source": spec}

    def fake_run(cfg, tracker, backbone_factory=None):  # type: ignore[no-untyped-def]
        seen["encoder"] = cfg.encoder
        seen["backbone"] = backbone_factory("small_cnn")
        raise ConfigError("stop here")

    monkeypatch.setattr(enc, "resolve_encoder", fake_resolve)
    monkeypatch.setattr(seg, "run_segment", fake_run)
    r = CliRunner().invoke(main, ["segment", "--encoder", "runs:/abc123/model", "--arch",
                                  "small_cnn", "--device", "cpu"])
    assert "stop here" in r.output
    assert seen["resolve"] == ("runs:/abc123/model", "small_cnn", 3, "auto")
    assert seen["encoder"] == "runs:/abc123/model" and seen["backbone"] is not None


# -- issue 25 item 10: dataset names before any work; a truncated tile names its file ---------

def _patches_folder(root: Path, n: int = 2) -> Path:
    """A consep_patches-shaped folder with ``n`` real 32x32 patches per split."""
    import json

    from PIL import Image

    meta: dict = {"type_names": {"0": "bg", "1": "other"}, "inst_type": {}}
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        (root / split / "images").mkdir(parents=True)
        (root / split / "inst_png").mkdir()
        for i in range(n):
            stem = f"img{i}_{i}"
            Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(
                root / split / "images" / f"{stem}.jpg", quality=90)
            inst = np.zeros((32, 32), np.uint8)
            inst[4:10, 4:10] = 1
            Image.fromarray(inst).save(root / split / "inst_png" / f"{stem}.png")
            meta["inst_type"][f"{split}/{stem}"] = [1]
    (root / "inst_types.json").write_text(json.dumps(meta))
    return root


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("victim", ["train/images/img1_1.jpg", "test/inst_png/img0_0.png"])
def test_a_truncated_tile_is_a_data_error_naming_the_file(tmp_path, victim):
    """Before: ``OSError: image file is truncated`` from inside PIL (a traceback)."""
    from scarcelab.data.nuclei import load_nuclei

    root = _patches_folder(tmp_path / "consep_patches")
    assert len(load_nuclei("consep_patches", root).train) == 2  # the intact fixture loads
    bad = tmp_path / "bad"
    root = _patches_folder(bad / "consep_patches")
    _truncate(root / victim)
    with pytest.raises(DataError) as e:
        load_nuclei("consep_patches", root)
    msg = str(e.value)
    assert str(root / victim) in msg and "truncated or corrupt" in msg and "\n" not in msg
    # not an image at all, and a file that vanished between listing and reading
    (root / victim).write_bytes(b"not an image")
    with pytest.raises(DataError, match="not a readable image"):
        load_nuclei("consep_patches", root)


def test_a_truncated_tile_through_the_cli_is_one_error_line(tmp_path, monkeypatch):
    from scarcelab.entrypoints.cli import main

    root = _patches_folder(tmp_path / "consep_patches")
    _truncate(root / "train" / "images" / "img0_0.jpg")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    r = CliRunner().invoke(main, ["segment", "--data-dir", str(root), "--device", "cpu",
                                  "--arch", "small_cnn"])
    err = [ln for ln in r.output.splitlines() if ln.startswith("Error")]
    assert r.exit_code == 1 and len(err) == 1, r.output
    assert "img0_0.jpg" in err[0] and "Traceback" not in r.output


def test_corrupt_cpm15_masks_and_consep_mat_name_the_file(tmp_path):
    from PIL import Image

    from scarcelab.data.nuclei import load_nuclei
    from scarcelab.data.nuclei.consep_mat import read_consep_mat

    root = tmp_path / "nuclei_cpm15"
    root.mkdir()
    np.savez_compressed(root / "instance_masks.npz", image01=np.zeros((8, 8), np.int32))
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(root / "image01.png")
    _truncate(root / "instance_masks.npz")
    with pytest.raises(DataError, match="instance_masks.npz: not a readable .npz"):
        load_nuclei("nuclei_cpm15", root)
    mat = tmp_path / "x.mat"
    from scipy.io import savemat

    savemat(mat, {"inst_map": np.ones((50, 50))}, do_compression=True)
    _truncate(mat)
    with pytest.raises(DataError, match="x.mat: not a readable MATLAB"):
        read_consep_mat(mat)


def test_cross_test_names_are_checked_before_any_work(tmp_path, monkeypatch):
    """Before: ``--cross-test nosuch`` trained and tested, then failed looking the name up,
    and the run ended FAILED with nothing to show for the training."""
    import scarcelab.protocols.segment as seg
    from scarcelab.entrypoints.cli import main
    from scarcelab.tracker import InMemoryTracker

    def no_training(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("trained before the dataset names were checked")

    monkeypatch.setattr(seg, "_train_and_test", no_training)
    db = tmp_path / "m.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    for cross, words in (("nosuch", "unknown segmentation dataset 'nosuch'"),
                         ("nuclei_cpm15,nosuch", "'nosuch'"),
                         ("nuclei_cpm15,nuclei_cpm15", "given twice")):
        r = CliRunner().invoke(main, ["segment", "--cross-test", cross, "--device", "cpu"])
        err = [ln for ln in r.output.splitlines() if ln.startswith("Error")]
        assert r.exit_code == 2 and len(err) == 1, r.output
        assert "'--cross-test'" in err[0] and words in err[0], err[0]
    r = CliRunner().invoke(main, ["segment", "--dataset", "nosuch", "--device", "cpu"])
    assert r.exit_code == 2 and "'--dataset'" in r.output, r.output
    assert not db.exists()

    # the protocol itself (the Python API): unknown names, and a cross-test set whose data
    # is broken, fail before the run is opened or anything is trained
    tr = InMemoryTracker()
    with pytest.raises(ConfigError, match="nosuch"):
        seg.run_segment(seg.SegmentConfig(cross_test=("nosuch",), device="cpu",
                                          arch="small_cnn"), tr)

    def broken(data_dir=None):  # type: ignore[no-untyped-def]
        raise DataError("/data/broken_cross/x.png: not a readable image")

    monkeypatch.setitem(seg.SEG_DATASETS._entries, "broken_cross", broken)
    root = _patches_folder(tmp_path / "consep_patches")
    with pytest.raises(DataError, match="broken_cross"):
        seg.run_segment(seg.SegmentConfig(data_dir=str(root), cross_test=("broken_cross",),
                                          device="cpu", arch="small_cnn"), tr)
    assert tr.study is None  # no run was opened


# -- maps, fields and dtypes (mutation sample, docs/mutation.md) -----------------------
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


def test_auto_arch_falls_back_to_the_resolved_arch_when_the_encoder_names_none():
    """``arch=auto`` with a pretrained encoder asks the factory for its own arch (None); when
    the encoder's info names none, the run is tagged with the arch ``auto`` resolves to."""
    from scarcelab.models import create_model

    asked: list = []

    def factory(arch):  # type: ignore[no-untyped-def]
        asked.append(arch)
        return create_model("small_cnn")

    cfg = seg.SegmentConfig(encoder="runs:/abc123/model", arch="auto", device="cpu")
    _, info = seg.resolve_backbone(cfg, factory)
    assert asked == [None]
    assert info["arch"] == cfg.resolved_arch() == "small_cnn"


@pytest.mark.parametrize(("aggregation", "selected"), [("image", 0.25), ("pooled", 0.75)])
def test_the_aggregation_picks_the_validation_pq_that_selects_the_checkpoint(monkeypatch,
                                                                            aggregation,
                                                                            selected):
    """``aggregation=image`` selects on the per-image mean PQ, ``pooled`` on the PQ of the
    pooled counts: with the two told apart, the selected value is the one asked for."""
    from scarcelab.tracker import InMemoryTracker

    monkeypatch.setattr(seg, "load_nuclei", _synthetic_nuclei)
    monkeypatch.setitem(seg.SEG_DATASETS._entries, "synthetic_nuclei", _synthetic_nuclei)
    validate = seg._Run.validate

    def told_apart(self, val, post):  # type: ignore[no-untyped-def]
        return {**validate(self, val, post), "pq": 0.25, "pq_pooled": 0.75}

    monkeypatch.setattr(seg._Run, "validate", told_apart)
    cfg = seg.SegmentConfig(dataset="synthetic_nuclei", max_epochs=1, steps_per_epoch=1,
                            batch_size=2, crop=32, window=32, scale=1.0, lr=0.0,
                            n_overlays=0, device="cpu", arch="small_cnn",
                            aggregation=aggregation)
    tr = InMemoryTracker()
    seg.run_segment(cfg, tr)
    assert tr.study.history("seg/val_pq_selected") == [(0, selected)]
