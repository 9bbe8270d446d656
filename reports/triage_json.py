"""triage.json (jobs ranked worst first, hosts that recur) and the per-job files triage writes."""

from __future__ import annotations

from typing import Any

import orjson
from forensics.reports import json_report, markdown

from forensics import __version__
from forensics.analyze import Analysis
from forensics.triage import JobSummary, host_table, job_table


def build(results: list[JobSummary]) -> dict[str, Any]:
    """The triage.json document: one record per job and one per host named by findings."""
    return {
        "schema_version": 1,
        "tool": {"name": "forensics", "version": __version__},
        "jobs": job_table(results).to_dicts(),
        "hosts": host_table(results).to_dicts(),
    }


def render(results: list[JobSummary]) -> bytes:
    return orjson.dumps(build(results), option=orjson.OPT_INDENT_2)


def job_files(analysis: Analysis) -> dict[str, bytes]:
    """The files triage writes for one job (findings.json and summary.md); runs in the worker process."""
    return {
        "findings.json": orjson.dumps(json_report.build(analysis), option=orjson.OPT_INDENT_2),
        "summary.md": markdown.render(analysis).encode("utf-8"),
    }
