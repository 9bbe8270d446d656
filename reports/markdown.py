"""summary.md: the findings, worst first, and what was read, for pasting into a ticket."""

from __future__ import annotations

import polars as pl

from forensics.analyze import Analysis
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


def render(analysis: Analysis, top: int = 20) -> str:
    lines = [f"# forensics: {analysis.run_dir.name}", ""]
    n_ok = analysis.sources.filter(pl.col("status") == "ok").height
    bad = analysis.sources.filter(pl.col("status").is_in(["partial", "failed"]))
    lines.append(
        f"{len(analysis.context.ranks)} rank(s) on {len(analysis.context.hosts)} host(s); {analysis.sources.height} file(s): "
        f"{n_ok} ok, {bad.height} partial or failed."
    )
    lines.append("")
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
    lines += markdown_table(step_table(analysis.context))
    breakdown = step_breakdown_table(analysis.context)
    if breakdown.height:
        lines += ["## Step breakdown per rank (median over steps)", ""]
        lines += markdown_table(breakdown)
    return "\n".join(lines)
