"""triage.html: jobs ranked by cost, drain candidates with their evidence, incidents over time, and a link
to each job's own report. One self-contained file (plotly.js inlined once, works offline), laid out by
templates/triage.html.j2 with autoescape: every name from the input is text, never markup."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

import orjson
import polars as pl
from forensics.reports.figures import Figure, plotly_template
from forensics.reports.triage_json import overview
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup
from plotly.offline import get_plotlyjs

from forensics import __version__
from forensics.fleet.state import SEVERITIES, job_ranking, recurring_culprits
from forensics.fleet.triage import TriageRun

_COLOURS = {"critical": "#b00020", "warning": "#e09000", "info": "#0b61a4"}


def _env() -> Environment:
    env = Environment(loader=PackageLoader("forensics.reports", "templates"),
                      autoescape=select_autoescape(["html", "j2"], default=True))
    env.filters["hours"] = lambda v: "" if v is None else f"{v:.4g}"
    env.filters["when"] = _when
    env.filters["href"] = lambda p: quote(p) if p else ""
    return env


def _when(ns: int | None) -> str:
    return "" if ns is None else datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def script_json(value: Any) -> Markup:
    """JSON for inside <script>: `<`, `>` and `&` as \\u escapes, so no name from the input can close
    the script element or open a comment."""
    text = orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY).decode()
    return Markup(text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


def timeline(data: pl.DataFrame) -> tuple[dict[str, Any] | None, int]:
    """The incidents-over-time figure (x: the job's start, y: GPU-hours lost, one trace per severity),
    and how many incidents have no date (not shown)."""
    inc = data.filter(pl.col("incident_id").is_not_null())
    dated = inc.filter(pl.col("start_ns").is_not_null())
    if dated.height == 0:
        return None, inc.height
    # what go.Figure gave, without importing plotly's graph objects (validators, narwhals): its default template
    # and keys in the order of plotly's validated JSON, so the page's bytes are the same
    fig = Figure()
    fig.layout["template"] = plotly_template("plotly")
    for sev in SEVERITIES:
        part = dated.filter(pl.col("severity") == sev)
        if part.height == 0:
            continue
        fig.add_scatter(
            hovertemplate="%{text}<br>%{y:.4g} GPU-hours<extra></extra>",
            marker={"color": _COLOURS[sev], "size": 9}, mode="markers", name=sev,
            text=[f"{j}: {t}" for j, t in zip(part["job_id"].to_list(), part["incident_title"].to_list())],
            x=[datetime.fromtimestamp(t / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
               for t in part["start_ns"].to_list()],
            y=[h if h is not None else 0.0 for h in part["gpu_hours_lost"].to_list()],
        )
    fig.update_layout(xaxis={"title": "job start (UTC)", "type": "date"}, margin={"t": 40, "b": 40, "l": 60, "r": 10},
                      title="Incidents over time (job start)", yaxis_title="GPU-hours lost", height=360)
    return fig.to_plotly_json(), inc.height - dated.height


def render(run: TriageRun) -> str:
    figure, undated = timeline(run.data)
    return _env().get_template("triage.html.j2").render(
        version=__version__,
        overview=overview(run),
        culprits=recurring_culprits(run.data).to_dicts(),
        jobs=job_ranking(run.data, run.analysed).to_dicts(),
        failed=[s for s in run.summaries if s.status == "failed"],
        skipped=run.found.skipped,
        figure=script_json(figure) if figure else None,
        undated=undated,
        plotlyjs=Markup(get_plotlyjs()) if figure else None,
    )
