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
