"""Hostile and careless sweep specs (issue 25 items 1-5): refused before anything runs, in
one line that names the file, the line and the fix, within a second.

Each case was a probe that got through before: ``env: {PYTHONPATH: dir}`` ran that folder's
``sitecustomize.py`` in every cell; a YAML alias bomb of 388 bytes hung the driver (> 60 s,
0.6 GB, still growing); 300 bytes of axes asked for 10^8 cells (a ``MemoryError`` after a
minute); a key written twice was silently the last one; a non-UTF-8 file was a
``UnicodeDecodeError`` traceback; a sweep name with a quote crashed MLflow's search filter.
"""

from __future__ import annotations

import time

import pytest
from click.testing import CliRunner

from scarcelab.entrypoints.cli import main
from scarcelab.tracking.sweep import spec as spec_module
from scarcelab.tracking.sweep.spec import SpecError, SweepSpec, load_spec, parse_spec

BASE = "name: x\n{top}grids:\n  - entry: supervised\n    method: sup\n"


def _err(text: str, path: str = "g.yaml", **kw: object) -> str:
    t0 = time.process_time()  # CPU seconds: a loaded machine does not make it fail
    with pytest.raises(SpecError) as e:
        parse_spec(text, path, **kw)  # type: ignore[arg-type]
    took = time.process_time() - t0
    msg = str(e.value)
    assert "\n" not in msg and took < 1.0, (took, msg)  # one line, within a second
    return msg


# -- item 1: env: variables that load code ---------------------------------------------------

@pytest.mark.parametrize("name", ["PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PYTHONUSERBASE",
                                  "PYTHONWARNINGS", "PYTHONBREAKPOINT", "LD_PRELOAD",
                                  "LD_LIBRARY_PATH", "LD_AUDIT", "DYLD_INSERT_LIBRARIES", "PATH",
                                  "HOME", "GIT_CONFIG_GLOBAL", "BASH_ENV", "GCONV_PATH",
                                  "NODE_OPTIONS", "OPENSSL_CONF", "MPLBACKEND"])
def test_env_that_loads_code_is_refused_at_its_line(name):
    msg = _err(BASE.format(top=f"env:\n  OMP_NUM_THREADS: '1'\n  {name}: /tmp/x\n"))
    assert msg.startswith("g.yaml:4: env: ") and name in msg and "can load code" in msg


@pytest.mark.parametrize("name", ["MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI"])
def test_env_the_driver_sets_is_refused(name):
    assert "set by the sweep driver" in _err(BASE.format(top=f"env: {{{name}: x}}\n"))


def test_harmless_env_still_passes():
    sp = parse_spec(BASE.format(top="env: {OMP_NUM_THREADS: 1, PYTHONHASHSEED: 0, "
                                    "PYTHONUNBUFFERED: 1, SCARCELAB_DATA: /d}\n"))
    assert sp.env == {"OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1",
                      "SCARCELAB_DATA": "/d"}


@pytest.mark.parametrize("env,words", [("{'A B': x}", "not a variable name"),
                                      ("{OMP_NUM_THREADS: [1, 2]}", "must be a string")])
def test_env_names_and_values_are_checked(env, words):
    assert words in _err(BASE.format(top=f"env: {env}\n"))


def test_a_spec_built_in_code_is_held_to_the_same_env_list(tmp_path, monkeypatch):
    from scarcelab.tracking.sweep.driver import Driver

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    sp = parse_spec(BASE.format(top=""), "g.yaml")
    bad = SweepSpec(sp.name, sp.experiment, sp.cells, env={"LD_PRELOAD": "/tmp/x.so"},
                    path="g.yaml")
    with pytest.raises(SpecError, match="LD_PRELOAD can load code"):
        Driver(bad, echo=lambda s: None)


# -- item 2: YAML alias bombs -----------------------------------------------------------------

def _bomb(levels: int, where: str) -> str:
    rows = ['  A: &a ["x","x","x","x","x","x","x","x","x","x"]']
    for i in range(1, levels):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        rows.append(f"  {cur.upper()}: &{cur} [" + ",".join([f"*{prev}"] * 10) + "]")
    body = "\n".join(rows) + "\n"
    if where == "env":
        return f"name: bomb\nenv:\n{body}grids:\n  - entry: supervised\n    method: sup\n"
    return ("name: bomb\ngrids:\n  - entry: semi\n    method: fixmatch\n    set:\n"
            + body.replace("\n  ", "\n      ").replace("  A:", "      A:", 1))


@pytest.mark.parametrize("where", ["env", "set"])
def test_an_alias_bomb_is_refused_within_a_second(where):
    text = _bomb(9, where)  # 10^9 values from ~450 bytes
    assert len(text) < 600
    msg = _err(text)
    assert "YAML aliases expand this spec to " in msg and "fewer aliases" in msg
    total = int(msg.split("expand this spec to ")[1].split()[0].replace(",", ""))
    assert total > 10**9
    # it points at the value that alone passes the limit: 11,111 = the fourth level (D)
    line = int(msg.split(":")[1])
    assert text.splitlines()[line - 1].strip().startswith("D: &d"), msg


def test_a_recursive_alias_is_refused():
    assert "refers to the value that holds it" in _err(
        "name: x\nenv: &e {A: *e}\ngrids:\n  - entry: supervised\n    method: sup\n")


