"""summary.md: ready to paste into a ticket (GitHub or Jira).

The verdict first, then the job, the incidents as a table, the worst findings with their top evidence,
the detectors that could not run and the damaged inputs. Every piece of input text goes through
:func:`md_text`; every list and cell is bounded, and the whole text stays under :data:`MAX_CHARS` whatever
the job size (the rest is in findings.json).
"""

from __future__ import annotations

import re

import polars as pl
from forensics.reports.lastwords import summary as last_words_summary

from forensics.base.findings import Finding
from forensics.facts.run_header import header_lines
from forensics.incidents import verdict_text
from forensics.pipeline import Analysis, run_header

MAX_CHARS = 60_000
"""Hard limit on summary.md (GitHub issue bodies stop at 65,536 characters; Jira comments at 32,767 by
default, so the first sections, which are what matters, come first)."""
TOP_FINDINGS = 20
EVIDENCE_FINDINGS = 10
EVIDENCE_ROWS = 5
EVIDENCE_COLUMNS = 6
MAX_INCIDENTS = 25
MAX_DAMAGED = 25
CELL_CHARS = 120

# Characters that start markup in GitHub Markdown (CommonMark + tables, autolinks, HTML) or in Jira's
# wiki syntax. Each is backslash-escaped, which both render as the character itself.
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]<>()#+!|~^&])")
_LINE_START = re.compile(r"^(\s*)([-=]|\d+[.)])")


def md_text(value: object) -> str:
    """Text from the input (file, host, kernel, rank names), safe to put anywhere in Markdown: it is
    shown as written, never as a link, an HTML tag, a table cell border, code or emphasis."""
    text = " ".join(str(value).split())  # a newline would end a table row or a paragraph
    return _LINE_START.sub(lambda m: m.group(1) + "\\" + m.group(2), _MD_SPECIAL.sub(r"\\\1", text))


def clip(value: object, limit: int = CELL_CHARS) -> str:
    """Plain text cut to ``limit`` characters (before escaping, so no escape is cut in half)."""
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def _cell(value: object, float_digits: int) -> str:
    """A table cell: never at a line start, so only the inline specials need escaping (a "1." stays 1.)."""
    if isinstance(value, float):
        return f"{value:.{float_digits}f}"
    return "" if value is None else _MD_SPECIAL.sub(r"\\\1", clip(value))


def markdown_table(df: pl.DataFrame, float_digits: int = 2, max_rows: int | None = None) -> list[str]:
    if df.height == 0:
        return ["_none_", ""]
    shown = df if max_rows is None else df.head(max_rows)
    head = "| " + " | ".join(md_text(c) for c in df.columns) + " |"
    sep = "|" + "---|" * len(df.columns)
    rows = ["| " + " | ".join(_cell(v, float_digits) for v in row) + " |" for row in shown.iter_rows()]
    more = [f"_{df.height - shown.height} more row(s) in findings.json._", ""] if df.height > shown.height else []
    return [head, sep, *rows, "", *more]


# --- sections -------------------------------------------------------------------------------------


def _head(analysis: Analysis) -> list[str]:
    """Title, the verdict (the lines the CLI prints, worst first), the job."""
    lines = [f"# forensics: {md_text(analysis.run_dir.name)}", ""]
    verdicts = [f"- {md_text(clip(verdict_text(i), 800))}" for i in analysis.incidents[:MAX_INCIDENTS]]
    if len(analysis.incidents) > MAX_INCIDENTS:
        verdicts.append(f"- ... and {len(analysis.incidents) - MAX_INCIDENTS} more incident(s) in findings.json")
    lines += verdicts or ["No problems found by the detectors that could run."]
    lines += ["", "## Job", ""]
    lines += [clip(line, 2000) + "  " for line in header_lines(run_header(analysis), md_text)]
    steps = analysis.frames["steps"]
    n_steps = steps["step"].n_unique() if steps.height else 0
    lines += [f"{n_steps} profiled step(s)." if n_steps else "No profiled steps in the traces.", ""]
    if analysis.context.coverage["gpu_time_ns"]:
        lines += ["**Coverage:** " + md_text(clip(analysis.context.coverage["line"], 2000)), ""]
    return lines


def _incidents_md(analysis: Analysis) -> list[str]:
    if not analysis.incidents:
        return []
    rows = [{"severity": i.severity.value, "incident": i.title,
             "GPU-hours lost": None if i.gpu_hours_lost is None else f"{i.gpu_hours_lost:.3g}",
             "confidence": i.confidence, "findings": len(i.findings), "id": i.id}
            for i in analysis.incidents]
    df = pl.DataFrame(rows, schema={"severity": pl.String, "incident": pl.String, "GPU-hours lost": pl.String,
                                    "confidence": pl.String, "findings": pl.Int64, "id": pl.String})
    return [f"## Incidents ({len(analysis.incidents)})", "", *markdown_table(df, max_rows=MAX_INCIDENTS)]


