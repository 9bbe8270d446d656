"""summary.md: the findings, worst first, and what was read, for pasting into a ticket."""

from __future__ import annotations

import polars as pl

from forensics.analyze import Analysis
from forensics.incidents import verdict_text
from forensics.runinfo import header_lines, run_header
from forensics.tables import step_breakdown_table, step_table


def markdown_table(df: pl.DataFrame, float_digits: int = 2) -> list[str]:
    if df.height == 0:
        return ["_none_", ""]
    head = "| " + " | ".join(df.columns) + " |"
    sep = "|" + "---|" * len(df.columns)
    rows = []
    for row in df.iter_rows():
        cells = [
            f"{v:.{float_digits}f}" if isinstance(v, float) else ("" if v is None else str(v).replace("|", "\\|"))
            for v in row
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return [head, sep, *rows, ""]


def md_escape(text: str) -> str:
    """Input text is never markup: escape Markdown's inline syntax."""
    return "".join("\\" + c if c in "\\`*_[]<>#|" else c for c in text)


def _head(analysis: Analysis) -> list[str]:
    """Title, the verdict (the lines the CLI prints), the run header, the incidents."""
    lines = [f"# forensics: {md_escape(analysis.run_dir.name)}", ""]
    verdicts = [f"- {md_escape(verdict_text(i))}" for i in analysis.incidents]
    lines += verdicts or ["No problems found by the detectors that could run."]
    lines.append("")
    n_ok = analysis.sources.filter(pl.col("status") == "ok").height
    n_bad = analysis.sources.filter(pl.col("status").is_in(["partial", "failed"])).height
    lines += [md_escape(line) + "  " for line in header_lines(run_header(analysis))]
    lines += [f"{analysis.sources.height} file(s): {n_ok} ok, {n_bad} partial or failed.", ""]
    return lines + _incidents_md(analysis)


def _incidents_md(analysis: Analysis) -> list[str]:
    if not analysis.incidents:
        return []
    lines = [f"## Incidents ({len(analysis.incidents)})", ""]
    for i in analysis.incidents:
        lost = f", {i.gpu_hours_lost:.4g} GPU-hours lost" if i.gpu_hours_lost is not None else ""
        lines += [f"### [{i.severity.value}] {md_escape(i.title)} (confidence {i.confidence}{lost})", "",
                  md_escape(i.summary), "", "Findings: " + ", ".join(f"`{fid}`" for fid in i.findings), ""]
    return lines


def render(analysis: Analysis, top: int = 20) -> str:
    lines = _head(analysis)
    bad = analysis.sources.filter(pl.col("status").is_in(["partial", "failed"]))
    lines.append(f"## Findings ({len(analysis.findings)})")
    lines.append("")
    if not analysis.findings:
        lines += ["No problems found by the detectors that could run.", ""]
    for f in analysis.findings[:top]:
        lost = f" ({f.gpu_seconds_lost:.1f} GPU-s lost)" if f.gpu_seconds_lost else ""
        lines.append(f"### [{f.severity.value}] {f.title}{lost}")
        lines.append("")
        scope = []
        if f.ranks:
            scope.append("ranks " + ", ".join(map(str, sorted(f.ranks))))
        if f.hosts:
            scope.append("hosts " + ", ".join(sorted(f.hosts)))
        if f.gpus:
            scope.append("GPUs " + ", ".join(sorted(f.gpus)))
        if scope:
            lines += ["_" + "; ".join(scope) + "_", ""]
        lines += [f.summary, "", f"**What to do:** {f.remediation}", ""]
    if len(analysis.findings) > top:
        lines += [f"... and {len(analysis.findings) - top} more in findings.json.", ""]
    if analysis.skipped:
        lines += ["## Detectors skipped", ""]
        lines += [f"- `{s.detector}`: {s.reason}" for s in analysis.skipped]
        lines.append("")
    if bad.height:
        lines += ["## Damaged inputs", ""]
        lines += markdown_table(bad.select("path", "kind", "status", "message"))
    lines += ["## Steps per rank", ""]
    lines += markdown_table(step_table(analysis.frames))
    breakdown = step_breakdown_table(analysis.frames)
    if breakdown.height:
        lines += ["## Step breakdown per rank (median over steps)", ""]
        lines += markdown_table(breakdown)
    return "\n".join(lines)
