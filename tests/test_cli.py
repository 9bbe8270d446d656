from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, SCHEMA_PATH, SHARED, assert_valid_findings, shared_path


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "forensics.cli", *args], capture_output=True, text=True, cwd=ROOT)


def test_vendored_schema_matches_shared_contract():
    shared = shared_path("findings.schema.json", root=SHARED)
    assert json.loads(shared.read_text()) == json.loads(SCHEMA_PATH.read_text())


def test_missing_run_dir_is_exit_2_without_traceback(tmp_path: Path):
    res = run_cli("analyze", str(tmp_path / "nope"), "--out", str(tmp_path / "o"))
    assert res.returncode == 2
    assert "Traceback" not in res.stderr and "no such directory" in res.stderr


def test_bad_option_value_is_exit_2(tmp_path: Path):
    res = run_cli("analyze", str(tmp_path), "--fail-on", "bogus")
    assert res.returncode == 2
    assert "Traceback" not in res.stderr


def test_out_inside_run_dir_is_refused(tmp_path: Path):
    res = run_cli("analyze", str(tmp_path), "--out", str(tmp_path / "report"))
    assert res.returncode == 2 and "inside RUN_DIR" in res.stderr
    assert not (tmp_path / "report").exists()


def test_folder_without_readable_source_is_exit_2_but_still_reports(tmp_path: Path, findings_validator):
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("nothing here\n")
    (run / "rank0.pt.trace.json").write_text("")
    res = run_cli("analyze", str(run), "--out", str(tmp_path / "o"), "-q")
    assert res.returncode == 2, res.stderr
    doc = assert_valid_findings(findings_validator, tmp_path / "o" / "findings.json")
    statuses = {s["path"]: (s["kind"], s["status"]) for s in doc["run"]["sources"]}
    assert statuses == {"notes.txt": ("unknown", "ignored"), "rank0.pt.trace.json": ("kineto", "failed")}
    assert (tmp_path / "o" / "summary.md").exists() and (tmp_path / "o" / "report.html").exists()


def test_unknown_detector_setting_is_exit_2(tmp_path: Path):
    res = run_cli("analyze", str(tmp_path), "--out", str(tmp_path.parent / "o2"), "--set", "nosuch.x=1")
    assert res.returncode == 2 and "unknown detector" in res.stderr


def test_unknown_option_and_missing_argument_are_exit_2_without_traceback(tmp_path: Path):
    for args in (("analyze", str(tmp_path), "--bogus"), ("analyze",), ("nosuchcommand",)):
        res = run_cli(*args)
        assert res.returncode == 2, args
        assert "Traceback" not in res.stderr and "Error" in res.stderr, args
