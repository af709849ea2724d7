"""Grid specs (tracking/sweep/spec.py): expansion into cells and errors that name the line."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from scarcelab.entrypoints.cli import main
from scarcelab.tracking.sweep.spec import SpecError, load_spec, parse_spec

GRID = """\
name: mini
retries: 2
grids:
  - entry: semi
    method: [fixmatch, pseudolabel]
    dataset: [breastmnist, pneumoniamnist]
    seed: [0, 1]
    budget_minutes: 2
    set: {lambda_u: 1, threshold: 0.9}
  - entry: al
    strategy: [random, margin]
    dataset: splice
    query-size: [1, 5]
full:
  budget_minutes: 60
"""


def test_grid_expands_to_the_cartesian_product_with_cli_argv():
    sp = parse_spec(GRID, "g.yaml")
    assert sp.name == "mini" and sp.experiment == "mini" and sp.retries == 2
    semi = [c for c in sp.cells if c.entry == "semi"]
    al = [c for c in sp.cells if c.entry == "al"]
    assert len(semi) == 8 and len(al) == 4
    assert len({c.id for c in sp.cells}) == 12
    c = semi[0]
    assert c.argv() == ["semi", "--method", "fixmatch", "--dataset", "breastmnist", "--seed",
                        "0", "--budget-minutes", "2", "--set", "lambda_u=1,threshold=0.9"]
    assert ["--query-size", "5"] == al[-1].argv()[-2:]
    assert {dict(c.options)["seed"] for c in semi} == {"0", "1"}


def test_full_scale_overrides_every_grid_it_applies_to():
    sp = parse_spec(GRID.replace("  - entry: al\n    strategy: [random, margin]\n    dataset: "
                                 "splice\n    query-size: [1, 5]\n", ""), full=True)
    assert {dict(c.options)["budget_minutes"] for c in sp.cells} == {"60"}


def test_cell_ids_are_stable_and_ignore_key_order():
    a = parse_spec("name: a\ngrids:\n  - {entry: semi, method: fixmatch, seed: 1}\n")
    b = parse_spec("name: b\ngrids:\n  - {entry: semi, seed: 1, method: fixmatch}\n")
    c = parse_spec("name: c\ngrids:\n  - {entry: semi, seed: 2, method: fixmatch}\n")
    assert a.cells[0].id == b.cells[0].id != c.cells[0].id


@pytest.mark.parametrize("text,line,words", [
    ("name: x\ngrids:\n  - entry: semi\n    methd: [a]\n", 4, "semi has no option 'methd'"),
    ("name: x\ngrids:\n  - entry: semy\n", 3, "unknown entry point 'semy'"),
    ("name: x\ngridz: []\n", 2, "unknown key 'gridz'"),
    ("grids:\n  - entry: semi\n", 1, "'name'"),
    ("name: x\ngrids:\n  - entry: semi\n    seed: []\n", 4, "empty list"),
    ("name: x\ngrids:\n  - entry: semi\n    experiment: e\n", 4, "set by the sweep"),
    ("name: x\ncpus_per_cell: -1\ngrids:\n  - entry: semi\n", 2, "cpus_per_cell"),
    ("name: x\ngrids:\n  - entry: semi\n    seed: [0, 0]\n", 3, "appears twice"),
    ("name: x\ngrids: [\n", 3, "not valid YAML"),
])
def test_errors_name_the_file_and_line(text, line, words):
    with pytest.raises(SpecError) as e:
        parse_spec(text, "grid.yaml")
    assert str(e.value).startswith(f"grid.yaml:{line}: "), str(e.value)
    assert words in str(e.value)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(SpecError, match="no such spec file"):
        load_spec(tmp_path / "nope.yaml")


def test_dry_run_prints_every_cell_and_runs_nothing(tmp_path):
    p = tmp_path / "g.yaml"
    p.write_text(GRID)
    res = CliRunner().invoke(main, ["sweep", str(p), "--dry-run"])
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    assert lines[0].startswith("sweep mini: 12 cells") and len(lines) == 13
    assert "scarcelab semi --method fixmatch --dataset breastmnist" in lines[1]
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ngrids:\n  - entry: semi\n    methd: [a]\n")
    res = CliRunner().invoke(main, ["sweep", str(bad), "--dry-run"])
    assert res.exit_code != 0 and "bad.yaml:4:" in res.output and "Traceback" not in res.output


def test_shipped_suites_are_valid():
    from pathlib import Path

    suites = sorted((Path(__file__).resolve().parents[3] / "suites").glob("*.yaml"))
    assert suites, "suites/ ships grid specs"
    for p in suites:
        # the claims scale: test_each_shipped_suite_has_a_claims_design_or_says_why_not
        for flags in ({}, {"full": True}, {"smoke": True}):
            sp = load_spec(p, **flags)
            assert sp.cells, p


DEPS = """\
name: deps
grids:
  - id: pretrain
    entry: self
    method: simclr
    dataset: pathology_crops
    seed: [0, 1]
  - entry: probe
    encoder: [random, "@pretrain"]
    protocol: [linear, finetune]
    seed: [0, 1]
    budget_minutes: 2
