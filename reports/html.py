"""report.html: one self-contained file (plotly.js inlined once, works offline).

Figures are built from small aggregate tables, never from raw events, so the file stays small
enough to attach to a ticket whatever the size of the traces.
"""

from __future__ import annotations

import html
from typing import Any

import orjson
import plotly.graph_objects as go
import polars as pl
from plotly.offline import get_plotlyjs

from forensics import __version__
from forensics.analyze import Analysis
from forensics.incidents import verdict_text
from forensics.runinfo import header_lines, run_header
from forensics.tables import kernel_table, step_breakdown_table, step_table

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem;max-width:1200px;color:#1d1d1f}
h1{font-size:1.6rem}h2{margin-top:2rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.85rem;margin:.5rem 0}td,th{border:1px solid #ddd;padding:.25rem .5rem;text-align:left}
th{background:#f5f5f7}.sev-critical{color:#b00020;font-weight:600}.sev-warning{color:#a15c00;font-weight:600}
.sev-info{color:#0b61a4}.finding{border-left:4px solid #ccc;padding:.25rem 1rem;margin:1rem 0}
.finding.critical{border-color:#b00020}.finding.warning{border-color:#e09000}.finding.info{border-color:#0b61a4}
.status-failed{color:#b00020}.status-partial{color:#a15c00}code{background:#f5f5f7;padding:0 .2rem}
"""


def _esc(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3f}"
    return html.escape(str(value))


def _table(df: pl.DataFrame, max_rows: int = 500, status_col: str | None = None) -> str:
    if df.height == 0:
        return "<p><em>none</em></p>"
    out = ["<table><thead><tr>", *[f"<th>{_esc(c)}</th>" for c in df.columns], "</tr></thead><tbody>"]
    for row in df.head(max_rows).iter_rows(named=True):
        cls = f' class="status-{_esc(row[status_col])}"' if status_col else ""
        out.append(f"<tr{cls}>" + "".join(f"<td>{_esc(v)}</td>" for v in row.values()) + "</tr>")
    out.append("</tbody></table>")
    if df.height > max_rows:
        out.append(f"<p><em>{df.height - max_rows} more rows not shown</em></p>")
    return "".join(out)


def _script_json(value: Any) -> str:
    """JSON for inside <script>: `<`, `>` and `&` as \\u escapes, so no label from the input can
    close the script element or open a comment (they occur only inside JSON strings)."""
    text = orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY).decode()
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _figure(fig: go.Figure, div_id: str) -> str:
    spec = _script_json(fig.to_plotly_json())
    return (
        f'<div id="{div_id}" style="height:360px"></div>'
        f"<script>(function(){{var s={spec};Plotly.newPlot('{div_id}',s.data,s.layout,"
        f"{{displaylogo:false,responsive:true}});}})();</script>"
    )


def _findings_html(analysis: Analysis) -> str:
    if not analysis.findings:
        return "<p>No problems found by the detectors that could run.</p>"
    parts = []
    for f in analysis.findings:
        sev = f.severity.value
        lost = f" &middot; {f.gpu_seconds_lost:.1f} GPU-s lost" if f.gpu_seconds_lost else ""
        evidence = pl.DataFrame(list(f.evidence)[:50]) if f.evidence else pl.DataFrame()
        metrics = "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in f.metrics.items())
        parts.append(
            f'<div class="finding {sev}"><h3><span class="sev-{sev}">{sev.upper()}</span> {_esc(f.title)}</h3>'
            f"<p><em>{_esc(f.scope)}</em>{lost} &middot; <code>{_esc(f.id)}</code></p>"
            f"<p>{_esc(f.summary)}</p><p><strong>What to do:</strong> {_esc(f.remediation)}</p>"
            f"<details><summary>metrics and evidence</summary><table>{metrics}</table>"
            f"{_table(evidence) if evidence.width else ''}</details></div>"
        )
    return "".join(parts)


def _verdict_html(analysis: Analysis) -> str:
    """The same lines the CLI prints, worst first."""
    if not analysis.incidents:
        return "<p><strong>Verdict:</strong> no problems found by the detectors that could run.</p>"
    items = "".join(f'<li class="sev-{i.severity.value}">{_esc(verdict_text(i))}</li>' for i in analysis.incidents)
    return f"<h2>Verdict</h2><ul>{items}</ul>"


def _incidents_html(analysis: Analysis) -> str:
    parts = [f"<h2>Incidents ({len(analysis.incidents)})</h2>"] if analysis.incidents else []
    for i in analysis.incidents:
        lost = f" &middot; {i.gpu_hours_lost:.4g} GPU-hours lost" if i.gpu_hours_lost is not None else ""
        parts.append(f'<div class="finding {i.severity.value}"><h3>{_esc(i.title)}</h3>'
                     f"<p><code>{_esc(i.id)}</code> &middot; confidence {_esc(i.confidence)}{lost}</p>"
                     f"<p>{_esc(i.summary)}</p><p>findings: "
                     + ", ".join(f"<code>{_esc(fid)}</code>" for fid in i.findings) + "</p></div>")
    return "".join(parts)


def render(analysis: Analysis) -> str:
    steps = step_table(analysis.context)
    figures = []
    if steps.height:
        labels = [str(r) if r is not None else "?" for r in steps["rank"].to_list()]
        fig = go.Figure(go.Bar(x=labels, y=steps["mean_ms"].to_list(), name="mean step (ms)"))
        fig.update_layout(title="Mean step time per rank", xaxis_title="rank", yaxis_title="ms",
                          margin=dict(t=40, b=40, l=50, r=10))
        figures.append(_figure(fig, "fig-steps"))
    kernels = kernel_table(analysis.context)
    if kernels.height:
        fig = go.Figure()
        for cls in kernels["class"].unique(maintain_order=True).to_list():
            part = kernels.filter(pl.col("class") == cls)
            fig.add_bar(x=[str(r) for r in part["rank"].to_list()], y=part["total_ms"].to_list(), name=str(cls))
        fig.update_layout(barmode="stack", title="GPU busy time per rank by kernel class",
                          xaxis_title="rank", yaxis_title="ms", margin=dict(t=40, b=40, l=50, r=10))
        figures.append(_figure(fig, "fig-kernels"))
    skipped = pl.DataFrame([s.to_json() for s in analysis.skipped]) if analysis.skipped else pl.DataFrame()
    body = [
        f"<h1>forensics report: {_esc(analysis.run_dir.name)}</h1>",
        _verdict_html(analysis),
        "".join(f"<p>{_esc(line)}</p>" for line in header_lines(run_header(analysis))),
        f"<p>{analysis.sources.height} file(s) read. forensics {__version__}.</p>",
        _incidents_html(analysis),
        f"<h2>Findings ({len(analysis.findings)})</h2>",
        _findings_html(analysis),
        "<h2>Steps per rank</h2>",
        *figures,
        _table(steps),
        "<h2>Step breakdown per rank (median over steps)</h2>",
        _table(step_breakdown_table(analysis.context)),
        "<h2>Ranks</h2>",
        _table(analysis.frames["ranks"].drop("source")),
        "<h2>Sources</h2>",
        _table(analysis.sources.drop("parse_ns"), status_col="status"),
        "<h2>Detectors skipped</h2>",
        _table(skipped),
    ]
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>forensics: {_esc(analysis.run_dir.name)}</title><style>{_CSS}</style>"
        f"<script>{get_plotlyjs()}</script></head><body>{''.join(body)}</body></html>"
    )