def _last_words_md(analysis: Analysis) -> list[str]:
    """The first failure and its first lines, the scheduler's message, the stack suspects."""
    lw = last_words_summary(analysis)
    if lw is None:
        return []
    lines = ["## Last words", ""]
    first = lw["first"]
    if first is not None:
        lines += [f"**{md_text(clip(first.title, 300))}**", "", md_text(clip(first.summary, 1000)), ""]
    for r in lw["ranks"][:4]:
        lines += [f"- {md_text(r['who'])}{' on ' + md_text(r['host']) if r['host'] else ''}, {md_text(r['time'])}, "
                  f"{md_text(r['where'])}: {md_text(clip(r['first_line'], 300))}"]
        lines += [f"  - {md_text(clip(t, 200))}" for t in r["traceback"].splitlines()[-6:]]
    if len(lw["ranks"]) > 4:
        lines.append(f"- ... {len(lw['ranks']) - 4} more failing process(es) in report.html")
    lines += [f"- scheduler / launcher: {md_text(clip(line, 300))}" for line in lw["scheduler"][:3]]
    if lw["stacks"].height:
        lines += ["", "Stack groups:", "", *markdown_table(lw["stacks"].select("where", "count", "members"), max_rows=8)]
    return [*lines, ""]


def _evidence_md(f: Finding) -> list[str]:
    if not f.evidence:
        return []
    rows = [{k: None if v is None else clip(v, CELL_CHARS) for k, v in row.items()} for row in f.evidence[:EVIDENCE_ROWS]]
    df = pl.DataFrame(rows, infer_schema_length=None)
    df = df.select(df.columns[:EVIDENCE_COLUMNS])
    more = f", first {EVIDENCE_ROWS}" if len(f.evidence) > EVIDENCE_ROWS else ""
    return [f"Evidence ({len(f.evidence)} row(s){more}):", "", *markdown_table(df)]


def _finding_lines(f: Finding, with_evidence: bool) -> list[str]:
    lost = f" ({f.gpu_seconds_lost:.1f} GPU-s lost)" if f.gpu_seconds_lost else ""
    lines = [f"### [{f.severity.value}] {md_text(clip(f.title, 300))}{lost}", ""]  # no link: input cannot define [x]: refs
    if f.scope:
        lines += ["_" + md_text(clip(f.scope, 500)) + "_", ""]
    lines += [md_text(clip(f.summary, 2000)), "", f"**What to do:** {md_text(clip(f.remediation, 1000))}", ""]
    return lines + (_evidence_md(f) if with_evidence else [])


def _findings_md(analysis: Analysis, top: int, budget: int) -> list[str]:
    """The worst ``top`` findings, the first ones with their top evidence, within ``budget`` characters."""
    lines = [f"## Findings ({len(analysis.findings)})", ""]
    if not analysis.findings:
        return [*lines, "No problems found by the detectors that could run.", ""]
    used, shown = 0, 0
    for n, f in enumerate(analysis.findings[:top]):
        part = _finding_lines(f, with_evidence=n < EVIDENCE_FINDINGS)
        size = sum(len(line) + 1 for line in part)
        if used + size > budget:
            break
        lines, used, shown = lines + part, used + size, shown + 1
    if len(analysis.findings) > shown:
        lines += [f"... and {len(analysis.findings) - shown} more in findings.json.", ""]
    return lines


def _inputs_md(analysis: Analysis) -> list[str]:
    lines: list[str] = []
    if analysis.skipped:
        lines += ["## Detectors skipped", ""]
        lines += [f"- {md_text(s.detector)}: {md_text(clip(s.reason, 300))}" for s in analysis.skipped]
        lines.append("")
    src = analysis.sources
    bad = src.filter(pl.col("status").is_in(["partial", "failed"])).sort("path")
    if bad.height:
        lines += [f"## Damaged inputs ({bad.height})", ""]
        lines += markdown_table(bad.select("path", "kind", "status", "message"), max_rows=MAX_DAMAGED)
    ignored = src.filter(pl.col("status") == "ignored").height
    if ignored:
        lines += [f"{ignored} file(s) ignored (not a trace or log forensics reads); listed in report.html.", ""]
    return lines


def _bounded(lines: list[str], limit: int) -> str:
    """Join the lines; past ``limit`` characters cut at a line end and say where the rest is."""
    text = "\n".join(lines)
    if len(text) <= limit:
        return text
    note = "\n\n_summary.md is cut here to stay ticket-sized; findings.json and report.html have everything._\n"
    cut = text.rfind("\n", 0, limit - len(note))
    return text[: max(cut, 0)] + note


def render(analysis: Analysis, top: int = TOP_FINDINGS) -> str:
    limit = MAX_CHARS - 1000  # headroom for the line ends and the cut note
    head, tail = _head(analysis) + _incidents_md(analysis) + _last_words_md(analysis), _inputs_md(analysis)
    fixed = sum(len(line) + 1 for line in head + tail)
    # the findings get what the bounded sections leave; _bounded is the last guard
    return _bounded(head + _findings_md(analysis, top, limit - fixed - 200) + tail, limit)
