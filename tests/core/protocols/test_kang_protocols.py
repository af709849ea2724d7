"""Kang et al. (2022)'s protocols (issue 23, items 7-10): segmentation with a frozen encoder,
label fractions for probing / fine-tuning / segmentation, torchvision / timm ResNet weight
files (an ImageNet-supervised encoder, made here with random weights: none can be
downloaded) loaded whole for ``probe`` and ``segment``, and a transfer view that never
averages runs of different architectures, protocols or label fractions."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch import nn

from scarcelab.data.bundle import RawDataset
from scarcelab.data.splits import make_split
from scarcelab.errors import ConfigError, DataError
from scarcelab.models.encoder import build_encoder
from scarcelab.tracker import InMemoryTracker

REPO = Path(__file__).resolve().parents[3]
SHARED = Path(os.environ.get("SCARCELAB_SHARED_DATA", REPO.parent / "shared" / "data"))


def _need(folder: str) -> Path:
    if not (SHARED / folder).exists():
        pytest.skip(f"{SHARED / folder} absent (../shared/data exists on project machines)")
    return SHARED / folder


def _raw(counts: tuple[int, ...] = (300, 120, 80)) -> RawDataset:
    y = np.concatenate([np.full(c, i) for i, c in enumerate(counts)])
    x = np.zeros((len(y), 1, 2, 2), dtype=np.uint8)
    return RawDataset(name="toy", train_x=x, train_y=y, test_x=x[::50], test_y=y[::50],
                      num_classes=len(counts), class_names=[str(i) for i in range(len(counts))])


# -- item 8: label fractions in the split ------------------------------------------------------
def test_label_fraction_keeps_validation_and_draws_a_stratified_subset():
    raw = _raw()
    full = make_split(raw, "all", 100, seed=4, allow_large_val=True)
    tenth = make_split(raw, "all", 100, seed=4, allow_large_val=True, label_fraction=0.1)
    third = make_split(raw, "all", 100, seed=4, allow_large_val=True, label_fraction=0.3)
    # the same images select the model at every fraction
    assert tenth["val"] == third["val"] == full["val"]
    assert full["n_labeled"] == 400 and tenth["n_labeled"] == 40 and third["n_labeled"] == 120
    y = raw.train_y
    # natural class frequencies of the labeled pool (240/96/64 of 400): 24/10/6 and 72/29/19
    assert np.bincount(y[tenth["labeled"]]).tolist() == [24, 10, 6]
    assert np.bincount(y[third["labeled"]]).tolist() == [72, 29, 19]
    # prefixes of one seeded order: 10 % within 30 % within 100 %
    assert set(tenth["labeled"]) <= set(third["labeled"]) <= set(full["labeled"])
    # the dropped labels join the unlabeled pool; nothing is lost or doubled
    assert sorted(tenth["labeled"] + tenth["unlabeled"] + tenth["val"]) == list(range(500))
    assert len({full["hash"], tenth["hash"], third["hash"]}) == 3
    assert tenth["label_fraction"] == 0.1 and tenth["n_labeled_pool"] == 400
    # fraction 1 is the split of before: same JSON, same hash
    assert make_split(raw, "all", 100, seed=4, allow_large_val=True, label_fraction=1.0) == full
    assert "label_fraction" not in full


def test_label_fraction_bad_values_are_named():
    raw = _raw()
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ConfigError, match="label_fraction must be in"):
            make_split(raw, "all", 100, label_fraction=bad)
    with pytest.raises(ConfigError, match="fewer than the 3 classes"):
        make_split(raw, "all", 100, allow_large_val=True, label_fraction=0.004)


# -- item 9: torchvision / timm ResNet files ---------------------------------------------------
def _tv_resnet18(seed: int = 0) -> nn.Module:
    """An 'ImageNet-style' torchvision ResNet-18 (random weights, non-trivial BN stats)."""
    from torchvision.models import resnet18

    torch.manual_seed(seed)
    net = resnet18(weights=None)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.1)
    return net.eval()


def test_imagenet_resnet_file_loads_whole_with_arch_auto(tmp_path):
    """arch=auto: a 7x7-stem torchvision ResNet-18 goes into resnet18_imagenet and *every*
    tensor loads (the old resolver needed arch=resnet18 and left the stem at random)."""
    tv = _tv_resnet18()
    torch.save(tv.state_dict(), tmp_path / "resnet18-imagenet.pth")
    got, info = build_encoder(str(tmp_path / "resnet18-imagenet.pth"), None, 3, norm="none")
    assert info["arch"] == "resnet18_imagenet" and info["format"] == "torchvision"
    assert info["skipped"] == ["net.fc.bias", "net.fc.weight"]  # the 1000-way head only
    own = got.state_dict()
    for k, v in tv.state_dict().items():
        if not k.startswith("fc."):
            assert torch.equal(own[f"net.{k}"], v), k
    # the same network: features equal torchvision's pooled features (no norm folding)
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        want = torch.flatten(nn.Sequential(*list(tv.children())[:-1])(x), 1)
        np.testing.assert_allclose(got(x).numpy(), want.numpy(), rtol=1e-4, atol=1e-5)


def test_imagenet_normalisation_is_folded_into_the_stem(tmp_path):
    """scarcelab feeds (x - 0.5) / 0.5; the folded stem computes what the weights computed on
    ImageNet-normalised input, exactly away from the stem's zero padding (3 px)."""
    from scarcelab.models.encoder import IMAGENET_MEAN, IMAGENET_STD

    tv = _tv_resnet18(1)
    torch.save(tv.state_dict(), tmp_path / "r18.pth")
    got, info = build_encoder(str(tmp_path / "r18.pth"), None, 3)  # norm=auto: ImageNet's
    assert info["input_norm"] == "imagenet"
    x = torch.rand(2, 3, 40, 40)
    mean = torch.tensor(IMAGENET_MEAN)[None, :, None, None]
    std = torch.tensor(IMAGENET_STD)[None, :, None, None]
    with torch.no_grad():
        want = tv.bn1(tv.conv1((x - mean) / std))
        n = got.net
        have = n.bn1(n.conv1((x - 0.5) / 0.5))
    np.testing.assert_allclose(have[..., 2:-2, 2:-2].numpy(), want[..., 2:-2, 2:-2].numpy(),
                               rtol=1e-4, atol=1e-4)
    assert not torch.allclose(have[..., :1, :], want[..., :1, :], atol=1e-3)  # the padding
    # a custom normalisation (e.g. Lunit's released trunks) is parsed and folded alike
    lunit = "0.70322989,0.53606487,0.66096631/0.21716536,0.26081574,0.20723464"
    _, info2 = build_encoder(str(tmp_path / "r18.pth"), None, 3, norm=lunit)
    assert info2["input_norm"] == lunit and info2["fingerprint"] != info["fingerprint"]


