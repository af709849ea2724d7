"""Every option of the study commands reaches what it controls (issue 44, item 2).

An option declared on the command line but not passed on into ``StudyConfig`` passed
every other test and was silently dropped (seen while classifying the options for the
leaderboard): the command accepted ``--x 5`` and trained as without it. Here each option
of ``semi`` (the study options are shared by supervised, semi and self) is given a value
other than its default, and the ``StudyConfig`` the command builds must differ from the
one it builds without it. An option that controls something other than the study's
configuration (the run's name, the MLflow experiment, the model registry…) is listed in
:data:`ELSEWHERE` with where it goes; a new option in neither table fails, naming it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

#: option -> a value other than its default (given on the command line)
CHANGED: dict[str, str] = {
    "method": "mixmatch",
    "dataset": "pneumoniamnist",
    "data_dir": ".",
    "arch": "small_cnn",
    "seed": "3",
    "budget_minutes": "2",
    "budget_clock": "cpu",
    "class_weights": "none",
    "max_epochs": "7",
    "patience": "3",
    "n_labeled": "40",
    "n_val": "30",
    "allow_large_val": "true",
    "search": "fixed",
    "transfer_epochs": "5",
    "positive_class": "1",
    "val_from": "train",
    "batch_size": "16",
    "unlabeled_batch_size": "32",
    "max_steps_per_epoch": "4",
    "max_trials": "2",
    "device": "cpu",
    "study_name": "shared-one",
    "overrides": "lambda_u=2",
    "diag_samples": "0",
    "probe_solver": "torch",
    "eval_every_steps": "8",
    "schedule_horizon": "epochs",
    "precision": "fp32",
    "channels_last": "on",
    "cudnn_benchmark": "on",
    "fused_optimizer": "on",
    "tf32": "on",
    "compile": "default",
}

#: the options of a user's own images (their dataset is folder:PATH)
OWN: dict[str, str] = {
    "image_size": "32",
    "channels": "rgb",
    "fit": "pad",
    "skip_bad_files": "true",
    "test_fraction": "0.3",
    "folds": "2",
}

#: options that control something other than the StudyConfig, and where they go
ELSEWHERE: dict[str, str] = {
    "run_name": "the study run's name (entrypoints/options.py apply_identity)",
    "tags": "the study run's extra tags (apply_identity)",
    "description": "the study run's description (apply_identity)",
    "quiet": "the console's verbosity",
    "verbose": "the console's verbosity",
    "experiment": "the MLflow experiment of the tracker (entrypoints/study.py _tracker)",
    "register_model": "the model registry name of the tracker (register_model_as)",
    "hparams_from": "resolved from the tracking store into hparams "
                    "(tests/tracking/test_hparams_from.py); here only 'defaults' needs no store",
}


def _own(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (root / "labeled" / c).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(rng.integers(0, 255, (12, 12), dtype=np.uint8)).save(
                root / "labeled" / c / f"{i}.png")
    (root / "unlabeled").mkdir()
    Image.fromarray(rng.integers(0, 255, (12, 12), dtype=np.uint8)).save(
        root / "unlabeled" / "u.png")
    return root


def _config(args: list[str]) -> dict[str, Any]:
    from scarcelab.entrypoints.cli import main
    from scarcelab.entrypoints.study import study_config

    cmd = main.commands["semi"]  # type: ignore[attr-defined]
    kw = dict(cmd.make_context("semi", list(args)).params)
    for k in ELSEWHERE:
        kw.pop(k, None)
    return dataclasses.asdict(study_config("semi", kw))


def test_every_study_option_is_classified() -> None:
    from scarcelab.entrypoints.cli import main

    names = {p.name for p in main.commands["semi"].params}  # type: ignore[attr-defined]
    unclassified = names - set(CHANGED) - set(OWN) - set(ELSEWHERE)
    assert not unclassified, (
        f"options {sorted(unclassified)} are in no table of this test: give each a changed "
        "value in CHANGED (or OWN), or say in ELSEWHERE where it goes")
    assert not (set(CHANGED) | set(OWN) | set(ELSEWHERE)) - names, "stale entries"


#: what an option needs beside it to take effect (the base and the changed run share it)
CONTEXT: dict[str, list[str]] = {
    "search": ["--hparams-from", "defaults"],  # fixed: the literature's configuration
    "transfer_epochs": ["--search", "none"],  # read by transfer runs only
    "positive_class": ["--dataset", "pneumoniamnist"],
}


@pytest.mark.parametrize("name", sorted(CHANGED))
def test_a_changed_option_changes_the_study_config(name: str) -> None:
    flag = "--set" if name == "overrides" else "--" + name.replace("_", "-")
    base_args = ["--method", "fixmatch", *CONTEXT.get(name, [])]
    if name == "method":
        base_args = CONTEXT.get(name, [])
        base = _config(["--method", "fixmatch"])
    else:
        base = _config(base_args)
    got = _config([*base_args, flag, CHANGED[name]])
    assert any(got[k] != base[k] for k in got), (
        f"{flag} {CHANGED[name]} left the StudyConfig as it was")


@pytest.mark.parametrize("name", sorted(OWN))
def test_an_own_image_option_changes_the_data_options(name: str, tmp_path: Path) -> None:
    ds = f"folder:{_own(tmp_path / 'imgs')}"
    base = _config(["--method", "fixmatch", "--dataset", ds])
    flag = "--" + name.replace("_", "-")
    got = _config(["--method", "fixmatch", "--dataset", ds, flag, OWN[name]])
    assert got["data_options"] != base["data_options"], (
        f"{flag} {OWN[name]} left data_options as they were")


def test_a_new_option_named_after_a_field_reaches_it_with_no_hand_over_line(monkeypatch):
    """Adding a study option is its declaration and the core's field (docs/extending.md,
    "Adding a training-wide setting"): ``study_config`` hands over every declared option
    whose name is a ``StudyConfig`` field. Here ``sweep_point`` (a field no command
    declares) stands for a new option: once declared, its parsed value reaches the config
    without a line naming it; before it is declared, a key of that name is ignored (a
    command's own options never leak into the study's)."""
    from scarcelab.entrypoints import study
    from scarcelab.entrypoints.cli import main

    kw = dict(main.commands["semi"].make_context("semi", ["--method", "fixmatch"]).params)
    for k in ELSEWHERE:
        kw.pop(k, None)
    assert study.study_config("semi", {**kw, "sweep_point": "p"}).sweep_point == ""
    declared = study.study_options_names()
    monkeypatch.setattr(study, "study_options_names", lambda: declared | {"sweep_point"})
    assert study.study_config("semi", {**kw, "sweep_point": "p"}).sweep_point == "p"


def test_every_study_option_has_a_field_or_a_named_conversion() -> None:
    from dataclasses import fields

    from scarcelab.entrypoints import study
    from scarcelab.entrypoints.options import DATASET_ENTRY, FOLDS_ENTRY
    from scarcelab.protocols.search import StudyConfig

    placed = ({f.name for f in fields(StudyConfig)} | set(study.CONVERTED)
              | set(study.NOT_CONFIG) | set(DATASET_ENTRY) | set(FOLDS_ENTRY))
    assert not study.study_options_names() - placed, (
        "declare a StudyConfig field of the option's name, or convert it in study_config")
    assert set(study.NOT_CONFIG) <= set(ELSEWHERE)
