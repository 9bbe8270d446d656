"""report.html in a real browser (Debian's chromium through playwright; see tests/browser.py).

The incident samples open without a console error, draw every figure, show the verdict on the first
screen (1280x800), make no network request, and input text with HTML/script payloads stays text.
"""

from __future__ import annotations

import json
from pathlib import Path

import plotly.graph_objects as go
import polars as pl
import pytest
from forensics.reports import html as html_report
from forensics.reports.views import View, build_views

from forensics.base.findings import Finding, Severity
from forensics.pipeline import Analysis, analyze
from tests.browser import VIEWPORT, open_page  # noqa: F401  (pytest fixture)
from tests.conftest import ROOT

SAMPLES = ("xid79", "ddp_straggler")
KERNEL_PAYLOADS = ("<script>alert(1)</script>", "</script><img src=x onerror=alert(1)>")
# a file name cannot hold "/": the payloads that fit one
FILE_PAYLOAD = "<img src=x onerror=alert(2)>"
DIR_PAYLOAD = "run<svg onload=alert(3)>"

_CACHE: dict[str, tuple[Analysis, Path]] = {}


def _report(name: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Analysis, Path]:
    if name not in _CACHE:
        analysis = analyze(ROOT / "sample_traces" / name, workers=1)
        path = tmp_path_factory.mktemp(name) / "report.html"
        path.write_text(html_report.render(analysis), encoding="utf-8")
        _CACHE[name] = analysis, path
    return _CACHE[name]


def _expected_figures(analysis: Analysis) -> int:
    return sum(len(v.figures) for v in build_views(analysis) if not v.empty_reason)


@pytest.mark.parametrize("sample", SAMPLES)
def test_incident_report_opens_clean_draws_every_figure_and_shows_the_verdict_first(
        sample: str, open_page, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory):  # noqa: F811
    analysis, path = _report(sample, tmp_path_factory)
    assert analysis.incidents, f"{sample} is an incident sample"
    opened = open_page(path)
    page = opened.page
    page.wait_for_load_state("networkidle")
    opened.assert_clean()  # no console error, no exception, no dialog, no request beyond file:
    figures = page.locator("div.plotly-graph-div")
    assert figures.count() == _expected_figures(analysis) > 0
    for i in range(figures.count()):
        assert figures.nth(i).locator(".plot-container svg.main-svg").count() >= 1, f"figure {i} did not draw"
    # the first screen: the worst incident's verdict, then the job header, within 1280x800 without scrolling
    worst = analysis.incidents[0]
    line = page.locator("#verdict li").first
    assert line.inner_text().find(worst.verdict) >= 0
    for selector in ("#verdict li >> nth=0", "#job"):
        box = page.locator(selector).bounding_box()
        assert box is not None and box["y"] + min(box["height"], 60) <= VIEWPORT["height"], selector
    shot = opened.screenshot(tmp_path / f"{sample}-first-screen.png")
    assert shot.stat().st_size > 10_000


def _hostile_run(root: Path) -> Path:
    """A one-rank Kineto trace whose kernel names and file name are HTML/script payloads."""
    run = root / DIR_PAYLOAD
    run.mkdir()
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 1000}]
    events += [{"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": 10 + 200 * i, "dur": 100,
                "args": {"device": 0, "stream": 7, "correlation": i + 1}} for i, name in enumerate(KERNEL_PAYLOADS)]
    doc = {"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": events}
    (run / f"node1_42.{FILE_PAYLOAD}.pt.trace.json").write_text(json.dumps(doc))
    return run


def test_script_payloads_in_kernel_and_file_names_render_as_text(
        open_page, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: F811
    analysis = analyze(_hostile_run(tmp_path), workers=1)
    real = html_report.build_views
    # a view that charts and tabulates the names too (figure JSON inside a <script>, sortable table cells)
    hostile = View("hostile", "kernels", "by name", figures=[go.Figure(go.Bar(x=list(KERNEL_PAYLOADS), y=[1, 2]))],
                   tables=[("kernels", pl.DataFrame({"kernel": list(KERNEL_PAYLOADS), "ms": [1.0, 2.0]}))])
    monkeypatch.setattr(html_report, "build_views", lambda a: [*real(a), hostile])
    kernels = analysis.frames["kernels"]["name"].to_list()
    assert sorted(kernels) == sorted(KERNEL_PAYLOADS)  # the names come from the parsed trace
    # a finding that names them (title, summary, scope, evidence), as a detector's would
    analysis.findings.append(Finding("straggler", Severity.WARNING, f"slow kernel {kernels[0]}",
                                     f"kernel {kernels[1]} is slow", f"look at {kernels[0]}", kind="slow_rank", ranks=(0,),
                                     hosts=(kernels[1],), evidence=tuple({"kernel": k, "ms": 1.0} for k in kernels)))
    path = tmp_path / "report.html"
    path.write_text(html_report.render(analysis), encoding="utf-8")
    opened = open_page(path)
    page = opened.page
    page.wait_for_load_state("networkidle")
    page.locator("details").evaluate_all("ds => ds.forEach(d => d.open = true)")  # evidence visible too
    opened.assert_clean()  # no dialog: no payload ran
    assert page.locator("img, svg[onload]").count() == 0  # no element from the input
    # a script in <body> holds the names only as escaped JSON (\\u003c...), never as markup
    assert page.evaluate("() => [...document.body.querySelectorAll('script')].filter("
                         "s => /<(script|img)/i.test(s.textContent)).length") == 0
    text = page.locator("body").inner_text()
    for payload in (*KERNEL_PAYLOADS, FILE_PAYLOAD, DIR_PAYLOAD):
        assert payload in text, payload  # shown as written
    assert page.title() == f"forensics: {DIR_PAYLOAD}"
    assert page.get_by_text(f"slow kernel {KERNEL_PAYLOADS[0]}").first.is_visible()
    assert page.locator("#hostile .plot-container svg.main-svg").count() >= 1  # the chart of the names drew
    cells = page.locator("#hostile td").all_inner_texts()
    assert set(KERNEL_PAYLOADS) <= set(cells)


def test_the_recorder_sees_network_requests_console_errors_and_dialogs(open_page, tmp_path: Path):  # noqa: F811
    """The checks above can fail: a page that fetches, logs an error and alerts is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text('<img src="http://192.0.2.1/x.png"><script>console.error("boom"); alert(1)</script>')
    opened = open_page(bad)
    assert opened.dialogs == ["alert: 1"]
    assert "boom" in opened.console_errors
    assert any(url.startswith("http://192.0.2.1/") for url in opened.requests)
    with pytest.raises(AssertionError):
        opened.assert_clean()