def test_norm_spec_errors_before_any_file_is_read(tmp_path):
    from scarcelab.models.encoder import parse_norm

    for bad in ("imagenet2", "1,2/3", "0.5,0.5,0.5/0,1,1"):
        with pytest.raises(ConfigError, match="encoder_norm"):
            build_encoder(str(tmp_path / "absent.pt"), None, 3, norm=bad)
    assert parse_norm("none", "torchvision") is None
    assert parse_norm("auto", "backbone") is None  # scarcelab's own weights: no folding
    with pytest.raises(ConfigError, match="random encoder has none"):
        build_encoder("random", "small_cnn", 3, norm="imagenet")


@pytest.mark.parametrize("layout", ["moco", "timm_checkpoint", "dino", "lunit_trunk"])
def test_foreign_resnet_layouts(tmp_path, layout):
    """The wrappers ResNet weights come in: MoCo's module.encoder_q.* (+ an MLP head),
    timm's train checkpoint (state_dict + its own arch name), DINO's teacher
    module.backbone.*, and Lunit's released trunks (torchvision names, no fc)."""
    tv = _tv_resnet18(2)
    sd = tv.state_dict()
    obj = {"moco": {"state_dict": {**{f"module.encoder_q.{k}": v for k, v in sd.items()},
                                   "module.encoder_q.fc.2.weight": torch.zeros(128, 512)},
                    "epoch": 200, "arch": "resnet18"},
           "timm_checkpoint": {"state_dict": sd, "arch": "resnet18", "epoch": 3},
           "dino": {"teacher": {f"module.backbone.{k}": v for k, v in sd.items()}},
           "lunit_trunk": {k: v for k, v in sd.items() if not k.startswith("fc.")}}[layout]
    torch.save(obj, tmp_path / "w.pth")
    got, info = build_encoder(str(tmp_path / "w.pth"), None, 3, norm="none")
    assert info["arch"] == "resnet18_imagenet", info
    own = got.state_dict()
    for k, v in sd.items():
        if not k.startswith("fc."):
            assert torch.equal(own[f"net.{k}"], v), k


