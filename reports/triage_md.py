"""triage.md: jobs ranked worst first, and hosts that recur across jobs."""

from __future__ import annotations

from forensics.reports.markdown import markdown_table

from forensics.triage import JobSummary, host_table, job_table


def render(results: list[JobSummary]) -> str:
    jobs = job_table(results)
    hosts = host_table(results)
    recurring = hosts.filter(hosts["jobs"] > 1) if hosts.height else hosts
    lines = [
        f"# forensics triage: {len(results)} job(s)",
        "",
        "## Jobs, worst first",
        "",
        *markdown_table(jobs),
        "## Recurring hosts (named by findings in more than one job)",
        "",
        *markdown_table(recurring),
        "## All hosts named by findings",
        "",
        *markdown_table(hosts),
    ]
    return "\n".join(lines)
