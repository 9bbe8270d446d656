"""`forensics analyze --engine ray` parses the same units of files with the same function as the process
pool: identical sources, frames and findings.json.

Ray is in the test extra (CI installs it); without it these tests fail, they are not skipped."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli


@pytest.fixture
def job(tmp_path: Path) -> Path:
    """A simulated job plus one broken trace (a failed source must come back in its place too)."""
    run = tmp_path / "job"
    shutil.copytree(ROOT / "sample_traces" / "ddp_straggler", run)
    (run / "profiler" / "zz_broken.pt.trace.json").write_bytes(b"{")
    return run


def test_ray_engine_gives_the_pool_s_frames_and_findings(ray_session, job: Path, monkeypatch: pytest.MonkeyPatch):
    from forensics.parsers.discovery import discover, discover_and_parse, units
    from forensics.reports import json_report

    from forensics.pipeline import analyze

    assert len(units(discover(job), 2)) > 2  # several tasks, so their order matters
    pool = discover_and_parse(job, workers=2)
    local = analyze(job, workers=2)

    def not_here(*args: object) -> None:
        raise AssertionError("parsed in the driver, not in Ray tasks")

    monkeypatch.setattr("forensics.parsers.discovery.parse_unit", not_here)
    monkeypatch.setattr("forensics.parsers.discovery.run_pool", not_here)
    on_ray = discover_and_parse(job, engine="ray")
    assert [p.file.rel_path for p in on_ray] == [p.file.rel_path for p in pool]
    assert [(p.result.status, p.result.message) for p in on_ray] == [(p.result.status, p.result.message) for p in pool]
    assert any(p.result.status == "failed" for p in on_ray)
    remote = analyze(job, engine="ray")
    assert remote.frames.present == local.frames.present and {"kernels", "steps", "sources"} <= local.frames.present
    for name in local.frames.present - {"sources"}:
        assert remote.frames[name].equals(local.frames[name]), name
    keep = [c for c in local.sources.columns if c != "parse_ns"]
    assert remote.sources.select(keep).equals(local.sources.select(keep))
    assert json_report.render(remote) == json_report.render(local)


def test_ray_address_needs_the_ray_engine(tmp_path: Path):
    res = run_cli("analyze", str(ROOT / "sample_traces" / "xid79"), "--out", str(tmp_path / "out"),
                  "--ray-address", "127.0.0.1:6379", "-q")
    assert res.returncode == 2, res.stderr
    assert "--ray-address needs --engine ray" in res.stderr
    assert not (tmp_path / "out").exists()