def test_resnet_arch_of_reads_depth_block_and_stem():
    from torchvision.models import resnet34, resnet50

    from scarcelab.models.encoder import resnet_arch_of

    with torch.device("meta"):
        r50 = resnet50().state_dict()
        r34 = resnet34().state_dict()
        small = {k: v for k, v in _tv_resnet18().state_dict().items()}
    assert resnet_arch_of(r50, "f") == "resnet50_imagenet"
    small["conv1.weight"] = torch.zeros(64, 3, 3, 3)
    assert resnet_arch_of(small, "f") == "resnet18"
    with pytest.raises(ConfigError, match=r"blocks \(3, 4, 6, 3\) \(basic\)"):
        resnet_arch_of(r34, "f")


def test_explicit_small_stem_arch_still_loads_all_but_the_stem(tmp_path):
    tv = _tv_resnet18(3)
    torch.save(tv.state_dict(), tmp_path / "r18.pth")
    got, info = build_encoder(str(tmp_path / "r18.pth"), "resnet18", 3)
    assert info["skipped"] == ["net.conv1.weight", "net.fc.bias", "net.fc.weight"]
    assert info["stem"] == "initialised" and info["input_norm"] == "none"
    with pytest.raises(DataError, match="do not fit arch 'wrn28_2'"):
        build_encoder(str(tmp_path / "r18.pth"), "wrn28_2", 3)


# -- items 7-9: segmentation -------------------------------------------------------------------
def _seg_cfg(**kw):  # type: ignore[no-untyped-def]
    from scarcelab.protocols.segment import SegmentConfig

    base = dict(max_epochs=1, steps_per_epoch=2, batch_size=2, crop=32, window=64,
                scale=0.25, max_val_tiles=1, max_test_tiles=1, n_overlays=0, device="cpu",
                arch="small_cnn", lr=1e-2, data_dir=str(_need("consep_patches")))
    return SegmentConfig(**{**base, **kw})


def test_frozen_segmentation_trains_the_decoder_only():
    """protocol=frozen: after training, every encoder tensor (BatchNorm statistics included)
    is the initial one and the decoder moved; protocol=finetune moves the encoder too."""
    from scarcelab.models.unet import NucleusUNet
    from scarcelab.protocols.segment import run_segment

    # the initial network, built as run_segment builds it for seed 0
    backbone = build_encoder("random", "small_cnn", 3, 0)[0]
    torch.manual_seed(0)
    ref = NucleusUNet(backbone, n_types=4)
    init = {k: v.clone() for k, v in ref.state_dict().items()}
    for protocol in ("frozen", "finetune"):
        tr = InMemoryTracker()
        run_segment(_seg_cfg(protocol=protocol, max_train_tiles=3), tr)
        state = tr.checkpoints[0]["state_dict"]
        assert state.keys() == init.keys()
        enc_keys = [k for k in state if k.startswith("encoder.")]
        dec_keys = [k for k in state if k.startswith(("fuse.", "head."))
                    and state[k].is_floating_point()]
        assert enc_keys and dec_keys
        moved_enc = [k for k in enc_keys if not torch.equal(state[k], init[k])]
        assert any(not torch.equal(state[k], init[k]) for k in dec_keys), protocol
        tags, params = tr.study.tags, tr.study.params
        assert tags["scarcelab.protocol"] == protocol and tags["scarcelab.task"] == "segment"
        assert params["protocol"] == protocol
        if protocol == "frozen":
            assert moved_enc == []
            n_dec = sum(v.numel() for k, v in ref.named_parameters()
                        if not k.startswith("encoder."))
            assert params["n_trainable_params"] == n_dec
        else:
            assert moved_enc  # weights and BatchNorm statistics
            assert params["n_trainable_params"] == sum(p.numel() for p in ref.parameters())


