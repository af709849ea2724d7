"""Rendering views: markdown, CSV, PNG plots and one standalone HTML report.

The HTML page embeds its plots as base64 PNGs and its style inline, so it can be mailed,
attached to a run as an artifact and opened from the MLflow UI with nothing else.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import cast
from urllib.parse import urlsplit, urlunsplit

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from scarcelab.tracking import stats  # noqa: E402
from scarcelab.tracking.query.frame import VAL  # noqa: E402
from scarcelab.tracking.query.keys import BLOCK  # noqa: E402

FLOAT_FMT = ".4f"


def to_markdown(df: pd.DataFrame) -> str:
    if df.empty:
        return "_(no rows)_"
    return df.to_markdown(index=False, floatfmt=FLOAT_FMT)


def to_csv(df: pd.DataFrame) -> str:
    return df.to_csv(index=False)


PM = "\u00b1"  # ±


def _num(x: float, digits: int) -> str:
    return f"{x:.{digits}f}"


#: words of column names holding scores: shown with decimals even where whole (0.000)
_SCORE_WORDS = ("accuracy", "auroc", "gain", "p", "value", "statistic", "rank", "pq", "dq",
                "sq", "aji", "dice", "auc", "sensitivity", "mean", "std", "min", "max")


def people_frame(df: pd.DataFrame, digits: int = 3) -> pd.DataFrame:
    """The view as a person reads it: each ``X_mean`` / ``X_std`` pair (and ``mean`` / ``std``)
    becomes one column ``X`` holding ``0.796 ± 0.015`` (just the mean where there is no std: one
    seed), numbers rounded to ``digits`` (whole numbers shown whole), and columns with no value
    in any row dropped. Every cell is a string; the machine formats (CSV, JSON) keep the full
    frame.
    """
    out = pd.DataFrame(index=df.index)
    for c in df.columns:
        if c.endswith("_std") and c[:-4] + "_mean" in df:
            continue
        col = df[c]
        if c == "std" and "mean" in df:
            continue
        pair = c[:-5] + "_std" if c.endswith("_mean") else ("std" if c == "mean" else None)
        if pair is not None and pair in df:
            std = df[pair]
            out[c[:-5] if c.endswith("_mean") else f"mean {PM} std"] = [
                "" if pd.isna(m) else _num(m, digits) + (
                    "" if pd.isna(sd) else f" {PM} {_num(sd, digits)}")
                for m, sd in zip(col, std, strict=True)]
            continue
        num = pd.to_numeric(col, errors="coerce")
        is_num = col.map(lambda v: isinstance(v, (int, float, np.number))
                         and not isinstance(v, bool)).all()
        if is_num and len(col):
            vals = num.dropna()
            whole = pd.api.types.is_integer_dtype(col) or (
                not set(c.replace(" ", "_").split("_")) & set(_SCORE_WORDS)
                and vals.map(lambda v: float(cast("float", v)).is_integer()).all()
                and bool((vals.abs() > 1).any()))  # 0 and 1 alone: more likely scores
            out[c] = ["" if pd.isna(v) else (f"{int(v)}" if whole else _num(v, digits))
                      for v in num]
        else:
            out[c] = ["" if v is None or (isinstance(v, float) and np.isnan(v))
                      or str(v) == "nan" else str(v) for v in col]
    keep = [c for c in out.columns if (out[c] != "").any()]
    return out[keep].reset_index(drop=True)


def to_table(df: pd.DataFrame, digits: int = 3) -> str:
    """An aligned plain-text table for a terminal (:func:`people_frame`'s cells): text
    left-aligned, numbers right-aligned so that their decimal points line up."""
    if df.empty:
        return "(no rows)"
    p = people_frame(df, digits)
    right = {c for c in p.columns
             if p[c].map(lambda v: v == "" or cast("str", v).replace(PM, "")
                         .replace(" ", "").replace(".", "").replace("-", "").isdigit()).all()}
    widths = {c: max(len(c), *(len(v) for v in p[c])) for c in p.columns}

    def line(cells: dict[str, str]) -> str:
        return "  ".join(cells[c].rjust(widths[c]) if c in right else cells[c].ljust(widths[c])
                         for c in p.columns).rstrip()

    rows = [line({c: c for c in p.columns}),
            line({c: "-" * widths[c] for c in p.columns})]
    rows += [line(dict(r)) for _, r in p.iterrows()]
    return "\n".join(rows)


def to_json(df: pd.DataFrame) -> str:
    """Records, one object per row; missing values are ``null`` (not NaN, which is not
    JSON)."""
    import json

    records = df.astype(object).where(df.notna(), None).to_dict(orient="records")
    return json.dumps(records, indent=1, default=str)


def png_bytes(fig: Figure, dpi: int = 110) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


# -- plots ---------------------------------------------------------------------------
def _grid(n: int, rows: int = 1) -> tuple[Figure, np.ndarray]:
    cols = max(n, 1)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    return fig, axes


def _block_title(ds: object, nl: object) -> str:
    return f"{ds}" + (f" (n={int(nl)})" if nl is not None and pd.notna(nl) else "")  # type: ignore[call-overload]


def row_labels(part: pd.DataFrame) -> pd.Series:
    """One label per leaderboard row of a block: the method, and — where the block holds
    several rows of it (variants run with other settings) — what sets each apart: the
    shown settings that differ (``budget_minutes=1``) and the ``setting`` column."""
    shown = ("n_val", "arch", "budget_minutes", "search")
    out = part["method"].astype(str).copy()
    for _, g in part.groupby("method", sort=False):
        if len(g) < 2:
            continue
        differ = [c for c in shown if c in g and g[c].astype(str).nunique() > 1]
        for i, r in g.iterrows():
            bits = [f"{c}={r[c]:g}" if isinstance(r[c], float) else f"{c}={r[c]}"
                    for c in differ]
            if str(r.get("setting", "") or "") not in ("", "nan"):
                bits.append(str(r["setting"]))
            # pandas-stubs allow only int | str Series labels; i is a label of out's own index
            out[i] = f"{r['method']} ({', '.join(bits)})"  # pyright: ignore[reportCallIssue, reportArgumentType]
    return out


def plot_leaderboard(lb: pd.DataFrame, metric: str = "test_balanced_accuracy") -> Figure | None:
    """Per dataset block: mean ± std of ``metric`` per method (per variant, see
    :func:`row_labels`), best at the top."""
    if lb.empty or f"{metric}_mean" not in lb:
        return None
    blocks = list(lb.groupby(list(BLOCK), dropna=False, sort=True))
    cols = min(len(blocks), 3)  # at most three blocks a row: readable at page width
    rows = -(-len(blocks) // cols)
    fig, grid = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.0 * rows), squeeze=False)
    for ax in grid.ravel()[len(blocks):]:
        ax.set_visible(False)
    for ax, ((ds, nl), part) in zip(grid.ravel(), blocks, strict=False):
        part = part.sort_values(f"{metric}_mean", kind="stable")
        labels = row_labels(part)
        std = part[f"{metric}_std"]
        # error bars: ± one sample std over seeds, capped so that a small one stays
        # visible; a row of one seed has no std (drawn as 0) and is labelled so below
        ax.barh(labels, part[f"{metric}_mean"], xerr=std.fillna(0), color="tab:blue",
                alpha=0.8, error_kw={"ecolor": "black", "elinewidth": 1.2, "capsize": 4,
                                     "capthick": 1.2})
        n = part["n"] if "n" in part else pd.Series(np.nan, index=part.index)
        for y, (sd, k) in enumerate(zip(std, n, strict=True)):
            note = f"n={int(k)}" if pd.notna(k) else ""
            if pd.isna(sd):
                note += " (no std)"
            ax.annotate(note.strip(), (0, y), xytext=(3, 0), textcoords="offset points",
                        va="center", fontsize=7, color="white")
        ax.set_title(_block_title(ds, nl), fontsize=10)
        ax.set_xlabel(metric.replace("_", " ") + " (mean ± std over seeds)")
    fig.tight_layout()
    return fig


def plot_profile(prof: pd.DataFrame, metric: str = "test_balanced_accuracy") -> Figure | None:
    """SSL-vs-SSL Fig. 1 style: test (top) and validation (bottom) score of the checkpoint
    best on validation by time t; lines are seed means, bands the min-max over seeds."""
    if prof.empty:
        return None
    blocks = list(prof.groupby(list(BLOCK), dropna=False, sort=True))
    fig, axes = _grid(len(blocks), rows=2)
    for j, ((ds, nl), part) in enumerate(blocks):
        for i, (m, label) in enumerate(((metric, "test"), (VAL, "validation"))):
            ax = axes[i, j]
            for k, (meth, g) in enumerate(part.groupby("method", sort=True)):
                color = f"C{k % 10}"
                x = g["t_s"].to_numpy() / 60.0
                ax.plot(x, g[f"{m}_mean"], color=color, label=str(meth), lw=1.6,
                        drawstyle="steps-post")
                ax.fill_between(x, g[f"{m}_min"], g[f"{m}_max"], color=color, alpha=0.15,
                                step="post", lw=0)
            ax.set_title(f"{_block_title(ds, nl)}: {label}", fontsize=10)
            ax.set_xlabel("minutes")
            ax.set_ylabel("balanced accuracy" if "balanced" in m else m)
        axes[0, j].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def plot_gains(g: pd.DataFrame) -> Figure | None:
    """Median gain (bar) and worst gain (marker) per method, in points of the metric."""
    if g.empty:
        return None
    g = g.iloc[::-1]
    fig, ax = plt.subplots(figsize=(6, 0.4 * len(g) + 1.2))
    ax.barh(g["method"].astype(str), g["median_gain"], color="tab:green", alpha=0.7,
            label="median gain")
    ax.plot(g["worst_gain"], g["method"].astype(str), "kx", label="worst gain")
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel("gain over the best labeled-only method")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# -- report -------------------------------------------------------------------------
@dataclass
class Section:
    """One view in a report. ``display`` (default: ``table``) is what the HTML page shows,
    e.g. a few time points of a long profile; the CSV and markdown files hold ``table``."""

    title: str
    table: pd.DataFrame
    figures: dict[str, Figure | None] = field(default_factory=dict)
    note: str = ""
    display: pd.DataFrame | None = None


def _safe_uri(uri: str) -> str:
    """Drop credentials (user:password@) from a URI before it goes into a report."""
    parts = urlsplit(uri)
    if parts.password or parts.username:
        host = parts.hostname or ""
        netloc = host + (f":{parts.port}" if parts.port else "")
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return uri


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em;color:#222}
h1{font-size:1.5em} h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ccc}
table.scarcelab{border-collapse:collapse;font-size:0.85em;margin:0.5em 0}
table.scarcelab th,table.scarcelab td{border:1px solid #bbb;padding:3px 8px;text-align:right}
table.scarcelab th{background:#eef}
table.scarcelab td:first-child,table.scarcelab th:first-child{text-align:left}
img{max-width:100%;margin:0.5em 0} .note{color:#555;font-size:0.9em}
div.wide{overflow-x:auto;max-width:100%}
table.scarcelab th{white-space:normal;max-width:9em;vertical-align:bottom}
table.scarcelab td{white-space:nowrap}
"""


def html_report(sections: Sequence[Section], title: str = "scarcelab report",
                meta: dict[str, str] | None = None, pngs: dict[str, bytes] | None = None
                ) -> str:
    """One standalone HTML page: every section's table and its plots (base64 PNG)."""
    pngs = pngs or {}
    out = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'>",
           f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
           f"<h1>{html.escape(title)}</h1>"]
    if meta:
        out.append("<p class='note'>" + "<br>".join(
            f"{html.escape(k)}: {html.escape(v)}" for k, v in meta.items()) + "</p>")
    for s in sections:
        anchor = s.title.lower().replace(" ", "-")
        out.append(f"<h2 id='{html.escape(anchor)}'>{html.escape(s.title)}</h2>")
        if s.note:
            out.append(f"<p class='note'>{html.escape(s.note)}</p>")
        shown = s.table if s.display is None else s.display
        if shown.empty:
            out.append("<p><em>no rows</em></p>")
        else:
            # the page shows what a person reads (mean ± std, rounded, no empty columns)
            # inside a scroll box, so a wide view never pushes the page sideways; the CSV
            # and markdown files beside it keep every column and digit
            page = people_frame(shown, digits=4)
            page.columns = [c.replace("_", " ") for c in page.columns]  # wraps at spaces
            out.append("<div class='wide'>" + page.to_html(
                index=False, classes="scarcelab", border=0, na_rep="",
                table_id=f"table-{anchor}") + "</div>")
        for name in s.figures:
            data = pngs.get(name)
            if data:
                b64 = base64.b64encode(data).decode()
                out.append(f"<img alt='{html.escape(name)}' src='data:image/png;base64,{b64}'>")
    out.append("</body></html>")
    return "\n".join(out)