def test_modest_aliases_keep_working():
    text = """\
name: shared
grids:
  - &common
    entry: supervised
    method: [sup, mixup]
    seed: &seeds [0, 1, 2]
    budget_minutes: 1
  - <<: *common
    method: supcon
    seed: *seeds
"""
    sp = parse_spec(text)
    assert len(sp.cells) == 9
    assert {dict(c.options)["method"] for c in sp.cells} == {"sup", "mixup", "supcon"}
    # the limit is on what aliases add, not on what is written
    MAX_ALIAS_EXPANSION = spec_module.MAX_ALIAS_EXPANSION  # noqa: N806
    many = "name: many\ngrids:\n  - entry: supervised\n    method: sup\n    seed: [" + \
        ",".join(str(i) for i in range(MAX_ALIAS_EXPANSION // 2)) + "]\n"
    assert len(parse_spec(many).cells) == MAX_ALIAS_EXPANSION // 2


# -- item 3: cells counted before they are expanded -------------------------------------------

AXES = ("method: [a0,a1,a2,a3,a4,a5,a6,a7,a8,a9]\n    dataset: [d0,d1,d2,d3,d4,d5,d6,d7,d8,d9]\n"
        "    seed: [0,1,2,3,4,5,6,7,8,9]\n    arch: [r0,r1,r2,r3,r4,r5,r6,r7,r8,r9]\n"
        "    max_epochs: [1,2,3,4,5,6,7,8,9,10]\n    patience: [1,2,3,4,5,6,7,8,9,10]\n"
        "    budget_minutes: [1,2,3,4,5,6,7,8,9,10]\n    n_val: [1,2,3,4,5,6,7,8,9,10]\n")


def test_a_grid_of_10_8_cells_is_refused_before_it_is_built():
    text = "name: big\ngrids:\n  - entry: supervised\n    " + AXES
    assert len(text) < 400
    msg = _err(text)
    assert msg.startswith("g.yaml:3: this grid has 100,000,000 cells (10 method x 10 dataset")
    assert "--max-cells" in msg


def test_the_cap_counts_every_grid_and_a_flag_raises_it(tmp_path):
    text = ("name: two\ngrids:\n  - {entry: supervised, method: sup, seed: [0, 1, 2, 3, 4, 5]}\n"
            "  - {entry: supervised, method: mixup, seed: [0, 1, 2, 3, 4, 5]}\n")
    assert "12 with the grids before it" in _err(text, max_cells=10)
    msg = _err(text, max_cells=10)
    assert msg.startswith("g.yaml:4: this grid has 6 cells")
    assert len(parse_spec(text, max_cells=12).cells) == 12
    p = tmp_path / "two.yaml"
    p.write_text(text)
    r = CliRunner().invoke(main, ["sweep", str(p), "--dry-run", "--max-cells", "10"])
    assert r.exit_code == 1 and "two.yaml:4: this grid has 6 cells" in r.output
    r = CliRunner().invoke(main, ["sweep", str(p), "--dry-run", "--max-cells", "12"])
    assert r.exit_code == 0 and "12 cells" in r.output


# -- item 4: duplicate keys, not UTF-8 --------------------------------------------------------

@pytest.mark.parametrize("text,line,words", [
    (BASE.format(top="") + "    method: mixup\n", 5, "key 'method' appears twice in this "
     "mapping (first at line 4); keep one"),
    ("name: x\nname: y\ngrids:\n  - {entry: supervised, method: sup}\n", 2, "key 'name'"),
    (BASE.format(top="env: {A: '1', A: '2'}\n"), 2, "key 'A' appears twice"),
    (BASE.format(top="") + "    budget_minutes: 1\n    budget-minutes: 2\n", 6,
     "'budget-minutes' and 'budget_minutes' are the same option --budget-minutes"),
])
def test_a_key_written_twice_is_refused_at_its_second_line(text, line, words):
    msg = _err(text)
    assert msg.startswith(f"g.yaml:{line}: ") and words in msg, msg


def test_a_spec_that_is_not_utf8_is_an_error_with_its_line(tmp_path):
    p = tmp_path / "latin1.yaml"
    p.write_bytes(b"name: x\ngrids:\n  - entry: supervised\n    method: caf\xe9\n")
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert str(e.value) == (f"{p}:4: the spec is not UTF-8 (byte 0xe9 at offset 52); save it "
                            "as UTF-8")
    r = CliRunner().invoke(main, ["sweep", str(p), "--dry-run"])
    assert r.exit_code == 1 and "not UTF-8" in r.output and "Traceback" not in r.output
    p.write_bytes(b"name: x\ngrids:\n  - {entry: supervised, method: s\x07}\n")
    with pytest.raises(SpecError, match=r"latin1.yaml:3: not valid YAML: character '\\x07'"):
        load_spec(p)


# -- item 5: names MLflow's filter cannot hold ------------------------------------------------

@pytest.mark.parametrize("name", ['"bob\'s"', "'a''b'", '"x\\"y"', "a`b", '"a\\\\b"'])
def test_a_sweep_name_with_a_quote_is_refused(name):
    msg = _err(f"name: {name}\ngrids:\n  - {{entry: supervised, method: sup}}\n")
    assert msg.startswith("g.yaml:1: the sweep name") and "rename it" in msg


def test_a_quoted_name_in_code_is_refused_by_the_driver(tmp_path, monkeypatch):
    from scarcelab.tracking.sweep.driver import Driver

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    sp = parse_spec(BASE.format(top=""), "g.yaml")
    with pytest.raises(SpecError, match="rename it"):
        Driver(SweepSpec("bob's", "e", sp.cells, path="g.yaml"), echo=lambda s: None)