"""


def test_a_reference_depends_on_the_cell_that_agrees_on_the_referenced_axes():
    sp = parse_spec(DEPS, "g.yaml")
    pre = {dict(c.options)["seed"]: c for c in sp.cells if c.entry == "self"}
    probes = [c for c in sp.cells if c.entry == "probe"]
    assert len(probes) == 8
    for c in probes:
        o = dict(c.options)
        if o["encoder"] == "random":
            assert c.refs == ()
        else:  # the literal reference stays the option's value; the cell it matched is named
            assert o["encoder"] == "@pretrain"
            assert c.refs == (("encoder", pre[o["seed"]].id),)
            assert c.argv({"encoder": "runs:/abc/model"})[1:3] == ["--encoder",
                                                                    "runs:/abc/model"]
    # stable: the same spec gives the same ids; a changed dependency gives new dependents
    again = parse_spec(DEPS, "g.yaml")
    assert [c.id for c in again.cells] == [c.id for c in sp.cells]
    changed = parse_spec(DEPS.replace("dataset: pathology_crops", "dataset: crc"), "g.yaml")
    dep_ids = {c.id for c in sp.cells if c.refs}
    assert not dep_ids & {c.id for c in changed.cells if c.refs}
    assert {c.id for c in sp.cells if c.entry == "probe" and not c.refs} == \
        {c.id for c in changed.cells if c.entry == "probe" and not c.refs}


@pytest.mark.parametrize("old,new,line,words", [
    ('"@pretrain"', '"@pretrian"', 9, "@pretrian names no grid (grid ids: pretrain)"),
    # the referenced grid has an axis (arch) this grid does not pin: two cells match
    ("    seed: [0, 1]\n  - entry: probe", "    seed: [0, 1]\n    arch: [a, b]\n"
     "  - entry: probe", 10, "matches 2 cells of grid 'pretrain' (matched on seed=0; they "
     "differ in arch)"),
    ("    seed: [0, 1]\n    budget", "    seed: [0, 5]\n    budget", 9,
     "no cell of grid 'pretrain' has seed=5"),
    # pretrain -> (its hparams_from) -> the probe grid -> pretrain
    ("    method: simclr\n", "    method: simclr\n    hparams_from: \"@probes\"\n", 11,
     "makes a dependency cycle (grid 0 (pretrain) -> grid 1 (probes) -> grid 0 (pretrain))"),
    ("    method: simclr\n", "    method: simclr\n    hparams_from: \"@pretrain\"\n", 6,
     "makes a dependency cycle (grid 0 (pretrain) -> grid 0 (pretrain))"),
    ('"@pretrain"', "@pretrain", 9, 'quote a reference to another grid: "@pretrain"'),
    ("  - id: pretrain\n", "  - id: [x]\n", 3, "a grid's 'id' is a name"),
])
def test_reference_errors_name_the_file_and_line(old, new, line, words):
    text = DEPS.replace("  - entry: probe\n", "  - entry: probe\n    id: probes\n") \
        if "@probes" in new else DEPS
    text = text.replace(old, new, 1)
    assert text != DEPS
    with pytest.raises(SpecError) as e:
        parse_spec(text, "grid.yaml")
    assert str(e.value).startswith(f"grid.yaml:{line}: "), str(e.value)
    assert words in str(e.value), str(e.value)


def test_shipped_dependency_suites_expand_and_show_their_dependencies():
    from pathlib import Path

    suites = Path(__file__).resolve().parents[3] / "suites"
    # per seed: linear and finetune probes at two label budgets (the smoke: one), and
    # segmentations fine-tuned and frozen on all tiles and fine-tuned on 10 %
    for flags, n_pre, per in (({}, 1, 7), ({"full": True}, 3, 7), ({"smoke": True}, 1, 5)):
        sp = load_spec(suites / "pathology.yaml", **flags)
        pre = [c for c in sp.cells if c.entry == "self"]
        deps = [c for c in sp.cells if c.refs]
        assert len(pre) == n_pre and len(deps) == per * n_pre
        seeds = {c.id: dict(c.options)["seed"] for c in pre}
        for c in deps:  # each evaluation uses the encoder pre-trained with its own seed
            assert seeds[c.refs[0][1]] == dict(c.options)["seed"]
        res = CliRunner().invoke(main, ["sweep", str(suites / "pathology.yaml"), "--dry-run"]
                                 + [f"--{k}" for k in flags])
        assert res.exit_code == 0, res.output
        lines = {ln.split()[0]: ln for ln in res.output.splitlines()[1:]}
        assert len(lines) == len(sp.cells)
        for c in deps:
            assert "--encoder @pretrain" in lines[c.id]
            assert f"once cell {c.refs[0][1]} finished" in lines[c.id]
    tune = load_spec(suites / "tune_it.yaml")
    assert {c.entry for c in tune.cells} == {"tune"} and len(tune.cells) == 10
    full = load_spec(suites / "tune_it.yaml", full=True)
    assert len(full.cells) == 10 * 5
    assert {dict(c.options)["epochs"] for c in full.cells} == {"default"}


CLAIMS = GRID.replace("    budget_minutes: 2\n", "    budget_minutes: 2\n    claims: {seed: [0, "
                      "1, 2, 3], dataset: breastmnist, budget_minutes: 5}\n").replace(
    "    query-size: [1, 5]\n", "    query-size: [1, 5]\n    claims: {query-size: 1}\n")


def test_the_claims_scale_merges_its_blocks_and_records_apart():
    """``--claims`` (issue 41 item 5): the top-level ``claims:`` into every grid and a
    grid's own after it (axes replaced, e.g. more seeds on fewer datasets), into the
    experiment ``<experiment>-claims`` so its numbers never mix with the reference's."""
    ref = parse_spec(CLAIMS, "c.yaml")
    sp = parse_spec(CLAIMS, "c.yaml", scale="claims")
    assert sp.scale == "claims" and sp.experiment == "mini-claims"
    assert ref.scale == "reference" and ref.experiment == "mini" and len(ref.cells) == 12
    semi = [dict(c.options) for c in sp.cells if c.entry == "semi"]
    assert len(semi) == 8 and {o["dataset"] for o in semi} == {"breastmnist"}
    assert {o["seed"] for o in semi} == {"0", "1", "2", "3"}
    assert {o["budget_minutes"] for o in semi} == {"5"}
    al = [dict(c.options) for c in sp.cells if c.entry == "al"]
    assert sorted(o["strategy"] for o in al) == ["margin", "random"]
    assert {o["query_size"] for o in al} == {"1"}
    # the top-level block goes into every grid, a grid's own after it
    top = parse_spec("name: t\ngrids:\n  - {entry: al, strategy: random, repetitions: 2}\n"
                     "  - {entry: al, strategy: margin, claims: {repetitions: 7}}\n"
                     "claims: {repetitions: 20, query_size: 1}\n", "t.yaml", scale="claims")
    assert [(dict(c.options)["repetitions"], dict(c.options)["query_size"])
            for c in top.cells] == [("20", "1"), ("7", "1")]
    # the reference grid is untouched by the claims blocks, and the cell ids of a scale
    # are those of the same options written out (an export's cells are checked by id)
    assert {c.id for c in ref.cells} == {c.id for c in parse_spec(GRID, "g.yaml").cells}
    for bad, words in ((dict(scale="tiny"), "unknown scale 'tiny'"),
                       (dict(scale="claims", full=True), "--claims and --full")):
        with pytest.raises(SpecError, match=words):
            parse_spec(CLAIMS, "c.yaml", **bad)
    # a spec without a design: --claims is an error, not the reference grid renamed
    with pytest.raises(SpecError, match="no `claims:` block"):
        parse_spec(GRID, "g.yaml", scale="claims")