def write_report(sections: Sequence[Section], out_dir: str | Path,
                 title: str = "scarcelab report", meta: dict[str, str] | None = None
                 ) -> dict[str, Path]:
    """Write ``report.html``, ``<view>.csv``, ``<view>.md`` and ``<plot>.png`` into
    ``out_dir``; returns name -> path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    pngs: dict[str, bytes] = {}
    for s in sections:
        stem = s.title.lower().replace(" ", "_")
        for ext, text in (("csv", to_csv(s.table)), ("md", to_markdown(s.table))):
            p = out / f"{stem}.{ext}"
            p.write_text(text)
            paths[p.name] = p
        for name, fig in s.figures.items():
            if fig is None:
                continue
            pngs[name] = png_bytes(fig)
            p = out / f"{name}.png"
            p.write_bytes(pngs[name])
            paths[p.name] = p
    p = out / "report.html"
    p.write_text(html_report(sections, title, meta, pngs))
    paths[p.name] = p
    return paths


def report_meta(experiments: Sequence[str], uri: str) -> dict[str, str]:
    return {"experiments": ", ".join(experiments), "tracking URI": _safe_uri(uri),
            "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")}


def condense_profile(prof: pd.DataFrame, k: int = 6) -> pd.DataFrame:
    """At most ``k`` evenly spaced time points per block: a readable table for the page."""
    if prof.empty:
        return prof
    keep = []
    for _, part in prof.groupby(list(BLOCK), dropna=False, sort=False):
        ts = np.sort(part["t_s"].unique())
        pick = ts[np.unique(np.linspace(0, len(ts) - 1, min(k, len(ts))).round().astype(int))]
        keep.append(part[part["t_s"].isin(pick)])
    return pd.concat(keep)


def cd_figure(scores: pd.DataFrame, title: str) -> Figure | None:
    """A CD diagram when the scores allow one: two methods and two complete problems (rank
    tests need at least two blocks; one (dataset, query size) of AL runs averaged over
    repetitions is one block, and the report must not crash on it)."""
    if scores.shape[1] < 2 or len(scores.dropna()) < 2:
        return None
    return stats.cd_diagram(scores, title=title)
