"""A suite's paper file, ``suites/papers/<suite>.yaml``: the source's numbers with their
citations, and its headline claims with the rule that tests each on our numbers.

Why a data file: a results page must never carry a hand-typed number. The paper's values
live here once, each with where it was read (paper or repository, table, row, column), and
the page only copies them; values that could not be read with certainty are listed under
``not_found`` (with the reason) instead of guessed. Layout::

    suite: cdalbench                  # the spec's file name (suites/cdalbench.yaml)
    title: CDALBench
    paper: "Werner et al., A Cross-Domain Benchmark for Active Learning (arXiv 2408.00426)"
    comparisons:                      # tables of paper value beside ours
      - title: AUC, query size 1
        source: "github.com/wernerth94/…, results/auc_qs1.csv @ 9180529c"
        ours: {view: al_auc, query_size: 1}      # merged into every value's `ours`
        values:
          - {row: Random, column: Splice, value: 0.760,
             ours: {strategy: random, dataset: splice}}
    not_found:
      - "Table 3's per-dataset gains: the paper's tables could not be read here"
    claims:
      - id: oracle_bound
        claim: "The greedy oracle upper-bounds the AL strategies"
        source: "Sec. 4 / results/auc_qs1.csv"
        rule: {kind: oracle_best, min_problems: 2}

A comparison marked ``claims_table: true`` holds the numbers the claims rest on (the
paper's headline table, cited by table and row): :func:`paper_data` turns it into the
frames the rules read, so that every rule can be run on the paper's own numbers (a value's
``sd`` and ``n``, where the source gives them, let the rules' tests run on it too). A
claim's ``needs`` states the scale testing it takes (steps or epochs per trial against the
paper's, completed trials, seeds, networks, datasets or named stand-ins:
:func:`.claims.check_scale`); below it the verdict is "not testable at this scale".

``ours`` selects the number of ours put beside a value (:func:`tracking.results.page`'s
``lookup``: ``view`` is ``al_auc``, ``table3`` or ``leaderboard``, the other keys pick the
row). ``scale`` (default 1) multiplies *our* value into the paper's unit (100 when the
paper reports percent).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

#: where a suite's paper file lives, relative to the suite spec's folder
PAPERS_DIR = "papers"
VIEWS = ("al_auc", "table3", "leaderboard", "transfer")


class PaperError(ValueError):
    """A paper file that cannot be used; the message starts with the file's path."""


@dataclass(frozen=True)
class Value:
    row: str
    column: str
    value: float
    ours: dict[str, Any]
    note: str = ""
    sd: float | None = None  # the source's spread (a standard deviation), where it gives one
    n: int | None = None  # the runs behind the value, where the source says


@dataclass(frozen=True)
class Comparison:
    title: str
    source: str
    values: tuple[Value, ...]
    scale: float = 1.0
    note: str = ""
    claims_table: bool = False


@dataclass(frozen=True)
class Claim:
    id: str
    claim: str
    source: str
    rule: dict[str, Any]
    needs: dict[str, Any] | None = None


@dataclass
class PaperFile:
    suite: str
    title: str
    paper: str
    path: str = ""
    comparisons: list[Comparison] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)
    not_found: list[str] = field(default_factory=list)


def paper_path(spec_path: str | Path) -> Path:
    p = Path(spec_path)
    return p.parent / PAPERS_DIR / f"{p.stem}.yaml"


def _need(d: Any, key: str, where: str, kind: type | tuple[type, ...] = str) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise PaperError(f"{where}: needs '{key}'")
    v = d[key]
    if not isinstance(v, kind) or isinstance(v, bool):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise PaperError(f"{where}.{key}: must be a {names}, got {v!r}")
    return v


def _check_needs(needs: dict[str, Any], where: str) -> None:
    """The value types of a claim's ``needs`` (claims.check_scale reads them)."""
    for k in ("steps_per_trial", "epochs_per_trial", "min_share", "trials", "seeds",
              "retrains"):
        v = needs.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or v <= 0):
            raise PaperError(f"{where}.{k}: a number > 0, got {v!r}")
    nets = needs.get("networks")
    if nets is not None and (not isinstance(nets, list)
                             or not all(isinstance(n, str) for n in nets)):
        raise PaperError(f"{where}.networks: a list of network names (scarcelab list archs), "
                         f"got {nets!r}")
    ds = needs.get("datasets")
    if ds is not None and not isinstance(ds, dict):
        raise PaperError(f"{where}.datasets: a mapping of our dataset name to the paper's "
                         f"dataset it is or stands in for, got {ds!r}")


