"""The report's figures as plain data (reports/figures.py): exactly what plotly's own validation makes of them,
so the page draws what a ``go.Figure`` would have drawn, without paying for the validation on every job."""

from __future__ import annotations

import json
import re
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio
import pytest
from forensics.reports.figures import Figure, colorscale, figure_html, page_figure, plotly_template, plotly_white
from forensics.reports.views import build_views

from forensics.base.findings import Finding, Severity
from forensics.base.frames import JobFrames
from forensics.facts.context import JobContext
from forensics.pipeline import Analysis, analyze
from tests.conftest import ROOT, shared_path
from tests.frame_builders import MS, dp_job

SAMPLES = sorted(p for p in (ROOT / "sample_traces").iterdir() if p.is_dir())


def _validated(fig: dict) -> dict:
    """plotly's validated form of ``fig`` (every property checked and coerced by its validator)."""
    return go.Figure(fig).to_plotly_json()


def _assert_views_validate(analysis: Analysis) -> int:
    n = 0
    for view in build_views(analysis):
        for i, fig in enumerate(view.figures):
            shown = page_figure(fig)
            assert _validated(shown) == shown, f"{view.id} figure {i}: plotly would draw something else"
            n += 1
    return n


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_every_figure_of_every_view_is_already_in_plotly_validated_form(sample: Path):
    assert _assert_views_validate(analyze(sample, workers=1)) >= 5


def test_hardware_events_figures_with_marks_validate():
    """The shared dmesg folder: wall-clock and since-boot lanes, marks as shapes and annotations."""
    analysis = analyze(shared_path("dmesg"), workers=1)
    assert _assert_views_validate(analysis) >= 1


def test_host_level_bars_and_culprits_validate():
    """Above 64 ranks the anatomy draws per host, outliers apart; a straggler finding marks its rank."""
    frames, _ = dp_job(n_ranks=80, steps=3, slow={5: 1.3}, clock_offset={1: 3 * MS}, seq=True)
    straggler = Finding("straggler", Severity.WARNING, "Straggler", "s", "r", kind="slow_rank", ranks=(5,))
    analysis = Analysis(Path("job"), JobContext(JobFrames({n: frames[n] for n in frames.present})), [straggler])
    assert _assert_views_validate(analysis) >= 5


def test_builder_writes_plotly_forms():
    fig = Figure().add_bar(x=["a"], y=[1.0], name="n", marker_color="#fff")
    fig.update_layout(title="t", xaxis_title="x", margin=dict(t=1), legend=dict(orientation="h", y=-0.2))
    fig.update_layout(margin=dict(b=2)).update_xaxes(type="category").update_yaxes(title="y")
    fig.add_heatmap(z=[[1.0, None]], colorscale=colorscale("Viridis"), colorbar=dict(title="ms"))
    fig.add_shape(type="line", x0=0, x1=0, y0=0, y1=1, yref="paper", line=dict(color="#b00020", dash="dot"))
    fig.add_annotation(x=0, y=1, yref="paper", text="m", showarrow=False)
    assert fig == {
        "data": [
            {"type": "bar", "x": ["a"], "y": [1.0], "name": "n", "marker": {"color": "#fff"}},
            {"type": "heatmap", "z": [[1.0, None]], "colorscale": colorscale("Viridis"),
             "colorbar": {"title": {"text": "ms"}}},
        ],
        "layout": {
            "title": {"text": "t"}, "xaxis": {"title": {"text": "x"}, "type": "category"},
            "yaxis": {"title": {"text": "y"}}, "margin": {"t": 1, "b": 2}, "legend": {"orientation": "h", "y": -0.2},
            "shapes": [{"type": "line", "x0": 0, "x1": 0, "y0": 0, "y1": 1, "yref": "paper",
                        "line": {"color": "#b00020", "dash": "dot"}}],
            "annotations": [{"x": 0, "y": 1, "yref": "paper", "text": "m", "showarrow": False}],
        },
    }
    page = page_figure(fig)
    assert _validated(page) == page
    reference = go.Figure(go.Heatmap(colorscale="Viridis")).to_plotly_json()["data"][0]["colorscale"]
    assert colorscale("Viridis") == [list(stop) for stop in reference]


def _newplot_args(markup: str) -> list:
    call = re.search(r'Plotly\.newPlot\(\s*"[^"]+",\s*(.*)\)\s*};', markup, re.S)
    assert call
    return json.loads(f"[{call.group(1)}]")


def test_figure_html_draws_a_plain_figure_as_plotly_io_draws_the_graph_object():
    """The same markup as plotly.io on the validated go.Figure with the page's template; the figure is untouched."""
    fig = Figure().add_bar(x=["</script><b>"], y=[2.0], name="k").update_layout(height=300, yaxis_title="ms")
    before = json.dumps(fig)
    mine = figure_html(fig, "f1")
    graph = go.Figure(fig).update_layout(template="plotly_white")
    theirs = pio.to_html(graph, include_plotlyjs=False, full_html=False, include_mathjax=False, div_id="f1",
                         default_height="380px", config={"displaylogo": False, "responsive": True})
    assert _newplot_args(mine) == _newplot_args(theirs)
    assert re.sub(r"\{.*\}", "", str(mine), flags=re.S) == re.sub(r"\{.*\}", "", theirs, flags=re.S)
    assert json.dumps(fig) == before and "template" not in fig["layout"]
    assert "</script><b>" not in mine and mine.count("<script") == mine.count("</script>")
    assert _newplot_args(mine)[1]["template"] == plotly_white()
    # a go.Figure (diff.html's waterfall) goes through the same function
    assert _newplot_args(figure_html(graph, "f1")) == _newplot_args(theirs)


