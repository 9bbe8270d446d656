"""report.html: one self-contained page an engineer attaches to a ticket.

Rendered from the Jinja2 templates in ``templates/`` with autoescaping on, so every piece of input text
(file, host, kernel names) is escaped by the template engine, never by hand. Figures are plain data
(:mod:`forensics.reports.figures`) embedded through ``plotly.io`` (its JSON escapes ``<``, ``>`` and ``/``),
and plotly.js is inlined once, only when the page has a figure: the page makes no network request of any kind.

This module turns the :class:`Analysis` into plain data (strings, numbers, lists); the templates lay it out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jinja2
import jinja2.bccache
import polars as pl
from forensics.reports.figures import PLOTLY_JS_SLOT, copy_plotly_js, plotly_js, plotly_js_bytes
from forensics.reports.figures import figure_html as figure_html  # re-exported: diff_html imports it from here
from forensics.reports.lastwords import summary as last_words_summary
from forensics.reports.views import View, build_views, view_for
from markupsafe import Markup

from forensics import __version__
from forensics.base.findings import Finding
from forensics.incidents import Incident, trace_window
from forensics.pipeline import Analysis, run_header

MAX_TABLE_ROWS = 500
"""Rows shown per table; the rest is counted ("N more rows") and lives in findings.json / Parquet."""
MAX_EVIDENCE_ROWS = 50
MAX_RANK_ROWS = 2048
"""Ranks and GPUs are listed whole up to this many (a 1,024-rank job: about 0.3 MB)."""

TEMPLATE_CODE = Path(__file__).parent / "templates" / "compiled.json"
"""The Python code Jinja2 generates from :data:`COMPILED_TEMPLATES` (with :data:`ENV`'s settings), as the package
ships it: `forensics docs` regenerates it, `forensics docs --check` fails when it is stale."""
COMPILED_TEMPLATES = ("report.html.j2", "_macros.html.j2", "report.css", "sort.js", "diff.html.j2")


class ShippedTemplateCode(jinja2.BytecodeCache):
    """A read-only Jinja2 bytecode cache over :data:`TEMPLATE_CODE`: a template whose source has the checksum
    recorded there, under the Jinja2 version that generated it, runs that code (compiled by Python, ~5 ms for
    report.html) instead of being parsed and generated again on every run (~30 ms of CPU). Anything else (an
    edited template, another Jinja2, no file) is compiled from its source, as without the cache."""

    def __init__(self, path: Path = TEMPLATE_CODE) -> None:
        self.path = path
        self._shipped: dict[str, dict[str, str]] | None = None

    def _entries(self) -> dict[str, dict[str, str]]:
        if self._shipped is None:
            try:
                data = json.loads(self.path.read_bytes())
            except (OSError, ValueError):
                data = {}
            fits = isinstance(data, dict) and data.get("jinja2") == jinja2.__version__
            self._shipped = data.get("templates", {}) if fits else {}
        return self._shipped

    def get_bucket(self, environment: jinja2.Environment, name: str, filename: str | None,
                   source: str) -> jinja2.bccache.Bucket:
        bucket = jinja2.bccache.Bucket(environment, name, self.get_source_checksum(source))
        entry = self._entries().get(name)
        if isinstance(entry, dict) and entry.get("checksum") == bucket.checksum and isinstance(entry.get("code"), str):
            bucket.code = compile(entry["code"], filename or "<template>", "exec")
        return bucket

    def set_bucket(self, bucket: jinja2.bccache.Bucket) -> None:
        """Read-only: a run writes nothing outside its output folder."""

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:  # pragma: no cover - get_bucket is overridden
        """Unused (:meth:`get_bucket` reads the shipped code)."""

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:  # pragma: no cover - set_bucket is overridden
        """Unused (read-only)."""


ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("forensics.reports", "templates"),
    autoescape=True,  # every {{ value }} is HTML-escaped; only the plotly markup below is marked safe
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    bytecode_cache=ShippedTemplateCode(),
)


def template_code() -> str:
    """The text of :data:`TEMPLATE_CODE`: each of :data:`COMPILED_TEMPLATES` as the Python code :data:`ENV` generates
    from it, with its source's checksum and the Jinja2 version (the code calls that version's runtime)."""
    cache = ShippedTemplateCode()
    out = {}
    for name in COMPILED_TEMPLATES:
        source, filename, _ = ENV.loader.get_source(ENV, name)  # type: ignore[union-attr]
        out[name] = {"checksum": cache.get_source_checksum(source),
                     "code": ENV.compile(source, name, filename, raw=True)}
    return json.dumps({"jinja2": jinja2.__version__, "templates": out}, indent=1, sort_keys=True) + "\n"


def _anchor(text: str) -> str:
    """An id attribute value from code-made names (finding ids, view ids): letters, digits, - and _ only."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", text)


