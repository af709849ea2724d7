"""What a run is called and says about itself (issue 27 items 4 and 9): the CLI's name
under ``mlflow run``, distinct trial and retrain names, ``--run-name/--tags/--description``,
no ``null``/``''`` params, descriptions that name only what the run holds, overlays with a
legend, the importance plot's caveat, encodings in the cache folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from scarcelab.entrypoints.cli import main
from scarcelab.entrypoints.options import Tags
from scarcelab.tracking.mlflow_tracker import _generated_name
from scarcelab.tracking.run_views import RunViews

TINY = ["--dataset", "synthetic_tiny", "--arch", "small_cnn", "--device", "cpu",
        "--max-epochs", "1", "--patience", "1", "--batch-size", "16",
        "--max-steps-per-epoch", "2", "--max-trials", "2", "--budget-minutes", "5"]


@pytest.fixture
def store(store, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """conftest's store with this module's extras, as its own copy had: 1 s pip-requirement
    inference, no system-metrics monitor, and the record spool in tmp_path."""
    monkeypatch.setenv("MLFLOW_REQUIREMENTS_INFERENCE_TIMEOUT", "1")
    monkeypatch.setenv("SCARCELAB_SYSTEM_METRICS", "0")
    monkeypatch.setenv("SCARCELAB_SPOOL_DIR", str(tmp_path / "spool"))
    return store


def test_mlflows_random_names_are_told_from_chosen_ones() -> None:
    from mlflow.utils.name_utils import _generate_random_name

    assert all(_generated_name(_generate_random_name()) for _ in range(50))
    assert not _generated_name("sup-breastmnist-s0") and not _generated_name("my run")


def test_trials_and_retrains_never_share_a_name() -> None:
    rv = RunViews()
    rv._rv()["name"] = "tune-ole-cifair10-s0"
    assert rv.trial_run_name(3) == "tune-ole-cifair10-s0/t03"
    assert rv.trial_run_name(3, "retrain") == "tune-ole-cifair10-s0/r03"


def test_tags_option_refuses_keys_scarcelab_owns() -> None:
    assert Tags().parse("project=liver, owner=ana") == {"project": "liver", "owner": "ana"}
    for bad in ("scarcelab.role=x", "mlflow.runName=x", "novalue"):
        with pytest.raises(ValueError):
            Tags().parse(bad)


def _study(c: MlflowClient, exp: str) -> object:
    e = c.get_experiment_by_name(exp)
    return c.search_runs([e.experiment_id], "tags.`scarcelab.role` = 'study'")[0]


def test_under_mlflow_run_the_study_gets_the_cli_name_tags_and_description(store) -> None:
    c = MlflowClient()
    exp = c.create_experiment("proj")
    run = c.create_run(exp, run_name="agreeable-swan-628")  # what `mlflow run` creates
    args = ["--method", "sup", *TINY, "--tags", "project=liver", "--description",
            "Baseline for the liver study.", "--register-model", "auto"]
    # ... and the entry point's parameters it logs before starting the command
    from mlflow.entities import Param
    from mlflow.projects import _project_spec

    user = {a[2:].replace("-", "_"): b for a, b in zip(args[::2], args[1::2], strict=True)}
    ep = _project_spec.load_project(str(Path(__file__).resolve().parents[2])) \
        .get_entry_point("supervised")
    final, extra = ep.compute_parameters(user, storage_dir=None)
    c.log_batch(run.info.run_id, params=[Param(k, v) for k, v in {**final, **extra}.items()])
    env = {"MLFLOW_RUN_ID": run.info.run_id, "MLFLOW_EXPERIMENT_ID": exp}
    res = CliRunner().invoke(main, ["-q", "supervised", *args], env=env)
    assert res.exit_code == 0, res.output
    study = c.get_run(run.info.run_id)
    assert study.info.run_name == "sup-synthetic_tiny-s0"
    assert study.data.tags["project"] == "liver"
    note = study.data.tags["mlflow.note.content"]
    assert note.splitlines()[2] == "Baseline for the liver study."
    assert "Artifacts: model `runs:/" in note and "test_confusion_matrix.png" in note
    arts = {a.path.removeprefix("plots/") for a in c.list_artifacts(study.info.run_id, "plots")}
    listed = note.split("figures under `plots/` (")[1].split(")")[0].split(", ")
    assert set(listed) == arts  # the description names exactly what plots/ holds
    p = study.data.params  # no empty values, no resolved.<x>=null beside "default"
    assert not [k for k, v in p.items() if v in ("''", "")
                or (k.startswith("resolved.") and v == "null")], p
    assert p["data_dir"] == "default" and "resolved.data_dir" not in p
    trials = sorted(t.info.run_name for t in c.search_runs(
        [exp], "tags.`scarcelab.role` = 'trial'"))
    assert trials == ["sup-synthetic_tiny-s0/t00", "sup-synthetic_tiny-s0/t01"]
    (v,) = c.search_model_versions("name = 'scarcelab-supervised-sup-synthetic_tiny'")
    assert v.run_id == run.info.run_id


def test_a_name_given_to_mlflow_run_is_kept(store) -> None:
    c = MlflowClient()
    exp = c.create_experiment("kept")
    run = c.create_run(exp, run_name="my-liver-run")  # mlflow run --run-name my-liver-run
    res = CliRunner().invoke(main, ["-q", "supervised", "--method", "sup", *TINY,
                                    "--max-trials", "1"],
                             env={"MLFLOW_RUN_ID": run.info.run_id,
                                  "MLFLOW_EXPERIMENT_ID": exp})
    assert res.exit_code == 0, res.output
    assert c.get_run(run.info.run_id).info.run_name == "my-liver-run"


def test_sweep_cells_get_readable_names() -> None:
    from scarcelab.tracking.run_views import cell_run_name

    opts = (("method", "fixmatch"), ("dataset", "breastmnist"), ("seed", "0"),
            ("n_labeled", "40"))
    assert cell_run_name("semi", opts) == "semi fixmatch breastmnist seed=0 n_labeled=40"
    long = (("encoder", "runs:/0123456789abcdef0123456789abcdef/model"),)
    assert cell_run_name("probe", long) == "probe encoder=…model"
    assert len(cell_run_name("semi", tuple((f"k{i}", "v" * 9) for i in range(30)))) == 100


def test_run_name_option_names_the_study_and_its_trials(store) -> None:
    res = CliRunner().invoke(main, ["-q", "supervised", "--method", "sup", *TINY,
                                    "--max-trials", "1", "--experiment", "named",
                                    "--run-name", "liver-baseline"])
    assert res.exit_code == 0, res.output
    c = MlflowClient()
    assert _study(c, "named").info.run_name == "liver-baseline"
    e = c.get_experiment_by_name("named")
    (trial,) = c.search_runs([e.experiment_id], "tags.`scarcelab.role` = 'trial'")
    assert trial.info.run_name == "liver-baseline/t00"


def test_description_lists_only_what_was_logged() -> None:
    rv = RunViews()
    st = rv._rv()
    st.update(name="segment-x", tags={"scarcelab.role": "study"}, params={})
    st["final"] = {"seg/pq": 0.5, "seg/aji": 0.4}
    text = rv._rv_description(st, "FINISHED")
    assert "plots/" not in text and "runs:/" not in text  # nothing of it was logged
    assert "PQ 0.5000" in text
    st["artifacts"] = ["overlays/a.png", "overlays/b.png"]
    st["final"].update({"final/test_balanced_accuracy_mean": 0.71,
                        "final/test_balanced_accuracy_std": 0.02, "final/n_runs": 10})
    text = rv._rv_description(st, "FINISHED")
    assert "`overlays/` (2 files)" in text
    assert "Final retraining: test balanced accuracy 0.7100 ± 0.0200 (mean ± std over 10 " \
        "retrains)." in text


def test_importance_plot_says_how_many_trials_it_stands_on() -> None:
    import optuna

    from scarcelab.tracking.plots import FEW_TRIALS, search_figures

    def trials(n: int) -> list[optuna.trial.FrozenTrial]:
        study = optuna.create_study(direction="maximize",
                                    sampler=optuna.samplers.RandomSampler(seed=0))
        study.optimize(lambda t: t.suggest_float("lr", 1e-4, 1.0, log=True)
                       + t.suggest_float("wd", 0.0, 1.0), n_trials=n)
        return study.trials

    few = search_figures(trials(2))["param_importances"]
    assert any("from 2 completed trials: too few" in t.get_text() for t in few.axes[0].texts)
    many = search_figures(trials(FEW_TRIALS))["param_importances"]
    texts = [t.get_text() for t in many.axes[0].texts]
    assert any(f"from {FEW_TRIALS} completed trials" in t for t in texts)
    assert not any("too few" in t for t in texts)


def test_encodings_are_cached_outside_the_data_folder(tmp_path, monkeypatch) -> None:
    from scarcelab.data.download import cache_root

    monkeypatch.setenv("SCARCELAB_DATA", str(tmp_path / "data"))
    monkeypatch.delenv("SCARCELAB_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "scarcelab"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_root() == Path.home() / ".cache" / "scarcelab"
    monkeypatch.setenv("SCARCELAB_CACHE", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"
    # the commands use it, not the data root
    import inspect

    import scarcelab.active.datasets as ds
    import scarcelab.entrypoints.al as al
    import scarcelab.entrypoints.probe as probe

    for mod in (ds, al, probe):
        src = inspect.getsource(mod)
        assert 'cache_root() / "encoded"' in src and 'default_data_dir() / "encoded"' \
            not in src, mod.__name__


def test_overlay_has_a_legend_and_a_readable_name() -> None:
    from scarcelab.data.nuclei import NucleiTile
    from scarcelab.protocols.segment import OVERLAY_LEGEND_PX, overlay, overlay_name

    inst = np.zeros((40, 40), np.int32)
    inst[10:20, 10:20] = 1
    tile = NucleiTile("test/test_10_000", np.full((40, 40, 3), 128, np.uint8), inst, None,
                      "test_10")
    img = overlay(tile, inst)
    assert img.shape == (40 + OVERLAY_LEGEND_PX, 84, 3)
    legend = img[:OVERLAY_LEGEND_PX]
    assert (legend != 255).any()  # text drawn on the white strip
    assert overlay_name("consep_patches", "test/test_10_000") == \
        "overlays/consep_patches-test_10_000.png"


class _Views(RunViews):
    """RunViews with the two tracker members it uses: a temp folder and a record sink."""

    def __init__(self, tmp: Path) -> None:
        import tempfile

        self._tmp = tempfile.TemporaryDirectory(dir=tmp)
        self.ops: list[dict] = []

    def _submit(self, op: dict) -> None:
        self.ops.append(op)


def test_segment_and_tune_studies_get_the_figures_their_description_names(tmp_path) -> None:
    seg = _Views(tmp_path)
    st = seg._rv()
    st.update(name="segment-consep_patches-small_cnn-s0", tags={"scarcelab.role": "study"})
    for e, pq in enumerate((0.2, 0.35, 0.3)):
        seg._rv_metrics({"seg/val_pq": pq, "train/loss": 1.0 / (e + 1)}, e, "study")
    seg._rv_metrics({"seg/pq": 0.33, "seg/selected_epoch": 1}, 1, "study")
    seg._rv_figures(st)
    assert [o["path"].rsplit("/", 1)[-1] for o in seg.ops] == ["val_pq_by_epoch.png"]
    assert "figures under `plots/` (val_pq_by_epoch.png)" in seg._rv_description(st, "FINISHED")

    tune = _Views(tmp_path)
    st = tune._rv()
    st.update(name="tune-ole-cifair10-s0", tags={"scarcelab.role": "study"})
    scores = [0.70, 0.74, 0.72]
    for i, s in enumerate(scores):
        tune._rv_metrics({"final/test_balanced_accuracy": s}, i, "study")
    tune._rv_metrics({"final/test_balanced_accuracy_mean": float(np.mean(scores)),
                      "final/test_balanced_accuracy_std": float(np.std(scores, ddof=1)),
                      "final/n_runs": 3.0}, 0, "study")
    tune._rv_figures(st)
    text = tune._rv_description(st, "FINISHED")
    assert "figures under `plots/` (final_retrains.png)" in text
    assert "0.7200 ± 0.0200 (mean ± std over 3 retrains)" in text


def test_tags_and_description_do_not_split_leaderboard_rows() -> None:
    import pandas as pd

    from scarcelab.tracking.query.frame import study_settings

    studies = pd.DataFrame({"run_id": ["a", "b", "c"],
                            "params.method": ["sup", "sup", "sup"],
                            "params.budget_minutes": ["3", "3", "3"],
                            "params.tags": ["none", "project=liver", None],
                            "params.description": ["none", "Baseline.", None]})
    s = study_settings(studies)
    assert "tags" not in s.columns and "description" not in s.columns
    assert len(s.drop_duplicates()) == 1
