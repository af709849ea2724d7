"""Issue 27 item 10: Ray, scikit-image and h5py are extras; a missing one is one line that
names the extra (simulated here by making the import fail: ``sys.modules[name] = None``)."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from scarcelab.extras import EXTRAS, MissingExtra, need

REPO = Path(__file__).resolve().parents[2]
META = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _missing(monkeypatch, *names: str) -> None:  # type: ignore[no-untyped-def]
    for n in names:  # None in sys.modules: `import n` raises ImportError
        monkeypatch.setitem(sys.modules, n, None)


def _dist(req: str) -> str:
    return re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].lower()


def test_heavy_packages_are_extras_and_all_brings_every_extra() -> None:
    core = {_dist(r) for r in META["dependencies"]}
    extras = META["optional-dependencies"]
    for module, (dist, extra) in EXTRAS.items():
        assert dist not in core, f"{dist} is still a hard dependency"
        assert dist in {_dist(r) for r in extras[extra]}, (module, extra)
    assert "pyarrow" not in core  # it comes with MLflow; scarcelab never imports it
    (everything,) = extras["all"]
    assert set(everything[everything.index("[") + 1:-1].split(",")) == \
        set(extras) - {"all", "dev"}


def test_need_names_the_extra_and_is_also_an_import_error(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _missing(monkeypatch, "ray")
    with pytest.raises(ImportError) as e:  # code that caught a failed import still does
        need("ray", "scarcelab sweep (cells as Ray tasks)")
    assert isinstance(e.value, MissingExtra)
    msg = str(e.value)
    assert "scarcelab sweep (cells as Ray tasks) needs ray" in msg
    assert "pip install 'scarcelab[sweep]'" in msg and "\n" not in msg


def test_sweep_without_ray_is_one_line_naming_the_extra(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from scarcelab.entrypoints.cli import main

    _missing(monkeypatch, "ray")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/m.db")
    r = CliRunner().invoke(main, ["sweep", str(REPO / "suites" / "cdalbench.yaml"), "--smoke"])
    assert r.exit_code == 1, r.output
    assert "needs ray" in r.output and "scarcelab[sweep]" in r.output
    assert "Traceback" not in r.output
    assert not (tmp_path / "m.db").exists()  # stopped before any run was opened


def test_segment_without_scikit_image_fails_before_reading_data(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from scarcelab.protocols.segment import SegmentConfig, run_segment
    from scarcelab.tracker import InMemoryTracker

    _missing(monkeypatch, "skimage", "skimage.segmentation")
    tr = InMemoryTracker()
    with pytest.raises(MissingExtra, match=r"segment .*needs scikit-image.*scarcelab\[pathology\]"):
        run_segment(SegmentConfig(device="cpu", arch="small_cnn", data_dir="/nonexistent"), tr)
    assert tr.study is None  # nothing was started


def test_pcam_without_h5py_names_the_pathology_extra(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from scarcelab.data.sources import pcam

    _missing(monkeypatch, "h5py")
    with pytest.raises(MissingExtra, match=r"pcam dataset.*needs h5py.*scarcelab\[pathology\]"):
        pcam._read(tmp_path / "x.h5", "x", None)


def test_core_commands_work_without_any_extra(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A study, `list`, the query layer: none of them imports an extra."""
    from scarcelab.entrypoints.cli import main

    _missing(monkeypatch, *EXTRAS, "skimage.segmentation")
    for argv in (["list", "methods"], ["list", "datasets"]):
        r = CliRunner().invoke(main, argv)
        assert r.exit_code == 0, r.output
    from scarcelab.protocols.search import StudyConfig, run_study
    from scarcelab.tracker import InMemoryTracker

    cfg = StudyConfig(method="sup", dataset="synthetic_tiny", arch="small_cnn", device="cpu",
                      max_epochs=1, max_trials=1, budget_minutes=1, batch_size=16,
                      max_steps_per_epoch=1)
    t = InMemoryTracker()
    run_study(cfg, t)
    assert t.study.status == "FINISHED"
