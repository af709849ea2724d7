"""Behaviours of scarcelab/active that the seeded mutation sample (docs/mutation.md) showed
no test checked. Expected values are hand-derived from the documented contracts."""

from __future__ import annotations

import numpy as np
import torch

from scarcelab.active.encoded import DiskEncodingCache, Encoded, EncoderConfig


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


def _tiny(n: int = 24) -> tuple[np.ndarray, np.ndarray]:
    from scarcelab.data import load_raw

    raw = load_raw("synthetic_tiny")
    return raw.train_x[:n], raw.train_y[:n]


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
    x, _ = _tiny(24)  # 24 images, batch 8 -> 3 steps per epoch, 2 epochs -> 6 steps
    cfg = EncoderConfig(method="simclr", arch="small_cnn", epochs=2, batch_size=8)
    _, stats = train_encoder(x, 3, cfg, torch.device("cpu"))
    assert seen == [6] and stats["encoder_steps"] == 6.0


def test_encoding_meta_times_the_embedding_pass_as_a_small_positive_duration():
    from scarcelab.active.encoded import encode_dataset

    x, y = _tiny(16)
    cfg = EncoderConfig(method="simclr", arch="small_cnn", epochs=1, batch_size=16)
    enc, _, _ = encode_dataset("t", x, y, x[:4], y[:4], 3, cfg, torch.device("cpu"), None)
    # a duration of two forward passes over 20 tiny images, not a clock reading
    assert 0.0 <= enc.meta["embed_s"] < 600.0
    assert 0.0 <= enc.meta["encoder_train_s"] < 600.0


def test_min_sq_dist_keeps_the_callers_precision():
    """float64 callers get float64 distances equal to brute force, not a float32 buffer."""
    from scarcelab.active.base import min_sq_dist_to

    g = torch.Generator().manual_seed(0)
    pts = torch.randn(50, 7, generator=g, dtype=torch.float64) * 1e3
    ctr = torch.randn(4, 7, generator=g, dtype=torch.float64) * 1e3
    got = min_sq_dist_to(pts, ctr, chunk=16)
    want = ((pts[:, None, :] - ctr[None, :, :]) ** 2).sum(-1).min(1).values
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-6)


def test_typicality_is_the_inverse_mean_distance_to_the_nearest_neighbours():
    """Points 0, 1, 2, 10 on a line, k = 1: nearest-neighbour distances 1, 1, 1, 8."""
    from scarcelab.active.strategies.typiclust import typicality

    emb = np.array([[0.0], [1.0], [2.0], [10.0]])
    np.testing.assert_allclose(typicality(emb, 1), [1.0, 1.0, 1.0, 1 / 8], rtol=1e-6)
    # k = 2: point 0 -> (1 + 2) / 2, point 1 -> (1 + 1) / 2, 2 -> (1 + 2) / 2, 10 -> (8 + 9) / 2
    np.testing.assert_allclose(typicality(emb, 2), [1 / 1.5, 1.0, 1 / 1.5, 1 / 8.5], rtol=1e-6)


def test_dsa_divides_by_distances_below_one():
    """DSA = dist_a / dist_b (Kim et al.); distances under 1 must not be clipped to 1: labeled
    class 0 at 0 and class 1 at 0.5, a candidate at 0.1 predicted 0 -> 0.1 / 0.5 = 0.2."""
    from scarcelab.active.strategies.dsa import dsa_scores

    s = dsa_scores(np.array([[0.1]]), np.array([0]), np.array([[0.0], [0.5]]), np.array([0, 1]))
    np.testing.assert_allclose(s, [0.2], rtol=1e-5)


def _toy_real(monkeypatch, name: str = "toy_real"):  # type: ignore[no-untyped-def]
    """A small non-synthetic dataset registered for the test only (loaded once per sweep,
    like every real set)."""
    from scarcelab.active import datasets as ds

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(-2, 1, (40, 2)), rng.normal(2, 1, (40, 2))])
    y = np.repeat([0, 1], 40)
    data = ds.ALData(name, x[::2].astype(np.float32), y[::2], x[1::2].astype(np.float32),
                     y[1::2], 2, "toy:source", "a note for the run",
                     {"scarcelab.encoding_key": "k0"})
    monkeypatch.setitem(ds.AL_DATASETS._entries, name, ds.ALDatasetSpec(
        lambda d, r, c: data, ds.dataset_config("honeypot").replace(budget=4, max_epochs=3)))
    return data


def test_real_dataset_sweep_records_its_params_digest_note_and_tags(monkeypatch):
    from scarcelab.active.loop import ALRunConfig, _digest, run_al
    from scarcelab.tracker import InMemoryTracker

    data = _toy_real(monkeypatch)
    tr = InMemoryTracker()
    run_al(ALRunConfig("random", "toy_real", query_size=2), tr)
    assert tr.study is not None and tr.study.params["query_size"] == 2
    assert tr.dataset.source == "toy:source" and tr.dataset.digest == _digest(data)
    assert len(tr.dataset.digest) == 16
    assert tr.artifacts["al_config.json"]["note"] == "a note for the run"
    assert tr.study.tags["scarcelab.encoding_key"] == "k0"


def test_registered_kinds_follow_the_registration():
    from scarcelab.active.datasets import AL_DATASETS

    splice = AL_DATASETS.get("splice")
    assert splice.synthetic is False and splice.kind == "tabular"
    assert AL_DATASETS.get("mnist_5k").kind == "image"
    assert AL_DATASETS.get("honeypot").synthetic is True
    assert AL_DATASETS.get("honeypot").kind == "synthetic"


def test_shared_data_fallback_notes_the_folder_that_lacked_the_file(tmp_path, monkeypatch):
    from scarcelab.active import datasets as ds
    from scarcelab.data import provenance

    empty, shared = tmp_path / "default", tmp_path / "shared"
    empty.mkdir()
    shared.mkdir()
    (shared / "toy.csv").write_text("a,b\n1,2\n")
    monkeypatch.setenv("SCARCELAB_DATA", str(empty))
    monkeypatch.setattr(ds, "SHARED_DATA", shared)
    provenance.reset()
    [p] = ds._locate(empty, "toy", ("toy.csv",))
    assert p == shared / "toy.csv"
    [rec] = [r for r in provenance.used() if r["path"] == str(p.resolve())]
    assert rec["note"] == f"fallback: not found in {empty}"


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


def test_mc_dropout_of_a_linear_classifier_acts_on_its_input():
    """With no hidden layer the only dropout is the input's, so MC strategies (BALD) still
    see model uncertainty; with hidden layers it is the layers' own."""
    from scarcelab.active.classifier import ALNet

    lin = ALNet(4, 3, hidden=(), dropout=0.5)
    assert len(lin.mc_dropouts()) == 1 and lin.mc_dropouts()[0] is lin.in_drop
    mlp = ALNet(4, 3, hidden=(5, 6), dropout=0.5)
    assert [id(d) for d in mlp.mc_dropouts()] == [id(d) for d in mlp.drops]
