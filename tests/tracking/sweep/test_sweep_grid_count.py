"""A sweep spec of too many cells is refused from arithmetic alone (issue 42, item 13).

The cell count is the product of the grids' list lengths, computed before any grid is
checked, converted or expanded, and a spec file too large to be a sweep spec is refused
before it is parsed (100,000 one-cell grids took 34 CPU-s to be refused). Speed is not
timed here: the tests show that the expanding and parsing code is never reached."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scarcelab.tracking.sweep import spec as S
from scarcelab.tracking.sweep.spec import SpecError, load_spec, parse_spec


def _never(*_: Any, **__: Any) -> None:
    raise AssertionError("the spec was parsed or a grid expanded before the count refused it")


def test_a_billion_cell_grid_is_refused_without_building_any_grid(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(S._Grids, "add", _never)
    axis = "[" + ", ".join(str(i) for i in range(1000)) + "]"
    text = (f"name: big\ngrids:\n  - entry: supervised\n    method: sup\n    seed: {axis}\n"
            f"    max_epochs: {axis}\n    patience: {axis}\n")
    with pytest.raises(SpecError, match=r"big.yaml:3: this grid has 1,000,000,000 cells "
                       r"\(1000 seed x 1000 max_epochs x 1000 patience\): more than the cap "
                       r"of 10,000"):
        parse_spec(text, "big.yaml")


def test_many_small_grids_are_counted_together_before_the_first_is_checked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """3,000 one-cell grids over a cap of 2,000: the grid that crosses it is named, and no
    grid (not even the first, valid one) was expanded."""
    monkeypatch.setattr(S._Grids, "add", _never)
    grids = "".join(f"  - {{entry: supervised, seed: {i}}}\n" for i in range(3000))
    with pytest.raises(SpecError, match=r"g.yaml:2003: this grid has 1 cells \(one\), 2,001 "
                       r"with the grids before it: more than the cap of 2,000"):
        parse_spec(f"name: many\ngrids:\n{grids}", "g.yaml", max_cells=2000)


def test_the_count_merges_the_scale_block_before_refusing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``full:`` block's lists are axes too: counted with the grid they merge into."""
    monkeypatch.setattr(S._Grids, "add", _never)
    text = ("name: s\nfull:\n  seed: [0, 1, 2, 3, 4]\ngrids:\n  - entry: supervised\n"
            "    method: [sup, mixup]\n    full:\n      max_epochs: [1, 2, 3]\n")
    with pytest.raises(SpecError, match=r"this grid has 30 cells"):
        parse_spec(text, "s.yaml", full=True, max_cells=29)


def test_a_spec_file_too_large_to_be_a_spec_is_refused_before_it_is_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(S, "_load", _never)  # the YAML parser is never reached
    p = tmp_path / "huge.yaml"
    p.write_text("name: huge\ngrids:\n" + "".join(
        f"  - {{entry: supervised, method: sup, seed: {i}}}\n" for i in range(100_000)))
    with pytest.raises(SpecError) as e:
        load_spec(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}: the spec is 4,")
    assert "at most 128 KiB" in msg and "one list" in msg and "\n" not in msg
    with pytest.raises(SpecError, match="at most 128 KiB"):
        parse_spec(p.read_text(), str(p))


def test_specs_within_the_caps_still_expand() -> None:
    """The count agrees with the expansion (product of list lengths, grids added up)."""
    text = ("name: ok\ngrids:\n  - entry: supervised\n    method: [sup, mixup]\n"
            "    seed: [0, 1, 2]\n  - entry: supervised\n    method: sup\n    seed: [7, 8]\n")
    sp = parse_spec(text, "ok.yaml", max_cells=8)
    assert len(sp.cells) == 8
    with pytest.raises(SpecError, match=r"ok.yaml:6: this grid has 2 cells \(2 seed\), 8 "
                       r"with the grids before it: more than the cap of 7"):
        parse_spec(text, "ok.yaml", max_cells=7)