def test_each_shipped_suite_has_a_claims_design_or_says_why_not():
    """Issue 41 item 5: a suite's ``--claims`` is a design sized to test its paper's claims
    on this machine, or the spec refuses it and its header says why (ssl_vs_ssl and
    tune_it: the claims need ResNet-18 / WRN-16-8 at the paper's length)."""
    from pathlib import Path

    suites = Path(__file__).resolve().parents[3] / "suites"
    designed = set()
    for p in sorted(suites.glob("*.yaml")):
        try:
            sp = load_spec(p, scale="claims")
        except SpecError as e:
            assert "no `claims:` block" in str(e)
            assert "No `--claims` design" in p.read_text(), p.name
            continue
        designed.add(p.stem)
        assert sp.experiment.endswith("-claims") and sp.cells
    assert designed == {"cdalbench", "cscore", "pathology"}
    seeds = {dict(c.options)["seed"] for c in load_spec(suites / "pathology.yaml",
                                                         scale="claims").cells}
    assert seeds == {"0", "1", "2"}


def test_cdalbench_claims_scale_is_the_design_its_header_states():
    """suites/cdalbench.yaml --claims: seven strategies on six problems (splice and usps at
    q = 1 and 5, the synthetic sets at q = 1), the q = 1 oracle on the synthetic sets, 20
    paired repetitions per cell (the claims' ``needs`` ask >= 10 and >= 2 problems)."""
    from pathlib import Path

    p = Path(__file__).resolve().parents[3] / "suites" / "cdalbench.yaml"
    sp = load_spec(p, scale="claims")
    opts = [dict(c.options) for c in sp.cells]
    assert sp.experiment == "cdalbench-claims" and len(opts) == 44
    assert {int(o["repetitions"]) for o in opts} == {20}
    problems: dict[str, set[tuple[str, str]]] = {}
    for o in opts:
        problems.setdefault(o["strategy"], set()).add((o["dataset"], o["query_size"]))
    six = {("splice", "1"), ("splice", "5"), ("usps", "1"), ("usps", "5"),
           ("honeypot", "1"), ("diverging_sine", "1")}
    heuristics = {"margin", "random", "entropy", "least_confident", "badge", "coreset",
                  "typiclust"}
    assert {s for s, ps in problems.items() if ps == six} == heuristics
    assert problems["oracle"] == {("honeypot", "1"), ("diverging_sine", "1")}
    r = CliRunner().invoke(main, ["sweep", str(p), "--claims", "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "44 cells -> experiment 'cdalbench-claims' (claims scale" in r.output


def test_only_selects_a_slice_with_the_cells_it_depends_on(tmp_path):
    """``sweep --only`` (tracking/sweep/spec.py::select_cells): every filter must hold, a
    dependent brings the cell it depends on, the slice's cells are the design's own cells
    (same ids), and a filter that names no option or no value is an error, not an empty
    or a whole sweep."""
    from scarcelab.tracking.sweep.spec import select_cells

    sp = parse_spec(DEPS, "g.yaml")
    probes = [c for c in sp.cells if c.entry == "probe" and dict(c.options)["seed"] == "1"]
    got = select_cells(sp.cells, ["seed=1", "encoder=@pretrain"])
    pre1 = next(c for c in sp.cells if c.entry == "self" and dict(c.options)["seed"] == "1")
    want = [c for c in probes if c.refs] + [pre1]
    assert {c.id for c in got} == {c.id for c in want} and len(got) == len(want) >= 2
    assert [c.id for c in got] == [c.id for c in sp.cells if c.id in {w.id for w in want}]
    assert select_cells(sp.cells, ["seed=0,1"]) == sp.cells  # both seeds: every cell
    for bad, words in (("sed=1", "no cell has the option 'sed'"),
                       ("seed=7", "no cell has seed = 7 (its values here: 0, 1)"),
                       ("seed", "write KEY=VALUE")):
        with pytest.raises(SpecError, match=words.replace("(", r"\(").replace(")", r"\)")):
            select_cells(sp.cells, [bad])
    p = tmp_path / "g.yaml"
    p.write_text(GRID)
    res = CliRunner().invoke(main, ["sweep", str(p), "--dry-run", "--only",
                                    "method=fixmatch", "--only", "dataset=breastmnist"])
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    assert all("--method fixmatch --dataset breastmnist" in ln for ln in lines[1:])
    assert lines[0].startswith(f"sweep mini: {len(lines) - 1} cells") and len(lines) > 1
    res = CliRunner().invoke(main, ["sweep", str(p), "--dry-run", "--only", "method=x"])
    assert res.exit_code != 0 and "no cell has method = x" in res.output
