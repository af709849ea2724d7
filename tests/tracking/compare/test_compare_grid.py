"""``scarcelab compare``'s grid, its budget split and its command line, without running a
study: the grid file round trip and its refusals (one line, file:line), the split of a
total budget by hand, the slots of CPU / GPU / packed cells, the sweep spec it hands to
``scarcelab sweep``, ``--dry-run`` (every command shell-quoted, nothing written or logged)
and the refusals before any work."""

from __future__ import annotations

import math
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from scarcelab.entrypoints.cli import main
from scarcelab.tracking.compare import grid as G

BASE = ["compare", "--dataset", "synthetic_tiny", "--cell-minutes", "2"]


def _grid(**kw):  # type: ignore[no-untyped-def]
    args = {"dataset": "synthetic_tiny", "methods": None, "seeds": None, "options": {}}
    args.update(kw)
    return G.build_grid(**args)


# -- the budget --------------------------------------------------------------------------

def test_the_total_is_split_equally_over_waves_less_overheads() -> None:
    # 18 cells on 2 slots: 9 waves; (480 min - 1.5 min) / 9 - 0.25 min = 52.92 -> 52.9
    p = G.plan_budget(18, 2, 8.0, None, overhead_s=15, fixed_s=90)
    assert p.waves == 9 and p.cell_minutes == pytest.approx(52.9)
    assert p.estimate_s <= 8 * 3600 and p.estimate_s == pytest.approx(90 + 9 * (52.9 * 60 + 15))
    # 5 cells on 2 slots: a third wave of one cell takes as long as a full one
    p = G.plan_budget(5, 2, 1.0, None, overhead_s=0, fixed_s=0)
    assert p.waves == 3 and p.cell_minutes == pytest.approx(20.0)
    # rounded down to 0.1 min, so that re-runs give the same cells: 60 / 7 = 8.571...
    assert G.plan_budget(7, 1, 1.0, None, 0, 0).cell_minutes == pytest.approx(8.5)
    assert "floor_0.1((480 min - 1.50 min) / 9 - 0.25 min)" in \
        G.plan_budget(18, 2, 8.0, None, 15, 90).formula()


def test_a_budget_too_small_is_refused_with_the_total_that_would_do() -> None:
    with pytest.raises(G.GridError) as e:
        G.plan_budget(18, 1, 0.2, None, overhead_s=15, fixed_s=90)
    msg = str(e.value)
    assert "\n" not in msg and "below the minimum of 1 min" in msg
    need = float(msg.split("give at least --budget-hours ")[1].split(",")[0])
    assert need == pytest.approx(math.ceil((90 + 18 * (60 + 15)) / 36) / 100)
    assert G.plan_budget(18, 1, need, None, 15, 90).cell_minutes >= 1.0  # and it does
    with pytest.raises(G.GridError, match="one of the two"):
        G.plan_budget(4, 1, 1.0, 3.0)
    with pytest.raises(G.GridError, match="below the minimum"):
        G.plan_budget(4, 1, None, 0.5)
    assert G.plan_budget(4, 1, None, 0.5, min_minutes=0.2).cell_minutes == 0.5


def test_slots_of_cpu_gpu_and_packed_cells() -> None:
    cpu = G.resources(None, "", None, None, "auto", n_cpus=2, n_gpus=0)
    assert (cpu.slots, cpu.cpus_per_cell, cpu.gpus_per_cell) == (2, 1.0, 0.0)
    gpu = G.resources(None, "", None, None, "auto", n_cpus=16, n_gpus=1)
    assert (gpu.slots, gpu.cpus_per_cell, gpu.gpus_per_cell) == (1, 16.0, 1.0)
    packed = G.resources(None, "", None, None, 0.25, n_cpus=16, n_gpus=1)
    assert (packed.slots, packed.cpus_per_cell) == (4, 4.0)
    two = G.resources(None, "", None, None, "auto", n_cpus=16, n_gpus=2)
    assert (two.slots, two.cpus_per_cell) == (2, 8.0)
    assert G.resources(3, "", None, None, 0, n_cpus=2, n_gpus=0).slots == 3  # --jobs
    assert G.resources(None, "ray://h:1", 8, None, "auto").slots == 8
    given = G.resources(None, "", 4, None, "auto", n_cpus=16, n_gpus=0)
    assert (given.slots, given.cpus_per_cell, given.gpus_per_cell) == (4, 4.0, 0.0)
    with pytest.raises(G.GridError, match="--slots"):
        G.resources(None, "ray://h:1", None, None, "auto")
    with pytest.raises(G.GridError, match="no GPU"):
        G.resources(None, "", None, None, 1.0, n_cpus=2, n_gpus=0)
    assert G.check_gpus_per_cell("0.5") == 0.5 and G.check_gpus_per_cell("auto") == "auto"
    for bad in ("1.5", "-1", "x"):
        with pytest.raises(G.GridError, match="--gpus-per-cell"):
            G.check_gpus_per_cell(bad)


