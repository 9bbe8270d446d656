"""Renderers are pure functions of an Analysis: test them on hand-built findings."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import orjson
import polars as pl
from forensics.reports import html as html_report
from forensics.reports import json_report, markdown

from forensics.base import frames as fr
from forensics.base.findings import Finding, Severity, Skipped, sort_findings
from forensics.facts.context import JobContext
from forensics.pipeline import Analysis
from tests.conftest import assert_valid_findings


def _analysis() -> Analysis:
    sources = fr.conform(
        "sources",
        pl.DataFrame(
            {
                "path": ["n1_1.1.pt.trace.json.gz", "bad.json"],
                "kind": ["kineto", "kineto"],
                "rank": [3, None],
                "host": ["n1", None],
                "status": ["ok", "failed"],
                "message": [None, "not JSON: unexpected character at byte 0"],
            }
        ),
    )
    steps = pl.DataFrame({"rank": [3, 3], "host": ["n1", "n1"], "step": [1, 2], "start_ns": [0, 10_000_000],
                          "end_ns": [10_000_000, 30_000_000]})
    ranks = pl.DataFrame({"rank": [3], "world_size": [8], "host": ["n1"]})
    frames = fr.JobFrames({"sources": sources, "steps": steps, "ranks": ranks})
    findings = [
        Finding("straggler", Severity.INFO, "minor", "s", "r", kind="slow_rank", ranks=(1,)),
        Finding(
            "gpu_hw_error", Severity.CRITICAL, "Xid 79 <GPU fell off the bus>", "GPU 0000:3b:00.0 on n1 fell off the bus",
            "drain the node", ranks=(3,), hosts=("n1",), gpus=("0000:3b:00.0",), metrics={"xid": 79, "nan": float("nan")},
            evidence=({"line": 12, "text": "NVRM: Xid (PCI:0000:3b:00): 79"},), gpu_seconds_lost=12.5,
        ),
    ]
    return Analysis(Path("/runs/job42"), JobContext(frames), sort_findings(findings), [Skipped("busy_wait", "needs kernels")])


def test_findings_json_validates_and_is_deterministic(findings_validator):
    a = _analysis()
    doc = assert_valid_findings(findings_validator, orjson.loads(json_report.render(a)))
    assert json_report.render(a) == json_report.render(_analysis())
    assert doc["run"]["ranks"] == [3] and doc["run"]["hosts"] == ["n1"] and doc["run"]["world_size"] == 8
    assert doc["run"]["steps_analyzed"] == 2
    crit = next(f for f in doc["findings"] if f["detector"] == "gpu_hw_error")
    assert crit["metrics"]["nan"] is None  # NaN is not JSON
    assert crit["id"] == Finding("gpu_hw_error", Severity.WARNING, "other title", "", "", ranks=(3,), hosts=("n1",),
                                 gpus=("0000:3b:00.0",)).id


def test_markdown_lists_findings_worst_first_and_damaged_inputs():
    md = markdown.render(_analysis())
    assert md.index("[info] minor") > md.index("[critical] Xid 79")
    assert "bad.json" in md and "not JSON" in md
    assert "- busy\\_wait: needs kernels" in md


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.external: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        for key, value in attrs:
            if key in ("src", "href") and value and re.match(r"(https?:)?//", value):
                self.external.append(value)

    def handle_data(self, data):
        self.text.append(data)


def test_html_is_self_contained_escaped_and_attachable():
    from forensics.reports.views import build_views

    analysis = _analysis()
    page = html_report.render(analysis)
    parser = _Collector()
    parser.feed(page)
    assert parser.external == []  # works offline: nothing fetched
    assert "<GPU fell off the bus>" not in page and "&lt;GPU fell off the bus&gt;" in page
    assert sum(len(v.figures) for v in build_views(analysis)) > 0  # steps without kernels still draw
    assert page.count("* plotly.js v") == 1  # inlined once
    assert len(page.encode()) < 6_000_000


# --- input text is never markup (issue #13.6) ---------------------------------------------------------

HOSTILE = ["a[b](http://x)<script>|`c`", "*bold* _em_ **x** ~~s~~ {code} ^sup^", "# head\n- item\n1. one", "&lt; \\ |", "k<T>::run[0]!"]


def _md_html(text: str) -> str:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").enable("table").render(text)


def test_md_text_renders_as_the_text_itself():
    import html as html_mod

    for raw in HOSTILE:
        rendered = _md_html(markdown.md_text(raw))
        flat = " ".join(raw.split())
        # one paragraph whose text is the input (newlines folded), with no element inside it
        assert rendered == f"<p>{html_mod.escape(flat, quote=True)}</p>\n", (raw, rendered)


def test_markdown_table_cells_with_pipes_and_html_stay_in_their_cell():
    from html.parser import HTMLParser

    df = pl.DataFrame({"na|me": HOSTILE, "n": list(range(len(HOSTILE)))})
    rendered = _md_html("\n".join(markdown.markdown_table(df)))

    class Cells(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.cells: list[str] = []
            self.tags: set[str] = set()
            self._in = False

        def handle_starttag(self, tag, attrs):
            self.tags.add(tag)
            if tag in ("td", "th"):
                self._in, self.cells = True, [*self.cells, ""]

        def handle_endtag(self, tag):
            self._in = self._in and tag not in ("td", "th")

        def handle_data(self, data):
            if self._in:
                self.cells[-1] += data

    parser = Cells()
    parser.feed(rendered)
    assert parser.tags <= {"table", "thead", "tbody", "tr", "th", "td"}  # no link, code, emphasis or script
    expected = ["na|me", "n"] + [c for i, raw in enumerate(HOSTILE) for c in (" ".join(raw.split()), str(i))]
    assert parser.cells == expected


def test_findings_with_hostile_names_render_as_text_in_markdown_and_html():
    a = _analysis()
    name = "ncclKernel<|`x`|>[0](javascript:alert(1))"
    a.findings.append(Finding("straggler", Severity.WARNING, f"slow kernel {name}", f"kernel {name} on host h[1]|<b>", "check",
                              kind="slow_rank", ranks=(2,), hosts=("h[1]|<b>",)))
    md = markdown.render(a)
    rendered = _md_html(md)
    assert "<b>" not in rendered and "href" not in rendered and "<a " not in rendered
    assert "ncclKernel&lt;|`x`|&gt;[0](javascript:alert(1))" in rendered  # shown as text
    assert "<code>" not in rendered
    page = html_report.render(a)
    assert name not in page and "ncclKernel&lt;|`x`|&gt;[0](javascript:alert(1))" in page
    assert "h[1]|&lt;b&gt;" in page
