"""summary.md is ticket-ready (issue 16.5): verdict first, incidents table, top evidence, skipped detectors,
damaged inputs; input text escaped for GitHub/Jira Markdown; under 60,000 characters whatever the job size."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import polars as pl
from forensics.reports import markdown

from forensics.base import frames as fr
from forensics.base.findings import Finding, Severity, Skipped, sort_findings
from forensics.facts.context import JobContext
from forensics.incidents import Incident, verdict_text
from forensics.pipeline import Analysis

HOSTILE = "k<script>alert(1)</script>|`x`[y](javascript:z)*a*_b_"
ALLOWED_TAGS = {"h1", "h2", "h3", "p", "ul", "li", "table", "thead", "tbody", "tr", "th", "td", "em", "strong", "br"}


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)

    def handle_data(self, data):
        self.text.append(data)


def _rendered(md: str) -> _Tags:
    from markdown_it import MarkdownIt

    parser = _Tags()
    parser.feed(MarkdownIt("commonmark").enable("table").render(md))
    return parser


def _huge(n_ranks: int = 1024, n_findings: int = 3000, n_bad: int = 2000, n_incidents: int = 60) -> Analysis:
    """A job far past any real size: every list in summary.md would overflow without its bounds."""
    hosts = [f"node{r // 8}-{HOSTILE}" for r in range(n_ranks)]
    paths = [f"profiler/{HOSTILE}-{i}.pt.trace.json" for i in range(n_bad)] + [f"r{r}.json" for r in range(n_ranks)]
    sources = fr.conform("sources", pl.DataFrame({
        "path": paths, "kind": ["kineto"] * len(paths), "rank": [None] * n_bad + list(range(n_ranks)),
        "host": [None] * n_bad + hosts, "status": ["failed"] * n_bad + ["ok"] * n_ranks,
        "message": [f"not JSON: {HOSTILE} " * 20] * n_bad + [None] * n_ranks,
    }))
    ranks = pl.DataFrame({"rank": list(range(n_ranks)), "world_size": [n_ranks] * n_ranks, "host": hosts})
    frames = fr.JobFrames({"sources": sources, "ranks": ranks})
    evidence = tuple({"kernel": HOSTILE * 10, "rank": r, "ms": 1.5, **{f"c{i}": HOSTILE for i in range(12)}}
                     for r in range(200))
    findings = [Finding("straggler", Severity.WARNING if i % 2 else Severity.CRITICAL, f"slow {HOSTILE} {i}",
                        f"summary {HOSTILE} " * 50, f"fix {HOSTILE} " * 30, kind="slow_rank", ranks=tuple(range(i % 50)),
                        hosts=(hosts[i % n_ranks],), evidence=evidence, key=str(i)) for i in range(n_findings)]
    incidents = [Incident(f"incident-{i}", f"incident {HOSTILE}", Severity.CRITICAL, findings[i].id,
                          (findings[i].id,), f"story {HOSTILE} " * 40, f"verdict {i} {HOSTILE} " * 20,
                          gpu_hours_lost=1.5, confidence="high") for i in range(n_incidents)]
    skipped = [Skipped(f"detector_{i}", f"needs {HOSTILE}") for i in range(30)]
    return Analysis(Path(f"/runs/{HOSTILE}"), JobContext(frames), sort_findings(findings), skipped, incidents)


def test_summary_of_a_huge_job_stays_ticket_sized_escaped_and_complete():
    a = _huge()
    md = markdown.render(a)
    assert len(md) < 60_000
    lines = md.splitlines()
    assert lines[2].replace("\\", "") == "- " + " ".join(verdict_text(a.incidents[0]).split())[:797].rstrip() + "..."
    for head in ("## Job", "## Incidents (60)", "## Findings (3000)", "## Detectors skipped", "## Damaged inputs (2000)"):
        assert head in md, head
    assert "Evidence (200 row(s), first 5):" in md
    assert "more in findings.json" in md
    rendered = _rendered(md)
    assert rendered.tags <= ALLOWED_TAGS, rendered.tags - ALLOWED_TAGS  # no link, code, image or script from the input
    text = "".join(rendered.text)
    assert HOSTILE in text  # shown as written


def test_summary_of_a_1024_rank_job_is_under_60k(tmp_path: Path):
    """A 1,024-rank job shape (all sources ok, 128 hosts) through the real header; a simulated one measured 1.x KB."""
    a = _huge(n_findings=5, n_bad=0, n_incidents=1)
    md = markdown.render(a)
    assert len(md) < 60_000
    assert "1024 rank(s) on 128 host(s)" in md.replace("\\", "")
    assert "## Damaged inputs" not in md


def test_every_cut_is_at_a_line_end_and_says_so():
    lines = [f"| {i} | {'x' * 50} |" for i in range(5000)]
    text = markdown._bounded(lines, 10_000)
    assert len(text) <= 10_000
    body, note = text.rsplit("\n\n", 1)
    assert body.splitlines() == lines[: len(body.splitlines())]  # whole lines only
    assert "cut here" in note


def test_top_evidence_of_the_worst_findings_is_a_table_of_escaped_cells():
    a = _huge(n_findings=3, n_bad=3, n_incidents=1)
    md = markdown.render(a)
    table = re.search(r"Evidence \(200 row\(s\), first 5\):\n\n(\|.*\n)+", md)
    assert table is not None
    rows = table.group(0).splitlines()[2:]
    assert len(rows) == 2 + 5  # header, separator, five rows
    assert rows[0].count(" | ") + 1 == markdown.EVIDENCE_COLUMNS


def test_numbers_in_cells_render_without_a_backslash():
    df = pl.DataFrame({"v": ["0.00918", "1. one", "-3"], "n": [1, 2, 3]})
    rendered = _rendered("\n".join(markdown.markdown_table(df)))
    cells = "".join(rendered.text).split()
    assert "0.00918" in cells and "-3" in cells and "\\" not in "".join(rendered.text)
