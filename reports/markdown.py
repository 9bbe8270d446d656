"""summary.md: the findings, worst first, and what was read, for pasting into a ticket."""

from __future__ import annotations

import re

import polars as pl

from forensics.analyze import Analysis
from forensics.findings import Finding
from forensics.incidents import verdict_text
from forensics.runinfo import header_lines, run_header
from forensics.tables import step_breakdown_table, step_table

# Characters that start markup in GitHub Markdown (CommonMark + tables, autolinks, HTML) or in Jira's
# wiki syntax. Each is backslash-escaped, which both render as the character itself.
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]<>()#+!|~^&])")
_LINE_START = re.compile(r"^(\s*)([-=]|\d+[.)])")


def md_text(value: object) -> str:
    """Text from the input (file, host, kernel, rank names), safe to put anywhere in Markdown: it is
    shown as written, never as a link, an HTML tag, a table cell border, code or emphasis."""
    text = " ".join(str(value).split())  # a newline would end a table row or a paragraph
    return _LINE_START.sub(lambda m: m.group(1) + "\\" + m.group(2), _MD_SPECIAL.sub(r"\\\1", text))


def _cell(value: object, float_digits: int) -> str:
    if isinstance(value, float):
        return f"{value:.{float_digits}f}"
    return "" if value is None else md_text(value)


def markdown_table(df: pl.DataFrame, float_digits: int = 2) -> list[str]:
    if df.height == 0:
        return ["_none_", ""]
    head = "| " + " | ".join(md_text(c) for c in df.columns) + " |"
    sep = "|" + "---|" * len(df.columns)
    rows = ["| " + " | ".join(_cell(v, float_digits) for v in row) + " |" for row in df.iter_rows()]
    return [head, sep, *rows, ""]


def _finding_lines(f: Finding) -> list[str]:
    lost = f" ({f.gpu_seconds_lost:.1f} GPU-s lost)" if f.gpu_seconds_lost else ""
    lines = [f"### [{f.severity.value}] {md_text(f.title)}{lost}", ""]  # no link: input cannot define [x]: refs
    if f.scope:
        lines += ["_" + md_text(f.scope) + "_", ""]
    return [*lines, md_text(f.summary), "", f"**What to do:** {md_text(f.remediation)}", ""]


def _head(analysis: Analysis) -> list[str]:
    """Title, the verdict (the lines the CLI prints), the run header, the incidents."""
    lines = [f"# forensics: {md_text(analysis.run_dir.name)}", ""]
    verdicts = [f"- {md_text(verdict_text(i))}" for i in analysis.incidents]
    lines += verdicts or ["No problems found by the detectors that could run."]
    lines.append("")
    n_ok = analysis.sources.filter(pl.col("status") == "ok").height
    n_bad = analysis.sources.filter(pl.col("status").is_in(["partial", "failed"])).height
    lines += [line + "  " for line in header_lines(run_header(analysis), md_text)]
    lines += [f"{analysis.sources.height} file(s): {n_ok} ok, {n_bad} partial or failed.", ""]
    return lines + _incidents_md(analysis)


def _incidents_md(analysis: Analysis) -> list[str]:
    if not analysis.incidents:
        return []
    lines = [f"## Incidents ({len(analysis.incidents)})", ""]
    for i in analysis.incidents:
        lost = f", {i.gpu_hours_lost:.4g} GPU-hours lost" if i.gpu_hours_lost is not None else ""
        lines += [f"### [{i.severity.value}] {md_text(i.title)} (confidence {i.confidence}{lost})", "",
                  md_text(i.summary), "", "Findings: " + ", ".join(f"`{fid}`" for fid in i.findings), ""]
    return lines


def render(analysis: Analysis, top: int = 20) -> str:
    lines = _head(analysis)
    bad = analysis.sources.filter(pl.col("status").is_in(["partial", "failed"]))
    lines.append(f"## Findings ({len(analysis.findings)})")
    lines.append("")
    if not analysis.findings:
        lines += ["No problems found by the detectors that could run.", ""]
    for f in analysis.findings[:top]:
        lines += _finding_lines(f)
    if len(analysis.findings) > top:
        lines += [f"... and {len(analysis.findings) - top} more in findings.json.", ""]
    if analysis.skipped:
        lines += ["## Detectors skipped", ""]
        lines += [f"- {md_text(s.detector)}: {md_text(s.reason)}" for s in analysis.skipped]
        lines.append("")
    if bad.height:
        lines += ["## Damaged inputs", ""]
        lines += markdown_table(bad.select("path", "kind", "status", "message"))
    lines += ["## Steps per rank", ""]
    lines += markdown_table(step_table(analysis.context))
    breakdown = step_breakdown_table(analysis.context)
    if breakdown.height:
        lines += ["## Step breakdown per rank (median over steps)", ""]
        lines += markdown_table(breakdown)
    return "\n".join(lines)
