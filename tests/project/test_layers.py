"""The layers of the product code, as contracts an import scan checks (issue 44 item 3).

DESIGN §1 fixes a dependency direction: entry points -> protocols -> the learning core
(methods, active, data, models, metrics, the epoch loop); protocols report through the
``Tracker`` interface, which ``tracking/`` implements with MLflow. Only "the core never
imports mlflow" was enforced (tests/project/test_packaging.py); an import that ran the other way
was found by a reader, after it had spread. These are the layers, written down so that
one such import fails here, in the commit that adds it:

1. **The core knows nothing of MLflow.** ``scarcelab/`` (without the mapped
   ``scarcelab.tracking`` / ``scarcelab.entrypoints``) never imports ``mlflow``,
   ``scarcelab.tracking`` or ``scarcelab.entrypoints``: its tests run with an in-memory
   tracker, and a method author reads no MLflow code.
2. **The loop does not import what drives it.** Inside the core, only
   ``scarcelab.protocols`` imports ``scarcelab.protocols``: a protocol (search, tune,
   transfer, the AL loop's drivers) runs ``scarcelab/train.py`` and the methods, never the
   reverse. A piece both need (the linear probe the loop refits every epoch) lives below
   both (``scarcelab/probe.py``).
3. **Tracking sits below the command line.** Nothing in ``tracking/`` (the sweep, compare,
   query and results layers included) imports ``scarcelab.entrypoints``: the commands are
   one thin layer over it (DESIGN §1), and the sweep that runs them as cells reads them
   through the table they install (``tracking/commands.py``), not by importing them.
4. **Reading runs does not depend on the pages that show them.** ``tracking/query``
   (frames, views, leaderboards) never imports ``tracking/results`` (the published pages and
   their claims): a page is built from views, so a view that needs a page's helper has it
   moved into the query layer.

An exception is named in :data:`EXCEPTIONS` with why it is one (one today: the sweep
cell's process, ``tracking/sweep/cell.py``, which *is* the command line with a GPU cap);
an exception that no longer matches an import fails too, so the list only shrinks. Every
import counts, also one inside a function (a lazy import is still a dependency; it only
runs later). The scan reads the files (``ast``), so it needs no import of torch or MLflow
and covers code that no test runs.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: repository folder -> the package name it is installed as (setup.py's mapping)
ROOTS = {"scarcelab": "scarcelab", "tracking": "scarcelab.tracking",
         "entrypoints": "scarcelab.entrypoints"}
TRACKING, ENTRYPOINTS = "scarcelab.tracking", "scarcelab.entrypoints"


@dataclass(frozen=True)
class Import:
    importer: str  # the importing module's dotted name
    imported: str  # the imported module (``from a.b import c`` -> a.b and a.b.c)
    where: str  # path:line

    def __str__(self) -> str:
        return f"{self.where}: {self.importer} imports {self.imported}"


def _module(path: Path, root: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(root).with_suffix("").parts)
    parts[0] = ROOTS[parts[0]]
    is_pkg = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_pkg else parts), is_pkg


def _canonical(name: str) -> str:
    """``tracking.x`` / ``entrypoints.x`` (a source-checkout spelling) as installed."""
    head = name.split(".")[0]
    return ROOTS[head] + name[len(head):] if head in ("tracking", "entrypoints") else name


def product_imports(root: Path = REPO) -> list[Import]:
    """Every import statement of the product code (top level or inside a function)."""
    out = []
    for folder in ROOTS:
        for path in sorted((root / folder).rglob("*.py")):
            mod, is_pkg = _module(path, root)
            where = str(path.relative_to(root))
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    out += [Import(mod, _canonical(a.name), f"{where}:{node.lineno}")
                            for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    if node.level:  # relative: resolved against the importing package
                        base = mod.split(".")[: None if is_pkg else -1]
                        base = base[: len(base) - node.level + 1]
                        src = ".".join(base + ([node.module] if node.module else []))
                    else:
                        src = _canonical(node.module or "")
                    out.append(Import(mod, src, f"{where}:{node.lineno}"))
                    out += [Import(mod, f"{src}.{a.name}", f"{where}:{node.lineno}")
                            for a in node.names if a.name != "*"]
    return out


def _under(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _core(mod: str) -> bool:
    return _under(mod, "scarcelab") and not _under(mod, TRACKING, ENTRYPOINTS)


@dataclass(frozen=True)
class Contract:
    name: str
    importer: object  # (str) -> bool: modules the rule applies to
    forbidden: tuple[str, ...]  # module prefixes those may not import

    def broken_by(self, imp: Import) -> bool:
        return self.importer(imp.importer) and _under(imp.imported, *self.forbidden)  # type: ignore[operator]


CONTRACTS = (
    Contract("the core never imports mlflow, tracking or the entry points", _core,
             ("mlflow", TRACKING, ENTRYPOINTS)),
    Contract("inside the core only protocols import protocols",
             lambda m: _core(m) and not _under(m, "scarcelab.protocols"),
             ("scarcelab.protocols",)),
    Contract("tracking never imports the entry points", lambda m: _under(m, TRACKING),
             (ENTRYPOINTS,)),
    Contract("the query layer never imports the results pages",
             lambda m: _under(m, f"{TRACKING}.query"), (f"{TRACKING}.results",)),
)

#: (importing module, imported module prefix) -> why it is allowed. Keep it short.
EXCEPTIONS: dict[tuple[str, str], str] = {
    (f"{TRACKING}.sweep.cell", f"{ENTRYPOINTS}.cli"):
        "the process a sweep cell runs as (`python -m scarcelab.tracking.sweep.cell <entry> "
        "…`) is `scarcelab <entry> …` with the cell's GPU memory cap applied first: running "
        "the command line is its whole job, and nothing in tracking imports it (the driver "
        "names it as a module to start). It belongs in entrypoints/ once the driver's "
        "CELL_MODULE can move (tracking/sweep/driver.py, issue 44 item 6's file)",
}


def violations(imports: list[Import] | None = None) -> list[tuple[str, Import]]:
    """(contract name, import) for every import that breaks a contract and is no named
    exception."""
    out = []
    for imp in product_imports() if imports is None else imports:
        for c in CONTRACTS:
            if c.broken_by(imp) and not any(
                    imp.importer == m and _under(imp.imported, p) for m, p in EXCEPTIONS):
                out.append((c.name, imp))
    return out


def _statements(found: list[tuple[str, Import]]) -> set[str]:
    return {imp.where for _, imp in found}


@pytest.mark.parametrize("contract", CONTRACTS, ids=lambda c: c.name.replace(" ", "-"))
def test_layer_contract_holds(contract: Contract) -> None:
    bad = [imp for name, imp in violations() if name == contract.name]
    assert not bad, (f"{contract.name} (tests/project/test_layers.py docstring says why); move the "
                     "shared piece to the lower layer:\n" + "\n".join(map(str, bad)))


def test_every_exception_is_still_needed() -> None:
    imports = product_imports()
    for (mod, prefix), why in EXCEPTIONS.items():
        assert why.strip(), (mod, prefix)
        assert any(imp.importer == mod and _under(imp.imported, prefix) for imp in imports), (
            f"exception {mod} -> {prefix} matches no import any more: remove it")


def test_the_scan_sees_each_kind_of_import(tmp_path: Path) -> None:
    """The scan is what the contracts rest on: a lazy, a relative and a source-checkout
    spelled import are each seen, mapped to the installed name, and flagged."""
    for folder in ROOTS:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "scarcelab" / "protocols").mkdir()
    (tmp_path / "scarcelab" / "protocols" / "__init__.py").write_text("")
    (tmp_path / "scarcelab" / "train.py").write_text(
        "def f():\n    from .protocols import probe\n    import mlflow.tracking\n")
    (tmp_path / "tracking" / "query").mkdir()
    (tmp_path / "tracking" / "query" / "__init__.py").write_text(
        "from tracking.results import page\nfrom ...entrypoints import cli\n")
    found = {(i.importer, i.imported) for i in product_imports(tmp_path)}
    assert ("scarcelab.train", "scarcelab.protocols.probe") in found
    assert ("scarcelab.train", "mlflow.tracking") in found
    assert ("scarcelab.tracking.query", "scarcelab.tracking.results.page") in found
    assert ("scarcelab.tracking.query", "scarcelab.entrypoints.cli") in found
    broken = {c.name for i in product_imports(tmp_path) for c in CONTRACTS if c.broken_by(i)}
    assert broken == {c.name for c in CONTRACTS}


def test_the_known_violations_are_gone() -> None:
    """The three imports issue 44 named, each by the module that made it."""
    found = {(imp.importer, imp.imported) for _, imp in violations()}
    for importer, imported in (("scarcelab.train", "scarcelab.protocols.probe"),
                               (f"{TRACKING}.query.views", f"{TRACKING}.results.page"),
                               (f"{TRACKING}.sweep.spec", f"{ENTRYPOINTS}.cli")):
        assert (importer, imported) not in found
    # the count the closing note reports: import statements that break a layer
    assert len(_statements(violations())) == 0


def test_tracking_reads_the_commands_through_the_table_the_cli_installs() -> None:
    """The port that replaced tracking's imports of the command line: without the command
    line loaded, a spec's options cannot be read and the error names the fix (one line);
    once it is imported, the sweep sees every command and its options."""
    import subprocess
    import sys

    code = ("import sys\nfrom scarcelab.tracking.sweep.spec import entry_options\n"
            "try:\n    entry_options('supervised')\nexcept LookupError as e:\n"
            "    print(e); sys.exit(3)\n"
            "assert 'scarcelab.entrypoints' not in ' '.join(sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "import scarcelab.entrypoints.cli" in r.stdout and r.stdout.count("\n") == 1
    code = ("import scarcelab.entrypoints.cli\n"
            "from scarcelab.tracking.sweep.spec import entry_continuation, entry_options\n"
            "print(sorted(entry_options('supervised'))[:3], entry_continuation('tune'))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Continuation(option='resume'" in r.stdout