def test_segment_label_fraction_trains_on_a_subset_and_keeps_validation():
    from scarcelab.protocols.segment import label_subset, run_segment

    tiles = list(range(40))
    a, b = label_subset(tiles, 0.1, 3), label_subset(tiles, 0.5, 3)  # type: ignore[arg-type]
    assert len(a) == 4 and len(b) == 20 and set(a) <= set(b) and a == sorted(a)
    assert label_subset(tiles, 1.0, 3) is tiles and len(label_subset(tiles, 0.001, 3)) == 1
    splits = {}
    for f in (1.0, 0.1):
        tr = InMemoryTracker()
        run_segment(_seg_cfg(label_fraction=f, lr=0.0, steps_per_epoch=1), tr)
        splits[f] = tr.artifacts["split.json"]
        assert tr.study.tags["scarcelab.label_fraction"] == f"{f:g}"
        assert tr.study.params["label_fraction"] == f
        pool = tr.study.params["n_train_tiles_pool"]
        assert tr.study.params["n_train_tiles"] == (pool if f == 1 else round(0.1 * pool))
    assert splits[0.1]["val"] == splits[1.0]["val"]  # selected on the same tiles
    assert set(splits[0.1]["train"]) < set(splits[1.0]["train"])


def test_segment_bad_protocol_and_fraction_fail_before_any_work():
    from scarcelab.protocols.segment import SegmentConfig, run_segment

    for kw, msg in (({"protocol": "linear"}, "protocol='linear'"),
                    ({"label_fraction": 0.0}, "label_fraction must be in"),
                    ({"encoder_norm": "imagenet1k"}, "encoder_norm")):
        with pytest.raises(ConfigError, match=msg):
            run_segment(SegmentConfig(data_dir="/nonexistent", **kw), InMemoryTracker())


def test_segment_takes_an_imagenet_resnet_file_whole(tmp_path):
    """The segment entry point used to refuse a torchvision ImageNet state dict; now it loads
    all of it (arch=auto -> resnet18_imagenet) and, frozen, keeps it."""
    from scarcelab.protocols.segment import run_segment

    torch.save(_tv_resnet18(4).state_dict(), tmp_path / "resnet18-imagenet.pth")
    enc, _ = build_encoder(str(tmp_path / "resnet18-imagenet.pth"), None, 3)
    tr = InMemoryTracker()
    run_segment(_seg_cfg(encoder=str(tmp_path / "resnet18-imagenet.pth"), arch="auto",
                         protocol="frozen", crop=64, max_train_tiles=2, steps_per_epoch=1), tr)
    tags = tr.study.tags
    assert tags["scarcelab.arch"] == "resnet18_imagenet"
    assert tags["scarcelab.encoder_format"] == "torchvision"
    assert tags["scarcelab.encoder_norm"] == "imagenet"
    assert tags["scarcelab.encoder_skipped"] == "net.fc.bias,net.fc.weight"
    assert tr.checkpoints[0]["arch"] == "resnet18_imagenet"
    state = tr.checkpoints[0]["state_dict"]
    from scarcelab.models.unet import encoder_stages

    stages = encoder_stages(enc)
    for i, s in enumerate(stages):
        for k, v in s.state_dict().items():
            assert torch.equal(state[f"encoder.{i}.{k}"], v), (i, k)


