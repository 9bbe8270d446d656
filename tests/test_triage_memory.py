"""forensics triage's bounded workers (issue 17, item 5): a job over --worker-memory is ended and becomes a
failed row, a new worker takes the next job, the batch completes."""

from __future__ import annotations

import json
import time
from pathlib import Path

from forensics.reports import triage_json

from forensics.fleet.jobs import find_jobs
from forensics.fleet.triage import default_worker_memory, machine_memory, run_triage
from forensics.pipeline import Analysis
from tests.test_triage import _cli, _job

MB = 2**20
LIMIT_MB = 700  # a worker holds about 200 MB for these jobs


def hungry_files(analysis: Analysis) -> dict[str, bytes]:
    """The real report files, except that job ``b-hungry`` first grows past LIMIT_MB (3 GB at most)."""
    if analysis.run_dir.name == "b-hungry":
        held = []
        while len(held) < 60:
            held.append(b"x" * (50 * MB))
            time.sleep(0.02)
    return triage_json.job_files(analysis)


def test_a_job_over_the_worker_memory_limit_is_a_failed_row_and_the_next_job_gets_a_new_worker(tmp_path: Path):
    jobs = tmp_path / "jobs"
    for name in ("a", "b-hungry", "c", "d"):
        _job(jobs / name)
    run = run_triage(find_jobs([jobs]), tmp_path / "out", workers=1, worker_memory=LIMIT_MB, render=hungry_files)
    try:
        by = {s.job_id: s for s in run.summaries}
        assert sorted(by) == ["a", "b-hungry", "c", "d"]
        hungry = by["b-hungry"]
        assert hungry.status == "failed" and hungry.files == [] and hungry.retry  # tried again by the next run
        assert hungry.reason == f"not analysed: its worker exceeded the worker memory limit of {LIMIT_MB} MB"
        for name in ("a", "c", "d"):  # c and d ran in the worker that replaced the one ended
            assert by[name].status == "ok" and by[name].files == ["findings.json", "report.html", "summary.md"], name
    finally:
        run.cleanup()


def test_cli_worker_memory_every_job_over_a_tiny_limit(tmp_path: Path):
    jobs = tmp_path / "jobs"
    for name in ("a", "b"):
        _job(jobs / name)
    out = tmp_path / "out"
    res = _cli("triage", str(jobs), "--out", str(out), "-q", "--worker-memory", "1")
    assert res.returncode == 2, res.stderr  # every job failed
    rows = json.loads((out / "triage.json").read_text())["rows"]
    assert [(r["job_id"], r["status"], r["reason"]) for r in rows] == [
        (j, "failed", "not analysed: its worker exceeded the worker memory limit of 1 MB") for j in ("a", "b")]


def test_default_bound_is_a_share_of_the_machine():
    with open("/proc/meminfo") as fh:
        total = int(next(line for line in fh if line.startswith("MemTotal:")).split()[1]) * 1024
    cgroup = Path("/sys/fs/cgroup/memory.max")
    if cgroup.is_file() and cgroup.read_text().strip().isdigit():
        total = min(total, int(cgroup.read_text()))
    assert machine_memory() == total
    assert default_worker_memory(2) == max(512 * MB, int(0.8 * total) // 2)