def load_paper(path: str | Path) -> PaperFile:
    """Read and check a paper file; rules are checked against :mod:`.claims`' registry."""
    from scarcelab.tracking.results.claims import RULES

    p = Path(path)
    if not p.is_file():
        raise PaperError(f"{p}: no paper file (suites/papers/<suite>.yaml holds the source's "
                         "numbers and claims; see tracking/results/papers.py)")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise PaperError(f"{p}: not valid YAML: {e}") from None
    where = str(p)
    if not isinstance(data, dict):
        raise PaperError(f"{where}: a mapping with suite, title, paper, comparisons, claims")
    unknown = set(data) - {"suite", "title", "paper", "comparisons", "claims", "not_found"}
    if unknown:
        raise PaperError(f"{where}: unknown key(s) {sorted(unknown)}")
    out = PaperFile(suite=_need(data, "suite", where), title=_need(data, "title", where),
                    paper=_need(data, "paper", where), path=where)
    if out.suite != p.stem:
        raise PaperError(f"{where}.suite: {out.suite!r} but the file is {p.name}: name the "
                         "file after the suite spec it belongs to")
    for i, c in enumerate(data.get("comparisons") or []):
        cw = f"{where}: comparisons[{i}]"
        base = c.get("ours") or {} if isinstance(c, dict) else {}
        values = []
        for j, v in enumerate(_need(c, "values", cw, list)):
            vw = f"{cw}.values[{j}]"
            ours = {**base, **(_need(v, "ours", vw, dict) if "ours" in v else {})}
            if ours.get("view") not in VIEWS:
                raise PaperError(f"{vw}.ours.view: {ours.get('view')!r}; valid: "
                                 f"{', '.join(VIEWS)}")
            sd, n = v.get("sd"), v.get("n")
            if sd is not None and (not isinstance(sd, int | float) or isinstance(sd, bool)
                                   or sd < 0):
                raise PaperError(f"{vw}.sd: a number >= 0 (the source's standard deviation), "
                                 f"got {sd!r}")
            if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
                raise PaperError(f"{vw}.n: a whole number >= 1 (the runs behind the value), "
                                 f"got {n!r}")
            values.append(Value(str(_need(v, "row", vw, (str, int, float))),
                                str(_need(v, "column", vw, (str, int, float))),
                                float(_need(v, "value", vw, (int, float))), ours,
                                str(v.get("note", "")), None if sd is None else float(sd), n))
        out.comparisons.append(Comparison(
            _need(c, "title", cw), _need(c, "source", cw), tuple(values),
            float(c.get("scale", 1.0)), str(c.get("note", "")),
            bool(c.get("claims_table", False))))
    ids = set()
    for i, c in enumerate(data.get("claims") or []):
        cw = f"{where}: claims[{i}]"
        cid = _need(c, "id", cw)
        if cid in ids:
            raise PaperError(f"{cw}.id: {cid!r} is used twice")
        ids.add(cid)
        rule = _need(c, "rule", cw, dict)
        kind = rule.get("kind")
        if kind not in RULES:
            raise PaperError(f"{cw}.rule.kind: unknown rule {kind!r}; valid: "
                             f"{', '.join(sorted(RULES))}")
        try:
            RULES[kind].describe(**{k: v for k, v in rule.items() if k != "kind"})
        except TypeError as e:
            raise PaperError(f"{cw}.rule: {e}") from None
        needs = c.get("needs")
        if needs is not None:
            from scarcelab.tracking.results.claims import NEEDS_KEYS

            if not isinstance(needs, dict):
                raise PaperError(f"{cw}.needs: a mapping of {', '.join(NEEDS_KEYS)}")
            bad = sorted(set(needs) - set(NEEDS_KEYS))
            if bad:
                raise PaperError(f"{cw}.needs: unknown key(s) {bad}; valid: "
                                 f"{', '.join(NEEDS_KEYS)}")
            _check_needs(needs, f"{cw}.needs")
        out.claims.append(Claim(cid, _need(c, "claim", cw), _need(c, "source", cw), rule,
                                needs))
    nf = data.get("not_found") or []
    if not isinstance(nf, list) or not all(isinstance(s, str) for s in nf):
        raise PaperError(f"{where}.not_found: a list of sentences")
    out.not_found = list(nf)
    return out


#: which SuiteData frame a comparison's view fills, and the names of its columns
_PAPER_FRAMES = {"al_auc": ("al", "strategy", "auc"), "table3": ("retrains", "method", "score"),
                 "leaderboard": ("studies", "method", "score")}


def paper_data(paper: PaperFile) -> Any:
    """The paper's own numbers as the rules read ours (:class:`.claims.SuiteData`): each
    value of a ``claims_table`` comparison becomes a summary row (``<value>_mean``,
    ``_sd``, ``n``) of the frame its view names, its ``ours`` keys as the row's columns
    and the value divided by the comparison's ``scale`` (back into our unit)."""
    from scarcelab.tracking.results.claims import SuiteData

    rows: dict[str, list[dict[str, Any]]] = {}
    for c in paper.comparisons:
        if not c.claims_table:
            continue
        for v in c.values:
            view = v.ours.get("view")
            if view not in _PAPER_FRAMES:
                raise PaperError(f"{paper.path}: {c.title!r}: a claims table of view "
                                 f"{view!r}; the rules read {', '.join(_PAPER_FRAMES)}")
            frame, _, value = _PAPER_FRAMES[view]
            row = {k: x for k, x in v.ours.items() if k != "view"}
            row.update({f"{value}_mean": v.value / c.scale,
                        f"{value}_sd": (v.sd / c.scale) if v.sd is not None else float("nan"),
                        "n": v.n if v.n is not None else float("nan")})
            rows.setdefault(frame, []).append(row)
    return SuiteData(**{f: pd.DataFrame(r) for f, r in rows.items()})
