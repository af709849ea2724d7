"""The tag names are one module of constants, and product code spells none of them itself.

Tag names are DESIGN's public contract (§4.2), so this file keeps them as literal strings: a
constant that drifted from the documented name must fail here, not silently rename a tag.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from scarcelab import tags as T

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("scarcelab", "tracking", "entrypoints")
#: Left for the change that owns the file (issue 44: the layers helper edits it): use
#: ``T.PREFIX`` there, then delete the entry (an entry that matches nothing fails)
PENDING: dict[str, list[str]] = {}  # file -> literals still to fix: none
#: "scarcelab.*" strings that are not tags: click's ctx.meta key of the typed options
NOT_TAGS = {"scarcelab.raw_params",
            "scarcelab.datasets"}  # the dataset plugins' entry-point group

#: DESIGN.md §4.2, "Tags:" (the git commit is MLflow's own tag)
DESIGN_TAGS = {"ROLE": "scarcelab.role", "FAMILY": "scarcelab.family",
               "METHOD": "scarcelab.method", "DATASET": "scarcelab.dataset",
               "SEED": "scarcelab.seed", "SPLIT_HASH": "scarcelab.split_hash",
               "VERSION": "scarcelab.version"}


def _constants() -> dict[str, str]:
    return {k: v for k, v in vars(T).items() if k.isupper() and isinstance(v, str)}


def test_design_tags_have_their_documented_names() -> None:
    for name, value in DESIGN_TAGS.items():
        assert getattr(T, name) == value


def test_design_md_lists_no_tag_the_module_lacks() -> None:
    """Read the tag names of DESIGN.md §4.2 itself, where the checkout sits beside it."""
    design = ROOT.parent / "shared" / "DESIGN.md"
    if not design.is_file():
        pytest.skip(f"{design} not beside this checkout")
    text = design.read_text()
    runs = text[text.index("### 4.2 Runs"):text.index("### 4.3")]
    documented = set(re.findall(r"`(scarcelab\.[a-z_]+)`", runs))
    assert documented == set(DESIGN_TAGS.values())
    assert documented <= set(_constants().values())


def test_constants_are_distinct_prefixed_names() -> None:
    values = [v for k, v in _constants().items() if k != "PREFIX"]
    assert len(values) == len(set(values)), "two constants name the same tag"
    assert all(re.fullmatch(r"scarcelab\.[a-z0-9_]+", v) for v in values), values
    assert T.note("test_set") == T.TEST_SET == "scarcelab.test_set"


def test_the_module_imports_nothing() -> None:
    """The core imports it, and the core never imports mlflow (DESIGN §1)."""
    code = ("import sys; before = set(sys.modules); import scarcelab.tags; "
            "new = set(sys.modules) - before - {'scarcelab', 'scarcelab.tags'}; "
            "assert not any(m.startswith('mlflow') for m in sys.modules), new")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def _is_module_name(body: str) -> bool:
    """``scarcelab.methods.semi``, ``scarcelab.tracking`` (a logger), ``scarcelab.entrypoints.x``:
    a name whose first part is a module of the checkout is an import or a logger name."""
    head = body.removeprefix("scarcelab.").split(".")[0].split("{")[0]
    return bool(head) and any((d / head).is_dir() or (d / f"{head}.py").is_file()
                              for d in (ROOT / "scarcelab", ROOT))


#: a whole string that is a tag name, or an f-string that builds one (``scarcelab.n_{k}``)
TAG_NAME = re.compile(r"scarcelab\.[a-z0-9_]*(\{[^}]*\}[a-z0-9_]*)*")


def tag_literals(source: str) -> list[tuple[int, str]]:
    """The string literals of ``source`` that spell a scarcelab tag: a quoted name (or an
    f-string building one), or a name in an MLflow filter (``tags.`scarcelab.role```).
    Prose that mentions a tag (an error message, a docstring) is not a spelling of it."""
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.STRING:
            continue
        quote = re.match(r"[rRbBuUfF]*('''|\"\"\"|'|\")", tok.string)
        assert quote is not None
        body = tok.string[quote.end():len(tok.string) - len(quote.group(1))]
        if (TAG_NAME.fullmatch(body) and not _is_module_name(body) and body not in NOT_TAGS) \
                or re.search(r"tags\.`?scarcelab", body):
            found.append((tok.start[0], tok.string))
    return found


def test_tag_literal_finder_finds_what_it_must() -> None:
    src = ('x = {"scarcelab.role": "study"}\n'
           "y = f\"tags.`scarcelab.role` = 'al'\"\n"
           'z = f"scarcelab.{k}"\n'
           'ok = ("scarcelab.methods.semi", "scarcelab.tracking", f"tags.`{T.ROLE}`")\n'
           '"""A docstring may name ``scarcelab.role=study``."""\n'
           'e = "scarcelab.best_trial tag missing (it did not finish)"\n')
    assert [line for line, _ in tag_literals(src)] == [1, 2, 3]


def test_no_product_file_spells_a_tag() -> None:
    files = [p for d in PRODUCT for p in (ROOT / d).rglob("*.py")]
    assert len(files) > 50
    offenders = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if rel == "scarcelab/tags.py":
            continue
        found = tag_literals(path.read_text())
        pending = PENDING.get(rel, [])
        assert all(p in [t for _, t in found] for p in pending), f"{rel}: fixed, delete it " \
            "from PENDING"
        offenders += [f"{rel}:{line}: {text}" for line, text in found if text not in pending]
    assert not offenders, "use the constants of scarcelab/tags.py:\n" + "\n".join(offenders)