def test_report_bytes_are_the_page_encoded_with_plotly_js_spliced_in_once():
    from forensics.reports import html as html_report
    from plotly.offline import get_plotlyjs

    analysis = analyze(ROOT / "sample_traces" / "xid79", workers=1)
    page = html_report.render(analysis)
    assert html_report.render_bytes(analysis) == page.encode("utf-8")
    assert page.count(get_plotlyjs()) == 1 and "<!-- plotly.js -->" not in page
    empty = Analysis(Path("job"), JobContext(JobFrames({})), [])  # no figure: no plotly.js at all
    assert html_report.render_bytes(empty) == html_report.render(empty).encode("utf-8")
    assert "Plotly" not in html_report.render(empty)


@pytest.mark.parametrize("name", ["plotly_white", "plotly"])
def test_the_template_read_from_plotly_s_json_is_the_validated_template(name: str):
    """report.html carries the template as read from plotly's JSON file (no validation at import): the same JSON,
    key order included, as plotly's validated template, so the page's bytes do not change. triage.html carries
    ``plotly``, the one a go.Figure has by default."""
    validated = pio.templates[name].to_plotly_json()
    assert json.dumps(plotly_template(name)) == json.dumps(validated)
    assert plotly_white() is plotly_template("plotly_white")


def test_diff_waterfall_is_the_go_figure_it_replaces_byte_for_byte():
    from types import SimpleNamespace

    from forensics.reports.diff_html import contributors_figure

    parts = [{"what": "waiting in NCCL for peers", "delta_ms": -11.492}, {"what": "GPU <idle> & co", "delta_ms": 0.1}]
    d = SimpleNamespace(contributors=parts, base_side=SimpleNamespace(step_ms=103.763))
    mine = contributors_figure(d)  # type: ignore[arg-type]
    reference = go.Figure(go.Waterfall(  # diff_html's figure before it stopped importing plotly's graph objects
        x=["BASE step", *[p["what"] for p in parts], "BASE + median delta"],
        y=[103.763, *[p["delta_ms"] for p in parts], 0.0],
        measure=["absolute", "relative", "relative", "total"],
        hovertemplate="%{x}: %{y:.3f} ms<extra></extra>",
    ))
    reference.update_layout(yaxis_title="ms per step (median over the aligned steps)", showlegend=False, height=380,
                            margin={"t": 20, "b": 120, "l": 60, "r": 10})
    assert mine is not None and figure_html(mine, "fig-delta") == figure_html(reference, "fig-delta")


def test_triage_timeline_is_the_go_figure_it_replaces_byte_for_byte():
    from datetime import datetime, timezone

    import polars as pl
    from forensics.reports.triage_html import script_json, timeline

    data = pl.DataFrame({
        "incident_id": ["a", "b", "c", None], "start_ns": [1_700_000_000_000_000_000, None, 1_700_000_100 * 10**9, 5],
        "severity": ["critical", "warning", "info", "info"], "job_id": ["j/1", "j<2>", "j3", "j4"],
        "incident_title": ["GPU fell off", "slow", "</script>", "x"], "gpu_hours_lost": [1.5, None, None, 0.0],
    })
    mine, undated = timeline(data)
    reference = go.Figure()  # triage_html's figure before it stopped importing plotly's graph objects
    for sev, t, h, text in [("critical", 1_700_000_000, 1.5, "j/1: GPU fell off"), ("info", 1_700_000_100, 0.0,
                                                                                    "j3: </script>")]:
        reference.add_scatter(
            x=[datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")], y=[h], mode="markers",
            name=sev, marker={"color": {"critical": "#b00020", "info": "#0b61a4"}[sev], "size": 9}, text=[text],
            hovertemplate="%{text}<br>%{y:.4g} GPU-hours<extra></extra>")
    reference.update_layout(title="Incidents over time (job start)",
                            xaxis={"title": "job start (UTC)", "type": "date"}, yaxis_title="GPU-hours lost",
                            margin={"t": 40, "b": 40, "l": 60, "r": 10}, height=360)
    assert undated == 1 and mine is not None
    assert str(script_json(mine)) == str(script_json(reference.to_plotly_json()))


def _plotly_io_html(fig: object, div_id: str) -> str:
    """What plotly.io writes for a figure as the page embeds it."""
    return pio.to_html(page_figure(fig), validate=False, include_plotlyjs=False, full_html=False,  # type: ignore[arg-type]
                       include_mathjax=False, div_id=div_id, default_height="380px",
                       config={"displaylogo": False, "responsive": True})


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_figure_html_writes_plotly_io_s_markup_byte_for_byte(sample: Path):
    """figure_html writes the markup itself (no plotly.io import): the very string plotly.io.to_html writes, for
    every figure of every view of the bundled samples."""
    n = 0
    for view in build_views(analyze(sample, workers=1)):
        for i, fig in enumerate(view.figures):
            div_id = f"{view.id}-fig{i}"
            assert str(figure_html(fig, div_id)) == _plotly_io_html(fig, div_id), div_id
            n += 1
    assert n >= 5


def test_figure_html_of_odd_figures_is_plotly_io_s_too():
    """A go.Figure, a pixel size, text that could end the script, and a value orjson does not write as it is
    (plotly.io cleans it first; figure_html then leaves it to plotly.io)."""
    from decimal import Decimal

    graph = go.Figure(go.Bar(x=["</script>\u2028"], y=[1], name="a")).update_layout(width=500, height=300)
    odd = Figure().add_bar(x=["a"], y=[Decimal("1.5")], name="n")
    for fig in (graph, odd, Figure().add_bar(x=[">/<"], y=[2.0], name="n").update_layout(height=250)):
        assert str(figure_html(fig, "f")) == _plotly_io_html(fig, "f")
