"""bench/architecture.py: the counting functions on a tree small enough to count by hand."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("architecture", ROOT / "bench" /
                                                  "architecture.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = mod  # type: ignore[union-attr]  # dataclasses look it up
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    body = "\n".join(f"    x{i} = {i}" for i in range(84))  # 84 body lines + def = 85
    _write(tmp_path, "scarcelab/__init__.py", "")
    _write(tmp_path, "scarcelab/tags.py", 'ROLE = "scarcelab.role"\nSEED = "scarcelab.seed"\n')
    _write(tmp_path, "scarcelab/long.py", f"@decorated\ndef long():\n{body}\n")
    # a class method of 3 lines holding a nested function of 2: each counted on its own
    _write(tmp_path, "scarcelab/pkg/__init__.py", """\
        class Box:
            def method(self):
                def inner():
                    return "scarcelab.role"
                return inner
        PACKAGES = ("scarcelab.pkg", "scarcelab.tracking.query")
        """)
    _write(tmp_path, "tracking/run.py", """\
        def tag(run, key):
            run.set("scarcelab.role", "study")
            run.set("scarcelab.seed", f"scarcelab.{key}")
            return "not scarcelab.role", "scarcelab.entrypoints.cli"
        """)
    _write(tmp_path, "other/ignored.py", 'X = "scarcelab.role"\n')
    return tmp_path


def test_function_lengths_count_def_to_last_line_nested_and_methods_apart(tree: Path):
    b = _bench()
    got = dict(b.function_lengths(tree))
    assert got == {"scarcelab/long.py::long": 85,
                   "scarcelab/pkg/__init__.py::Box.method": 4,
                   "scarcelab/pkg/__init__.py::Box.method.inner": 2,
                   "tracking/run.py::tag": 4}
    f = b.Figures(functions=list(got.items()))
    assert f.long() == [("scarcelab/long.py::long", 85)]
    assert f.long(limit=3) == [("scarcelab/long.py::long", 85),
                               ("scarcelab/pkg/__init__.py::Box.method", 4),
                               ("tracking/run.py::tag", 4)]
    assert f.longest() == ("scarcelab/long.py::long", 85)


def test_literals_skip_tags_py_fstring_parts_other_dirs_and_module_paths(tree: Path):
    b = _bench()
    tags, paths = b.scarcelab_literals(tree)
    # role: pkg/__init__ once, run.py once (tags.py, other/ and "not scarcelab.role" are
    # not counted); seed: run.py once; the f-string's fixed part is no literal
    assert tags == {"scarcelab.role": 2, "scarcelab.seed": 1}
    assert paths == {"scarcelab.pkg": 1, "scarcelab.tracking.query": 1,
                     "scarcelab.entrypoints.cli": 1}
    assert b.module_names(tree) == {"scarcelab", "scarcelab.tags", "scarcelab.long",
                                    "scarcelab.pkg", "scarcelab.tracking.run"}


def test_duplicates_pair_count_is_read_from_the_first_line():
    b = _bench()
    assert b.parse_duplicates("30 pairs of places (166 files read), each ...\nD1 a ~ b\n") == 30
    assert b.parse_duplicates("1 pair of places (2 files read)\n") == 1
    assert b.parse_duplicates("no duplicates (12 files read)\n") == 0
    with pytest.raises(ValueError, match="unexpected first line"):
        b.parse_duplicates("incomplete: usage: ...")


def test_a_revision_and_the_working_tree_are_copied_folder_by_folder(tmp_path: Path):
    """``materialise`` copies only the named folders (of a revision via ``git archive``, or
    of the working tree), so what is measured is exactly those folders."""
    b = _bench()
    for rev, dest in (("HEAD", tmp_path / "rev"), (None, tmp_path / "work")):
        dest.mkdir()
        root = b.materialise(rev, ("scarcelab",), dest)
        assert (root / "scarcelab" / "registry.py").is_file()
        assert not (root / "tracking").exists() and not (root / "tests").exists()
        names = dict(b.function_lengths(root, ("scarcelab",)))
        assert "scarcelab/registry.py::Registry.register" in names
