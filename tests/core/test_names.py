"""Names typed on the command line: answered before torch is imported, with the near misses
and the names that fit (issue 27 items 7 and 8)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from scarcelab.entrypoints.cli import main
from scarcelab.registry import StaticIndex, did_you_mean

ROOT = Path(__file__).resolve().parents[2]


def _registries() -> dict[str, object]:
    from scarcelab.active import STRATEGIES
    from scarcelab.data import DATASETS
    from scarcelab.data.nuclei import SEG_DATASETS
    from scarcelab.methods import METHODS
    from scarcelab.models import MODELS

    return {"method": METHODS, "strategy": STRATEGIES, "arch": MODELS, "dataset": DATASETS,
            "segmentation dataset": SEG_DATASETS}


@pytest.mark.parametrize("kind", ["method", "strategy", "arch", "dataset",
                                  "segmentation dataset"])
def test_static_index_holds_exactly_what_the_registry_imports(kind: str) -> None:
    idx = StaticIndex(kind)
    assert idx.complete
    # other tests register their own datasets (tests/core/protocols/test_transfer.py...): only
    # the entries of scarcelab's own files are the index's
    reg = _registries()[kind]
    own = [n for n in reg.names()
           if getattr(reg.get(n), "__module__", "scarcelab").startswith("scarcelab")]
    assert idx.names() == own


def test_method_family_from_its_folder_is_the_class_family() -> None:
    from scarcelab.methods import METHODS

    idx = StaticIndex("method")
    assert {n: idx.family(n) for n in idx.names()} == {n: c.family for n, c in METHODS.items()}


def test_did_you_mean_best_first_and_nothing_for_a_far_name() -> None:
    assert did_you_mean("fixmach", ["comatch", "fixmatch", "sup"]) == " did you mean fixmatch?"
    assert did_you_mean("zzzz", ["fixmatch", "sup"]) == ""
    assert did_you_mean("breastmnis", ["breastmnist", "chestmnist", "pcam"]).startswith(
        " did you mean breastmnist? (also close: chestmnist")


def _cli(*args: str) -> tuple[int, str, bool]:
    """Exit code, output, and whether torch got imported, in a fresh interpreter."""
    code = ("import sys; from click.testing import CliRunner; "
            "from scarcelab.entrypoints.cli import main; "
            f"r = CliRunner().invoke(main, {list(args)!r}); "
            "print(r.output); print('TORCH', 'torch' in sys.modules); sys.exit(r.exit_code)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    out = p.stdout
    return p.returncode, out, "TORCH True" in out


def test_semi_method_typo_answers_before_torch_with_the_semi_methods_only() -> None:
    rc, out, torch_loaded = _cli("semi", "--method", "fixmach")
    assert rc == 2
    assert "did you mean fixmatch?" in out
    assert "semi methods: comatch, ds3l, fixmatch" in out
    assert "simclr" not in out and "sup," not in out  # not every family's names
    assert not torch_loaded


def test_a_method_of_another_family_names_its_command_before_torch() -> None:
    rc, out, torch_loaded = _cli("semi", "--method", "sup")
    assert rc == 2
    assert "sup is a supervised method, not semi" in out
    assert "scarcelab supervised --method sup" in out
    assert not torch_loaded


@pytest.mark.parametrize("args, hint", [
    (["supervised", "--method", "sup", "--dataset", "breastmnis"], "did you mean breastmnist?"),
    (["supervised", "--method", "sup", "--arch", "resnet19"], "did you mean resnet18?"),
    (["al", "--strategy", "margn"], "did you mean margin?"),
    (["tune", "--method", "oel"], "did you mean ole?"),
    (["tune", "--method", "ole", "--dataset", "cifair1"], "did you mean cifair10?"),
    (["segment", "--dataset", "consep_patch"], "did you mean consep_patches?"),
    (["probe", "--method", "fixmatch"], "fixmatch is a semi method, not supervised"),
])
def test_every_command_checks_its_names_while_parsing(args: list[str], hint: str) -> None:
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2, r.output  # (tune's dataset: in check_tune, still exit 2)
    assert hint in r.output


def _commands() -> dict[str, click.Command]:
    return {n: main.get_command(click.Context(main), n) for n in main.list_commands(
        click.Context(main))}


def test_data_dir_is_typed_and_device_defaults_to_auto_everywhere() -> None:
    from scarcelab.entrypoints.options import Folder

    seen_dir, seen_dev = [], []
    for name, cmd in _commands().items():
        for p in cmd.params:
            if p.name == "data_dir":
                assert isinstance(p.type, Folder), name
                seen_dir.append(name)
            if p.name == "device":
                assert p.default == "auto", name
                seen_dev.append(name)
    assert {"semi", "al", "probe", "segment", "tune"} <= set(seen_dir)
    assert {"semi", "al", "probe", "segment", "tune"} <= set(seen_dev)


def test_a_missing_data_dir_is_refused_while_parsing(tmp_path: Path) -> None:
    for cmd in ("probe", "segment"):
        r = CliRunner().invoke(main, [cmd, "--data-dir", str(tmp_path / "nope")])
        assert r.exit_code == 2 and "folder does not exist" in r.output, (cmd, r.output)


def test_help_texts_print_no_doubled_percent() -> None:
    for name in _commands():
        out = CliRunner().invoke(main, [name, "--help"], terminal_width=200).output
        assert "%%" not in out, name


def test_list_datasets_shows_classes_sizes_and_what_is_on_disk(tmp_path: Path) -> None:
    (tmp_path / "breastmnist.npz").write_bytes(b"")  # only its presence is looked at
    r = CliRunner().invoke(main, ["list", "datasets", "--data-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    rows = {line.split()[0]: line.split() for line in r.output.splitlines()[1:] if line}
    assert rows["breastmnist"][1:4] == ["2", "546/78/156", "yes"]
    assert rows["pathmnist"][1:4] == ["9", "89996/10004/7180", "no"]
    assert rows["synthetic_tiny"][3] == "generated"
    assert rows["cub"][1] == "200" and rows["cub"][3] == "no"