# -- the grid ----------------------------------------------------------------------------

def test_the_default_grid_and_its_sweep_spec() -> None:
    g = _grid(options={"arch": "small_cnn"})
    assert g.methods == G.DEFAULT_METHODS and g.seeds == G.DEFAULT_SEEDS
    assert g.families == {"sup": "supervised", "mixup": "supervised", "fixmatch": "semi",
                          "mixmatch": "semi", "simclr": "self", "byol": "self"}
    plan = G.plan_budget(g.n_cells, 2, 2.0, None)
    res = G.resources(None, "", None, None, "auto", n_cpus=2, n_gpus=0)
    spec = G.spec_of(g, plan, res, "compare-x", "exp-x", 1)
    assert len(spec.cells) == 18 and spec.experiment == "exp-x"
    labels = [(c.entry, dict(c.options)["method"], dict(c.options)["seed"]) for c in spec.cells]
    # seed-major: every method of seed 0 first, so a compare cut short has whole seeds
    assert labels[:6] == [(g.families[m], m, "0") for m in g.methods]
    assert {(m, s) for _, m, s in labels} == {(m, str(s)) for m in g.methods for s in g.seeds}
    for c in spec.cells:  # one budget, one set of options, for every study
        o = dict(c.options)
        assert o["budget_minutes"] == f"{plan.cell_minutes:g}" and o["arch"] == "small_cnn"
        assert o["diag_samples"] == "0" and o["dataset"] == "synthetic_tiny"
    again = G.spec_of(_grid(options={"arch": "small_cnn"}), plan, res, "compare-x", "exp-x", 1)
    assert [c.id for c in again.cells] == [c.id for c in spec.cells]  # stable: resumable


def test_a_grid_file_round_trips_and_paths_are_made_absolute(tmp_path: Path,
                                                             monkeypatch) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.chdir(tmp_path)
    g = _grid(methods=["sup", "fixmatch"], seeds=[3, 4],
              options={"data_dir": "data", "set": "none"}, budget_hours=2.0)
    assert g.options["data_dir"] == str(data.resolve())  # the cells run elsewhere
    f = tmp_path / "grid.yaml"
    f.write_text(G.grid_yaml(g))
    assert G.load_grid(f) == g
    text = f.read_text().replace("method_options: {}",
                                 "method_options: {fixmatch: {set: {threshold: 0.9}}}")
    f.write_text(text)
    assert G.load_grid(f).cell_options("fixmatch")["set"] == "threshold=0.9"
    assert G.check_dataset("synthetic_tiny", "x") == "synthetic_tiny"


@pytest.mark.parametrize("text, line, words", [
    ("dataset: synthetic_tiny\nmethods: [sup, fixmach]\n", 2, "did you mean fixmatch"),
    ("dataset: synthetic_tiny\nmethods: [sup, sup, fixmatch]\n", 2, "sup given twice"),
    ("dataset: synthetic_tiny\nmethods: [fixmatch, simclr]\n", 2, "no labeled-only method"),
    ("dataset: synthetic_tiny\nseeds: [0]\n", 2, "no interval and no test"),
    ("dataset: synthetic_tiny\nmethod: [sup]\n", 2, "unknown key 'method'"),
    ("dataset: synthetic_tiny\noptions:\n  arch: small_cnn\n  archh: x\n", 4,
     "'archh' is not an option of scarcelab"),
    ("dataset: synthetic_tiny\noptions: {seed: 3}\n", 2, "set by compare"),
    ("dataset: synthetic_tiny\noptions: {quiet: true}\n", 2, "is a flag"),
    ("dataset: synthetic_tiny\noptions: {n_labeled: abc}\n", 2, "n_labeled='abc'"),
    ("dataset: synthetic_tiny\nmethod_options:\n  comatch: {arch: small_cnn}\n", 3,
     "not one of the grid's methods"),
    ("dataset: synthetic_tiny\nbudget_hours: 2\ncell_minutes: 3\n", 3, "not both"),
    ("dataset: nosuchset\n", 1, "unknown dataset"),
])
def test_a_bad_grid_file_is_one_line_with_its_line(tmp_path: Path, text: str, line: int,
                                                   words: str) -> None:
    f = tmp_path / "g.yaml"
    f.write_text(text)
    with pytest.raises(G.GridError) as e:
        G.load_grid(f)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{f}:{line}:"), msg
    assert words in msg, msg