ENV.filters["anchor"] = _anchor


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1e6 else f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_cell(v) for v in value)
    return str(value)


@dataclass
class Table:
    """A table as text cells; ``numeric`` tells the sorter which columns sort as numbers."""

    caption: str
    columns: list[str]
    rows: list[list[str]]
    numeric: list[bool]
    more: int = 0
    row_class: list[str] = field(default_factory=list)


def table(caption: str, df: pl.DataFrame, max_rows: int = MAX_TABLE_ROWS, status_col: str | None = None) -> Table:
    numeric = [dtype.is_numeric() for dtype in df.dtypes]
    shown = df.head(max_rows)
    rows = [[_cell(v) for v in row] for row in shown.iter_rows()]
    classes = [f"status-{s}" for s in shown[status_col].cast(pl.String).fill_null("").to_list()] if status_col else []
    return Table(caption, list(df.columns), rows, numeric, max(df.height - max_rows, 0), classes)


@dataclass
class ViewData:
    id: str
    title: str
    caption: str
    empty_reason: str | None
    figures: list[Markup]
    tables: list[Table]


_REST = re.compile(r":[a-z]+:`~?([^`]*)`|``([^`]*)``|`([^`]*)`")


def prose(text: str | None) -> str | None:
    """Code-written prose (a view's title and caption, often lifted from a docstring) without its reST
    markup: ``x``, `x` and :func:`x` read as x. Never applied to input text, which shows as written."""
    return None if text is None else _REST.sub(lambda m: next(g for g in m.groups() if g is not None), text)


def _view_data(view: View) -> ViewData:
    vid = _anchor(view.id)
    figures = [] if view.empty_reason else [figure_html(f, f"{vid}-fig{i}") for i, f in enumerate(view.figures)]
    tables = [] if view.empty_reason else [table(prose(cap) or "", df) for cap, df in view.tables]
    return ViewData(vid, prose(view.title) or "", prose(view.caption) or "", prose(view.empty_reason), figures, tables)


# --- first screen ------------------------------------------------------------------------------------


def _duration(ns: int) -> str:
    s = ns / 1e9
    if s < 1:
        return f"{s * 1e3:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    return f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def _listing(items: list[str], limit: int) -> str:
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _ranks_line(run: dict[str, Any]) -> str:
    seen, world = run["ranks"], run["world_size"]
    text = f"{len(seen)} seen" + (f" of {world} (world size from {run['world_size_source']})" if world else "")
    if run["ranks_missing"]:
        text += f"; no data for rank(s) {_listing([str(r) for r in run['ranks_missing']], 16)}"
    return text


def _steps_line(analysis: Analysis) -> str:
    steps = analysis.frames["steps"]
    if steps.height == 0:
        return "none marked in the traces"
    ids = sorted(set(steps["step"].drop_nulls().to_list()))
    n = len(ids)
    span = f" (step {ids[0]} to {ids[-1]})" if n > 1 else f" (step {ids[0]})" if n else ""
    return f"{n} profiled step(s){span}"


