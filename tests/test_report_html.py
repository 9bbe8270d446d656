"""report.html structure (issue 16.1-16.3), without a browser: tests/test_report_browser.py opens it in chromium."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import jinja2
import plotly.graph_objects as go
import polars as pl
import pytest
from forensics.reports import html as html_report
from forensics.reports.views import View
from plotly.offline import get_plotlyjs

from forensics.base.findings import Finding, Severity
from forensics.pipeline import Analysis, analyze
from tests.conftest import ROOT

SAMPLES = sorted(p.name for p in (ROOT / "sample_traces").iterdir() if p.is_dir())
_CACHE: dict[str, Analysis] = {}


def _sample(name: str) -> Analysis:
    if name not in _CACHE:
        _CACHE[name] = analyze(ROOT / "sample_traces" / name, workers=1)
    return _CACHE[name]


def _visible_text(page: str) -> str:
    body = re.sub(r"<(script|style)\b.*?</\1>", " ", page, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", body))


def _table_column(page: str, section: str, column: int) -> list[str]:
    part = page[page.index(f'<section id="{section}"'):]
    body = part[part.index("<tbody>"):part.index("</tbody>")]
    return [html.unescape(re.findall(r"<td>(.*?)</td>", row)[column]) for row in re.findall(r"<tr[^>]*>(.*?)</tr>",
                                                                                            body)]


def test_every_sample_page_reads_as_prose(tmp_path: Path):
    """No reST or Markdown markup (``x``, `x`, :func:`x`) in what the reader sees; the verdict comes first."""
    assert SAMPLES, "no bundled samples"
    for name in SAMPLES:
        a = _sample(name)
        page = html_report.render(a)
        text = _visible_text(page)
        assert "`" not in text and not re.search(r":(func|class|attr|mod|meth):", text), name
        if a.incidents:
            assert text.index("Verdict") < text.index(html.unescape(a.incidents[0].verdict)) < text.index("Ranks")


def test_plotly_js_is_inlined_once_and_each_figure_through_plotly_io():
    a = _sample("ddp_straggler")
    page = html_report.render(a)
    marker = get_plotlyjs()[:300]
    assert page.count(marker) == 1
    n_figures = sum(len(v.figures) for v in html_report.build_views(a) if not v.empty_reason)
    assert n_figures > 0
    assert page.count('class="plotly-graph-div"') == n_figures
    # nothing is loaded from anywhere: no script or stylesheet by URL (plotly's MathJax and CDN are off)
    assert not re.search(r"<(script|link|img|iframe)\b[^>]*\b(src|href)=", page)


def _fake_views(label: str) -> list[View]:
    fig = go.Figure(go.Bar(x=[label], y=[1], name=label))
    return [
        View("rank-step-heatmap", "Step time per rank and step", "caption with ``markup`` and :func:`x`",
             figures=[fig], tables=[("cells", pl.DataFrame({"name": [label, "b"], "ms": [2.0, 10.0]}))]),
        View("hw-events", "Hardware events", "c", empty_reason="no kernel log in the inputs"),
    ]


def test_findings_link_to_their_view_only_when_it_shows_something(monkeypatch: pytest.MonkeyPatch):
    a = _sample("xid79")
    monkeypatch.setattr(html_report, "build_views", lambda analysis: _fake_views("x"))
    straggler = Finding("straggler", Severity.WARNING, "slow", "s", "r", kind="slow_rank", ranks=(1,))
    a.findings.append(straggler)
    try:
        page = html_report.render(a)
    finally:
        a.findings.pop()
    card = page[page.index(f'id="f-{straggler.id}"'):]
    card = card[:card.index("</article>")]
    assert 'href="#rank-step-heatmap"' in card and f'href="#ev-{straggler.id}"' not in card  # no evidence: no link
    hw = next(f for f in a.findings if f.detector == "gpu_hw_error")
    card = page[page.index(f'id="f-{hw.id}"'):]
    card = card[:card.index("</article>")]
    assert "#hw-events" not in card  # the view is empty: no link to it
    assert f'href="#ev-{hw.id}"' in card and f'id="ev-{hw.id}"' in card  # evidence link and its target
    assert "Nothing to show: no kernel log in the inputs." in page
    text = _visible_text(page)
    assert "caption with markup and x" in text  # reST from a view's caption does not reach the reader


def test_figure_labels_and_table_cells_cannot_close_the_script(monkeypatch: pytest.MonkeyPatch):
    label = "</script><script>alert(1)</script><!--"
    monkeypatch.setattr(html_report, "build_views", lambda analysis: _fake_views(label))
    page = html_report.render(_sample("xid79"))
    assert label not in page and "alert(1)" in page
    assert "&lt;/script&gt;&lt;script&gt;alert(1)" in page  # the table cell, escaped by the template
    assert page.count("<script") == page.count("</script>")


def test_tables_are_sortable_ranks_sorted_gpus_as_host_bus_id_and_sources_say_why(tmp_path: Path):
    a = _sample("xid79")
    page = html_report.render(a)
    ranks = [int(r) for r in _table_column(page, "ranks", 0)]
    assert ranks == sorted(a.frames["ranks"]["rank"].to_list())
    gpus = _table_column(page, "gpus", 0)
    ident = a.context.identity.filter(pl.col("bus_id").is_not_null())
    assert sorted(gpus) == sorted({f"{h}:{b}" for h, b in zip(ident["host"], ident["bus_id"])})
    assert page.count('<table class="sortable">') >= 3 and "table.sortable" in page  # the inline sorter
    # an ignored file is listed with its reason
    run = tmp_path / "run"
    run.mkdir()
    for f in (ROOT / "sample_traces" / "xid79" / "kernel").rglob("*"):
        if f.is_file():
            (run / f.name).write_bytes(f.read_bytes())
    (run / "notes.txt").write_text("not a trace\n")
    b = analyze(run, workers=1)
    row = b.sources.filter(pl.col("path") == "notes.txt").row(0, named=True)
    assert row["status"] == "ignored" and row["message"]
    page = html_report.render(b)
    paths, statuses, whys = (_table_column(page, "sources", i) for i in (0, 4, 5))
    i = paths.index("notes.txt")
    assert (statuses[i], whys[i]) == ("ignored", row["message"])


def _shipped_jinja2() -> str | None:
    return json.loads(html_report.TEMPLATE_CODE.read_text()).get("jinja2")


def _env_like_report(cache: jinja2.BytecodeCache | None) -> jinja2.Environment:
    env = jinja2.Environment(loader=html_report.ENV.loader, autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, bytecode_cache=cache)
    env.filters.update(html_report.ENV.filters)
    return env


def test_report_pages_run_the_shipped_template_code_and_render_the_same_bytes():
    """report.html's templates run the code shipped in templates/compiled.json (no parse, no code generation per
    run) when this Jinja2 generated it; the page is byte for byte what the templates compiled from source give."""
    if _shipped_jinja2() != jinja2.__version__:
        pytest.skip(f"compiled.json is Jinja2 {_shipped_jinja2()}'s code, this is {jinja2.__version__}: "
                    "the templates are compiled from source (run `forensics docs`)")
    cache = html_report.ShippedTemplateCode()
    for name in html_report.COMPILED_TEMPLATES:
        source, filename, _ = html_report.ENV.loader.get_source(html_report.ENV, name)
        assert cache.get_bucket(html_report.ENV, name, filename, source).code is not None, name
    a = _sample("ddp_straggler")
    shipped, fresh = _env_like_report(cache), _env_like_report(None)
    data = html_report.context(a)
    pages = [env.get_template("report.html.j2").render(**data, plotly_js=None) for env in (shipped, fresh)]
    assert pages[0] == pages[1] and "Verdict" in pages[0]


def test_an_edited_template_or_another_jinja2_compiles_from_source(tmp_path: Path):
    shipped = json.loads(html_report.TEMPLATE_CODE.read_text())
    name = "report.html.j2"
    source, filename, _ = html_report.ENV.loader.get_source(html_report.ENV, name)
    edited = source.replace("Verdict", "Verdict!")
    path = tmp_path / "compiled.json"
    for version, text in ((jinja2.__version__, edited), ("0.0", source)):
        path.write_text(json.dumps({**shipped, "jinja2": version}))
        bucket = html_report.ShippedTemplateCode(path).get_bucket(html_report.ENV, name, filename, text)
        assert bucket.code is None, version
    path.write_text(json.dumps({**shipped, "jinja2": jinja2.__version__}))
    assert html_report.ShippedTemplateCode(path).get_bucket(html_report.ENV, name, filename, source).code is not None
    assert html_report.ShippedTemplateCode(tmp_path / "none.json").get_bucket(
        html_report.ENV, name, filename, source).code is None
    # an edited report.html.j2 renders its edit (compiled from source), with the shipped cache in place
    env = _env_like_report(html_report.ShippedTemplateCode())
    env.loader = jinja2.DictLoader({name: "{{ x }}!"})
    assert env.get_template(name).render(x="<a>") == "&lt;a&gt;!"


def test_report_writer_writes_the_rendered_bytes_with_plotly_js_streamed(tmp_path: Path):
    a = _sample("ddp_straggler")
    path = tmp_path / "report.html"
    html_report.report_writer(a)(path)
    assert path.read_bytes() == html_report.render_bytes(a) == html_report.render(a).encode("utf-8")
