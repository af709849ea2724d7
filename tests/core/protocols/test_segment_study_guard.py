"""A behaviour guard of ``run_segment``'s set-up, which the training guard sees only as key
names: the values of the study's tags, params and artifacts, and the stride check that
refuses a crop before any record is opened. Recorded on ``run_segment`` before it was split
into named steps; the params and artifacts are compared by a digest of their sorted repr."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from test_segment_guard import Recorder, _cfg, synthetic  # noqa: F401 - a fixture

from scarcelab.accel import NAMES as ACCEL_NAMES
from scarcelab.errors import ConfigError
from scarcelab.protocols import segment as seg


def _digest(d: dict[str, Any]) -> str:
    return hashlib.sha256(repr(sorted(d.items())).encode()).hexdigest()[:16]


def test_the_study_record_is_unchanged(synthetic) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    tr = Recorder()
    seg.run_segment(_cfg(max_epochs=5, patience=1, label_fraction=0.5,
                         cross_test=("synthetic_nuclei",)), tr)
    tags = {k: v for k, v in tr.study.tags.items() if k != "scarcelab.phase"}
    assert tr.study.name == "segment-synthetic_nuclei-small_cnn-s0"
    assert _digest(tags) == TAGS_DIGEST, sorted(tags.items())
    # the precision and kernel settings (issue 40, recorded since): the former fp32 NCHW
    # path, checked apart so that the recorded digests stay those of the recording
    former = {"precision": "fp32", "channels_last": "off", "cudnn_benchmark": "off",
              "fused_optimizer": "off", "tf32": "off", "compile": "off"}
    assert {k: tr.study.params[k] for k in ACCEL_NAMES} == former
    params = {k: v for k, v in tr.study.params.items() if k not in ACCEL_NAMES}
    assert _digest(params) == PARAMS_DIGEST, sorted(params.items())
    assert tr.study.params["cross_test"] == "synthetic_nuclei"
    assert sorted(tr.artifacts) == ["config.json", "split.json"]
    assert _digest(tr.artifacts["split.json"]) == SPLIT_DIGEST
    config = dict(tr.artifacts["config.json"])
    assert config.pop("accel") == former
    assert _digest(config) == CONFIG_DIGEST
    assert (tr.dataset.name, tr.dataset.source) == ("synthetic_nuclei", "synthetic")


TAGS_DIGEST = "2f089564dc0cebeb"
PARAMS_DIGEST = "a8121b9d4ccdae25"
SPLIT_DIGEST = "08e14de146d7efbf"
CONFIG_DIGEST = "dee912e9d85583f7"


@pytest.mark.parametrize(("kw", "match"), [
    ({"crop": 30}, r"^crop=30 must be a multiple of the small_cnn encoder's stride 4$"),
    ({"window": 34}, r"^window=34 must be a multiple of the small_cnn encoder's stride 4$"),
])
def test_a_crop_off_the_stride_fails_before_any_record(  # type: ignore[no-untyped-def]
        synthetic, kw, match) -> None:  # noqa: F811
    tr = Recorder()
    with pytest.raises(ConfigError, match=match):
        seg.run_segment(_cfg(**kw), tr)
    assert tr.calls == []
