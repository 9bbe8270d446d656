from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from forensics.errors import UsageError
from forensics.triage import JobSummary, host_table, job_dirs, job_table
from tests.conftest import ROOT


def _finding(detector: str, severity: str, hosts: list[str], lost: float | None) -> dict:
    return {"detector": detector, "severity": severity, "title": f"{detector} on {hosts}", "hosts": hosts,
            "impact": {"gpu_seconds_lost": lost}}


def _job(name: str, findings: list[dict], counts: dict[str, int]) -> JobSummary:
    return JobSummary(name, f"/x/{name}", findings, counts=counts)


def test_jobs_rank_worst_severity_first_then_gpu_seconds():
    results = [
        _job("quiet", [], {}),
        _job("warn_big", [_finding("straggler", "warning", ["n1"], 500.0)], {"warning": 1}),
        _job("crit_small", [_finding("gpu_hw_error", "critical", ["n2"], 1.0)], {"critical": 1}),
        _job("warn_small", [_finding("straggler", "warning", ["n2"], 5.0)], {"warning": 1}),
        JobSummary("broken", "/x/broken", None, error="no readable trace or log"),
    ]
    table = job_table(results)
    assert table["job"].to_list() == ["broken", "crit_small", "warn_big", "warn_small", "quiet"]
    assert table["worst"].to_list() == ["error", "critical", "warning", "warning", "clean"]


def test_hosts_recurring_across_jobs_come_first():
    results = [
        _job("a", [_finding("straggler", "warning", ["n2"], 1.0), _finding("busy_wait", "info", ["n9"], None)], {}),
        _job("b", [_finding("gpu_hw_error", "critical", ["n2"], None)], {}),
        _job("c", [_finding("straggler", "warning", ["n9"], 1.0), _finding("straggler", "warning", ["n9"], 1.0)], {}),
    ]
    hosts = host_table(results)
    assert hosts.select("host", "jobs", "findings", "critical").rows() == [("n2", 2, 2, 1), ("n9", 2, 3, 0)]
    assert hosts.filter(hosts["host"] == "n2")["detectors"].item() == "gpu_hw_error, straggler"


def test_job_dirs_one_parent_or_many(tmp_path: Path):
    (tmp_path / "j2").mkdir()
    (tmp_path / "j1").mkdir()
    (tmp_path / "file.txt").write_text("x")
    assert job_dirs([tmp_path]) == [tmp_path / "j1", tmp_path / "j2"]
    assert job_dirs([tmp_path / "j2", tmp_path / "j1"]) == [tmp_path / "j1", tmp_path / "j2"]
    with pytest.raises(UsageError, match="no job folders"):
        job_dirs([tmp_path / "j1"])
    with pytest.raises(UsageError, match="no such directory"):
        job_dirs([tmp_path / "nope"])


def test_triage_cli_writes_reports_and_exit_2_when_no_job_is_readable(tmp_path: Path):
    for name in ("a", "b"):
        (tmp_path / "jobs" / name).mkdir(parents=True)
        (tmp_path / "jobs" / name / "notes.txt").write_text("nothing\n")
    res = subprocess.run(
        [sys.executable, "-m", "forensics.cli", "triage", str(tmp_path / "jobs"), "--out", str(tmp_path / "t"), "-q",
         "--workers", "1"],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert res.returncode == 2, res.stderr
    assert (tmp_path / "t" / "triage.json").exists() and (tmp_path / "t" / "a" / "findings.json").exists()
    assert "Traceback" not in res.stderr


def _stable(doc: dict) -> dict:
    """The kernel-log parser lists tied record counts in no fixed order: compare those messages as word sets."""
    for src in doc["run"]["sources"]:
        if src.get("message"):
            src["message"] = sorted(re.split(r"[ ,()]+", src["message"]))
    return doc


def test_triage_in_worker_processes_writes_what_analyze_writes(tmp_path: Path):
    """The renderer travels to the workers; each job's files equal `forensics analyze` of that job."""
    jobs = tmp_path / "jobs"
    for name in ("xid79", "pp_small_m"):
        shutil.copytree(ROOT / "sample_traces" / name, jobs / name)
    res = subprocess.run(
        [sys.executable, "-m", "forensics.cli", "triage", str(jobs), "--out", str(tmp_path / "t"), "-q", "--workers", "2"],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr
    triage_doc = json.loads((tmp_path / "t" / "triage.json").read_text())
    for name in ("xid79", "pp_small_m"):
        single = subprocess.run(
            [sys.executable, "-m", "forensics.cli", "analyze", str(jobs / name), "--out", str(tmp_path / f"a_{name}"), "-q",
             "--fail-on", "never"], capture_output=True, text=True, cwd=ROOT,
        )
        assert single.returncode == 0, single.stderr
        expected = _stable(json.loads((tmp_path / f"a_{name}" / "findings.json").read_text()))
        assert _stable(json.loads((tmp_path / "t" / name / "findings.json").read_text())) == expected
        assert (tmp_path / "t" / name / "summary.md").read_text() == (tmp_path / f"a_{name}" / "summary.md").read_text()
        row = next(j for j in triage_doc["jobs"] if j["job"] == name)
        assert row["critical"] == sum(f["severity"] == "critical" for f in expected["findings"])
        # the job is named by its worst incident's root cause (issue 14), not by its first finding
        assert row["top_finding"] == (expected["incidents"][0]["title"] if expected["incidents"] else None)
        damaged = sum(s["status"] in ("partial", "failed") for s in expected["run"]["sources"])
        assert row["damaged_sources"] == damaged