def _wall_line(analysis: Analysis) -> str:
    window = trace_window(analysis.frames)
    if window is None:
        return "unknown (no profiled steps)"
    lo, hi = window
    start = datetime.fromtimestamp(lo / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{_duration(hi - lo)} of profiled steps, from {start}"


def _few(ignored: list[dict[str, Any]], limit: int = 3) -> str:
    """The ignored files themselves when there are only a few: ": a.txt (not a trace); ..."."""
    if not ignored or len(ignored) > limit:
        return ""
    return ": " + "; ".join(f"{s['path']} ({s['reason'] or s['status']})" for s in ignored)


def job_header(analysis: Analysis, run: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, plain text) rows of the job header, first screen."""
    hosts = run["hosts"]
    host_text = f"{len(hosts)} seen" + (f" of {run['hosts_expected']} expected" if run["hosts_expected"] else "")
    if hosts:
        host_text += ": " + _listing(hosts, 12)
    gpus, world = run["gpus"], run["world_size"]
    gpu_text = f"{len(gpus)} identified by PCI bus id" + (f", {world} expected (one per rank)" if world else "")
    ignored = run["sources_ignored"]
    return [
        ("Ranks", _ranks_line(run)),
        ("Hosts", host_text),
        ("GPUs", gpu_text),
        ("Steps", _steps_line(analysis)),
        ("Wall time", _wall_line(analysis)),
        ("GPU time", analysis.context.coverage["line"]),
        ("Sources", f"{run['sources_used']} file(s) used, {len(ignored)} ignored or unreadable" + _few(ignored)),
        ("Tool", f"forensics {__version__}"),
    ]


# --- incidents and findings ---------------------------------------------------------------------------


def _hours(hours: float | None) -> str | None:
    """GPU-hours for a reader: 2 decimals; below 0.01 the GPU-seconds, not a 5e-06."""
    if hours is None:
        return None
    return f"{hours:.2f} GPU-hours" if hours >= 0.01 else f"< 0.01 GPU-hours ({hours * 3600:.3g} GPU-s)"


def _incident_data(inc: Incident) -> dict[str, Any]:
    return {
        "id": inc.id, "title": inc.title, "severity": inc.severity.value, "verdict": inc.verdict,
        "summary": inc.summary, "confidence": inc.confidence, "findings": list(inc.findings),
        "gpu_hours": _hours(inc.gpu_hours_lost),
    }


def _evidence_table(f: Finding) -> Table | None:
    if not f.evidence:
        return None
    rows = [{k: _cell(v) for k, v in row.items()} for row in list(f.evidence)[:MAX_EVIDENCE_ROWS]]
    df = pl.DataFrame(rows, infer_schema_length=None)
    t = table("evidence", df)
    t.more = max(len(f.evidence) - MAX_EVIDENCE_ROWS, 0)
    t.numeric = [all(_is_number(r[i]) for r in t.rows) for i in range(len(t.columns))]
    return t


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return text == ""
    return True


def _finding_data(f: Finding, views: dict[str, ViewData]) -> dict[str, Any]:
    target = views.get(view_for(f.detector) or "")
    return {
        "id": f.id, "detector": f.detector, "severity": f.severity.value, "title": f.title, "scope": f.scope,
        "summary": f.summary, "remediation": f.remediation, "confidence": f.confidence, "incident": f.incident,
        "lost": f"{f.gpu_seconds_lost:.1f}" if f.gpu_seconds_lost else None,
        "metrics": [(k, _cell(v)) for k, v in f.metrics.items()],
        "evidence": _evidence_table(f), "n_evidence": len(f.evidence),
        "view": None if target is None or target.empty_reason else (target.id, target.title),
    }


# --- job tables ----------------------------------------------------------------------------------------


def _ranks_table(analysis: Analysis) -> Table:
    ranks = analysis.frames["ranks"]
    cols = [c for c in ranks.columns if c != "source"]
    return table("one row per traced process, by rank", ranks.select(cols).sort("rank", nulls_last=True),
                 max_rows=MAX_RANK_ROWS)


def _gpus_table(run: dict[str, Any]) -> Table:
    df = pl.DataFrame(
        {"gpu": [f"{g['host']}:{g['pci_bus_id']}" for g in run["gpus"]], "rank": [g["rank"] for g in run["gpus"]]},
        schema={"gpu": pl.String, "rank": pl.Int64},
    )
    return table("GPUs as host:PCI bus id, with the rank that drove each", df.sort("rank", "gpu", nulls_last=True),
                 max_rows=MAX_RANK_ROWS)


def _sources_table(analysis: Analysis) -> Table:
    src = analysis.sources.select("path", "kind", "rank", "host", "status", pl.col("message").alias("why / message"))
    order = pl.col("status").replace_strict({"failed": 0, "partial": 1, "ignored": 2}, default=3, return_dtype=pl.Int8)
    src = src.sort(order, "path")
    return table("every file found: damaged and ignored ones first, each with why", src, max_rows=MAX_TABLE_ROWS * 2,
                 status_col="status")


def _skipped_table(analysis: Analysis) -> Table:
    df = pl.DataFrame([s.to_json() for s in analysis.skipped], schema={"detector": pl.String, "reason": pl.String})
    return table("detectors that could not run on these inputs, and why", df)


def _last_words(analysis: Analysis) -> dict[str, Any] | None:
    """The "Last words" section: the tracebacks per failing rank (collapsed), the launcher's failure table, the
    scheduler's messages, the stack groups."""
    lw = last_words_summary(analysis)
    if lw is None:
        return None
    first = lw["first"]
    return {"first": None if first is None else {"title": first.title, "summary": first.summary, "id": first.id},
            "ranks": lw["ranks"], "scheduler": lw["scheduler"], "sigterms": lw["sigterms"],
            "launcher": table("torchrun / launcher failure records (Root Cause = first_observed)", lw["launcher"])
            if lw["launcher"].height else None,
            "stacks": table("main-thread stacks grouped across processes (innermost 6 frames)", lw["stacks"])
            if lw["stacks"].height else None}


def context(analysis: Analysis) -> dict[str, Any]:
    """Everything the template shows, as plain data."""
    run = run_header(analysis)
    views = [_view_data(v) for v in build_views(analysis)]
    by_id = {v.id: v for v in views}
    return {
        "name": analysis.run_dir.name,
        "path": str(analysis.run_dir),
        "incidents": [_incident_data(i) for i in analysis.incidents],
        "last_words": _last_words(analysis),
        "header": job_header(analysis, run),
        "findings": [_finding_data(f, by_id) for f in analysis.findings],
        "views": views,
        "ranks": _ranks_table(analysis),
        "gpus": _gpus_table(run),
        "sources": _sources_table(analysis),
        "skipped": _skipped_table(analysis),
        "version": __version__,
    }


def _page(analysis: Analysis) -> str:
    """The page with :data:`PLOTLY_JS_SLOT` where plotly.js goes (only when a figure needs it)."""
    data = context(analysis)
    has_figures = any(v.figures for v in data["views"])
    return ENV.get_template("report.html.j2").render(**data, plotly_js=PLOTLY_JS_SLOT if has_figures else None)


def render(analysis: Analysis) -> str:
    # plotly.js is code we ship, not input: it goes in as it is, once
    return _page(analysis).replace(PLOTLY_JS_SLOT, plotly_js(), 1)


def report_writer(analysis: Analysis) -> Callable[[Path], None]:
    """What writes ``render_bytes(analysis)`` to a path: the page rendered now, plotly.js copied from plotly's own
    file while writing (:func:`forensics.reports.figures.copy_plotly_js`), never held in memory."""
    head, slot, tail = _page(analysis).partition(PLOTLY_JS_SLOT)
    before, after = head.encode("utf-8"), tail.encode("utf-8")

    def write(path: Path) -> None:
        with open(path, "wb") as fh:
            fh.write(before)
            if slot:
                copy_plotly_js(fh)
            fh.write(after)

    return write


def render_bytes(analysis: Analysis) -> bytes:
    """``render(analysis).encode("utf-8")``, without building and encoding the 5 MB string (triage sends the page
    back as bytes; ``analyze`` writes it with :func:`report_writer`)."""
    head, slot, tail = _page(analysis).partition(PLOTLY_JS_SLOT)
    return b"".join([head.encode("utf-8"), plotly_js_bytes() if slot else b"", tail.encode("utf-8")])