def test_sweep_names_are_safe_and_distinct_for_paths() -> None:
    a, b = G.sweep_name("folder:/data/x-ray's set"), G.sweep_name("folder:/data/x_ray_s_set")
    assert a != b and "'" not in a and a.startswith("compare-folder-data-x-ray-s-set-")
    assert G.sweep_name("breastmnist") == "compare-breastmnist"


# -- the command line --------------------------------------------------------------------

def test_dry_run_prints_quoted_commands_and_writes_and_logs_nothing(tmp_path: Path,
                                                                    monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'store.db'}")
    r = CliRunner().invoke(main, [*BASE, "--methods", "sup,fixmatch", "--seeds", "0,1",
                                  "--option", "description=two words; a 'quote'",
                                  "--jobs", "2", "--gpus-per-cell", "0", "--dry-run"])
    assert r.exit_code == 0, r.output
    out = r.output
    assert "2 methods x 2 seeds = 4 studies" in out and "each study 2 min" in out
    assert "estimate: 60 s + 2 wave(s) x (2 min + 15 s)" in out
    cmds = [ln.split("  ", 1)[1] for ln in out.splitlines() if "  scarcelab " in ln]
    assert len(cmds) == 4
    argv = shlex.split(cmds[0])  # a shell reads back exactly the cell's arguments
    assert argv[:3] == ["scarcelab", "supervised", "--method"]
    assert argv[argv.index("--description") + 1] == "two words; a 'quote'"
    assert not (tmp_path / "store.db").exists() and not (tmp_path / "compare-synthetic_tiny"
                                                        ).exists()
    assert list(tmp_path.iterdir()) == []


def test_write_grid_then_grid_gives_the_same_plan(tmp_path: Path) -> None:
    f = tmp_path / "g.yaml"
    r = CliRunner().invoke(main, [*BASE, "--methods", "sup,simclr", "--seeds", "1,2",
                                  "--option", "arch=small_cnn", "--write-grid", str(f)])
    assert r.exit_code == 0 and f.is_file(), r.output
    a = CliRunner().invoke(main, [*BASE, "--methods", "sup,simclr", "--seeds", "1,2",
                                  "--option", "arch=small_cnn", "--dry-run", "--slots", "2"])
    b = CliRunner().invoke(main, ["compare", "--grid", str(f), "--dry-run", "--slots", "2"])
    assert a.exit_code == b.exit_code == 0, b.output
    assert a.output == b.output


@pytest.mark.parametrize("args, words", [
    (["--methods", "sup,fixmach"], "did you mean fixmatch"),
    (["--seeds", "0"], "no interval and no test"),
    (["--option", "bogus=1"], "'bogus' is not an option"),
    (["--option", "budget_minutes=3"], "set by compare"),
    (["--address", "ray://h:1"], "give --slots"),
    (["--gpus-per-cell", "1.5"], "at most 1"),
])
def test_refusals_before_any_work_are_one_line(tmp_path: Path, monkeypatch, args,  # type: ignore[no-untyped-def]
                                               words) -> None:
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, [*BASE, *args])
    assert r.exit_code == 1, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and words in lines[0], r.output
    assert list(tmp_path.iterdir()) == []  # nothing written, no store


def test_budget_and_grid_conflicts_are_refused(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["compare", "--dataset", "synthetic_tiny", "--budget-hours",
                                  "0.1", "--dry-run"])
    assert r.exit_code == 1 and "below the minimum" in r.output and "--budget-hours" in r.output
    f = tmp_path / "g.yaml"
    f.write_text("dataset: synthetic_tiny\nmethods: [sup, fixmatch]\n")
    r = CliRunner().invoke(main, ["compare", "--grid", str(f), "--dataset", "breastmnist",
                                  "--cell-minutes", "2", "--dry-run"])
    assert r.exit_code == 1 and "edit the file instead of giving --dataset" in r.output
    r = CliRunner().invoke(main, ["compare", "--cell-minutes", "2"])
    assert r.exit_code == 2 and "--dataset" in r.output