# -- item 8: the probe's label fraction --------------------------------------------------------
def test_probe_label_fraction_linear_and_finetune_share_the_split():
    from test_transfer import SEPARABLE, _separable

    from scarcelab.protocols.transfer import ProbeConfig, probe_split, run_finetune, run_linear

    enc, info = build_encoder("random", "small_cnn", 3, seed=0)
    cfg = ProbeConfig(dataset=SEPARABLE, encoder="random", device="cpu", probe_trials=3,
                      label_fraction=0.25)
    tr = InMemoryTracker()
    res = run_linear(cfg, enc, info, tr)
    split = tr.artifacts["split.json"]
    full = probe_split(ProbeConfig(dataset=SEPARABLE), _separable())
    assert split["val"] == full["val"] and split["n_labeled"] == round(0.25 * 120)
    assert tr.study.tags["scarcelab.label_fraction"] == "0.25"
    assert tr.study.params["label_fraction"] == 0.25 and res.split_hash == split["hash"]
    # fine-tuning's study draws the very same split (run_finetune checks the hash)
    fcfg = ProbeConfig(dataset=SEPARABLE, encoder="random", protocol="finetune",
                       device="cpu", budget_minutes=1, max_epochs=1, batch_size=8,
                       max_steps_per_epoch=1, max_trials=1, label_fraction=0.25)
    ftr = InMemoryTracker()
    fres = run_finetune(fcfg, enc, info, ftr)
    assert fres.split_hash == split["hash"]
    assert ftr.study.tags["scarcelab.label_fraction"] == "0.25"
    assert ftr.artifacts["split.json"]["labeled"] == split["labeled"]
    with pytest.raises(ConfigError, match="set the label budget one way"):
        ProbeConfig(dataset=SEPARABLE, n_labeled=30, label_fraction=0.5).validate()


def test_label_fraction_tag_of_an_explicit_budget():
    from scarcelab.protocols.transfer import label_fraction_tag

    raw = _raw()
    assert label_fraction_tag(make_split(raw, "all", 100, allow_large_val=True)) == "1"
    assert label_fraction_tag(make_split(raw, 40, 100, allow_large_val=True)) == "0.1"
    assert label_fraction_tag(make_split(raw, 30, 100, allow_large_val=True)) == "0.075"
    assert label_fraction_tag(make_split(raw, "all", 100, allow_large_val=True,
                                         label_fraction=0.3)) == "0.3"


# -- the entry points: options, one-line errors, MLproject parity ------------------------------
@pytest.mark.parametrize(("args", "option"), [
    (["segment", "--protocol", "linear"], "'--protocol'"),
    (["segment", "--label-fraction", "0"], "'--label-fraction'"),
    (["segment", "--label-fraction", "1.5"], "'--label-fraction'"),
    (["probe", "--label-fraction", "0"], "'--label-fraction'"),
    (["probe", "--label-fraction", "x"], "'--label-fraction'"),
])
def test_new_options_bad_values_are_one_line_errors(args, option):
    from scarcelab.entrypoints.cli import main

    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and f"Invalid value for {option}" in r.output, r.output
    assert len([ln for ln in r.output.splitlines() if ln.startswith("Error")]) == 1


def test_bad_encoder_norm_is_one_line_before_any_work(tmp_path):
    from scarcelab.entrypoints.cli import main

    empty = tmp_path / "empty"  # an existing folder without data: nothing could be read
    empty.mkdir()
    for cmd in ("segment", "probe"):
        r = CliRunner().invoke(main, [cmd, "--encoder-norm", "imagenet1k", "--data-dir",
                                      str(empty), "--device", "cpu"])
        assert r.exit_code == 1 and "encoder_norm='imagenet1k'" in r.output, r.output


def test_segment_cli_logs_protocol_and_fraction_into_mlflow(tmp_path, monkeypatch):
    import mlflow

    from scarcelab.entrypoints.cli import main

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.setenv("MLFLOW_REQUIREMENTS_INFERENCE_TIMEOUT", "1")
    monkeypatch.chdir(tmp_path)
    mlflow.set_tracking_uri(uri)
    r = CliRunner().invoke(main, [
        "segment", "--data-dir", str(_need("consep_patches")), "--experiment", "seg",
        "--max-epochs", "1", "--steps-per-epoch", "1", "--batch-size", "2", "--crop", "32",
        "--window", "64", "--scale", "0.25", "--max-val-tiles", "1", "--max-test-tiles", "1",
        "--device", "cpu", "--arch", "small_cnn", "--protocol", "frozen",
        "--label-fraction", "0.05"])
    assert r.exit_code == 0, r.output
    assert "frozen, label fraction 0.05" in r.output
    run = mlflow.search_runs(experiment_names=["seg"]).iloc[0]
    assert run["tags.scarcelab.protocol"] == "frozen"
    assert run["tags.scarcelab.label_fraction"] == "0.05"
    assert run["params.protocol"] == "frozen" and run["params.label_fraction"] == "0.05"
    assert int(run["params.n_train_tiles"]) == round(0.05 * int(
        run["params.n_train_tiles_pool"]))
